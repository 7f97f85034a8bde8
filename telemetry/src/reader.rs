//! Reading a telemetry directory: listing, pruning, filtering and streaming.
//!
//! A [`Scan`] answers a [`Query`] (a kind, an optional time range, node and job sets, a
//! column projection) in three pruning steps, each counted in the [`ScanReport`]:
//!
//! 1. **partition paths** — files whose `date=` day lies outside the time range or whose
//!    `node=` is not wanted are never opened;
//! 2. **row-group statistics** — the footer's min/max of `timestamp`, `node` and `job_id`
//!    drop row groups (and whole files) that cannot match;
//! 3. **row filter** — the remaining row groups are decoded with a Parquet row filter that
//!    reads only the filter columns first and materialises the projection for the rows
//!    that match, so a scan returns exactly the matching rows.
//!
//! Batches are streamed one at a time (bounded memory). **Damaged files are not fatal:**
//! a file whose footer cannot be read, whose schema version is unknown, or whose pages
//! fail to decode is recorded in [`ScanReport::errors`] (path and reason) and skipped;
//! the scan continues with the next file. (Rows a file yielded before a decode error in a
//! later page have already been returned.)
//!
//! Listing ignores hidden and `.tmp` files (files still being written) and files that a
//! `compact-*` file of the same directory lists as merged (see [`crate::compact`]).

use std::collections::{BTreeSet, VecDeque};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, TimestampMicrosecondType};
use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch};
use arrow_schema::{ArrowError, DataType};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowPredicateFn, ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder, RowFilter,
};
use parquet::file::metadata::{ParquetMetaData, RowGroupMetaData};
use parquet::file::statistics::Statistics;

use crate::convert::Record;
use crate::error::{Result, TelemetryError};
use crate::partition::{COMPACT_PREFIX, PARQUET_SUFFIX, Partition, is_hidden_or_tmp};
use crate::schema::{
    META_COMPACTED_FROM, META_KIND, META_SCHEMA_VERSION, SCHEMA_VERSION, TelemetryKind, col,
    oldest_readable_version,
};

/// A damaged or unreadable file, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileError {
    /// The file.
    pub path: PathBuf,
    /// What went wrong.
    pub reason: String,
}

/// A data file found by [`list_files`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataFile {
    /// Full path.
    pub path: PathBuf,
    /// Partition parsed from the path; `None` for a file outside the layout.
    pub partition: Option<Partition>,
    /// Size in bytes.
    pub bytes: u64,
}

/// The result of listing a telemetry directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// Data files, sorted by path.
    pub files: Vec<DataFile>,
    /// Hidden / `.tmp` files that were skipped (files in progress or left by a crash).
    pub ignored: Vec<PathBuf>,
    /// Files skipped because a compacted file already contains their rows.
    pub superseded: Vec<PathBuf>,
    /// Directories or compacted files that could not be read.
    pub errors: Vec<FileError>,
}

/// Lists the Parquet files under `root`.
pub fn list_files(root: &Path) -> Result<Listing> {
    let mut listing = Listing::default();
    if !root.is_dir() {
        let (kind, what) = if root.exists() {
            (std::io::ErrorKind::NotADirectory, "not a directory")
        } else {
            (std::io::ErrorKind::NotFound, "no such directory")
        };
        return Err(TelemetryError::io(
            "listing",
            root,
            std::io::Error::new(kind, what),
        ));
    }
    walk(root, root, &mut listing);
    listing.files.sort_by(|a, b| a.path.cmp(&b.path));
    listing.ignored.sort();
    listing.superseded.sort();
    Ok(listing)
}

