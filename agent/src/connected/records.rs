//! The `--exec` workers' state on disk, so that a restarted agent can find them again.
//!
//! `OUT/jobs/state/<job>.<worker>.<attempt>.json` ([`WorkerRecord`]) is written when a
//! worker starts (write to `….json.tmp`, fsync, rename: a crash leaves the old file or
//! the new one, never half of one) and removed when the scheduler has no further use
//! for it: the worker was stopped, or its final report was delivered (or refused). The
//! worker's supervising shell writes `<job>.<worker>.<attempt>.exit` (its command's exit
//! status, written to `….exit.tmp` and renamed) whether or not the agent is alive.
//!
//! The file name carries the incarnation too, so a record whose contents are corrupt
//! still names the worker it was about (see `Runner::adopt_survivors` for what is done
//! with one).
//!
//! **Across versions.** Records outlive the agent that wrote them: an upgrade restarts
//! the agent while its workers run, and the next one must read what the last one
//! wrote. So a field added to [`WorkerRecord`] must have a serde default (a record
//! without it still reads), fields are never renamed or removed, and unknown fields
//! (from a newer agent, after a rollback) are ignored. `a_record_written_by_the_first_version_still_reads`
//! holds a record as the first version wrote it. A record that does not read whole
//! still yields its process ([`RecordedProcess`]) when it can, so the worker is found
//! and stopped rather than left running unsupervised on GPUs the scheduler frees.

use std::io::Write;
use std::path::{Path, PathBuf};

use marshal_scheduler::service::pb;
use serde::{Deserialize, Serialize};

use crate::connected::jobs::Incarnation;

/// One GPU (or slice of one) a worker holds: `pb::GpuSlot`, in a form serde can store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldGpu {
    pub index: u32,
    pub milli: u32,
    pub mig_compute: u32,
    pub mig_memory: u32,
}

impl From<&pb::GpuSlot> for HeldGpu {
    fn from(g: &pb::GpuSlot) -> Self {
        HeldGpu {
            index: g.index,
            milli: g.milli,
            mig_compute: g.mig_compute,
            mig_memory: g.mig_memory,
        }
    }
}

impl From<&HeldGpu> for pb::GpuSlot {
    fn from(g: &HeldGpu) -> Self {
        pb::GpuSlot {
            index: g.index,
            milli: g.milli,
            mig_compute: g.mig_compute,
            mig_memory: g.mig_memory,
        }
    }
}

/// What a restarted agent needs to know about a worker it did not start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerRecord {
    pub job: u64,
    pub worker: u32,
    pub attempt: u32,
    pub gpus: Vec<HeldGpu>,
    /// The MIG instances claimed for it (UUIDs), restored on adoption so that they are
    /// not handed out twice.
    pub mig_uuids: Vec<String>,
    /// The supervising shell: session leader, so also the process group id the agent
    /// kills on STOP.
    pub pid: u32,
    /// `/proc/<pid>/stat` field 22 at start: tells the worker from a later process that
    /// got the same pid.
    pub start_ticks: u64,
    /// `/proc/sys/kernel/random/boot_id` at start: a record from an earlier boot
    /// describes a process that died with that boot.
    pub boot_id: String,
    /// The command, for the operator reading the file.
    pub command: String,
    /// The record's layout ([`RECORD_VERSION`]); absent in the first version's records.
    #[serde(default = "first_version")]
    pub version: u32,
}

/// The layout [`WorkerRecord`]s are written in.
pub const RECORD_VERSION: u32 = 1;

fn first_version() -> u32 {
    1
}

/// What identifies a recorded worker's process, read from a record that does not read
/// whole (damaged elsewhere, or of a layout this agent does not know).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct RecordedProcess {
    pub pid: u32,
    pub start_ticks: u64,
    pub boot_id: String,
    /// The worker the record is about, which must be the one its file name says.
    job: u64,
    worker: u32,
    attempt: u32,
}

impl RecordedProcess {
    fn is_about(&self, i: &Incarnation) -> bool {
        (self.job, self.worker, self.attempt) == (i.job, i.worker, i.attempt)
    }
}

