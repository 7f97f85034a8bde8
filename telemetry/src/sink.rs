//! The Parquet sink: a writer thread that turns rows into partitioned, rolling files.
//!
//! ```text
//! producer ──send()/try_send()──▶ queue of ≤ capacity messages ──▶ writer thread
//!                                                              │ route rows to partitions
//!                                                              │ validate, append to per-GPU columns
//!                                                              │ ≤ row_group_rows → one row group
//!                                                              ▼
//!                       <root>/kind=gpu/date=YYYY-MM-DD/node=<node>/part-NNNNNN.parquet
//! ```
//!
//! Design decisions:
//!
//! * **One writer thread, no async runtime.** Encoding and compression are CPU work; the
//!   thread owns every open file, so no locks are held while encoding.
//! * **Bounded memory, backpressure.** The queue holds at most `channel_capacity`
//!   batches: [`TelemetrySink::send`] blocks when it is full, [`TelemetrySink::try_send`]
//!   hands the rows back ([`TrySendError::Full`]) so a sampler can drop or coalesce.
//!   A blocked producer is woken when the queue has drained to half, not per message
//!   ([`crate::backpressure`]), so a writer that is behind does not also pay a wake-up
//!   for every message it takes.
//!   Rows buffered for row groups (about 150 bytes each: a GPU row is packed into 136
//!   bytes plus its per-link counters) are capped by `max_buffered_rows` (the fullest
//!   buffer is written out early) and open files by `max_open_files` (the least recently
//!   used file is finished). Rows handed to the sink are validated and dropped on
//!   arrival; only their packed or columnar form is kept.
//! * **Two intakes, one validation.** GPU rows come as `Vec<GpuSample>` or as a
//!   [`GpuBatch`] (interned strings, no per-row `Arc<str>` to drop); both are validated
//!   and appended by the same function, so they produce the same files and counts.
//! * **Row groups are sorted.** Rows are appended, as they arrive, to Arrow column
//!   builders kept per GPU, so each row group is written in the kind's file order (GPU then
//!   time for GPU samples) without sorting; consecutive values of one GPU's series then
//!   delta-encode to a few bits. Row groups declare the order in their `sorting_columns`
//!   metadata. (Rows arriving out of time order take a slower path that sorts.)
//! * **Rolling.** A file is finished when it reaches `max_file_bytes`, when its rows span
//!   `max_file_span` of *data* time, when it has been open `max_file_age` of *wall* time
//!   (so data becomes visible to readers within that delay), and at [`TelemetrySink::flush`]
//!   and shutdown. A file never spans two UTC days: the date is part of its partition.
//! * **Crash safety.** Files are written under hidden `.tmp` names and published by
//!   fsync + rename (see [`crate::writer`]). After a crash, only `.tmp` files can be
//!   incomplete, and readers ignore them.
//! * **A full disk loses no row the sink accepted.** When the file system refuses a write
//!   (no space, a quota, a directory that cannot be written), the refused bytes wait in
//!   memory in order (module `patient_file`), as do rows whose file cannot be created
//!   and finished files whose `fsync` or rename failed, and the sink retries with a
//!   backoff (50 ms doubling to 2 s); the first refusal of each episode is logged and
//!   kept in [`SinkStats::errors`], and [`SinkStats::stall`] says why it is waiting.
//!   Memory stays bounded: while stalled with `max_buffered_rows` rows buffered or
//!   `max_backlog_bytes` bytes waiting, the writer takes no new messages, so `send`
//!   blocks and `try_send` / `send_timeout` hand rows back (those rows were never
//!   accepted; the producer counts them). `flush` returns [`TelemetryError::SinkStalled`]
//!   rather than waiting for the disk. At shutdown the sink keeps trying for
//!   `shutdown_grace`, then gives up: the rows still unwritten are counted in
//!   [`SinkStats::rows_dropped`] with an error that says so. Only an encoding error
//!   (a bug, not the disk) discards a file's rows at once. A telemetry hiccup must not
//!   take an agent down.
//! * **Single writer per partition.** Sequence numbers are chosen by scanning the partition
//!   directory when it is first used; two sinks must not write the same node's partitions.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parquet::file::properties::WriterProperties;

use crate::backpressure::{Backpressure, Reserved, WriterSide};
use crate::batch::GpuBatch;
use crate::columns::{Columnar, GpuRef, RowGroupBuffer};
use crate::convert::{Record, Records};
use crate::error::{Result, TelemetryError};
use crate::partition::{Date, PART_PREFIX, Partition, part_name, seq_of};
use crate::schema::{GpuSample, META_PARTITION, NodeSample, StepProfile, TelemetryKind};
use crate::validate::ValidationReport;
use crate::writer::{AtomicParquetFile, CommitError, Unpublished, WriteOptions, writer_properties};

