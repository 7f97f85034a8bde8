//! Column builders: rows are validated and appended to builders one at a time.
//!
//! The sink buffers incoming rows directly in these builders (one set per GPU, see
//! [`RowGroupBuffer`]), so a row is touched once, dropped right away, and the row group
//! is assembled without sorting rows. [`crate::Record::to_batch`] uses the same builders.
//!
//! GPU rows, the bulk of telemetry, are validated into fixed-size packed rows (one
//! `Vec::push` per row, strings as dictionary keys, see `PackedGpu`) and cut into Arrow
//! columns when the row group is written: appending to 29 column vectors per row, spread
//! over every GPU's builders, took about 1.8 times the instructions per row (capacity
//! and `Option` checks per column) and touched 29 cache lines per row. Node samples and
//! step profiles, a few rows per second, are appended column by column.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::builder::{ListBuilder, StringBuilder, StructBuilder, UInt64Builder};
use arrow_array::types::{
    Float32Type, Float64Type, Int32Type, TimestampMicrosecondType, UInt16Type, UInt32Type,
    UInt64Type,
};
use arrow_array::{
    ArrayRef, ArrowPrimitiveType, BooleanArray, DictionaryArray, ListArray, PrimitiveArray,
    RecordBatch, StringArray,
};
use arrow_buffer::{BooleanBuffer, Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::SchemaRef;

use crate::convert::Record;
use crate::error::{Result, TelemetryError};
use crate::schema::{
    GpuSample, Health, MemPhase, NodeSample, StepProfile, col, gpu_schema, link_item_field,
    node_schema, port_fields, port_item_field, step_schema,
};
use crate::validate::{Issue, ValidationReport};

/// Upper bound accepted for temperatures, °C. Anything hotter is a sensor fault.
const MAX_TEMPERATURE_C: f32 = 200.0;
/// Upper bound accepted for board power, milliwatts (a GB200 superchip draws ~2.7 kW).
const MAX_POWER_MW: u32 = 10_000_000;

/// Builders for the columns of one row type.
pub(crate) trait Columns<R>: Send {
    /// Empty builders with room for `capacity` rows.
    fn new(capacity: usize) -> Self;
    /// Rows appended.
    fn len(&self) -> usize;
    /// Validates `row` and appends it, or counts it as rejected.
    fn push(&mut self, row: &R, report: &mut ValidationReport);
    /// The appended rows as a batch; the builders start over empty.
    fn finish(&mut self) -> Result<RecordBatch>;
}

/// Row types with column builders.
pub(crate) trait Columnar: Record {
    /// The builders.
    type Columns: Columns<Self>;

    /// Key that orders rows within one bucket ([`Record::bucket`]) when the file order
    /// is "bucket, then time"; `None` when it is not (the bucket is then always sorted).
    fn minor_key(&self) -> Option<i64>;

    /// Rows a bucket's builders have room for when the bucket receives its first row
    /// (before any row group tells its size): builders then grow by doubling from
    /// there, copying what they hold each time, instead of from zero.
    const INITIAL_ROWS: usize = 0;
}

/// Converts rows with the builders of their type.
pub(crate) fn rows_to_batch<'a, R: Columnar>(
    rows: impl IntoIterator<Item = &'a R>,
    report: &mut ValidationReport,
) -> Result<RecordBatch> {
    let rows = rows.into_iter();
    let mut cols = R::Columns::new(rows.size_hint().0);
    for r in rows {
        cols.push(r, report);
    }
    cols.finish()
}

fn batch(schema: SchemaRef, columns: Vec<ArrayRef>, what: &str) -> Result<RecordBatch> {
    RecordBatch::try_new(schema, columns)
        .map_err(|e| TelemetryError::arrow(format!("assembling a {what} record batch"), e))
}

/// A primitive column under construction: a plain `Vec` of values and, once the first
/// null arrives, a `Vec<bool>` of validity. Cheaper per append than Arrow's builders, and
/// the vectors become the array's buffers without a copy.
struct Col<T: ArrowPrimitiveType> {
    values: Vec<T::Native>,
    valid: Option<Vec<bool>>,
}

impl<T: ArrowPrimitiveType> Col<T> {
    fn with_capacity(n: usize) -> Self {
        Self {
            values: Vec::with_capacity(n),
            valid: None,
        }
    }

    #[inline]
    fn append_value(&mut self, v: T::Native) {
        self.values.push(v);
        if let Some(valid) = &mut self.valid {
            valid.push(true);
        }
    }

    #[inline]
    fn append_null(&mut self) {
        let n = self.values.len();
        self.valid.get_or_insert_with(|| vec![true; n]).push(false);
        self.values.push(T::Native::default());
    }

    #[inline]
    fn append_option(&mut self, v: Option<T::Native>) {
        match v {
            Some(v) => self.append_value(v),
            None => self.append_null(),
        }
    }

    fn finish(&mut self) -> PrimitiveArray<T> {
        let cap = self.values.len();
        let values = std::mem::replace(&mut self.values, Vec::with_capacity(cap));
        let nulls = self.valid.take().map(NullBuffer::from);
        PrimitiveArray::new(ScalarBuffer::from(values), nulls)
    }
}

/// The distinct strings of one dictionary column and their keys, remembering the
/// previous value so a string that repeats row after row (the normal case) costs a
/// pointer comparison.
struct Interner {
    values: Vec<Arc<str>>,
    index: HashMap<Arc<str>, i32>,
    last: Option<(Arc<str>, i32)>,
}

impl Interner {
    fn new() -> Self {
        Self {
            values: Vec::new(),
            index: HashMap::new(),
            last: None,
        }
    }

    /// The key of `v`.
    #[inline]
    fn key(&mut self, v: &Arc<str>) -> i32 {
        // Fast path (inlined): the same `Arc` as the previous row.
        match &self.last {
            Some((last, key)) if Arc::ptr_eq(last, v) => *key,
            _ => self.key_other(v),
        }
    }

    /// A value that is not the previous row's `Arc` (perhaps an equal string).
    #[inline(never)]
    fn key_other(&mut self, v: &Arc<str>) -> i32 {
        if let Some((last, key)) = &self.last
            && **last == **v
        {
            return *key;
        }
        let key = match self.index.get(v) {
            Some(k) => *k,
            None => {
                let k = self.values.len() as i32;
                self.values.push(v.clone());
                self.index.insert(v.clone(), k);
                k
            }
        };
        self.last = Some((v.clone(), key));
        key
    }

