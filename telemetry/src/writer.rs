//! Parquet writer settings and crash-safe file creation, shared by the sink and `compact`.
//!
//! **Encodings.** Telemetry is a few long series per GPU, and files are sorted by GPU then
//! time, so the settings are chosen by column type (see [`writer_properties`]):
//!
//! * every integer column (timestamps, counters, memory, clocks, bitmasks, indices) is
//!   `DELTA_BINARY_PACKED` without a dictionary: counters and timestamps have small,
//!   regular deltas, and constant-ish values (memory per phase, clocks, ECC counts) have
//!   zero deltas, which pack to nothing. A dictionary would cost a hash per value and buy
//!   nothing over that. These columns are encoded by the private `int_column` module,
//!   not by parquet-rs (fewer than half of its instructions per value), and so are the
//!   per-link counters, lists of integers, by the private `list_column` module (levels
//!   generated from the list lengths, not item by item);
//! * floats and the noisy PCIe rates are `BYTE_STREAM_SPLIT` without a dictionary: the
//!   bytes of equal significance are stored together, so ZSTD finds the repeated
//!   sign/exponent and high bytes (NVML percentages and temperatures are integers, which
//!   leaves the low mantissa bytes zero). These columns are encoded by the private
//!   `split_column` module (a copy per value and one pass per page, where parquet-rs
//!   gathers, checks for NaN twice and scatters each value, with a ZSTD context per page);
//! * strings are `Dictionary(Int32, Utf8)` in Arrow and `RLE_DICTIONARY` in Parquet,
//!   encoded by the private `dict_column` module straight from the Arrow keys:
//!   parquet-rs would hash every value again (its dictionary encoder) or copy every string for ZSTD to fold
//!   (`PLAIN`, which this writer used before), either about a third of the writer's
//!   instructions per row for 8 string columns. Readers get the dictionary pages back;
//!   a string column that is not a dictionary (the node schema's port names) is `PLAIN`;
//! * pages are ZSTD compressed, level 1 by default (level 3 saved under 0.5 % on the
//!   benchmark data and cost ~10 % more CPU), data page format v2.
//!
//! **Statistics.** Numeric columns have row-group min/max statistics; the columns readers
//! filter on (timestamp, node, job, GPU index/uuid) also have page-level statistics (the
//! page index), which external engines (DataFusion, DuckDB, Spark) use to skip pages.
//! Strings nobody filters on (cluster, GPU type, health, worker, phase, placement) have
//! none: it saves a comparison per value.
//!
//! **Atomicity.** A file is written as `.<name>.tmp` in its final directory, then
//! flushed, `fsync`ed, renamed to `<name>`, and the directory is `fsync`ed. A reader (which
//! ignores hidden and `.tmp` names) sees either nothing or the complete file.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{DataType, SchemaRef};
use parquet::arrow::arrow_writer::{ArrowColumnWriter, ArrowRowGroupWriterFactory, compute_leaves};
use parquet::arrow::{ArrowSchemaConverter, add_encoded_arrow_schema_to_metadata};
use parquet::basic::{Compression, Encoding, Type as PhysicalType, ZstdLevel};
use parquet::file::metadata::{KeyValue, SortingColumn};
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::{ColumnDescPtr, ColumnPath};

use crate::bool_column::BoolColumn;
use crate::chunk::ColumnChunkEncoder;
use crate::dict_column::DictColumn;
use crate::error::{Result, TelemetryError};
use crate::faults::{self, FaultOp};
use crate::int_column::IntColumn;
use crate::list_column::ListColumn;
use crate::partition::tmp_name;
use crate::patient_file::PatientFile;
use crate::schema::{
    META_KIND, META_SCHEMA_VERSION, META_ZSTD_LEVEL, SCHEMA_VERSION, TelemetryKind, col,
};
use crate::split_column::SplitColumn;