#[cfg(test)]
mod full_disk_tests;
mod stall;
mod sweep;
use stall::Stall;

/// Sink settings. [`SinkConfig::new`] gives defaults suited to a node agent.
#[derive(Debug, Clone, PartialEq)]
pub struct SinkConfig {
    /// Root directory of the telemetry tree.
    pub root: PathBuf,
    /// Parquet settings (compression level, row-group and page sizes).
    pub write: WriteOptions,
    /// A file is finished once it holds this many bytes. Default 128 MiB.
    pub max_file_bytes: u64,
    /// A file is finished before it would span more than this much data time. Default 1 h.
    pub max_file_span: Duration,
    /// A file is finished after it has been open this long (wall time). Default 5 min.
    pub max_file_age: Duration,
    /// Upper bound on rows buffered across all open files (about 150 bytes each in
    /// packed rows or column builders). Default 512 Ki rows.
    pub max_buffered_rows: usize,
    /// Upper bound on files open at once. Default 64.
    pub max_open_files: usize,
    /// Batches the queue holds before `send` blocks. Default 64.
    pub channel_capacity: usize,
    /// While the file system refuses writes, the encoded bytes kept in memory for it
    /// before the sink stops taking rows. Default 64 MiB (at a few bytes per row,
    /// millions of rows).
    pub max_backlog_bytes: usize,
    /// How long shutdown keeps retrying writes the file system refuses before it gives
    /// the rows up (counted and reported). Default 10 s.
    pub shutdown_grace: Duration,
    /// Delete the days of telemetry under `root` older than this ([`crate::retention`]):
    /// swept when the sink starts and hourly. Default `None`: keep everything.
    pub retention: Option<Duration>,
}

impl SinkConfig {
    /// Defaults for writing under `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            write: WriteOptions::default(),
            max_file_bytes: 128 << 20,
            max_file_span: Duration::from_secs(3600),
            max_file_age: Duration::from_secs(300),
            max_buffered_rows: 512 * 1024,
            max_open_files: 64,
            channel_capacity: 64,
            max_backlog_bytes: 64 << 20,
            shutdown_grace: Duration::from_secs(10),
            retention: None,
        }
    }

    fn check(&self) -> Result<()> {
        let bad = |m: &str| Err(TelemetryError::Config(format!("sink: {m}")));
        if self.max_file_span.is_zero() || self.max_file_age.is_zero() {
            return bad("max_file_span and max_file_age must be positive");
        }
        if self.max_buffered_rows == 0 || self.max_open_files == 0 {
            return bad("max_buffered_rows and max_open_files must be positive");
        }
        if self.channel_capacity == 0 || self.max_backlog_bytes == 0 {
            return bad("channel_capacity and max_backlog_bytes must be positive");
        }
        if self.retention.is_some_and(|r| r.is_zero()) {
            return bad("retention must be positive (absent: keep everything)");
        }
        Ok(())
    }
}

/// A file the sink has published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedFile {
    /// Final path.
    pub path: PathBuf,
    /// Rows in the file.
    pub rows: u64,
    /// Size on disk.
    pub bytes: u64,
}

/// What the sink has done so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SinkStats {
    /// Batches received by the writer thread.
    pub batches: u64,
    /// Rows received by the writer thread.
    pub rows_received: u64,
    /// Rows in published files.
    pub rows_written: u64,
    /// Rows lost: to an encoding error, or still unwritten when shutdown gave up on a
    /// file system that kept refusing them.
    pub rows_dropped: u64,
    /// Values nulled and rows rejected by validation.
    pub validation: ValidationReport,
    /// Files published.
    pub files_committed: u64,
    /// Bytes in published files.
    pub bytes_committed: u64,
    /// The most recently published files (at most [`SinkStats::MAX_LISTED`]).
    pub files: Vec<CommittedFile>,
    /// CPU time the writer thread has used (Linux: from `/proc/thread-self/schedstat`;
    /// zero elsewhere). Rows written per second of this time is the sink's cost per core.
    pub writer_cpu: Duration,
    /// Write errors seen.
    pub error_count: u64,
    /// The first write errors, as text (at most [`SinkStats::MAX_LISTED`]).
    pub errors: Vec<String>,
    /// While the file system refuses writes: its last refusal. `None` when writing.
    pub stall: Option<String>,
    /// Episodes of refused writes so far (each counted once in `error_count`).
    pub stalls: u64,
    /// Encoded bytes waiting in memory for the file system.
    pub backlog_bytes: u64,
    /// Data files deleted by retention ([`SinkConfig::retention`]).
    pub pruned_files: u64,
    /// Bytes in those files.
    pub pruned_bytes: u64,
}

