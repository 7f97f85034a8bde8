//! The live GPU source, through NVML (`nvml-wrapper`).
//!
//! NVML is loaded at run time (`libnvidia-ml.so.1`), so this crate builds and runs on
//! machines without a GPU: [`NvmlSource::open`] then returns
//! [`TelemetryError::NvmlUnavailable`] with the loader's reason.
//!
//! What each field comes from:
//!
//! | field | NVML |
//! |---|---|
//! | `sm_util_pct`, `mem_util_pct` | `nvmlDeviceGetUtilizationRates` |
//! | `mem_used_bytes`, `mem_total_bytes` | `nvmlDeviceGetMemoryInfo` |
//! | `nvlink_*_per_link_kib`, `nvlink_*_kib` | per active link, `nvmlDeviceGetNvLinkUtilizationCounter` (counter 0) when that counter's control is set to count **bytes**, stored in KiB (the cumulative count divided by 1024, rounded down: the counters advance in KiB steps, and flooring a cumulative value never accumulates error); where the counters are refused (Hopper and newer), the field values `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX` per link (`scopeId` = link; cumulative KiB); the totals are the sum over links |
//! | `pcie_*_kib_per_s` | `nvmlDeviceGetPcieThroughput` (KiB/s, as NVML gives it) |
//! | `temperature_c` | `nvmlDeviceGetTemperature(GPU)` |
//! | `power_mw` | `nvmlDeviceGetPowerUsage` (mW, as NVML gives it) |
//! | `sm_clock_mhz`, `mem_clock_mhz` | `nvmlDeviceGetClockInfo(SM / MEM)` |
//! | `throttle_reasons` | `nvmlDeviceGetCurrentClocksThrottleReasons` |
//! | `ecc_corrected`, `ecc_uncorrected` | `nvmlDeviceGetTotalEccErrors(…, VOLATILE)` |
//! | `xid` | critical-XID events, collected by a background thread on an event set |
//! | `mig_mode` | `nvmlDeviceGetMigMode` (current) |
//! | `gpu_uuid`, `gpu_type` | `nvmlDeviceGetUUID`, `nvmlDeviceGetName` |
//!
//! A query a device refuses (`NOT_SUPPORTED`, a symbol missing from an old driver, no
//! permission) yields a null, and is not asked again for that device. Any other failure
//! yields a null for this sample only and is counted in [`NvmlSource::query_errors`].
//! A device that cannot be reached at all (`GPU_LOST`) is reported with health `failed`.
//!
//! Hopper and newer GPUs no longer support the NVLink utilisation counters; their
//! replacement needs a per-link `scopeId`, which `nvml-wrapper` 0.13 cannot set, so
//! `nvml/fields.rs` makes that one call itself. A GPU that fell off the bus (its handle
//! still valid, its queries answering `GPU_IS_LOST`) is written with health `failed`.
//!
//! Everything here with more than one GPU, NVLink or MIG is tested against the fake
//! driver in `telemetry/fake-nvml`, not on hardware.
//!
//! `job_id`, `worker` and `mem_phase` are not known to NVML: the agent sets them with
//! [`NvmlSource::annotate`].

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, TemperatureSensor, TopologyLevel,
};
use nvml_wrapper::enum_wrappers::nv_link::UtilizationCountUnit;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::enums::nv_link::Counter;
use nvml_wrapper::error::NvmlError;
use serde::{Deserialize, Serialize};

use crate::error::{Result, TelemetryError};
use crate::schema::{GpuSample, Health, MemPhase};
use crate::source::Source;

mod fields;

/// Most NVLinks a GPU has (`NVML_NVLINK_MAX_LINKS`).
const MAX_NVLINKS: u32 = 18;
/// XIDs after which a GPU should not be used until it is reset or replaced
/// (double-bit ECC, micro-controller halt, page-retirement failure, NVLink error, fallen
/// off the bus, uncontained ECC, GSP errors, unrecovered ECC).
const FATAL_XIDS: &[u32] = &[48, 62, 64, 74, 79, 95, 119, 120, 140];
/// A non-fatal XID marks the GPU degraded for this long.
const XID_DEGRADED_FOR: Duration = Duration::from_secs(300);

