//! A file that keeps the bytes the file system refuses, in order, until it takes them.
//!
//! The sink writes through parquet-rs's file writer, which counts every byte it hands
//! down to place its column chunks and its footer. If a write failed half way (a full
//! disk, a quota, a directory made read-only), that writer's state would no longer
//! match the file, and the only safe move would be to discard the file with every row
//! in it. Under it sits this type instead: a refused write is *accepted* into an
//! in-memory backlog, so the writer above never sees an error and its offsets stay
//! true; later writes join the backlog behind it, and [`PatientFile::drain`] writes the
//! backlog out once the file system takes bytes again. The bytes reach the disk in the
//! order they were written, so the file ends up exactly as if nothing had failed.
//!
//! The backlog holds encoded, compressed pages (a few bytes per row), and the sink caps
//! its total size (`SinkConfig::max_backlog_bytes`) by taking no new rows while it is
//! over the cap.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::faults::{self, FaultOp};

/// A file opened for writing whose refused bytes wait in memory.
#[derive(Debug)]
pub(crate) struct PatientFile {
    file: File,
    path: PathBuf,
    backlog: Vec<u8>,
    /// Why the last write was refused (taken by the caller once reported).
    refusal: Option<io::Error>,
}

impl PatientFile {
    pub(crate) fn new(file: File, path: PathBuf) -> Self {
        Self {
            file,
            path,
            backlog: Vec::new(),
            refusal: None,
        }
    }

    /// Bytes written but not yet on disk.
    pub(crate) fn backlog_len(&self) -> usize {
        self.backlog.len()
    }

    /// Why a write was refused since the last call, if one was.
    pub(crate) fn take_refusal(&mut self) -> Option<io::Error> {
        self.refusal.take()
    }

    /// Writes the backlog to the file; on a refusal keeps what is left of it.
    pub(crate) fn drain(&mut self) -> io::Result<()> {
        let mut done = 0;
        let result = loop {
            if done == self.backlog.len() {
                break Ok(());
            }
            match write_to_disk(&mut self.file, &self.path, &self.backlog[done..]) {
                Ok(0) => break Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        self.backlog.drain(..done);
        result
    }

    /// `fsync`s the file (the backlog must be drained first).
    pub(crate) fn sync(&self) -> io::Result<()> {
        faults::check(&self.path, FaultOp::Sync)?;
        self.file.sync_all()
    }
}

/// One write of `bytes` (which a test may refuse).
fn write_to_disk(file: &mut File, path: &Path, bytes: &[u8]) -> io::Result<usize> {
    faults::check(path, FaultOp::Write)?;
    file.write(bytes)
}

impl Write for PatientFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.backlog.is_empty() {
            match write_to_disk(&mut self.file, &self.path, buf) {
                Ok(n) => return Ok(n),
                // The caller (`write_all`) retries an interrupted write.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => return Err(e),
                Err(e) => self.refusal = Some(e),
            }
        }
        self.backlog.extend_from_slice(buf);
        Ok(buf.len())
    }

    /// Nothing is buffered here beyond the backlog, which [`PatientFile::drain`] writes.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::{NO_SPACE, inject};

    #[test]
    fn refused_bytes_wait_and_reach_the_file_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut f = PatientFile::new(File::create(&path).unwrap(), path.clone());
        f.write_all(b"one ").unwrap();
        assert_eq!(f.backlog_len(), 0);
        {
            let _full = inject(dir.path(), FaultOp::Write, NO_SPACE);
            f.write_all(b"two ").unwrap();
            f.write_all(b"three ").unwrap();
            assert_eq!(f.backlog_len(), 10);
            let why = f.take_refusal().expect("the refusal is reported");
            assert_eq!(why.raw_os_error(), Some(NO_SPACE));
            assert!(f.take_refusal().is_none(), "reported once");
            assert!(f.drain().is_err(), "still full");
            assert_eq!(f.backlog_len(), 10, "nothing lost to the failed drain");
        }
        // Once bytes are waiting, new ones queue behind them even though the disk
        // would take them: the order is kept.
        f.write_all(b"four").unwrap();
        assert_eq!(f.backlog_len(), 14);
        f.drain().unwrap();
        assert_eq!(f.backlog_len(), 0);
        f.sync().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"one two three four");
    }
}
