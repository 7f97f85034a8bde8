//! The decision log in Parquet (feature `decision-log`, on with `service`): one row per
//! placement decision the server makes, and one outcome row when the placement it made
//! ends, for the trainer to retrain from.
//!
//! Two file sets under the log directory, joined on `decision_id`:
//!
//! ```text
//! <dir>/decisions/part-<first decision id, 20 digits>-<seq>.parquet   DecisionRow
//! <dir>/outcomes/part-<unix µs>-<seq>.parquet                        OutcomeRow
//! ```
//!
//! (Two schemas rather than one with nullable outcome columns: a decision row is final
//! when written, and an outcome arrives minutes to days later, so no file is rewritten.)
//!
//! The writer ([`DecisionLog`]) is a thread behind a bounded channel: [`DecisionLog::send`]
//! never blocks (a full channel drops the batch and counts it), rows are buffered up to
//! `file_rows` or `flush_ms`, and each file is written whole under a hidden `.tmp` name,
//! `fsync`ed and renamed, so a reader sees complete files only. A write error is logged,
//! counted (its rows are dropped, so memory stays bounded) and the writer carries on.
//! [`read_decision_log`] reads both sets back. Decisions of the learned policy also carry
//! their featurised candidates ([`LoggedFeatures`], module `features`), which is what the
//! trainer's `marshal train policy-from-log` learns from.

mod features;
mod resume;
mod retention;

pub use features::LoggedFeatures;
#[cfg(test)]
pub(crate) use resume::write_placements;
pub use resume::{HighestLogged, highest_logged_decision};
pub use retention::{Pruned, prune_files, prune_log};

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arrow_array::builder::{
    BooleanBuilder, Float64Builder, Int32Builder, Int64Builder, StringBuilder, UInt32Builder,
    UInt64Builder,
};
use arrow_array::{
    Array, ArrayRef, BooleanArray, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
    UInt32Array, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

/// The layout of the log's files, written into each file's key-value metadata: a
/// reader skips a file of a later version rather than misread it. Files without it were
/// written before it was kept, in version 1.
pub const LOG_VERSION: u32 = 1;
const VERSION_KEY: &str = "marshal.decision_log.version";
/// The database whose decisions a file holds (`Store::database_id`): decision ids start
/// again at 1 in each database, so rows of two databases must never be joined.
const DATABASE_KEY: &str = "marshal.database";

/// Sub-directory of the decision rows.
pub const DECISIONS_DIR: &str = "decisions";
/// Sub-directory of the outcome rows.
pub const OUTCOMES_DIR: &str = "outcomes";

/// One placement decision: its inputs, the action and who decided.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DecisionRow {
    pub decision_id: u64,
    /// Wall-clock time of the decision, Unix microseconds.
    pub at_us: i64,
    pub job_id: String,
    // The job spec, summarised.
    pub job_name: String,
    pub tenant: String,
    pub priority: i32,
    pub workers: u32,
    /// `none`, `whole`, `milli` or `mig`.
    pub gpu_kind: String,
    /// GPU per worker in thousandths (8 whole GPUs = 8000).
    pub gpu_milli_per_worker: u32,
    pub cpu_milli: u32,
    pub memory_mib: u64,
    /// `none`, `data-parallel`, `tensor-parallel`, `pipeline-parallel`.
    pub comm: String,
    pub preemptible: bool,
    // The cluster at decision time.
    pub queue_depth: u32,
    pub idle_gpus: u32,
    pub feasible_nodes: u32,
    // The action.
    /// `place` or `reject`.
    pub verdict: String,
    pub reason: String,
    /// The node of each worker, comma-separated (empty when not placed).
    pub nodes: String,
    /// GPU indices per worker: `node:0,1;node:2` (`node:3@500` for a share).
    pub gpus: String,
    /// GPU thousandths allocated by the placement.
    pub gpu_milli_placed: u64,
    // Who decided.
    /// `heuristic:<policy>`, `learned` or `fallback:<reason>`.
    pub path: String,
    /// The gate's confidence (probability margin); absent for heuristics.
    pub confidence: Option<f64>,
    pub policy: String,
    /// Content hash of the model artifact that served the decision (learned policy).
    pub model_version: Option<String>,
    /// The featurised decision (learned policy only; absent in older files).
    pub features: Option<LoggedFeatures>,
}

/// How a placement ended: the outcome of its decision.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OutcomeRow {
    pub decision_id: u64,
    pub job_id: String,
    /// The job state that ended the placement: `COMPLETED`, `FAILED`, `PREEMPTED`,
    /// `REQUEUED`, `CANCELLED`, or `REJECTED` for a rejection decision.
    pub state: String,
    pub at_us: i64,
    /// Seconds from entering the queue to the decision.
    pub wait_s: f64,
    /// Seconds the placement ran (absent for a rejection).
    pub run_s: Option<f64>,
}

/// Rows to append.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogBatch {
    pub decisions: Vec<DecisionRow>,
    pub outcomes: Vec<OutcomeRow>,
}

impl LogBatch {
    pub fn is_empty(&self) -> bool {
        self.decisions.is_empty() && self.outcomes.is_empty()
    }

    fn len(&self) -> u64 {
        (self.decisions.len() + self.outcomes.len()) as u64
    }
}

/// Writer settings.
#[derive(Clone, Debug, PartialEq)]
pub struct LogOptions {
    /// Rows per file at most (decisions and outcomes each).
    pub file_rows: usize,
    /// Buffered rows are written at least this often.
    pub flush_ms: u64,
    /// Batches the channel holds before `send` starts dropping.
    pub channel_batches: usize,
    /// Files last written longer ago than this are deleted ([`prune_log`]: at start,
    /// then every [`RETENTION_SWEEP`]); `None`: kept for ever.
    pub retention: Option<Duration>,
    /// The database the decisions belong to, written into every file.
    pub database: Option<u64>,
}