impl SinkStats {
    /// Cap on the lengths of [`SinkStats::files`] and [`SinkStats::errors`].
    pub const MAX_LISTED: usize = 1024;
}

/// Why [`TelemetrySink::try_send`] did not take the rows; the rows come back.
#[derive(Debug)]
pub enum TrySendError {
    /// The queue is full: the writer thread is behind.
    Full(Records),
    /// The writer thread has stopped.
    Closed(Records),
}

impl std::fmt::Display for TrySendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TrySendError::Full(r) => {
                write!(f, "telemetry sink is full ({} rows not sent)", r.len())
            }
            TrySendError::Closed(r) => {
                write!(f, "telemetry sink is closed ({} rows not sent)", r.len())
            }
        }
    }
}

impl std::error::Error for TrySendError {}

enum Msg {
    Rows(Records),
    /// Answered with the rows still waiting for the file system, if any, and why.
    Flush(SyncSender<Option<(u64, String)>>),
}

/// Handle to the sink's writer thread. Dropping it finishes every open file (blocking).
#[derive(Debug)]
pub struct TelemetrySink {
    root: PathBuf,
    tx: Option<Sender<Msg>>,
    gate: Arc<Backpressure>,
    handle: Option<JoinHandle<()>>,
    stats: Arc<Mutex<SinkStats>>,
    /// Set by shutdown: a writer that stopped taking messages (stalled, memory full)
    /// takes them again, to finish.
    closing: Arc<AtomicBool>,
}

impl TelemetrySink {
    /// Starts the writer thread.
    pub fn open(config: SinkConfig) -> Result<Self> {
        Self::spawn(config, None)
    }