    /// `keys` as a dictionary column of the strings seen; forgets them.
    fn finish(&mut self, keys: PrimitiveArray<Int32Type>) -> Result<ArrayRef> {
        let values = StringArray::from_iter_values(self.values.iter().map(|s| &**s));
        self.values.clear();
        self.index.clear();
        self.last = None;
        let dict = DictionaryArray::<Int32Type>::try_new(keys, Arc::new(values))
            .map_err(|e| TelemetryError::arrow("building a dictionary column", e))?;
        Ok(Arc::new(dict))
    }
}

/// Builds a `Dictionary(Int32, Utf8)` column.
struct DictBuilder {
    keys: Col<Int32Type>,
    dict: Interner,
}

impl DictBuilder {
    fn new(capacity: usize) -> Self {
        Self {
            keys: Col::with_capacity(capacity),
            dict: Interner::new(),
        }
    }

    #[inline]
    fn append(&mut self, v: &Arc<str>) {
        let key = self.dict.key(v);
        self.keys.append_value(key);
    }

    #[inline]
    fn append_option(&mut self, v: Option<&Arc<str>>) {
        match v {
            Some(v) => self.append(v),
            None => self.keys.append_null(),
        }
    }

    fn finish(&mut self) -> Result<ArrayRef> {
        let keys = self.keys.finish();
        self.dict.finish(keys)
    }
}

/// Builds a `Dictionary(Int32, Utf8)` column of an enum: the key is the variant's index.
struct EnumBuilder {
    keys: Col<Int32Type>,
    values: &'static [&'static str],
}

impl EnumBuilder {
    fn new(capacity: usize, values: &'static [&'static str]) -> Self {
        Self {
            keys: Col::with_capacity(capacity),
            values,
        }
    }

    fn finish(&mut self) -> Result<ArrayRef> {
        let keys = self.keys.finish();
        let values = StringArray::from_iter_values(self.values.iter());
        let dict = DictionaryArray::<Int32Type>::try_new(keys, Arc::new(values))
            .map_err(|e| TelemetryError::arrow("building an enum column", e))?;
        Ok(Arc::new(dict))
    }
}

const HEALTH_VALUES: &[&str] = &["ok", "degraded", "failed"];
const PHASE_VALUES: &[&str] = &["warmup", "steady", "eval", "checkpoint"];

fn health_key(h: Health) -> i32 {
    match h {
        Health::Ok => 0,
        Health::Degraded => 1,
        Health::Failed => 2,
    }
}

fn phase_key(p: MemPhase) -> i32 {
    match p {
        MemPhase::Warmup => 0,
        MemPhase::Steady => 1,
        MemPhase::Eval => 2,
        MemPhase::Checkpoint => 3,
    }
}

#[inline]
fn required_str(report: &mut ValidationReport, column: &'static str, v: &str) -> bool {
    if v.is_empty() {
        report.reject(column, Issue::Empty);
        false
    } else {
        true
    }
}

#[inline]
fn valid_timestamp(report: &mut ValidationReport, ts: i64) -> bool {
    if ts < 0 {
        report.reject(col::TIMESTAMP, Issue::Negative);
        false
    } else {
        true
    }
}

/// One validated GPU row as the sink buffers it: the values of [`GpuSample`] without
/// `Option`s (a null is a bit in `nulls` and a zero value), strings as dictionary keys,
/// per-link counters elsewhere ([`LinkCol`]). 136 bytes, appended with one `Vec::push`
/// where 29 column builders took 29; the columns are cut out of the rows when the row
/// group is written.
#[derive(Debug, Clone, Copy, Default)]
struct PackedGpu {
    ts: i64,
    /// `U64_COLUMNS`, in that order.
    u64s: [u64; 7],
    /// `F32_COLUMNS`, in that order.
    f32s: [f32; 3],
    /// `U32_COLUMNS`, in that order.
    u32s: [u32; 6],
    /// Dictionary keys: cluster, node, GPU UUID, GPU type, job, worker.
    keys: [i32; 6],
    /// Bit `1 << b` set: the value of null-bit `b` is null (see `NULL_*`).
    nulls: u32,
    gpu_index: u16,
    health: u8,
    phase: u8,
    mig: bool,
}

/// Null bits of [`PackedGpu::nulls`]: `u64s[i]` is bit `i`, `f32s[i]` bit `7 + i`,
/// `u32s[i]` bit `10 + i`, then the rest.
const NULL_F32: u32 = 7;
const NULL_U32: u32 = 10;
const NULL_JOB: u32 = 16;
const NULL_WORKER: u32 = 17;
const NULL_PHASE: u32 = 18;
const NULL_MIG: u32 = 19;
const NULL_TX_LINKS: u32 = 20;
const NULL_RX_LINKS: u32 = 21;
/// A bit no row sets (non-nullable columns).
const NEVER_NULL: u32 = 31;

/// Dictionary key indices in [`PackedGpu::keys`].
const KEY_CLUSTER: usize = 0;
const KEY_NODE: usize = 1;
const KEY_UUID: usize = 2;
const KEY_TYPE: usize = 3;
const KEY_JOB: usize = 4;
const KEY_WORKER: usize = 5;

/// `v`'s value, or the type's zero with `bit` set in `nulls`.
#[inline(always)]
fn unpack<T: Default>(nulls: &mut u32, bit: u32, v: Option<T>) -> T {
    match v {
        Some(v) => v,
        None => {
            *nulls |= 1 << bit;
            T::default()
        }
    }
}

/// A `List<UInt64>` column (per-link counters): values and list ends, the ends kept only
/// from the first row that has a list on (rows before it are null lists).
#[derive(Default)]
struct LinkCol {
    values: Vec<u64>,
    /// `values.len()` after each row, once any row had a list; empty before.
    ends: Vec<u32>,
    /// The rows the builder expects (its bucket's last row group), so that the first
    /// list can size `values` for all of them instead of growing them list by list.
    expected_rows: usize,
}

impl LinkCol {
    fn expecting(rows: usize) -> Self {
        Self {
            expected_rows: rows,
            ..Self::default()
        }
    }

