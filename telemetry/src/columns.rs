//! Column builders: rows are validated and appended to Arrow builders one at a time.
//!
//! The sink buffers incoming rows directly in these builders (one set per GPU, see
//! [`RowGroupBuffer`]), so a row is touched once, dropped right away, and the row group
//! is assembled without sorting or copying rows. [`crate::Record::to_batch`] uses the
//! same builders.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, ListBuilder, StringBuilder, StructBuilder, UInt64Builder,
};
use arrow_array::types::{
    Float32Type, Float64Type, Int32Type, TimestampMicrosecondType, UInt16Type, UInt32Type,
    UInt64Type,
};
use arrow_array::{
    ArrayRef, ArrowPrimitiveType, DictionaryArray, PrimitiveArray, RecordBatch, StringArray,
};
use arrow_buffer::{NullBuffer, ScalarBuffer};
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

/// Builds a `Dictionary(Int32, Utf8)` column, remembering the previous value so a string
/// that repeats row after row (the normal case) costs a pointer comparison.
struct DictBuilder {
    keys: Col<Int32Type>,
    values: Vec<Arc<str>>,
    index: HashMap<Arc<str>, i32>,
    last: Option<(Arc<str>, i32)>,
}

impl DictBuilder {
    fn new(capacity: usize) -> Self {
        Self {
            keys: Col::with_capacity(capacity),
            values: Vec::new(),
            index: HashMap::new(),
            last: None,
        }
    }

