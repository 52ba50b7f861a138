//! A mock stream: one worker thread that runs enqueued work in order, like a CUDA stream.
//! Errors of the work are kept and returned by the next `synchronize`.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use unicomm_core::{DeviceStream, Error, Marker, Result};

use crate::marker::{Mark, MockMarker};

pub(crate) type Job = Box<dyn FnOnce() -> Result<()> + Send>;

/// Work a graph can replay: makes the job of one replay, on the host at the launch (so a
/// collective takes its sequence number in the launch's order, as an eager call does).
pub(crate) type Replayable = Arc<dyn Fn() -> Job + Send + Sync>;

struct State {
    jobs: VecDeque<Job>,
    enqueued: u64,
    done: u64,
    error: Option<Error>,
    shutdown: bool,
    /// The worker has returned (or unwound): a drop's join then returns at once.
    exited: bool,
    /// While capturing: the work recorded for the graph, instead of run.
    capture: Option<Vec<Replayable>>,
}

pub(crate) struct Inner {
    state: Mutex<State>,
    /// Signalled when a job is pushed or the stream shuts down (worker side) and when a job
    /// finishes (waiter side).
    cv: Condvar,
    /// How long `synchronize` waits without any job finishing before it reports `Timeout`.
    idle_timeout: Duration,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn push(&self, job: Job) -> Result<()> {
        let mut st = self.lock();
        if st.shutdown {
            return Err(Error::invalid("stream", "the stream is being destroyed"));
        }
        if st.capture.is_some() {
            return Err(not_capturable());
        }
        st.jobs.push_back(job);
        st.enqueued += 1;
        drop(st);
        self.cv.notify_all();
        Ok(())
    }
}

/// A stream of the mock backend.
pub struct MockStream {
    pub(crate) inner: Arc<Inner>,
    worker: Option<JoinHandle<()>>,
    /// (world id, rank) of the communicator that created it.
    pub(crate) owner: (u64, usize),
}

impl std::fmt::Debug for MockStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MockStream(rank {})", self.owner.1)
    }
}

impl MockStream {
    pub(crate) fn new(owner: (u64, usize), idle_timeout: Duration) -> Result<Self> {
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                jobs: VecDeque::new(),
                enqueued: 0,
                done: 0,
                error: None,
                shutdown: false,
                exited: false,
                capture: None,
            }),
            cv: Condvar::new(),
            idle_timeout,
        });
        let w = inner.clone();
        let worker = std::thread::Builder::new()
            .name(format!("unicomm-mock-stream-r{}", owner.1))
            .spawn(move || {
                /// Marks the worker exited however it ends, so a drop never waits for it.
                struct Exit<'a>(&'a Inner);
                impl Drop for Exit<'_> {
                    fn drop(&mut self) {
                        self.0.lock().exited = true;
                        self.0.cv.notify_all();
                    }
                }
                let _exit = Exit(&w);
                worker_loop(&w)
            })
            .map_err(|e| Error::Device {
                runtime: "mock",
                call: "create_stream",
                code: 1,
                name: "ThreadSpawn".into(),
                message: e.to_string(),
            })?;
        Ok(MockStream {
            inner,
            worker: Some(worker),
            owner,
        })
    }

    /// The deadline of every wait of work on this stream.
    pub(crate) fn timeout(&self) -> Duration {
        self.inner.idle_timeout
    }

    /// Enqueues a job.
    pub(crate) fn push(&self, job: Job) -> Result<()> {
        self.inner.push(job)
    }

    /// Enqueues work a graph can replay (recorded while capturing).
    pub(crate) fn push_replayable(&self, make: Replayable) -> Result<()> {
        self.inner.push_replayable(make)
    }

    /// Waits until every job enqueued so far is done; returns (and clears) the first error.
    pub(crate) fn synchronize_inner(&self) -> Result<()> {
        let st = self.inner.lock();
        let target = st.enqueued;
        let (mut st, reached) = self.inner.wait_progressing(st, |st| st.done >= target);
        if !reached {
            return Err(Error::Timeout {
                what: format!(
                    "stream of rank {} ({} of {} operations done, none finished within the deadline)",
                    self.owner.1, st.done, target
                ),
                after: self.inner.idle_timeout,
            });
        }
        match st.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Inner {
    /// Whether the stream is capturing a graph.
    pub(crate) fn capturing(&self) -> bool {
        self.lock().capture.is_some()
    }

    /// Enqueues work a graph can replay: recorded while the stream captures, run otherwise.
    pub(crate) fn push_replayable(&self, make: Replayable) -> Result<()> {
        {
            let mut st = self.lock();
            if let Some(c) = st.capture.as_mut() {
                c.push(make);
                return Ok(());
            }
        }
        self.push(make())
    }

    /// Waits until `reached` holds, as long as the work makes progress: the deadline is per
    /// operation, not for the whole queue. The guard, and whether `reached` holds.
    fn wait_progressing<'a>(
        &self,
        mut st: MutexGuard<'a, State>,
        reached: impl Fn(&State) -> bool,
    ) -> (MutexGuard<'a, State>, bool) {
        let mut last_done = st.done;
        let mut deadline = Instant::now() + self.idle_timeout;
        while !reached(&st) {
            let now = Instant::now();
            if now >= deadline {
                return (st, false);
            }
            st = self
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            if st.done != last_done {
                last_done = st.done;
                deadline = Instant::now() + self.idle_timeout;
            }
        }
        (st, true)
    }
}