/// Tunable Parquet settings.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteOptions {
    /// ZSTD level: 1 (fast) … 22 (small), or one of ZSTD's fast levels below 0 (faster
    /// still, larger files: on the sink benchmark −3 takes 6 % fewer writer instructions
    /// for 8–10 % more bytes, see the README). 0 is refused (ZSTD reads it as 3). Default 1.
    /// Our own column encoders take it as it is; parquet-rs's (booleans, the node
    /// schema's port lists) take at least 1, the least parquet-rs accepts.
    pub zstd_level: i32,
    /// Maximum rows per row group. Default 65 536.
    pub row_group_rows: usize,
    /// Maximum rows per data page. Default 20 000.
    pub data_page_rows: usize,
}

impl Default for WriteOptions {
    fn default() -> Self {
        Self {
            zstd_level: 1,
            row_group_rows: 64 * 1024,
            data_page_rows: 20_000,
        }
    }
}

/// Noisy integer rates: `BYTE_STREAM_SPLIT` like the floats rather than delta encoded
/// (the delta of noise is noisier than the noise).
const SPLIT_COLUMNS: &[&str] = &[
    col::PCIE_TX_KIB_PER_S,
    col::PCIE_RX_KIB_PER_S,
    col::POWER_MW,
];

/// String columns without statistics (never filtered on; saves a comparison per value).
const UNSTATISTICAL_COLUMNS: &[&str] = &[
    col::CLUSTER,
    col::GPU_TYPE,
    col::HEALTH,
    col::WORKER,
    col::MEM_PHASE,
    col::PHASE,
    col::PLACEMENT,
];

/// Columns readers filter on: page-level statistics (the page index).
const INDEXED_COLUMNS: &[&str] = &[
    col::TIMESTAMP,
    col::NODE,
    col::JOB_ID,
    col::GPU_INDEX,
    col::GPU_UUID,
];

/// The writer settings for `kind`, with `extra` key-value metadata.
pub fn writer_properties(
    kind: TelemetryKind,
    schema: &SchemaRef,
    sort_columns: &[&str],
    opts: &WriteOptions,
    extra: Vec<KeyValue>,
) -> Result<WriterProperties> {
    if opts.row_group_rows == 0 || opts.data_page_rows == 0 {
        return Err(TelemetryError::Config(
            "row_group_rows and data_page_rows must be positive".into(),
        ));
    }
    let levels = zstd::compression_level_range();
    if opts.zstd_level == 0 || !levels.contains(&opts.zstd_level) {
        return Err(TelemetryError::Config(format!(
            "zstd level {}: not in 1..={} or {}..=-1",
            opts.zstd_level,
            levels.end(),
            levels.start()
        )));
    }
    let level = ZstdLevel::try_new(opts.zstd_level.max(1))
        .map_err(|e| TelemetryError::Config(format!("zstd level {}: {e}", opts.zstd_level)))?;
    let descr = ArrowSchemaConverter::new()
        .convert(schema)
        .map_err(|e| TelemetryError::schema(format!("{kind} schema"), e.to_string()))?;

    let mut kv = vec![
        KeyValue::new(META_SCHEMA_VERSION.to_string(), SCHEMA_VERSION.to_string()),
        KeyValue::new(META_KIND.to_string(), kind.as_str().to_string()),
        KeyValue::new(META_ZSTD_LEVEL.to_string(), opts.zstd_level.to_string()),
    ];
    kv.extend(extra);

    let mut b = WriterProperties::builder()
        .set_writer_version(WriterVersion::PARQUET_2_0)
        .set_compression(Compression::ZSTD(level))
        .set_max_row_group_row_count(Some(opts.row_group_rows))
        .set_data_page_row_count_limit(opts.data_page_rows)
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_key_value_metadata(Some(kv))
        .set_created_by(format!("marshal-telemetry {}", env!("CARGO_PKG_VERSION")));

    let mut sorting = Vec::new();
    for (leaf, c) in descr.columns().iter().enumerate() {
        let path: ColumnPath = c.path().clone();
        let root = path.parts()[0].as_str();
        if INDEXED_COLUMNS.contains(&root) {
            b = b.set_column_statistics_enabled(path.clone(), EnabledStatistics::Page);
        } else if UNSTATISTICAL_COLUMNS.contains(&root) {
            b = b.set_column_statistics_enabled(path.clone(), EnabledStatistics::None);
        }
        match c.physical_type() {
            PhysicalType::INT32 | PhysicalType::INT64 if !SPLIT_COLUMNS.contains(&root) => {
                b = b
                    .set_column_dictionary_enabled(path.clone(), false)
                    .set_column_encoding(path.clone(), Encoding::DELTA_BINARY_PACKED);
            }
            PhysicalType::INT32
            | PhysicalType::INT64
            | PhysicalType::FLOAT
            | PhysicalType::DOUBLE => {
                b = b
                    .set_column_dictionary_enabled(path.clone(), false)
                    .set_column_encoding(path.clone(), Encoding::BYTE_STREAM_SPLIT);
            }
            PhysicalType::BYTE_ARRAY => {
                b = b
                    .set_column_dictionary_enabled(path.clone(), false)
                    .set_column_encoding(path.clone(), Encoding::PLAIN);
            }
            _ => {}
        }
        if let Some(pos) = sort_columns.iter().position(|s| *s == root) {
            sorting.push((
                pos,
                SortingColumn {
                    column_idx: leaf as i32,
                    descending: false,
                    nulls_first: false,
                },
            ));
        }
    }
    sorting.sort_by_key(|(pos, _)| *pos);
    if !sorting.is_empty() {
        b = b.set_sorting_columns(Some(sorting.into_iter().map(|(_, s)| s).collect()));
    }
    Ok(b.build())
}

