//! linkemu: torbed's userspace link emulator. It takes the place of the bridge in the local
//! backend's switch namespace and forwards Ethernet frames between the switch-side veth
//! ends (AF_PACKET sockets, so no TUN device and no root in the initial namespace), applying
//! per (source node, destination node) delay, jitter, loss and rate, for kernels without
//! sch_netem.
//!
//! ```text
//! linkemu run TABLE.json                         forward until SIGTERM/SIGINT; SIGHUP rereads TABLE
//! linkemu check TABLE.json                       validate a link table and exit
//! linkemu offloads-off [--netns PATH] DEV ...    turn TSO/GSO/GRO/tx-checksum off (before `run`)
//! linkemu version
//! ```

mod control;
mod delayline;
mod engine;
mod link;
mod rng;
mod sys;
mod table;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::ExitCode;

use engine::{Engine, Tx};
use sys::{Epoll, PacketSocket, Signals, Timer};
use table::Table;

const KEY_TIMER: u64 = u64::MAX;
const KEY_SIGNAL: u64 = u64::MAX - 1;
const KEY_LISTEN: u64 = u64::MAX - 2;
const KEY_CONN: u64 = 1 << 32; // + fd
/// Frames taken from one port per wake-up before the others get a turn.
const BUDGET: usize = 64;
const RCVBUF: usize = 8 << 20;

struct Sockets(Vec<PacketSocket>);

impl Tx for Sockets {
    fn send(&mut self, port: usize, frame: &[u8]) -> bool {
        self.0[port].send(frame)
    }
}

fn log(msg: &str) {
    eprintln!("linkemu: {msg}");
}

fn write_stats(engine: &Engine) {
    if let Some(path) = &engine.table().stats_file {
        let text = serde_json::to_string_pretty(&engine.stats()).unwrap_or_default();
        let tmp = format!("{path}.tmp");
        if let Err(e) = std::fs::write(&tmp, text + "\n").and_then(|_| std::fs::rename(&tmp, path)) {
            log(&format!("cannot write stats to {path}: {e}"));
        }
    }
}

/// Most reply bytes a control connection may have waiting before it is dropped (a stats
/// reply of a 750-node network is ~2.5 MB).
const MAX_OUT: usize = 64 << 20;

struct Conn {
    stream: UnixStream,
    pending: Vec<u8>,
    /// Reply bytes not yet taken by the peer (written as the socket accepts them).
    out: Vec<u8>,
    /// The peer closed its side: answer what was asked, then close.
    eof: bool,
    /// What the loop waits on this socket for, (input, room for output): Epoll::modify's.
    interest: (bool, bool),
}

/// What the main loop does with a control connection after `serve_conn`.
#[derive(Debug, PartialEq)]
enum ConnState {
    Close,
    /// Keep it; wait for input (unless the peer closed) and, when true, for room to write.
    Keep { output: bool },
}

/// Read requests, answer them, and write as much of the answers as the socket takes now.
/// Never blocks: this runs on the forwarding thread, and a reader that is slow to take a
/// large reply (a starved collector reading a 2.5 MB stats answer) once stalled every
/// frame for up to 200 ms per write with the blocking write used before.
fn serve_conn(conn: &mut Conn, engine: &mut Engine, table_path: &str) -> ConnState {
    let mut buf = [0u8; 4096];
    while !conn.eof {
        match conn.stream.read(&mut buf) {
            Ok(0) => conn.eof = true,
            Ok(n) => conn.pending.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return ConnState::Close,
        }
        if conn.pending.len() > 1 << 20 {
            return ConnState::Close;
        }
    }
    while let Some(pos) = conn.pending.iter().position(|&b| b == b'\n') {
        let line: Vec<u8> = conn.pending.drain(..=pos).collect();
        let text = String::from_utf8_lossy(&line);
        if text.trim().is_empty() {
            continue;
        }
        let reply = control::handle(engine, table_path, text.trim(), sys::now_ns());
        if reply["ok"] == true && text.contains("\"set\"") {
            log(&format!("control: {}", text.trim()));
        }
        conn.out.extend_from_slice(reply.to_string().as_bytes());
        conn.out.push(b'\n');
        if conn.out.len() > MAX_OUT {
            return ConnState::Close;
        }
    }
    let mut written = 0;
    while written < conn.out.len() {
        match conn.stream.write(&conn.out[written..]) {
            Ok(0) => return ConnState::Close,
            Ok(n) => written += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return ConnState::Close,
        }
    }
    conn.out.drain(..written);
    if conn.eof && conn.out.is_empty() {
        return ConnState::Close;
    }
    ConnState::Keep { output: !conn.out.is_empty() }
}