fn worker_loop(inner: &Inner) {
    loop {
        let job = {
            let mut st = inner.lock();
            loop {
                if let Some(j) = st.jobs.pop_front() {
                    break j;
                }
                if st.shutdown {
                    return;
                }
                st = inner.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        };
        let r = job();
        let mut st = inner.lock();
        if let Err(e) = r {
            // The first error is the one reported, as CUDA reports the first failure.
            st.error.get_or_insert(e);
        }
        st.done += 1;
        drop(st);
        inner.cv.notify_all();
    }
}

impl DeviceStream for MockStream {
    type Graph = MockGraph;

    fn begin_capture(&self) -> Result<()> {
        let mut st = self.inner.lock();
        if st.capture.is_some() {
            return Err(Error::invalid("stream", "the stream is capturing already"));
        }
        st.capture = Some(Vec::new());
        Ok(())
    }

    fn end_capture(&self) -> Result<MockGraph> {
        let work = self
            .inner
            .lock()
            .capture
            .take()
            .ok_or_else(|| Error::invalid("stream", "the stream is not capturing"))?;
        Ok(MockGraph {
            work,
            owner: self.owner,
        })
    }

    fn capturing(&self) -> Result<bool> {
        Ok(self.inner.lock().capture.is_some())
    }

    fn synchronize(&self) -> Result<()> {
        self.synchronize_inner()
    }

    fn query(&self) -> Result<bool> {
        let st = self.inner.lock();
        match &st.error {
            Some(e) => Err(e.clone()),
            None => Ok(st.done >= st.enqueued),
        }
    }

    fn record(&self) -> Result<Marker> {
        let mark = Mark::new(1);
        let set = mark.clone();
        self.push(Box::new(move || {
            set.reach(1);
            Ok(())
        }))?;
        Ok(Marker::new(MockMarker(mark)))
    }

    fn wait(&self, marker: &Marker) -> Result<()> {
        let mark = MockMarker::of(marker)?;
        let point = mark.armed();
        let timeout = self.inner.idle_timeout;
        // The worker holds this stream's later work until the other stream's worker reached
        // the marker, as a GPU stream waits for an event; bounded by the stream's deadline.
        self.push_replayable(Arc::new(move || {
            let mark = mark.clone();
            Box::new(move || {
                let deadline = Instant::now() + timeout;
                while !mark.passed(point) {
                    if Instant::now() >= deadline {
                        return Err(Error::Timeout {
                            what: "a stream waiting for a marker of another stream".into(),
                            after: timeout,
                        });
                    }
                    std::thread::sleep(Duration::from_micros(50));
                }
                Ok(())
            })
        }))
    }

    fn launch_marker(&self) -> Result<Marker> {
        Ok(Marker::new(MockMarker(Mark::new(0))))
    }

    fn launch_host_fn(&self, f: Box<dyn FnOnce() + Send + 'static>) -> Result<()> {
        let inner = self.inner.clone();
        self.push(Box::new(move || {
            // CUDA's rule (cuLaunchHostFunc): a host function is not called once the
            // stream's work has failed; the error waits for the stream's next wait.
            if inner.lock().error.is_some() {
                return Ok(());
            }
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|_| {
                Error::invalid(
                    "host function",
                    "a host function enqueued on the stream panicked",
                )
            })
        }))
    }
}