/// Where a top-level field's Parquet leaves are encoded.
#[derive(Debug, Clone, Copy)]
enum FieldEncoder {
    /// parquet-rs's Arrow column writers, for the leaves `first..first + count`.
    Arrow { first: usize, count: usize },
    /// One of our own encoders (one leaf), by its index in `own_columns`.
    Own(usize),
}

/// A Parquet file being written under a temporary name, published by [`Self::commit`].
///
/// Dictionary string columns are encoded by [`DictColumn`] from their Arrow keys, delta
/// encoded integer columns by [`IntColumn`], byte-stream-split floats and rates by
/// [`SplitColumn`], lists of integers by [`ListColumn`], the rest (booleans, the node
/// schema's port structs and names) by parquet-rs's Arrow column writers; all chunks are
/// appended to the same row group in schema order (see the private `dict_column`,
/// `int_column`, `split_column` and `list_column` modules for why).
pub(crate) struct AtomicParquetFile {
    final_path: PathBuf,
    tmp_path: PathBuf,
    writer: SerializedFileWriter<BufWriter<PatientFile>>,
    schema: SchemaRef,
    factory: ArrowRowGroupWriterFactory,
    fields: Vec<FieldEncoder>,
    own_columns: Vec<Box<dyn ColumnChunkEncoder + Send>>,
    /// Column writers of the open row group, one per leaf (`None` for a leaf we encode
    /// ourselves); empty while no row group is open.
    arrow_columns: Vec<Option<ArrowColumnWriter>>,
    row_group_rows: usize,
    buffered_rows: usize,
    rows: u64,
}

impl std::fmt::Debug for AtomicParquetFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AtomicParquetFile")
            .field("final_path", &self.final_path)
            .field("rows", &self.rows)
            .finish()
    }
}

/// The encoder of ours that writes a (non-dictionary) leaf, if one does.
fn own_column(
    descr: ColumnDescPtr,
    data_type: &DataType,
    props: &WriterProperties,
) -> std::result::Result<Option<Box<dyn ColumnChunkEncoder + Send>>, String> {
    if let Some(column) = IntColumn::for_leaf(descr.clone(), data_type, props)? {
        return Ok(Some(Box::new(column)));
    }
    if let Some(column) = ListColumn::for_leaf(descr.clone(), data_type, props)? {
        return Ok(Some(Box::new(column)));
    }
    if let Some(column) = BoolColumn::for_leaf(descr.clone(), data_type, props)? {
        return Ok(Some(Box::new(column)));
    }
    Ok(SplitColumn::for_leaf(descr, data_type, props)?
        .map(|c| Box::new(c) as Box<dyn ColumnChunkEncoder + Send>))
}