    /// Appends row `row`'s list (`None`: null); returns whether it is null.
    #[inline]
    fn append(&mut self, row: usize, v: Option<&[u64]>) -> bool {
        match v {
            None => {
                if !self.ends.is_empty() {
                    self.ends.push(self.values.len() as u32);
                }
                true
            }
            Some(v) => {
                if self.ends.is_empty() {
                    let rows = self.expected_rows.max(row + 1);
                    self.ends.reserve(rows);
                    self.values.reserve((rows - row) * v.len());
                    self.ends.resize(row, 0);
                }
                self.values.extend_from_slice(v);
                self.ends.push(self.values.len() as u32);
                false
            }
        }
    }

    fn finish(&mut self, rows: &[PackedGpu], nulls: NullBits, bit: u32) -> ArrayRef {
        let offsets = if self.ends.is_empty() {
            OffsetBuffer::new_zeroed(rows.len())
        } else {
            OffsetBuffer::new(ScalarBuffer::from_iter(
                std::iter::once(0).chain(self.ends.iter().map(|e| *e as i32)),
            ))
        };
        self.ends.clear();
        let values = PrimitiveArray::<UInt64Type>::from(std::mem::take(&mut self.values));
        Arc::new(ListArray::new(
            link_item_field(),
            offsets,
            Arc::new(values),
            null_buffer(rows, nulls, bit),
        ))
    }
}

/// Null-bit summary of a bucket's rows: bits set in any row, and bits set in every row.
#[derive(Clone, Copy)]
struct NullBits {
    any: u32,
    all: u32,
}

impl NullBits {
    fn of(rows: &[PackedGpu]) -> Self {
        rows.iter()
            .fold(NullBits { any: 0, all: !0 }, |NullBits { any, all }, r| {
                NullBits {
                    any: any | r.nulls,
                    all: all & r.nulls,
                }
            })
    }
}

/// A bitmap of `f` over `rows` (LSB first, 64 rows per word).
fn bits(rows: &[PackedGpu], f: impl Fn(&PackedGpu) -> bool) -> BooleanBuffer {
    let words: Vec<u64> = rows
        .chunks(64)
        .map(|chunk| {
            chunk
                .iter()
                .enumerate()
                .fold(0u64, |w, (i, r)| w | (u64::from(f(r)) << i))
        })
        .collect();
    BooleanBuffer::new(Buffer::from_vec(words), 0, rows.len())
}

/// The validity of null-bit `bit` over `rows`; `None` when no row has it set.
fn null_buffer(rows: &[PackedGpu], nulls: NullBits, bit: u32) -> Option<NullBuffer> {
    let mask = 1 << bit;
    if nulls.any & mask == 0 {
        None
    } else if nulls.all & mask != 0 {
        Some(NullBuffer::new_null(rows.len()))
    } else {
        Some(NullBuffer::new(bits(rows, |r| r.nulls & mask == 0)))
    }
}

/// One primitive column cut out of `rows`.
fn column<T: ArrowPrimitiveType>(
    rows: &[PackedGpu],
    nulls: NullBits,
    bit: u32,
    value: impl Fn(&PackedGpu) -> T::Native,
) -> PrimitiveArray<T> {
    let values: Vec<T::Native> = rows.iter().map(value).collect();
    PrimitiveArray::new(ScalarBuffer::from(values), null_buffer(rows, nulls, bit))
}

/// Builders of the [`GpuSample`] columns: validated rows packed into [`PackedGpu`]s.
pub(crate) struct GpuColumns {
    rows: Vec<PackedGpu>,
    /// Cluster, node, GPU UUID, GPU type, job, worker (as in [`PackedGpu::keys`]).
    dicts: [Interner; 6],
    tx_links: LinkCol,
    rx_links: LinkCol,
}

impl Columns<GpuSample> for GpuColumns {
    fn new(n: usize) -> Self {
        Self {
            rows: Vec::with_capacity(n),
            dicts: std::array::from_fn(|_| Interner::new()),
            tx_links: LinkCol::expecting(n),
            rx_links: LinkCol::expecting(n),
        }
    }

    fn len(&self) -> usize {
        self.rows.len()
    }

    fn push(&mut self, r: &GpuSample, report: &mut ValidationReport) {
        self.push_ref(&GpuRef::from(r), report);
    }

    fn finish(&mut self) -> Result<RecordBatch> {
        self.finish_gpu()
    }
}

/// One GPU row borrowed from either a [`GpuSample`] or a [`crate::GpuBatch`]: both intake
/// paths validate and append through [`GpuColumns::push_ref`].
pub(crate) struct GpuRef<'a> {
    pub(crate) timestamp_us: i64,
    pub(crate) cluster: &'a Arc<str>,
    pub(crate) node: &'a Arc<str>,
    pub(crate) gpu_index: u16,
    pub(crate) gpu_uuid: &'a Arc<str>,
    pub(crate) gpu_type: &'a Arc<str>,
    pub(crate) sm_util_pct: Option<f32>,
    pub(crate) mem_util_pct: Option<f32>,
    pub(crate) mem_used_bytes: Option<u64>,
    pub(crate) mem_total_bytes: Option<u64>,
    pub(crate) nvlink_tx_kib: Option<u64>,
    pub(crate) nvlink_rx_kib: Option<u64>,
    pub(crate) nvlink_tx_per_link_kib: Option<&'a [u64]>,
    pub(crate) nvlink_rx_per_link_kib: Option<&'a [u64]>,
    pub(crate) pcie_tx_kib_per_s: Option<u32>,
    pub(crate) pcie_rx_kib_per_s: Option<u32>,
    pub(crate) temperature_c: Option<f32>,
    pub(crate) power_mw: Option<u32>,
    pub(crate) sm_clock_mhz: Option<u32>,
    pub(crate) mem_clock_mhz: Option<u32>,
    pub(crate) throttle_reasons: Option<u64>,
    pub(crate) ecc_corrected: Option<u64>,
    pub(crate) ecc_uncorrected: Option<u64>,
    pub(crate) xid: Option<u32>,
    pub(crate) health: Health,
    pub(crate) job_id: Option<&'a Arc<str>>,
    pub(crate) worker: Option<&'a Arc<str>>,
    pub(crate) mem_phase: Option<MemPhase>,
    pub(crate) mig_mode: Option<bool>,
}

