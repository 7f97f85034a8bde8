//! The telemetry data model: Rust row types and their Arrow schemas.
//!
//! Three kinds of rows are recorded, each with its own schema and its own partition
//! (`kind=gpu|node|step`):
//!
//! | kind | row type | one row per |
//! |---|---|---|
//! | `gpu` | [`GpuSample`] | GPU and sampling tick |
//! | `node` | [`NodeSample`] | node and sampling tick |
//! | `step` | [`StepProfile`] | job, training step and phase |
//!
//! Design decisions:
//!
//! * **Timestamps** are `Timestamp(Microsecond, "UTC")`, microseconds since the Unix epoch.
//! * **Repeated strings** (cluster, node, uuid, GPU type, job, health, phase) are Arrow
//!   `Dictionary(Int32, Utf8)` columns; in Parquet they are stored `PLAIN` and ZSTD folds
//!   a value that repeats on every row to a few bits (Parquet's own dictionary encoding
//!   would hash every value again; see [`crate::writer`]). In the row types they are
//!   `Arc<str>`, so a sampler clones a pointer, not a string, per row.
//! * **Every measured value is nullable.** NVML refuses some queries on some devices
//!   (power on a MIG instance, ECC on a consumer board, NVLink on a PCIe card); a refused
//!   query is a null, never an error and never a made-up zero. Identity columns
//!   (timestamp, cluster, node, GPU index/uuid/type, health) are required.
//! * **Counters are cumulative** (`nvlink_*_kib`, ECC counts, node network bytes):
//!   rates are derived by the reader, which survives missed samples and restarts
//!   (a counter that goes down has been reset). PCIe throughput is the rate NVML gives.
//! * **Values are stored in the unit the source measures them in** (schema version 2):
//!   NVLink counters in KiB and PCIe rates in KiB/s (NVML's units), power in integer
//!   milliwatts (`nvmlDeviceGetPowerUsage`). Version 1 stored NVLink counters and PCIe
//!   rates in bytes and power as `f32` watts: the conversions kept 10 always-zero bits in
//!   every counter delta and filled the float mantissa, about 1.5 bytes/row for nothing.
//! * **Versioning.** Every file stores [`SCHEMA_VERSION`] under [`META_SCHEMA_VERSION`] in
//!   the Parquet key-value metadata; readers refuse (report and skip) files from a newer
//!   version. Additive changes (a new nullable column) bump the version. Version 2
//!   changed the units of the GPU schema (above): `gpu` files of version 1 are refused
//!   with [`crate::TelemetryError::SchemaVersion`] (reported and skipped, never misread);
//!   `node` and `step` files are unchanged and read in both versions.

use std::sync::{Arc, OnceLock};

use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};

/// Version of the schemas in this module, stored in every file's key-value metadata.
pub const SCHEMA_VERSION: u32 = 2;
/// Oldest version of each kind this build reads (the GPU schema changed units in 2).
pub const fn oldest_readable_version(kind: TelemetryKind) -> u32 {
    match kind {
        TelemetryKind::Gpu => 2,
        TelemetryKind::Node | TelemetryKind::Step => 1,
    }
}
/// Key-value metadata key holding [`SCHEMA_VERSION`].
pub const META_SCHEMA_VERSION: &str = "marshal.telemetry.schema_version";
/// Key-value metadata key holding the [`TelemetryKind`] (`gpu`, `node`, `step`).
pub const META_KIND: &str = "marshal.telemetry.kind";
/// Key-value metadata key holding the partition path the file was written to.
pub const META_PARTITION: &str = "marshal.telemetry.partition";
/// Key-value metadata key, on files written by `compact`, listing the merged files.
pub const META_COMPACTED_FROM: &str = "marshal.telemetry.compacted_from";
/// Key-value metadata key holding the ZSTD level the file's pages were compressed at
/// (readers need no level; it records the size/speed trade-off the writer chose).
pub const META_ZSTD_LEVEL: &str = "marshal.telemetry.zstd_level";