    /// `gate`: the writer thread waits for one message on it before it starts receiving
    /// (tests use it to hold the channel full).
    fn spawn(config: SinkConfig, gate: Option<Receiver<()>>) -> Result<Self> {
        config.check()?;
        std::fs::create_dir_all(&config.root)
            .map_err(|e| TelemetryError::io("creating directory", &config.root, e))?;
        let mut props = HashMap::new();
        for kind in TelemetryKind::ALL {
            let sort = match kind {
                TelemetryKind::Gpu => GpuSample::sort_columns(),
                TelemetryKind::Node => NodeSample::sort_columns(),
                TelemetryKind::Step => StepProfile::sort_columns(),
            };
            let p = writer_properties(kind, &kind.schema(), sort, &config.write, Vec::new())?;
            props.insert(kind, p);
        }
        let (tx, rx) = mpsc::channel();
        let backpressure = Backpressure::new(config.channel_capacity);
        let writer_side = WriterSide(backpressure.clone());
        let stats = Arc::new(Mutex::new(SinkStats::default()));
        let root = config.root.clone();
        let span_us = config.max_file_span.as_micros().min(i64::MAX as u128) as i64;
        let closing = Arc::new(AtomicBool::new(false));
        let worker = Worker {
            files: HashMap::default(),
            closing: closing.clone(),
            ctx: Ctx {
                cfg: config,
                props,
                next_seq: HashMap::new(),
                buffered: 0,
                tick: 0,
                span_us,
                stats: stats.clone(),
                stall: None,
                unpublished: Vec::new(),
            },
        };
        let handle = std::thread::Builder::new()
            .name("telemetry-sink".into())
            .spawn(move || {
                if let Some(gate) = gate {
                    let _ = gate.recv();
                }
                worker.run(rx, writer_side)
            })
            .map_err(|e| TelemetryError::io("spawning the writer thread for", &root, e))?;
        Ok(Self {
            root,
            tx: Some(tx),
            gate: backpressure,
            handle: Some(handle),
            stats,
            closing,
        })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn closed(&self, reason: &str) -> TelemetryError {
        TelemetryError::SinkClosed {
            root: self.root.clone(),
            reason: reason.into(),
        }
    }

    /// Queues rows, blocking while the queue is full.
    pub fn send(&self, rows: impl Into<Records>) -> Result<()> {
        let rows = rows.into();
        if rows.is_empty() {
            return Ok(());
        }
        self.queue(Msg::Rows(rows))
    }

    /// Queues a message, blocking while the queue is full.
    fn queue(&self, msg: Msg) -> Result<()> {
        let tx = self
            .tx
            .as_ref()
            .ok_or_else(|| self.closed("already finished"))?;
        if self.gate.reserve() == Reserved::Closed {
            return Err(self.closed("the writer thread has stopped"));
        }
        tx.send(msg).map_err(|_| {
            self.gate.release();
            self.closed("the writer thread has stopped")
        })
    }

    /// Queues rows without blocking; gives them back if the queue is full.
    pub fn try_send(&self, rows: impl Into<Records>) -> std::result::Result<(), TrySendError> {
        self.send_until(rows.into(), None)
    }

    /// Queues rows, waiting at most `timeout` while the queue is full; gives them back
    /// if it is still full then (a sampler that must keep its pace drops them and
    /// counts them: the sink never accepted them).
    pub fn send_timeout(
        &self,
        rows: impl Into<Records>,
        timeout: Duration,
    ) -> std::result::Result<(), TrySendError> {
        self.send_until(rows.into(), Some(Instant::now() + timeout))
    }

    fn send_until(
        &self,
        rows: Records,
        deadline: Option<Instant>,
    ) -> std::result::Result<(), TrySendError> {
        if rows.is_empty() {
            return Ok(());
        }
        let Some(tx) = self.tx.as_ref() else {
            return Err(TrySendError::Closed(rows));
        };
        let reserved = match deadline {
            None => self.gate.try_reserve(),
            Some(deadline) => self.gate.reserve_until(deadline),
        };
        match reserved {
            Reserved::Yes => {}
            Reserved::Full => return Err(TrySendError::Full(rows)),
            Reserved::Closed => return Err(TrySendError::Closed(rows)),
        }
        tx.send(Msg::Rows(rows)).map_err(|e| {
            self.gate.release();
            match e.0 {
                Msg::Rows(r) => TrySendError::Closed(r),
                Msg::Flush(_) => unreachable!("only rows are sent here"),
            }
        })
    }

    /// Finishes every open file (publishing what was sent before this call) and waits
    /// until that is done. The sink stays usable. While the file system refuses writes,
    /// this returns [`TelemetryError::SinkStalled`] (the rows wait in memory and are
    /// published once it takes them) instead of waiting for the disk.
    pub fn flush(&self) -> Result<()> {
        let (ack_tx, ack_rx) = mpsc::sync_channel(1);
        self.queue(Msg::Flush(ack_tx))?;
        match ack_rx.recv() {
            Ok(None) => Ok(()),
            Ok(Some((rows, reason))) => Err(TelemetryError::SinkStalled {
                root: self.root.clone(),
                rows,
                reason,
            }),
            Err(_) => Err(self.closed("the writer thread stopped during flush")),
        }
    }

    /// A snapshot of the statistics.
    pub fn stats(&self) -> SinkStats {
        lock(&self.stats).clone()
    }

    /// Finishes every open file, stops the writer thread and returns the final statistics.
    pub fn finish(mut self) -> Result<SinkStats> {
        self.shutdown()?;
        Ok(self.stats())
    }

    fn shutdown(&mut self) -> Result<()> {
        self.closing.store(true, Ordering::SeqCst);
        drop(self.tx.take());
        if let Some(h) = self.handle.take() {
            h.join()
                .map_err(|_| self.closed("the writer thread panicked"))?;
        }
        Ok(())
    }
}

impl Drop for TelemetrySink {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::error!("telemetry sink shutdown: {e}");
        }
    }
}

fn lock(m: &Mutex<SinkStats>) -> std::sync::MutexGuard<'_, SinkStats> {
    // Stats are plain counters: a panic while holding the lock cannot break them.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Rows waiting for the next row group of one file.
enum Buffer {
    Gpu(RowGroupBuffer<GpuSample>),
    Node(RowGroupBuffer<NodeSample>),
    Step(RowGroupBuffer<StepProfile>),
}

impl Buffer {
    fn len(&self) -> usize {
        match self {
            Buffer::Gpu(v) => v.len(),
            Buffer::Node(v) => v.len(),
            Buffer::Step(v) => v.len(),
        }
    }

    /// The buffered rows as batches in file order, leaving the buffer empty.
    fn take_batches(&mut self) -> Result<Vec<arrow_array::RecordBatch>> {
        match self {
            Buffer::Gpu(v) => v.take_batches(),
            Buffer::Node(v) => v.take_batches(),
            Buffer::Step(v) => v.take_batches(),
        }
    }

    /// Validation counts since the last call.
    fn take_report(&mut self) -> ValidationReport {
        match self {
            Buffer::Gpu(v) => v.take_report(),
            Buffer::Node(v) => v.take_report(),
            Buffer::Step(v) => v.take_report(),
        }
    }
}

/// Row types the sink buffers.
trait Buffered: Columnar {
    fn new_buffer() -> Buffer;
    fn vec(b: &mut Buffer) -> &mut RowGroupBuffer<Self>;
}

