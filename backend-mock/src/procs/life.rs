//! Every rank's life connection watched by one thread of the hub (an event loop, `mio`):
//! a closed connection without the rank's goodbye is its death; the world's poison is sent
//! to each rank once. One wake-up per event and one tick every 50 ms for the whole world,
//! where a thread per rank polling every 50 ms made 20,000 wake-ups a second at 1,023 ranks.

use std::collections::HashMap;
use std::io::Read;
use std::net::TcpStream;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Weak};
use std::time::Duration;

use mio::{Events, Interest, Poll, Token, Waker};

use super::wire::*;
use unicomm_core::{Error, Result};

const WAKER: Token = Token(usize::MAX);
const TICK: Duration = Duration::from_millis(50);

/// What the watcher tells the hub (which owns the lives) and asks of it.
pub(crate) trait Watcher: Send + Sync + 'static {
    /// `rank` said goodbye (it finalized).
    fn departed(&self, rank: usize);
    /// `rank`'s life connection ended (a death unless it said goodbye).
    fn ended(&self, rank: usize);
    /// The world's poison, once there is one.
    fn poisoned(&self) -> Option<Error>;
    /// The hub is shutting down.
    fn stopped(&self) -> bool;
}

/// Where the hub hands over a rank's life connection once it authenticated.
pub(crate) struct Lives {
    tx: Sender<(usize, TcpStream)>,
    waker: Arc<Waker>,
}

impl Lives {
    /// Starts the watching thread for `hub`; it ends when the hub is dropped.
    pub(crate) fn start<H: Watcher>(hub: Weak<H>) -> Result<Lives> {
        let fail = |e: std::io::Error| Error::Bootstrap {
            reason: format!("the mock's hub: its life watcher: {e}"),
        };
        let poll = Poll::new().map_err(fail)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(fail)?);
        let (tx, rx) = channel();
        std::thread::Builder::new()
            .name("unicomm-hub-lives".into())
            .spawn(move || watch(poll, rx, hub))
            .map_err(fail)?;
        Ok(Lives { tx, waker })
    }

    /// Watches `rank`'s life on `s` from now on.
    pub(crate) fn add(&self, rank: usize, s: TcpStream) {
        if self.tx.send((rank, s)).is_ok() {
            let _ = self.waker.wake();
        }
    }
}

struct Watched {
    rank: usize,
    s: mio::net::TcpStream,
    /// The poison frame being sent (once), and how much of it went out.
    told: Option<(Vec<u8>, usize)>,
}

fn watch<H: Watcher>(mut poll: Poll, rx: Receiver<(usize, TcpStream)>, hub: Weak<H>) {
    let mut events = Events::with_capacity(256);
    let mut all: HashMap<Token, Watched> = HashMap::new();
    loop {
        if poll.poll(&mut events, Some(TICK)).is_err() {
            std::thread::sleep(TICK);
        }
        let Some(h) = hub.upgrade() else { return };
        for ev in events.iter() {
            if ev.token() == WAKER {
                continue;
            }
            if let Some(w) = all.get_mut(&ev.token()) {
                if !read_life(&*h, w) {
                    if let Some(mut w) = all.remove(&ev.token()) {
                        let _ = poll.registry().deregister(&mut w.s);
                        h.ended(w.rank);
                    }
                }
            }
        }
        while let Ok((rank, s)) = rx.try_recv() {
            if s.set_nonblocking(true).is_err() {
                h.ended(rank);
                continue;
            }
            let mut s = mio::net::TcpStream::from_std(s);
            let t = Token(rank);
            if poll
                .registry()
                .register(&mut s, t, Interest::READABLE)
                .is_err()
            {
                h.ended(rank);
                continue;
            }
            let mut w = Watched {
                rank,
                s,
                told: None,
            };
            // Bytes (or the end) that came before the registration.
            if read_life(&*h, &mut w) {
                all.insert(t, w);
            } else {
                h.ended(rank);
            }
        }
        if let Some(e) = h.poisoned() {
            tell(&mut all, &e);
        }
        if h.stopped() {
            return;
        }
    }
}

/// Reads what the rank sent; `false` once its connection ended.
fn read_life(h: &impl Watcher, w: &mut Watched) -> bool {
    let mut b = [0u8; 16];
    loop {
        match w.s.read(&mut b) {
            Ok(0) => return false,
            Ok(n) => {
                if b[..n].contains(&op::BYE) {
                    h.departed(w.rank);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

/// The world's poison, once to each rank; what a full socket did not take goes out at the
/// next tick.
fn tell(all: &mut HashMap<Token, Watched>, e: &Error) {
    use std::io::Write;
    let mut w = W::default();
    w.error(e);
    let mut frame = (w.0.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&w.0);
    for x in all.values_mut() {
        let (out, sent) = x.told.get_or_insert_with(|| (frame.clone(), 0));
        while *sent < out.len() {
            match x.s.write(&out[*sent..]) {
                Ok(n) if n > 0 => *sent += n,
                // Full, closed or failed: the next tick tries again (or the rank's end is
                // seen by the reader).
                _ => break,
            }
        }
    }
}