/// Column names, shared by the schemas, the writer settings and the reader's filters.
pub mod col {
    #![allow(missing_docs)]
    pub const TIMESTAMP: &str = "timestamp";
    pub const CLUSTER: &str = "cluster";
    pub const NODE: &str = "node";
    pub const GPU_INDEX: &str = "gpu_index";
    pub const GPU_UUID: &str = "gpu_uuid";
    pub const GPU_TYPE: &str = "gpu_type";
    pub const SM_UTIL_PCT: &str = "sm_util_pct";
    pub const MEM_UTIL_PCT: &str = "mem_util_pct";
    pub const MEM_USED_BYTES: &str = "mem_used_bytes";
    pub const MEM_TOTAL_BYTES: &str = "mem_total_bytes";
    pub const NVLINK_TX_KIB: &str = "nvlink_tx_kib";
    pub const NVLINK_RX_KIB: &str = "nvlink_rx_kib";
    pub const NVLINK_TX_PER_LINK_KIB: &str = "nvlink_tx_per_link_kib";
    pub const NVLINK_RX_PER_LINK_KIB: &str = "nvlink_rx_per_link_kib";
    pub const PCIE_TX_KIB_PER_S: &str = "pcie_tx_kib_per_s";
    pub const PCIE_RX_KIB_PER_S: &str = "pcie_rx_kib_per_s";
    pub const TEMPERATURE_C: &str = "temperature_c";
    pub const POWER_MW: &str = "power_mw";
    pub const SM_CLOCK_MHZ: &str = "sm_clock_mhz";
    pub const MEM_CLOCK_MHZ: &str = "mem_clock_mhz";
    pub const THROTTLE_REASONS: &str = "throttle_reasons";
    pub const ECC_CORRECTED: &str = "ecc_corrected";
    pub const ECC_UNCORRECTED: &str = "ecc_uncorrected";
    pub const XID: &str = "xid";
    pub const HEALTH: &str = "health";
    pub const JOB_ID: &str = "job_id";
    pub const WORKER: &str = "worker";
    pub const MEM_PHASE: &str = "mem_phase";
    pub const MIG_MODE: &str = "mig_mode";
    // node samples
    pub const NET_PORTS: &str = "net_ports";
    pub const PORT: &str = "port";
    pub const TX_BYTES: &str = "tx_bytes";
    pub const RX_BYTES: &str = "rx_bytes";
    pub const HOST_MEM_USED_BYTES: &str = "host_mem_used_bytes";
    pub const HOST_MEM_TOTAL_BYTES: &str = "host_mem_total_bytes";
    pub const CPU_UTIL_PCT: &str = "cpu_util_pct";
    // step profiles
    pub const STEP: &str = "step";
    pub const STEP_TIME_S: &str = "step_time_s";
    pub const PHASE: &str = "phase";
    pub const PEAK_MEM_BYTES: &str = "peak_mem_bytes";
    pub const NUM_GPUS: &str = "num_gpus";
    pub const PLACEMENT: &str = "placement";
    pub const MODEL: &str = "model";
    pub const BATCH_SIZE: &str = "batch_size";
    pub const COMM: &str = "comm";
    pub const SPAN: &str = "span";
    pub const TENANTS: &str = "tenants";
    pub const GPU_UTIL_PCT: &str = "gpu_util_pct";
}

/// Which schema (and which top-level partition) a file belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TelemetryKind {
    /// Per-GPU samples ([`GpuSample`]).
    Gpu,
    /// Per-node samples ([`NodeSample`]).
    Node,
    /// Per-job step profiles ([`StepProfile`]).
    Step,
}

impl TelemetryKind {
    /// All kinds, in partition order.
    pub const ALL: [TelemetryKind; 3] =
        [TelemetryKind::Gpu, TelemetryKind::Node, TelemetryKind::Step];

    /// The partition value (`kind=<this>`).
    pub fn as_str(self) -> &'static str {
        match self {
            TelemetryKind::Gpu => "gpu",
            TelemetryKind::Node => "node",
            TelemetryKind::Step => "step",
        }
    }

    /// Parses a partition value.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// The Arrow schema of this kind.
    pub fn schema(self) -> SchemaRef {
        match self {
            TelemetryKind::Gpu => gpu_schema(),
            TelemetryKind::Node => node_schema(),
            TelemetryKind::Step => step_schema(),
        }
    }
}