/// `Dictionary(Int32, Utf8)`: the type [`DictColumn`] encodes.
fn is_dictionary_string(field: &arrow_schema::Field) -> bool {
    matches!(field.data_type(), DataType::Dictionary(k, v)
        if **k == DataType::Int32 && **v == DataType::Utf8)
}

impl AtomicParquetFile {
    /// Creates `dir/.<name>.tmp` (never overwriting an existing file).
    pub(crate) fn create(
        dir: &Path,
        name: &str,
        schema: SchemaRef,
        mut props: WriterProperties,
    ) -> Result<Self> {
        faults::check(dir, FaultOp::Create)
            .and_then(|()| std::fs::create_dir_all(dir))
            .map_err(|e| TelemetryError::io("creating directory", dir, e))?;
        let final_path = dir.join(name);
        let tmp_path = dir.join(tmp_name(name));
        let parquet_schema = ArrowSchemaConverter::new()
            .with_coerce_types(props.coerce_types())
            .convert(&schema)
            .map_err(|e| TelemetryError::parquet(&tmp_path, e))?;
        add_encoded_arrow_schema_to_metadata(&schema, &mut props);
        let row_group_rows = props.max_row_group_row_count().unwrap_or(usize::MAX).max(1);

        let mut fields = Vec::with_capacity(schema.fields().len());
        let mut own_columns: Vec<Box<dyn ColumnChunkEncoder + Send>> = Vec::new();
        let mut leaf = 0;
        let config = TelemetryError::Config;
        for (i, field) in schema.fields().iter().enumerate() {
            let count = (leaf..parquet_schema.num_columns())
                .take_while(|&l| parquet_schema.get_column_root_idx(l) == i)
                .count();
            let own: Option<Box<dyn ColumnChunkEncoder + Send>> = if count != 1 {
                None
            } else if is_dictionary_string(field) {
                let descr = parquet_schema.column(leaf);
                Some(Box::new(DictColumn::new(descr, &props).map_err(config)?))
            } else {
                let (descr, data_type) = (parquet_schema.column(leaf), field.data_type());
                own_column(descr, data_type, &props).map_err(config)?
            };
            match own {
                Some(column) => {
                    fields.push(FieldEncoder::Own(own_columns.len()));
                    own_columns.push(column);
                }
                None => fields.push(FieldEncoder::Arrow { first: leaf, count }),
            }
            leaf += count;
        }

        let file = faults::check(&tmp_path, FaultOp::Create)
            .and_then(|()| {
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&tmp_path)
            })
            .map_err(|e| TelemetryError::io("creating", &tmp_path, e))?;
        let file = PatientFile::new(file, tmp_path.clone());
        let writer = SerializedFileWriter::new(
            BufWriter::with_capacity(1 << 20, file),
            parquet_schema.root_schema_ptr(),
            Arc::new(props),
        )
        .map_err(|e| TelemetryError::parquet(&tmp_path, e))?;
        let factory = ArrowRowGroupWriterFactory::new(&writer, schema.clone());
        Ok(Self {
            final_path,
            tmp_path,
            writer,
            schema,
            factory,
            fields,
            own_columns,
            arrow_columns: Vec::new(),
            row_group_rows,
            buffered_rows: 0,
            rows: 0,
        })
    }

    /// Rows written so far.
    pub(crate) fn rows(&self) -> u64 {
        self.rows
    }

    /// Bytes written to disk plus bytes buffered in the open row group.
    pub(crate) fn bytes(&self) -> u64 {
        let arrow: usize = self
            .arrow_columns
            .iter()
            .flatten()
            .map(ArrowColumnWriter::get_estimated_total_bytes)
            .sum();
        let own: usize = self.own_columns.iter().map(|c| c.buffered_bytes()).sum();
        (self.writer.bytes_written() + arrow + own) as u64
    }

    /// Makes room for `rows` more rows in the open row group's self-encoded columns, so
    /// that several batches of one row group fill buffers allocated once.
    pub(crate) fn reserve(&mut self, rows: usize) {
        let rows = rows.min(self.row_group_rows - self.buffered_rows);
        self.own_columns.iter_mut().for_each(|c| c.reserve(rows));
    }

    /// Appends a batch (buffered into the current row group; a row group is closed when
    /// it reaches the properties' row limit). A batch of other types, or with nulls in a
    /// non-nullable column, is refused and leaves the file as it was; after any other
    /// error the file is to be aborted.
    pub(crate) fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let types_match = batch.num_columns() == self.schema.fields().len()
            && (batch.columns().iter())
                .zip(self.schema.fields())
                .all(|(c, f)| c.data_type() == f.data_type());
        if !types_match {
            return Err(TelemetryError::schema(
                self.tmp_path.display().to_string(),
                format!("batch schema {} differs from the file's", batch.schema()),
            ));
        }
        // Checked before any column takes the batch, so a refused batch leaves the file
        // as it was.
        if let Some(field) = (batch.columns().iter())
            .zip(self.schema.fields())
            .find_map(|(c, f)| (!f.is_nullable() && c.null_count() > 0).then_some(f))
        {
            return Err(TelemetryError::schema(
                self.tmp_path.display().to_string(),
                format!("nulls in the non-nullable column {}", field.name()),
            ));
        }
        let mut at = 0;
        while at < batch.num_rows() {
            let take = (self.row_group_rows - self.buffered_rows).min(batch.num_rows() - at);
            self.write_rows(&batch.slice(at, take))?;
            at += take;
            if self.buffered_rows >= self.row_group_rows {
                self.end_row_group()?;
            }
        }
        Ok(())
    }

    fn write_rows(&mut self, batch: &RecordBatch) -> Result<()> {
        if self.arrow_columns.is_empty() && self.all_own() {
            // parquet-rs's writers are made for every leaf at once, each with a ZSTD
            // compression and decompression context: not made when none would be used.
            self.arrow_columns = self.fields.iter().map(|_| None).collect();
        }
        if self.arrow_columns.is_empty() {
            let index = self.writer.flushed_row_groups().len();
            let mut writers = self
                .factory
                .create_column_writers(index)
                .map_err(|e| TelemetryError::parquet(&self.tmp_path, e))?;
            self.arrow_columns = writers.drain(..).map(Some).collect();
            // A self-encoded leaf's own writer is never used.
            let mut leaf = 0;
            for field in &self.fields {
                match *field {
                    FieldEncoder::Own(_) => {
                        self.arrow_columns[leaf] = None;
                        leaf += 1;
                    }
                    FieldEncoder::Arrow { count, .. } => leaf += count,
                }
            }
        }
        let tmp = &self.tmp_path;
        for ((encoder, field), column) in self
            .fields
            .iter()
            .zip(self.schema.fields())
            .zip(batch.columns())
        {
            match *encoder {
                FieldEncoder::Own(c) => self.own_columns[c]
                    .push(column.as_ref())
                    .map_err(|e| TelemetryError::schema(tmp.display().to_string(), e))?,
                FieldEncoder::Arrow { first, count } => {
                    let leaves = compute_leaves(field, column)
                        .map_err(|e| TelemetryError::parquet(tmp, e))?;
                    if leaves.len() != count {
                        return Err(TelemetryError::schema(
                            tmp.display().to_string(),
                            format!(
                                "field {}: {} leaves, expected {count}",
                                field.name(),
                                leaves.len()
                            ),
                        ));
                    }
                    for (leaf, writer) in leaves.iter().zip(&mut self.arrow_columns[first..]) {
                        if let Some(writer) = writer {
                            writer
                                .write(leaf)
                                .map_err(|e| TelemetryError::parquet(tmp, e))?;
                        }
                    }
                }
            }
        }
        self.buffered_rows += batch.num_rows();
        self.rows += batch.num_rows() as u64;
        Ok(())
    }

    /// Whether every leaf is self-encoded (then each field is one leaf).
    fn all_own(&self) -> bool {
        self.fields
            .iter()
            .all(|f| matches!(f, FieldEncoder::Own(_)))
    }

    /// Closes the current row group (nothing happens when no row is buffered).
    pub(crate) fn end_row_group(&mut self) -> Result<()> {
        if self.buffered_rows == 0 {
            return Ok(());
        }
        self.buffered_rows = 0;
        let writers = std::mem::take(&mut self.arrow_columns);
        self.close_row_group(writers)
            .map_err(|e| TelemetryError::parquet(&self.tmp_path, e))
    }

    fn close_row_group(
        &mut self,
        writers: Vec<Option<ArrowColumnWriter>>,
    ) -> parquet::errors::Result<()> {
        let mut row_group = self.writer.next_row_group()?;
        let mut writers = writers.into_iter();
        for field in &self.fields {
            match *field {
                FieldEncoder::Own(c) => {
                    writers.next();
                    let (bytes, close) = self.own_columns[c].finish()?;
                    row_group.append_column(&bytes, close)?;
                }
                FieldEncoder::Arrow { count, .. } => {
                    for writer in writers.by_ref().take(count).flatten() {
                        writer.close()?.append_to_row_group(&mut row_group)?;
                    }
                }
            }
        }
        row_group.close()?;
        Ok(())
    }

    /// Adds key-value metadata to the footer.
    pub(crate) fn add_metadata(&mut self, key: &str, value: String) {
        self.writer
            .append_key_value_metadata(KeyValue::new(key.to_string(), value));
    }

    /// Bytes written but refused by the file system, waiting in memory.
    pub(crate) fn backlog_bytes(&self) -> usize {
        self.writer.inner().get_ref().backlog_len()
    }

    /// Why the file system refused a write since the last call, if it did. The bytes
    /// wait in memory ([`crate::patient_file`]); [`AtomicParquetFile::retry`] writes them.
    pub(crate) fn take_refusal(&mut self) -> Option<TelemetryError> {
        let why = self.writer.inner_mut().get_mut().take_refusal()?;
        Some(TelemetryError::io("writing", &self.tmp_path, why))
    }

    /// Writes the bytes the file system refused before.
    pub(crate) fn retry(&mut self) -> Result<()> {
        let buf = self.writer.inner_mut();
        buf.flush()
            .and_then(|()| buf.get_mut().drain())
            .map_err(|e| TelemetryError::io("writing", &self.tmp_path, e))
    }

    /// Writes the footer, `fsync`s, and renames the file into place. Refuses to replace
    /// an existing file. A file the file system refuses is removed and the error
    /// returned; the sink, which must not lose its rows, uses
    /// [`AtomicParquetFile::commit_or_wait`].
    pub(crate) fn commit(self) -> Result<PathBuf> {
        match self.commit_or_wait() {
            Ok(path) => Ok(path),
            Err(CommitError::Failed(e)) => Err(e),
            Err(CommitError::Refused(file, e)) => {
                file.abandon();
                Err(e)
            }
        }
    }

    /// [`AtomicParquetFile::commit`], except that when the file system refuses a step
    /// (the last bytes, the `fsync`, the rename), the finished file comes back, with
    /// every byte it holds, for [`Unpublished::publish`] to try again.
    pub(crate) fn commit_or_wait(mut self) -> std::result::Result<PathBuf, CommitError> {
        let finished = self.end_row_group().and_then(|()| {
            self.writer
                .finish()
                .map(drop)
                .map_err(|e| TelemetryError::parquet(&self.tmp_path, e))
        });
        if let Err(e) = finished {
            let _ = std::fs::remove_file(&self.tmp_path);
            return Err(CommitError::Failed(e));
        }
        Unpublished(Box::new(Finished {
            writer: self.writer,
            tmp_path: self.tmp_path,
            final_path: self.final_path,
            rows: self.rows,
            renamed: false,
        }))
        .publish()
    }

    /// Discards the file.
    pub(crate) fn abort(self) {
        let tmp = self.tmp_path.clone();
        drop(self);
        let _ = std::fs::remove_file(tmp);
    }
}

