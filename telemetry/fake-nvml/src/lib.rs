//! A fake `libnvidia-ml.so` for tests: it exports the NVML functions Marshal's NVML
//! source calls, answering for a multi-GPU machine that the CI does not have.
//!
//! Why a fake driver rather than a trait with a mock: the code under test is the real
//! path — `nvml-wrapper` loading a shared library with `dlopen`, resolving symbols,
//! passing C structs — so a test through this library exercises the same calls, struct
//! layouts and error codes a real driver sees. What it cannot show is how a real GPU
//! behaves; the README says which parts have met hardware.
//!
//! Machines are presets ([`machine::Machine::preset`]): `dgx-a100` (8 GPUs, NVSwitch,
//! byte counters), `hgx-h100` (8 GPUs, NVSwitch, Hopper's per-link field values instead
//! of counters), `pcie-bridged` (4 GPUs in NVLink-bridged pairs, counters counting
//! cycles, one GPU in MIG mode), `a100-mig` (2 GPUs without NVLink, both in MIG mode with
//! 3g.40gb, 2g.20gb and 1g.10gb instances). A test picks one with `fake_nvml_load` (or, for a
//! process it starts, the `FAKE_NVML_MACHINE` environment variable, read at the first
//! `nvmlInit` when nothing is loaded), moves counters with `fake_nvml_advance`, and
//! injects faults with `fake_nvml_inject_xid`, `fake_nvml_lose_gpu` and
//! `fake_nvml_make_absurd` (or, with the variable above, `FAKE_NVML_ABSURD_GPU=<index>`).
//! Functions this library does not export are missing symbols, as on an old driver.

mod machine;

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nvml_wrapper_sys::bindings::{
    nvmlDevice_st, nvmlDevice_t, nvmlEnableState_t, nvmlEventData_t, nvmlEventSet_st,
    nvmlEventSet_t, nvmlFieldValue_t, nvmlGpuTopologyLevel_t, nvmlMemory_v2_t,
    nvmlNvLinkUtilizationControl_t, nvmlPciInfo_t, nvmlReturn_t, nvmlUtilization_t,
};

use machine::{Gpu, Machine, NvlinkCounters};

const SUCCESS: nvmlReturn_t = 0;
const UNINITIALIZED: nvmlReturn_t = 1;
const INVALID_ARGUMENT: nvmlReturn_t = 2;
const NOT_SUPPORTED: nvmlReturn_t = 3;
const NOT_FOUND: nvmlReturn_t = 6;
const INSUFFICIENT_SIZE: nvmlReturn_t = 7;
const DRIVER_NOT_LOADED: nvmlReturn_t = 9;
const TIMEOUT: nvmlReturn_t = 10;
const GPU_IS_LOST: nvmlReturn_t = 15;

const FI_NVLINK_THROUGHPUT_DATA_TX: c_uint = 138;
const FI_NVLINK_THROUGHPUT_DATA_RX: c_uint = 139;
const VALUE_TYPE_UNSIGNED_LONG_LONG: c_uint = 3;
const EVENT_XID_CRITICAL: c_ulonglong = 8;

struct State {
    machine: Option<Machine>,
    /// `nvmlInit` calls not yet matched by `nvmlShutdown`.
    inits: u32,
}

static STATE: Mutex<State> = Mutex::new(State {
    machine: None,
    inits: 0,
});
/// Signalled when an XID is injected, so a waiting event set wakes at once.
static XID_ARRIVED: Condvar = Condvar::new();

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

// Handles are small integers, never dereferenced: a GPU is `(index + 1) << 8`, its MIG
// device in slot `s` that plus `s + 1`.
fn gpu_handle(index: u32, mig_slot: Option<u32>) -> nvmlDevice_t {
    let base = ((index as usize) + 1) << 8;
    (base + mig_slot.map_or(0, |s| s as usize + 1)) as *mut nvmlDevice_st
}

/// (GPU index, MIG slot) of a handle.
fn decode(handle: nvmlDevice_t) -> Option<(u32, Option<u32>)> {
    let h = handle as usize;
    let gpu = (h >> 8).checked_sub(1)?;
    let slot = (h & 0xFF).checked_sub(1);
    Some((u32::try_from(gpu).ok()?, slot.map(|s| s as u32)))
}