/// How often the writer deletes expired files when a retention is set.
pub const RETENTION_SWEEP: Duration = Duration::from_secs(3600);

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            file_rows: 8192,
            flush_ms: 10_000,
            channel_batches: 1024,
            retention: None,
            database: None,
        }
    }
}

/// The writer's counters.
#[derive(Debug, Default)]
pub struct LogStats {
    pub rows_written: AtomicU64,
    pub files_written: AtomicU64,
    /// Failed file writes (their rows are lost).
    pub write_errors: AtomicU64,
    /// Rows lost: in failed files, or dropped because the channel was full.
    pub rows_lost: AtomicU64,
    /// Files deleted by the retention.
    pub files_pruned: AtomicU64,
}

/// A snapshot of [`LogStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogCounts {
    pub rows_written: u64,
    pub files_written: u64,
    pub write_errors: u64,
    pub rows_lost: u64,
    pub files_pruned: u64,
}

impl LogStats {
    pub fn snapshot(&self) -> LogCounts {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LogCounts {
            rows_written: r(&self.rows_written),
            files_written: r(&self.files_written),
            write_errors: r(&self.write_errors),
            rows_lost: r(&self.rows_lost),
            files_pruned: r(&self.files_pruned),
        }
    }
}

/// The decision-log writer: a thread fed through a bounded channel.
#[derive(Debug)]
pub struct DecisionLog {
    dir: PathBuf,
    tx: Option<SyncSender<LogBatch>>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<LogStats>,
    /// Rows are being dropped (the writer is behind): said when it begins and ends, not
    /// at every batch, which at thousands of jobs a second floods the log.
    dropping: std::sync::atomic::AtomicBool,
    /// The writer thread ended (a panic): said once.
    writer_gone: std::sync::atomic::AtomicBool,
}

