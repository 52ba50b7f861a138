//! Rank 0's answer to a rank's first message, and the acknowledgement that makes the rank
//! joined.

use super::{Outcome, Server, Step};
use crate::auth::{same, Hello, FIRST_LEN, HELLO_LEN, IDS, IDS_HEAD_LEN, REFUSED};

/// A first message's answer: its outcome and the bytes to write; `Err` drops the
/// connection without one.
type Next = std::result::Result<(Outcome, Vec<u8>), String>;

impl Server<'_> {
    /// The answer to a rank's first message: nothing to one that does not prove the token
    /// (dropped); an authenticated refusal to a rank of another world, rank 0's own or one
    /// that joined already; else the ids, sealed, after rank 0's proof, and the
    /// acknowledgement due (the rank counts as joined only once it comes: two connections of
    /// one rank race there).
    pub(super) fn first(&mut self, b: &[u8; FIRST_LEN]) -> Next {
        let h = Hello::parse(&b[..HELLO_LEN]).map_err(|e| e.to_string())?;
        let (r, w) = words(&h);
        let expect = [b[HELLO_LEN], b[HELLO_LEN + 1]];
        let proof: [u8; 32] = b[HELLO_LEN + 2..].try_into().unwrap_or([0; 32]);
        if !same(
            &proof,
            &self.key.mac(b"client", &[&r, &w, &h.nonce, &expect]),
        ) {
            return Err("the client does not hold this job's token".into());
        }
        let world = self.env.world_size;
        let n = ((self.ids.len() / 128) as u16).to_le_bytes();
        let taken = self.served.get(h.rank) != Some(&false);
        if h.world != world || h.rank == 0 || h.rank >= world || taken || expect != n {
            // Authenticated under the client's fresh nonce: only a holder of the token can
            // refuse a rank, so a stranger on the port cannot make it give up.
            let mut msg = vec![REFUSED];
            msg.extend_from_slice(&n);
            msg.extend_from_slice(&self.key.mac(b"refused", &[&r, &w, &h.nonce, &n]));
            let why = match expect != n {
                true => format!(
                    "refused: rank {} expects {} id(s), this rendezvous hands out {}",
                    h.rank,
                    u16::from_le_bytes(expect),
                    u16::from_le_bytes(n)
                ),
                false => format!(
                    "refused: claims rank {} of {}; this job is {world} ranks{}",
                    h.rank,
                    h.world,
                    if taken && h.rank < world {
                        " and that rank already joined"
                    } else {
                        ""
                    }
                ),
            };
            if h.world != world && h.rank < h.world {
                self.misconfigured = Some(format!(
                    "rank {} of this job (it holds the job's token) was told a world of {} ranks, rank 0 one of {world}: every rank must be given the same world size",
                    h.rank, h.world
                ));
            }
            return Ok((Err(why), msg));
        }
        self.nonces.1 += 1;
        let mut ns = [0u8; 16];
        ns.copy_from_slice(&self.nonces.0.mac(b"nonce", &[&self.nonces.1.to_le_bytes()])[..16]);
        let mut msg = Vec::with_capacity(1 + IDS_HEAD_LEN + self.ids.len());
        msg.push(IDS);
        msg.extend_from_slice(&ns);
        msg.extend_from_slice(&n);
        msg.extend_from_slice(&self.key.mac(b"server", &[&r, &w, &h.nonce, &ns, &n]));
        let at = msg.len();
        msg.extend_from_slice(&self.ids);
        self.key.seal(&mut msg[at..], (&h.nonce, &ns));
        let due = self.key.mac(b"ack", &[&r, &w, &h.nonce, &ns]);
        Ok((Ok((h.rank, due)), msg))
    }

    /// `rank` acknowledged its ids: joined, unless it joined already (two processes that
    /// both hold the token claimed it: the job is misconfigured, and rank 0 fails at once).
    pub(super) fn joined(&mut self, rank: usize) -> Step {
        match self.served.get_mut(rank) {
            Some(t) if !*t => {
                *t = true;
                Step::Served
            }
            _ => {
                let why = format!("rank {rank} joined twice (two processes of this job claim it)");
                self.misconfigured = Some(why.clone());
                Step::Dropped(why)
            }
        }
    }
}

fn words(h: &Hello) -> ([u8; 4], [u8; 4]) {
    (
        (h.rank as u32).to_le_bytes(),
        (h.world as u32).to_le_bytes(),
    )
}
