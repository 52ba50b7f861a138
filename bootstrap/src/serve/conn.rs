//! One connection on rank 0's event loop: reading a rank's hello and proof, writing the
//! answer, reading the acknowledgement, each as far as the socket lets it go now.

use std::io::{ErrorKind, Read, Write};
use std::time::Instant;

use super::{Conn, Server, Step, PER_CONNECTION};
use crate::auth::{same, Hello, ACK, ACK_LEN, FIRST_LEN, HELLO_LEN};
use crate::stream::Stream;

impl Conn {
    pub(super) fn new(s: Stream, generation: u64) -> Conn {
        Conn {
            s,
            generation,
            answered: None,
            acking: None,
            inbuf: [0; FIRST_LEN],
            got: 0,
            out: Vec::new(),
            sent: 0,
            deadline: Instant::now() + PER_CONNECTION,
            counted: false,
        }
    }

    /// As far as the socket lets it go now.
    pub(super) fn advance(&mut self, srv: &mut Server<'_>) -> Step {
        if let Some((rank, due)) = self.acking {
            return match self.fill(ACK_LEN) {
                Ok(true) => {
                    let proof: [u8; 32] = self.inbuf[1..ACK_LEN].try_into().unwrap_or([0; 32]);
                    if self.inbuf[0] == ACK && same(&proof, &due) {
                        srv.joined(rank)
                    } else {
                        Step::Dropped(format!(
                            "an acknowledgement for rank {rank} that does not prove the token (a replayed hello?)"
                        ))
                    }
                }
                Ok(false) => Step::Waiting,
                Err(why) => Step::Dropped(format!("rank {rank}'s acknowledgement: {why}")),
            };
        }
        if self.answered.is_none() {
            // A hello's worth is judged as soon as it is in: a stranger's bytes are dropped
            // at once, not held until its connection's deadline.
            let whole = self.fill(HELLO_LEN).and_then(|_| {
                if self.got < HELLO_LEN {
                    return Ok(false);
                }
                Hello::parse(&self.inbuf[..HELLO_LEN]).map_err(|e| e.to_string())?;
                self.fill(FIRST_LEN)
            });
            match whole {
                Ok(true) => {}
                Ok(false) => return Step::Waiting,
                Err(why) => return Step::Dropped(why),
            }
            let (outcome, out) = match srv.first(&self.inbuf) {
                Ok(answer) => answer,
                Err(why) => return Step::Dropped(why),
            };
            self.answered = Some(outcome);
            self.out = out;
            self.sent = 0;
        }
        match self.flush(&mut srv.tally.writes) {
            Ok(true) => {}
            Ok(false) => return Step::Waiting,
            Err(e) => return Step::Dropped(format!("writing: {e}")),
        }
        match self.answered.take() {
            Some(Ok(due)) => {
                self.acking = Some(due);
                self.got = 0;
                self.advance(srv)
            }
            Some(Err(why)) => Step::Dropped(why),
            None => Step::Dropped("written to before its answer".into()),
        }
    }

    /// Writes what is pending, counting the write calls in `writes`; `Ok(true)` once all
    /// of it is out.
    fn flush(&mut self, writes: &mut u64) -> std::io::Result<bool> {
        while self.sent < self.out.len() {
            match self.s.write(&self.out[self.sent..]) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.sent += n;
                    *writes += 1;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Reads until `want` bytes are in; `Ok(true)` then.
    fn fill(&mut self, want: usize) -> std::result::Result<bool, String> {
        while self.got < want {
            match self.s.read(&mut self.inbuf[self.got..want]) {
                Ok(0) => return Err("closed before its handshake ended".into()),
                Ok(n) => self.got += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("reading: {e}")),
            }
        }
        Ok(true)
    }
}