impl std::fmt::Display for TelemetryKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A GPU's health as judged by its sampler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Health {
    /// Working normally.
    #[default]
    Ok,
    /// Working, but slowed or erroring (hardware throttling, a non-fatal XID).
    Degraded,
    /// Not usable (fell off the bus, uncorrectable ECC errors, a fatal XID).
    Failed,
}

impl Health {
    /// The stored string.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Ok => "ok",
            Health::Degraded => "degraded",
            Health::Failed => "failed",
        }
    }

    /// Parses a stored string.
    pub fn parse(s: &str) -> Option<Self> {
        [Health::Ok, Health::Degraded, Health::Failed]
            .into_iter()
            .find(|h| h.as_str() == s)
    }
}

/// The memory phase of a training job, as reported by the job (or inferred).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MemPhase {
    /// Start-up: compiling, allocating, filling caches.
    Warmup,
    /// Regular training steps.
    Steady,
    /// Evaluation passes.
    Eval,
    /// Writing a checkpoint.
    Checkpoint,
}

impl MemPhase {
    /// All phases.
    pub const ALL: [MemPhase; 4] = [
        MemPhase::Warmup,
        MemPhase::Steady,
        MemPhase::Eval,
        MemPhase::Checkpoint,
    ];

    /// The stored string.
    pub fn as_str(self) -> &'static str {
        match self {
            MemPhase::Warmup => "warmup",
            MemPhase::Steady => "steady",
            MemPhase::Eval => "eval",
            MemPhase::Checkpoint => "checkpoint",
        }
    }

    /// Parses a stored string.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

/// One sample of one GPU.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GpuSample {
    /// Microseconds since the Unix epoch (UTC).
    pub timestamp_us: i64,
    /// Cluster name.
    pub cluster: Arc<str>,
    /// Node (host) name.
    pub node: Arc<str>,
    /// NVML device index on the node.
    pub gpu_index: u16,
    /// NVML UUID (`GPU-…`, or `MIG-…` for a MIG instance).
    pub gpu_uuid: Arc<str>,
    /// Product name (`NVIDIA H100 80GB HBM3`).
    pub gpu_type: Arc<str>,
    /// Percent of time a kernel was running, 0–100.
    pub sm_util_pct: Option<f32>,
    /// Percent of time device memory was being read or written, 0–100.
    pub mem_util_pct: Option<f32>,
    /// Device memory allocated, bytes.
    pub mem_used_bytes: Option<u64>,
    /// Device memory installed, bytes.
    pub mem_total_bytes: Option<u64>,
    /// NVLink KiB (1024 bytes, NVML's unit) sent since the counter started, all links.
    pub nvlink_tx_kib: Option<u64>,
    /// NVLink KiB received since the counter started, all links.
    pub nvlink_rx_kib: Option<u64>,
    /// NVLink KiB sent, per link (index = link id).
    pub nvlink_tx_per_link_kib: Option<Vec<u64>>,
    /// NVLink KiB received, per link (index = link id).
    pub nvlink_rx_per_link_kib: Option<Vec<u64>>,
    /// PCIe send throughput, KiB per second (NVML's unit).
    pub pcie_tx_kib_per_s: Option<u32>,
    /// PCIe receive throughput, KiB per second.
    pub pcie_rx_kib_per_s: Option<u32>,
    /// GPU die temperature, °C.
    pub temperature_c: Option<f32>,
    /// Board power draw, milliwatts (NVML's unit).
    pub power_mw: Option<u32>,
    /// SM clock, MHz.
    pub sm_clock_mhz: Option<u32>,
    /// Memory clock, MHz.
    pub mem_clock_mhz: Option<u32>,
    /// NVML clock throttle reason bitmask (`nvmlClocksThrottleReason*`).
    pub throttle_reasons: Option<u64>,
    /// Corrected ECC errors since the driver loaded (volatile).
    pub ecc_corrected: Option<u64>,
    /// Uncorrected ECC errors since the driver loaded (volatile).
    pub ecc_uncorrected: Option<u64>,
    /// The last critical XID event seen on this GPU, if any.
    pub xid: Option<u32>,
    /// Health as judged by the sampler.
    pub health: Health,
    /// The job using the GPU, if any.
    pub job_id: Option<Arc<str>>,
    /// The job's worker (rank / pod) on this GPU, if known.
    pub worker: Option<Arc<str>>,
    /// The job's memory phase, if known.
    pub mem_phase: Option<MemPhase>,
    /// Whether MIG mode is enabled.
    pub mig_mode: Option<bool>,
}