impl<'a> From<&'a GpuSample> for GpuRef<'a> {
    #[inline]
    fn from(r: &'a GpuSample) -> Self {
        GpuRef {
            timestamp_us: r.timestamp_us,
            cluster: &r.cluster,
            node: &r.node,
            gpu_index: r.gpu_index,
            gpu_uuid: &r.gpu_uuid,
            gpu_type: &r.gpu_type,
            sm_util_pct: r.sm_util_pct,
            mem_util_pct: r.mem_util_pct,
            mem_used_bytes: r.mem_used_bytes,
            mem_total_bytes: r.mem_total_bytes,
            nvlink_tx_kib: r.nvlink_tx_kib,
            nvlink_rx_kib: r.nvlink_rx_kib,
            nvlink_tx_per_link_kib: r.nvlink_tx_per_link_kib.as_deref(),
            nvlink_rx_per_link_kib: r.nvlink_rx_per_link_kib.as_deref(),
            pcie_tx_kib_per_s: r.pcie_tx_kib_per_s,
            pcie_rx_kib_per_s: r.pcie_rx_kib_per_s,
            temperature_c: r.temperature_c,
            power_mw: r.power_mw,
            sm_clock_mhz: r.sm_clock_mhz,
            mem_clock_mhz: r.mem_clock_mhz,
            throttle_reasons: r.throttle_reasons,
            ecc_corrected: r.ecc_corrected,
            ecc_uncorrected: r.ecc_uncorrected,
            xid: r.xid,
            health: r.health,
            job_id: r.job_id.as_ref(),
            worker: r.worker.as_ref(),
            mem_phase: r.mem_phase,
            mig_mode: r.mig_mode,
        }
    }
}

impl GpuColumns {
    /// Validates one row and appends it, or counts it as rejected.
    #[inline]
    pub(crate) fn push_ref(&mut self, r: &GpuRef<'_>, report: &mut ValidationReport) {
        report.rows_in += 1;
        if !(valid_timestamp(report, r.timestamp_us)
            && required_str(report, col::CLUSTER, r.cluster)
            && required_str(report, col::NODE, r.node)
            && required_str(report, col::GPU_UUID, r.gpu_uuid)
            && required_str(report, col::GPU_TYPE, r.gpu_type))
        {
            return;
        }
        let mut nulls = 0u32;
        let n = &mut nulls;
        let used = match r.mem_total_bytes {
            Some(total) => report.at_most(col::MEM_USED_BYTES, r.mem_used_bytes, total),
            None => r.mem_used_bytes,
        };
        let u64s = [
            unpack(n, 0, used),
            unpack(n, 1, r.mem_total_bytes),
            unpack(n, 2, r.nvlink_tx_kib),
            unpack(n, 3, r.nvlink_rx_kib),
            unpack(n, 4, r.throttle_reasons),
            unpack(n, 5, r.ecc_corrected),
            unpack(n, 6, r.ecc_uncorrected),
        ];
        let f32s = [
            unpack(
                n,
                NULL_F32,
                report.f32_in(col::SM_UTIL_PCT, r.sm_util_pct, 100.0),
            ),
            unpack(
                n,
                NULL_F32 + 1,
                report.f32_in(col::MEM_UTIL_PCT, r.mem_util_pct, 100.0),
            ),
            unpack(
                n,
                NULL_F32 + 2,
                report.f32_in(col::TEMPERATURE_C, r.temperature_c, MAX_TEMPERATURE_C),
            ),
        ];
        let u32s = [
            unpack(n, NULL_U32, r.pcie_tx_kib_per_s),
            unpack(n, NULL_U32 + 1, r.pcie_rx_kib_per_s),
            unpack(
                n,
                NULL_U32 + 2,
                report.at_most(col::POWER_MW, r.power_mw, MAX_POWER_MW),
            ),
            unpack(n, NULL_U32 + 3, r.sm_clock_mhz),
            unpack(n, NULL_U32 + 4, r.mem_clock_mhz),
            unpack(n, NULL_U32 + 5, r.xid),
        ];
        let [cluster, node, uuid, gpu_type, job, worker] = &mut self.dicts;
        let keys = [
            cluster.key(r.cluster),
            node.key(r.node),
            uuid.key(r.gpu_uuid),
            gpu_type.key(r.gpu_type),
            unpack(n, NULL_JOB, r.job_id.map(|j| job.key(j))),
            unpack(n, NULL_WORKER, r.worker.map(|w| worker.key(w))),
        ];
        let phase = unpack(n, NULL_PHASE, r.mem_phase.map(phase_key)) as u8;
        let mig = unpack(n, NULL_MIG, r.mig_mode);
        let row = self.rows.len();
        if self.tx_links.append(row, r.nvlink_tx_per_link_kib) {
            *n |= 1 << NULL_TX_LINKS;
        }
        if self.rx_links.append(row, r.nvlink_rx_per_link_kib) {
            *n |= 1 << NULL_RX_LINKS;
        }
        self.rows.push(PackedGpu {
            ts: r.timestamp_us,
            u64s,
            f32s,
            u32s,
            keys,
            nulls,
            gpu_index: r.gpu_index,
            health: health_key(r.health) as u8,
            phase,
            mig,
        });
    }