fn run(table_path: &str) -> Result<(), String> {
    let table = Table::load(table_path)?;
    let (mut socks, buf_size) = open_ports(&table)?;
    let control_path = table.control_socket.clone();
    let spin_ns = table.spin_us * 1000;
    let nports = table.ports.len();
    let mut engine = Engine::new(table, buf_size)?;
    let mut lp = Loop::new(&socks, control_path.as_deref())?;
    tune_thread(engine.table().realtime_priority);
    log(&format!("forwarding between {nports} ports (frames up to {buf_size} bytes); table {table_path}"));

    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
    'main: loop {
        let now = sys::now_ns();
        engine.egress(now, &mut socks);
        let next = engine.next_departure();
        let spinning = matches!(next, Some(t) if t <= now + spin_ns);
        if !spinning {
            lp.timer.set(next.map(|t| t - spin_ns.min(t)));
        }
        let n = lp.epoll.wait(&mut events, if spinning { 0 } else { -1 }).map_err(|e| format!("epoll: {e}"))?;
        for ev in &events[..n] {
            let key = ev.u64; // (a copy: epoll_event is packed)
            match key {
                KEY_TIMER => lp.timer.clear(),
                KEY_SIGNAL => {
                    if lp.on_signals(&mut engine, table_path) {
                        break 'main;
                    }
                }
                KEY_LISTEN => lp.accept(),
                k if k >= KEY_CONN => lp.on_conn(k, &mut engine, table_path),
                port => lp.on_port(port as usize, &mut engine, &mut socks)?,
            }
        }
    }
    write_stats(&engine);
    if let Some(path) = control_path {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// A packet socket per port of the table, and the receive buffer size its MTUs need.
fn open_ports(table: &Table) -> Result<(Sockets, usize), String> {
    let mut mtu = 1500;
    for p in &table.ports {
        mtu = mtu.max(sys::mtu(&p.dev).map_err(|e| format!("{}: {e}", p.dev))?);
    }
    // Ethernet header + one VLAN tag; anything longer is a GSO/GRO super-frame.
    let buf_size = mtu as usize + 18;
    let mut socks = Sockets(Vec::new());
    for p in &table.ports {
        socks.0.push(PacketSocket::open(&p.dev, RCVBUF).map_err(|e| format!("port {}: {e}", p.dev))?);
    }
    Ok((socks, buf_size))
}

/// Sleeps end on time: no timer slack for this thread; real-time priority when asked for.
fn tune_thread(prio: u32) {
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0) };
    if prio > 0 {
        if let Err(e) = sys::set_realtime(prio) {
            log(&format!("running without real-time priority (SCHED_FIFO {prio}: {e}); delays may be late on a busy machine"));
        }
    }
}

/// What the forwarding loop waits on besides the ports: the departure timer, signals, the
/// control socket and its connections.
struct Loop {
    epoll: Epoll,
    timer: Timer,
    signals: Signals,
    listener: Option<UnixListener>,
    conns: HashMap<RawFd, Conn>,
    oversize_warned: bool,
}

impl Loop {
    fn new(socks: &Sockets, control_path: Option<&str>) -> Result<Loop, String> {
        let epoll = Epoll::new().map_err(|e| e.to_string())?;
        for (i, s) in socks.0.iter().enumerate() {
            epoll.add(s.fd, i as u64).map_err(|e| e.to_string())?;
        }
        let timer = Timer::new().map_err(|e| e.to_string())?;
        epoll.add(timer.fd, KEY_TIMER).map_err(|e| e.to_string())?;
        let signals = Signals::new().map_err(|e| e.to_string())?;
        epoll.add(signals.fd, KEY_SIGNAL).map_err(|e| e.to_string())?;
        let listener = match control_path {
            Some(path) => {
                let _ = std::fs::remove_file(path);
                let l = UnixListener::bind(path).map_err(|e| format!("control socket {path}: {e}"))?;
                l.set_nonblocking(true).map_err(|e| e.to_string())?;
                epoll.add(l.as_raw_fd(), KEY_LISTEN).map_err(|e| e.to_string())?;
                Some(l)
            }
            None => None,
        };
        Ok(Loop { epoll, timer, signals, listener, conns: HashMap::new(), oversize_warned: false })
    }

    /// SIGHUP reloads the table; any other signal stops the loop (true).
    fn on_signals(&mut self, engine: &mut Engine, table_path: &str) -> bool {
        while let Some(sig) = self.signals.read() {
            if sig == libc::SIGHUP {
                match Table::load(table_path).and_then(|t| engine.apply_table(t)) {
                    Ok(()) => log("SIGHUP: table reloaded"),
                    Err(e) => log(&format!("SIGHUP: table not reloaded: {e}")),
                }
            } else {
                log(&format!("signal {sig}: stopping"));
                return true;
            }
        }
        false
    }

    fn accept(&mut self) {
        if let Some(l) = &self.listener {
            while let Ok((stream, _)) = l.accept() {
                let fd = stream.as_raw_fd();
                if stream.set_nonblocking(true).is_ok() && self.epoll.add(fd, KEY_CONN + fd as u64).is_ok() {
                    self.conns.insert(fd, Conn { stream, pending: Vec::new(), out: Vec::new(),
                                                 eof: false, interest: (true, false) });
                }
            }
        }
    }