/// Runs `f` on an initialised machine and the GPU behind `handle`.
fn with_gpu(
    handle: nvmlDevice_t,
    f: impl FnOnce(&mut Machine, u32, Option<u32>) -> nvmlReturn_t,
) -> nvmlReturn_t {
    let mut st = state();
    if st.inits == 0 {
        return UNINITIALIZED;
    }
    let Some(m) = st.machine.as_mut() else {
        return UNINITIALIZED;
    };
    let Some((gpu, slot)) = decode(handle) else {
        return INVALID_ARGUMENT;
    };
    match m.gpus.get(gpu as usize) {
        None => INVALID_ARGUMENT,
        Some(g) if g.lost => GPU_IS_LOST,
        Some(_) => f(m, gpu, slot),
    }
}

/// Writes `s` NUL-terminated into a caller's buffer of `len` bytes.
///
/// # Safety
/// `buf` must be valid for `len` bytes.
unsafe fn write_str(s: &str, buf: *mut c_char, len: c_uint) -> nvmlReturn_t {
    if buf.is_null() {
        return INVALID_ARGUMENT;
    }
    if s.len() + 1 > len as usize {
        return INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller gives `len` bytes and `s.len() + 1 <= len`.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), buf, s.len());
        *buf.add(s.len()) = 0;
    }
    SUCCESS
}

/// Writes `value` through `out`, refusing a null pointer as NVML does.
///
/// # Safety
/// `out` must be null or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, value: T) -> nvmlReturn_t {
    if out.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: non-null and valid by the caller's contract.
    unsafe { out.write(value) };
    SUCCESS
}

/// [`put`] for two outputs: both written, or the first refusal.
///
/// # Safety
/// Each pointer must be null or valid for a write of `T`.
unsafe fn put_pair<T>(first: (*mut T, T), second: (*mut T, T)) -> nvmlReturn_t {
    if first.0.is_null() || second.0.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: non-null and valid by the caller's contract.
    unsafe {
        put(first.0, first.1);
        put(second.0, second.1)
    }
}

fn pci_info(bus_id: &str) -> nvmlPciInfo_t {
    // SAFETY: a plain C struct of integers and char arrays; all zeroes is valid.
    let mut info: nvmlPciInfo_t = unsafe { std::mem::zeroed() };
    for (dst, src) in info.busId.iter_mut().zip(bus_id.bytes()) {
        *dst = src as c_char;
    }
    for (dst, src) in info
        .busIdLegacy
        .iter_mut()
        .zip(bus_id.bytes().skip(4).take(15))
    {
        *dst = src as c_char;
    }
    info.pciDeviceId = 0x20B5_10DE;
    info
}

// ---- test controls -------------------------------------------------------------------

/// Loads a preset machine (resetting every counter and fault); 0 on success, -1 for an
/// unknown name.
///
/// # Safety
/// `name` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fake_nvml_load(name: *const c_char) -> c_int {
    // SAFETY: NUL-terminated by the caller's contract.
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    match Machine::preset(&name) {
        Some(m) => {
            state().machine = Some(m);
            0
        }
        None => -1,
    }
}

/// Moves every counter on by one tick.
#[unsafe(no_mangle)]
pub extern "C" fn fake_nvml_advance() {
    if let Some(m) = state().machine.as_mut() {
        m.advance();
    }
}

/// Queues a critical XID on GPU `gpu` for the event sets that watch it.
#[unsafe(no_mangle)]
pub extern "C" fn fake_nvml_inject_xid(gpu: c_uint, xid: c_ulonglong) {
    if let Some(m) = state().machine.as_mut() {
        m.pending_xids.push_back((gpu, xid));
    }
    XID_ARRIVED.notify_all();
}

/// Changes GPU `gpu` of the loaded machine, if there is one.
fn change_gpu(gpu: c_uint, change: impl FnOnce(&mut Gpu)) {
    if let Some(g) = state()
        .machine
        .as_mut()
        .and_then(|m| m.gpus.get_mut(gpu as usize))
    {
        change(g);
    }
}

/// Makes GPU `gpu` fall off the bus: every query on it answers `GPU_IS_LOST`.
#[unsafe(no_mangle)]
pub extern "C" fn fake_nvml_lose_gpu(gpu: c_uint) {
    change_gpu(gpu, |g| g.lost = true);
}

/// Makes GPU `gpu` report nonsense (250 % SM utilisation, more memory used than
/// installed, 4,000 °C), as a failing sensor or driver might.
#[unsafe(no_mangle)]
pub extern "C" fn fake_nvml_make_absurd(gpu: c_uint) {
    change_gpu(gpu, |g| g.absurd = true);
}

/// `nvmlInit` calls not matched by `nvmlShutdown` (a handle leak shows here).
#[unsafe(no_mangle)]
pub extern "C" fn fake_nvml_open_handles() -> c_uint {
    state().inits
}