/// Settings of the NVML source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlConfig {
    /// Cluster name written into every sample.
    pub cluster: String,
    /// Node name written into every sample (defaults to the host name).
    pub node: String,
    /// Load NVML from this path instead of the system default.
    pub lib_path: Option<PathBuf>,
    /// Watch critical-XID events on a background thread.
    pub watch_xid: bool,
}

impl Default for NvmlConfig {
    fn default() -> Self {
        Self {
            cluster: "default".into(),
            node: hostname(),
            lib_path: None,
            watch_xid: true,
        }
    }
}

/// The host name, from the kernel (`/proc/sys/kernel/hostname`), else `$HOSTNAME`.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

/// What the agent knows about a GPU's use that NVML does not.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuAnnotation {
    /// The job using the GPU.
    pub job_id: Option<Arc<str>>,
    /// The job's worker on the GPU.
    pub worker: Option<Arc<str>>,
    /// The job's memory phase.
    pub mem_phase: Option<MemPhase>,
}

#[derive(Debug, Clone)]
struct DeviceInfo {
    index: u32,
    uuid: Arc<str>,
    name: Arc<str>,
    pci_bus_id: String,
    memory_total: u64,
    /// Links that exist on the device (0 when NVLink is not supported).
    links: u32,
}

/// The live NVML source. See the [module docs](self).
pub struct NvmlSource {
    nvml: Nvml,
    cluster: Arc<str>,
    node: Arc<str>,
    devices: Vec<DeviceInfo>,
    annotations: HashMap<u32, GpuAnnotation>,
    /// (device, query) pairs the device refused; not asked again.
    unsupported: HashSet<(u32, &'static str)>,
    query_errors: u64,
    xid: Option<XidWatcher>,
    /// Per GPU index: the episodes in which it could not be reached (warned once each).
    unreachable: HashMap<u32, crate::episodes::Episode>,
}

impl std::fmt::Debug for NvmlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlSource")
            .field("cluster", &self.cluster)
            .field("node", &self.node)
            .field("devices", &self.devices)
            .field("unsupported", &self.unsupported.len())
            .field("query_errors", &self.query_errors)
            .finish()
    }
}

fn init(lib_path: Option<&PathBuf>) -> std::result::Result<Nvml, NvmlError> {
    match lib_path {
        Some(p) => Nvml::builder().lib_path(OsStr::new(p.as_os_str())).init(),
        None => Nvml::init(),
    }
}

/// `true` for errors that mean "this device will never answer this query".
fn is_permanent(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::NotSupported
            | NvmlError::FunctionNotFound
            | NvmlError::FailedToLoadSymbol(_)
            | NvmlError::NoPermission
            | NvmlError::InvalidArg
    )
}

/// The queries of one GPU in one sample: refusals become `None` and are remembered for
/// the device, other failures are counted, and a GPU that has fallen off the bus is
/// noted so that the row says so.
struct Queries<'a> {
    unsupported: &'a mut HashSet<(u32, &'static str)>,
    errors: &'a mut u64,
    gpu: u32,
    lost: bool,
}

impl Queries<'_> {
    /// Whether this GPU refused `what` for good.
    fn refused(&self, what: &'static str) -> bool {
        self.unsupported.contains(&(self.gpu, what))
    }

    fn ask<T>(
        &mut self,
        what: &'static str,
        f: impl FnOnce() -> std::result::Result<T, NvmlError>,
    ) -> Option<T> {
        if self.refused(what) {
            return None;
        }
        match f() {
            Ok(v) => Some(v),
            Err(e) if is_permanent(&e) => {
                self.unsupported.insert((self.gpu, what));
                None
            }
            Err(e) => {
                *self.errors += 1;
                self.lost |= matches!(e, NvmlError::GpuLost);
                tracing::debug!("NVML {what} on GPU {}: {e}", self.gpu);
                None
            }
        }
    }
}

