//! File-system refusals injected by tests: a full disk, a directory that cannot be
//! written, a failed `fsync` or rename, under one directory at a time.
//!
//! A real full disk needs a mount (root) and a revoked permission does not stop root,
//! so the sink's tests refuse operations here instead, at the same calls that would
//! fail. Faults are keyed by directory, so tests running in parallel, each under its
//! own temporary directory, do not see each other's. (The `fail` crate's fail points
//! are process-wide names with no such scope.)
//!
//! Compiled into the crate's own tests and, with the `fault-injection` feature, into
//! other crates' tests; otherwise the check is an empty inline function.

use std::io;
use std::path::Path;

/// An operation that can be refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultOp {
    /// Creating a directory or a file.
    Create,
    /// Writing bytes to a file.
    Write,
    /// `fsync` of a file.
    Sync,
    /// `fsync` of a directory (after a rename into it).
    SyncDir,
    /// Renaming a finished file into place.
    Rename,
}

#[cfg(any(test, feature = "fault-injection"))]
mod registry {
    use super::FaultOp;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Mutex, MutexGuard, PoisonError};

    struct Fault {
        id: u64,
        under: PathBuf,
        op: FaultOp,
        errno: i32,
    }

    static FAULTS: Mutex<Vec<Fault>> = Mutex::new(Vec::new());
    /// Lets [`check`] skip the lock while no fault is set (benchmarks built with the
    /// feature, because another crate's tests asked for it, pay one load per write).
    static ANY: AtomicBool = AtomicBool::new(false);
    static NEXT_ID: AtomicU64 = AtomicU64::new(0);

    fn faults() -> MutexGuard<'static, Vec<Fault>> {
        FAULTS.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Refuses `op` on every path under `under` with the OS error `errno` until the
    /// guard is dropped.
    #[must_use = "the fault is lifted when the guard is dropped"]
    pub fn inject(under: &Path, op: FaultOp, errno: i32) -> FaultGuard {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let mut all = faults();
        all.push(Fault {
            id,
            under: under.to_path_buf(),
            op,
            errno,
        });
        ANY.store(true, Ordering::SeqCst);
        FaultGuard { id }
    }

    /// Lifts its fault when dropped.
    #[derive(Debug)]
    pub struct FaultGuard {
        id: u64,
    }

    impl Drop for FaultGuard {
        fn drop(&mut self) {
            let mut all = faults();
            all.retain(|f| f.id != self.id);
            ANY.store(!all.is_empty(), Ordering::SeqCst);
        }
    }

    pub(crate) fn check(path: &Path, op: FaultOp) -> std::io::Result<()> {
        if !ANY.load(Ordering::SeqCst) {
            return Ok(());
        }
        match faults()
            .iter()
            .find(|f| f.op == op && path.starts_with(&f.under))
        {
            Some(f) => Err(std::io::Error::from_raw_os_error(f.errno)),
            None => Ok(()),
        }
    }
}

#[cfg(any(test, feature = "fault-injection"))]
pub use registry::{FaultGuard, inject};

/// `Err` when a test refuses `op` on `path`.
#[inline]
pub(crate) fn check(path: &Path, op: FaultOp) -> io::Result<()> {
    #[cfg(any(test, feature = "fault-injection"))]
    return registry::check(path, op);
    #[cfg(not(any(test, feature = "fault-injection")))]
    {
        let _ = (path, op);
        Ok(())
    }
}

/// `ENOSPC`: no space left on the device.
pub const NO_SPACE: i32 = 28;
/// `EACCES`: permission denied.
pub const PERMISSION_DENIED: i32 = 13;
/// `EIO`: an I/O error of the device.
pub const DEVICE_ERROR: i32 = 5;