impl WorkerRecord {
    pub fn incarnation(&self) -> Incarnation {
        Incarnation {
            job: self.job,
            worker: self.worker,
            attempt: self.attempt,
        }
    }
}

/// `path` with `.tmp` after its name.
fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

/// Writes `bytes` to `path` whole and durably: into `path` + `.tmp`, `fsync`, rename,
/// `fsync` of the directory (without it a power loss can undo the rename, and a worker
/// that was started is forgotten). A reader (or a crash) never meets half a file under
/// the final name. The error names the file that failed: the temporary one, or `path`
/// for the rename. A directory that cannot be synced is only a warning: the record is
/// in place, and refusing it would refuse the worker it describes.
pub(crate) fn write_durably(path: &Path, bytes: &[u8]) -> Result<(), (PathBuf, std::io::Error)> {
    let tmp = tmp_path(path);
    let written = std::fs::File::create(&tmp).and_then(|mut file| {
        file.write_all(bytes)?;
        file.sync_all()
    });
    if let Err(e) = written {
        return Err((tmp, e));
    }
    std::fs::rename(&tmp, path).map_err(|e| (path.to_path_buf(), e))?;
    if let Some(dir) = path.parent()
        && let Err(error) = marshal_model::artifact::sync_dir(dir)
    {
        tracing::warn!(record = %path.display(), %error, "worker record: cannot sync its directory; a power loss may undo the write");
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a worker record: {source}")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error(
        "{path}: the record is about job {job} worker {worker} attempt {attempt}, not the one its name says"
    )]
    Mismatch {
        path: PathBuf,
        job: u64,
        worker: u32,
        attempt: u32,
    },
    #[error("{path}: not an exit status: {text:?}")]
    ExitStatus { path: PathBuf, text: String },
}

/// A file of the state directory that could not be turned into a record.
#[derive(Debug)]
pub struct Unreadable {
    pub path: PathBuf,
    /// From the file name, when it has the `<job>.<worker>.<attempt>.json` form.
    pub incarnation: Option<Incarnation>,
    pub error: RecordError,
    /// Its process, when the file is JSON that names one although it is not a whole
    /// record (never for a record about another worker than its name says).
    pub process: Option<RecordedProcess>,
}

/// The state directory: `OUT/jobs/state`.
#[derive(Clone, Debug)]
pub struct RecordStore {
    dir: PathBuf,
}

impl RecordStore {
    pub fn open(dir: PathBuf) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        Ok(RecordStore { dir })
    }

    fn stem(i: &Incarnation) -> String {
        format!("{}.{}.{}", i.job, i.worker, i.attempt)
    }

    pub fn record_path(&self, i: &Incarnation) -> PathBuf {
        self.dir.join(format!("{}.json", Self::stem(i)))
    }

    /// Where the worker's supervising shell writes its command's exit status.
    pub fn exit_path(&self, i: &Incarnation) -> PathBuf {
        self.dir.join(format!("{}.exit", Self::stem(i)))
    }

    /// Writes the record atomically and durably ([`write_durably`]).
    pub fn write(&self, record: &WorkerRecord) -> Result<(), RecordError> {
        let path = self.record_path(&record.incarnation());
        let bytes = serde_json::to_vec_pretty(record).map_err(|source| RecordError::Parse {
            path: tmp_path(&path),
            source,
        })?;
        write_durably(&path, &bytes).map_err(|(path, source)| RecordError::Io { path, source })
    }

    /// Removes the worker's record and exit status (absent ones are fine).
    pub fn remove(&self, i: &Incarnation) {
        for path in [self.record_path(i), self.exit_path(i)] {
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(path = %path.display(), error = %e, "worker state not removed");
            }
        }
    }

    /// The exit status the worker's supervising shell recorded, if it has.
    pub fn exit_status(&self, i: &Incarnation) -> Result<Option<i32>, RecordError> {
        let path = self.exit_path(i);
        match std::fs::read_to_string(&path) {
            Ok(text) => text
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| RecordError::ExitStatus { path, text }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(RecordError::Io { path, source }),
        }
    }

    /// Every record in the directory, and every `*.json` file that is not one. Other
    /// files (exit statuses, a `.tmp` left by a crash mid-write) are not records.
    pub fn load_all(&self) -> Result<(Vec<WorkerRecord>, Vec<Unreadable>), RecordError> {
        let entries = std::fs::read_dir(&self.dir).map_err(|source| RecordError::Io {
            path: self.dir.clone(),
            source,
        })?;
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        paths.sort();
        let mut records = Vec::new();
        let mut unreadable = Vec::new();
        for path in paths {
            let incarnation = incarnation_from_name(&path);
            match read_record(&path, incarnation) {
                Ok(r) => records.push(r),
                Err(error) => unreadable.push(Unreadable {
                    // Only from a record about the worker its name says: a misplaced
                    // record must not get another worker's process killed.
                    process: match error {
                        RecordError::Parse { .. } => std::fs::read(&path)
                            .ok()
                            .and_then(|bytes| {
                                serde_json::from_slice::<RecordedProcess>(&bytes).ok()
                            })
                            .filter(|p| incarnation.is_some_and(|i| p.is_about(&i))),
                        _ => None,
                    },
                    path,
                    incarnation,
                    error,
                }),
            }
        }
        Ok((records, unreadable))
    }
}

