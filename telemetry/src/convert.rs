//! Conversion between row types and Arrow record batches.
//!
//! [`Record`] is implemented by [`GpuSample`], [`NodeSample`] and [`StepProfile`]. Rows go
//! in through [`Record::to_batch`], which validates every value (see [`crate::validate`])
//! and drops or nulls what is broken, and come out through [`Record::from_batch`], which
//! accepts string columns either dictionary encoded or plain. The builders behind
//! `to_batch` are shared with the sink, which appends to them row by row.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int32Type, TimestampMicrosecondType, UInt16Type, UInt32Type,
    UInt64Type,
};
use arrow_array::{Array, ArrayRef, ArrowPrimitiveType, PrimitiveArray, RecordBatch, StringArray};
use arrow_schema::{DataType, SchemaRef};

use crate::batch::GpuBatch;
use crate::columns::rows_to_batch;
use crate::error::{Result, TelemetryError};
use crate::schema::{
    GpuSample, Health, MemPhase, NetPort, NodeSample, StepProfile, TelemetryKind, col,
};
use crate::validate::ValidationReport;

/// A telemetry row type with an Arrow schema.
pub trait Record: Sized + Send + 'static {
    /// The kind (schema and partition) of this row type.
    const KIND: TelemetryKind;

    /// The Arrow schema.
    fn schema() -> SchemaRef {
        Self::KIND.schema()
    }

    /// Time of the row, microseconds since the Unix epoch.
    fn timestamp_us(&self) -> i64;

    /// The node the row belongs to, for `node=` partitioning; `None` for per-job rows.
    fn node(&self) -> Option<&Arc<str>>;

    /// Order of rows inside one file (e.g. GPU then time), chosen for compression.
    fn file_order(&self, other: &Self) -> Ordering;

    /// The columns [`Self::file_order`] sorts by, outermost first.
    fn sort_columns() -> &'static [&'static str];

    /// The outermost sort key of [`Self::file_order`] as a small integer (the GPU index
    /// for GPU samples, 0 otherwise): writers bucket rows by it instead of sorting them.
    fn bucket(&self) -> u32 {
        0
    }

    /// Converts rows into a record batch, validating them; rejected rows are left out and
    /// counted in `report` together with every nulled value.
    fn to_batch<'a, I>(rows: I, report: &mut ValidationReport) -> Result<RecordBatch>
    where
        I: IntoIterator<Item = &'a Self>;

    /// Converts a record batch with this kind's columns back into rows.
    fn from_batch(batch: &RecordBatch) -> Result<Vec<Self>>;
}

/// Read access to a string column stored either as `Utf8` or `Dictionary(_, Utf8)`.
enum StrCol<'a> {
    Plain(&'a StringArray),
    Dict {
        keys: &'a PrimitiveArray<Int32Type>,
        values: Vec<Arc<str>>,
    },
}

impl<'a> StrCol<'a> {
    fn new(batch: &'a RecordBatch, name: &str) -> Result<Self> {
        let array = column(batch, name)?;
        match array.data_type() {
            DataType::Utf8 => Ok(StrCol::Plain(array.as_string::<i32>())),
            DataType::Dictionary(k, v) if **k == DataType::Int32 && **v == DataType::Utf8 => {
                let dict = array.as_dictionary::<Int32Type>();
                let values = dict.values().as_string::<i32>();
                let values = (0..values.len())
                    .map(|i| {
                        Arc::from(if values.is_null(i) {
                            ""
                        } else {
                            values.value(i)
                        })
                    })
                    .collect();
                Ok(StrCol::Dict {
                    keys: dict.keys(),
                    values,
                })
            }
            other => Err(TelemetryError::schema(
                "record batch",
                format!("column {name} has type {other}, expected a string column"),
            )),
        }
    }

    fn get(&self, i: usize) -> Option<Arc<str>> {
        match self {
            StrCol::Plain(a) => (!a.is_null(i)).then(|| Arc::from(a.value(i))),
            StrCol::Dict { keys, values } => {
                if keys.is_null(i) {
                    None
                } else {
                    values.get(keys.value(i) as usize).cloned()
                }
            }
        }
    }