/// Per-link cumulative NVLink KiB `(tx, rx)` from the utilisation counters, when
/// counter 0 counts bytes; a counter set to cycles or packets is refused as
/// `NotSupported` (not a traffic figure, and not ours to reconfigure). Inactive links
/// read 0.
fn nvlink_counters_kib(
    d: &nvml_wrapper::Device<'_>,
    active: &[bool],
) -> std::result::Result<(Vec<u64>, Vec<u64>), NvmlError> {
    let mut tx = Vec::with_capacity(active.len());
    let mut rx = Vec::with_capacity(active.len());
    for (l, &up) in (0u32..).zip(active) {
        if !up {
            tx.push(0);
            rx.push(0);
            continue;
        }
        let link = d.link_wrapper_for(l);
        if link.utilization_control(Counter::Zero)?.units != UtilizationCountUnit::Bytes {
            return Err(NvmlError::NotSupported);
        }
        let c = link.utilization_counter(Counter::Zero)?;
        tx.push(c.send / 1024);
        rx.push(c.receive / 1024);
    }
    Ok((tx, rx))
}

/// Per-link cumulative NVLink KiB `(tx, rx)` from Hopper's field values; inactive links
/// read 0.
fn nvlink_fields_kib(
    nvml: &Nvml,
    d: &nvml_wrapper::Device<'_>,
    active: &[bool],
) -> std::result::Result<(Vec<u64>, Vec<u64>), NvmlError> {
    let up: Vec<u32> = (0u32..)
        .zip(active)
        .filter(|(_, a)| **a)
        .map(|(l, _)| l)
        .collect();
    let (up_tx, up_rx) = fields::nvlink_throughput_kib(nvml, d, &up)?;
    let mut tx = vec![0; active.len()];
    let mut rx = vec![0; active.len()];
    for (k, &l) in up.iter().enumerate() {
        tx[l as usize] = up_tx[k];
        rx[l as usize] = up_rx[k];
    }
    Ok((tx, rx))
}

impl NvmlSource {
    /// Opens NVML with default settings.
    pub fn open() -> Result<Self> {
        Self::open_with(NvmlConfig::default())
    }

    /// Opens NVML.
    pub fn open_with(config: NvmlConfig) -> Result<Self> {
        let nvml = init(config.lib_path.as_ref()).map_err(|e| {
            TelemetryError::NvmlUnavailable(format!(
                "cannot load or initialise NVML{}: {e} (is the NVIDIA driver installed and \
                 libnvidia-ml.so.1 on the library path?)",
                config
                    .lib_path
                    .as_ref()
                    .map(|p| format!(" from {}", p.display()))
                    .unwrap_or_default()
            ))
        })?;
        let count = nvml.device_count().map_err(|e| TelemetryError::Nvml {
            call: "device_count",
            source: e,
        })?;
        let mut devices = Vec::with_capacity(count as usize);
        for index in 0..count {
            let info = match nvml.device_by_index(index) {
                Ok(d) => DeviceInfo {
                    index,
                    uuid: d
                        .uuid()
                        .unwrap_or_else(|_| format!("GPU-UNKNOWN-{index}"))
                        .into(),
                    name: d.name().unwrap_or_else(|_| "unknown".into()).into(),
                    pci_bus_id: d.pci_info().map(|p| p.bus_id).unwrap_or_default(),
                    memory_total: d.memory_info().map(|m| m.total).unwrap_or(0),
                    links: (0..MAX_NVLINKS)
                        .take_while(|&l| d.link_wrapper_for(l).is_active().is_ok())
                        .count() as u32,
                },
                Err(e) => {
                    tracing::warn!("NVML: GPU {index} unreachable at open: {e}");
                    DeviceInfo {
                        index,
                        uuid: format!("GPU-UNKNOWN-{index}").into(),
                        name: "unknown".into(),
                        pci_bus_id: String::new(),
                        memory_total: 0,
                        links: 0,
                    }
                }
            };
            devices.push(info);
        }
        let xid = config
            .watch_xid
            .then(|| XidWatcher::spawn(config.lib_path.clone()));
        Ok(Self {
            nvml,
            cluster: config.cluster.into(),
            node: config.node.into(),
            devices,
            annotations: HashMap::new(),
            unsupported: HashSet::new(),
            query_errors: 0,
            unreachable: HashMap::new(),
            xid,
        })
    }

