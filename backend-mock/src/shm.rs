//! Shared memory for ranks in different processes (Linux): every allocation of such a rank
//! is an anonymous `memfd` mapped into its process; a peer reaches it by opening the owner's
//! descriptor through `/proc/<pid>/fd/<fd>` and mapping it for the duration of one
//! collective. No file of any file system is created, so nothing outlives the processes:
//! the kernel frees a memfd when its last descriptor and mapping are gone, even when a
//! process is killed.

#![allow(
    unsafe_code,
    reason = "the mock's host memory and shared mappings, read and written as device memory"
)]

#[cfg(target_os = "linux")]
use std::fs::File;
#[cfg(target_os = "linux")]
use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(target_os = "linux")]
use unicomm_core::{Error, Result};

/// Where a peer finds an allocation: the owner's process and descriptor, the allocation's
/// id (checked against the memfd's name, so a descriptor number reused for another
/// allocation is refused), and the offset of the byte meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Remote {
    pub pid: u32,
    pub fd: i32,
    pub id: u64,
    pub offset: usize,
}

#[cfg(target_os = "linux")]
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

#[cfg(target_os = "linux")]
fn os(call: &'static str, e: std::io::Error) -> Error {
    Error::Device {
        runtime: "mock",
        call,
        code: e.raw_os_error().unwrap_or(0),
        name: "SharedMemory".into(),
        message: e.to_string(),
    }
}

#[cfg(target_os = "linux")]
fn name(id: u64) -> String {
    format!("unicomm-mock-{id}")
}

#[cfg(target_os = "linux")]
/// One allocation in shared memory, owned by this process.
pub(crate) struct Segment {
    file: File,
    map: memmap2::MmapMut,
    id: u64,
}

#[cfg(target_os = "linux")]
impl Segment {
    /// A zeroed shared allocation of `bytes` (> 0) bytes.
    pub(crate) fn new(bytes: usize) -> Result<Self> {
        use std::os::fd::FromRawFd;
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let cname = std::ffi::CString::new(name(id)).map_err(|_| Error::invalid("name", "NUL"))?;
        // SAFETY: a valid C string; the flags are memfd_create's.
        let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(os("memfd_create", std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just returned by memfd_create and is owned by nothing else.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(bytes as u64).map_err(|e| os("ftruncate", e))?;
        // SAFETY: the memfd is ours and sized above; peers that map it write only under the
        // collective protocol (as threads of one process do), never behind this mapping's
        // back at a time the owner reads it.
        let map = unsafe { memmap2::MmapMut::map_mut(&file) }.map_err(|e| os("mmap", e))?;
        Ok(Segment { file, map, id })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.map.as_ptr() as *mut u8
    }

    /// A segment holding `bytes` (published once, read by peers through [`PeerMap`]).
    pub(crate) fn with(bytes: &[u8]) -> Result<Self> {
        let mut s = Segment::new(bytes.len().max(1))?;
        s.map[..bytes.len()].copy_from_slice(bytes);
        Ok(s)
    }

    /// Where a peer finds byte `offset` of this allocation.
    pub(crate) fn remote(&self, offset: usize) -> Remote {
        use std::os::fd::AsRawFd;
        Remote {
            pid: std::process::id(),
            fd: self.file.as_raw_fd(),
            id: self.id,
            offset,
        }
    }
}

#[cfg(target_os = "linux")]
/// A peer's allocation mapped into this process, unmapped on drop.
pub(crate) struct PeerMap {
    map: memmap2::MmapMut,
}

#[cfg(target_os = "linux")]
impl PeerMap {
    /// Maps the allocation `r` names. Fails (an error, never a wrong mapping) when the owner
    /// is gone or the descriptor now holds another allocation.
    pub(crate) fn open(r: &Remote) -> Result<Self> {
        let path = format!("/proc/{}/fd/{}", r.pid, r.fd);
        let gone = |what: &str| {
            Error::aborted(format!(
                "the memory of a peer (process {}) is gone: {what}; the peer's process exited",
                r.pid
            ))
        };
        let target = std::fs::read_link(&path).map_err(|e| gone(&e.to_string()))?;
        let want = format!("/memfd:{}", name(r.id));
        if !target.to_string_lossy().starts_with(&want)
            || target.to_string_lossy()[want.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
        {
            return Err(gone("its descriptor holds another allocation"));
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| gone(&e.to_string()))?;
        // SAFETY: a memfd of a peer of this job, sized by its owner, which keeps it (and the
        // bytes this collective touches) alive until every rank left the collective.
        let map = unsafe { memmap2::MmapMut::map_mut(&file) }.map_err(|e| os("mmap", e))?;
        if r.offset > map.len() {
            return Err(Error::invalid(
                "offset",
                format!("byte {} of a {}-byte peer allocation", r.offset, map.len()),
            ));
        }
        Ok(PeerMap { map })
    }

    /// The local address of byte `offset`.
    pub(crate) fn addr(&self, offset: usize) -> usize {
        self.map.as_ptr() as usize + offset
    }

    /// `len` bytes from `offset`, within the allocation.
    pub(crate) fn bytes(&self, offset: usize, len: usize) -> Result<&[u8]> {
        offset
            .checked_add(len)
            .and_then(|end| self.map.get(offset..end))
            .ok_or_else(|| {
                Error::invalid(
                    "len",
                    format!(
                        "bytes {offset}+{len} of a {}-byte peer allocation",
                        self.map.len()
                    ),
                )
            })
    }
}