    fn finish_gpu(&mut self) -> Result<RecordBatch> {
        let rows = &self.rows[..];
        let any = NullBits::of(rows);
        // Macros, not closures over an index: a literal index needs no bounds check per
        // value.
        macro_rules! u64_col {
            ($i:literal) => {
                Arc::new(column::<UInt64Type>(rows, any, $i, |r| r.u64s[$i])) as ArrayRef
            };
        }
        macro_rules! f32_col {
            ($i:literal) => {
                Arc::new(column::<Float32Type>(rows, any, NULL_F32 + $i, |r| {
                    r.f32s[$i]
                })) as ArrayRef
            };
        }
        macro_rules! u32_col {
            ($i:literal) => {
                Arc::new(column::<UInt32Type>(rows, any, NULL_U32 + $i, |r| {
                    r.u32s[$i]
                })) as ArrayRef
            };
        }
        macro_rules! keys {
            ($k:expr, $bit:expr) => {
                column::<Int32Type>(rows, any, $bit, |r| r.keys[$k])
            };
        }
        let [cluster, node, uuid, gpu_type, job, worker] = &mut self.dicts;
        let enum_col = |values: &'static [&'static str], keys: PrimitiveArray<Int32Type>| {
            let values = StringArray::from_iter_values(values.iter());
            DictionaryArray::<Int32Type>::try_new(keys, Arc::new(values))
                .map(|d| Arc::new(d) as ArrayRef)
                .map_err(|e| TelemetryError::arrow("building an enum column", e))
        };
        let columns: Vec<ArrayRef> = vec![
            Arc::new(
                column::<TimestampMicrosecondType>(rows, any, NEVER_NULL, |r| r.ts)
                    .with_timezone("UTC"),
            ),
            cluster.finish(keys!(KEY_CLUSTER, NEVER_NULL))?,
            node.finish(keys!(KEY_NODE, NEVER_NULL))?,
            Arc::new(column::<UInt16Type>(rows, any, NEVER_NULL, |r| r.gpu_index)),
            uuid.finish(keys!(KEY_UUID, NEVER_NULL))?,
            gpu_type.finish(keys!(KEY_TYPE, NEVER_NULL))?,
            f32_col!(0),
            f32_col!(1),
            u64_col!(0),
            u64_col!(1),
            u64_col!(2),
            u64_col!(3),
            self.tx_links.finish(rows, any, NULL_TX_LINKS),
            self.rx_links.finish(rows, any, NULL_RX_LINKS),
            u32_col!(0),
            u32_col!(1),
            f32_col!(2),
            u32_col!(2),
            u32_col!(3),
            u32_col!(4),
            u64_col!(4),
            u64_col!(5),
            u64_col!(6),
            u32_col!(5),
            enum_col(
                HEALTH_VALUES,
                column::<Int32Type>(rows, any, NEVER_NULL, |r| i32::from(r.health)),
            )?,
            job.finish(keys!(KEY_JOB, NULL_JOB))?,
            worker.finish(keys!(KEY_WORKER, NULL_WORKER))?,
            enum_col(
                PHASE_VALUES,
                column::<Int32Type>(rows, any, NULL_PHASE, |r| i32::from(r.phase)),
            )?,
            Arc::new(BooleanArray::new(
                bits(rows, |r| r.mig),
                null_buffer(rows, any, NULL_MIG),
            )),
        ];
        self.rows.clear();
        batch(gpu_schema(), columns, "GPU sample")
    }
}

impl Columnar for GpuSample {
    type Columns = GpuColumns;

    /// 34 KiB of packed rows per GPU (4 minutes of 1-second samples).
    const INITIAL_ROWS: usize = 256;

    fn minor_key(&self) -> Option<i64> {
        Some(self.timestamp_us)
    }
}

/// Builders of the [`NodeSample`] columns.
pub(crate) struct NodeColumns {
    len: usize,
    ts: Col<TimestampMicrosecondType>,
    cluster: DictBuilder,
    node: DictBuilder,
    ports: ListBuilder<StructBuilder>,
    used: Col<UInt64Type>,
    total: Col<UInt64Type>,
    cpu: Col<Float32Type>,
}

impl Columns<NodeSample> for NodeColumns {
    fn new(n: usize) -> Self {
        let port_builder = StructBuilder::new(
            port_fields(),
            vec![
                Box::new(StringBuilder::new()),
                Box::new(UInt64Builder::new()),
                Box::new(UInt64Builder::new()),
            ],
        );
        Self {
            len: 0,
            ts: Col::with_capacity(n),
            cluster: DictBuilder::new(n),
            node: DictBuilder::new(n),
            ports: ListBuilder::with_capacity(port_builder, n).with_field(port_item_field()),
            used: Col::with_capacity(n),
            total: Col::with_capacity(n),
            cpu: Col::with_capacity(n),
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn push(&mut self, r: &NodeSample, report: &mut ValidationReport) {
        report.rows_in += 1;
        if !(valid_timestamp(report, r.timestamp_us)
            && required_str(report, col::CLUSTER, &r.cluster)
            && required_str(report, col::NODE, &r.node))
        {
            return;
        }
        self.len += 1;
        self.ts.append_value(r.timestamp_us);
        self.cluster.append(&r.cluster);
        self.node.append(&r.node);
        match &r.net_ports {
            Some(list) => {
                let sb = self.ports.values();
                for p in list {
                    if let Some(b) = sb.field_builder::<StringBuilder>(0) {
                        b.append_value(&p.port);
                    }
                    if let Some(b) = sb.field_builder::<UInt64Builder>(1) {
                        b.append_value(p.tx_bytes);
                    }
                    if let Some(b) = sb.field_builder::<UInt64Builder>(2) {
                        b.append_value(p.rx_bytes);
                    }
                    sb.append(true);
                }
                self.ports.append(true);
            }
            None => self.ports.append_null(),
        }
        let total = r.host_mem_total_bytes;
        let used = match total {
            Some(t) => report.at_most(col::HOST_MEM_USED_BYTES, r.host_mem_used_bytes, t),
            None => r.host_mem_used_bytes,
        };
        self.used.append_option(used);
        self.total.append_option(total);
        self.cpu
            .append_option(report.f32_in(col::CPU_UTIL_PCT, r.cpu_util_pct, 100.0));
    }

    fn finish(&mut self) -> Result<RecordBatch> {
        self.len = 0;
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.ts.finish().with_timezone("UTC")),
            self.cluster.finish()?,
            self.node.finish()?,
            Arc::new(self.ports.finish()),
            Arc::new(self.used.finish()),
            Arc::new(self.total.finish()),
            Arc::new(self.cpu.finish()),
        ];
        batch(node_schema(), columns, "node sample")
    }
}

impl Columnar for NodeSample {
    type Columns = NodeColumns;

    fn minor_key(&self) -> Option<i64> {
        Some(self.timestamp_us)
    }
}

/// Builders of the [`StepProfile`] columns.
pub(crate) struct StepColumns {
    len: usize,
    ts: Col<TimestampMicrosecondType>,
    job: DictBuilder,
    step: Col<UInt64Type>,
    step_time: Col<Float64Type>,
    phase: EnumBuilder,
    peak: Col<UInt64Type>,
    gpu_type: DictBuilder,
    num_gpus: Col<UInt32Type>,
    placement: DictBuilder,
    model: DictBuilder,
    batch_size: Col<UInt32Type>,
    comm: DictBuilder,
    span: DictBuilder,
    tenants: Col<UInt16Type>,
    gpu_util: Col<Float32Type>,
}