fn walk(root: &Path, dir: &Path, out: &mut Listing) {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) => {
            out.errors.push(FileError {
                path: dir.to_path_buf(),
                reason: format!("cannot list directory: {e}"),
            });
            return;
        }
    };
    let mut here = Vec::new();
    for entry in rd.flatten() {
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let Ok(ft) = entry.file_type() else { continue };
        if ft.is_dir() {
            if !name.starts_with('.') {
                walk(root, &path, out);
            }
        } else if name.ends_with(PARQUET_SUFFIX) || is_hidden_or_tmp(&name) {
            if is_hidden_or_tmp(&name) {
                out.ignored.push(path);
            } else {
                let bytes = entry.metadata().map(|m| m.len()).unwrap_or(0);
                here.push((name, path, bytes));
            }
        }
    }
    // Files merged into a compacted file of this directory are superseded by it.
    let mut superseded = BTreeSet::new();
    for (name, path, _) in &here {
        if name.starts_with(COMPACT_PREFIX) {
            match read_metadata(path) {
                Ok(md) => {
                    if let Some(list) = kv(&md, META_COMPACTED_FROM) {
                        superseded.extend(list.split(',').map(str::to_string));
                    }
                }
                Err(e) => out.errors.push(FileError {
                    path: path.clone(),
                    reason: e.to_string(),
                }),
            }
        }
    }
    let partition = dir
        .strip_prefix(root)
        .ok()
        .and_then(|rel| Partition::parse(rel).map(|(p, _)| p));
    for (name, path, bytes) in here {
        if superseded.contains(&name) {
            out.superseded.push(path);
        } else {
            out.files.push(DataFile {
                path,
                partition: partition.clone(),
                bytes,
            });
        }
    }
}

pub fn read_metadata(path: &Path) -> Result<Arc<ParquetMetaData>> {
    let file = File::open(path).map_err(|e| TelemetryError::io("opening", path, e))?;
    let md = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new())
        .map_err(|e| TelemetryError::parquet(path, e))?;
    Ok(md.metadata().clone())
}

pub fn kv<'a>(md: &'a ParquetMetaData, key: &str) -> Option<&'a str> {
    md.file_metadata()
        .key_value_metadata()?
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_deref())
}

/// Checks a file's schema version and kind; returns its kind.
///
/// `gpu` files of schema version 1 (NVLink and PCIe in bytes, power as `f32` watts) are
/// refused with a versioned error rather than converted: see [`crate::schema`].
pub(crate) fn check_file(path: &Path, md: &ParquetMetaData) -> Result<TelemetryKind> {
    let version = kv(md, META_SCHEMA_VERSION);
    let kind = kv(md, META_KIND).and_then(TelemetryKind::parse);
    let oldest = kind.map_or(1, oldest_readable_version);
    match version.and_then(|v| v.parse::<u32>().ok()) {
        Some(v) if (oldest..=SCHEMA_VERSION).contains(&v) => {}
        found => {
            return Err(TelemetryError::SchemaVersion {
                path: path.to_path_buf(),
                found: version.map(str::to_string),
                kind: kind.map_or_else(|| "?".to_string(), |k| k.to_string()),
                oldest,
                supported: SCHEMA_VERSION,
                note: match found {
                    Some(v) if v < oldest => {
                        "; gpu schema 1 stored NVLink and PCIe in bytes and power in watts, \
                         version 2 stores KiB and milliwatts: re-record the data"
                    }
                    _ => "",
                },
            });
        }
    }
    kind.ok_or_else(|| {
        TelemetryError::schema(
            path.display().to_string(),
            format!("missing or unknown {META_KIND} metadata"),
        )
    })
}

/// What to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// Which kind of rows.
    pub kind: TelemetryKind,
    /// Earliest timestamp (inclusive), µs.
    pub start_us: Option<i64>,
    /// Latest timestamp (exclusive), µs.
    pub end_us: Option<i64>,
    /// Only these nodes (GPU and node kinds).
    pub nodes: Option<BTreeSet<String>>,
    /// Only these jobs (GPU and step kinds).
    pub jobs: Option<BTreeSet<String>>,
    /// Only these columns, in schema order (all when `None`).
    pub columns: Option<Vec<String>>,
    /// Rows per returned batch.
    pub batch_size: usize,
}

impl Query {
    /// Everything of one kind.
    pub fn new(kind: TelemetryKind) -> Self {
        Self {
            kind,
            start_us: None,
            end_us: None,
            nodes: None,
            jobs: None,
            columns: None,
            batch_size: 8192,
        }
    }

    /// Restricts to `start_us <= timestamp < end_us`.
    pub fn time_range(mut self, start_us: i64, end_us: i64) -> Self {
        self.start_us = Some(start_us);
        self.end_us = Some(end_us);
        self
    }

