//! Merging the many small files of a partition into one.
//!
//! The sink rolls files often (every few minutes, so data becomes visible), which leaves
//! many small files per partition. [`compact_partition`] merges them:
//!
//! 1. the inputs are read row group by row group; rows are re-buffered into full row
//!    groups, each sorted in the kind's file order (GPU then time), so the merged file
//!    compresses at least as well as its inputs;
//! 2. the output, `compact-<seq>.parquet`, is written under a hidden `.tmp` name, synced
//!    and renamed into place like every other file; its footer lists the inputs under
//!    `marshal.telemetry.compacted_from`;
//! 3. the output's row count is checked against the inputs', and only then are the inputs
//!    deleted.
//!
//! Until step 3 completes the originals stay in place. If the process dies between the
//! rename and the deletions, readers already ignore the listed inputs (see
//! [`crate::reader::list_files`]), and the next compaction of the directory deletes them.
//! An input that cannot be read (truncated, garbage, wrong kind), or that the merge would
//! change (another tool's file with values the sink's validation nulls or rows it rejects,
//! such as a utilisation above 100 % or a repeated sample), is left alone, reported in
//! [`CompactReport::skipped`], and the merge is redone without it: compaction never
//! alters a value.
//!
//! Compact partitions that are no longer being written (earlier days): the sink numbers
//! its files by scanning the directory when it first writes there.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};

use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::columns::{Columnar, RowGroupBuffer};
use crate::convert::Record;
use crate::error::{Result, TelemetryError};
use crate::partition::{
    COMPACT_PREFIX, PARQUET_SUFFIX, Partition, is_hidden_or_tmp, part_name, seq_of,
};
use crate::reader::{FileError, check_file, kv, read_metadata};
use crate::schema::{
    GpuSample, META_COMPACTED_FROM, META_PARTITION, NodeSample, StepProfile, TelemetryKind,
};
use crate::writer::{AtomicParquetFile, WriteOptions, sync_dir, writer_properties};

/// Compaction settings.
#[derive(Debug, Clone, PartialEq)]
pub struct CompactOptions {
    /// Only compact a directory holding at least this many files (at least 2).
    pub min_files: usize,
    /// Parquet settings of the merged file.
    pub write: WriteOptions,
}

impl Default for CompactOptions {
    fn default() -> Self {
        Self {
            min_files: 2,
            write: WriteOptions::default(),
        }
    }
}

/// What a compaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// The partition directory.
    pub dir: PathBuf,
    /// Files merged.
    pub inputs: Vec<PathBuf>,
    /// The merged file, if one was written.
    pub output: Option<PathBuf>,
    /// Rows in the merged file.
    pub rows: u64,
    /// Leftover inputs of an earlier, interrupted compaction that were deleted.
    pub recovered: Vec<PathBuf>,
    /// Files that could not be read and were left in place.
    pub skipped: Vec<FileError>,
}

enum Merge {
    Done(u64),
    BadInput(PathBuf, String),
}