/// Why [`AtomicParquetFile::commit_or_wait`] did not publish the file.
#[derive(Debug)]
pub(crate) enum CommitError {
    /// The file system refused a step; the file waits to be published.
    Refused(Unpublished, TelemetryError),
    /// The file could not be finished (or its name is taken): it was removed.
    Failed(TelemetryError),
}

/// A finished file that is not in place yet: the file system refused its last bytes,
/// its `fsync`, its rename or the directory's `fsync`.
// Boxed: the writer is large, and the value travels in `CommitError`.
pub(crate) struct Unpublished(Box<Finished>);

struct Finished {
    writer: SerializedFileWriter<BufWriter<PatientFile>>,
    tmp_path: PathBuf,
    final_path: PathBuf,
    rows: u64,
    /// The rename is done; only the directory's `fsync` is left.
    renamed: bool,
}

impl std::fmt::Debug for Unpublished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unpublished")
            .field("final_path", &self.0.final_path)
            .field("rows", &self.0.rows)
            .field("renamed", &self.0.renamed)
            .finish()
    }
}

impl Unpublished {
    /// Rows in the file.
    pub(crate) fn rows(&self) -> u64 {
        self.0.rows
    }

    /// The directory the file is published in.
    pub(crate) fn dir(&self) -> &Path {
        self.0.final_path.parent().unwrap_or(Path::new("."))
    }