impl DecisionLog {
    /// Starts the writer for `dir`. Never fails: a directory that cannot be created or
    /// written shows up as write errors, and scheduling goes on.
    pub fn open(dir: &Path, opts: LogOptions) -> DecisionLog {
        let (tx, rx) = sync_channel(opts.channel_batches.max(1));
        let stats = Arc::new(LogStats::default());
        let writer = Writer {
            dir: dir.to_path_buf(),
            opts,
            stats: stats.clone(),
            seq: 0,
            decisions: Vec::new(),
            outcomes: Vec::new(),
        };
        let thread = std::thread::Builder::new()
            .name("decision-log".into())
            .spawn(move || writer.run(rx));
        let thread = match thread {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::error!(error = %e, "decision log: cannot start the writer thread; nothing is logged");
                stats.write_errors.fetch_add(1, Ordering::Relaxed);
                None
            }
        };
        DecisionLog {
            dir: dir.to_path_buf(),
            tx: thread.as_ref().map(|_| tx),
            thread,
            stats,
            dropping: Default::default(),
            writer_gone: Default::default(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Queues rows for writing; never blocks. A full channel drops them (counted).
    pub fn send(&self, batch: LogBatch) {
        if batch.is_empty() {
            return;
        }
        let n = batch.len();
        let sent = match &self.tx {
            Some(tx) => match tx.try_send(batch) {
                Ok(()) => {
                    if self.dropping.swap(false, Ordering::Relaxed) {
                        tracing::warn!(
                            rows_lost = self.stats.rows_lost.load(Ordering::Relaxed),
                            "decision log: the writer caught up; rows are logged again"
                        );
                    }
                    true
                }
                Err(TrySendError::Full(_)) => {
                    if !self.dropping.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            rows = n,
                            "decision log: writer behind; rows dropped until it catches up (counted in marshal_decision_log_rows_total{{outcome=\"lost\"}})"
                        );
                    }
                    false
                }
                Err(TrySendError::Disconnected(_)) => {
                    if !self.writer_gone.swap(true, Ordering::Relaxed) {
                        tracing::error!(
                            "decision log: the writer thread has stopped; every later row is lost"
                        );
                    }
                    false
                }
            },
            None => false,
        };
        if !sent {
            self.stats.rows_lost.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub fn stats(&self) -> LogCounts {
        self.stats.snapshot()
    }

    /// Writes whatever is buffered and stops the thread.
    pub fn finish(mut self) -> LogCounts {
        self.close();
        self.stats.snapshot()
    }

    fn close(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for DecisionLog {
    fn drop(&mut self) {
        self.close();
    }
}

struct Writer {
    dir: PathBuf,
    opts: LogOptions,
    stats: Arc<LogStats>,
    seq: u64,
    decisions: Vec<DecisionRow>,
    outcomes: Vec<OutcomeRow>,
}

impl Writer {
    fn run(mut self, rx: Receiver<LogBatch>) {
        let every = Duration::from_millis(self.opts.flush_ms.max(1));
        let mut last = Instant::now();
        let mut next_sweep = Instant::now();
        loop {
            if self.opts.retention.is_some() && Instant::now() >= next_sweep {
                self.sweep();
                next_sweep = Instant::now() + RETENTION_SWEEP;
            }
            let mut wait = every.saturating_sub(last.elapsed());
            if self.opts.retention.is_some() {
                wait = wait.min(next_sweep.saturating_duration_since(Instant::now()));
            }
            match rx.recv_timeout(wait) {
                Ok(mut b) => {
                    self.decisions.append(&mut b.decisions);
                    self.outcomes.append(&mut b.outcomes);
                    if self.decisions.len() >= self.opts.file_rows {
                        self.flush_decisions();
                    }
                    if self.outcomes.len() >= self.opts.file_rows {
                        self.flush_outcomes();
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.flush_decisions();
                    self.flush_outcomes();
                    return;
                }
            }
            if last.elapsed() >= every {
                self.flush_decisions();
                self.flush_outcomes();
                last = Instant::now();
            }
        }
    }

    fn sweep(&self) {
        let Some(keep) = self.opts.retention else {
            return;
        };
        // A horizon before the epoch (a clock far off) deletes nothing.
        let Some(before) = std::time::SystemTime::now().checked_sub(keep) else {
            return;
        };
        let pruned = prune_log(&self.dir, before);
        self.stats
            .files_pruned
            .fetch_add(pruned.files, Ordering::Relaxed);
    }

    fn flush_decisions(&mut self) {
        while !self.decisions.is_empty() {
            let n = self.decisions.len().min(self.opts.file_rows.max(1));
            let rows: Vec<DecisionRow> = self.decisions.drain(..n).collect();
            let name = format!("part-{:020}-{:06}.parquet", rows[0].decision_id, self.seq);
            self.seq += 1;
            let result = decisions_batch(&rows).and_then(|b| {
                write_file(&self.dir.join(DECISIONS_DIR), &name, &b, self.opts.database)
            });
            self.account(result, rows.len());
        }
    }

    fn flush_outcomes(&mut self) {
        while !self.outcomes.is_empty() {
            let n = self.outcomes.len().min(self.opts.file_rows.max(1));
            let rows: Vec<OutcomeRow> = self.outcomes.drain(..n).collect();
            let name = format!("part-{:020}-{:06}.parquet", rows[0].at_us.max(0), self.seq);
            self.seq += 1;
            let result = outcomes_batch(&rows).and_then(|b| {
                write_file(&self.dir.join(OUTCOMES_DIR), &name, &b, self.opts.database)
            });
            self.account(result, rows.len());
        }
    }

    fn account(&self, result: Result<(), String>, rows: usize) {
        match result {
            Ok(()) => {
                self.stats
                    .rows_written
                    .fetch_add(rows as u64, Ordering::Relaxed);
                self.stats.files_written.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                tracing::warn!(%error, rows, "decision log: file not written; rows lost");
                self.stats.write_errors.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .rows_lost
                    .fetch_add(rows as u64, Ordering::Relaxed);
            }
        }
    }
}

/// Writes `batch` to `dir/name` through a hidden temporary file, `fsync` and rename.
fn write_file(
    dir: &Path,
    name: &str,
    batch: &RecordBatch,
    database: Option<u64>,
) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    // The process id keeps two servers that share the directory (a misconfiguration,
    // or the old and new process during a restart) off each other's temporary files.
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let done = unused_name(dir, name);
    let write = || -> Result<(), String> {
        let file = File::create(&tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
        let mut meta = vec![KeyValue::new(
            VERSION_KEY.to_string(),
            LOG_VERSION.to_string(),
        )];
        if let Some(db) = database {
            meta.push(KeyValue::new(
                DATABASE_KEY.to_string(),
                format!("{db:016x}"),
            ));
        }
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .set_key_value_metadata(Some(meta))
            .build();
        let mut w = ArrowWriter::try_new(file, batch.schema(), Some(props))
            .map_err(|e| format!("{}: {e}", tmp.display()))?;
        w.write(batch)
            .map_err(|e| format!("writing {}: {e}", tmp.display()))?;
        let file = w
            .into_inner()
            .map_err(|e| format!("closing {}: {e}", tmp.display()))?;
        file.sync_all()
            .map_err(|e| format!("syncing {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &done).map_err(|e| format!("renaming {}: {e}", done.display()))?;
        // The rows are in place; only their durability across a power loss is in doubt.
        if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
            tracing::warn!(dir = %dir.display(), error = %e, "decision log: directory not synced");
        }
        Ok(())
    };
    let r = write();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// `dir/name`, or, when a file of that name exists (decision ids that repeat: another
/// server writing here, or ids reused after a crash without durable commits),
/// `dir/<stem>-dup<N>.parquet` for the first free N: a file is never replaced.
fn unused_name(dir: &Path, name: &str) -> PathBuf {
    let first = dir.join(name);
    if !first.exists() {
        return first;
    }
    let stem = name.strip_suffix(".parquet").unwrap_or(name);
    (1u32..)
        .map(|n| dir.join(format!("{stem}-dup{n}.parquet")))
        .find(|p| !p.exists())
        .expect("some suffix is free")
}

fn decisions_schema() -> SchemaRef {
    use DataType::*;
    let f = |n: &str, t: DataType, null: bool| Field::new(n, t, null);
    Arc::new(Schema::new(
        [
            f("decision_id", UInt64, false),
            f("at_us", Int64, false),
            f("job_id", Utf8, false),
            f("job_name", Utf8, false),
            f("tenant", Utf8, false),
            f("priority", Int32, false),
            f("workers", UInt32, false),
            f("gpu_kind", Utf8, false),
            f("gpu_milli_per_worker", UInt32, false),
            f("cpu_milli", UInt32, false),
            f("memory_mib", UInt64, false),
            f("comm", Utf8, false),
            f("preemptible", Boolean, false),
            f("queue_depth", UInt32, false),
            f("idle_gpus", UInt32, false),
            f("feasible_nodes", UInt32, false),
            f("verdict", Utf8, false),
            f("reason", Utf8, false),
            f("nodes", Utf8, false),
            f("gpus", Utf8, false),
            f("gpu_milli_placed", UInt64, false),
            f("path", Utf8, false),
            f("confidence", Float64, true),
            f("policy", Utf8, false),
            f("model_version", Utf8, true),
        ]
        .into_iter()
        .chain(features::fields())
        .collect::<Vec<_>>(),
    ))
}

fn outcomes_schema() -> SchemaRef {
    use DataType::*;
    Arc::new(Schema::new(vec![
        Field::new("decision_id", UInt64, false),
        Field::new("job_id", Utf8, false),
        Field::new("state", Utf8, false),
        Field::new("at_us", Int64, false),
        Field::new("wait_s", Float64, false),
        Field::new("run_s", Float64, true),
    ]))
}

fn strings<'a>(it: impl Iterator<Item = Option<&'a str>>) -> ArrayRef {
    let mut b = StringBuilder::new();
    for s in it {
        b.append_option(s);
    }
    Arc::new(b.finish())
}

fn decisions_batch(rows: &[DecisionRow]) -> Result<RecordBatch, String> {
    macro_rules! col {
        ($b:ty, $f:ident) => {{
            let mut b = <$b>::new();
            for r in rows {
                b.append_value(r.$f);
            }
            Arc::new(b.finish()) as ArrayRef
        }};
    }
    let s = |get: fn(&DecisionRow) -> &str| strings(rows.iter().map(|r| Some(get(r))));
    let mut confidence = Float64Builder::new();
    for r in rows {
        confidence.append_option(r.confidence);
    }
    let mut columns: Vec<ArrayRef> = vec![
        col!(UInt64Builder, decision_id),
        col!(Int64Builder, at_us),
        s(|r| &r.job_id),
        s(|r| &r.job_name),
        s(|r| &r.tenant),
        col!(Int32Builder, priority),
        col!(UInt32Builder, workers),
        s(|r| &r.gpu_kind),
        col!(UInt32Builder, gpu_milli_per_worker),
        col!(UInt32Builder, cpu_milli),
        col!(UInt64Builder, memory_mib),
        s(|r| &r.comm),
        col!(BooleanBuilder, preemptible),
        col!(UInt32Builder, queue_depth),
        col!(UInt32Builder, idle_gpus),
        col!(UInt32Builder, feasible_nodes),
        s(|r| &r.verdict),
        s(|r| &r.reason),
        s(|r| &r.nodes),
        s(|r| &r.gpus),
        col!(UInt64Builder, gpu_milli_placed),
        s(|r| &r.path),
        Arc::new(confidence.finish()),
        s(|r| &r.policy),
        strings(rows.iter().map(|r| r.model_version.as_deref())),
    ];
    columns.extend(features::columns(rows.iter().map(|r| r.features.as_ref())));
    RecordBatch::try_new(decisions_schema(), columns).map_err(|e| e.to_string())
}

fn outcomes_batch(rows: &[OutcomeRow]) -> Result<RecordBatch, String> {
    let mut id = UInt64Builder::new();
    let mut at = Int64Builder::new();
    let mut wait = Float64Builder::new();
    let mut run = Float64Builder::new();
    for r in rows {
        id.append_value(r.decision_id);
        at.append_value(r.at_us);
        wait.append_value(r.wait_s);
        run.append_option(r.run_s);
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(id.finish()),
        strings(rows.iter().map(|r| Some(r.job_id.as_str()))),
        strings(rows.iter().map(|r| Some(r.state.as_str()))),
        Arc::new(at.finish()),
        Arc::new(wait.finish()),
        Arc::new(run.finish()),
    ];
    RecordBatch::try_new(outcomes_schema(), columns).map_err(|e| e.to_string())
}

/// The decision log read back: every complete file of both sets.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DecisionLogData {
    /// Sorted by decision id.
    pub decisions: Vec<DecisionRow>,
    /// Sorted by time.
    pub outcomes: Vec<OutcomeRow>,
    /// Files read.
    pub files: usize,
    /// Files left out because they could not be read, each with its path and reason.
    pub skipped: Vec<String>,
    /// The database the rows read are of, when their files say.
    pub database: Option<u64>,
}

impl DecisionLogData {
    /// Each decision with its outcome, if the placement has ended.
    pub fn joined(&self) -> Vec<(&DecisionRow, Option<&OutcomeRow>)> {
        let by_id: std::collections::HashMap<u64, &OutcomeRow> =
            self.outcomes.iter().map(|o| (o.decision_id, o)).collect();
        self.decisions
            .iter()
            .map(|d| (d, by_id.get(&d.decision_id).copied()))
            .collect()
    }
}

fn column<'a, T: 'static>(b: &'a RecordBatch, name: &str) -> Result<&'a T, String> {
    b.column_by_name(name)
        .ok_or_else(|| format!("column {name} missing"))?
        .as_any()
        .downcast_ref::<T>()
        .ok_or_else(|| {
            format!(
                "column {name} has type {:?}",
                b.schema()
                    .field_with_name(name)
                    .map(|f| f.data_type().clone())
            )
        })
}

/// [`column`], for a column the writer never leaves null. Read through `value(i)`, a
/// null slot gives whatever its buffer holds (0, an empty string) without a word, so a
/// file holding one (another writer's, or damaged) is refused, naming the column and
/// the row (counted from 0 over the file; the batch's rows start at `first_row`).
fn required<'a, T: Array + 'static>(
    b: &'a RecordBatch,
    name: &str,
    first_row: usize,
) -> Result<&'a T, String> {
    let a = column::<T>(b, name)?;
    if a.null_count() == 0 {
        return Ok(a);
    }
    let i = (0..a.len()).find(|&i| a.is_null(i)).unwrap_or(0);
    Err(format!(
        "row {}: column {name} is null, which the decision log never writes",
        first_row + i
    ))
}

fn parquet_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(format!("listing {}: {e}", dir.display())),
    };
    for e in entries {
        let e = e.map_err(|e| format!("listing {}: {e}", dir.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && name.ends_with(".parquet") {
            out.push(e.path());
        }
    }
    out.sort();
    Ok(out)
}

/// A file's batches, and the database it names (none in a file written before files
/// named it). A file of a later layout than [`LOG_VERSION`] is refused.
fn batches(path: &Path) -> Result<(Option<u64>, Vec<RecordBatch>), String> {
    let (database, builder) = open_log_file(path)?;
    let batches = builder
        .build()
        .map_err(|e| format!("{}: {e}", path.display()))?
        .map(|b| b.map_err(|e| format!("{}: {e}", path.display())))
        .collect::<Result<_, _>>()?;
    Ok((database, batches))
}

/// A file's reader, its footer read, and the database the file names (see
/// [`batches`]); nothing else is read yet.
fn open_log_file(
    path: &Path,
) -> Result<(Option<u64>, ParquetRecordBatchReaderBuilder<File>), String> {
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = builder
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .cloned()
        .unwrap_or_default();
    let value = |key: &str| {
        meta.iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.clone())
    };
    if let Some(v) = value(VERSION_KEY) {
        match v.parse::<u32>() {
            Ok(n) if n <= LOG_VERSION => {}
            _ => {
                return Err(format!(
                    "{}: decision log version {v:?}, written by a newer Marshal (this one reads up to {LOG_VERSION})",
                    path.display()
                ));
            }
        }
    }
    let database = match value(DATABASE_KEY) {
        Some(v) => Some(
            u64::from_str_radix(&v, 16)
                .map_err(|_| format!("{}: database {v:?} is not an id", path.display()))?,
        ),
        None => None,
    };
    Ok((database, builder))
}

fn opt_f64(a: &Float64Array, i: usize) -> Option<f64> {
    (!a.is_null(i)).then(|| a.value(i))
}

/// Reads the decision log under `dir` (both file sets). A damaged file (cut short, of
/// another schema, of a later layout) is skipped whole and named in
/// [`DecisionLogData::skipped`], so one bad file costs its own rows only; a directory
/// that cannot be listed is an error.
///
/// Files of several databases (a database replaced while its log directory was kept)
/// are not mixed: decision ids start again at 1 in each, so joining them would pair
/// rows of different jobs. The database whose files hold the latest row is read; the
/// others' files are skipped, each named with why. Files that name no database
/// (written before files did) are read as before beside one named database, and
/// skipped beside two or more, where they could be of either.
pub fn read_decision_log(dir: &Path) -> Result<DecisionLogData, String> {
    let mut data = DecisionLogData::default();
    let mut decisions = Vec::new();
    for path in parquet_files(&dir.join(DECISIONS_DIR))? {
        match decisions_in(&path) {
            Ok((db, rows)) => decisions.push((path, db, rows)),
            Err(e) => data.skipped.push(e),
        }
    }
    let mut outcomes = Vec::new();
    for path in parquet_files(&dir.join(OUTCOMES_DIR))? {
        match outcomes_in(&path) {
            Ok((db, rows)) => outcomes.push((path, db, rows)),
            Err(e) => data.skipped.push(e),
        }
    }
    let latest = |db: &Option<u64>, at: i64, best: &mut Option<(i64, u64)>| {
        if let Some(db) = *db
            && best.is_none_or(|(t, _)| at > t)
        {
            *best = Some((at, db));
        }
    };
    let mut newest: Option<(i64, u64)> = None;
    for (_, db, rows) in &decisions {
        for r in rows {
            latest(db, r.at_us, &mut newest);
        }
    }
    for (_, db, rows) in &outcomes {
        for r in rows {
            latest(db, r.at_us, &mut newest);
        }
    }
    data.database = newest.map(|(_, db)| db);
    let named: std::collections::BTreeSet<u64> = decisions
        .iter()
        .map(|(_, db, _)| db)
        .chain(outcomes.iter().map(|(_, db, _)| db))
        .flatten()
        .copied()
        .collect();
    let foreign = |path: &Path, db: &Option<u64>| -> Option<String> {
        match (db, data.database) {
            (Some(db), Some(kept)) if *db != kept => Some(format!(
                "{}: from database {db:016x}, not {kept:016x} whose rows are the latest here; decision ids start again in each database, so its rows are left out",
                path.display()
            )),
            // Beside two named databases, a file naming none could be of either.
            (None, Some(_)) if named.len() > 1 => Some(format!(
                "{}: names no database (written before files did), and this log holds {} databases' files; its rows are left out",
                path.display(),
                named.len()
            )),
            _ => None,
        }
    };
    let mut skipped = Vec::new();
    for (path, db, rows) in decisions {
        match foreign(&path, &db) {
            Some(why) => skipped.push(why),
            None => {
                data.files += 1;
                data.decisions.extend(rows);
            }
        }
    }
    for (path, db, rows) in outcomes {
        match foreign(&path, &db) {
            Some(why) => skipped.push(why),
            None => {
                data.files += 1;
                data.outcomes.extend(rows);
            }
        }
    }
    data.skipped.extend(skipped);
    data.decisions.sort_by_key(|d| d.decision_id);
    data.outcomes.sort_by_key(|o| (o.at_us, o.decision_id));
    Ok(data)
}

/// Every decision row of one file, or why the file is unusable (naming it, and the row
/// when a value is missing or malformed).
fn decisions_in(path: &Path) -> Result<(Option<u64>, Vec<DecisionRow>), String> {
    let mut rows = Vec::new();
    let (database, batches) = batches(path)?;
    for b in batches {
        let first_row = rows.len();
        let err = |e: String| format!("{}: {e}", path.display());
        let u64s = |n| required::<UInt64Array>(&b, n, first_row).map_err(err);
        let u32s = |n| required::<UInt32Array>(&b, n, first_row).map_err(err);
        let strs = |n| required::<StringArray>(&b, n, first_row).map_err(err);
        let (id, at, prio) = (
            u64s("decision_id")?,
            required::<Int64Array>(&b, "at_us", first_row).map_err(err)?,
            required::<Int32Array>(&b, "priority", first_row).map_err(err)?,
        );
        let (job, name, tenant, kind, comm) = (
            strs("job_id")?,
            strs("job_name")?,
            strs("tenant")?,
            strs("gpu_kind")?,
            strs("comm")?,
        );
        let (workers, gpw, cpu, mem) = (
            u32s("workers")?,
            u32s("gpu_milli_per_worker")?,
            u32s("cpu_milli")?,
            u64s("memory_mib")?,
        );
        let pre = required::<BooleanArray>(&b, "preemptible", first_row).map_err(err)?;
        let (qd, idle, feas) = (
            u32s("queue_depth")?,
            u32s("idle_gpus")?,
            u32s("feasible_nodes")?,
        );
        let (verdict, reason, nodes, gpus) = (
            strs("verdict")?,
            strs("reason")?,
            strs("nodes")?,
            strs("gpus")?,
        );
        let placed = u64s("gpu_milli_placed")?;
        let (path_c, policy) = (strs("path")?, strs("policy")?);
        let version = column::<StringArray>(&b, "model_version").map_err(err)?;
        let conf = column::<Float64Array>(&b, "confidence").map_err(err)?;
        let feats = features::FeatureColumns::of(&b).map_err(err)?;
        for i in 0..b.num_rows() {
            rows.push(DecisionRow {
                decision_id: id.value(i),
                at_us: at.value(i),
                job_id: job.value(i).into(),
                job_name: name.value(i).into(),
                tenant: tenant.value(i).into(),
                priority: prio.value(i),
                workers: workers.value(i),
                gpu_kind: kind.value(i).into(),
                gpu_milli_per_worker: gpw.value(i),
                cpu_milli: cpu.value(i),
                memory_mib: mem.value(i),
                comm: comm.value(i).into(),
                preemptible: pre.value(i),
                queue_depth: qd.value(i),
                idle_gpus: idle.value(i),
                feasible_nodes: feas.value(i),
                verdict: verdict.value(i).into(),
                reason: reason.value(i).into(),
                nodes: nodes.value(i).into(),
                gpus: gpus.value(i).into(),
                gpu_milli_placed: placed.value(i),
                path: path_c.value(i).into(),
                confidence: opt_f64(conf, i),
                policy: policy.value(i).into(),
                model_version: (!version.is_null(i)).then(|| version.value(i).to_string()),
                features: feats
                    .row(i)
                    .map_err(|e| err(format!("row {}: {e}", first_row + i)))?,
            });
        }
    }
    Ok((database, rows))
}

/// Every outcome row of one file, or why the file is unusable (naming it).
fn outcomes_in(path: &Path) -> Result<(Option<u64>, Vec<OutcomeRow>), String> {
    let mut rows = Vec::new();
    let (database, batches) = batches(path)?;
    for b in batches {
        let first_row = rows.len();
        let err = |e: String| format!("{}: {e}", path.display());
        let id = required::<UInt64Array>(&b, "decision_id", first_row).map_err(err)?;
        let job = required::<StringArray>(&b, "job_id", first_row).map_err(err)?;
        let state = required::<StringArray>(&b, "state", first_row).map_err(err)?;
        let at = required::<Int64Array>(&b, "at_us", first_row).map_err(err)?;
        let wait = required::<Float64Array>(&b, "wait_s", first_row).map_err(err)?;
        let run = column::<Float64Array>(&b, "run_s").map_err(err)?;
        for i in 0..b.num_rows() {
            rows.push(OutcomeRow {
                decision_id: id.value(i),
                job_id: job.value(i).into(),
                state: state.value(i).into(),
                at_us: at.value(i),
                wait_s: wait.value(i),
                run_s: opt_f64(run, i),
            });
        }
    }
    Ok((database, rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(id: u64) -> DecisionRow {
        DecisionRow {
            decision_id: id,
            at_us: 1_000 + id as i64,
            job_id: id.to_string(),
            workers: 1,
            gpu_kind: "whole".into(),
            gpu_milli_per_worker: 2000,
            verdict: "place".into(),
            nodes: "n-0".into(),
            gpus: "n-0:0,1".into(),
            path: "learned".into(),
            confidence: id.is_multiple_of(2).then_some(0.5),
            policy: "learned".into(),
            model_version: Some("abc".into()),
            // Every third row is a heuristic's: no features.
            features: (!id.is_multiple_of(3)).then(|| LoggedFeatures {
                version: marshal_model::policy::POLICY_SCHEMA_VERSION,
                job: vec![id as f32; marshal_model::policy::JOB_FEATURES],
                candidates: vec![0.5; 2 * marshal_model::policy::CANDIDATE_FEATURES],
                taken: (id % 2) as u32,
            }),
            ..DecisionRow::default()
        }
    }

    /// Small files, flushed only when full or finished.
    fn four_row_files() -> LogOptions {
        LogOptions {
            file_rows: 4,
            flush_ms: 60_000,
            channel_batches: 16,
            retention: None,
            database: None,
        }
    }

    #[test]
    fn rows_round_trip_through_rolling_files() {
        let dir = tempfile::tempdir().unwrap();
        let log = DecisionLog::open(dir.path(), four_row_files());
        for id in 1..=10 {
            log.send(LogBatch {
                decisions: vec![decision(id)],
                outcomes: id
                    .is_multiple_of(3)
                    .then(|| OutcomeRow {
                        decision_id: id,
                        job_id: id.to_string(),
                        state: "COMPLETED".into(),
                        at_us: 5_000 + id as i64,
                        wait_s: 1.0,
                        run_s: Some(2.0),
                    })
                    .into_iter()
                    .collect(),
            });
        }
        let counts = log.finish();
        assert_eq!(counts.rows_written, 13);
        assert_eq!(counts.write_errors, 0);
        // 10 decisions in files of 4 → 3 files; 3 outcomes → 1 file.
        assert_eq!(counts.files_written, 4);
        let data = read_decision_log(dir.path()).unwrap();
        assert_eq!(data.files, 4);
        assert_eq!(data.decisions, (1..=10).map(decision).collect::<Vec<_>>());
        let joined = data.joined();
        assert_eq!(joined.iter().filter(|(_, o)| o.is_some()).count(), 3);
        assert!(
            joined
                .iter()
                .all(|(d, o)| o.is_none_or(|o| o.decision_id == d.decision_id))
        );
    }

    #[test]
    fn files_of_two_databases_are_not_joined_and_a_later_layout_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        // Database a wrote decisions 1–4 and their outcomes; then database b, beside it
        // and later, its own decisions 1–4.
        for (db, later) in [(0xa_u64, 0), (0xb, 1_000_000)] {
            let log = DecisionLog::open(
                dir.path(),
                LogOptions {
                    database: Some(db),
                    ..four_row_files()
                },
            );
            for id in 1..=4 {
                log.send(LogBatch {
                    decisions: vec![DecisionRow {
                        at_us: decision(id).at_us + later,
                        job_name: format!("of {db:x}"),
                        ..decision(id)
                    }],
                    outcomes: vec![OutcomeRow {
                        decision_id: id,
                        job_id: id.to_string(),
                        state: "COMPLETED".into(),
                        at_us: 5_000 + later + id as i64,
                        wait_s: 1.0,
                        run_s: Some(2.0),
                    }],
                });
            }
            assert_eq!(log.finish().write_errors, 0);
        }
        // A file from before files named their database, and one of a later layout.
        let decisions = dir.path().join(DECISIONS_DIR);
        let legacy = decisions_batch(&[decision(50)]).unwrap();
        write_file(&decisions, "legacy.parquet", &legacy, None).unwrap();
        let props = WriterProperties::builder()
            .set_key_value_metadata(Some(vec![KeyValue::new(
                VERSION_KEY.to_string(),
                "2".to_string(),
            )]))
            .build();
        let newer = File::create(decisions.join("newer.parquet")).unwrap();
        let mut w = ArrowWriter::try_new(newer, legacy.schema(), Some(props)).unwrap();
        w.write(&legacy).unwrap();
        w.close().unwrap();

        let data = read_decision_log(dir.path()).unwrap();
        assert_eq!(data.database, Some(0xb));
        let ids: Vec<u64> = data.decisions.iter().map(|d| d.decision_id).collect();
        assert_eq!(ids, [1, 2, 3, 4]);
        assert!(data.decisions.iter().all(|d| d.job_name == "of b"));
        assert_eq!(data.outcomes.len(), 4);
        assert!(data.outcomes.iter().all(|o| o.at_us > 1_000_000));
        let skipped = data.skipped.join("\n");
        assert_eq!(data.skipped.len(), 4, "{skipped}");
        assert!(
            skipped.contains("legacy.parquet: names no database"),
            "{skipped}"
        );
        assert_eq!(
            skipped.matches("from database 000000000000000a").count(),
            2,
            "{skipped}"
        );
        assert!(
            skipped
                .contains("newer.parquet: decision log version \"2\", written by a newer Marshal"),
            "{skipped}"
        );
        // Each of b's decisions meets b's outcome, never a's.
        for (d, o) in data.joined() {
            if d.decision_id <= 4 {
                assert!(o.unwrap().at_us > 1_000_000);
            }
        }
    }

    /// A database upgraded to files that name it keeps the files it wrote before.
    #[test]
    fn files_naming_no_database_are_read_beside_one_named_database() {
        let dir = tempfile::tempdir().unwrap();
        let decisions = dir.path().join(DECISIONS_DIR);
        let legacy = decisions_batch(&[decision(1)]).unwrap();
        write_file(&decisions, "legacy.parquet", &legacy, None).unwrap();
        let named = decisions_batch(&[decision(2)]).unwrap();
        write_file(&decisions, "named.parquet", &named, Some(7)).unwrap();
        let data = read_decision_log(dir.path()).unwrap();
        assert_eq!(data.database, Some(7));
        assert!(data.skipped.is_empty(), "{:?}", data.skipped);
        assert_eq!(data.decisions.len(), 2);
    }

    #[test]
    fn a_second_writer_with_the_same_ids_replaces_no_file() {
        let dir = tempfile::tempdir().unwrap();
        // Two runs that both number decisions from 1 (two servers on one directory, or
        // ids reused after a crash without durable commits).
        for _ in 0..2 {
            let log = DecisionLog::open(dir.path(), four_row_files());
            for id in 1..=4 {
                log.send(LogBatch {
                    decisions: vec![decision(id)],
                    outcomes: vec![],
                });
            }
            assert_eq!(log.finish().write_errors, 0);
        }
        let files = parquet_files(&dir.path().join(DECISIONS_DIR)).unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "part-00000000000000000001-000000-dup1.parquet",
                "part-00000000000000000001-000000.parquet"
            ]
        );
        assert_eq!(read_decision_log(dir.path()).unwrap().decisions.len(), 8);
    }

    #[test]
    fn a_damaged_file_is_skipped_by_name_and_costs_only_its_own_rows() {
        let dir = tempfile::tempdir().unwrap();
        let log = DecisionLog::open(dir.path(), four_row_files());
        for id in 1..=10 {
            log.send(LogBatch {
                decisions: vec![decision(id)],
                outcomes: vec![],
            });
        }
        log.finish();
        let files = parquet_files(&dir.path().join(DECISIONS_DIR)).unwrap();
        assert_eq!(files.len(), 3);
        // Cut the second file short, and drop in a Parquet file of another schema.
        let bytes = std::fs::read(&files[1]).unwrap();
        std::fs::write(&files[1], &bytes[..bytes.len() / 2]).unwrap();
        let batch = decisions_batch(&[decision(99)]).unwrap();
        write_file(
            &dir.path().join(OUTCOMES_DIR),
            "foreign.parquet",
            &batch,
            None,
        )
        .unwrap();

        let data = read_decision_log(dir.path()).unwrap();
        assert_eq!(data.files, 2);
        assert_eq!(data.skipped.len(), 2, "{:?}", data.skipped);
        assert!(data.skipped[0].contains(&files[1].display().to_string()));
        assert!(data.skipped[1].contains("foreign.parquet"));
        assert!(
            data.skipped[1].contains("column state missing"),
            "{:?}",
            data.skipped
        );
        let ids: Vec<u64> = data.decisions.iter().map(|d| d.decision_id).collect();
        assert_eq!(ids, [1, 2, 3, 4, 9, 10]);
        assert!(data.outcomes.is_empty());
    }

    /// `batch` with column `name` replaced by `column`, its field nullable (as another
    /// writer's schema may have it).
    fn with_column(batch: &RecordBatch, name: &str, column: ArrayRef) -> RecordBatch {
        let schema = batch.schema();
        let i = schema.index_of(name).unwrap();
        let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields[i] = fields[i].clone().with_nullable(true);
        let mut columns = batch.columns().to_vec();
        columns[i] = column;
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
    }

    #[test]
    fn a_null_where_the_log_never_writes_one_skips_the_file_naming_the_row() {
        use arrow_array::builder::{Float32Builder, ListBuilder};
        use marshal_model::policy::{JOB_FEATURES, POLICY_SCHEMA_VERSION};
        let dir = tempfile::tempdir().unwrap();
        let (decisions, outcomes) = (
            dir.path().join(DECISIONS_DIR),
            dir.path().join(OUTCOMES_DIR),
        );
        write_file(
            &decisions,
            "part-good.parquet",
            &decisions_batch(&[decision(1), decision(2)]).unwrap(),
            None,
        )
        .unwrap();
        // Rows 10 and 11 carry features, row 12 (a heuristic's) none.
        let batch = decisions_batch(&[decision(10), decision(11), decision(12)]).unwrap();
        // A null inside a feature list (it would read as 0.0, a finite value).
        let mut job = ListBuilder::new(Float32Builder::new());
        job.values().append_slice(&[10.0; JOB_FEATURES - 1]);
        job.values().append_null();
        job.append(true);
        job.values().append_slice(&[11.0; JOB_FEATURES]);
        job.append(true);
        job.append_null();
        let damaged: [(&str, ArrayRef, &str); 5] = [
            (
                "workers",
                Arc::new(UInt32Array::from(vec![Some(1), None, Some(1)])),
                "row 1: column workers is null",
            ),
            (
                "job_id",
                strings([Some("10"), Some("11"), None].into_iter()),
                "row 2: column job_id is null",
            ),
            (
                "preemptible",
                Arc::new(BooleanArray::from(vec![None, Some(false), Some(false)])),
                "row 0: column preemptible is null",
            ),
            // Features half there: the version of row 11 is missing.
            (
                "features_version",
                Arc::new(UInt32Array::from(vec![
                    Some(POLICY_SCHEMA_VERSION),
                    None,
                    None,
                ])),
                "row 1: the feature columns are null in some and set in others",
            ),
            (
                "job_features",
                Arc::new(job.finish()),
                "row 0: column job_features holds a null value",
            ),
        ];
        for (name, column, _) in &damaged {
            let file = format!("part-{name}.parquet");
            write_file(
                &decisions,
                &file,
                &with_column(&batch, name, column.clone()),
                None,
            )
            .unwrap();
        }
        let outcome = |id: u64| OutcomeRow {
            decision_id: id,
            job_id: id.to_string(),
            state: "COMPLETED".into(),
            at_us: 5_000,
            wait_s: 1.0,
            run_s: None,
        };
        let batch = outcomes_batch(&[outcome(1), outcome(2)]).unwrap();
        let wait = Arc::new(Float64Array::from(vec![Some(1.0), None])) as ArrayRef;
        write_file(
            &outcomes,
            "part-wait_s.parquet",
            &with_column(&batch, "wait_s", wait),
            None,
        )
        .unwrap();

        let data = read_decision_log(dir.path()).unwrap();
        let ids: Vec<u64> = data.decisions.iter().map(|d| d.decision_id).collect();
        assert_eq!(ids, [1, 2], "only the good file's rows");
        assert!(data.outcomes.is_empty());
        assert_eq!(data.files, 1);
        assert_eq!(data.skipped.len(), damaged.len() + 1, "{:?}", data.skipped);
        let whys = damaged
            .iter()
            .map(|(name, _, why)| (format!("part-{name}.parquet"), *why))
            .chain([(
                "part-wait_s.parquet".to_string(),
                "row 1: column wait_s is null",
            )]);
        for (file, why) in whys {
            assert!(
                data.skipped
                    .iter()
                    .any(|s| s.contains(&file) && s.contains(why)),
                "{file}: {why}: {:?}",
                data.skipped
            );
        }
    }

    #[test]
    fn with_a_retention_the_writer_deletes_expired_files_at_start() {
        let tmp = tempfile::tempdir().unwrap();
        let day = Duration::from_secs(86_400);
        // A file from a run 40 days ago.
        let old = LogOptions {
            flush_ms: 1,
            ..four_row_files()
        };
        let log = DecisionLog::open(tmp.path(), old.clone());
        log.send(LogBatch {
            decisions: (1..=2).map(decision).collect(),
            outcomes: vec![],
        });
        assert_eq!(log.finish().files_written, 1);
        let first = parquet_files(&tmp.path().join(DECISIONS_DIR)).unwrap();
        assert_eq!(first.len(), 1);
        File::options()
            .write(true)
            .open(&first[0])
            .unwrap()
            .set_modified(std::time::SystemTime::now() - 40 * day)
            .unwrap();
        // Restarted with a 30-day retention: that file goes, today's stays.
        let log = DecisionLog::open(
            tmp.path(),
            LogOptions {
                retention: Some(30 * day),
                ..old
            },
        );
        log.send(LogBatch {
            decisions: (3..=4).map(decision).collect(),
            outcomes: vec![],
        });
        let counts = log.finish();
        assert_eq!((counts.files_pruned, counts.files_written), (1, 1));
        let data = read_decision_log(tmp.path()).unwrap();
        let ids: Vec<u64> = data.decisions.iter().map(|d| d.decision_id).collect();
        assert_eq!(ids, [3, 4]);
    }

    #[test]
    fn an_unwritable_directory_counts_errors_and_does_not_block() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, b"x").unwrap();
        let log = DecisionLog::open(&file.join("log"), LogOptions::default());
        log.send(LogBatch {
            decisions: vec![decision(1)],
            outcomes: vec![],
        });
        let counts = log.finish();
        assert_eq!(counts.rows_written, 0);
        assert_eq!(counts.write_errors, 1);
        assert_eq!(counts.rows_lost, 1);
    }
}