    /// Restricts to the given nodes.
    pub fn nodes<S: Into<String>>(mut self, nodes: impl IntoIterator<Item = S>) -> Self {
        self.nodes = Some(nodes.into_iter().map(Into::into).collect());
        self
    }

    /// Restricts to the given jobs.
    pub fn jobs<S: Into<String>>(mut self, jobs: impl IntoIterator<Item = S>) -> Self {
        self.jobs = Some(jobs.into_iter().map(Into::into).collect());
        self
    }

    /// Reads only these columns.
    pub fn columns<S: Into<String>>(mut self, columns: impl IntoIterator<Item = S>) -> Self {
        self.columns = Some(columns.into_iter().map(Into::into).collect());
        self
    }

    /// Sets the batch size.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    fn validate(&self) -> Result<()> {
        let schema = self.kind.schema();
        let has = |c: &str| schema.field_with_name(c).is_ok();
        if self.nodes.is_some() && !has(col::NODE) {
            return Err(TelemetryError::InvalidQuery(format!(
                "{} rows have no node column",
                self.kind
            )));
        }
        if self.jobs.is_some() && !has(col::JOB_ID) {
            return Err(TelemetryError::InvalidQuery(format!(
                "{} rows have no job_id column",
                self.kind
            )));
        }
        if let Some(cols) = &self.columns
            && let Some(bad) = cols.iter().find(|c| !has(c))
        {
            return Err(TelemetryError::InvalidQuery(format!(
                "{} rows have no column {bad:?}",
                self.kind
            )));
        }
        if let (Some(s), Some(e)) = (self.start_us, self.end_us)
            && s > e
        {
            return Err(TelemetryError::InvalidQuery(format!(
                "time range start {s} is after end {e}"
            )));
        }
        if self.batch_size == 0 {
            return Err(TelemetryError::InvalidQuery(
                "batch_size must be positive".into(),
            ));
        }
        Ok(())
    }

    fn in_time(&self, lo: i64, hi: i64) -> bool {
        // [lo, hi] intersects [start, end)
        self.start_us.is_none_or(|s| hi >= s) && self.end_us.is_none_or(|e| lo < e)
    }

    fn has_row_filter(&self) -> bool {
        self.start_us.is_some()
            || self.end_us.is_some()
            || self.nodes.is_some()
            || self.jobs.is_some()
    }
}

/// What a scan did: how much it pruned, read and returned, and which files it skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// Data files found under the root (all kinds).
    pub files_listed: usize,
    /// Files of other kinds.
    pub files_other_kind: usize,
    /// Files skipped on their partition path (date or node).
    pub files_pruned_by_partition: usize,
    /// Files opened whose every row group was pruned by statistics.
    pub files_pruned_by_stats: usize,
    /// Files whose rows were decoded.
    pub files_read: usize,
    /// Row groups in opened files.
    pub row_groups_total: usize,
    /// Row groups skipped on their statistics.
    pub row_groups_pruned: usize,
    /// Rows in the row groups that were decoded.
    pub rows_scanned: u64,
    /// Rows returned (after the row filter).
    pub rows_returned: u64,
    /// Hidden / `.tmp` files ignored.
    pub files_ignored: usize,
    /// Damaged or incompatible files that were skipped.
    pub errors: Vec<FileError>,
}

/// A streaming query over a telemetry directory. Iterating yields record batches; see
/// [`Scan::report`] for what was pruned and skipped.
pub struct Scan {
    query: Query,
    pending: VecDeque<DataFile>,
    current: Option<(PathBuf, ParquetRecordBatchReader)>,
    report: ScanReport,
}

impl std::fmt::Debug for Scan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scan")
            .field("query", &self.query)
            .field("pending", &self.pending.len())
            .field("current", &self.current.as_ref().map(|(p, _)| p))
            .field("report", &self.report)
            .finish()
    }
}

impl Scan {
    /// Lists `root` and prepares the scan (no file is opened yet).
    pub fn new(root: &Path, query: Query) -> Result<Self> {
        let listing = list_files(root)?;
        let mut scan = Self::from_files(listing.files, query)?;
        scan.report.files_ignored = listing.ignored.len();
        scan.report.errors.extend(listing.errors);
        Ok(scan)
    }