    /// Number of GPUs.
    pub fn device_count(&self) -> usize {
        self.devices.len()
    }

    /// Queries that failed transiently so far.
    pub fn query_errors(&self) -> u64 {
        self.query_errors
    }

    /// Sets (or with `None` clears) what the agent knows about GPU `index`.
    pub fn annotate(&mut self, index: u32, annotation: Option<GpuAnnotation>) {
        match annotation {
            Some(a) => {
                self.annotations.insert(index, a);
            }
            None => {
                self.annotations.remove(&index);
            }
        }
    }

    /// Samples every GPU now.
    pub fn sample_at(&mut self, now_us: i64) -> Vec<GpuSample> {
        let xids = self.xid.as_ref().map(|w| w.snapshot()).unwrap_or_default();
        let mut out = Vec::with_capacity(self.devices.len());
        for info in &self.devices {
            let i = info.index;
            let ann = self.annotations.get(&i).cloned().unwrap_or_default();
            let mut s = GpuSample {
                timestamp_us: now_us,
                cluster: self.cluster.clone(),
                node: self.node.clone(),
                gpu_index: i as u16,
                gpu_uuid: info.uuid.clone(),
                gpu_type: info.name.clone(),
                mem_total_bytes: (info.memory_total > 0).then_some(info.memory_total),
                job_id: ann.job_id,
                worker: ann.worker,
                mem_phase: ann.mem_phase,
                ..Default::default()
            };
            let d = match self.nvml.device_by_index(i) {
                Ok(d) => {
                    if let Some(ticks) = self.unreachable.entry(i).or_default().succeeded() {
                        tracing::warn!("NVML: GPU {i} reachable again after {ticks} samples");
                    }
                    d
                }
                Err(e) => {
                    if self.unreachable.entry(i).or_default().failed() {
                        tracing::warn!(
                            "NVML: GPU {i} unreachable: {e} (said once until it is back)"
                        );
                    }
                    s.health = Health::Failed;
                    out.push(s);
                    continue;
                }
            };
            let mut q = Queries {
                unsupported: &mut self.unsupported,
                errors: &mut self.query_errors,
                gpu: i,
                lost: false,
            };
            if let Some(u) = q.ask("utilization", || d.utilization_rates()) {
                s.sm_util_pct = Some(u.gpu as f32);
                s.mem_util_pct = Some(u.memory as f32);
            }
            if let Some(m) = q.ask("memory", || d.memory_info()) {
                s.mem_used_bytes = Some(m.used);
                s.mem_total_bytes = Some(m.total);
            }
            s.pcie_tx_kib_per_s = q.ask("pcie_tx", || d.pcie_throughput(PcieUtilCounter::Send));
            s.pcie_rx_kib_per_s = q.ask("pcie_rx", || d.pcie_throughput(PcieUtilCounter::Receive));
            s.temperature_c = q
                .ask("temperature", || d.temperature(TemperatureSensor::Gpu))
                .map(|t| t as f32);
            s.power_mw = q.ask("power", || d.power_usage());
            s.sm_clock_mhz = q.ask("sm_clock", || d.clock_info(Clock::SM));
            s.mem_clock_mhz = q.ask("mem_clock", || d.clock_info(Clock::Memory));
            let throttle = q.ask("throttle", || d.current_throttle_reasons());
            s.throttle_reasons = throttle.map(|t| t.bits());
            s.ecc_corrected = q.ask("ecc_corrected", || {
                d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
            });
            s.ecc_uncorrected = q.ask("ecc_uncorrected", || {
                d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            });
            s.mig_mode = q.ask("mig_mode", || d.mig_mode()).map(|m| m.current == 1);

            // NVLink: the utilisation counters where they count bytes, else Hopper's
            // per-link field values; null when the GPU offers neither.
            // A link whose state cannot be read (a lost GPU) is not an idle link: then
            // the row has no NVLink figures at all.
            let active = (info.links > 0)
                .then(|| {
                    q.ask("nvlink_state", || {
                        (0..info.links)
                            .map(|l| d.link_wrapper_for(l).is_active())
                            .collect::<std::result::Result<Vec<bool>, _>>()
                    })
                })
                .flatten();
            if let Some(active) = active {
                // Field values only where the counters are refused for good, so that one
                // GPU's cumulative series never switches source after a passing error.
                let per_link = q
                    .ask("nvlink_counters", || nvlink_counters_kib(&d, &active))
                    .or_else(|| {
                        q.refused("nvlink_counters")
                            .then(|| {
                                q.ask("nvlink_fields", || {
                                    nvlink_fields_kib(&self.nvml, &d, &active)
                                })
                            })
                            .flatten()
                    });
                if let Some((tx, rx)) = per_link {
                    s.nvlink_tx_kib = Some(tx.iter().sum());
                    s.nvlink_rx_kib = Some(rx.iter().sum());
                    s.nvlink_tx_per_link_kib = Some(tx);
                    s.nvlink_rx_per_link_kib = Some(rx);
                }
            }
            let lost = q.lost;

            let event = xids.get(&*info.uuid).copied();
            s.xid = event.map(|(x, _)| x);
            s.health = if lost {
                // Fallen off the bus: every query fails until the GPU is reset.
                Health::Failed
            } else {
                judge_health(
                    throttle,
                    s.ecc_uncorrected,
                    event.map(|(x, at)| (x, at.elapsed())),
                )
            };
            out.push(s);
        }
        out
    }