    /// Bytes waiting in memory.
    pub(crate) fn backlog_bytes(&self) -> usize {
        self.0.writer.inner().get_ref().backlog_len()
    }

    /// Takes the remaining steps: the bytes, `fsync`, rename, the directory's `fsync`.
    pub(crate) fn publish(mut self) -> std::result::Result<PathBuf, CommitError> {
        if !self.0.renamed {
            let buf = self.0.writer.inner_mut();
            let written = buf.flush().and_then(|()| buf.get_mut().drain());
            if let Err(e) = written {
                let e = TelemetryError::io("writing", &self.0.tmp_path, e);
                return Err(CommitError::Refused(self, e));
            }
            if let Err(e) = buf.get_ref().sync() {
                let e = TelemetryError::io("syncing", &self.0.tmp_path, e);
                return Err(CommitError::Refused(self, e));
            }
            if self.0.final_path.exists() {
                let _ = std::fs::remove_file(&self.0.tmp_path);
                return Err(CommitError::Failed(TelemetryError::io(
                    "publishing (target exists)",
                    &self.0.final_path,
                    std::io::Error::from(std::io::ErrorKind::AlreadyExists),
                )));
            }
            let renamed = faults::check(&self.0.final_path, FaultOp::Rename)
                .and_then(|()| std::fs::rename(&self.0.tmp_path, &self.0.final_path));
            if let Err(e) = renamed {
                let e = TelemetryError::io("renaming into place", &self.0.final_path, e);
                return Err(CommitError::Refused(self, e));
            }
            self.0.renamed = true;
        }
        match sync_dir(self.0.final_path.parent().unwrap_or(Path::new("."))) {
            Ok(()) => Ok(self.0.final_path),
            Err(e) => Err(CommitError::Refused(self, e)),
        }
    }

    /// Gives up: removes the file if it is not in place yet. Returns its path if it is
    /// (renamed, only the directory's `fsync` failed: readers see it).
    pub(crate) fn abandon(self) -> Option<PathBuf> {
        if self.0.renamed {
            return Some(self.0.final_path);
        }
        let tmp = self.0.tmp_path.clone();
        drop(self);
        let _ = std::fs::remove_file(tmp);
        None
    }
}

/// `fsync`s a directory so a rename in it is durable. A file system that cannot sync a
/// directory at all (it answers "invalid argument" or "not supported": some network and
/// FUSE file systems) has nothing more to do; taking that for a refusal to retry
/// stalled the sink for good.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    match faults::check(dir, FaultOp::SyncDir)
        .and_then(|()| File::open(dir))
        .and_then(|d| d.sync_all())
    {
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::InvalidInput | std::io::ErrorKind::Unsupported
            ) =>
        {
            Ok(())
        }
        other => other.map_err(|e| TelemetryError::io("syncing directory", dir, e)),
    }
}