    fn on_conn(&mut self, key: u64, engine: &mut Engine, table_path: &str) {
        let fd = (key - KEY_CONN) as RawFd;
        let keep = match self.conns.get_mut(&fd) {
            Some(c) => match serve_conn(c, engine, table_path) {
                ConnState::Keep { output } => {
                    // A closed peer's EOF stays readable: then wait only for room to write.
                    let want = (!c.eof, output);
                    want == c.interest || self.epoll.modify(fd, key, want.0, want.1).map(|_| c.interest = want).is_ok()
                }
                ConnState::Close => false,
            },
            None => false,
        };
        if !keep {
            self.epoll.del(fd);
            self.conns.remove(&fd);
        }
    }

    /// Up to BUDGET frames from one port into the engine.
    fn on_port(&mut self, port: usize, engine: &mut Engine, socks: &mut Sockets) -> Result<(), String> {
        for _ in 0..BUDGET {
            let mut buf = engine.buffer();
            match socks.0[port].recv(&mut buf) {
                Ok(Some(len)) if len <= buf.len() => {
                    engine.ingress(sys::now_ns(), port, buf, len, socks);
                }
                Ok(Some(len)) => {
                    engine.note_oversize(port);
                    engine.recycle(buf);
                    if !self.oversize_warned {
                        self.oversize_warned = true;
                        log(&format!("dropped a {len}-byte frame on {} (larger than MTU: are \
                                      TSO/GSO/GRO off? see `linkemu offloads-off`)", socks.0[port].dev));
                    }
                }
                Ok(None) => {
                    engine.recycle(buf);
                    break;
                }
                Err(e) => {
                    engine.recycle(buf);
                    return Err(format!("receive on {}: {e}", socks.0[port].dev));
                }
            }
        }
        Ok(())
    }
}

fn offloads(args: &[String]) -> Result<(), String> {
    if args.is_empty() {
        return Err("usage: linkemu offloads-off [--netns PATH] DEV ... [--netns PATH DEV ...]".into());
    }
    let mut i = 0;
    while i < args.len() {
        if args[i] == "--netns" {
            let path = args.get(i + 1).ok_or("--netns needs a path")?;
            sys::enter_netns(path).map_err(|e| e.to_string())?;
            i += 2;
            continue;
        }
        sys::offloads_off(&args[i]).map_err(|e| e.to_string())?;
        i += 1;
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let result = match args.get(1).map(String::as_str) {
        Some("run") if args.len() == 3 => run(&args[2]),
        Some("check") if args.len() == 3 => Table::load(&args[2]).map(|t| {
            println!("{}: {} ports, {} link overrides", args[2], t.ports.len(), t.links.len());
        }),
        Some("offloads-off") => offloads(&args[2..]),
        Some("version") | Some("--version") => {
            println!("linkemu {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        _ => {
            eprintln!("usage: linkemu run TABLE.json | check TABLE.json | offloads-off [--netns PATH] DEV ... | version");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log(&e);
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::tests::engine;

    fn conn(stream: UnixStream) -> Conn {
        stream.set_nonblocking(true).unwrap();
        Conn { stream, pending: Vec::new(), out: Vec::new(), eof: false, interest: (true, false) }
    }

    #[test]
    fn a_reader_that_does_not_read_never_blocks_the_loop() {
        let (ours, mut peer) = UnixStream::pair().unwrap();
        let mut c = conn(ours);
        let mut e = engine();
        // Far more answer bytes than the socket buffers: the old blocking write waited here.
        let n = 20_000;
        peer.write_all(br#"{"op": "stats"}"#).unwrap();
        let mut state = ConnState::Keep { output: false };
        for _ in 0..n {
            peer.write_all(b"\n{\"op\": \"stats\"}").unwrap();
            state = serve_conn(&mut c, &mut e, "/nonexistent");
        }
        // The blocking write used before gave up after 200 ms and closed the connection.
        assert_eq!(state, ConnState::Keep { output: true }, "answers wait for the reader");
        assert!(!c.out.is_empty());
        // The peer reads now: every answer arrives whole, in order, once output is flushed.
        peer.write_all(b"\n").unwrap();
        peer.shutdown(std::net::Shutdown::Write).unwrap();
        let reader = std::thread::spawn(move || {
            let mut all = String::new();
            peer.read_to_string(&mut all).unwrap();
            all
        });
        loop {
            match serve_conn(&mut c, &mut e, "/nonexistent") {
                ConnState::Close => break,
                ConnState::Keep { .. } => std::thread::sleep(std::time::Duration::from_millis(1)),
            }
        }
        drop(c);
        let all = reader.join().unwrap();
        let lines: Vec<&str> = all.lines().collect();
        assert_eq!(lines.len(), n + 1);
        for l in lines {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            assert_eq!(v["ok"], true);
        }
    }

    #[test]
    fn a_closed_peer_is_dropped_once_answered() {
        let (ours, mut peer) = UnixStream::pair().unwrap();
        let mut c = conn(ours);
        let mut e = engine();
        peer.write_all(b"{\"op\": \"ping\"}\n").unwrap();
        peer.shutdown(std::net::Shutdown::Write).unwrap();
        assert_eq!(serve_conn(&mut c, &mut e, "/nonexistent"), ConnState::Close);
        drop(c); // the loop drops a closed connection
        let mut answer = String::new();
        peer.read_to_string(&mut answer).unwrap();
        assert!(answer.contains("\"ok\":true"), "{answer}");
    }
}
