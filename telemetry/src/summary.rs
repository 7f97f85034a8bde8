//! A summary of a telemetry directory (for `marshal telemetry inspect`).
//!
//! Per kind, row counts, sizes and the time span come from the file footers alone; the
//! per-GPU figures (mean / max utilisation, peak memory) read only the columns they need.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Int32Type, TimestampMicrosecondType, UInt16Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef};
use arrow_schema::{DataType, SchemaRef};
use parquet::arrow::parquet_to_arrow_schema;
use parquet::file::statistics::Statistics;

use crate::error::Result;
use crate::reader::{FileError, Query, Scan, check_file, kv, list_files, read_metadata};
use crate::schema::{META_SCHEMA_VERSION, TelemetryKind, col};
use crate::validate::classify;

/// Footer-level figures for one kind.
#[derive(Debug, Clone, PartialEq)]
pub struct KindSummary {
    /// The kind.
    pub kind: TelemetryKind,
    /// Readable files.
    pub files: usize,
    /// Row groups.
    pub row_groups: usize,
    /// Rows.
    pub rows: u64,
    /// Bytes on disk.
    pub bytes: u64,
    /// Earliest timestamp (µs), from row-group statistics.
    pub first_us: Option<i64>,
    /// Latest timestamp (µs), from row-group statistics.
    pub last_us: Option<i64>,
    /// Schema versions found.
    pub schema_versions: BTreeSet<u32>,
    /// The Arrow schema of the first file.
    pub schema: Option<SchemaRef>,
}

impl KindSummary {
    /// Bytes per row on disk.
    pub fn bytes_per_row(&self) -> Option<f64> {
        (self.rows > 0).then(|| self.bytes as f64 / self.rows as f64)
    }
}

/// Figures for one GPU over the whole directory.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSummary {
    /// Node.
    pub node: String,
    /// NVML index.
    pub gpu_index: u16,
    /// UUID.
    pub gpu_uuid: String,
    /// Product name.
    pub gpu_type: String,
    /// Samples.
    pub rows: u64,
    /// First sample (µs).
    pub first_us: i64,
    /// Last sample (µs).
    pub last_us: i64,
    /// Mean SM utilisation over non-null samples.
    pub mean_sm_util_pct: Option<f64>,
    /// Highest SM utilisation.
    pub max_sm_util_pct: Option<f32>,
    /// Mean memory-bandwidth utilisation over non-null samples.
    pub mean_mem_util_pct: Option<f64>,
    /// Highest memory-bandwidth utilisation.
    pub max_mem_util_pct: Option<f32>,
    /// Highest memory in use, bytes.
    pub peak_mem_used_bytes: Option<u64>,
    /// Installed memory, bytes (last seen).
    pub mem_total_bytes: Option<u64>,
    /// Values left out of the figures above because the sink would have nulled them
    /// (NaN, ±∞, negative, a percentage above 100, more memory used than installed):
    /// files written by another tool may hold them.
    pub invalid_values: u64,
}

/// See the [module docs](self).
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// The directory.
    pub root: PathBuf,
    /// Per kind present.
    pub kinds: Vec<KindSummary>,
    /// Per GPU, sorted by node and index.
    pub gpus: Vec<GpuSummary>,
    /// Hidden / `.tmp` files ignored.
    pub ignored_files: usize,
    /// Files superseded by a compacted file.
    pub superseded_files: usize,
    /// Damaged files (each listed once).
    pub errors: Vec<FileError>,
}

#[derive(Default)]
struct Acc {
    gpu_index: u16,
    gpu_type: String,
    rows: u64,
    first: i64,
    last: i64,
    sm: (f64, u64, Option<f32>),
    mem: (f64, u64, Option<f32>),
    peak: Option<u64>,
    total: Option<u64>,
    invalid: u64,
}

fn str_at(c: &ArrayRef, i: usize) -> Option<&str> {
    match c.data_type() {
        DataType::Dictionary(k, _) if **k == DataType::Int32 => {
            let d = c.as_dictionary::<Int32Type>();
            if d.keys().is_null(i) {
                return None;
            }
            let v = d.values().as_string_opt::<i32>()?;
            Some(v.value(d.keys().value(i) as usize))
        }
        DataType::Utf8 => {
            let s = c.as_string::<i32>();
            (!s.is_null(i)).then(|| s.value(i))
        }
        _ => None,
    }
}

/// Adds a utilisation to its mean and maximum; false (and nothing added) when the sink's
/// validation rule would have nulled it.
fn add_pct(acc: &mut (f64, u64, Option<f32>), v: f32) -> bool {
    if classify(f64::from(v), 100.0).is_some() {
        return false;
    }
    acc.0 += f64::from(v);
    acc.1 += 1;
    acc.2 = Some(acc.2.map_or(v, |m| m.max(v)));
    true
}

