//! The rendezvous' authentication: MACs under the job's token over fresh nonces, and the
//! hello a rank opens with.

use unicomm_core::{Error, Result};

/// The handshake's version is in its magic: a rank of another version is dropped as "not
/// unicomm's" (version 3: the rank's hello, rank 0's answer, the rank's acknowledgement;
/// version 2 had no acknowledgement; version 1 a challenge before the answer).
pub(crate) const MAGIC: &[u8; 8] = b"UNICOMM3";

/// A rank's first and only message: its hello, the number of ids it expects (u16), then its
/// proof of the token over both (`MAC("client", rank, world, nonce, count)`). One round trip: rank 0 answers with the ids (or a
/// refusal) at once, where a challenge first cost each rank two more messages, and rank 0
/// two more system calls and the packets behind them (the kernel's loopback TCP, not the
/// MACs, is nearly all of rank 0's time per rank: 93% under `perf` at 4,096 ranks).
/// Freshness needs no challenge before the answer: the ids are sealed under the rank's nonce
/// and one rank 0 draws for this answer, so no two answers share a keystream, and a replayed
/// hello gets ids it cannot open. A rank counts as joined only once it acknowledges the
/// answer ([`ACK`]: a proof over rank 0's fresh nonce, which a replayer cannot make), so a
/// hello captured by a squatter before rank 0 listened and replayed to it takes no rank's
/// place: the real rank is still served.
pub(crate) const FIRST_LEN: usize = HELLO_LEN + 2 + 32;

/// Rank 0's answers. `REFUSED` is followed by the number of ids rank 0 hands out (u16) and
/// its proof over the rank's hello and that number (32).
pub(crate) const REFUSED: u8 = 0;
pub(crate) const IDS: u8 = 2;
/// After `IDS`: rank 0's nonce (16), the number of ids (u16), its proof (32, over the
/// rank's hello, both nonces and that number); then the ids, sealed.
pub(crate) const IDS_HEAD_LEN: usize = 16 + 2 + 32;
/// A rank's acknowledgement of the ids: `ACK`, then its proof over its hello and rank 0's
/// nonce (`MAC("ack", rank, world, nonce, rank 0's nonce)`). Rank 0 writes nothing back.
pub(crate) const ACK: u8 = 3;
pub(crate) const ACK_LEN: usize = 1 + 32;
pub(crate) fn io(what: &str, e: std::io::Error) -> Error {
    Error::Bootstrap {
        reason: format!("{what}: {e}"),
    }
}

pub(crate) type Mac = hmac::Hmac<sha2::Sha256>;

/// `HMAC-SHA256(token, label || parts...)`.
pub(crate) fn mac(token: &[u8], label: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    use hmac::Mac as _;
    // HMAC takes keys of any length, so this cannot fail.
    let mut m = match <Mac as hmac::digest::KeyInit>::new_from_slice(token) {
        Ok(m) => m,
        Err(_) => return [0; 32],
    };
    m.update(label);
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// The job's token prepared once as an HMAC key (its padded inner and outer states), so
/// that each MAC of a handshake costs two compressions of its message, not a key schedule.
#[derive(Clone)]
pub(crate) struct Key(Mac);

impl Key {
    pub(crate) fn new(token: &[u8]) -> Key {
        // HMAC takes keys of any length: `new_from_slice` cannot fail for it; the empty
        // key stands in where it would.
        Key(<Mac as hmac::digest::KeyInit>::new_from_slice(token)
            .unwrap_or_else(|_| <Mac as hmac::digest::KeyInit>::new(&Default::default())))
    }

    /// `HMAC-SHA256(token, label || parts...)`, as [`mac`].
    pub(crate) fn mac(&self, label: &[u8], parts: &[&[u8]]) -> [u8; 32] {
        use hmac::Mac as _;
        let mut m = self.0.clone();
        m.update(label);
        for p in parts {
            m.update(p);
        }
        m.finalize().into_bytes().into()
    }

    /// The ids sealed (or opened: the same XOR) with the keystream of one handshake.
    pub(crate) fn seal(&self, ids: &mut [u8], nonces: (&[u8; 16], &[u8; 16])) {
        for (k, chunk) in ids.chunks_mut(32).enumerate() {
            let ks = self.mac(b"key", &[nonces.0, nonces.1, &(k as u32).to_le_bytes()]);
            chunk.iter_mut().zip(ks).for_each(|(b, k)| *b ^= k);
        }
    }
}

/// Constant-time comparison of two MACs.
pub(crate) fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

pub(crate) fn nonce() -> Result<[u8; 16]> {
    let mut n = [0u8; 16];
    getrandom::fill(&mut n).map_err(|e| Error::Bootstrap {
        reason: format!("no randomness for the rendezvous: {e}"),
    })?;
    Ok(n)
}

/// A client's first message: magic, rank, world size, nonce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The rank the client claims.
    pub rank: usize,
    /// The world size it claims.
    pub world: usize,
    /// Its nonce.
    pub nonce: [u8; 16],
}

/// The hello's size on the wire.
pub const HELLO_LEN: usize = 32;

impl Hello {
    pub(crate) fn bytes(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&(self.rank as u32).to_le_bytes());
        b[12..16].copy_from_slice(&(self.world as u32).to_le_bytes());
        b[16..].copy_from_slice(&self.nonce);
        b
    }

    /// Parses a hello; anything but this exact format is an error (never a panic: the
    /// rendezvous listens on the network).
    pub fn parse(b: &[u8]) -> Result<Hello> {
        let bad = |why: &str| Error::Bootstrap {
            reason: format!("malformed hello: {why}"),
        };
        if b.len() != HELLO_LEN {
            return Err(bad(&format!("{} bytes, not {HELLO_LEN}", b.len())));
        }
        if &b[..8] != MAGIC {
            return Err(bad("not unicomm's"));
        }
        let word = |r: std::ops::Range<usize>| -> Result<usize> {
            let a: [u8; 4] = b[r].try_into().map_err(|_| bad("short field"))?;
            Ok(u32::from_le_bytes(a) as usize)
        };
        let mut nonce = [0u8; 16];
        nonce.copy_from_slice(&b[16..32]);
        Ok(Hello {
            rank: word(8..12)?,
            world: word(12..16)?,
            nonce,
        })
    }
}