impl Columns<StepProfile> for StepColumns {
    fn new(n: usize) -> Self {
        Self {
            len: 0,
            ts: Col::with_capacity(n),
            job: DictBuilder::new(n),
            step: Col::with_capacity(n),
            step_time: Col::with_capacity(n),
            phase: EnumBuilder::new(n, PHASE_VALUES),
            peak: Col::with_capacity(n),
            gpu_type: DictBuilder::new(n),
            num_gpus: Col::with_capacity(n),
            placement: DictBuilder::new(n),
            model: DictBuilder::new(n),
            batch_size: Col::with_capacity(n),
            comm: DictBuilder::new(n),
            span: DictBuilder::new(n),
            tenants: Col::with_capacity(n),
            gpu_util: Col::with_capacity(n),
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn push(&mut self, r: &StepProfile, report: &mut ValidationReport) {
        report.rows_in += 1;
        if !(valid_timestamp(report, r.timestamp_us)
            && required_str(report, col::JOB_ID, &r.job_id)
            && required_str(report, col::GPU_TYPE, &r.gpu_type))
        {
            return;
        }
        // The step time is the measurement the row exists for: a broken one drops the row.
        match crate::validate::classify(r.step_time_s, f64::MAX) {
            Some(issue) => {
                report.reject(col::STEP_TIME_S, issue);
                return;
            }
            None if r.step_time_s == 0.0 => {
                report.reject(col::STEP_TIME_S, Issue::OutOfRange);
                return;
            }
            None => {}
        }
        self.len += 1;
        self.ts.append_value(r.timestamp_us);
        self.job.append(&r.job_id);
        self.step.append_value(r.step);
        self.step_time.append_value(r.step_time_s);
        self.phase.keys.append_option(r.phase.map(phase_key));
        self.peak.append_option(r.peak_mem_bytes);
        self.gpu_type.append(&r.gpu_type);
        self.num_gpus.append_value(r.num_gpus);
        self.placement.append(&r.placement);
        self.model.append_option(r.model.as_ref());
        self.batch_size.append_option(r.batch_size);
        self.comm.append_option(r.comm.as_ref());
        self.span.append_option(r.span.as_ref());
        self.tenants.append_option(r.tenants);
        let util = r.gpu_util_pct.map(f64::from);
        match util.and_then(|u| crate::validate::classify(u, 100.0)) {
            Some(issue) => {
                report.null(col::GPU_UTIL_PCT, issue);
                self.gpu_util.append_null();
            }
            None => self.gpu_util.append_option(r.gpu_util_pct),
        }
    }

    fn finish(&mut self) -> Result<RecordBatch> {
        self.len = 0;
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.ts.finish().with_timezone("UTC")),
            self.job.finish()?,
            Arc::new(self.step.finish()),
            Arc::new(self.step_time.finish()),
            self.phase.finish()?,
            Arc::new(self.peak.finish()),
            self.gpu_type.finish()?,
            Arc::new(self.num_gpus.finish()),
            self.placement.finish()?,
            self.model.finish()?,
            Arc::new(self.batch_size.finish()),
            self.comm.finish()?,
            self.span.finish()?,
            Arc::new(self.tenants.finish()),
            Arc::new(self.gpu_util.finish()),
        ];
        batch(step_schema(), columns, "step profile")
    }
}

impl Columnar for StepProfile {
    type Columns = StepColumns;

    fn minor_key(&self) -> Option<i64> {
        None
    }
}

/// Rows waiting to become one row group, in file order.
///
/// Rows are validated and appended to the column builders of their bucket
/// ([`Record::bucket`], the GPU) as they arrive, so the row group comes out ordered by GPU
/// then time without a sort. A bucket whose rows arrived out of order (or a row type
/// without a [`Columnar::minor_key`]) is decoded, sorted and re-encoded when taken: a
/// slow path that normal, in-order sampling never takes.
pub(crate) struct RowGroupBuffer<R: Columnar> {
    buckets: Vec<Bucket<R>>,
    len: usize,
    report: ValidationReport,
}

struct Bucket<R: Columnar> {
    cols: R::Columns,
    last: Option<i64>,
    /// Minor key of the last row accepted, kept across row groups: a row that repeats
    /// it is a duplicate.
    last_accepted: Option<i64>,
    sorted: bool,
    /// Rows in the previous row group: the next one is sized alike, so builders do not
    /// grow (and copy) row by row in steady state.
    previous: usize,
}

/// Buckets above this share the last one (which then gets sorted).
const MAX_BUCKETS: usize = 1024;

impl<R: Columnar> RowGroupBuffer<R> {
    pub(crate) fn new() -> Self {
        Self {
            buckets: Vec::new(),
            len: 0,
            report: ValidationReport::default(),
        }
    }

