//! Rank 0's rendezvous running beside its caller ([`exchange_unique_ids_serving`]
//! (super::exchange_unique_ids_serving)): how it ended, asked once the caller is done.

use std::thread::JoinHandle;

use unicomm_core::{Error, Result};

/// The rendezvous rank 0 serves while its caller goes on. It ends by itself: every rank
/// served, or its deadline passed.
#[must_use = "`finish` reports a rendezvous that did not complete"]
pub struct Serving {
    thread: Option<JoinHandle<Result<()>>>,
}

impl Serving {
    /// A rendezvous already over (another rank, the file rendezvous, or served in place).
    pub(crate) fn finished() -> Serving {
        Serving { thread: None }
    }

    /// `serve` on a thread of its own.
    pub(crate) fn spawn(serve: impl FnOnce() -> Result<()> + Send + 'static) -> Result<Serving> {
        let thread = std::thread::Builder::new()
            .name("unicomm-rendezvous".into())
            .spawn(serve)
            .map_err(|e| Error::Bootstrap {
                reason: format!("no thread for rank 0's rendezvous: {e}"),
            })?;
        Ok(Serving {
            thread: Some(thread),
        })
    }

    /// Waits for the rendezvous to end and returns how: `Ok` once every rank holds the ids,
    /// else its error (`Timeout` naming the ranks that never joined). Bounded by the
    /// rendezvous's own deadline.
    pub fn finish(mut self) -> Result<()> {
        match self.thread.take() {
            None => Ok(()),
            Some(t) => t.join().unwrap_or_else(|_| {
                Err(Error::Bootstrap {
                    reason: "rank 0's rendezvous thread panicked".into(),
                })
            }),
        }
    }

    /// Whether the rendezvous is over (without waiting).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Rank 0's communicator made by `create` while the rendezvous serves the others, and
    /// the rendezvous finished after it. A rendezvous that fails first (a rank told another
    /// world size, a rank claimed twice, its deadline) ends the wait at once with its error:
    /// a library's creation waits for every rank with a deadline of its own (NCCL's
    /// `ncclCommInitRank`, 10 minutes by default), so `create` runs on a thread of its own
    /// and is left to end there. A creation that fails names the ranks that never came
    /// where the rendezvous already knows them.
    pub fn create_beside<T: Send + 'static>(
        self,
        create: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let ended = |r: Result<T>, serving: Serving| match r {
            // Created: every rank held the ids, so the rendezvous ends at once.
            Ok(c) => serving.finish().map(|()| c),
            Err(e) if serving.is_finished() => Err(serving.finish().err().unwrap_or(e)),
            // Left to serve the others until its deadline.
            Err(e) => Err(e),
        };
        if self.is_finished() {
            return ended(create(), self);
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("unicomm-create".into())
            .spawn(move || drop(tx.send(create())))
            .map_err(|e| Error::Bootstrap {
                reason: format!("no thread for rank 0's creation: {e}"),
            })?;
        use std::sync::mpsc::RecvTimeoutError;
        loop {
            match rx.recv_timeout(std::time::Duration::from_millis(5)) {
                Ok(r) => return ended(r, self),
                Err(RecvTimeoutError::Timeout) if self.is_finished() => break,
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Error::Bootstrap {
                        reason: "rank 0's creation ended without a result".into(),
                    })
                }
            }
        }
        self.finish()?;
        // Every rank holds the ids: the creation ends by itself, within its own deadline.
        match rx.recv() {
            Ok(r) => r,
            Err(_) => Err(Error::Bootstrap {
                reason: "rank 0's creation ended without a result".into(),
            }),
        }
    }
}

impl Drop for Serving {
    /// Never waits: the thread ends by the rendezvous's deadline on its own.
    fn drop(&mut self) {
        self.thread.take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A rendezvous that fails while the creation still waits for the ranks (as NCCL's
    /// init waits for a rank the rendezvous refused) ends rank 0's wait at once with the
    /// rendezvous's error, not at the creation's deadline.
    #[test]
    fn a_failed_rendezvous_ends_the_wait_for_the_creation_at_once() {
        let serving = Serving::spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            Err(Error::invalid(
                "WORLD_SIZE",
                "rank 1 was told a world of 3 ranks",
            ))
        })
        .unwrap();
        let t = Instant::now();
        let r = serving.create_beside(|| {
            std::thread::sleep(Duration::from_secs(30));
            Ok(())
        });
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(
            matches!(&r, Err(Error::InvalidArgument { reason, .. }) if reason.contains("world of 3")),
            "{r:?}"
        );
    }

    /// A rendezvous that served every rank leaves the creation's result as it is; a
    /// creation that fails after a failed rendezvous gets the rendezvous's error, which
    /// names the ranks.
    #[test]
    fn the_creation_s_result_after_a_rendezvous_that_served_or_failed() {
        let served = Serving::spawn(|| Ok(())).unwrap();
        assert_eq!(served.create_beside(|| Ok(7)).unwrap(), 7);
        let failed = Serving::spawn(|| {
            Err(Error::Bootstrap {
                reason: "rank 1 never joined".into(),
            })
        })
        .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let r = failed.create_beside(|| -> Result<()> {
            Err(Error::Bootstrap {
                reason: "ncclCommInitRank timed out".into(),
            })
        });
        assert!(
            matches!(&r, Err(Error::Bootstrap { reason }) if reason.contains("never joined")),
            "{r:?}"
        );
    }
}
