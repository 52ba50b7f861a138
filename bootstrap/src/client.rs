//! A client's side of the rendezvous: bounded reads and writes, and the join itself (its
//! hello and proof, rank 0's answer: a refusal or the ids, its acknowledgement), over TCP
//! to rank 0 or a local socket to its host's first rank.

use std::time::Instant;

use super::auth::*;
use super::launcher::LaunchEnv;
use super::stream::Timed;
use unicomm_core::shrink::MAX_IDS;
use unicomm_core::Error;

/// Reads exactly `buf.len()` bytes before `deadline` (each read's timeout is what is left).
pub(crate) fn read_until<S: Timed>(
    s: &mut S,
    buf: &mut [u8],
    deadline: Instant,
) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

pub(crate) fn write_until<S: Timed>(
    s: &mut S,
    buf: &[u8],
    deadline: Instant,
) -> std::io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(std::io::ErrorKind::TimedOut.into());
    }
    s.set_write_timeout(Some(left))?;
    s.write_all(buf)
}

/// Why a join failed: final (the real rank 0 refused this rank) or worth retrying (a
/// stranger on the port, a broken connection).
#[derive(Debug)]
pub(crate) enum JoinError {
    Refused(Error),
    Retry(Error),
}

impl From<Error> for JoinError {
    fn from(e: Error) -> Self {
        JoinError::Retry(e)
    }
}

/// A client's side: its hello and proof in one message, then rank 0's answer (a refusal, or
/// the `count` ids after rank 0's proof; from rank 0 over TCP, or from the host's first rank
/// on its local socket), then its acknowledgement over rank 0's nonce, without which it does
/// not count as joined. It waits for the answer's first byte only until `answer_by` (a process that holds the
/// connection open and silent, a squatter that took it before rank 0 listened, is then left
/// for a new connection), and for the rest until `deadline`.
pub(crate) fn join<S: Timed>(
    s: &mut S,
    env: &LaunchEnv,
    count: usize,
    (answer_by, deadline): (Instant, Instant),
) -> std::result::Result<Vec<u8>, JoinError> {
    let j = Joining::hello(s, env, count, deadline)?;
    let mut kind = [0u8; 1];
    read_until(s, &mut kind, answer_by.min(deadline)).map_err(|e| io("rank 0's answer", e))?;
    match kind[0] {
        REFUSED => Err(j.refused(s, env)),
        IDS => j.ids(s),
        other => Err(Error::Bootstrap {
            reason: format!("answer {other} is not unicomm's (a stranger on the port)"),
        }
        .into()),
    }
}

/// A client's join in progress: what its proofs cover (its rank and world as sent, its
/// nonce, the number of ids it expects).
struct Joining {
    key: Key,
    nonce: [u8; 16],
    r: [u8; 4],
    w: [u8; 4],
    expect: [u8; 2],
    count: usize,
    deadline: Instant,
}

impl Joining {
    /// Sends the hello and its proof in one message.
    fn hello<S: Timed>(
        s: &mut S,
        env: &LaunchEnv,
        count: usize,
        deadline: Instant,
    ) -> std::result::Result<Joining, JoinError> {
        let key = Key::new(&env.token);
        let h = Hello {
            rank: env.rank,
            world: env.world_size,
            nonce: nonce()?,
        };
        let (r, w) = (
            (h.rank as u32).to_le_bytes(),
            (h.world as u32).to_le_bytes(),
        );
        let expect = u16::try_from(count)
            .map_err(|_| Error::invalid("count", format!("{count} ids; at most {MAX_IDS}")))?
            .to_le_bytes();
        let mut first = [0u8; FIRST_LEN];
        first[..HELLO_LEN].copy_from_slice(&h.bytes());
        first[HELLO_LEN..HELLO_LEN + 2].copy_from_slice(&expect);
        first[HELLO_LEN + 2..].copy_from_slice(&key.mac(b"client", &[&r, &w, &h.nonce, &expect]));
        write_until(s, &first, deadline).map_err(|e| io("hello", e))?;
        Ok(Joining {
            key,
            nonce: h.nonce,
            r,
            w,
            expect,
            count,
            deadline,
        })
    }

    /// Rank 0's refusal: believed only from a holder of the token (a stranger's is retried);
    /// then final, naming why.
    fn refused<S: Timed>(&self, s: &mut S, env: &LaunchEnv) -> JoinError {
        let mut refusal = [0u8; 2 + 32];
        if let Err(e) = read_until(s, &mut refusal, self.deadline) {
            return io("rank 0's refusal", e).into();
        }
        let n = [refusal[0], refusal[1]];
        let proof: [u8; 32] = refusal[2..].try_into().unwrap_or([0; 32]);
        let (r, w) = (&self.r, &self.w);
        if !same(&proof, &self.key.mac(b"refused", &[r, w, &self.nonce, &n])) {
            return Error::Bootstrap {
                reason: "a refusal without this job's token (a stranger on the port)".into(),
            }
            .into();
        }
        if n != self.expect {
            return other_count(u16::from_le_bytes(n), self.count);
        }
        JoinError::Refused(Error::Bootstrap {
            reason: format!(
                "rank 0 refused rank {} of {} (another world size, or this rank already joined)",
                env.rank, env.world_size
            ),
        })
    }

    /// Rank 0's ids after its proof, then this rank's acknowledgement over rank 0's fresh
    /// nonce (a replay of this hello, a squatter's capture, cannot take this rank's place).
    fn ids<S: Timed>(&self, s: &mut S) -> std::result::Result<Vec<u8>, JoinError> {
        let mut ch = [0u8; IDS_HEAD_LEN];
        read_until(s, &mut ch, self.deadline).map_err(|e| io("rank 0's answer", e))?;
        let mut ns = [0u8; 16];
        ns.copy_from_slice(&ch[..16]);
        let n = [ch[16], ch[17]];
        let mut proof = [0u8; 32];
        proof.copy_from_slice(&ch[18..]);
        let (r, w) = (&self.r, &self.w);
        if !same(
            &proof,
            &self.key.mac(b"server", &[r, w, &self.nonce, &ns, &n]),
        ) {
            return Err(Error::Bootstrap {
                reason: "the process on the rendezvous port does not hold this job's token \
                         (another job, or a stranger on the port)"
                    .into(),
            }
            .into());
        }
        if n != self.expect {
            return Err(other_count(u16::from_le_bytes(n), self.count));
        }
        let mut ids = vec![0u8; 128 * self.count];
        read_until(s, &mut ids, self.deadline).map_err(|e| io("receiving the id", e))?;
        self.key.seal(&mut ids, (&self.nonce, &ns));
        let mut ack = [0u8; ACK_LEN];
        ack[0] = ACK;
        ack[1..].copy_from_slice(&self.key.mac(b"ack", &[r, w, &self.nonce, &ns]));
        write_until(s, &ack, self.deadline).map_err(|e| io("the acknowledgement", e))?;
        Ok(ids)
    }
}

/// Rank 0 hands out `served` ids, this rank expects `count` (an authenticated answer: final).
fn other_count(served: u16, count: usize) -> JoinError {
    JoinError::Refused(Error::Bootstrap {
        reason: format!(
            "rank 0 hands out {served} unique id(s), this rank expects {count} \
             (UNICOMM_RANKS_PER_ROOT or the library's version differs between ranks)"
        ),
    })
}
