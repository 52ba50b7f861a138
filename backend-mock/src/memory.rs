//! Host memory standing in for device memory.

#![allow(
    unsafe_code,
    reason = "the mock's host memory and shared mappings, read and written as device memory"
)]

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use unicomm_core::{DeviceMemory, Error, Result};

use crate::lock::{Guard, Lock};
use crate::stream::MockStream;

mod checks;
pub(crate) use checks::check_range;
use checks::same_rank;

/// Alignment of every mock allocation (what cudaMalloc guarantees is 256; a cache line is
/// enough for host code and keeps f64/u64 accesses aligned).
const ALIGN: usize = 64;

/// One host allocation. Data is reached only through raw pointers while the lock is held:
/// a writer holds it exclusively, readers shared, so two streams touching the same buffer
/// are serialised instead of racing.
pub(crate) struct HostAlloc {
    ptr: NonNull<u8>,
    bytes: usize,
    lock: Lock,
    /// The "device" this is memory of: (device id, the rank of the world that created it),
    /// shared by every communicator of that rank (parent and children).
    pub(crate) owner: (u64, usize),
    /// The shared-memory segment holding the bytes, for ranks in different processes
    /// (`procs.rs`); `None`: the process's heap.
    #[cfg(target_os = "linux")]
    pub(crate) seg: Option<crate::shm::Segment>,
    /// The bytes are someone else's (a host slice lent by a [`HostScope`]): never freed here,
    /// and revoked before the lender's borrow ends.
    lent: bool,
    /// The first failure of work that used these bytes: what a [`HostScope`]'s end reports
    /// for a slice whose work failed (its output never written), however the end's wait
    /// and the work's deadline fall.
    failure: std::sync::OnceLock<Error>,
}

// SAFETY: the allocation is plain bytes owned by this struct; all access to them goes
// through the lock (or, inside a collective, through the rank-to-rank protocol while the
// owning rank holds the lock), so sharing the pointer between threads is sound.
unsafe impl Send for HostAlloc {}
// SAFETY: as above: `&HostAlloc` only hands out the bytes under the lock.
unsafe impl Sync for HostAlloc {}

impl HostAlloc {
    /// In shared memory (ranks in different processes), where `shared` and there are bytes.
    #[cfg(target_os = "linux")]
    fn new_in(bytes: usize, owner: (u64, usize), shared: bool) -> Result<Self> {
        if !shared || bytes == 0 {
            return Self::new(bytes, owner);
        }
        let seg = crate::shm::Segment::new(bytes)?;
        Ok(HostAlloc {
            ptr: NonNull::new(seg.ptr()).ok_or_else(|| Error::invalid("mmap", "NULL"))?,
            bytes,
            lock: Lock::default(),
            owner,
            seg: Some(seg),
            lent: false,
            failure: std::sync::OnceLock::new(),
        })
    }

    #[cfg(not(target_os = "linux"))]
    fn new_in(bytes: usize, owner: (u64, usize), _shared: bool) -> Result<Self> {
        Self::new(bytes, owner)
    }

    /// Where a peer process finds byte `offset` (`None` in the heap).
    #[cfg(target_os = "linux")]
    pub(crate) fn remote(&self, offset: usize) -> Option<crate::shm::Remote> {
        self.seg.as_ref().map(|s| s.remote(offset))
    }

    #[cfg(not(target_os = "linux"))]
    pub(crate) fn remote(&self, _offset: usize) -> Option<crate::shm::Remote> {
        None
    }

    fn new(bytes: usize, owner: (u64, usize)) -> Result<Self> {
        let ptr = if bytes == 0 {
            // The empty allocation is never dereferenced.
            NonNull::<u8>::dangling()
        } else {
            let layout = Layout::from_size_align(bytes, ALIGN)
                .map_err(|e| Error::invalid("bytes", format!("{bytes} bytes: {e}")))?;
            // SAFETY: the layout has a non-zero size.
            let p = unsafe { std::alloc::alloc_zeroed(layout) };
            NonNull::new(p).ok_or_else(|| Error::Device {
                runtime: "mock",
                call: "alloc",
                code: 2,
                name: "OutOfMemory".into(),
                message: format!("host allocation of {bytes} bytes failed"),
            })?
        };
        Ok(Self::at(ptr, bytes, owner, false))
    }

    /// The allocation over `ptr..ptr + bytes` in this process (not shared memory).
    fn at(ptr: NonNull<u8>, bytes: usize, owner: (u64, usize), lent: bool) -> Self {
        HostAlloc {
            ptr,
            bytes,
            lock: Lock::default(),
            owner,
            #[cfg(target_os = "linux")]
            seg: None,
            lent,
            failure: std::sync::OnceLock::new(),
        }
    }