macro_rules! buffered {
    ($t:ty, $v:ident) => {
        impl Buffered for $t {
            fn new_buffer() -> Buffer {
                Buffer::$v(RowGroupBuffer::new())
            }
            fn vec(b: &mut Buffer) -> &mut RowGroupBuffer<Self> {
                match b {
                    Buffer::$v(v) => v,
                    _ => unreachable!("buffer kind is fixed by the partition key"),
                }
            }
        }
    };
}
buffered!(GpuSample, Gpu);
buffered!(NodeSample, Node);
buffered!(StepProfile, Step);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    kind: TelemetryKind,
    date: Date,
    node: Option<Arc<str>>,
}

/// State shared by all open files (kept apart from the file map for the borrow checker).
struct Ctx {
    cfg: SinkConfig,
    props: HashMap<TelemetryKind, WriterProperties>,
    next_seq: HashMap<PathBuf, u64>,
    /// Rows buffered over all open files.
    buffered: usize,
    /// Monotonic use counter for LRU.
    tick: u64,
    /// `cfg.max_file_span` in microseconds.
    span_us: i64,
    stats: Arc<Mutex<SinkStats>>,
    /// Set while the file system refuses writes ([`stall`]).
    stall: Option<Stall>,
    /// Finished files whose last bytes, `fsync` or rename the file system refused.
    unpublished: Vec<Unpublished>,
}

impl Ctx {
    fn error(&mut self, e: TelemetryError, rows_lost: u64) {
        tracing::error!("telemetry sink: {e} ({rows_lost} rows lost)");
        let mut s = lock(&self.stats);
        s.error_count += 1;
        s.rows_dropped += rows_lost;
        if s.errors.len() < SinkStats::MAX_LISTED {
            s.errors.push(e.to_string());
        }
    }

    /// Counts a published file.
    fn committed(&mut self, path: PathBuf, rows: u64) {
        let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let mut s = lock(&self.stats);
        s.rows_written += rows;
        s.files_committed += 1;
        s.bytes_committed += bytes;
        if s.files.len() >= SinkStats::MAX_LISTED {
            s.files.remove(0);
        }
        s.files.push(CommittedFile { path, rows, bytes });
    }

    /// The next unused sequence number in `dir`.
    fn next_seq(&mut self, dir: &Path) -> u64 {
        let next = self.next_seq.entry(dir.to_path_buf()).or_insert_with(|| {
            std::fs::read_dir(dir)
                .map(|rd| {
                    rd.filter_map(|e| e.ok())
                        .filter_map(|e| e.file_name().to_str().and_then(seq_of))
                        .max()
                        .unwrap_or(0)
                })
                .unwrap_or(0)
                + 1
        });
        let seq = *next;
        *next += 1;
        seq
    }
}

/// The file currently being written for one partition, and its row buffer.
struct OpenFile {
    partition: Partition,
    dir: PathBuf,
    buffer: Buffer,
    file: Option<AtomicParquetFile>,
    /// Earliest row time in the current file (written or buffered).
    first_ts: Option<i64>,
    /// When the current file received its first row.
    opened_at: Option<Instant>,
    last_used: u64,
    /// Its file could not be created: the retry ([`stall`]) tries again.
    blocked: bool,
}

impl OpenFile {
    fn push<R: Buffered>(&mut self, row: &R, ctx: &mut Ctx) {
        let ts = row.timestamp_us();
        self.push_with(ts, ctx, |b| R::vec(b).push(row));
    }

    /// A row of a [`GpuBatch`].
    #[inline]
    fn push_gpu(&mut self, row: &GpuRef<'_>, ctx: &mut Ctx) {
        self.push_with(row.timestamp_us, ctx, |b| {
            GpuSample::vec(b).push_with(
                u32::from(row.gpu_index),
                Some(row.timestamp_us),
                |cols, report| cols.push_ref(row, report),
            )
        });
    }

    /// Rolls the file if `ts` is past its span, then appends a row through `append`
    /// (which returns whether validation accepted it).
    #[inline]
    fn push_with(&mut self, ts: i64, ctx: &mut Ctx, append: impl FnOnce(&mut Buffer) -> bool) {
        if let Some(first) = self.first_ts
            && ts >= first.saturating_add(ctx.span_us)
        {
            self.close(ctx);
        }
        if !append(&mut self.buffer) {
            return; // rejected by validation (counted in the buffer's report)
        }
        self.first_ts = Some(self.first_ts.map_or(ts, |f| f.min(ts)));
        self.opened_at.get_or_insert_with(Instant::now);
        ctx.buffered += 1;
        if self.buffer.len() >= ctx.cfg.write.row_group_rows {
            self.write_row_group(ctx);
        }
    }