/// Work a capture on a mock stream recorded (collectives, device copies, marker waits);
/// each launch replays it in order on the launch's stream.
pub struct MockGraph {
    work: Vec<Replayable>,
    /// (world id, rank) of the streams it may be launched on: the capturing stream's device.
    owner: (u64, usize),
}

impl std::fmt::Debug for MockGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MockGraph({} operations, rank {})",
            self.work.len(),
            self.owner.1
        )
    }
}

impl unicomm_core::DeviceGraph for MockGraph {
    type Stream = MockStream;

    fn launch(&self, stream: &MockStream) -> Result<()> {
        if stream.owner != self.owner {
            return Err(Error::invalid(
                "stream",
                format!(
                    "a graph captured on a stream of rank {} of world {} launched on a stream of rank {} of world {} (a graph is launched on its own rank's streams)",
                    self.owner.1, self.owner.0, stream.owner.1, stream.owner.0
                ),
            ));
        }
        // One lock for the whole replay: its jobs stay together on the stream.
        let jobs: Vec<Job> = self.work.iter().map(|make| make()).collect();
        let mut st = stream.inner.lock();
        if st.shutdown {
            return Err(Error::invalid("stream", "the stream is being destroyed"));
        }
        if st.capture.is_some() {
            return Err(not_capturable());
        }
        st.enqueued += jobs.len() as u64;
        st.jobs.extend(jobs);
        drop(st);
        stream.inner.cv.notify_all();
        Ok(())
    }
}

#[cold]
fn not_capturable() -> Error {
    Error::invalid(
        "stream",
        "the stream is capturing a graph, and this operation cannot be captured (host copies and waits, host functions run once, markers)",
    )
}

impl Drop for MockStream {
    fn drop(&mut self) {
        // Pending work still runs (every wait in it has a deadline), as a CUDA stream's work
        // completes after cudaStreamDestroy; then the worker exits.
        self.inner.lock().shutdown = true;
        self.inner.cv.notify_all();
        let Some(w) = self.worker.take() else {
            return;
        };
        // Joined with the stream's own rule: as long as the work makes progress, each
        // operation within the deadline. A worker stuck past it (a peer process stopped in a
        // copy) is left to finish on its own; its work keeps what it uses alive.
        let st = self.inner.lock();
        let (st, exited) = self.inner.wait_progressing(st, |st| st.exited);
        if !exited {
            tracing::warn!(
                rank = self.owner.1,
                "a stream dropped with work stuck past the deadline: its worker is left to finish"
            );
            return;
        }
        drop(st);
        // Exited: the join returns at once. A worker that panicked has nothing left to clean
        // up; ignore it.
        let _ = w.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drop never blocks without a deadline: a stream whose work is stuck (a peer process
    /// stopped inside a copy) is dropped within its deadline, its worker left to finish.
    #[test]
    fn a_stream_with_stuck_work_is_dropped_within_its_deadline() {
        let s = MockStream::new((0, 0), Duration::from_millis(100)).unwrap();
        s.push(Box::new(|| {
            std::thread::sleep(Duration::from_secs(3));
            Ok(())
        }))
        .unwrap();
        let t = Instant::now();
        drop(s);
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }

    /// Work that makes progress is waited for, each operation within the deadline.
    #[test]
    fn a_stream_whose_work_progresses_is_drained_at_drop() {
        let s = MockStream::new((0, 0), Duration::from_millis(200)).unwrap();
        let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for _ in 0..5 {
            let d = done.clone();
            s.push(Box::new(move || {
                std::thread::sleep(Duration::from_millis(60));
                d.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            }))
            .unwrap();
        }
        drop(s);
        assert_eq!(done.load(std::sync::atomic::Ordering::SeqCst), 5);
    }
}