    fn required(&self, i: usize, name: &str) -> Result<Arc<str>> {
        self.get(i).ok_or_else(|| {
            TelemetryError::schema("record batch", format!("null in required column {name}"))
        })
    }
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef> {
    batch
        .column_by_name(name)
        .ok_or_else(|| TelemetryError::schema("record batch", format!("missing column {name}")))
}

fn prim<'a, T: ArrowPrimitiveType>(
    batch: &'a RecordBatch,
    name: &str,
) -> Result<&'a PrimitiveArray<T>> {
    column(batch, name)?.as_primitive_opt::<T>().ok_or_else(|| {
        TelemetryError::schema(
            "record batch",
            format!(
                "column {name} has type {}, expected {}",
                batch
                    .column_by_name(name)
                    .map(|c| c.data_type().to_string())
                    .unwrap_or_default(),
                T::DATA_TYPE
            ),
        )
    })
}

#[inline]
fn opt<T: ArrowPrimitiveType>(a: &PrimitiveArray<T>, i: usize) -> Option<T::Native> {
    (!a.is_null(i)).then(|| a.value(i))
}

/// A value of a column the schema declares non-null. Arrow keeps a value under a null,
/// usually 0; a file written by another tool may hold nulls there, and reading them as 0
/// would date a row to 1970 (and `compact` would write that and delete the input).
fn req<T: ArrowPrimitiveType>(a: &PrimitiveArray<T>, i: usize, name: &str) -> Result<T::Native> {
    opt(a, i).ok_or_else(|| {
        TelemetryError::schema("record batch", format!("null in required column {name}"))
    })
}

fn u64_lists(batch: &RecordBatch, name: &str) -> Result<Vec<Option<Vec<u64>>>> {
    let list = column(batch, name)?.as_list_opt::<i32>().ok_or_else(|| {
        TelemetryError::schema("record batch", format!("column {name} is not a list"))
    })?;
    let values = list
        .values()
        .as_primitive_opt::<UInt64Type>()
        .ok_or_else(|| {
            TelemetryError::schema(
                "record batch",
                format!("column {name} is not a list of UInt64"),
            )
        })?;
    let offsets = list.value_offsets();
    (0..list.len())
        .map(|i| {
            if list.is_null(i) {
                return Ok(None);
            }
            let items = offsets[i] as usize..offsets[i + 1] as usize;
            // The schema's items are not nullable; another tool's file may still hold a
            // null, and its buffer slot would read as a zero counter.
            if items.clone().any(|j| values.is_null(j)) {
                return Err(TelemetryError::schema(
                    "record batch",
                    format!("null item in list column {name}"),
                ));
            }
            Ok(Some(values.values()[items].to_vec()))
        })
        .collect()
}

fn enum_col<T>(
    col: &StrCol<'_>,
    i: usize,
    name: &str,
    parse: fn(&str) -> Option<T>,
) -> Result<Option<T>> {
    match col.get(i) {
        None => Ok(None),
        Some(s) => parse(&s).map(Some).ok_or_else(|| {
            TelemetryError::schema(
                "record batch",
                format!("unknown value {s:?} in column {name}"),
            )
        }),
    }
}

impl Record for GpuSample {
    const KIND: TelemetryKind = TelemetryKind::Gpu;

    fn timestamp_us(&self) -> i64 {
        self.timestamp_us
    }

    fn node(&self) -> Option<&Arc<str>> {
        Some(&self.node)
    }

    fn file_order(&self, other: &Self) -> Ordering {
        (self.gpu_index, self.timestamp_us).cmp(&(other.gpu_index, other.timestamp_us))
    }