    /// `bytes` bytes at `ptr` that someone else owns, as memory of rank `owner`.
    ///
    /// # Safety
    /// `ptr..ptr + bytes` stays valid (and, where work may write it, unaliased by any Rust
    /// reference) until [`HostAlloc::revoke`] has returned `Ok`, which the lender calls
    /// before its borrow ends.
    unsafe fn lent(ptr: NonNull<u8>, bytes: usize, owner: (u64, usize)) -> Self {
        Self::at(ptr, bytes, owner, true)
    }

    /// Work that used these bytes failed with `e` (the first failure is kept).
    pub(crate) fn failed(&self, e: &Error) {
        let _ = self.failure.set(e.clone());
    }

    /// Waits (at most `timeout`) for the access in progress, then refuses every later one.
    fn revoke(&self, timeout: Duration) -> Result<()> {
        self.lock.revoke(timeout, self.addr())
    }

    pub(crate) fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Copies `src` to the start of the allocation, under the write lock (host-side set-up
    /// of a blocking exchange; `src` must fit).
    pub(crate) fn fill(&self, src: &[u8], timeout: Duration) -> Result<()> {
        check_range(self.bytes, 0, src.len(), "src")?;
        let _g = self.write_lock(timeout)?;
        // SAFETY: in bounds (checked); the write lock excludes every other access.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr(), src.len()) };
        Ok(())
    }

    /// The allocation's first `dst.len()` bytes into `dst`, read under the read lock.
    fn copy_out(&self, dst: &mut [u8], timeout: Duration) -> Result<()> {
        check_range(self.bytes, 0, dst.len(), "dst")?;
        let _g = self.read_lock(timeout)?;
        // SAFETY: in bounds (checked); the read lock excludes writers; `dst` is the
        // caller's memory, distinct from the allocation.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// The allocation's bytes, read under the read lock.
    pub(crate) fn to_vec(&self, timeout: Duration) -> Result<Vec<u8>> {
        let _g = self.read_lock(timeout)?;
        let mut v = vec![0u8; self.bytes];
        // SAFETY: `bytes` valid bytes; the read lock excludes writers.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), v.as_mut_ptr(), self.bytes) };
        Ok(v)
    }

    /// Shared access until the guard drops, waiting at most `timeout` for a writer.
    pub(crate) fn read_lock(&self, timeout: Duration) -> Result<Guard<'_>> {
        self.lock.acquire(false, timeout, self.addr())
    }

    /// Exclusive access until the guard drops, waiting at most `timeout`.
    pub(crate) fn write_lock(&self, timeout: Duration) -> Result<Guard<'_>> {
        self.lock.acquire(true, timeout, self.addr())
    }
}

impl Drop for HostAlloc {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if self.seg.is_some() {
            return; // the segment unmaps and closes itself
        }
        if self.bytes != 0 && !self.lent {
            // SAFETY: allocated in `new` with exactly this layout (valid then, so valid now).
            unsafe {
                std::alloc::dealloc(
                    self.ptr.as_ptr(),
                    Layout::from_size_align_unchecked(self.bytes, ALIGN),
                )
            }
        }
    }
}

/// A mock "device" allocation: host memory, shared with the stream workers that use it so
/// that it lives until enqueued work is done.
pub struct MockMemory {
    pub(crate) inner: Arc<HostAlloc>,
    /// A lent slice's view: the mark its scope counts (never copied into a clone, so work
    /// holding the memory is not counted as a view).
    _view: Option<Arc<()>>,
}

impl Clone for MockMemory {
    fn clone(&self) -> Self {
        MockMemory {
            inner: self.inner.clone(),
            _view: None,
        }
    }
}

impl std::fmt::Debug for MockMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MockMemory({:#x}, {} bytes, rank {})",
            self.inner.addr(),
            self.inner.bytes,
            self.inner.owner.1
        )
    }
}

impl MockMemory {
    pub(crate) fn new(bytes: usize, owner: (u64, usize), shared: bool) -> Result<Self> {
        Ok(MockMemory {
            inner: Arc::new(HostAlloc::new_in(bytes, owner, shared)?),
            _view: None,
        })
    }
}

impl DeviceMemory for MockMemory {
    type Stream = MockStream;

    /// The work holds the allocation (a host slice lent by a scope: the scope's end waits
    /// for the work), so no drop frees it under the work.
    fn outlives_its_work(&self) -> bool {
        true
    }

    fn byte_len(&self) -> usize {
        self.inner.bytes
    }

