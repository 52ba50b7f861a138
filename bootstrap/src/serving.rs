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
}

impl Drop for Serving {
    /// Never waits: the thread ends by the rendezvous's deadline on its own.
    fn drop(&mut self) {
        self.thread.take();
    }
}