    fn sort_columns() -> &'static [&'static str] {
        &[col::GPU_INDEX, col::TIMESTAMP]
    }

    fn bucket(&self) -> u32 {
        u32::from(self.gpu_index)
    }

    fn to_batch<'a, I>(rows: I, report: &mut ValidationReport) -> Result<RecordBatch>
    where
        I: IntoIterator<Item = &'a Self>,
    {
        rows_to_batch(rows, report)
    }

    fn from_batch(batch: &RecordBatch) -> Result<Vec<Self>> {
        let ts = prim::<TimestampMicrosecondType>(batch, col::TIMESTAMP)?;
        let cluster = StrCol::new(batch, col::CLUSTER)?;
        let node = StrCol::new(batch, col::NODE)?;
        let gpu_index = prim::<UInt16Type>(batch, col::GPU_INDEX)?;
        let uuid = StrCol::new(batch, col::GPU_UUID)?;
        let gpu_type = StrCol::new(batch, col::GPU_TYPE)?;
        let sm_util = prim::<Float32Type>(batch, col::SM_UTIL_PCT)?;
        let mem_util = prim::<Float32Type>(batch, col::MEM_UTIL_PCT)?;
        let mem_used = prim::<UInt64Type>(batch, col::MEM_USED_BYTES)?;
        let mem_total = prim::<UInt64Type>(batch, col::MEM_TOTAL_BYTES)?;
        let nv_tx = prim::<UInt64Type>(batch, col::NVLINK_TX_KIB)?;
        let nv_rx = prim::<UInt64Type>(batch, col::NVLINK_RX_KIB)?;
        let nv_tx_links = u64_lists(batch, col::NVLINK_TX_PER_LINK_KIB)?;
        let nv_rx_links = u64_lists(batch, col::NVLINK_RX_PER_LINK_KIB)?;
        let pcie_tx = prim::<UInt32Type>(batch, col::PCIE_TX_KIB_PER_S)?;
        let pcie_rx = prim::<UInt32Type>(batch, col::PCIE_RX_KIB_PER_S)?;
        let temperature = prim::<Float32Type>(batch, col::TEMPERATURE_C)?;
        let power = prim::<UInt32Type>(batch, col::POWER_MW)?;
        let sm_clock = prim::<UInt32Type>(batch, col::SM_CLOCK_MHZ)?;
        let mem_clock = prim::<UInt32Type>(batch, col::MEM_CLOCK_MHZ)?;
        let throttle = prim::<UInt64Type>(batch, col::THROTTLE_REASONS)?;
        let ecc_c = prim::<UInt64Type>(batch, col::ECC_CORRECTED)?;
        let ecc_u = prim::<UInt64Type>(batch, col::ECC_UNCORRECTED)?;
        let xid = prim::<UInt32Type>(batch, col::XID)?;
        let health = StrCol::new(batch, col::HEALTH)?;
        let job = StrCol::new(batch, col::JOB_ID)?;
        let worker = StrCol::new(batch, col::WORKER)?;
        let phase = StrCol::new(batch, col::MEM_PHASE)?;
        let mig = column(batch, col::MIG_MODE)?
            .as_boolean_opt()
            .ok_or_else(|| {
                TelemetryError::schema(
                    "record batch",
                    format!("column {} is not boolean", col::MIG_MODE),
                )
            })?;

        let mut out = Vec::with_capacity(batch.num_rows());
        for (i, (tx_links, rx_links)) in nv_tx_links.into_iter().zip(nv_rx_links).enumerate() {
            out.push(GpuSample {
                timestamp_us: req(ts, i, col::TIMESTAMP)?,
                cluster: cluster.required(i, col::CLUSTER)?,
                node: node.required(i, col::NODE)?,
                gpu_index: req(gpu_index, i, col::GPU_INDEX)?,
                gpu_uuid: uuid.required(i, col::GPU_UUID)?,
                gpu_type: gpu_type.required(i, col::GPU_TYPE)?,
                sm_util_pct: opt(sm_util, i),
                mem_util_pct: opt(mem_util, i),
                mem_used_bytes: opt(mem_used, i),
                mem_total_bytes: opt(mem_total, i),
                nvlink_tx_kib: opt(nv_tx, i),
                nvlink_rx_kib: opt(nv_rx, i),
                nvlink_tx_per_link_kib: tx_links,
                nvlink_rx_per_link_kib: rx_links,
                pcie_tx_kib_per_s: opt(pcie_tx, i),
                pcie_rx_kib_per_s: opt(pcie_rx, i),
                temperature_c: opt(temperature, i),
                power_mw: opt(power, i),
                sm_clock_mhz: opt(sm_clock, i),
                mem_clock_mhz: opt(mem_clock, i),
                throttle_reasons: opt(throttle, i),
                ecc_corrected: opt(ecc_c, i),
                ecc_uncorrected: opt(ecc_u, i),
                xid: opt(xid, i),
                health: enum_col(&health, i, col::HEALTH, Health::parse)?.ok_or_else(|| {
                    TelemetryError::schema("record batch", "null in required column health")
                })?,
                job_id: job.get(i),
                worker: worker.get(i),
                mem_phase: enum_col(&phase, i, col::MEM_PHASE, MemPhase::parse)?,
                mig_mode: (!mig.is_null(i)).then(|| mig.value(i)),
            });
        }
        Ok(out)
    }
}

impl Record for NodeSample {
    const KIND: TelemetryKind = TelemetryKind::Node;

