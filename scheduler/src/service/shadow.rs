//! Shadow mode's live advisor: the Advisor service alone (and health), answering a
//! foreign scheduler's `Advise` calls and appending every recommendation to a shadow log
//! (JSON lines, one [`DecisionRecord`] each). It holds no cluster and no jobs, so it
//! cannot act. With `policy = "learned"` it advises through the same model slot as
//! `marshal serve` (gate, fallback, hot reload), and each record carries the path.

use std::collections::VecDeque;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tonic::{Request, Response, Status};

use crate::service::error::ServiceError;
use std::sync::Arc;

use crate::service::model::ModelSlot;
use crate::service::pb;
use crate::service::pb::advisor_service_server::AdvisorService;
use crate::service::records::DecisionRecord;

/// Decisions kept in memory for Explain (the log has them all).
const EXPLAIN_WINDOW: usize = 100_000;

/// Where the shadow log goes, and when it is rotated.
#[derive(Clone, Debug, PartialEq)]
pub struct ShadowLog {
    pub path: PathBuf,
    /// Once the log holds this many bytes it is renamed `<path>.1` (older ones shift to
    /// `.2`, …) and a new one begins; `None`: one file for good.
    pub rotate_bytes: Option<u64>,
    /// Rotated files kept (`.1` to `.<keep>`); the oldest beyond are deleted.
    pub keep: usize,
}

impl ShadowLog {
    /// One file, never rotated.
    pub fn single(path: &Path) -> Self {
        ShadowLog {
            path: path.to_path_buf(),
            rotate_bytes: None,
            keep: 0,
        }
    }

    /// The `k`-th rotated file (`<path>.k`).
    pub fn rotated(&self, k: usize) -> PathBuf {
        let mut name = self.path.clone().into_os_string();
        name.push(format!(".{k}"));
        PathBuf::from(name)
    }
}

/// The open log and how many bytes it holds.
#[derive(Debug)]
struct LogFile {
    out: std::io::BufWriter<std::fs::File>,
    len: u64,
    /// After a failed rotation, the size at which it is tried again (another
    /// `rotate_bytes` on), so that a lasting failure is not retried on every call.
    retry_at: u64,
}

#[derive(Debug)]
pub struct ShadowAdvisor {
    policy: String,
    model: Arc<dyn ModelSlot>,
    log: Mutex<LogFile>,
    options: ShadowLog,
    log_name: String,
    next_id: AtomicU64,
    recent: Mutex<VecDeque<DecisionRecord>>,
    advise: crate::service::advisor::AdviseOptions,
    advise_slots: Arc<tokio::sync::Semaphore>,
}

impl ShadowAdvisor {
    /// Recommends CPU-only nodes first for CPU-only jobs
    /// ([`crate::service::ServiceConfig::cpu_nodes_first`]).
    pub fn with_cpu_nodes_first(mut self, on: bool) -> Self {
        self.advise.cpu_nodes_first = on;
        self
    }

    /// Counts each tenant's holdings in the snapshot against `quota`
    /// ([`crate::service::ServiceConfig::quota`]).
    pub fn with_quota(mut self, quota: Option<crate::framework::QuotaConfig>) -> Self {
        self.advise.quota = quota.map(Arc::new);
        self
    }

    /// `Advise` calls computed at once ([`crate::service::advisor::advise_slots`]).
    pub fn with_max_concurrent_advise(self, n: usize) -> Self {
        ShadowAdvisor {
            advise_slots: crate::service::advisor::advise_slots(n),
            ..self
        }
    }