    fn address(&self) -> usize {
        self.inner.addr()
    }

    fn write(&self, offset: usize, src: &[u8], stream: &MockStream) -> Result<()> {
        same_rank(self.inner.owner, stream)?;
        check_range(self.inner.bytes, offset, src.len(), "src")?;
        if src.is_empty() {
            return Ok(());
        }
        // Staged like a pageable cudaMemcpyAsync: the caller may reuse `src` at once.
        let staged = src.to_vec();
        let mem = self.inner.clone();
        let timeout = stream.timeout();
        stream.push(Box::new(move || {
            let _g = mem.write_lock(timeout)?;
            // SAFETY: the range was checked against the allocation above; the write lock
            // excludes every other access to it; `staged` is a distinct host vector.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    staged.as_ptr(),
                    mem.ptr.as_ptr().add(offset),
                    staged.len(),
                )
            };
            Ok(())
        }))
    }

    // A job of the stream that holds both allocations' locks (the source's for reading,
    // this one's for writing; one lock when they are the same).
    fn copy_from(
        &self,
        offset: usize,
        src: &MockMemory,
        src_offset: usize,
        bytes: usize,
        stream: &MockStream,
    ) -> Result<()> {
        same_rank(self.inner.owner, stream)?;
        same_rank(src.inner.owner, stream)?;
        check_range(self.inner.bytes, offset, bytes, "dst")?;
        check_range(src.inner.bytes, src_offset, bytes, "src")?;
        if bytes == 0 {
            return Ok(());
        }
        let (dst, src, timeout) = (self.inner.clone(), src.inner.clone(), stream.timeout());
        stream.push_replayable(Arc::new(move || {
            let (dst, src) = (dst.clone(), src.clone());
            Box::new(move || copy_job(&dst, offset, &src, src_offset, bytes, timeout))
        }))
    }

    fn read(&self, offset: usize, dst: &mut [u8], stream: &MockStream) -> Result<()> {
        same_rank(self.inner.owner, stream)?;
        check_range(self.inner.bytes, offset, dst.len(), "dst")?;
        // Wait for the stream first (errors of earlier work surface here, as with a blocking
        // cudaMemcpy), then read on this thread: `dst` never escapes the call.
        stream.synchronize_inner()?;
        if dst.is_empty() {
            return Ok(());
        }
        let _g = self.inner.read_lock(stream.timeout())?;
        // SAFETY: range checked above; the read lock excludes writers; `dst` is caller memory
        // distinct from the allocation.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.inner.ptr.as_ptr().add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
        Ok(())
    }
}

/// A device copy as the stream's worker runs it: both allocations' locks held (the
/// source's for reading, the destination's for writing; one lock when they are the same).
fn copy_job(
    dst: &Arc<HostAlloc>,
    offset: usize,
    src: &Arc<HostAlloc>,
    src_offset: usize,
    bytes: usize,
    timeout: std::time::Duration,
) -> Result<()> {
    let same = Arc::ptr_eq(dst, src);
    let _w = dst.write_lock(timeout)?;
    let _r = if same {
        None
    } else {
        Some(src.read_lock(timeout)?)
    };
    // SAFETY: both ranges were checked against their allocations when the copy was
    // enqueued; the locks exclude every other access; `copy` allows the overlap of a copy
    // within one allocation.
    unsafe {
        std::ptr::copy(
            src.ptr.as_ptr().add(src_offset),
            dst.ptr.as_ptr().add(offset),
            bytes,
        )
    };
    Ok(())
}

/// Host slices lent to the mock's collectives for the length of a [`host_scope`](crate::host_scope):
/// the rank's input and output read and written where they are, with no copy, when the rank
/// lives in this process (ranks in other processes reach only shared memory: there the
/// slice is copied into a shared allocation when lent and, if lent to be written, back at
/// the scope's end).
///
/// The scope owns the lendings, so none can outlive it: at its end (also when the closure
/// panics) it waits, up to the communicator's deadline, until no work holds a lent slice,
/// then revokes each one, so that work enqueued in the scope and still queued past the
/// deadline fails with `InvalidArgument` instead of touching the slice.
pub struct HostScope<'scope, 'env: 'scope, D = crate::MockComm> {
    pub(crate) comm: &'env crate::MockComm,
    lent: std::cell::RefCell<Vec<Lending<'scope>>>,
    _scope: std::marker::PhantomData<&'scope mut &'scope ()>,
    _env: std::marker::PhantomData<&'env mut &'env ()>,
    _d: std::marker::PhantomData<fn() -> D>,
}