    fn timestamp_us(&self) -> i64 {
        self.timestamp_us
    }

    fn node(&self) -> Option<&Arc<str>> {
        Some(&self.node)
    }

    fn file_order(&self, other: &Self) -> Ordering {
        self.timestamp_us.cmp(&other.timestamp_us)
    }

    fn sort_columns() -> &'static [&'static str] {
        &[col::TIMESTAMP]
    }

    fn to_batch<'a, I>(rows: I, report: &mut ValidationReport) -> Result<RecordBatch>
    where
        I: IntoIterator<Item = &'a Self>,
    {
        rows_to_batch(rows, report)
    }

    fn from_batch(batch: &RecordBatch) -> Result<Vec<Self>> {
        let ts = prim::<TimestampMicrosecondType>(batch, col::TIMESTAMP)?;
        let cluster = StrCol::new(batch, col::CLUSTER)?;
        let node = StrCol::new(batch, col::NODE)?;
        let ports = column(batch, col::NET_PORTS)?
            .as_list_opt::<i32>()
            .ok_or_else(|| {
                TelemetryError::schema("record batch", "column net_ports is not a list")
            })?;
        let port_struct = ports.values().as_struct_opt().ok_or_else(|| {
            TelemetryError::schema("record batch", "net_ports items are not structs")
        })?;
        let bad =
            || TelemetryError::schema("record batch", "net_ports struct has unexpected fields");
        let names = port_struct
            .column_by_name(col::PORT)
            .and_then(|c| c.as_string_opt::<i32>())
            .ok_or_else(bad)?;
        let txs = port_struct
            .column_by_name(col::TX_BYTES)
            .and_then(|c| c.as_primitive_opt::<UInt64Type>())
            .ok_or_else(bad)?;
        let rxs = port_struct
            .column_by_name(col::RX_BYTES)
            .and_then(|c| c.as_primitive_opt::<UInt64Type>())
            .ok_or_else(bad)?;
        let offsets = ports.value_offsets();
        let used = prim::<UInt64Type>(batch, col::HOST_MEM_USED_BYTES)?;
        let total = prim::<UInt64Type>(batch, col::HOST_MEM_TOTAL_BYTES)?;
        let cpu = prim::<Float32Type>(batch, col::CPU_UTIL_PCT)?;
        let mut port_names: HashMap<&str, Arc<str>> = HashMap::new();
        let mut out = Vec::with_capacity(batch.num_rows());
        for i in 0..batch.num_rows() {
            let net_ports = if ports.is_null(i) {
                None
            } else {
                let items = offsets[i] as usize..offsets[i + 1] as usize;
                let mut list = Vec::with_capacity(items.len());
                for j in items {
                    // Fields the schema declares not nullable; a null would read as "" or 0.
                    let null = [
                        (col::PORT, names.is_null(j)),
                        (col::TX_BYTES, txs.is_null(j)),
                        (col::RX_BYTES, rxs.is_null(j)),
                    ]
                    .into_iter()
                    .find(|(_, null)| *null);
                    if let Some((field, _)) = null {
                        return Err(TelemetryError::schema(
                            "record batch",
                            format!("null {field} in an item of list column {}", col::NET_PORTS),
                        ));
                    }
                    let name = names.value(j);
                    let port = port_names
                        .entry(name)
                        .or_insert_with(|| Arc::from(name))
                        .clone();
                    list.push(NetPort {
                        port,
                        tx_bytes: txs.value(j),
                        rx_bytes: rxs.value(j),
                    });
                }
                Some(list)
            };
            out.push(NodeSample {
                timestamp_us: req(ts, i, col::TIMESTAMP)?,
                cluster: cluster.required(i, col::CLUSTER)?,
                node: node.required(i, col::NODE)?,
                net_ports,
                host_mem_used_bytes: opt(used, i),
                host_mem_total_bytes: opt(total, i),
                cpu_util_pct: opt(cpu, i),
            });
        }
        Ok(out)
    }
}

impl Record for StepProfile {
    const KIND: TelemetryKind = TelemetryKind::Step;

    fn timestamp_us(&self) -> i64 {
        self.timestamp_us
    }

    fn node(&self) -> Option<&Arc<str>> {
        None
    }

    fn file_order(&self, other: &Self) -> Ordering {
        (&*self.job_id, self.step, self.timestamp_us).cmp(&(
            &*other.job_id,
            other.step,
            other.timestamp_us,
        ))
    }