    /// Appends to `log.path` (created when missing). Decision ids continue after the
    /// largest already in it or, when it holds none (it was just rotated), in `.1`, so
    /// Explain ids stay unique across restarts and rotations. `model` serves the
    /// `learned` policy ([`crate::service::model::NoModel`] for a heuristic advisor).
    ///
    /// Only the log's tail is read ([`TAIL_BYTES`], more if no record ends in it): a log
    /// of months is not read whole at every start. Ids are handed out in order and
    /// appended within one call of each other, so the largest is among the last records.
    /// (Counting lines, as before, gave an id twice after a crash that lost a record
    /// written out of order.)
    pub fn open(
        policy: &str,
        log: &ShadowLog,
        model: Arc<dyn ModelSlot>,
    ) -> Result<Self, std::io::Error> {
        let file = open_for_append(&log.path)?;
        let mut largest_id = largest_id_at_the_end(&log.path, &file, true)?;
        // Also `.1`'s: a call that took a larger id may have been appended before the
        // rotation while a smaller one went after it.
        if let Ok(previous) = std::fs::File::open(log.rotated(1))
            && previous.metadata().is_ok_and(|m| m.is_file())
        {
            // Best effort: an unreadable `.1` must not keep the advisor from starting.
            match largest_id_at_the_end(&log.rotated(1), &previous, false) {
                Ok(id) => largest_id = largest_id.max(id),
                Err(error) => {
                    tracing::warn!(log = %log.rotated(1).display(), %error, "shadow log: cannot read the rotated log for its last id");
                }
            }
        }
        let len = file.metadata()?.len();
        Ok(ShadowAdvisor {
            policy: policy.to_string(),
            model,
            log: Mutex::new(LogFile {
                out: std::io::BufWriter::new(file),
                len,
                retry_at: 0,
            }),
            options: log.clone(),
            log_name: log.path.display().to_string(),
            next_id: AtomicU64::new(largest_id + 1),
            recent: Mutex::new(VecDeque::new()),
            advise: Default::default(),
            advise_slots: crate::service::advisor::advise_slots(0),
        })
    }

    /// Writes out and syncs the log (at shutdown).
    pub fn sync_log(&self) -> Result<(), std::io::Error> {
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.out.flush()?;
        log.out.get_ref().sync_all()
    }

    fn append(&self, records: &[DecisionRecord]) -> Result<(), Status> {
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        // The caller hears of it, and so does the operator: an incumbent that treats the
        // advisor as best effort would otherwise leave the log quietly incomplete.
        let io = |e: std::io::Error| {
            tracing::error!(log = %self.log_name, error = %e, "shadow log: a recommendation was not written");
            Status::internal(format!("shadow log {}: {e}", self.log_name))
        };
        for r in records {
            let line = serde_json::to_string(r).map_err(|e| Status::internal(e.to_string()))?;
            writeln!(log.out, "{line}").map_err(io)?;
            log.len += line.len() as u64 + 1;
        }
        log.out.flush().map_err(io)?;
        if let Some(max) = self.options.rotate_bytes
            && log.len >= max.max(log.retry_at)
        {
            // The records are in the log already: a failed rotation is logged, and the
            // log grows on until another `max` bytes later.
            if let Err(error) = rotate(&self.options, &mut log) {
                log.retry_at = log.len.saturating_add(max);
                tracing::warn!(log = %self.log_name, %error, "shadow log: rotation failed; still appending to the current file");
            }
        }
        Ok(())
    }
}

fn open_for_append(path: &Path) -> Result<std::fs::File, std::io::Error> {
    std::fs::OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(path)
}

/// `<path>.k` → `<path>.k+1` down to `.1`, dropping `.keep`; `<path>` → `<path>.1`; a
/// new `<path>`. The log is synced first, so a rotated file is whole. Once the log has
/// been renamed `.1`, a new `<path>` is opened before anything else can fail, or the
/// rename is undone: writing on under `.1` would let the next rotation shift, and in
/// the end delete, the file being written.
fn rotate(options: &ShadowLog, log: &mut LogFile) -> Result<(), std::io::Error> {
    rotate_opening(options, log, open_for_append)
}

/// [`rotate`], opening the new log with `open` (a failing one in tests).
fn rotate_opening(
    options: &ShadowLog,
    log: &mut LogFile,
    open: impl FnOnce(&Path) -> Result<std::fs::File, std::io::Error>,
) -> Result<(), std::io::Error> {
    log.out.get_ref().sync_all()?;
    let gone = |r: std::io::Result<()>| match r {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    };
    gone(std::fs::remove_file(options.rotated(options.keep.max(1))))?;
    for k in (1..options.keep.max(1)).rev() {
        gone(std::fs::rename(options.rotated(k), options.rotated(k + 1)))?;
    }
    std::fs::rename(&options.path, options.rotated(1))?;
    let file = match open(&options.path) {
        Ok(f) => f,
        Err(e) => {
            if let Err(back) = std::fs::rename(options.rotated(1), &options.path) {
                tracing::error!(log = %options.path.display(), error = %back, "shadow log: cannot undo a failed rotation; the log is being written as its .1 file");
            }
            return Err(e);
        }
    };
    *log = LogFile {
        out: std::io::BufWriter::new(file),
        len: 0,
        retry_at: 0,
    };
    if let Some(dir) = options.path.parent()
        && let Err(error) = marshal_model::artifact::sync_dir(dir)
    {
        tracing::warn!(log = %options.path.display(), %error, "shadow log: the rotation may not survive a power loss");
    }
    tracing::info!(log = %options.path.display(), "shadow log rotated");
    Ok(())
}