    /// Discovers how the GPUs are connected (PCIe level of every pair, NVLink peers).
    pub fn discover_topology(&self) -> Result<DiscoveredTopology> {
        let dev = |i: u32| {
            self.nvml
                .device_by_index(i)
                .map_err(|e| TelemetryError::Nvml {
                    call: "device_by_index",
                    source: e,
                })
        };
        let gpus = self
            .devices
            .iter()
            .map(|d| {
                Ok(DiscoveredGpu {
                    index: d.index,
                    uuid: d.uuid.to_string(),
                    name: d.name.to_string(),
                    memory_total: d.memory_total,
                    pci_bus_id: d.pci_bus_id.clone(),
                    mig_mode: in_mig_mode(&dev(d.index)?)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut pcie = Vec::new();
        for a in 0..self.devices.len() as u32 {
            for b in a + 1..self.devices.len() as u32 {
                let level = dev(a)?
                    .topology_common_ancestor(dev(b)?)
                    .map(Level::from)
                    .unwrap_or(Level::System);
                pcie.push(GpuPair { a, b, level });
            }
        }
        let mut peers = Vec::new();
        for d in &self.devices {
            let device = dev(d.index)?;
            for l in 0..d.links {
                let link = device.link_wrapper_for(l);
                if !matches!(link.is_active(), Ok(true)) {
                    continue;
                }
                if let Ok(remote) = link.remote_pci_info() {
                    peers.push(NvlinkPeer {
                        gpu: d.index,
                        link: l,
                        remote_pci_bus_id: remote.bus_id,
                        remote_gpu: None,
                    });
                }
            }
        }
        Ok(DiscoveredTopology::assemble(gpus, pcie, peers))
    }

    /// The MIG devices of every GPU in MIG mode (none for a GPU without MIG support or
    /// with MIG off). A device whose name holds no profile NVML can be read as is
    /// skipped with a warning; it cannot be matched to a demand.
    pub fn mig_instances(&self) -> Result<Vec<crate::mig::MigInstance>> {
        let nvml_err = |call| move |e| TelemetryError::Nvml { call, source: e };
        let mut out = Vec::new();
        for d in &self.devices {
            let device = self
                .nvml
                .device_by_index(d.index)
                .map_err(nvml_err("device_by_index"))?;
            if !in_mig_mode(&device)? {
                continue;
            }
            let slots = device
                .mig_device_count()
                .map_err(nvml_err("mig_device_count"))?;
            for slot in 0..slots {
                // Slots without an instance answer NotFound.
                let Ok(mig) = device.mig_device_by_index(slot) else {
                    continue;
                };
                let uuid = mig.uuid().map_err(nvml_err("mig uuid"))?;
                let name = mig.name().unwrap_or_default();
                let parsed = crate::mig::parse_profile(&name).and_then(|(profile, c, gb)| {
                    Some((profile, c, crate::mig::memory_slices(gb, d.memory_total)?))
                });
                match parsed {
                    Some((profile, compute, memory)) => out.push(crate::mig::MigInstance {
                        gpu: d.index,
                        uuid,
                        profile,
                        compute,
                        memory,
                    }),
                    None => {
                        tracing::warn!(gpu = d.index, %uuid, %name, "MIG device without a readable profile; not handed out")
                    }
                }
            }
        }
        Ok(out)
    }
}

/// Whether `device` is in MIG mode now; false for a GPU without MIG (its refusal is
/// permanent), an error when the mode cannot be read for the time being.
fn in_mig_mode(device: &nvml_wrapper::Device<'_>) -> Result<bool> {
    match device.mig_mode() {
        Ok(m) => Ok(m.current == 1),
        Err(e) if is_permanent(&e) => Ok(false),
        Err(e) => Err(TelemetryError::Nvml {
            call: "mig_mode",
            source: e,
        }),
    }
}

impl Source for NvmlSource {
    fn sample(&mut self, now_us: i64) -> Result<Vec<GpuSample>> {
        Ok(self.sample_at(now_us))
    }
}

/// Health from what NVML reports: a fatal XID or an uncorrected ECC error since the
/// driver loaded → failed; hardware or thermal throttling, or a recent non-fatal XID →
/// degraded.
pub fn judge_health(
    throttle: Option<ThrottleReasons>,
    ecc_uncorrected: Option<u64>,
    last_xid: Option<(u32, Duration)>,
) -> Health {
    if ecc_uncorrected.is_some_and(|n| n > 0)
        || last_xid.is_some_and(|(x, _)| FATAL_XIDS.contains(&x))
    {
        return Health::Failed;
    }
    let slow = ThrottleReasons::HW_SLOWDOWN
        | ThrottleReasons::HW_THERMAL_SLOWDOWN
        | ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN
        | ThrottleReasons::SW_THERMAL_SLOWDOWN;
    if throttle.is_some_and(|t| t.intersects(slow))
        || last_xid.is_some_and(|(_, ago)| ago < XID_DEGRADED_FOR)
    {
        return Health::Degraded;
    }
    Health::Ok
}

/// Collects critical XID events on its own thread (an NVML event set borrows its `Nvml`,
/// so the thread owns a second handle and the set).
struct XidWatcher {
    stop: Arc<AtomicBool>,
    last: Arc<Mutex<HashMap<String, (u32, Instant)>>>,
    handle: Option<JoinHandle<()>>,
}

impl XidWatcher {
    fn spawn(lib_path: Option<PathBuf>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let last = Arc::new(Mutex::new(HashMap::new()));
        let (s, l) = (stop.clone(), last.clone());
        let handle = std::thread::Builder::new()
            .name("nvml-xid".into())
            .spawn(move || Self::run(lib_path, s, l))
            .map_err(|e| tracing::warn!("NVML: cannot start the XID watcher: {e}"))
            .ok();
        Self { stop, last, handle }
    }

    fn run(
        lib_path: Option<PathBuf>,
        stop: Arc<AtomicBool>,
        last: Arc<Mutex<HashMap<String, (u32, Instant)>>>,
    ) {
        let Ok(nvml) = init(lib_path.as_ref()) else {
            return;
        };
        let Ok(count) = nvml.device_count() else {
            return;
        };
        let Ok(mut set) = nvml.create_event_set() else {
            return;
        };
        for i in 0..count {
            let Ok(d) = nvml.device_by_index(i) else {
                continue;
            };
            match d.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                Ok(s) => set = s,
                Err(e) => {
                    // The set is gone with the error; start a fresh one for the rest.
                    tracing::debug!("NVML: no XID events for GPU {i}: {:?}", e.error);
                    match nvml.create_event_set() {
                        Ok(s) => set = s,
                        Err(_) => return,
                    }
                }
            }
        }
        while !stop.load(Ordering::Relaxed) {
            match set.wait(500) {
                Ok(ev) => {
                    if let (Some(XidError::Value(x)), Ok(uuid)) = (ev.event_data, ev.device.uuid())
                    {
                        let x = u32::try_from(x).unwrap_or(u32::MAX);
                        tracing::warn!("NVML: XID {x} on {uuid}");
                        last.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(uuid, (x, Instant::now()));
                    }
                }
                Err(NvmlError::Timeout) => {}
                Err(e) => {
                    tracing::warn!("NVML: XID watcher stopped: {e}");
                    return;
                }
            }
        }
    }

    fn snapshot(&self) -> HashMap<String, (u32, Instant)> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for XidWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// How close two GPUs are, closest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Connected by NVLink (directly or through the same NVSwitch).
    NvLink,
    /// On the same board (e.g. the two dies of a K80): `NVML_TOPOLOGY_INTERNAL`.
    SameBoard,
    /// Behind one PCIe switch.
    Single,
    /// Behind several PCIe switches, no host bridge.
    Multiple,
    /// Behind the same host bridge.
    HostBridge,
    /// Same NUMA node, different host bridges.
    Node,
    /// Different NUMA nodes (across the CPU interconnect).
    System,
}

impl From<TopologyLevel> for Level {
    fn from(l: TopologyLevel) -> Self {
        match l {
            TopologyLevel::Internal => Level::SameBoard,
            TopologyLevel::Single => Level::Single,
            TopologyLevel::Multiple => Level::Multiple,
            TopologyLevel::HostBridge => Level::HostBridge,
            TopologyLevel::Node => Level::Node,
            TopologyLevel::System => Level::System,
        }
    }
}

/// A GPU found by topology discovery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiscoveredGpu {
    /// NVML index.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// Product name.
    pub name: String,
    /// Installed memory, bytes.
    pub memory_total: u64,
    /// PCI bus id (`00000000:18:00.0`).
    pub pci_bus_id: String,
    /// Whether the GPU is in MIG mode (currently; false for a GPU without MIG).
    #[serde(default)]
    pub mig_mode: bool,
}

/// The connection level of two GPUs (`a < b`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuPair {
    /// Lower index.
    pub a: u32,
    /// Higher index.
    pub b: u32,
    /// Closest connection.
    pub level: Level,
}

/// One active NVLink and what is at its other end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvlinkPeer {
    /// GPU index.
    pub gpu: u32,
    /// Link number.
    pub link: u32,
    /// PCI bus id of the remote end (a GPU or an NVSwitch).
    pub remote_pci_bus_id: String,
    /// The remote GPU's index, when the remote end is one of this node's GPUs.
    pub remote_gpu: Option<u32>,
}