/// Counters of one network port of a node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NetPort {
    /// Port (interface) name, e.g. `ib0`, `eth0`, `mlx5_0:1`.
    pub port: Arc<str>,
    /// Bytes sent since the counter started.
    pub tx_bytes: u64,
    /// Bytes received since the counter started.
    pub rx_bytes: u64,
}

/// One sample of one node.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeSample {
    /// Microseconds since the Unix epoch (UTC).
    pub timestamp_us: i64,
    /// Cluster name.
    pub cluster: Arc<str>,
    /// Node (host) name.
    pub node: Arc<str>,
    /// Per-port network counters; `None` when not collected.
    pub net_ports: Option<Vec<NetPort>>,
    /// Host memory in use, bytes.
    pub host_mem_used_bytes: Option<u64>,
    /// Host memory installed, bytes.
    pub host_mem_total_bytes: Option<u64>,
    /// CPU utilisation over all cores, 0–100.
    pub cpu_util_pct: Option<f32>,
}

/// The measured profile of one training step (or of one phase of a step).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepProfile {
    /// When the step ended, microseconds since the Unix epoch (UTC).
    pub timestamp_us: i64,
    /// The job.
    pub job_id: Arc<str>,
    /// Step number.
    pub step: u64,
    /// Wall time of the step, seconds (finite, > 0).
    pub step_time_s: f64,
    /// The memory phase the step was in.
    pub phase: Option<MemPhase>,
    /// Peak device memory per GPU during the step (phase), bytes.
    pub peak_mem_bytes: Option<u64>,
    /// GPU product name.
    pub gpu_type: Arc<str>,
    /// Number of GPUs the job ran on.
    pub num_gpus: u32,
    /// Placement shape, e.g. `2x4` (2 nodes × 4 GPUs).
    pub placement: Arc<str>,
    /// What the job trains (a workload kind, e.g. `ResNet-50 (batch size 64)`).
    pub model: Option<Arc<str>>,
    /// Global batch size.
    pub batch_size: Option<u32>,
    /// Communication pattern (`none`, `data-parallel`, `tensor-parallel`, …).
    pub comm: Option<Arc<str>>,
    /// Widest topology level the job's GPUs span (`gpu`, `nvlink-island`, `node`,
    /// `rack`, `spine`, `cluster`).
    pub span: Option<Arc<str>>,
    /// Most jobs sharing any one of the job's GPUs, the job included.
    pub tenants: Option<u16>,
    /// Mean SM utilisation of the job's GPUs during the step, 0–100.
    pub gpu_util_pct: Option<f32>,
}

fn dict() -> DataType {
    DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
}

fn timestamp_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

/// The item field of the per-link counter lists.
pub(crate) fn link_item_field() -> Arc<Field> {
    Arc::new(Field::new("item", DataType::UInt64, false))
}

pub(crate) fn port_fields() -> Fields {
    Fields::from(vec![
        Field::new(col::PORT, DataType::Utf8, false),
        Field::new(col::TX_BYTES, DataType::UInt64, false),
        Field::new(col::RX_BYTES, DataType::UInt64, false),
    ])
}

pub(crate) fn port_item_field() -> Arc<Field> {
    Arc::new(Field::new("item", DataType::Struct(port_fields()), false))
}

fn with_version(fields: Vec<Field>, kind: TelemetryKind) -> SchemaRef {
    let meta: std::collections::HashMap<String, String> = [
        (META_SCHEMA_VERSION.to_string(), SCHEMA_VERSION.to_string()),
        (META_KIND.to_string(), kind.as_str().to_string()),
    ]
    .into_iter()
    .collect();
    Arc::new(Schema::new_with_metadata(fields, meta))
}