    /// Rows accepted and buffered.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn push(&mut self, row: &R) -> bool {
        self.push_with(row.bucket(), row.minor_key(), |cols, report| {
            cols.push(row, report)
        })
    }

    /// Appends one row through `append` (which validates it) to the builders of
    /// `bucket`; `minor` is its [`Columnar::minor_key`]. Returns whether it was accepted.
    #[inline]
    pub(crate) fn push_with(
        &mut self,
        bucket: u32,
        minor: Option<i64>,
        append: impl FnOnce(&mut R::Columns, &mut ValidationReport),
    ) -> bool {
        let b = (bucket as usize).min(MAX_BUCKETS);
        if b >= self.buckets.len() {
            self.buckets.resize_with(b + 1, || Bucket {
                cols: R::Columns::new(R::INITIAL_ROWS),
                last: None,
                last_accepted: None,
                sorted: true,
                previous: 0,
            });
        }
        let bucket = &mut self.buckets[b];
        if minor.is_some() && b < MAX_BUCKETS && bucket.last_accepted == minor {
            self.report.rows_in += 1;
            self.report.reject(col::TIMESTAMP, Issue::Duplicate);
            return false;
        }
        let before = bucket.cols.len();
        append(&mut bucket.cols, &mut self.report);
        if bucket.cols.len() == before {
            return false; // rejected
        }
        self.len += 1;
        match minor {
            Some(k) if b < MAX_BUCKETS => {
                if bucket.last.is_some_and(|l| l > k) {
                    bucket.sorted = false;
                }
                bucket.last = Some(k);
                bucket.last_accepted = Some(k);
            }
            _ => bucket.sorted = false,
        }
        true
    }

    /// Validation counts since the last call.
    pub(crate) fn take_report(&mut self) -> ValidationReport {
        std::mem::take(&mut self.report)
    }

    /// The buffered rows as batches in file order (one per non-empty bucket); the buffer
    /// is left empty.
    pub(crate) fn take_batches(&mut self) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        for bucket in &mut self.buckets {
            if bucket.cols.len() == 0 {
                continue;
            }
            bucket.previous = bucket.cols.len();
            let batch = bucket.cols.finish()?;
            // `finish` leaves empty builders; give them last time's size up front.
            bucket.cols = R::Columns::new(bucket.previous);
            let sorted = std::mem::replace(&mut bucket.sorted, true);
            bucket.last = None;
            if sorted {
                out.push(batch);
            } else {
                let mut rows = R::from_batch(&batch)?;
                rows.sort_by(|a, b| a.file_order(b));
                // Values were validated on the way in; do not count them twice.
                out.push(rows_to_batch(&rows, &mut ValidationReport::default())?);
            }
        }
        self.len = 0;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Array;
    use arrow_array::builder::{
        BooleanBuilder, Float32Builder, PrimitiveBuilder, StringDictionaryBuilder,
    };

    fn full(ts: i64, node: &Arc<str>, gpu: u16) -> GpuSample {
        GpuSample {
            timestamp_us: ts,
            cluster: "prod".into(),
            node: node.clone(),
            gpu_index: gpu,
            gpu_uuid: format!("GPU-{gpu}").into(),
            gpu_type: "H100".into(),
            sm_util_pct: Some(97.0),
            mem_util_pct: Some(41.0),
            mem_used_bytes: Some(70 << 30),
            mem_total_bytes: Some(80 << 30),
            nvlink_tx_kib: Some(1 << 40),
            nvlink_rx_kib: Some(3),
            nvlink_tx_per_link_kib: Some(vec![1, 2, 3]),
            nvlink_rx_per_link_kib: None,
            pcie_tx_kib_per_s: Some(2_000_000),
            pcie_rx_kib_per_s: Some(u32::MAX),
            temperature_c: Some(61.0),
            power_mw: Some(412_500),
            sm_clock_mhz: Some(1980),
            mem_clock_mhz: Some(2619),
            throttle_reasons: Some(u64::MAX),
            ecc_corrected: Some(0),
            ecc_uncorrected: Some(1),
            xid: Some(79),
            health: Health::Degraded,
            job_id: Some("job-1".into()),
            worker: Some("rank-0".into()),
            mem_phase: Some(MemPhase::Checkpoint),
            mig_mode: Some(true),
        }
    }

    /// The batch as Arrow's own builders make it from the accepted rows (how the sink
    /// built GPU columns before rows were packed), nulling what validation nulls.
    fn expected(rows: &[GpuSample]) -> RecordBatch {
        fn prim<T: ArrowPrimitiveType>(v: impl Iterator<Item = Option<T::Native>>) -> ArrayRef {
            let mut b = PrimitiveBuilder::<T>::new();
            b.extend(v);
            Arc::new(b.finish())
        }
        fn dict<'a>(v: impl Iterator<Item = Option<&'a str>>) -> ArrayRef {
            let mut b = StringDictionaryBuilder::<Int32Type>::new();
            b.extend(v);
            Arc::new(b.finish())
        }
        fn links<'a>(v: impl Iterator<Item = Option<&'a Vec<u64>>>) -> ArrayRef {
            let mut b = ListBuilder::new(UInt64Builder::new()).with_field(link_item_field());
            for l in v {
                match l {
                    Some(l) => {
                        b.values().append_slice(l);
                        b.append(true);
                    }
                    None => b.append_null(),
                }
            }
            Arc::new(b.finish())
        }
        let pct = |v: Option<f32>, max: f32| v.filter(|v| v.is_finite() && *v >= 0.0 && *v <= max);
        let mut f32s = Float32Builder::new();
        f32s.extend(rows.iter().map(|r| pct(r.temperature_c, MAX_TEMPERATURE_C)));
        let mut mig = BooleanBuilder::new();
        mig.extend(rows.iter().map(|r| r.mig_mode));
        let health = ["ok", "degraded", "failed"];
        let phase = ["warmup", "steady", "eval", "checkpoint"];
        let columns = vec![
            Arc::new(
                PrimitiveArray::<TimestampMicrosecondType>::from_iter_values(
                    rows.iter().map(|r| r.timestamp_us),
                )
                .with_timezone("UTC"),
            ) as ArrayRef,
            dict(rows.iter().map(|r| Some(&*r.cluster))),
            dict(rows.iter().map(|r| Some(&*r.node))),
            prim::<UInt16Type>(rows.iter().map(|r| Some(r.gpu_index))),
            dict(rows.iter().map(|r| Some(&*r.gpu_uuid))),
            dict(rows.iter().map(|r| Some(&*r.gpu_type))),
            prim::<Float32Type>(rows.iter().map(|r| pct(r.sm_util_pct, 100.0))),
            prim::<Float32Type>(rows.iter().map(|r| pct(r.mem_util_pct, 100.0))),
            prim::<UInt64Type>(rows.iter().map(|r| match r.mem_total_bytes {
                Some(t) => r.mem_used_bytes.filter(|u| *u <= t),
                None => r.mem_used_bytes,
            })),
            prim::<UInt64Type>(rows.iter().map(|r| r.mem_total_bytes)),
            prim::<UInt64Type>(rows.iter().map(|r| r.nvlink_tx_kib)),
            prim::<UInt64Type>(rows.iter().map(|r| r.nvlink_rx_kib)),
            links(rows.iter().map(|r| r.nvlink_tx_per_link_kib.as_ref())),
            links(rows.iter().map(|r| r.nvlink_rx_per_link_kib.as_ref())),
            prim::<UInt32Type>(rows.iter().map(|r| r.pcie_tx_kib_per_s)),
            prim::<UInt32Type>(rows.iter().map(|r| r.pcie_rx_kib_per_s)),
            Arc::new(f32s.finish()),
            prim::<UInt32Type>(
                rows.iter()
                    .map(|r| r.power_mw.filter(|p| *p <= MAX_POWER_MW)),
            ),
            prim::<UInt32Type>(rows.iter().map(|r| r.sm_clock_mhz)),
            prim::<UInt32Type>(rows.iter().map(|r| r.mem_clock_mhz)),
            prim::<UInt64Type>(rows.iter().map(|r| r.throttle_reasons)),
            prim::<UInt64Type>(rows.iter().map(|r| r.ecc_corrected)),
            prim::<UInt64Type>(rows.iter().map(|r| r.ecc_uncorrected)),
            prim::<UInt32Type>(rows.iter().map(|r| r.xid)),
            dict(
                rows.iter()
                    .map(|r| Some(health[health_key(r.health) as usize])),
            ),
            dict(rows.iter().map(|r| r.job_id.as_deref())),
            dict(rows.iter().map(|r| r.worker.as_deref())),
            dict(
                rows.iter()
                    .map(|r| r.mem_phase.map(|p| phase[phase_key(p) as usize])),
            ),
            Arc::new(mig.finish()),
        ];
        RecordBatch::try_new(gpu_schema(), columns).unwrap()
    }

    /// Packed rows come out as the same Arrow columns (values, nulls, dictionaries,
    /// lists) as Arrow's builders make, with the same validation counts.
    #[test]
    fn the_first_list_sizes_the_link_values_for_the_expected_rows() {
        let mut col = LinkCol::expecting(100);
        assert!(col.append(0, None));
        assert!(!col.append(1, Some(&[1; 12])));
        // Room for the 99 rows from the first list on, so no later row grows it.
        assert!(col.values.capacity() >= 99 * 12);
        assert!(col.ends.capacity() >= 100);
        assert_eq!(col.ends, [0, 12]);
        // A bucket that outgrows its estimate still takes every row.
        let mut small = LinkCol::expecting(1);
        for row in 0..5 {
            small.append(row, Some(&[row as u64; 3]));
        }
        assert_eq!(small.values.len(), 15);
        assert_eq!(small.ends, [3, 6, 9, 12, 15]);
    }

    #[test]
    fn packed_gpu_rows_make_the_same_columns_as_arrow_builders() {
        let (n1, n2): (Arc<str>, Arc<str>) = ("node-1".into(), "node-2".into());
        let mut rows = vec![full(10, &n1, 0)];
        rows.push(GpuSample {
            sm_util_pct: Some(f32::NAN),
            mem_util_pct: Some(-1.0),
            mem_used_bytes: Some(81 << 30),
            temperature_c: Some(250.0),
            power_mw: Some(MAX_POWER_MW + 1),
            nvlink_tx_per_link_kib: Some(vec![]),
            nvlink_rx_per_link_kib: Some(vec![7]),
            job_id: None,
            mem_phase: None,
            mig_mode: None,
            health: Health::Failed,
            ..full(11, &n1, 1)
        });
        // An equal string in another `Arc`, a new string, and a row with nothing measured.
        rows.push(full(12, &"node-1".into(), 2));
        rows.push(GpuSample {
            worker: Some("rank-9".into()),
            ..full(13, &n2, 3)
        });
        rows.push(GpuSample {
            timestamp_us: 14,
            cluster: "prod".into(),
            node: n2.clone(),
            gpu_uuid: "GPU-x".into(),
            gpu_type: "H100".into(),
            ..Default::default()
        });
        let accepted = rows.clone();
        // Rejected rows are counted and leave no trace.
        rows.insert(
            1,
            GpuSample {
                timestamp_us: -1,
                ..full(0, &n1, 0)
            },
        );
        rows.push(GpuSample {
            node: "".into(),
            ..full(15, &n1, 0)
        });

        let mut report = ValidationReport::default();
        let got = rows_to_batch(&rows, &mut report).unwrap();
        let want = expected(&accepted);
        assert_eq!(got.schema(), want.schema());
        for (i, (g, w)) in got.columns().iter().zip(want.columns()).enumerate() {
            assert_eq!(
                g.to_data(),
                w.to_data(),
                "column {}",
                gpu_schema().field(i).name()
            );
        }
        assert_eq!(report.rows_in, 7);
        assert_eq!(report.rows_rejected, 2);
        assert_eq!(report.rejected_count(col::TIMESTAMP, Issue::Negative), 1);
        assert_eq!(report.rejected_count(col::NODE, Issue::Empty), 1);
        assert_eq!(report.nulled_count(col::SM_UTIL_PCT, Issue::NonFinite), 1);
        assert_eq!(report.nulled_count(col::MEM_UTIL_PCT, Issue::Negative), 1);
        assert_eq!(
            report.nulled_count(col::MEM_USED_BYTES, Issue::OutOfRange),
            1
        );
        assert_eq!(
            report.nulled_count(col::TEMPERATURE_C, Issue::OutOfRange),
            1
        );
        assert_eq!(report.nulled_count(col::POWER_MW, Issue::OutOfRange), 1);
        assert_eq!(report.total_nulled(), 5);

        // The builders start over empty and can be reused.
        let mut cols = GpuColumns::new(0);
        for r in &accepted[..2] {
            cols.push(r, &mut report);
        }
        cols.finish().unwrap();
        for r in &accepted {
            cols.push(r, &mut report);
        }
        let again = cols.finish().unwrap();
        assert_eq!(std::mem::size_of::<PackedGpu>(), 136);

        // Columns null in every row (and more than 64 rows: several bitmap words).
        let sparse: Vec<GpuSample> = (0..130)
            .map(|i| GpuSample {
                xid: None,
                nvlink_tx_per_link_kib: None,
                job_id: (i % 3 == 0).then(|| "job-2".into()),
                mig_mode: (i % 5 == 0).then_some(i % 2 == 0),
                ..full(i, &n1, 0)
            })
            .collect();
        let sparse_got = rows_to_batch(&sparse, &mut report).unwrap();
        let sparse_want = expected(&sparse);
        for (i, (g, w)) in sparse_got
            .columns()
            .iter()
            .zip(sparse_want.columns())
            .enumerate()
        {
            assert_eq!(
                g.to_data(),
                w.to_data(),
                "column {}",
                gpu_schema().field(i).name()
            );
        }
        for (g, w) in again.columns().iter().zip(want.columns()) {
            assert_eq!(g.to_data(), w.to_data());
        }
    }
}
