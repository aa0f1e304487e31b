//! Thin wrappers over the Linux calls linkemu needs: AF_PACKET sockets bound to one
//! interface, epoll, a CLOCK_MONOTONIC timerfd, a signalfd, and the ethtool ioctls that turn
//! segmentation and checksum offloads off.

use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;

// Not (yet) in every libc release.
const PACKET_QDISC_BYPASS: libc::c_int = 20;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn setsockopt_int(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    let v = value;
    cvt(unsafe {
        libc::setsockopt(fd, level, name, &v as *const _ as *const libc::c_void,
                         std::mem::size_of::<libc::c_int>() as libc::socklen_t)
    })
    .map(|_| ())
}

pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn ifindex(dev: &str) -> io::Result<u32> {
    let name = CString::new(dev).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))?;
    match unsafe { libc::if_nametoindex(name.as_ptr()) } {
        0 => Err(io::Error::new(io::ErrorKind::NotFound, format!("no interface '{dev}' in this network namespace"))),
        i => Ok(i),
    }
}

fn ifreq(dev: &str) -> libc::ifreq {
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in dev.bytes().take(libc::IFNAMSIZ - 1).enumerate() {
        req.ifr_name[i] = b as libc::c_char;
    }
    req
}

pub fn mtu(dev: &str) -> io::Result<u32> {
    let fd = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    let mut req = ifreq(dev);
    let r = unsafe { libc::ioctl(fd, libc::SIOCGIFMTU, &mut req) };
    let err = io::Error::last_os_error();
    unsafe { libc::close(fd) };
    if r < 0 {
        return Err(err);
    }
    Ok(unsafe { req.ifr_ifru.ifru_mtu } as u32)
}

/// A raw packet socket bound to one interface, non-blocking, that does not see the frames
/// it sends itself and bypasses the qdisc on transmit.
pub struct PacketSocket {
    pub fd: RawFd,
    pub dev: String,
}

impl PacketSocket {
    pub fn open(dev: &str, rcvbuf: usize) -> io::Result<PacketSocket> {
        let index = ifindex(dev)?;
        // Protocol 0 until bound: an unbound ETH_P_ALL socket would see every interface.
        let fd = cvt(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) })?;
        let sock = PacketSocket { fd, dev: dev.to_string() };
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = index as i32;
        setsockopt_int(fd, libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
            .map_err(|e| io::Error::new(e.kind(), format!("{dev}: PACKET_IGNORE_OUTGOING (kernel >= 4.20): {e}")))?;
        // Best effort: without it frames go through the (noqueue) qdisc, which still works.
        let _ = setsockopt_int(fd, libc::SOL_PACKET, PACKET_QDISC_BYPASS, 1);
        // A deep receive buffer absorbs bursts while the loop is busy; FORCE needs CAP_NET_ADMIN.
        if setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, rcvbuf as libc::c_int).is_err() {
            let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, rcvbuf as libc::c_int);
        }
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, 4 << 20);
        cvt(unsafe {
            libc::bind(fd, &sll as *const _ as *const libc::sockaddr, std::mem::size_of::<libc::sockaddr_ll>() as u32)
        })
        .map_err(|e| io::Error::new(e.kind(), format!("bind to {dev}: {e}")))?;
        // veths deliver frames for other MACs anyway; promiscuous mode makes that explicit.
        let mut mreq: libc::packet_mreq = unsafe { std::mem::zeroed() };
        mreq.mr_ifindex = index as i32;
        mreq.mr_type = libc::PACKET_MR_PROMISC as u16;
        let _ = unsafe {
            libc::setsockopt(fd, libc::SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, &mreq as *const _ as *const libc::c_void,
                             std::mem::size_of::<libc::packet_mreq>() as u32)
        };
        Ok(sock)
    }

    /// One frame into `buf`: Ok(Some(real length)) (may exceed buf.len(): truncated),
    /// Ok(None) when nothing is waiting.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        let r = unsafe { libc::recv(self.fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), libc::MSG_TRUNC) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
                _ => Err(e),
            };
        }
        Ok(Some(r as usize))
    }

    pub fn send(&self, frame: &[u8]) -> bool {
        let r = unsafe { libc::send(self.fd, frame.as_ptr() as *const libc::c_void, frame.len(), 0) };
        r == frame.len() as isize
    }
}

impl Drop for PacketSocket {
    fn drop(&mut self) {
        unsafe { libc::close(self.fd) };
    }
}

pub struct Epoll {
    pub fd: RawFd,
}