    /// Prepares a scan over the given files.
    pub fn from_files(files: Vec<DataFile>, query: Query) -> Result<Self> {
        query.validate()?;
        let mut report = ScanReport {
            files_listed: files.len(),
            ..Default::default()
        };
        let mut pending = VecDeque::new();
        for f in files {
            match &f.partition {
                Some(p) if p.kind != query.kind => report.files_other_kind += 1,
                Some(p)
                    if !query.in_time(p.date.start_us(), p.date.end_us() - 1)
                        || query.nodes.as_ref().is_some_and(|nodes| {
                            p.node.as_ref().is_some_and(|n| !nodes.contains(n))
                        }) =>
                {
                    report.files_pruned_by_partition += 1
                }
                _ => pending.push_back(f),
            }
        }
        Ok(Self {
            query,
            pending,
            current: None,
            report,
        })
    }

    /// The report so far (complete once the iterator is exhausted).
    pub fn report(&self) -> &ScanReport {
        &self.report
    }

    /// The file the last batch came from.
    pub fn current_file(&self) -> Option<&Path> {
        self.current.as_ref().map(|(p, _)| p.as_path())
    }

    /// Consumes the scan, returning its report.
    pub fn into_report(self) -> ScanReport {
        self.report
    }

    /// Converts the scan into typed rows. Fails if the query's kind is not `R`'s or a
    /// projection is set (typed rows need every column).
    pub fn rows<R: Record>(self) -> Result<Rows<R>> {
        if self.query.kind != R::KIND {
            return Err(TelemetryError::InvalidQuery(format!(
                "query reads {} rows, not {}",
                self.query.kind,
                R::KIND
            )));
        }
        if self.query.columns.is_some() {
            return Err(TelemetryError::InvalidQuery(
                "typed rows need all columns; remove the projection".into(),
            ));
        }
        Ok(Rows {
            scan: self,
            pending: Vec::new().into_iter(),
        })
    }

    fn fail(&mut self, path: PathBuf, reason: impl ToString) {
        self.report.errors.push(FileError {
            path,
            reason: reason.to_string(),
        });
    }

    /// Opens files until one has something to read.
    fn open_next(&mut self) -> bool {
        while let Some(f) = self.pending.pop_front() {
            match self.open(&f) {
                Ok(Some(reader)) => {
                    self.current = Some((f.path, reader));
                    return true;
                }
                Ok(None) => {}
                Err(e) => self.fail(f.path, e),
            }
        }
        false
    }