    fn is_empty(&self) -> bool {
        self.buffer.len() == 0 && self.file.is_none()
    }

    /// Encodes the buffer as one row group; finishes the file if it reached its size.
    fn write_row_group(&mut self, ctx: &mut Ctx) {
        let report = self.buffer.take_report();
        if !report.is_clean() || report.rows_in > 0 {
            lock(&ctx.stats).validation.merge(&report);
        }
        let n = self.buffer.len();
        if n == 0 {
            return;
        }
        // A partition whose file could not be created tries again only in the retry
        // (`stall`): its rows wait in the buffer.
        if self.file.is_none() && (self.blocked || !self.open_file(ctx)) {
            return;
        }
        ctx.buffered -= n;
        let file = self.file.as_mut().expect("opened above");
        let result = self.buffer.take_batches().and_then(|batches| {
            file.reserve(n);
            for batch in &batches {
                file.write(batch)?;
            }
            file.end_row_group()
        });
        if let Err(e) = result {
            // Not the disk (its refusals are kept, see `patient_file`): the encoder
            // failed, and the file cannot be trusted.
            let written = self.file.as_ref().map_or(0, |f| f.rows());
            if let Some(f) = self.file.take() {
                f.abort();
            }
            // Rows of this row group that reached the file are in `written`.
            ctx.error(e, (n as u64).max(written));
            self.reset();
            return;
        }
        if let Some(refused) = file.take_refusal() {
            ctx.refused(refused);
        }
        if self
            .file
            .as_ref()
            .is_some_and(|f| f.bytes() >= ctx.cfg.max_file_bytes)
        {
            self.close(ctx);
        }
    }

    /// Creates the partition's next file; on failure the stall is noted and the rows
    /// stay buffered.
    fn open_file(&mut self, ctx: &mut Ctx) -> bool {
        match self.create_file(ctx) {
            Ok(f) => {
                self.file = Some(f);
                true
            }
            Err(e) => {
                self.blocked = true;
                ctx.refused(e);
                false
            }
        }
    }

