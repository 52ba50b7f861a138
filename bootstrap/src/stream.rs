//! The two places a rendezvous is served from: rank 0's TCP port, and (with forwarding) a
//! host's local socket, where the host's first rank serves its other ranks. One handshake
//! over either.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use mio::event::Source;
use mio::{Interest, Registry, Token};
use unicomm_core::Result;

use super::auth::io;

/// The most listen queues rank 0 opens on its address (each holds up to the kernel's cap,
/// `net.core.somaxconn`: 65,536 ranks queued at 4,096).
pub(crate) const MAX_QUEUES: usize = 16;

/// Rank 0's listeners on exactly `addr`, with queues for `world` joining ranks: one where
/// the kernel's cap on a queue (`net.core.somaxconn`, 4,096 by default since Linux 5.4)
/// holds them, else enough for a quarter more (at most [`MAX_QUEUES`]) on the same address
/// and port (`SO_REUSEPORT`: the kernel spreads arrivals over them by their addresses and
/// ports, each with its own queue). Ranks arriving together beyond one queue would otherwise
/// have their connections dropped by the kernel and retried a second later (a listen
/// overflow).
pub(crate) fn listen(addr: SocketAddr, world: usize) -> Result<Vec<Listener>> {
    listen_capped(addr, world, somaxconn())
}

/// [`listen`] with the kernel's cap on one queue given.
pub(crate) fn listen_capped(addr: SocketAddr, world: usize, cap: usize) -> Result<Vec<Listener>> {
    use socket2::{Domain, Protocol, Socket, Type};
    let what = format!("rank 0 cannot listen on {addr}");
    // Beyond one queue a quarter to spare: the kernel spreads arrivals by a hash of their
    // addresses, not evenly (16,384 ranks over four full-size queues on a 16-core host: 17
    // connections overflowed one of them in one run of three).
    let cap = cap.max(1);
    let queues = match world <= cap {
        true => 1,
        false => (world.saturating_mul(5) / 4)
            .div_ceil(cap)
            .clamp(2, MAX_QUEUES),
    };
    let backlog = world.div_ceil(queues).clamp(128, 65_535) as i32;
    // Shared queues: the port is first taken in one step that another rank 0 of the same
    // job, started at the same moment, cannot also take (two that probed, then bound their
    // shared queues, both had the port in 7-15 of 20 trials).
    let lock = match queues > 1 {
        true => Some(std::sync::Arc::new(PortLock::take(addr, &what)?)),
        false => None,
    };
    if queues > 1 {
        // Shared queues would also share the port with a stale rank 0 of an earlier run
        // that opened its own shared queues there (same user, same token: it would hand
        // some ranks its old ids). A plain socket binds only where nothing listens: the
        // port is refused at once if anything does, as it is with one queue.
        let probe = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
            .map_err(|e| io(&what, e))?;
        probe.set_reuse_address(true).map_err(|e| io(&what, e))?;
        probe.bind(&addr.into()).map_err(|e| {
            io(
                &format!("{what} (something listens there already: a rank 0 of an earlier run?)"),
                e,
            )
        })?;
    }
    (0..queues)
        .map(|_| {
            let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
                .map_err(|e| io(&what, e))?;
            s.set_reuse_address(true).map_err(|e| io(&what, e))?;
            // One queue: the port is this job's alone (another socket on it fails the bind,
            // so a stale rank 0 on the same port is an error at once).
            if queues > 1 {
                s.set_reuse_port(true).map_err(|e| io(&what, e))?;
            }
            s.bind(&addr.into()).map_err(|e| io(&what, e))?;
            s.listen(backlog).map_err(|e| io(&what, e))?;
            s.set_nonblocking(true).map_err(|e| io(&what, e))?;
            Ok(Listener::Tcp(TcpQueue {
                l: mio::net::TcpListener::from_std(s.into()),
                _lock: lock.clone(),
            }))
        })
        .collect()
}

/// The kernel's cap on a listen queue (`net.core.somaxconn`); Linux's default where it
/// cannot be read.
fn somaxconn() -> usize {
    let read = unicomm_core::env::read_bounded("/proc/sys/net/core/somaxconn".as_ref(), 32);
    read.ok()
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4096)
}