    fn open(&mut self, f: &DataFile) -> Result<Option<ParquetRecordBatchReader>> {
        let path = &f.path;
        let file = File::open(path).map_err(|e| TelemetryError::io("opening", path, e))?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(file)
            .map_err(|e| TelemetryError::parquet(path, e))?;
        let md = builder.metadata().clone();
        let kind = check_file(path, &md)?;
        if kind != self.query.kind {
            if f.partition.is_some() {
                return Err(TelemetryError::schema(
                    path.display().to_string(),
                    format!(
                        "file holds {kind} rows but lies in a {} partition",
                        self.query.kind
                    ),
                ));
            }
            self.report.files_other_kind += 1;
            return Ok(None);
        }
        let schema = builder.schema().clone();
        let descr = builder.parquet_schema();

        // Row groups that may match.
        let leaf_of = |name: &str| {
            descr
                .columns()
                .iter()
                .position(|c| c.path().parts().first().map(String::as_str) == Some(name))
        };
        let ts_leaf = leaf_of(col::TIMESTAMP);
        let node_leaf = leaf_of(col::NODE);
        let job_leaf = leaf_of(col::JOB_ID);
        let total = md.num_row_groups();
        let keep: Vec<usize> = (0..total)
            .filter(|&i| {
                let rg = md.row_group(i);
                self.rg_may_match(rg, ts_leaf, node_leaf, job_leaf)
            })
            .collect();
        self.report.row_groups_total += total;
        self.report.row_groups_pruned += total - keep.len();
        if keep.is_empty() {
            self.report.files_pruned_by_stats += 1;
            return Ok(None);
        }
        self.report.rows_scanned += keep
            .iter()
            .map(|&i| md.row_group(i).num_rows() as u64)
            .sum::<u64>();

        // Projection.
        let mask = match &self.query.columns {
            None => ProjectionMask::all(),
            Some(cols) => {
                let mut roots = Vec::new();
                for c in cols {
                    let idx = schema.index_of(c).map_err(|_| {
                        TelemetryError::schema(
                            path.display().to_string(),
                            format!("no column {c:?}"),
                        )
                    })?;
                    roots.push(idx);
                }
                roots.sort_unstable();
                roots.dedup();
                ProjectionMask::roots(descr, roots)
            }
        };

        let mut builder = builder
            .with_row_groups(keep)
            .with_projection(mask)
            .with_batch_size(self.query.batch_size);
        if self.query.has_row_filter() {
            let mut roots = Vec::new();
            for (name, wanted) in [
                (
                    col::TIMESTAMP,
                    self.query.start_us.is_some() || self.query.end_us.is_some(),
                ),
                (col::NODE, self.query.nodes.is_some()),
                (col::JOB_ID, self.query.jobs.is_some()),
            ] {
                if wanted {
                    roots.push(schema.index_of(name).map_err(|_| {
                        TelemetryError::schema(
                            path.display().to_string(),
                            format!("no column {name:?}"),
                        )
                    })?);
                }
            }
            roots.sort_unstable();
            let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
            let q = RowPredicate {
                start: self.query.start_us,
                end: self.query.end_us,
                nodes: self.query.nodes.clone(),
                jobs: self.query.jobs.clone(),
            };
            let pred = ArrowPredicateFn::new(mask, move |batch: RecordBatch| q.evaluate(&batch));
            builder = builder.with_row_filter(RowFilter::new(vec![Box::new(pred)]));
        }
        let reader = builder
            .build()
            .map_err(|e| TelemetryError::parquet(path, e))?;
        self.report.files_read += 1;
        Ok(Some(reader))
    }

    fn rg_may_match(
        &self,
        rg: &RowGroupMetaData,
        ts_leaf: Option<usize>,
        node_leaf: Option<usize>,
        job_leaf: Option<usize>,
    ) -> bool {
        let q = &self.query;
        if (q.start_us.is_some() || q.end_us.is_some())
            && let Some(Statistics::Int64(s)) = ts_leaf.and_then(|l| rg.column(l).statistics())
            && let (Some(lo), Some(hi)) = (s.min_opt(), s.max_opt())
            && !q.in_time(*lo, *hi)
        {
            return false;
        }
        for (wanted, leaf) in [(&q.nodes, node_leaf), (&q.jobs, job_leaf)] {
            let (Some(wanted), Some(leaf)) = (wanted, leaf) else {
                continue;
            };
            let Some(Statistics::ByteArray(s)) = rg.column(leaf).statistics() else {
                continue;
            };
            match (s.min_opt(), s.max_opt()) {
                (Some(lo), Some(hi)) => {
                    let (lo, hi) = (lo.data(), hi.data());
                    if !wanted
                        .iter()
                        .any(|w| lo <= w.as_bytes() && w.as_bytes() <= hi)
                    {
                        return false;
                    }
                }
                // No min/max: every value is null, which matches no wanted value.
                _ if s.null_count_opt() == Some(rg.num_rows() as u64) => return false,
                _ => {}
            }
        }
        true
    }

    /// The next batch and the file it came from.
    fn next_with_path(&mut self) -> Option<(PathBuf, RecordBatch)> {
        loop {
            if self.current.is_none() && !self.open_next() {
                return None;
            }
            let (path, reader) = self.current.as_mut().expect("opened above");
            match reader.next() {
                Some(Ok(batch)) if batch.num_rows() == 0 => {}
                Some(Ok(batch)) => {
                    self.report.rows_returned += batch.num_rows() as u64;
                    return Some((path.clone(), batch));
                }
                Some(Err(e)) => {
                    let path = path.clone();
                    self.current = None;
                    self.fail(path, format!("decoding failed: {e}"));
                }
                None => self.current = None,
            }
        }
    }
}