impl Epoll {
    pub fn new() -> io::Result<Epoll> {
        Ok(Epoll { fd: cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })? })
    }

    pub fn add(&self, fd: RawFd, key: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: key };
        cvt(unsafe { libc::epoll_ctl(self.fd, libc::EPOLL_CTL_ADD, fd, &mut ev) }).map(|_| ())
    }

    /// What `fd` (added before) wakes the loop for: input, output or both.
    pub fn modify(&self, fd: RawFd, key: u64, input: bool, output: bool) -> io::Result<()> {
        let events = if input { libc::EPOLLIN as u32 } else { 0 } | if output { libc::EPOLLOUT as u32 } else { 0 };
        let mut ev = libc::epoll_event { events, u64: key };
        cvt(unsafe { libc::epoll_ctl(self.fd, libc::EPOLL_CTL_MOD, fd, &mut ev) }).map(|_| ())
    }

    pub fn del(&self, fd: RawFd) {
        unsafe { libc::epoll_ctl(self.fd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
    }

    /// Wait (forever, or `timeout_ms`) and return the keys of ready descriptors.
    pub fn wait(&self, events: &mut [libc::epoll_event], timeout_ms: i32) -> io::Result<usize> {
        let r = unsafe { libc::epoll_wait(self.fd, events.as_mut_ptr(), events.len() as i32, timeout_ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                return Ok(0);
            }
            return Err(e);
        }
        Ok(r as usize)
    }
}

impl Drop for Epoll {
    fn drop(&mut self) {
        unsafe { libc::close(self.fd) };
    }
}

/// A CLOCK_MONOTONIC timer armed at absolute times (hrtimer precision, no timer slack).
pub struct Timer {
    pub fd: RawFd,
    armed: Option<u64>,
}

impl Timer {
    pub fn new() -> io::Result<Timer> {
        let fd = cvt(unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) })?;
        Ok(Timer { fd, armed: None })
    }

    /// Arm at `at` (ns), or disarm with None; a no-op when already set so.
    pub fn set(&mut self, at: Option<u64>) {
        if self.armed == at {
            return;
        }
        let mut spec: libc::itimerspec = unsafe { std::mem::zeroed() };
        if let Some(t) = at {
            // 0 would disarm: an already-due time still needs to fire.
            let t = t.max(1);
            spec.it_value.tv_sec = (t / 1_000_000_000) as libc::time_t;
            spec.it_value.tv_nsec = (t % 1_000_000_000) as libc::c_long;
        }
        unsafe { libc::timerfd_settime(self.fd, libc::TFD_TIMER_ABSTIME, &spec, std::ptr::null_mut()) };
        self.armed = at;
    }

    /// After it fired: clear the readiness and forget the armed time.
    pub fn clear(&mut self) {
        let mut n = 0u64;
        unsafe { libc::read(self.fd, &mut n as *mut u64 as *mut libc::c_void, 8) };
        self.armed = None;
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        unsafe { libc::close(self.fd) };
    }
}

/// SIGTERM, SIGINT and SIGHUP delivered as readable events instead of handlers.
pub struct Signals {
    pub fd: RawFd,
}

impl Signals {
    pub fn new() -> io::Result<Signals> {
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
                libc::sigaddset(&mut set, s);
            }
            cvt(libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()))?;
            let fd = cvt(libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC))?;
            // A broken control client must not kill the forwarder.
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            Ok(Signals { fd })
        }
    }

    pub fn read(&self) -> Option<i32> {
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        let r = unsafe { libc::read(self.fd, &mut info as *mut _ as *mut libc::c_void, size) };
        if r == size as isize {
            Some(info.ssi_signo as i32)
        } else {
            None
        }
    }
}

/// Make the calling thread SCHED_FIFO at `priority`.
pub fn set_realtime(priority: u32) -> io::Result<()> {
    let param = libc::sched_param { sched_priority: priority as libc::c_int };
    cvt(unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) }).map(|_| ())
}

/// Enter the network namespace at `path` (e.g. /run/netns/NAME).
pub fn enter_netns(path: &str) -> io::Result<()> {
    let c = CString::new(path).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
    let fd = cvt(unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) })
        .map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))?;
    let r = cvt(unsafe { libc::setns(fd, libc::CLONE_NEWNET) });
    unsafe { libc::close(fd) };
    r.map(|_| ()).map_err(|e| io::Error::new(e.kind(), format!("setns {path}: {e}")))
}

// Legacy ethtool commands (struct ethtool_value): still served by every kernel and need no
// netlink; ethtool(8) is not needed on the machine.
const ETHTOOL_GTXCSUM: u32 = 0x16;
const ETHTOOL_STXCSUM: u32 = 0x17;
const ETHTOOL_GTSO: u32 = 0x1e;
const ETHTOOL_STSO: u32 = 0x1f;
const ETHTOOL_GGSO: u32 = 0x23;
const ETHTOOL_SGSO: u32 = 0x24;
const ETHTOOL_GGRO: u32 = 0x2b;
const ETHTOOL_SGRO: u32 = 0x2c;

#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

fn ethtool(fd: RawFd, dev: &str, cmd: u32, data: u32) -> io::Result<u32> {
    let mut v = EthtoolValue { cmd, data };
    let mut req = ifreq(dev);
    req.ifr_ifru.ifru_data = &mut v as *mut EthtoolValue as *mut libc::c_char;
    cvt(unsafe { libc::ioctl(fd, libc::SIOCETHTOOL, &mut req) })?;
    Ok(v.data)
}

/// Turn TSO, GSO, GRO and transmit checksum offload off on `dev` (in the current network
/// namespace) and check they stayed off. Returns the features that were on before.
pub fn offloads_off(dev: &str) -> io::Result<Vec<&'static str>> {
    let fd = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    let result = (|| {
        let mut was_on = Vec::new();
        for (name, get, set) in [("tso", ETHTOOL_GTSO, ETHTOOL_STSO), ("gso", ETHTOOL_GGSO, ETHTOOL_SGSO),
                                 ("gro", ETHTOOL_GGRO, ETHTOOL_SGRO), ("tx-checksum", ETHTOOL_GTXCSUM, ETHTOOL_STXCSUM)] {
            let on = ethtool(fd, dev, get, 0).map_err(|e| io::Error::new(e.kind(), format!("{dev}: get {name}: {e}")))?;
            if on != 0 {
                was_on.push(name);
                ethtool(fd, dev, set, 0).map_err(|e| io::Error::new(e.kind(), format!("{dev}: {name} off: {e}")))?;
                if ethtool(fd, dev, get, 0)? != 0 {
                    return Err(io::Error::other(format!("{dev}: {name} is still on after turning it off")));
                }
            }
        }
        Ok(was_on)
    })();
    unsafe { libc::close(fd) };
    result
}
