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

struct Conn {
    stream: UnixStream,
    pending: Vec<u8>,
}

fn serve_conn(conn: &mut Conn, engine: &mut Engine, table_path: &str) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match conn.stream.read(&mut buf) {
            Ok(0) => return false,
            Ok(n) => conn.pending.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
        if conn.pending.len() > 1 << 20 {
            return false;
        }
    }
    while let Some(pos) = conn.pending.iter().position(|&b| b == b'\n') {
        let line: Vec<u8> = conn.pending.drain(..=pos).collect();
        let text = String::from_utf8_lossy(&line);
        if text.trim().is_empty() {
            continue;
        }
        let reply = control::handle(engine, table_path, text.trim());
        if reply["ok"] == true && text.contains("\"set\"") {
            log(&format!("control: {}", text.trim()));
        }
        let mut out = reply.to_string();
        out.push('\n');
        // Replies are small; a short blocking write keeps this simple.
        let _ = conn.stream.set_nonblocking(false);
        let _ = conn.stream.set_write_timeout(Some(std::time::Duration::from_millis(200)));
        let ok = conn.stream.write_all(out.as_bytes()).is_ok();
        let _ = conn.stream.set_nonblocking(true);
        if !ok {
            return false;
        }
    }
    true
}

fn run(table_path: &str) -> Result<(), String> {
    let table = Table::load(table_path)?;
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
    let control_path = table.control_socket.clone();
    let spin_ns = table.spin_us * 1000;
    let nports = table.ports.len();
    let mut engine = Engine::new(table, buf_size)?;

    let epoll = Epoll::new().map_err(|e| e.to_string())?;
    for (i, s) in socks.0.iter().enumerate() {
        epoll.add(s.fd, i as u64).map_err(|e| e.to_string())?;
    }
    let mut timer = Timer::new().map_err(|e| e.to_string())?;
    epoll.add(timer.fd, KEY_TIMER).map_err(|e| e.to_string())?;
    let signals = Signals::new().map_err(|e| e.to_string())?;
    epoll.add(signals.fd, KEY_SIGNAL).map_err(|e| e.to_string())?;
    let listener = match &control_path {
        Some(path) => {
            let _ = std::fs::remove_file(path);
            let l = UnixListener::bind(path).map_err(|e| format!("control socket {path}: {e}"))?;
            l.set_nonblocking(true).map_err(|e| e.to_string())?;
            epoll.add(l.as_raw_fd(), KEY_LISTEN).map_err(|e| e.to_string())?;
            Some(l)
        }
        None => None,
    };
    let mut conns: HashMap<RawFd, Conn> = HashMap::new();
    // Sleeps end on time: no timer slack for this thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0) };
    let prio = engine.table().realtime_priority;
    if prio > 0 {
        if let Err(e) = sys::set_realtime(prio) {
            log(&format!("running without real-time priority (SCHED_FIFO {prio}: {e}); delays may be late on a busy machine"));
        }
    }
    log(&format!("forwarding between {nports} ports (frames up to {buf_size} bytes); table {table_path}"));

    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
    let mut oversize_warned = false;
    'main: loop {
        let now = sys::now_ns();
        engine.egress(now, &mut socks);
        let next = engine.next_departure();
        let spinning = matches!(next, Some(t) if t <= now + spin_ns);
        if !spinning {
            timer.set(next.map(|t| t - spin_ns.min(t)));
        }
        let n = epoll.wait(&mut events, if spinning { 0 } else { -1 }).map_err(|e| format!("epoll: {e}"))?;
        for ev in &events[..n] {
            let key = ev.u64;
            match key {
                KEY_TIMER => timer.clear(),
                KEY_SIGNAL => {
                    while let Some(sig) = signals.read() {
                        if sig == libc::SIGHUP {
                            match Table::load(table_path).and_then(|t| engine.apply_table(t)) {
                                Ok(()) => log("SIGHUP: table reloaded"),
                                Err(e) => log(&format!("SIGHUP: table not reloaded: {e}")),
                            }
                        } else {
                            log(&format!("signal {sig}: stopping"));
                            break 'main;
                        }
                    }
                }
                KEY_LISTEN => {
                    if let Some(l) = &listener {
                        while let Ok((stream, _)) = l.accept() {
                            let fd = stream.as_raw_fd();
                            if stream.set_nonblocking(true).is_ok() && epoll.add(fd, KEY_CONN + fd as u64).is_ok() {
                                conns.insert(fd, Conn { stream, pending: Vec::new() });
                            }
                        }
                    }
                }
                k if k >= KEY_CONN => {
                    let fd = (k - KEY_CONN) as RawFd;
                    let keep = match conns.get_mut(&fd) {
                        Some(c) => serve_conn(c, &mut engine, table_path),
                        None => false,
                    };
                    if !keep {
                        epoll.del(fd);
                        conns.remove(&fd);
                    }
                }
                port => {
                    let port = port as usize;
                    for _ in 0..BUDGET {
                        let mut buf = engine.buffer();
                        match socks.0[port].recv(&mut buf) {
                            Ok(Some(len)) if len <= buf.len() => {
                                engine.ingress(sys::now_ns(), port, buf, len, &mut socks);
                            }
                            Ok(Some(len)) => {
                                engine.note_oversize(port);
                                engine.recycle(buf);
                                if !oversize_warned {
                                    oversize_warned = true;
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
                }
            }
        }
    }
    write_stats(&engine);
    if let Some(path) = control_path {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
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