    fn sort_columns() -> &'static [&'static str] {
        &[col::JOB_ID, col::STEP, col::TIMESTAMP]
    }

    fn to_batch<'a, I>(rows: I, report: &mut ValidationReport) -> Result<RecordBatch>
    where
        I: IntoIterator<Item = &'a Self>,
    {
        rows_to_batch(rows, report)
    }

    fn from_batch(batch: &RecordBatch) -> Result<Vec<Self>> {
        let ts = prim::<TimestampMicrosecondType>(batch, col::TIMESTAMP)?;
        let job = StrCol::new(batch, col::JOB_ID)?;
        let step = prim::<UInt64Type>(batch, col::STEP)?;
        let step_time = prim::<Float64Type>(batch, col::STEP_TIME_S)?;
        let phase = StrCol::new(batch, col::PHASE)?;
        let peak = prim::<UInt64Type>(batch, col::PEAK_MEM_BYTES)?;
        let gpu_type = StrCol::new(batch, col::GPU_TYPE)?;
        let num_gpus = prim::<UInt32Type>(batch, col::NUM_GPUS)?;
        let placement = StrCol::new(batch, col::PLACEMENT)?;
        let model = StrCol::new(batch, col::MODEL)?;
        let batch_size = prim::<UInt32Type>(batch, col::BATCH_SIZE)?;
        let comm = StrCol::new(batch, col::COMM)?;
        let span = StrCol::new(batch, col::SPAN)?;
        let tenants = prim::<UInt16Type>(batch, col::TENANTS)?;
        let gpu_util = prim::<Float32Type>(batch, col::GPU_UTIL_PCT)?;
        (0..batch.num_rows())
            .map(|i| {
                Ok(StepProfile {
                    timestamp_us: req(ts, i, col::TIMESTAMP)?,
                    job_id: job.required(i, col::JOB_ID)?,
                    step: req(step, i, col::STEP)?,
                    step_time_s: req(step_time, i, col::STEP_TIME_S)?,
                    phase: enum_col(&phase, i, col::PHASE, MemPhase::parse)?,
                    peak_mem_bytes: opt(peak, i),
                    gpu_type: gpu_type.required(i, col::GPU_TYPE)?,
                    num_gpus: req(num_gpus, i, col::NUM_GPUS)?,
                    placement: placement.required(i, col::PLACEMENT)?,
                    model: model.get(i),
                    batch_size: opt(batch_size, i),
                    comm: comm.get(i),
                    span: span.get(i),
                    tenants: opt(tenants, i),
                    gpu_util_pct: opt(gpu_util, i),
                })
            })
            .collect()
    }
}

/// Rows of any kind, as carried by the sink's channel.
#[derive(Debug, Clone, PartialEq)]
pub enum Records {
    /// Per-GPU samples.
    Gpu(Vec<GpuSample>),
    /// Per-GPU samples with interned strings ([`GpuBatch`]): the cheaper intake.
    GpuBatch(GpuBatch),
    /// Per-node samples.
    Node(Vec<NodeSample>),
    /// Step profiles.
    Step(Vec<StepProfile>),
}

impl Records {
    /// Number of rows.
    pub fn len(&self) -> usize {
        match self {
            Records::Gpu(v) => v.len(),
            Records::GpuBatch(b) => b.len(),
            Records::Node(v) => v.len(),
            Records::Step(v) => v.len(),
        }
    }

    /// `true` when there are no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The kind of the rows.
    pub fn kind(&self) -> TelemetryKind {
        match self {
            Records::Gpu(_) | Records::GpuBatch(_) => TelemetryKind::Gpu,
            Records::Node(_) => TelemetryKind::Node,
            Records::Step(_) => TelemetryKind::Step,
        }
    }
}

impl From<Vec<GpuSample>> for Records {
    fn from(v: Vec<GpuSample>) -> Self {
        Records::Gpu(v)
    }
}

impl From<GpuBatch> for Records {
    fn from(b: GpuBatch) -> Self {
        Records::GpuBatch(b)
    }
}

impl From<Vec<NodeSample>> for Records {
    fn from(v: Vec<NodeSample>) -> Self {
        Records::Node(v)
    }
}

impl From<Vec<StepProfile>> for Records {
    fn from(v: Vec<StepProfile>) -> Self {
        Records::Step(v)
    }
}
