//! The two places a rendezvous is served from: rank 0's TCP port, and (with forwarding) a
//! host's local socket, where the host's first rank serves its other ranks. One handshake
//! over either.

use std::io::{Read, Write};
use std::time::Duration;

use mio::event::Source;
use mio::{Interest, Registry, Token};

/// A listener the server's event loop accepts on.
pub(crate) enum Listener {
    Tcp(mio::net::TcpListener),
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
            Listener::Tcp(l) => l.accept().map(|(s, _)| Stream::Tcp(s)),
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