/// Merges the data files directly in `dir`. See the [module docs](self).
pub fn compact_partition(dir: &Path, opts: &CompactOptions) -> Result<CompactReport> {
    let mut report = CompactReport {
        dir: dir.to_path_buf(),
        ..Default::default()
    };
    let mut names: BTreeSet<String> = BTreeSet::new();
    let rd = std::fs::read_dir(dir).map_err(|e| TelemetryError::io("listing", dir, e))?;
    for entry in rd.flatten() {
        if let Some(name) = entry.file_name().to_str()
            && name.ends_with(PARQUET_SUFFIX)
            && !is_hidden_or_tmp(name)
            && entry.file_type().is_ok_and(|t| t.is_file())
        {
            names.insert(name.to_string());
        }
    }

    // Finish an interrupted compaction: delete inputs a merged file already holds.
    let compacted: Vec<String> = names
        .iter()
        .filter(|n| n.starts_with(COMPACT_PREFIX))
        .cloned()
        .collect();
    for c in compacted {
        let path = dir.join(&c);
        match read_metadata(&path) {
            Ok(md) => {
                for input in kv(&md, META_COMPACTED_FROM).unwrap_or("").split(',') {
                    if !input.is_empty() && input != c && names.remove(input) {
                        let p = dir.join(input);
                        std::fs::remove_file(&p)
                            .map_err(|e| TelemetryError::io("removing", &p, e))?;
                        report.recovered.push(p);
                    }
                }
            }
            Err(e) => {
                names.remove(&c);
                report.skipped.push(FileError {
                    path,
                    reason: e.to_string(),
                });
            }
        }
    }
    if !report.recovered.is_empty() {
        sync_dir(dir)?;
    }

    let partition_kind = partition_of(dir).map(|p| p.kind);
    let mut inputs: Vec<String> = names.into_iter().collect();
    inputs.sort_by_key(|n| (seq_of(n).unwrap_or(u64::MAX), n.clone()));
    let min_files = opts.min_files.max(2);
    loop {
        if inputs.len() < min_files {
            return Ok(report);
        }
        // The kind is the partition's (`kind=` in its path), so that a stray file of
        // another kind is the one blamed whichever sorts first; outside a partition
        // layout, the first readable input's. Others must agree.
        let mut kind = None;
        for n in &inputs {
            let p = dir.join(n);
            match read_metadata(&p).and_then(|md| check_file(&p, &md)) {
                Ok(k) if partition_kind.is_none_or(|pk| pk == k) => {
                    kind = Some(k);
                    break;
                }
                Ok(k) => report.skipped.push(FileError {
                    path: p,
                    reason: format!(
                        "holds {k} rows, the partition holds {}",
                        partition_kind.expect("checked by the guard above")
                    ),
                }),
                Err(e) => report.skipped.push(FileError {
                    path: p,
                    reason: e.to_string(),
                }),
            }
        }
        let Some(kind) = kind else {
            return Ok(report);
        };
        let bad: BTreeSet<PathBuf> = report.skipped.iter().map(|e| e.path.clone()).collect();
        inputs.retain(|n| !bad.contains(&dir.join(n)));
        if inputs.len() < min_files {
            return Ok(report);
        }

        let seq = inputs.iter().filter_map(|n| seq_of(n)).max().unwrap_or(0) + 1;
        let existing_max = std::fs::read_dir(dir)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.file_name().to_str().and_then(seq_of))
                    .max()
                    .unwrap_or(0)
            })
            .unwrap_or(0);
        let name = part_name(COMPACT_PREFIX, seq.max(existing_max + 1));
        let sort = match kind {
            TelemetryKind::Gpu => GpuSample::sort_columns(),
            TelemetryKind::Node => NodeSample::sort_columns(),
            TelemetryKind::Step => StepProfile::sort_columns(),
        };
        let props = writer_properties(kind, &kind.schema(), sort, &opts.write, Vec::new())?;
        let mut out = AtomicParquetFile::create(dir, &name, kind.schema(), props)?;
        out.add_metadata(META_COMPACTED_FROM, inputs.join(","));
        if let Some(p) = partition_of(dir) {
            out.add_metadata(META_PARTITION, p.rel_dir().to_string_lossy().into_owned());
        }
        let paths: Vec<PathBuf> = inputs.iter().map(|n| dir.join(n)).collect();
        let rg = opts.write.row_group_rows;
        let merged = match kind {
            TelemetryKind::Gpu => merge::<GpuSample>(&paths, kind, &mut out, rg),
            TelemetryKind::Node => merge::<NodeSample>(&paths, kind, &mut out, rg),
            TelemetryKind::Step => merge::<StepProfile>(&paths, kind, &mut out, rg),
        };
        match merged {
            Err(e) => {
                out.abort();
                return Err(e);
            }
            Ok(Merge::BadInput(path, reason)) => {
                out.abort();
                report.skipped.push(FileError { path, reason });
                continue;
            }
            Ok(Merge::Done(rows)) => {
                let expected: u64 = paths
                    .iter()
                    .map(|p| read_metadata(p).map(|m| m.file_metadata().num_rows().max(0) as u64))
                    .sum::<Result<u64>>()?;
                if rows != expected {
                    out.abort();
                    return Err(TelemetryError::schema(
                        dir.display().to_string(),
                        format!("compaction merged {rows} rows but the inputs hold {expected}"),
                    ));
                }
                let output = out.commit()?;
                let written = read_metadata(&output)?.file_metadata().num_rows().max(0) as u64;
                if written != expected {
                    // Keep both: readers skip the inputs, so remove the bad output.
                    std::fs::remove_file(&output)
                        .map_err(|e| TelemetryError::io("removing", &output, e))?;
                    return Err(TelemetryError::schema(
                        output.display().to_string(),
                        format!("merged file holds {written} rows, expected {expected}"),
                    ));
                }
                for p in &paths {
                    std::fs::remove_file(p).map_err(|e| TelemetryError::io("removing", p, e))?;
                }
                sync_dir(dir)?;
                report.inputs = paths;
                report.output = Some(output);
                report.rows = rows;
                return Ok(report);
            }
        }
    }
}