/// How much of the log's end [`ShadowAdvisor::open`] reads for the largest id: a few
/// hundred records.
pub const TAIL_BYTES: u64 = 1 << 20;

/// The largest decision id among the complete records at the end of the log (0 when
/// there are none), after cutting off a torn last record (`cut_torn`; a rotated file,
/// opened read-only, is only read).
///
/// A log that does not end in a newline was cut mid-record (a crash or a full disk while
/// appending). That record's call failed, so no caller saw it; appending after it would
/// glue the next record onto it and damage both, so it is cut off.
fn largest_id_at_the_end(
    log: &Path,
    file: &std::fs::File,
    cut_torn: bool,
) -> Result<u64, std::io::Error> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let len = file.metadata()?.len();
    let mut window = TAIL_BYTES.min(len);
    let tail = loop {
        let mut reader = file;
        reader.seek(SeekFrom::Start(len - window))?;
        let mut tail = Vec::with_capacity(window as usize);
        reader.take(window).read_to_end(&mut tail)?;
        // Enough once it holds a whole line (between two newlines), or the whole log.
        if window == len || tail.iter().filter(|&&b| b == b'\n').nth(1).is_some() {
            break tail;
        }
        window = (window * 2).min(len);
    };
    let start = len - window;
    let complete = if tail.is_empty() || tail.ends_with(b"\n") {
        tail.len()
    } else {
        tail.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1)
    };
    if complete < tail.len() && cut_torn {
        tracing::warn!(
            log = %log.display(),
            bytes = tail.len() - complete,
            "the shadow log ends in a torn record (no newline); cut off before appending"
        );
        file.set_len(start + complete as u64)?;
        file.sync_all()?;
    }
    // The window's first line may be a record's end; it parses as nothing and is skipped.
    #[derive(serde::Deserialize)]
    struct Id {
        id: u64,
    }
    Ok(tail[..complete]
        .split(|&b| b == b'\n')
        .filter_map(|line| serde_json::from_slice::<Id>(line).ok())
        .map(|r| r.id)
        .max()
        .unwrap_or(0))
}

#[tonic::async_trait]
impl AdvisorService for std::sync::Arc<ShadowAdvisor> {
    async fn advise(
        &self,
        req: Request<pb::AdviseRequest>,
    ) -> Result<Response<pb::AdviseResponse>, Status> {
        let req = req.into_inner();
        let (name, mut recs, mut records) = crate::service::advisor::advise_off_thread(
            req,
            &self.policy,
            self.model.as_ref(),
            &self.advise,
            &self.advise_slots,
        )
        .await?;
        for (rec, record) in recs.iter_mut().zip(records.iter_mut()) {
            record.id = self.next_id.fetch_add(1, Ordering::Relaxed);
            rec.decision_id = record.id;
        }
        self.append(&records)?;
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        for r in records {
            if recent.len() == EXPLAIN_WINDOW {
                recent.pop_front();
            }
            recent.push_back(r);
        }
        Ok(Response::new(pb::AdviseResponse {
            recommendations: recs,
            policy: name,
        }))
    }