// ---- NVML: library and system --------------------------------------------------------

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    let mut st = state();
    if st.machine.is_none() {
        st.machine = std::env::var("FAKE_NVML_MACHINE")
            .ok()
            .and_then(|n| Machine::preset(&n));
        let absurd = std::env::var("FAKE_NVML_ABSURD_GPU").ok();
        if let (Some(m), Some(gpu)) = (st.machine.as_mut(), absurd)
            && let Some(g) = gpu.parse::<usize>().ok().and_then(|i| m.gpus.get_mut(i))
        {
            g.absurd = true;
        }
    }
    if st.machine.is_none() {
        return DRIVER_NOT_LOADED;
    }
    st.inits += 1;
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    let mut st = state();
    if st.inits == 0 {
        return UNINITIALIZED;
    }
    st.inits -= 1;
    SUCCESS
}

/// # Safety
/// `version` must be valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    let v = match state().machine.as_ref() {
        Some(m) => m.driver_version,
        None => return UNINITIALIZED,
    };
    // SAFETY: forwarded caller contract.
    unsafe { write_str(v, version, length) }
}

/// # Safety
/// `count` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    let st = state();
    let Some(m) = st.machine.as_ref().filter(|_| st.inits > 0) else {
        return UNINITIALIZED;
    };
    // SAFETY: forwarded caller contract.
    unsafe { put(count, m.gpus.len() as c_uint) }
}

/// # Safety
/// `device` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    let st = state();
    let Some(m) = st.machine.as_ref().filter(|_| st.inits > 0) else {
        return UNINITIALIZED;
    };
    match m.gpus.get(index as usize) {
        None => INVALID_ARGUMENT,
        // A GPU that fell off the bus still has a handle; its queries fail.
        // SAFETY: forwarded caller contract.
        Some(_) => unsafe { put(device, gpu_handle(index, None)) },
    }
}

// ---- NVML: identity ------------------------------------------------------------------

fn mig_name(gpu: &Gpu, slot: u32) -> Option<&str> {
    gpu.mig.as_ref()?.get(slot as usize).map(String::as_str)
}

/// # Safety
/// `uuid` must be valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    with_gpu(device, |m, i, slot| {
        let g = &m.gpus[i as usize];
        let s = match slot {
            None => g.uuid.clone(),
            Some(s) => format!("MIG-fake{i:04}-{s:04}-0000-0000-000000000000"),
        };
        // SAFETY: forwarded caller contract.
        unsafe { write_str(&s, uuid, length) }
    })
}

/// # Safety
/// `name` must be valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    with_gpu(device, |m, i, slot| {
        let g = &m.gpus[i as usize];
        let s = match slot {
            None => g.name.as_str(),
            Some(s) => match mig_name(g, s) {
                Some(n) => n,
                None => return NOT_FOUND,
            },
        };
        // SAFETY: forwarded caller contract.
        unsafe { write_str(s, name, length) }
    })
}

/// # Safety
/// `pci` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    // SAFETY: forwarded caller contract.
    with_gpu(device, |m, i, _| unsafe {
        put(pci, pci_info(&m.gpus[i as usize].bus_id))
    })
}

/// # Safety
/// `memory` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    with_gpu(device, |m, i, _| {
        let total = m.gpus[i as usize].memory_total;
        let used = machine::readings(&m.gpus[i as usize], i).2;
        let info = nvmlMemory_v2_t {
            version: (2 << 24) | std::mem::size_of::<nvmlMemory_v2_t>() as c_uint,
            total,
            reserved: 0,
            free: total.saturating_sub(used),
            used,
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(memory, info) }
    })
}

// ---- NVML: readings ------------------------------------------------------------------

/// # Safety
/// `utilization` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    with_gpu(device, |m, i, _| {
        let (gpu, memory, ..) = machine::readings(&m.gpus[i as usize], i);
        // SAFETY: forwarded caller contract.
        unsafe { put(utilization, nvmlUtilization_t { gpu, memory }) }
    })
}

/// # Safety
/// `value` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieThroughput(
    device: nvmlDevice_t,
    counter: c_uint,
    value: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, |m, i, _| {
        let (_, _, _, tx, rx, ..) = machine::readings(&m.gpus[i as usize], i);
        let v = match counter {
            0 => tx,
            1 => rx,
            _ => return INVALID_ARGUMENT,
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(value, v) }
    })
}

/// # Safety
/// `temp` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor: c_uint,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, |m, i, _| match sensor {
        // SAFETY: forwarded caller contract.
        0 => unsafe { put(temp, machine::readings(&m.gpus[i as usize], i).5) },
        _ => NOT_SUPPORTED,
    })
}