/// The partition `dir` is, from its trailing `key=value` components.
fn partition_of(dir: &Path) -> Option<Partition> {
    let comps: Vec<&str> = dir
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .collect();
    let start = comps.iter().rposition(|c| !c.contains('='))? + 1;
    let rel: PathBuf = comps[start..].iter().collect();
    Partition::parse(&rel).map(|(p, _)| p)
}

fn merge<R: Columnar>(
    paths: &[PathBuf],
    kind: TelemetryKind,
    out: &mut AtomicParquetFile,
    rg_rows: usize,
) -> Result<Merge> {
    let mut buf: RowGroupBuffer<R> = RowGroupBuffer::new();
    let mut rows = 0u64;
    for p in paths {
        let bad = |reason: String| Ok(Merge::BadInput(p.clone(), reason));
        let file = match File::open(p) {
            Ok(f) => f,
            Err(e) => return bad(format!("cannot open: {e}")),
        };
        let builder = match ParquetRecordBatchReaderBuilder::try_new(file) {
            Ok(b) => b,
            Err(e) => return bad(e.to_string()),
        };
        match check_file(p, builder.metadata()) {
            Ok(k) if k == kind => {}
            Ok(k) => return bad(format!("holds {k} rows, the partition holds {kind}")),
            Err(e) => return bad(e.to_string()),
        }
        // The merged file has the kind's columns only: a column another tool added would
        // be lost with the input, so such a file is left alone.
        let schema = kind.schema();
        if let Some(extra) = builder
            .schema()
            .fields()
            .iter()
            .find(|f| schema.field_with_name(f.name()).is_err())
        {
            return bad(format!(
                "column {:?} is not in the {kind} schema; merging would drop it",
                extra.name()
            ));
        }
        let reader = match builder.with_batch_size(8192).build() {
            Ok(r) => r,
            Err(e) => return bad(e.to_string()),
        };
        for batch in reader {
            let batch = match batch {
                Ok(b) => b,
                Err(e) => return bad(format!("decoding failed: {e}")),
            };
            let decoded = match R::from_batch(&batch) {
                Ok(v) => v,
                Err(e) => return bad(e.to_string()),
            };
            for r in &decoded {
                buf.push(r);
                if buf.len() >= rg_rows {
                    rows += write_row_group(&mut buf, out)?;
                }
            }
        }
        // Another tool's file may hold values the sink would have nulled or rows it would
        // have rejected; merging would change or drop them, so the file stays as it is.
        let changed = buf.take_report();
        if !changed.is_clean() {
            return bad(format!(
                "merging would change it: {changed} (the sink's validation)"
            ));
        }
    }
    rows += write_row_group(&mut buf, out)?;
    Ok(Merge::Done(rows))
}

/// Writes the buffered rows as one row group; returns how many.
fn write_row_group<R: Columnar>(
    buf: &mut RowGroupBuffer<R>,
    out: &mut AtomicParquetFile,
) -> Result<u64> {
    if buf.len() == 0 {
        return Ok(0);
    }
    let mut rows = 0;
    out.reserve(buf.len());
    for batch in buf.take_batches()? {
        out.write(&batch)?;
        rows += batch.num_rows() as u64;
    }
    out.end_row_group()?;
    Ok(rows)
}

/// Compacts every partition directory under `root` that holds at least
/// `opts.min_files` files. Returns a report per directory where something happened.
pub fn compact_all(root: &Path, opts: &CompactOptions) -> Result<Vec<CompactReport>> {
    let mut dirs = Vec::new();
    collect_dirs(root, &mut dirs);
    let mut out = Vec::new();
    for d in dirs {
        let r = compact_partition(&d, opts)?;
        if r.output.is_some() || !r.recovered.is_empty() || !r.skipped.is_empty() {
            out.push(r);
        }
    }
    Ok(out)
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut has_files = false;
    for e in rd.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            if !name.starts_with('.') {
                collect_dirs(&e.path(), out);
            }
        } else if name.ends_with(PARQUET_SUFFIX) && !is_hidden_or_tmp(&name) {
            has_files = true;
        }
    }
    if has_files {
        out.push(dir.to_path_buf());
    }
}