    #[inline]
    fn append(&mut self, v: &Arc<str>) {
        if let Some((last, key)) = &self.last
            && (Arc::ptr_eq(last, v) || **last == **v)
        {
            self.keys.append_value(*key);
            return;
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
        let values = StringArray::from_iter_values(self.values.iter().map(|s| &**s));
        self.values.clear();
        self.index.clear();
        self.last = None;
        let dict = DictionaryArray::<Int32Type>::try_new(keys, Arc::new(values))
            .map_err(|e| TelemetryError::arrow("building a dictionary column", e))?;
        Ok(Arc::new(dict))
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

/// Builders of the [`GpuSample`] columns.
pub(crate) struct GpuColumns {
    len: usize,
    ts: Col<TimestampMicrosecondType>,
    cluster: DictBuilder,
    node: DictBuilder,
    gpu_index: Col<UInt16Type>,
    uuid: DictBuilder,
    gpu_type: DictBuilder,
    sm_util: Col<Float32Type>,
    mem_util: Col<Float32Type>,
    mem_used: Col<UInt64Type>,
    mem_total: Col<UInt64Type>,
    nv_tx: Col<UInt64Type>,
    nv_rx: Col<UInt64Type>,
    nv_tx_links: ListBuilder<UInt64Builder>,
    nv_rx_links: ListBuilder<UInt64Builder>,
    pcie_tx: Col<UInt32Type>,
    pcie_rx: Col<UInt32Type>,
    temperature: Col<Float32Type>,
    power: Col<UInt32Type>,
    sm_clock: Col<UInt32Type>,
    mem_clock: Col<UInt32Type>,
    throttle: Col<UInt64Type>,
    ecc_c: Col<UInt64Type>,
    ecc_u: Col<UInt64Type>,
    xid: Col<UInt32Type>,
    health: EnumBuilder,
    job: DictBuilder,
    worker: DictBuilder,
    phase: EnumBuilder,
    mig: BooleanBuilder,
}

impl Columns<GpuSample> for GpuColumns {
    fn new(n: usize) -> Self {
        Self {
            len: 0,
            ts: Col::with_capacity(n),
            cluster: DictBuilder::new(n),
            node: DictBuilder::new(n),
            gpu_index: Col::with_capacity(n),
            uuid: DictBuilder::new(n),
            gpu_type: DictBuilder::new(n),
            sm_util: Col::with_capacity(n),
            mem_util: Col::with_capacity(n),
            mem_used: Col::with_capacity(n),
            mem_total: Col::with_capacity(n),
            nv_tx: Col::with_capacity(n),
            nv_rx: Col::with_capacity(n),
            nv_tx_links: ListBuilder::with_capacity(UInt64Builder::new(), n)
                .with_field(link_item_field()),
            nv_rx_links: ListBuilder::with_capacity(UInt64Builder::new(), n)
                .with_field(link_item_field()),
            pcie_tx: Col::with_capacity(n),
            pcie_rx: Col::with_capacity(n),
            temperature: Col::with_capacity(n),
            power: Col::with_capacity(n),
            sm_clock: Col::with_capacity(n),
            mem_clock: Col::with_capacity(n),
            throttle: Col::with_capacity(n),
            ecc_c: Col::with_capacity(n),
            ecc_u: Col::with_capacity(n),
            xid: Col::with_capacity(n),
            health: EnumBuilder::new(n, HEALTH_VALUES),
            job: DictBuilder::new(n),
            worker: DictBuilder::new(n),
            phase: EnumBuilder::new(n, PHASE_VALUES),
            mig: BooleanBuilder::with_capacity(n),
        }
    }

    fn len(&self) -> usize {
        self.len
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
        self.len += 1;
        self.ts.append_value(r.timestamp_us);
        self.cluster.append(r.cluster);
        self.node.append(r.node);
        self.gpu_index.append_value(r.gpu_index);
        self.uuid.append(r.gpu_uuid);
        self.gpu_type.append(r.gpu_type);
        self.sm_util
            .append_option(report.f32_in(col::SM_UTIL_PCT, r.sm_util_pct, 100.0));
        self.mem_util
            .append_option(report.f32_in(col::MEM_UTIL_PCT, r.mem_util_pct, 100.0));
        let used = match r.mem_total_bytes {
            Some(total) => report.at_most(col::MEM_USED_BYTES, r.mem_used_bytes, total),
            None => r.mem_used_bytes,
        };
        self.mem_used.append_option(used);
        self.mem_total.append_option(r.mem_total_bytes);
        self.nv_tx.append_option(r.nvlink_tx_kib);
        self.nv_rx.append_option(r.nvlink_rx_kib);
        for (b, v) in [
            (&mut self.nv_tx_links, r.nvlink_tx_per_link_kib),
            (&mut self.nv_rx_links, r.nvlink_rx_per_link_kib),
        ] {
            match v {
                Some(v) => {
                    b.values().append_slice(v);
                    b.append(true);
                }
                None => b.append_null(),
            }
        }
        self.pcie_tx.append_option(r.pcie_tx_kib_per_s);
        self.pcie_rx.append_option(r.pcie_rx_kib_per_s);
        self.temperature.append_option(report.f32_in(
            col::TEMPERATURE_C,
            r.temperature_c,
            MAX_TEMPERATURE_C,
        ));
        self.power
            .append_option(report.at_most(col::POWER_MW, r.power_mw, MAX_POWER_MW));
        self.sm_clock.append_option(r.sm_clock_mhz);
        self.mem_clock.append_option(r.mem_clock_mhz);
        self.throttle.append_option(r.throttle_reasons);
        self.ecc_c.append_option(r.ecc_corrected);
        self.ecc_u.append_option(r.ecc_uncorrected);
        self.xid.append_option(r.xid);
        self.health.keys.append_value(health_key(r.health));
        self.job.append_option(r.job_id);
        self.worker.append_option(r.worker);
        self.phase.keys.append_option(r.mem_phase.map(phase_key));
        self.mig.append_option(r.mig_mode);
    }

    fn finish_gpu(&mut self) -> Result<RecordBatch> {
        self.len = 0;
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.ts.finish().with_timezone("UTC")),
            self.cluster.finish()?,
            self.node.finish()?,
            Arc::new(self.gpu_index.finish()),
            self.uuid.finish()?,
            self.gpu_type.finish()?,
            Arc::new(self.sm_util.finish()),
            Arc::new(self.mem_util.finish()),
            Arc::new(self.mem_used.finish()),
            Arc::new(self.mem_total.finish()),
            Arc::new(self.nv_tx.finish()),
            Arc::new(self.nv_rx.finish()),
            Arc::new(self.nv_tx_links.finish()),
            Arc::new(self.nv_rx_links.finish()),
            Arc::new(self.pcie_tx.finish()),
            Arc::new(self.pcie_rx.finish()),
            Arc::new(self.temperature.finish()),
            Arc::new(self.power.finish()),
            Arc::new(self.sm_clock.finish()),
            Arc::new(self.mem_clock.finish()),
            Arc::new(self.throttle.finish()),
            Arc::new(self.ecc_c.finish()),
            Arc::new(self.ecc_u.finish()),
            Arc::new(self.xid.finish()),
            self.health.finish()?,
            self.job.finish()?,
            self.worker.finish()?,
            self.phase.finish()?,
            Arc::new(self.mig.finish()),
        ];
        batch(gpu_schema(), columns, "GPU sample")
    }
}

impl Columnar for GpuSample {
    type Columns = GpuColumns;

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
                cols: R::Columns::new(0),
                last: None,
                sorted: true,
                previous: 0,
            });
        }
        let bucket = &mut self.buckets[b];
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