/// # Safety
/// `power` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: nvmlDevice_t,
    power: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded caller contract.
    with_gpu(device, |m, i, _| unsafe {
        put(power, machine::readings(&m.gpus[i as usize], i).6)
    })
}

/// # Safety
/// `clock` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: nvmlDevice_t,
    clock_type: c_uint,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, |_, _, _| {
        let mhz = match clock_type {
            0 | 1 => 1980, // graphics, SM
            2 => 2619,     // memory
            _ => return NOT_SUPPORTED,
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(clock, mhz) }
    })
}

/// # Safety
/// `reasons` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    // GPU 0 idles (0x1); the rest run unthrottled.
    // SAFETY: forwarded caller contract.
    with_gpu(device, |_, i, _| unsafe { put(reasons, u64::from(i == 0)) })
}

/// # Safety
/// `count` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: nvmlDevice_t,
    _error_type: c_uint,
    _counter_type: c_uint,
    count: *mut c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: forwarded caller contract.
    with_gpu(device, |_, _, _| unsafe { put(count, 0) })
}

// ---- NVML: NVLink --------------------------------------------------------------------

fn link_of(m: &Machine, gpu: u32, link: c_uint) -> Option<&String> {
    m.gpus[gpu as usize].links.get(link as usize)
}

/// # Safety
/// `is_active` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: nvmlDevice_t,
    link: c_uint,
    is_active: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    with_gpu(device, |m, i, _| match link_of(m, i, link) {
        // SAFETY: forwarded caller contract.
        Some(_) => unsafe { put(is_active, 1) },
        None => INVALID_ARGUMENT,
    })
}

/// # Safety
/// `pci` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: nvmlDevice_t,
    link: c_uint,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    with_gpu(device, |m, i, _| match link_of(m, i, link) {
        // SAFETY: forwarded caller contract.
        Some(remote) => unsafe { put(pci, pci_info(remote)) },
        None => INVALID_ARGUMENT,
    })
}

/// # Safety
/// `control` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkUtilizationControl(
    device: nvmlDevice_t,
    link: c_uint,
    counter: c_uint,
    control: *mut nvmlNvLinkUtilizationControl_t,
) -> nvmlReturn_t {
    with_gpu(device, |m, i, _| {
        if link_of(m, i, link).is_none() || counter > 1 {
            return INVALID_ARGUMENT;
        }
        let units = match m.counters {
            NvlinkCounters::Bytes => 2,
            NvlinkCounters::Cycles => 0,
            NvlinkCounters::FieldValues => return NOT_SUPPORTED,
        };
        // Packet filter: all packets.
        let value = nvmlNvLinkUtilizationControl_t {
            units,
            pktfilter: 0xFF,
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(control, value) }
    })
}

/// # Safety
/// `rx` and `tx` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkUtilizationCounter(
    device: nvmlDevice_t,
    link: c_uint,
    counter: c_uint,
    rx: *mut c_ulonglong,
    tx: *mut c_ulonglong,
) -> nvmlReturn_t {
    with_gpu(device, |m, i, _| {
        if link_of(m, i, link).is_none() || counter > 1 {
            return INVALID_ARGUMENT;
        }
        // Bytes, with half a KiB more than the whole KiB, so a reader that rounds
        // instead of flooring is caught.
        let (r, t) = match m.counters {
            NvlinkCounters::Bytes => (
                m.nvlink_rx_kib(i, link) * 1024 + 512,
                m.nvlink_tx_kib(i, link) * 1024 + 512,
            ),
            NvlinkCounters::Cycles => (m.tick * 7_000_000, m.tick * 7_000_000),
            NvlinkCounters::FieldValues => return NOT_SUPPORTED,
        };
        // SAFETY: forwarded caller contract.
        unsafe { put_pair((rx, r), (tx, t)) }
    })
}

