//! Who the hub's loop admits: connections taken from the listener (at most
//! `MAX_UNAUTHENTICATED` unauthenticated ones, the oldest silent one giving way), hellos
//! authenticated, refused with a reason, or dropped as a stranger's.

use std::sync::Arc;
use std::time::Instant;

use mio::net::TcpListener;
use mio::{Interest, Poll, Token};

use super::{queue, Conn, Host, Served, Stage, HELLO_WITHIN, MAX_UNAUTHENTICATED};
use crate::procs::wire::*;

impl Served {
    fn unauthenticated(&self) -> usize {
        self.conns
            .values()
            .filter(|c| matches!(c.stage, Stage::Hello(_)))
            .count()
    }

    /// The oldest unauthenticated connection but `newest` that has sent nothing yet: what
    /// gives way to a newer arrival at the cap. A rank sends its hello as soon as it
    /// connects (its bytes are usually in before the hub accepts it), so a connection silent
    /// while others arrive is a stranger's, or a rank that reconnects when closed unanswered.
    fn oldest_silent(&self, newest: Token) -> Option<Token> {
        let mut silent: Vec<(Instant, Token)> = self
            .conns
            .iter()
            .filter_map(|(t, c)| match c.stage {
                Stage::Hello(d) if c.inb.is_empty() && *t != newest => Some((d, *t)),
                _ => None,
            })
            .collect();
        silent.sort_unstable();
        // Bytes not read yet count: a hello waiting in the socket is not silence.
        silent.into_iter().map(|(_, t)| t).find(|t| {
            let mut b = [0u8; 1];
            self.conns
                .get(t)
                .is_some_and(|c| !matches!(c.s.peek(&mut b), Ok(n) if n > 0))
        })
    }

    /// Takes every queued connection; over `MAX_UNAUTHENTICATED` unauthenticated ones, each
    /// arrival takes the place of the oldest silent one (or, where every other slot has
    /// started a hello, is closed itself: a rank retries a connection closed unanswered), so
    /// silent strangers cannot hold a real rank in the kernel's queue past its deadline (300
    /// of them once held the slots 2 s each in turn) and what they hold stays bounded.
    pub(super) fn accept(&mut self, poll: &Poll, listener: &TcpListener, ready: &mut Vec<Token>) {
        loop {
            match listener.accept() {
                Ok((mut s, peer)) if peer.ip().is_loopback() => {
                    let t = Token(self.next);
                    self.next += 1;
                    let _ = s.set_nodelay(true);
                    if poll
                        .registry()
                        .register(&mut s, t, Interest::READABLE)
                        .is_ok()
                    {
                        let stage = Stage::Hello(Instant::now() + HELLO_WITHIN);
                        let conn = Conn {
                            s,
                            inb: Vec::new(),
                            out: Vec::new(),
                            stage,
                            writing: false,
                            more: false,
                        };
                        self.conns.insert(t, conn);
                        ready.push(t); // its hello may have come before the registration
                        if self.unauthenticated() > MAX_UNAUTHENTICATED {
                            let out = self.oldest_silent(t).unwrap_or(t);
                            self.close(poll, out);
                        }
                    }
                }
                Ok(_) => {} // not from this machine: dropped
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }

    /// An authenticated hello: the life connection goes to the watcher, a calls connection
    /// stays here. `false` for anything else (dropped as a stranger's).
    pub(super) fn hello<H: Host>(
        &mut self,
        poll: &Poll,
        h: &Arc<H>,
        t: Token,
        hello: &[u8],
    ) -> bool {
        let (rank, kind) = match h.authenticate(hello) {
            Ok(k) => k,
            Err(Some(refusal)) => return self.refuse(poll, t, &refusal.answer(h.world())),
            Err(None) => return false,
        };
        match kind {
            LIFE => {
                if !h.join(rank) {
                    return self.refuse(poll, t, &Refusal::Twice.answer(h.world()));
                }
                let Some(mut c) = self.conns.remove(&t) else {
                    return false;
                };
                let _ = poll.registry().deregister(&mut c.s);
                let mut s = std::net::TcpStream::from(c.s);
                let _ = s.set_nonblocking(false);
                let _ = s.set_write_timeout(Some(HELLO_WITHIN));
                if send_frame(&mut s, &[0]).is_err() {
                    h.life_ended(rank);
                    return true;
                }
                h.watch_life(rank, s);
                true
            }
            CALLS if h.live(rank) => {
                let Some(c) = self.conns.get_mut(&t) else {
                    return false;
                };
                c.stage = Stage::Calls { rank, busy: false };
                queue(c, &[0]);
                true
            }
            _ => false,
        }
    }

    /// Answers an authenticated hello the hub refuses (the rank then fails at once, naming
    /// why, instead of retrying until its deadline) and closes the connection: `false`.
    fn refuse(&mut self, poll: &Poll, t: Token, answer: &[u8]) -> bool {
        if let Some(mut c) = self.conns.remove(&t) {
            let _ = poll.registry().deregister(&mut c.s);
            let mut s = std::net::TcpStream::from(c.s);
            let _ = s.set_nonblocking(false);
            let _ = s.set_write_timeout(Some(HELLO_WITHIN));
            let _ = send_frame(&mut s, answer);
        }
        false
    }
}