/// Schema of [`GpuSample`] rows.
pub fn gpu_schema() -> SchemaRef {
    static S: OnceLock<SchemaRef> = OnceLock::new();
    S.get_or_init(|| {
        use DataType::*;
        let fields = vec![
            Field::new(col::TIMESTAMP, timestamp_type(), false),
            Field::new(col::CLUSTER, dict(), false),
            Field::new(col::NODE, dict(), false),
            Field::new(col::GPU_INDEX, UInt16, false),
            Field::new(col::GPU_UUID, dict(), false),
            Field::new(col::GPU_TYPE, dict(), false),
            Field::new(col::SM_UTIL_PCT, Float32, true),
            Field::new(col::MEM_UTIL_PCT, Float32, true),
            Field::new(col::MEM_USED_BYTES, UInt64, true),
            Field::new(col::MEM_TOTAL_BYTES, UInt64, true),
            Field::new(col::NVLINK_TX_KIB, UInt64, true),
            Field::new(col::NVLINK_RX_KIB, UInt64, true),
            Field::new(col::NVLINK_TX_PER_LINK_KIB, List(link_item_field()), true),
            Field::new(col::NVLINK_RX_PER_LINK_KIB, List(link_item_field()), true),
            Field::new(col::PCIE_TX_KIB_PER_S, UInt32, true),
            Field::new(col::PCIE_RX_KIB_PER_S, UInt32, true),
            Field::new(col::TEMPERATURE_C, Float32, true),
            Field::new(col::POWER_MW, UInt32, true),
            Field::new(col::SM_CLOCK_MHZ, UInt32, true),
            Field::new(col::MEM_CLOCK_MHZ, UInt32, true),
            Field::new(col::THROTTLE_REASONS, UInt64, true),
            Field::new(col::ECC_CORRECTED, UInt64, true),
            Field::new(col::ECC_UNCORRECTED, UInt64, true),
            Field::new(col::XID, UInt32, true),
            Field::new(col::HEALTH, dict(), false),
            Field::new(col::JOB_ID, dict(), true),
            Field::new(col::WORKER, dict(), true),
            Field::new(col::MEM_PHASE, dict(), true),
            Field::new(col::MIG_MODE, Boolean, true),
        ];
        with_version(fields, TelemetryKind::Gpu)
    })
    .clone()
}

/// Schema of [`NodeSample`] rows.
pub fn node_schema() -> SchemaRef {
    static S: OnceLock<SchemaRef> = OnceLock::new();
    S.get_or_init(|| {
        use DataType::*;
        let fields = vec![
            Field::new(col::TIMESTAMP, timestamp_type(), false),
            Field::new(col::CLUSTER, dict(), false),
            Field::new(col::NODE, dict(), false),
            Field::new(col::NET_PORTS, List(port_item_field()), true),
            Field::new(col::HOST_MEM_USED_BYTES, UInt64, true),
            Field::new(col::HOST_MEM_TOTAL_BYTES, UInt64, true),
            Field::new(col::CPU_UTIL_PCT, Float32, true),
        ];
        with_version(fields, TelemetryKind::Node)
    })
    .clone()
}

/// Schema of [`StepProfile`] rows.
pub fn step_schema() -> SchemaRef {
    static S: OnceLock<SchemaRef> = OnceLock::new();
    S.get_or_init(|| {
        use DataType::*;
        let fields = vec![
            Field::new(col::TIMESTAMP, timestamp_type(), false),
            Field::new(col::JOB_ID, dict(), false),
            Field::new(col::STEP, UInt64, false),
            Field::new(col::STEP_TIME_S, Float64, false),
            Field::new(col::PHASE, dict(), true),
            Field::new(col::PEAK_MEM_BYTES, UInt64, true),
            Field::new(col::GPU_TYPE, dict(), false),
            Field::new(col::NUM_GPUS, UInt32, false),
            Field::new(col::PLACEMENT, dict(), false),
            Field::new(col::MODEL, dict(), true),
            Field::new(col::BATCH_SIZE, UInt32, true),
            Field::new(col::COMM, dict(), true),
            Field::new(col::SPAN, dict(), true),
            Field::new(col::TENANTS, UInt16, true),
            Field::new(col::GPU_UTIL_PCT, Float32, true),
        ];
        with_version(fields, TelemetryKind::Step)
    })
    .clone()
}