    fn create_file(&self, ctx: &mut Ctx) -> Result<AtomicParquetFile> {
        let kind = self.partition.kind;
        let props = ctx.props[&kind].clone();
        let mut last_err = None;
        // A name taken by someone else (another process, a leftover) is skipped.
        for _ in 0..16 {
            let name = part_name(PART_PREFIX, ctx.next_seq(&self.dir));
            if self.dir.join(&name).exists() {
                continue;
            }
            match AtomicParquetFile::create(&self.dir, &name, kind.schema(), props.clone()) {
                Ok(mut f) => {
                    f.add_metadata(
                        META_PARTITION,
                        self.partition.rel_dir().to_string_lossy().into_owned(),
                    );
                    return Ok(f);
                }
                Err(TelemetryError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::AlreadyExists =>
                {
                    last_err = Some(source);
                }
                Err(e) => return Err(e),
            }
        }
        Err(TelemetryError::io(
            "finding a free file name in",
            &self.dir,
            last_err.unwrap_or_else(|| std::io::Error::from(std::io::ErrorKind::AlreadyExists)),
        ))
    }

    /// Writes the buffer out and publishes the file. A file the file system refuses
    /// waits in [`Ctx::unpublished`]; rows that have no file yet (it cannot be created)
    /// stay buffered, and the partition stays open.
    fn close(&mut self, ctx: &mut Ctx) {
        self.write_row_group(ctx);
        if self.buffer.len() > 0 {
            return;
        }
        if let Some(file) = self.file.take() {
            let rows = file.rows();
            match file.commit_or_wait() {
                Ok(path) => ctx.committed(path, rows),
                Err(CommitError::Refused(file, e)) => {
                    ctx.unpublished.push(file);
                    ctx.refused(e);
                }
                Err(CommitError::Failed(e)) => ctx.error(e, rows),
            }
        }
        self.reset();
    }

    /// Rows accepted for this partition and not yet in a published file.
    fn rows_pending(&self) -> u64 {
        self.buffer.len() as u64 + self.file.as_ref().map_or(0, |f| f.rows())
    }

    fn reset(&mut self) {
        self.first_ts = None;
        self.opened_at = None;
    }
}

struct Worker {
    /// FxHash (`rustc-hash`): looked up once per run of rows of one partition, and the
    /// keys are this sink's own partitions, so SipHash's protection against chosen
    /// collisions buys nothing here and cost about 1 % of the writer's instructions per
    /// row (callgrind, benchmark).
    files: HashMap<Key, OpenFile, rustc_hash::FxBuildHasher>,
    ctx: Ctx,
    closing: Arc<AtomicBool>,
}

impl Worker {
    fn run(mut self, rx: Receiver<Msg>, gate: WriterSide) {
        let cpu_at_start = thread_cpu_time();
        let tick =
            (self.ctx.cfg.max_file_age / 4).clamp(Duration::from_millis(1), Duration::from_secs(1));
        let mut next_age_check = Instant::now() + tick;
        let mut next_sweep = Instant::now();
        loop {
            // One clock read per message; file ages are checked at most once per tick.
            let now = Instant::now();
            if now >= next_age_check {
                self.close_old(now);
                next_age_check = now + tick;
            }
            if now >= next_sweep {
                self.sweep_expired();
                next_sweep = now + sweep::EVERY;
            }
            let mut wait = tick;
            self.retry_stalled(now, false);
            if let Some(next_try) = self.ctx.stall.as_ref().map(Stall::next_try) {
                wait = wait.min(next_try.saturating_duration_since(now));
                if self.paused() {
                    // Taking more rows would outgrow the memory bounds: the queue
                    // fills and producers wait (or get their rows back).
                    std::thread::sleep(wait.max(Duration::from_millis(1)));
                    continue;
                }
            }
            let msg = rx.recv_timeout(wait);
            if msg.is_ok() {
                gate.0.taken();
            }
            match msg {
                Ok(Msg::Rows(rows)) => {
                    {
                        let mut s = lock(&self.ctx.stats);
                        s.batches += 1;
                        s.rows_received += rows.len() as u64;
                    }
                    match rows {
                        Records::Gpu(v) => self.route(v),
                        Records::GpuBatch(b) => self.route_batch(&b),
                        Records::Node(v) => self.route(v),
                        Records::Step(v) => self.route(v),
                    }
                    self.enforce_memory();
                }
                Ok(Msg::Flush(ack)) => {
                    self.retry_stalled(Instant::now(), true);
                    self.close_all();
                    let _ = ack.send(self.waiting());
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        self.close_all();
        self.finish_stalled();
        lock(&self.ctx.stats).writer_cpu = thread_cpu_time().saturating_sub(cpu_at_start);
    }

    /// Opens the partition's file if needed, marks it as just used and returns it (one
    /// hash lookup when the file is open and the open-file limit is not reached).
    fn touch<R: Buffered>(&mut self, key: Key) -> (&mut OpenFile, &mut Ctx) {
        if self.files.len() >= self.ctx.cfg.max_open_files && !self.files.contains_key(&key) {
            self.make_room();
        }
        let ctx = &mut self.ctx;
        ctx.tick += 1;
        let f = self.files.entry(key).or_insert_with_key(|key| {
            let partition = Partition {
                kind: key.kind,
                date: key.date,
                node: key.node.as_deref().map(str::to_string),
            };
            let dir = ctx.cfg.root.join(partition.rel_dir());
            OpenFile {
                partition,
                dir,
                buffer: R::new_buffer(),
                file: None,
                first_ts: None,
                opened_at: None,
                last_used: 0,
                blocked: false,
            }
        });
        f.last_used = ctx.tick;
        (f, ctx)
    }

    /// Routes a [`GpuBatch`]: runs of rows of one node and day go to that partition's
    /// file; no row is copied into a [`GpuSample`] and no reference count is touched
    /// per row.
    fn route_batch(&mut self, batch: &GpuBatch) {
        let rows = batch.rows();
        let mut i = 0;
        while i < rows.len() {
            let (node, date) = (rows[i].node, Date::of_us(rows[i].timestamp_us));
            let (lo, hi) = (date.start_us(), date.end_us());
            let mut j = i + 1;
            while j < rows.len() && rows[j].node == node && (lo..hi).contains(&rows[j].timestamp_us)
            {
                j += 1;
            }
            let key = Key {
                kind: TelemetryKind::Gpu,
                date,
                node: Some(batch.str(node).clone()),
            };
            let (f, ctx) = self.touch::<GpuSample>(key);
            for k in i..j {
                f.push_gpu(&batch.get(k), ctx);
            }
            i = j;
        }
    }

    fn route<R: Buffered>(&mut self, rows: Vec<R>) {
        // Split into runs of rows with the same partition (normally the whole batch).
        let mut runs: Vec<(Key, usize)> = Vec::new();
        for r in &rows {
            let date = Date::of_us(r.timestamp_us());
            match runs.last_mut() {
                Some((k, n))
                    if k.date == date
                        && match (&k.node, r.node()) {
                            (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
                            (None, None) => true,
                            _ => false,
                        } =>
                {
                    *n += 1
                }
                _ => runs.push((
                    Key {
                        kind: R::KIND,
                        date,
                        node: r.node().cloned(),
                    },
                    1,
                )),
            }
        }
        // Rows are read in place and dropped together after the message, not one by one
        // between pushes: 5 % more per-link rows per writer CPU-second on the sink bench
        // (README, "Telemetry").
        let mut start = 0;
        for (key, n) in runs {
            let (f, ctx) = self.touch::<R>(key);
            for row in &rows[start..start + n] {
                f.push(row, ctx);
            }
            start += n;
        }
        drop(rows);
    }

    /// Finishes the least recently used file while too many are open. A file whose
    /// rows cannot be written yet (the file system refuses) stays open, over the limit.
    fn make_room(&mut self) {
        while self.files.len() >= self.ctx.cfg.max_open_files {
            let Some((key, f)) = self.files.iter_mut().min_by_key(|(_, f)| f.last_used) else {
                return;
            };
            f.close(&mut self.ctx);
            if !f.is_empty() {
                return;
            }
            let key = key.clone();
            self.files.remove(&key);
        }
    }

    /// Writes out the fullest buffers while too many rows are buffered (while the file
    /// system refuses writes, buffers without a file stay: [`Worker::paused`]).
    fn enforce_memory(&mut self) {
        while self.ctx.buffered > self.ctx.cfg.max_buffered_rows {
            let Some(f) = self
                .files
                .values_mut()
                .max_by_key(|f| f.buffer.len())
                .filter(|f| f.buffer.len() > 0)
            else {
                return;
            };
            let before = self.ctx.buffered;
            f.write_row_group(&mut self.ctx);
            if self.ctx.buffered == before {
                return;
            }
        }
    }

    /// Finishes files open longer than `max_file_age`, and forgets idle partitions.
    fn close_old(&mut self, now: Instant) {
        let age = self.ctx.cfg.max_file_age;
        for f in self.files.values_mut() {
            if f.opened_at
                .is_some_and(|t| now.saturating_duration_since(t) >= age)
            {
                f.close(&mut self.ctx);
            }
        }
        self.files.retain(|_, f| !f.is_empty());
    }

    /// Closes every file; partitions whose rows cannot be written yet stay open.
    fn close_all(&mut self) {
        for f in self.files.values_mut() {
            f.close(&mut self.ctx);
        }
        self.files.retain(|_, f| !f.is_empty());
    }
}

/// CPU time of the calling thread (Linux; zero where unavailable).
fn thread_cpu_time() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map(Duration::from_nanos)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ts: i64) -> GpuSample {
        GpuSample {
            timestamp_us: ts,
            cluster: "c".into(),
            node: "n1".into(),
            gpu_uuid: "GPU-1".into(),
            gpu_type: "H100".into(),
            ..Default::default()
        }
    }

    #[test]
    fn try_send_reports_full_and_send_blocks_until_the_writer_drains() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = SinkConfig::new(dir.path());
        cfg.channel_capacity = 2;
        let (gate_tx, gate_rx) = mpsc::channel();
        let sink = Arc::new(TelemetrySink::spawn(cfg, Some(gate_rx)).unwrap());

        // The writer is held at the gate: the channel fills after two batches.
        sink.try_send(vec![sample(1)]).unwrap();
        sink.try_send(vec![sample(2)]).unwrap();
        match sink.try_send(vec![sample(3), sample(4)]) {
            Err(TrySendError::Full(Records::Gpu(rows))) => assert_eq!(rows.len(), 2),
            other => panic!("expected Full with the rows back, got {other:?}"),
        }

        // A blocking send waits…
        let done = Arc::new(AtomicBool::new(false));
        let t = {
            let (sink, done) = (sink.clone(), done.clone());
            std::thread::spawn(move || {
                sink.send(vec![sample(5)]).unwrap();
                done.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !done.load(Ordering::SeqCst),
            "send must block while the channel is full"
        );

        // …until the writer starts draining.
        gate_tx.send(()).unwrap();
        t.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
        let sink = Arc::try_unwrap(sink).expect("only handle left");
        let stats = sink.finish().unwrap();
        assert_eq!(stats.rows_received, 3);
        assert_eq!(stats.rows_written, 3);
    }

    #[test]
    fn config_is_checked() {
        let mut cfg = SinkConfig::new("/tmp/unused");
        cfg.channel_capacity = 0;
        assert!(matches!(
            TelemetrySink::open(cfg),
            Err(TelemetryError::Config(_))
        ));
        let mut cfg = SinkConfig::new("/tmp/unused");
        cfg.retention = Some(Duration::ZERO);
        assert!(matches!(
            TelemetrySink::open(cfg),
            Err(TelemetryError::Config(m)) if m.contains("retention")
        ));
    }
}