fn is_micros(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Timestamp(arrow_schema::TimeUnit::Microsecond, _)
    )
}

/// Files whose batches the per-GPU figures could not use, each named once: another
/// tool's types, or rows without their identity. Their rows still count in the kind's
/// footer figures, so the per-GPU rows then add up to less, and this says why.
#[derive(Default)]
struct Unreadable {
    errors: Vec<FileError>,
}

impl Unreadable {
    fn note(&mut self, file: Option<&Path>, reason: &str) {
        let Some(path) = file else { return };
        if !self.errors.iter().any(|e| e.path == path) {
            self.errors.push(FileError {
                path: path.to_path_buf(),
                reason: format!("per-GPU figures leave this file out: {reason}"),
            });
        }
    }
}

/// Summarises the directory at `root`.
pub fn summarize(root: &Path) -> Result<Summary> {
    let listing = list_files(root)?;
    let mut errors = listing.errors.clone();
    let mut kinds: BTreeMap<TelemetryKind, KindSummary> = BTreeMap::new();
    for f in &listing.files {
        let md = match read_metadata(&f.path) {
            Ok(md) => md,
            Err(e) => {
                errors.push(FileError {
                    path: f.path.clone(),
                    reason: e.to_string(),
                });
                continue;
            }
        };
        let kind = match check_file(&f.path, &md) {
            Ok(k) => k,
            Err(e) => {
                errors.push(FileError {
                    path: f.path.clone(),
                    reason: e.to_string(),
                });
                continue;
            }
        };
        let schema = parquet_to_arrow_schema(
            md.file_metadata().schema_descr(),
            md.file_metadata().key_value_metadata(),
        )
        .ok()
        .map(std::sync::Arc::new);
        // Another tool's nanosecond timestamps would read as microseconds, a thousandfold.
        let ts_type = schema
            .as_ref()
            .and_then(|s| s.field_with_name(col::TIMESTAMP).ok())
            .map(|f| f.data_type().clone());
        if let Some(t) = ts_type.filter(|t| !is_micros(t)) {
            errors.push(FileError {
                path: f.path.clone(),
                reason: format!(
                    "column {} has type {t}, expected microsecond timestamps",
                    col::TIMESTAMP
                ),
            });
            continue;
        }
        let k = kinds.entry(kind).or_insert_with(|| KindSummary {
            kind,
            files: 0,
            row_groups: 0,
            rows: 0,
            bytes: 0,
            first_us: None,
            last_us: None,
            schema_versions: BTreeSet::new(),
            schema: None,
        });
        k.files += 1;
        k.bytes += f.bytes;
        k.row_groups += md.num_row_groups();
        k.rows += md.file_metadata().num_rows().max(0) as u64;
        if let Some(v) = kv(&md, META_SCHEMA_VERSION).and_then(|v| v.parse().ok()) {
            k.schema_versions.insert(v);
        }
        if k.schema.is_none() {
            k.schema = schema;
        }
        let ts_leaf = md
            .file_metadata()
            .schema_descr()
            .columns()
            .iter()
            .position(|c| c.path().parts().first().map(String::as_str) == Some(col::TIMESTAMP));
        for rg in md.row_groups() {
            if let Some(Statistics::Int64(s)) = ts_leaf.and_then(|l| rg.column(l).statistics()) {
                if let Some(lo) = s.min_opt() {
                    k.first_us = Some(k.first_us.map_or(*lo, |f| f.min(*lo)));
                }
                if let Some(hi) = s.max_opt() {
                    k.last_us = Some(k.last_us.map_or(*hi, |l| l.max(*hi)));
                }
            }
        }
    }

    // Per-GPU figures from the columns they need.
    let mut gpus: HashMap<(String, String), Acc> = HashMap::new();
    if kinds.contains_key(&TelemetryKind::Gpu) {
        let query = Query::new(TelemetryKind::Gpu).columns([
            col::TIMESTAMP,
            col::NODE,
            col::GPU_INDEX,
            col::GPU_UUID,
            col::GPU_TYPE,
            col::SM_UTIL_PCT,
            col::MEM_UTIL_PCT,
            col::MEM_USED_BYTES,
            col::MEM_TOTAL_BYTES,
        ]);
        let refused: BTreeSet<&Path> = errors.iter().map(|e| e.path.as_path()).collect();
        let readable = listing
            .files
            .iter()
            .filter(|f| !refused.contains(f.path.as_path()))
            .cloned()
            .collect();
        let mut scan = Scan::from_files(readable, query)?;
        let mut unreadable = Unreadable::default();
        while let Some(batch) = scan.next() {
            let file = scan.current_file().map(Path::to_path_buf);
            let get = |n: &str| batch.column_by_name(n).cloned();
            let (
                Some(ts),
                Some(node),
                Some(idx),
                Some(uuid),
                Some(ty),
                Some(sm),
                Some(mu),
                Some(used),
                Some(total),
            ) = (
                get(col::TIMESTAMP),
                get(col::NODE),
                get(col::GPU_INDEX),
                get(col::GPU_UUID),
                get(col::GPU_TYPE),
                get(col::SM_UTIL_PCT),
                get(col::MEM_UTIL_PCT),
                get(col::MEM_USED_BYTES),
                get(col::MEM_TOTAL_BYTES),
            )
            else {
                unreadable.note(file.as_deref(), "a column the summary needs is missing");
                continue;
            };
            let (Some(ts), Some(idx), Some(sm), Some(mu), Some(used), Some(total)) = (
                ts.as_primitive_opt::<TimestampMicrosecondType>(),
                idx.as_primitive_opt::<UInt16Type>(),
                sm.as_primitive_opt::<Float32Type>(),
                mu.as_primitive_opt::<Float32Type>(),
                used.as_primitive_opt::<UInt64Type>(),
                total.as_primitive_opt::<UInt64Type>(),
            ) else {
                unreadable.note(
                    file.as_deref(),
                    "a column has another type than the schema's (e.g. float64 for float32)",
                );
                continue;
            };
            let mut last_key: Option<(String, String)> = None;
            for i in 0..batch.num_rows() {
                let (Some(n), Some(u)) = (str_at(&node, i), str_at(&uuid, i)) else {
                    unreadable.note(
                        file.as_deref(),
                        "rows without a node or GPU UUID (required columns) left out",
                    );
                    continue;
                };
                if last_key.as_ref().is_none_or(|(ln, lu)| ln != n || lu != u) {
                    last_key = Some((n.to_string(), u.to_string()));
                }
                let key = last_key.clone().expect("set above");
                let a = gpus.entry(key).or_insert_with(|| Acc {
                    first: i64::MAX,
                    last: i64::MIN,
                    ..Default::default()
                });
                a.gpu_index = idx.value(i);
                if a.gpu_type.is_empty() {
                    a.gpu_type = str_at(&ty, i).unwrap_or_default().to_string();
                }
                a.rows += 1;
                a.first = a.first.min(ts.value(i));
                a.last = a.last.max(ts.value(i));
                if !sm.is_null(i) && !add_pct(&mut a.sm, sm.value(i)) {
                    a.invalid += 1;
                }
                if !mu.is_null(i) && !add_pct(&mut a.mem, mu.value(i)) {
                    a.invalid += 1;
                }
                if !used.is_null(i) {
                    let u = used.value(i);
                    if !total.is_null(i) && u > total.value(i) {
                        a.invalid += 1;
                    } else {
                        a.peak = Some(a.peak.map_or(u, |p| p.max(u)));
                    }
                }
                if !total.is_null(i) {
                    a.total = Some(total.value(i));
                }
            }
        }
        errors.extend(unreadable.errors);
        let known: BTreeSet<PathBuf> = errors.iter().map(|e| e.path.clone()).collect();
        errors.extend(
            scan.into_report()
                .errors
                .into_iter()
                .filter(|e| !known.contains(&e.path)),
        );
    }
    let mut gpus: Vec<GpuSummary> = gpus
        .into_iter()
        .map(|((node, gpu_uuid), a)| GpuSummary {
            node,
            gpu_index: a.gpu_index,
            gpu_uuid,
            gpu_type: a.gpu_type,
            rows: a.rows,
            first_us: a.first,
            last_us: a.last,
            mean_sm_util_pct: (a.sm.1 > 0).then(|| a.sm.0 / a.sm.1 as f64),
            max_sm_util_pct: a.sm.2,
            mean_mem_util_pct: (a.mem.1 > 0).then(|| a.mem.0 / a.mem.1 as f64),
            max_mem_util_pct: a.mem.2,
            peak_mem_used_bytes: a.peak,
            mem_total_bytes: a.total,
            invalid_values: a.invalid,
        })
        .collect();
    gpus.sort_by(|a, b| {
        (&a.node, a.gpu_index, &a.gpu_uuid).cmp(&(&b.node, b.gpu_index, &b.gpu_uuid))
    });
    Ok(Summary {
        root: root.to_path_buf(),
        kinds: kinds.into_values().collect(),
        gpus,
        ignored_files: listing.ignored.len(),
        superseded_files: listing.superseded.len(),
        errors,
    })
}
