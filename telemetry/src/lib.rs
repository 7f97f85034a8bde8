//! Marshal's telemetry: the sample schema, the Parquet sink and reader, and GPU sources.
//!
//! ```text
//!  NvmlSource / ReplaySource ──Source::sample(now)──▶ Vec<GpuSample>
//!                                                        │ TelemetrySink::send / try_send
//!                                                        ▼ (bounded channel, one writer thread)
//!  <root>/kind=gpu/date=YYYY-MM-DD/node=<node>/part-NNNNNN.parquet   (ZSTD, sorted, atomic)
//!                                                        │
//!            Scan / read_all (partition, statistics and row pruning) · summarize · compact
//! ```
//!
//! | module | concern |
//! |---|---|
//! | [`schema`] | the row types ([`GpuSample`], [`NodeSample`], [`StepProfile`]), their Arrow schemas, [`SCHEMA_VERSION`] |
//! | [`convert`] | rows ↔ record batches ([`Record`]) |
//! | [`batch`] | the cheap GPU intake: rows with interned strings ([`GpuBatch`], [`GpuBatchBuilder`]) |
//! | [`validate`] | what happens to NaN, ∞, negative and out-of-range values ([`ValidationReport`]) |
//! | [`partition`] | Hive-style paths (`kind=/date=/node=`), UTC dates, file names |
//! | [`writer`] | Parquet encodings per column, crash-safe file creation (refused writes wait in memory: `patient_file`) |
//! | [`sink`] | the writer thread: partitioning, rolling, backpressure ([`TelemetrySink`]) |
//! | [`reader`] | listing, pruning, filtering, streaming ([`Scan`], [`Query`]) |
//! | [`summary`] | footer-level and per-GPU summaries for `inspect` ([`summarize`]) |
//! | [`compact`] | merging a partition's small files ([`compact_partition`]) |
//! | [`retention`] | deleting the days older than a horizon ([`prune_before`]) |
//! | [`source`], [`nvml`], [`replay`] | where samples come from ([`Source`], [`NvmlSource`], [`ReplaySource`]); topology discovery ([`DiscoveredTopology`]) |
//!
//! Design decisions, in one place (each module says more):
//!
//! * **Nothing in telemetry can take its consumer down.** Broken values are nulled or
//!   their rows rejected, and counted ([`validate`]); damaged files are reported and
//!   skipped by every reader ([`ScanReport::errors`]); writes the file system refuses
//!   (a full disk) wait in memory and are retried, so no accepted row is lost, and are
//!   counted ([`SinkStats::errors`], [`SinkStats::stall`]); a machine without NVML gets
//!   [`TelemetryError::NvmlUnavailable`], not a crash.
//! * **A reader never sees half a file.** Files are written under hidden `.tmp` names and
//!   published by fsync + rename; `compact` keeps its inputs until the merged file is in
//!   place, and readers skip inputs a merged file lists.
//! * **Bounded memory.** The sink's channel, its row buffers and its open files are all
//!   capped; scans stream one batch at a time; replay holds one UTC day.
//! * **Small files on disk.** Rows are stored sorted by GPU then time; integers are delta
//!   encoded, floats byte-stream-split, strings plain (ZSTD folds the repeats), all ZSTD
//!   compressed.
//!   On the benchmark's realistic data (see `benches/sink.rs`) almost all of the bytes are
//!   the genuinely noisy series (NVLink counters, power, PCIe rates).
//! * **Every measured value is nullable**, because NVML refuses different queries on
//!   different devices; a refused query is a null, never a made-up zero.
//! * **No async runtime, no unsafe code.** One writer thread and `std::sync::mpsc`.
//! * **Plain data at the boundary.** [`DiscoveredTopology`] is a serde struct; the
//!   scheduler converts it into its own topology graph, so this crate does not depend on
//!   the scheduler.
mod backpressure;
pub mod batch;
mod bool_column;
mod chunk;
pub(crate) mod columns;
pub mod compact;
pub mod convert;
mod delta;
mod dict_column;
pub mod episodes;
pub mod error;
#[doc(hidden)]
pub mod faults;
mod int_column;
mod list_column;
pub mod mig;
pub mod nvml;
pub mod partition;
mod patient_file;
pub mod reader;
pub mod replay;
pub mod retention;
mod rle;
pub mod schema;
pub mod sink;
pub mod source;
mod split_column;
pub mod summary;
#[cfg(test)]
mod test_support;
pub mod validate;
pub mod writer;

pub use batch::{GpuBatch, GpuBatchBuilder, GpuRow, StrId};
pub use compact::{CompactOptions, CompactReport, compact_all, compact_partition};
pub use convert::{Record, Records};
pub use error::{Result, TelemetryError};
pub use mig::MigInstance;
pub use nvml::{DiscoveredTopology, GpuAnnotation, Level, NvmlConfig, NvmlSource};
pub use reader::{
    DataFile, FileError, Listing, Query, Rows, Scan, ScanReport, list_files, read_all,
};
pub use replay::ReplaySource;
pub use retention::{PruneReport, first_day_kept, prune_before};
pub use schema::{
    GpuSample, Health, MemPhase, NetPort, NodeSample, SCHEMA_VERSION, StepProfile, TelemetryKind,
};
pub use sink::{SinkConfig, SinkStats, TelemetrySink, TrySendError};
pub use source::Source;
pub use summary::{GpuSummary, KindSummary, Summary, summarize};
pub use validate::{Issue, ValidationReport};
pub use writer::WriteOptions;