/// # Safety
/// `values` must be valid for `count` reads and writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: nvmlDevice_t,
    count: c_int,
    values: *mut nvmlFieldValue_t,
) -> nvmlReturn_t {
    let Ok(n) = usize::try_from(count) else {
        return INVALID_ARGUMENT;
    };
    if values.is_null() {
        return INVALID_ARGUMENT;
    }
    with_gpu(device, |m, i, _| {
        // SAFETY: the caller gives `count` values.
        let values = unsafe { std::slice::from_raw_parts_mut(values, n) };
        let links = m.gpus[i as usize].links.len() as c_uint;
        for v in values {
            let kib = |link| match v.fieldId {
                FI_NVLINK_THROUGHPUT_DATA_TX => m.nvlink_tx_kib(i, link),
                _ => m.nvlink_rx_kib(i, link),
            };
            let answer = match v.fieldId {
                FI_NVLINK_THROUGHPUT_DATA_TX | FI_NVLINK_THROUGHPUT_DATA_RX
                    if m.counters == NvlinkCounters::FieldValues =>
                {
                    match v.scopeId {
                        c_uint::MAX => Ok((0..links).map(kib).sum()),
                        l if l < links => Ok(kib(l)),
                        _ => Err(INVALID_ARGUMENT),
                    }
                }
                _ => Err(NOT_SUPPORTED),
            };
            v.timestamp = m.tick as i64 * 1_000_000;
            v.latencyUsec = 0;
            match answer {
                Ok(x) => {
                    v.nvmlReturn = SUCCESS;
                    v.valueType = VALUE_TYPE_UNSIGNED_LONG_LONG;
                    v.value.ullVal = x;
                }
                Err(e) => v.nvmlReturn = e,
            }
        }
        SUCCESS
    })
}

// ---- NVML: topology and MIG ----------------------------------------------------------

/// # Safety
/// `level` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTopologyCommonAncestor(
    a: nvmlDevice_t,
    b: nvmlDevice_t,
    level: *mut nvmlGpuTopologyLevel_t,
) -> nvmlReturn_t {
    let Some((gb, None)) = decode(b) else {
        return INVALID_ARGUMENT;
    };
    with_gpu(a, |m, ga, _| match m.gpus.get(gb as usize) {
        // SAFETY: forwarded caller contract.
        Some(_) => unsafe { put(level, m.common_ancestor(ga, gb)) },
        None => INVALID_ARGUMENT,
    })
}

/// # Safety
/// `current` and `pending` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, |m, i, _| {
        let on = c_uint::from(m.gpus[i as usize].mig.is_some());
        // SAFETY: forwarded caller contract.
        unsafe { put_pair((current, on), (pending, on)) }
    })
}

/// # Safety
/// `count` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, |m, i, _| match m.gpus[i as usize].mig {
        // Seven slots, as on an A100, whatever is created in them.
        // SAFETY: forwarded caller contract.
        Some(_) => unsafe { put(count, 7) },
        None => NOT_SUPPORTED,
    })
}

/// # Safety
/// `mig` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    with_gpu(device, |m, i, _| {
        match mig_name(&m.gpus[i as usize], index) {
            // SAFETY: forwarded caller contract.
            Some(_) => unsafe { put(mig, gpu_handle(i, Some(index))) },
            None => NOT_FOUND,
        }
    })
}

// ---- NVML: events --------------------------------------------------------------------

/// # Safety
/// `set` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    let mut st = state();
    let Some(m) = st.machine.as_mut() else {
        return UNINITIALIZED;
    };
    let id = m.next_event_set;
    m.next_event_set += 1;
    m.event_sets.insert(id, Vec::new());
    // SAFETY: forwarded caller contract.
    unsafe { put(set, id as *mut nvmlEventSet_st) }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    match state()
        .machine
        .as_mut()
        .map(|m| m.event_sets.remove(&(set as usize)))
    {
        Some(Some(_)) => SUCCESS,
        Some(None) => INVALID_ARGUMENT,
        None => UNINITIALIZED,
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    event_types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    if event_types & !EVENT_XID_CRITICAL != 0 {
        return NOT_SUPPORTED;
    }
    with_gpu(device, |m, i, _| {
        match m.event_sets.get_mut(&(set as usize)) {
            Some(gpus) => {
                gpus.push(i);
                SUCCESS
            }
            None => INVALID_ARGUMENT,
        }
    })
}

/// # Safety
/// `data` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    let deadline = Instant::now() + Duration::from_millis(timeout_ms.into());
    let mut st = state();
    loop {
        let Some(m) = st.machine.as_mut() else {
            return UNINITIALIZED;
        };
        let Some(watched) = m.event_sets.get(&(set as usize)) else {
            return INVALID_ARGUMENT;
        };
        if let Some(pos) = m.pending_xids.iter().position(|(g, _)| watched.contains(g)) {
            let (gpu, xid) = m.pending_xids.remove(pos).expect("position is in range");
            let event = nvmlEventData_t {
                device: gpu_handle(gpu, None),
                eventType: EVENT_XID_CRITICAL,
                eventData: xid,
                gpuInstanceId: 0,
                computeInstanceId: 0,
            };
            // SAFETY: forwarded caller contract.
            return unsafe { put(data, event) };
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return TIMEOUT;
        }
        st = XID_ARRIVED
            .wait_timeout(st, left)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}