impl Iterator for Scan {
    type Item = RecordBatch;

    fn next(&mut self) -> Option<RecordBatch> {
        self.next_with_path().map(|(_, b)| b)
    }
}

/// The row filter of a scan.
struct RowPredicate {
    start: Option<i64>,
    end: Option<i64>,
    nodes: Option<BTreeSet<String>>,
    jobs: Option<BTreeSet<String>>,
}

impl RowPredicate {
    fn evaluate(&self, batch: &RecordBatch) -> std::result::Result<BooleanArray, ArrowError> {
        let n = batch.num_rows();
        let mut keep = vec![true; n];
        if self.start.is_some() || self.end.is_some() {
            let ts = batch
                .column_by_name(col::TIMESTAMP)
                .and_then(|c| c.as_primitive_opt::<TimestampMicrosecondType>())
                .ok_or_else(|| ArrowError::SchemaError("timestamp column missing".into()))?;
            let (s, e) = (self.start.unwrap_or(i64::MIN), self.end.unwrap_or(i64::MAX));
            for (k, t) in keep.iter_mut().zip(ts.values().iter()) {
                *k &= *t >= s && *t < e;
            }
        }
        for (name, set) in [(col::NODE, &self.nodes), (col::JOB_ID, &self.jobs)] {
            if let Some(set) = set {
                let c = batch
                    .column_by_name(name)
                    .ok_or_else(|| ArrowError::SchemaError(format!("{name} column missing")))?;
                string_in(c, set, &mut keep)?;
            }
        }
        Ok(BooleanArray::from(keep))
    }
}

/// `keep[i] &= column[i] ∈ set` (null never matches).
fn string_in(
    c: &ArrayRef,
    set: &BTreeSet<String>,
    keep: &mut [bool],
) -> std::result::Result<(), ArrowError> {
    match c.data_type() {
        DataType::Dictionary(k, v) if **k == DataType::Int32 && **v == DataType::Utf8 => {
            let dict = c.as_dictionary::<Int32Type>();
            let values = dict.values().as_string::<i32>();
            let hit: Vec<bool> = (0..values.len())
                .map(|i| !values.is_null(i) && set.contains(values.value(i)))
                .collect();
            let keys = dict.keys();
            for (i, k) in keep.iter_mut().enumerate() {
                *k &= !keys.is_null(i) && hit.get(keys.value(i) as usize).copied().unwrap_or(false);
            }
        }
        DataType::Utf8 => {
            let s = c.as_string::<i32>();
            for (i, k) in keep.iter_mut().enumerate() {
                *k &= !s.is_null(i) && set.contains(s.value(i));
            }
        }
        other => {
            return Err(ArrowError::SchemaError(format!(
                "cannot filter a {other} column by string"
            )));
        }
    }
    Ok(())
}

/// Typed rows from a [`Scan`]. Batches that do not convert mark their file as damaged.
#[derive(Debug)]
pub struct Rows<R> {
    scan: Scan,
    pending: std::vec::IntoIter<R>,
}

impl<R: Record> Rows<R> {
    /// The underlying scan's report.
    pub fn report(&self) -> &ScanReport {
        self.scan.report()
    }

    /// Consumes the iterator, returning the report.
    pub fn into_report(self) -> ScanReport {
        self.scan.into_report()
    }
}

impl<R: Record> Iterator for Rows<R> {
    type Item = R;

    fn next(&mut self) -> Option<R> {
        loop {
            if let Some(r) = self.pending.next() {
                return Some(r);
            }
            let (path, batch) = self.scan.next_with_path()?;
            match R::from_batch(&batch) {
                Ok(rows) => self.pending = rows.into_iter(),
                Err(e) => {
                    // The file does not hold what its metadata claims: skip the rest of it.
                    self.scan.current = None;
                    self.scan.fail(path, e);
                }
            }
        }
    }
}

/// Reads every row matching `query` into memory.
pub fn read_all<R: Record>(root: &Path, query: Query) -> Result<(Vec<R>, ScanReport)> {
    let mut rows = Scan::new(root, query)?.rows::<R>()?;
    let out: Vec<R> = rows.by_ref().collect();
    Ok((out, rows.into_report()))
}