    async fn explain(
        &self,
        req: Request<pb::ExplainRequest>,
    ) -> Result<Response<pb::Explanation>, Status> {
        let id = req.into_inner().decision_id;
        if id == 0 {
            return Err(ServiceError::invalid("decision_id", "missing (ids start at 1)").into());
        }
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let record = recent.iter().find(|r| r.id == id).ok_or_else(|| {
            Status::not_found(format!(
                "decision {id} is not among the last {EXPLAIN_WINDOW} of this process; \
                 the shadow log {} has every decision",
                self.log_name
            ))
        })?;
        Ok(Response::new(
            record.to_pb(&crate::domain::GpuCatalog::default()),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::model::NoModel;

    #[test]
    fn a_torn_last_record_is_cut_off_before_appending_and_ids_continue() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("shadow.jsonl");
        let complete = "{\"id\":1}\n{\"id\":2}\n";
        std::fs::write(&log, format!("{complete}{{\"id\":3,\"jo")).unwrap();
        let advisor =
            ShadowAdvisor::open("topo-pack", &ShadowLog::single(&log), Arc::new(NoModel)).unwrap();
        assert_eq!(std::fs::read_to_string(&log).unwrap(), complete);
        assert_eq!(advisor.next_id.load(Ordering::Relaxed), 3);

        // A log that ends cleanly is left as it is.
        drop(advisor);
        let advisor =
            ShadowAdvisor::open("topo-pack", &ShadowLog::single(&log), Arc::new(NoModel)).unwrap();
        assert_eq!(std::fs::read_to_string(&log).unwrap(), complete);
        assert_eq!(advisor.next_id.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn ids_continue_after_the_largest_even_when_a_record_was_lost() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("shadow.jsonl");
        // Two calls raced; the one holding id 5 was lost in a crash: five lines, but 6
        // is taken.
        let lines: String = [1, 2, 3, 4, 6]
            .iter()
            .map(|id| format!("{{\"id\":{id},\"job\":\"x\"}}\n"))
            .collect();
        std::fs::write(&log, &lines).unwrap();
        let advisor =
            ShadowAdvisor::open("topo-pack", &ShadowLog::single(&log), Arc::new(NoModel)).unwrap();
        assert_eq!(advisor.next_id.load(Ordering::Relaxed), 7);
        // An empty log starts at 1.
        let empty = dir.path().join("empty.jsonl");
        let advisor =
            ShadowAdvisor::open("topo-pack", &ShadowLog::single(&empty), Arc::new(NoModel))
                .unwrap();
        assert_eq!(advisor.next_id.load(Ordering::Relaxed), 1);
    }

    /// A record, its size in the log, and a log in `dir` that rotates every two
    /// records (ids 1 to 9: records of one size).
    fn two_records_per_file(dir: &Path, keep: usize) -> (DecisionRecord, u64, ShadowLog) {
        let mut record = crate::service::codec::tests::placement_decision();
        record.id = 1;
        let size = serde_json::to_string(&record).unwrap().len() as u64 + 1;
        let options = ShadowLog {
            path: dir.join("shadow.jsonl"),
            rotate_bytes: Some(2 * size),
            keep,
        };
        (record, size, options)
    }

    /// The decision ids in a log file, in order.
    fn ids(path: &Path) -> Vec<u64> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<DecisionRecord>(l).unwrap().id)
            .collect()
    }

    #[test]
    fn a_rotated_log_keeps_its_newest_files_and_ids_continue() {
        let dir = tempfile::tempdir().unwrap();
        let (record, _, options) = two_records_per_file(dir.path(), 2);
        let advisor = ShadowAdvisor::open("topo-pack", &options, Arc::new(NoModel)).unwrap();
        let append = |advisor: &ShadowAdvisor| {
            let mut r = record.clone();
            r.id = advisor.next_id.fetch_add(1, Ordering::Relaxed);
            advisor.append(&[r]).unwrap();
        };
        for _ in 0..7 {
            append(&advisor);
        }
        // 1 2 | 3 4 | 5 6 | 7: the oldest pair is gone, two rotated files are kept.
        assert_eq!(ids(&options.path), [7]);
        assert_eq!(ids(&options.rotated(1)), [5, 6]);
        assert_eq!(ids(&options.rotated(2)), [3, 4]);
        assert!(!options.rotated(3).exists());
        append(&advisor);
        drop(advisor);
        // Right after a rotation the log is empty: ids continue from `.1`.
        assert_eq!(std::fs::metadata(&options.path).unwrap().len(), 0);
        let advisor = ShadowAdvisor::open("topo-pack", &options, Arc::new(NoModel)).unwrap();
        assert_eq!(advisor.next_id.load(Ordering::Relaxed), 9);
        append(&advisor);
        assert_eq!(ids(&options.path), [9]);
        assert_eq!(ids(&options.rotated(1)), [7, 8]);
        drop(advisor);

        // Two calls raced across a rotation: 11 went into `.1`, 10 after it. A restart
        // must not hand out 11 again.
        std::fs::write(&options.path, "{\"id\":10}\n").unwrap();
        std::fs::write(options.rotated(1), "{\"id\":9}\n{\"id\":11}\n").unwrap();
        let advisor = ShadowAdvisor::open("topo-pack", &options, Arc::new(NoModel)).unwrap();
        assert_eq!(advisor.next_id.load(Ordering::Relaxed), 12);
    }

    #[test]
    fn a_failed_rotation_loses_nothing_and_is_not_retried_on_every_call() {
        let dir = tempfile::tempdir().unwrap();
        let (record, size, options) = two_records_per_file(dir.path(), 1);
        // `.1` cannot be replaced: it is a directory with something in it.
        std::fs::create_dir(options.rotated(1)).unwrap();
        std::fs::write(options.rotated(1).join("x"), b"x").unwrap();
        let advisor = ShadowAdvisor::open("topo-pack", &options, Arc::new(NoModel)).unwrap();
        for id in 1..=5 {
            let mut r = record.clone();
            r.id = id;
            advisor.append(&[r]).unwrap();
        }
        // Every record is in the log, which kept growing...
        let lines = std::fs::read_to_string(&options.path).unwrap();
        assert_eq!(lines.lines().count(), 5);
        // ...and the next try waits for another `rotate_bytes`: at 2 records, then 4.
        assert_eq!(advisor.log.lock().unwrap().retry_at, 6 * size);
        // Once `.1` can be replaced, the next try rotates.
        std::fs::remove_dir_all(options.rotated(1)).unwrap();
        let mut r = record.clone();
        r.id = 6;
        advisor.append(&[r]).unwrap();
        assert_eq!(
            std::fs::read_to_string(options.rotated(1))
                .unwrap()
                .lines()
                .count(),
            6
        );
        assert_eq!(std::fs::metadata(&options.path).unwrap().len(), 0);
    }

    #[test]
    fn a_rotation_that_cannot_open_the_new_log_undoes_its_rename() {
        let dir = tempfile::tempdir().unwrap();
        let (record, _, options) = two_records_per_file(dir.path(), 2);
        let advisor = ShadowAdvisor::open("topo-pack", &options, Arc::new(NoModel)).unwrap();
        let append = |log: &mut LogFile, id: u64| {
            let mut r = record.clone();
            r.id = id;
            writeln!(log.out, "{}", serde_json::to_string(&r).unwrap()).unwrap();
            log.out.flush().unwrap();
        };
        let mut log = advisor.log.lock().unwrap();
        append(&mut log, 1);
        let refused = rotate_opening(&options, &mut log, |_| {
            Err(std::io::Error::other("no file descriptors left"))
        });
        assert!(refused.is_err());
        // The file being written is the log again, not its `.1`, which a later
        // rotation would shift and in the end delete.
        assert!(!options.rotated(1).exists());
        append(&mut log, 2);
        assert_eq!(ids(&options.path), [1, 2]);
        // The next rotation works from there.
        rotate(&options, &mut log).unwrap();
        append(&mut log, 3);
        assert_eq!(ids(&options.rotated(1)), [1, 2]);
        assert_eq!(ids(&options.path), [3]);
    }

    #[test]
    fn a_long_log_is_read_only_at_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("shadow.jsonl");
        // 3 MiB of records, then a torn one; the window is 1 MiB.
        let pad = "p".repeat(1000);
        let mut text = String::new();
        let mut id = 0;
        while (text.len() as u64) < 3 * TAIL_BYTES {
            id += 1;
            text.push_str(&format!("{{\"id\":{id},\"pad\":\"{pad}\"}}\n"));
        }
        let complete = text.len();
        text.push_str("{\"id\":99999,\"pa");
        std::fs::write(&log, &text).unwrap();
        let advisor =
            ShadowAdvisor::open("topo-pack", &ShadowLog::single(&log), Arc::new(NoModel)).unwrap();
        assert_eq!(advisor.next_id.load(Ordering::Relaxed), id + 1);
        assert_eq!(std::fs::metadata(&log).unwrap().len(), complete as u64);
        // One record longer than the window: the window grows until a record ends in it.
        let huge = format!("{{\"id\":41,\"pad\":\"{}\"}}\n", "q".repeat(3 << 20));
        std::fs::write(&log, format!("{{\"id\":40}}\n{huge}")).unwrap();
        let advisor =
            ShadowAdvisor::open("topo-pack", &ShadowLog::single(&log), Arc::new(NoModel)).unwrap();
        assert_eq!(advisor.next_id.load(Ordering::Relaxed), 42);
    }
}