/// A node's GPU topology as NVML sees it. Plain data: the scheduler converts it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiscoveredTopology {
    /// The GPUs.
    pub gpus: Vec<DiscoveredGpu>,
    /// Every pair of GPUs, with its closest connection.
    pub pairs: Vec<GpuPair>,
    /// Every active NVLink.
    pub nvlink_peers: Vec<NvlinkPeer>,
}

impl DiscoveredTopology {
    /// Combines the PCIe levels with the NVLink peers: two GPUs linked directly, or
    /// linked to the same remote device (an NVSwitch), are at [`Level::NvLink`].
    pub fn assemble(
        gpus: Vec<DiscoveredGpu>,
        pcie: Vec<GpuPair>,
        mut peers: Vec<NvlinkPeer>,
    ) -> Self {
        let norm = |s: &str| s.trim().to_ascii_lowercase();
        let by_bus: HashMap<String, u32> = gpus
            .iter()
            .map(|g| (norm(&g.pci_bus_id), g.index))
            .collect();
        for p in &mut peers {
            p.remote_gpu = by_bus.get(&norm(&p.remote_pci_bus_id)).copied();
        }
        let mut remotes: HashMap<u32, HashSet<String>> = HashMap::new();
        for p in &peers {
            remotes
                .entry(p.gpu)
                .or_default()
                .insert(norm(&p.remote_pci_bus_id));
        }
        let bus = |i: u32| {
            gpus.iter()
                .find(|g| g.index == i)
                .map(|g| norm(&g.pci_bus_id))
        };
        let pairs = pcie
            .into_iter()
            .map(|mut pair| {
                let ra = remotes.get(&pair.a);
                let rb = remotes.get(&pair.b);
                let direct = ra.zip(bus(pair.b)).is_some_and(|(r, b)| r.contains(&b))
                    || rb.zip(bus(pair.a)).is_some_and(|(r, a)| r.contains(&a));
                let shared = ra.zip(rb).is_some_and(|(x, y)| !x.is_disjoint(y));
                if direct || shared {
                    pair.level = Level::NvLink;
                }
                pair
            })
            .collect();
        Self {
            gpus,
            pairs,
            nvlink_peers: peers,
        }
    }