/// The port of a rank 0 with shared queues, taken in one step: on Linux a name of the
/// host's abstract socket namespace (per network namespace, as the port is), bound by one
/// socket at a time and released when its last queue closes (the process's end included).
/// Elsewhere nothing: the probe's bind alone, which two rank 0s started together can both
/// pass.
pub(crate) struct PortLock {
    #[cfg(target_os = "linux")]
    _name: std::os::unix::net::UnixDatagram,
}

impl PortLock {
    fn take(addr: SocketAddr, what: &str) -> Result<PortLock> {
        #[cfg(target_os = "linux")]
        {
            use std::os::linux::net::SocketAddrExt;
            let name = format!("unicomm-rendezvous/{addr}");
            let at = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
                .map_err(|e| io(what, e))?;
            let s = std::os::unix::net::UnixDatagram::bind_addr(&at).map_err(|e| {
                io(
                    &format!(
                        "{what} (a rank 0 listens there already: its shared queues hold the port)"
                    ),
                    e,
                )
            })?;
            // Nothing is ever read from it: what a stranger sends is refused.
            let _ = s.shutdown(std::net::Shutdown::Read);
            Ok(PortLock { _name: s })
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (addr, what);
            Ok(PortLock {})
        }
    }
}

/// One of rank 0's TCP queues, holding the port's lock where the queues share the port.
pub(crate) struct TcpQueue {
    l: mio::net::TcpListener,
    _lock: Option<std::sync::Arc<PortLock>>,
}

impl Source for TcpQueue {
    fn register(&mut self, r: &Registry, t: Token, i: Interest) -> std::io::Result<()> {
        self.l.register(r, t, i)
    }
    fn reregister(&mut self, r: &Registry, t: Token, i: Interest) -> std::io::Result<()> {
        self.l.reregister(r, t, i)
    }
    fn deregister(&mut self, r: &Registry) -> std::io::Result<()> {
        self.l.deregister(r)
    }
}

/// A listener the server's event loop accepts on.
pub(crate) enum Listener {
    Tcp(TcpQueue),
    #[cfg(target_os = "linux")]
    Local(mio::net::UnixListener),
}

/// One accepted connection.
pub(crate) enum Stream {
    Tcp(mio::net::TcpStream),
    #[cfg(target_os = "linux")]
    Local(mio::net::UnixStream),
}

impl Listener {
    pub(crate) fn accept(&self) -> std::io::Result<Stream> {
        match self {
            Listener::Tcp(q) => q.l.accept().map(|(s, _)| Stream::Tcp(s)),
            #[cfg(target_os = "linux")]
            Listener::Local(l) => l.accept().map(|(s, _)| Stream::Local(s)),
        }
    }
}

macro_rules! both {
    ($self:ident, $s:ident => $e:expr) => {
        match $self {
            Self::Tcp($s) => $e,
            #[cfg(target_os = "linux")]
            Self::Local($s) => $e,
        }
    };
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        both!(self, s => s.read(buf))
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        both!(self, s => s.write(buf))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        both!(self, s => s.flush())
    }
}

macro_rules! source {
    ($ty:ty) => {
        impl Source for $ty {
            fn register(&mut self, r: &Registry, t: Token, i: Interest) -> std::io::Result<()> {
                both!(self, s => s.register(r, t, i))
            }
            fn reregister(&mut self, r: &Registry, t: Token, i: Interest) -> std::io::Result<()> {
                both!(self, s => s.reregister(r, t, i))
            }
            fn deregister(&mut self, r: &Registry) -> std::io::Result<()> {
                both!(self, s => s.deregister(r))
            }
        }
    };
}
source!(Listener);
source!(Stream);

/// A client's blocking socket with per-operation deadlines (TCP to rank 0, or the host's
/// local socket).
pub(crate) trait Timed: Read + Write {
    fn set_read_timeout(&self, d: Option<Duration>) -> std::io::Result<()>;
    fn set_write_timeout(&self, d: Option<Duration>) -> std::io::Result<()>;
}

impl Timed for std::net::TcpStream {
    fn set_read_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        std::net::TcpStream::set_read_timeout(self, d)
    }
    fn set_write_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        std::net::TcpStream::set_write_timeout(self, d)
    }
}

#[cfg(target_os = "linux")]
impl Timed for std::os::unix::net::UnixStream {
    fn set_read_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        std::os::unix::net::UnixStream::set_read_timeout(self, d)
    }
    fn set_write_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        std::os::unix::net::UnixStream::set_write_timeout(self, d)
    }
}