fn read_record(path: &Path, named: Option<Incarnation>) -> Result<WorkerRecord, RecordError> {
    let bytes = std::fs::read(path).map_err(|source| RecordError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let record: WorkerRecord =
        serde_json::from_slice(&bytes).map_err(|source| RecordError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
    if record.version > RECORD_VERSION {
        tracing::warn!(path = %path.display(), version = record.version, "worker record of a newer agent's layout; read as this one's");
    }
    if named != Some(record.incarnation()) {
        return Err(RecordError::Mismatch {
            path: path.to_path_buf(),
            job: record.job,
            worker: record.worker,
            attempt: record.attempt,
        });
    }
    Ok(record)
}

/// `<job>.<worker>.<attempt>.json` → the incarnation.
fn incarnation_from_name(path: &Path) -> Option<Incarnation> {
    let stem = path.file_stem()?.to_str()?;
    let mut parts = stem.split('.');
    let i = Incarnation {
        job: parts.next()?.parse().ok()?,
        worker: parts.next()?.parse().ok()?,
        attempt: parts.next()?.parse().ok()?,
    };
    parts.next().is_none().then_some(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(job: u64) -> WorkerRecord {
        WorkerRecord {
            job,
            worker: 1,
            attempt: 2,
            gpus: vec![HeldGpu {
                index: 3,
                milli: 1000,
                mig_compute: 0,
                mig_memory: 0,
            }],
            mig_uuids: vec![],
            pid: 4242,
            start_ticks: 99,
            boot_id: "b".into(),
            command: "echo 'hi'".into(),
            version: RECORD_VERSION,
        }
    }

    /// A record as the first version wrote it (`to_vec_pretty`): every later agent must
    /// read it, or an upgrade strands the workers that run across it. A failure here
    /// means a field was added without a serde default, renamed or removed.
    const FIRST_VERSION_RECORD: &str = r#"{
  "job": 7,
  "worker": 1,
  "attempt": 2,
  "gpus": [
    {
      "index": 3,
      "milli": 1000,
      "mig_compute": 0,
      "mig_memory": 0
    }
  ],
  "mig_uuids": [],
  "pid": 4242,
  "start_ticks": 99,
  "boot_id": "b",
  "command": "echo 'hi'"
}"#;

    #[test]
    fn a_record_written_by_the_first_version_still_reads() {
        let dir = tempfile::tempdir().unwrap();
        let store = RecordStore::open(dir.path().join("state")).unwrap();
        std::fs::write(dir.path().join("state/7.1.2.json"), FIRST_VERSION_RECORD).unwrap();
        // A newer agent's record, with a field this one does not know (a rollback).
        let newer = FIRST_VERSION_RECORD
            .replace("\"job\": 7", "\"job\": 8")
            .replace(
                "\"command\"",
                "\"version\": 2,\n  \"cgroup\": \"/marshal/8\",\n  \"command\"",
            );
        std::fs::write(dir.path().join("state/8.1.2.json"), newer).unwrap();
        let (records, unreadable) = store.load_all().unwrap();
        assert!(unreadable.is_empty(), "{unreadable:?}");
        assert_eq!(records[0], record(7));
        assert_eq!(records[1].job, 8);
        assert_eq!(records[1].version, 2);
    }

    #[test]
    fn a_record_that_does_not_read_whole_still_names_its_process() {
        let dir = tempfile::tempdir().unwrap();
        let store = RecordStore::open(dir.path().join("state")).unwrap();
        // A layout this agent cannot read (a field it needs is gone), and a record about
        // another worker than its name says.
        let partial = FIRST_VERSION_RECORD.replace("\"gpus\"", "\"slots\"");
        std::fs::write(dir.path().join("state/7.1.2.json"), partial).unwrap();
        std::fs::write(dir.path().join("state/9.1.2.json"), FIRST_VERSION_RECORD).unwrap();
        let (records, unreadable) = store.load_all().unwrap();
        assert!(records.is_empty());
        let process = unreadable[0].process.as_ref().unwrap();
        assert_eq!(
            (process.pid, process.start_ticks, process.boot_id.as_str()),
            (4242, 99, "b")
        );
        assert!(matches!(unreadable[1].error, RecordError::Mismatch { .. }));
        assert_eq!(unreadable[1].process, None);
        // Unreadable and about another worker than its name says: no process either.
        let misplaced = FIRST_VERSION_RECORD.replace("\"gpus\"", "\"slots\"");
        std::fs::remove_file(dir.path().join("state/7.1.2.json")).unwrap();
        std::fs::write(dir.path().join("state/5.1.2.json"), misplaced).unwrap();
        let (_, unreadable) = store.load_all().unwrap();
        let five = unreadable
            .iter()
            .find(|u| u.path.ends_with("5.1.2.json"))
            .unwrap();
        assert!(matches!(five.error, RecordError::Parse { .. }));
        assert_eq!(five.process, None);
    }

    #[test]
    fn records_round_trip_and_bad_files_are_named_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let store = RecordStore::open(dir.path().join("state")).unwrap();
        store.write(&record(7)).unwrap();
        store.write(&record(8)).unwrap();
        let state = dir.path().join("state");
        // Corrupt, with a usable name; a record under the wrong name; a stray file; a
        // crash's leftover and an exit status, which are not records at all.
        std::fs::write(state.join("9.0.1.json"), b"{\"job\": 9, trunc").unwrap();
        std::fs::copy(state.join("7.1.2.json"), state.join("5.1.2.json")).unwrap();
        std::fs::write(state.join("notes.json"), b"{}").unwrap();
        std::fs::write(state.join("10.0.1.json.tmp"), b"{").unwrap();
        std::fs::write(state.join("7.1.2.exit"), b"3\n").unwrap();
        let (records, bad) = store.load_all().unwrap();
        assert_eq!(records, vec![record(7), record(8)]);
        let names: Vec<(String, Option<u64>)> = bad
            .iter()
            .map(|u| {
                (
                    u.path.file_name().unwrap().to_string_lossy().into_owned(),
                    u.incarnation.map(|i| i.job),
                )
            })
            .collect();
        assert_eq!(
            names,
            vec![
                ("5.1.2.json".into(), Some(5)),
                ("9.0.1.json".into(), Some(9)),
                ("notes.json".into(), None),
            ]
        );
        assert!(
            bad[1].error.to_string().contains("9.0.1.json"),
            "{}",
            bad[1].error
        );
        let i = record(7).incarnation();
        assert_eq!(store.exit_status(&i).unwrap(), Some(3));
        store.remove(&i);
        assert_eq!(store.exit_status(&i).unwrap(), None);
        assert!(!store.record_path(&i).exists());
        std::fs::write(store.exit_path(&i), b"x").unwrap();
        assert!(store.exit_status(&i).is_err());
    }
}