    /// The level between two GPUs, in either order.
    pub fn level(&self, a: u32, b: u32) -> Option<Level> {
        let (a, b) = (a.min(b), a.max(b));
        self.pairs
            .iter()
            .find(|p| p.a == a && p.b == b)
            .map(|p| p.level)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_rules() {
        assert_eq!(judge_health(None, None, None), Health::Ok);
        assert_eq!(
            judge_health(Some(ThrottleReasons::GPU_IDLE), Some(0), None),
            Health::Ok
        );
        assert_eq!(
            judge_health(Some(ThrottleReasons::HW_THERMAL_SLOWDOWN), Some(0), None),
            Health::Degraded
        );
        assert_eq!(judge_health(None, Some(2), None), Health::Failed);
        assert_eq!(
            judge_health(None, None, Some((79, Duration::from_secs(9999)))),
            Health::Failed
        );
        assert_eq!(
            judge_health(None, None, Some((13, Duration::from_secs(10)))),
            Health::Degraded
        );
        assert_eq!(
            judge_health(None, None, Some((13, Duration::from_secs(9999)))),
            Health::Ok
        );
    }

    fn gpu(i: u32, bus: &str) -> DiscoveredGpu {
        DiscoveredGpu {
            index: i,
            uuid: format!("GPU-{i}"),
            name: "H100".into(),
            memory_total: 80 << 30,
            pci_bus_id: bus.into(),
            mig_mode: false,
        }
    }

    #[test]
    fn topology_assembly_marks_nvlink_pairs() {
        let gpus = vec![
            gpu(0, "0000:18:00.0"),
            gpu(1, "0000:2A:00.0"),
            gpu(2, "0000:3A:00.0"),
        ];
        let pcie = vec![
            GpuPair {
                a: 0,
                b: 1,
                level: Level::Single,
            },
            GpuPair {
                a: 0,
                b: 2,
                level: Level::System,
            },
            GpuPair {
                a: 1,
                b: 2,
                level: Level::System,
            },
        ];
        let peers = vec![
            // 0 — 1 directly (bus id case differs).
            NvlinkPeer {
                gpu: 0,
                link: 0,
                remote_pci_bus_id: "0000:2a:00.0".into(),
                remote_gpu: None,
            },
            // 1 and 2 through the same switch.
            NvlinkPeer {
                gpu: 1,
                link: 1,
                remote_pci_bus_id: "0000:C0:00.0".into(),
                remote_gpu: None,
            },
            NvlinkPeer {
                gpu: 2,
                link: 0,
                remote_pci_bus_id: "0000:c0:00.0".into(),
                remote_gpu: None,
            },
        ];
        let t = DiscoveredTopology::assemble(gpus, pcie, peers);
        assert_eq!(t.level(1, 0), Some(Level::NvLink));
        assert_eq!(t.level(0, 2), Some(Level::System));
        assert_eq!(t.level(1, 2), Some(Level::NvLink));
        assert_eq!(t.nvlink_peers[0].remote_gpu, Some(1));
        assert_eq!(t.nvlink_peers[1].remote_gpu, None);
        let json = serde_json::to_string(&t).unwrap();
        assert!(json.contains("\"nv_link\""), "{json}");
        let back: DiscoveredTopology = serde_json::from_str(&json).unwrap();
        assert_eq!(back, t);
    }
}