/// One lent slice: its allocation and, where it was copied in to be written, the slice it
/// goes back to.
struct Lending<'scope> {
    alloc: Arc<HostAlloc>,
    back: Option<&'scope mut [u8]>,
    /// Held by the slice's view while it lives: one still held at the scope's end was
    /// forgotten (`mem::forget`), as no view can outlive its scope otherwise.
    view: Arc<()>,
}

/// A slice of a scope's caller, to be read or written.
pub(crate) enum HostBytes<'scope> {
    Read(&'scope [u8]),
    Write(&'scope mut [u8]),
}

impl<'scope, 'env, D> HostScope<'scope, 'env, D> {
    /// A scope to be ended by [`HostScope::end`] before the borrows it was lent end: made
    /// by `host_scope` alone, which does so (also when its closure panics).
    pub(crate) fn new(comm: &'env crate::MockComm) -> Self {
        HostScope {
            comm,
            lent: std::cell::RefCell::new(Vec::new()),
            _scope: std::marker::PhantomData,
            _env: std::marker::PhantomData,
            _d: std::marker::PhantomData,
        }
    }

    /// The allocation for a slice the caller borrowed for the scope.
    pub(crate) fn take(&'scope self, bytes: HostBytes<'scope>) -> Result<MockMemory> {
        let (owner, timeout) = (self.comm.owner(), self.comm.ctx.timeout);
        let lending = match bytes {
            // Peers in other processes map shared memory only: a documented copy in.
            _ if self.comm.shared => {
                let copied = |src: &[u8]| -> Result<Arc<HostAlloc>> {
                    let alloc = HostAlloc::new_in(src.len(), owner, true)?;
                    alloc.fill(src, timeout)?;
                    Ok(Arc::new(alloc))
                };
                match bytes {
                    HostBytes::Read(b) => Lending {
                        alloc: copied(b)?,
                        back: None,
                        view: Arc::new(()),
                    },
                    HostBytes::Write(b) => Lending {
                        alloc: copied(b)?,
                        back: Some(b),
                        view: Arc::new(()),
                    },
                }
            }
            HostBytes::Read(b) => {
                let ptr = NonNull::from(b).cast();
                // SAFETY: the borrow (`'scope`) lasts until `host_scope` returns, which first
                // ends the scope (`end`: every lending revoked); work only reads a `Lent`.
                let alloc = unsafe { HostAlloc::lent(ptr, b.len(), owner) };
                Lending {
                    alloc: Arc::new(alloc),
                    back: None,
                    view: Arc::new(()),
                }
            }
            HostBytes::Write(b) => {
                let (ptr, n) = (NonNull::from(&mut *b).cast(), b.len());
                // SAFETY: as above, and the borrow is exclusive: no reference aliases what
                // work writes until the scope has revoked it.
                let alloc = unsafe { HostAlloc::lent(ptr, n, owner) };
                Lending {
                    alloc: Arc::new(alloc),
                    back: None,
                    view: Arc::new(()),
                }
            }
        };
        let mem = MockMemory {
            inner: lending.alloc.clone(),
            _view: Some(lending.view.clone()),
        };
        self.lent.borrow_mut().push(lending);
        Ok(mem)
    }

    /// Waits until no work holds a lent slice (the communicator's deadline), revokes each,
    /// copies back what was copied in to be written. The first error is returned; every
    /// lending is revoked whatever happens.
    pub(crate) fn end(&self) -> Result<()> {
        let timeout = self.comm.ctx.timeout;
        let deadline = std::time::Instant::now() + timeout;
        let mut first = Ok(());
        for l in self.lent.borrow_mut().drain(..) {
            // A view forgotten (`mem::forget`) holds its memory for ever: not waited for.
            let forgotten = Arc::strong_count(&l.view) - 1;
            let addr = l.alloc.addr();
            let mut r = crate::lock::wait_unheld(&l.alloc, addr, deadline, forgotten, timeout);
            // Work that used the slice and failed (a peer that never joined, an abort):
            // its failure, even where it let go of the slice before the deadline.
            if let (Ok(()), Some(e)) = (&r, l.alloc.failure.get()) {
                r = Err(e.clone());
            }
            if let (Ok(()), Some(dst)) = (&r, l.back) {
                r = l.alloc.copy_out(dst, timeout);
            }
            // Past the deadline the work still queued is refused the slice; the access in
            // progress (bounded by its own deadline) is waited for, twice if need be.
            if let Err(e) = l.alloc.revoke(timeout).or_else(|_| l.alloc.revoke(timeout)) {
                eprintln!("unicomm-mock: a lent host slice could not be revoked ({e}); aborting the process rather than let work write memory its owner got back");
                std::process::abort();
            }
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}
