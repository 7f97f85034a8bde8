//! Marshal's NVML source against the fake driver: multi-GPU machines, NVLink counters
//! and Hopper's field values, topology discovery into the scheduler's node spec, MIG
//! instances, XID events and a GPU that falls off the bus — through `nvml-wrapper` and
//! `dlopen`, as with the real `libnvidia-ml.so`.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use marshal_scheduler::domain::GpuCatalog;
use marshal_telemetry::{
    GpuSample, Health, Issue, Level, NvmlConfig, NvmlSource, Query, SinkConfig, TelemetryKind,
    TelemetrySink, read_all,
};

/// The fake's state is per process; tests take turns.
static TURN: Mutex<()> = Mutex::new(());

/// The fake library built beside this test binary (`target/<profile>/deps`).
fn fake_library_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("test binary directory");
    let path = deps.join("libmarshal_fake_nvml.so");
    assert!(
        path.exists(),
        "{} is missing: it is built with this crate's tests (cargo test -p marshal-fake-nvml)",
        path.display()
    );
    path
}

/// The fake driver loaded with one machine, for the length of a test.
struct Fake {
    lib: libloading::Library,
    path: PathBuf,
    _turn: MutexGuard<'static, ()>,
}

impl Fake {
    fn load(machine: &str) -> Self {
        let turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
        let path = fake_library_path();
        // SAFETY: the fake runs no initialisation code on load.
        let lib = unsafe { libloading::Library::new(&path) }.expect("load the fake driver");
        Self {
            lib,
            path,
            _turn: turn,
        }
        .load_again(machine)
    }

    /// Another machine in the same library, keeping the turn.
    fn load_again(self, machine: &str) -> Self {
        let name = std::ffi::CString::new(machine).unwrap();
        // SAFETY: the signature is the one the fake exports.
        let rc = unsafe {
            let load: libloading::Symbol<unsafe extern "C" fn(*const std::ffi::c_char) -> i32> =
                self.lib.get(b"fake_nvml_load\0").unwrap();
            load(name.as_ptr())
        };
        assert_eq!(rc, 0, "unknown machine {machine}");
        self
    }

    fn call(&self, symbol: &[u8]) {
        // SAFETY: every control without arguments is `extern "C" fn()`.
        unsafe {
            let f: libloading::Symbol<unsafe extern "C" fn()> = self.lib.get(symbol).unwrap();
            f();
        }
    }

    fn advance(&self, ticks: u32) {
        for _ in 0..ticks {
            self.call(b"fake_nvml_advance\0");
        }
    }

    fn inject_xid(&self, gpu: u32, xid: u64) {
        // SAFETY: the signature is the one the fake exports.
        unsafe {
            let f: libloading::Symbol<unsafe extern "C" fn(u32, u64)> =
                self.lib.get(b"fake_nvml_inject_xid\0").unwrap();
            f(gpu, xid);
        }
    }

    fn lose_gpu(&self, gpu: u32) {
        // SAFETY: the signature is the one the fake exports.
        unsafe {
            let f: libloading::Symbol<unsafe extern "C" fn(u32)> =
                self.lib.get(b"fake_nvml_lose_gpu\0").unwrap();
            f(gpu);
        }
    }

    fn make_absurd(&self, gpu: u32) {
        // SAFETY: the signature is the one the fake exports.
        unsafe {
            let f: libloading::Symbol<unsafe extern "C" fn(u32)> =
                self.lib.get(b"fake_nvml_make_absurd\0").unwrap();
            f(gpu);
        }
    }

    fn open_handles(&self) -> u32 {
        // SAFETY: the signature is the one the fake exports.
        unsafe {
            let f: libloading::Symbol<unsafe extern "C" fn() -> u32> =
                self.lib.get(b"fake_nvml_open_handles\0").unwrap();
            f()
        }
    }

    fn open(&self, watch_xid: bool) -> NvmlSource {
        NvmlSource::open_with(NvmlConfig {
            cluster: "test".into(),
            node: "fake-node".into(),
            lib_path: Some(self.path.clone()),
            watch_xid,
        })
        .expect("open the fake driver")
    }
}

/// What the fake's counters hold after `ticks` ticks (see `machine.rs`).
fn tx_kib(ticks: u64, gpu: u64, link: u64) -> u64 {
    ticks * (1000 + 100 * gpu + link)
}
fn rx_kib(ticks: u64, gpu: u64, link: u64) -> u64 {
    ticks * (2000 + 100 * gpu + link)
}

fn assert_nvlink(rows: &[GpuSample], ticks: u64, links: u64) {
    for r in rows {
        let g = u64::from(r.gpu_index);
        let tx: Vec<u64> = (0..links).map(|l| tx_kib(ticks, g, l)).collect();
        let rx: Vec<u64> = (0..links).map(|l| rx_kib(ticks, g, l)).collect();
        assert_eq!(r.nvlink_tx_per_link_kib.as_ref(), Some(&tx), "GPU {g}");
        assert_eq!(r.nvlink_rx_per_link_kib.as_ref(), Some(&rx), "GPU {g}");
        assert_eq!(r.nvlink_tx_kib, Some(tx.iter().sum()));
        assert_eq!(r.nvlink_rx_kib, Some(rx.iter().sum()));
    }
}

#[test]
fn dgx_a100_rows_hold_every_reading_and_per_link_byte_counters() {
    let fake = Fake::load("dgx-a100");
    let mut src = fake.open(false);
    assert_eq!(src.device_count(), 8);
    fake.advance(3);
    let rows = src.sample_at(1_000_000);
    assert_eq!(rows.len(), 8);
    for (i, r) in rows.iter().enumerate() {
        let g = i as u32;
        assert_eq!(u32::from(r.gpu_index), g);
        assert_eq!(&*r.gpu_type, "NVIDIA A100-SXM4-80GB");
        assert!(r.gpu_uuid.starts_with("GPU-fake"), "{}", r.gpu_uuid);
        assert_eq!((&*r.cluster, &*r.node), ("test", "fake-node"));
        assert_eq!(r.sm_util_pct, Some((10 + 10 * g) as f32));
        assert_eq!(r.mem_util_pct, Some((5 * g) as f32));
        assert_eq!(r.mem_used_bytes, Some(u64::from(g) << 30));
        assert_eq!(r.mem_total_bytes, Some(80 << 30));
        assert_eq!(r.pcie_tx_kib_per_s, Some(1000 * g));
        assert_eq!(r.pcie_rx_kib_per_s, Some(2000 * g));
        assert_eq!(r.temperature_c, Some((40 + g) as f32));
        assert_eq!(r.power_mw, Some(100_000 + 1000 * g));
        assert_eq!((r.sm_clock_mhz, r.mem_clock_mhz), (Some(1980), Some(2619)));
        assert_eq!(r.throttle_reasons, Some(u64::from(i == 0)));
        assert_eq!((r.ecc_corrected, r.ecc_uncorrected), (Some(0), Some(0)));
        assert_eq!(r.mig_mode, Some(false));
        assert_eq!(r.health, Health::Ok);
        assert_eq!(r.xid, None);
    }
    // Byte counts floored to KiB (the fake adds half a KiB to each).
    assert_nvlink(&rows, 3, 12);
    fake.advance(2);
    assert_nvlink(&src.sample_at(2_000_000), 5, 12);
    assert_eq!(src.query_errors(), 0);
}

#[test]
fn hopper_nvlink_traffic_comes_from_per_link_field_values() {
    let fake = Fake::load("hgx-h100");
    let mut src = fake.open(false);
    fake.advance(4);
    let rows = src.sample_at(1_000_000);
    assert_eq!(rows.len(), 8);
    assert!(rows.iter().all(|r| &*r.gpu_type == "NVIDIA H100 80GB HBM3"));
    // KiB as NVML gives them, per link of 18, not the same figure 18 times.
    assert_nvlink(&rows, 4, 18);
    fake.advance(1);
    assert_nvlink(&src.sample_at(2_000_000), 5, 18);
    assert_eq!(src.query_errors(), 0);
}

#[test]
fn counters_counting_cycles_leave_nvlink_null_and_the_rest_filled() {
    let fake = Fake::load("pcie-bridged");
    let mut src = fake.open(false);
    fake.advance(2);
    for _ in 0..2 {
        let rows = src.sample_at(1_000_000);
        assert_eq!(rows.len(), 4);
        for r in &rows {
            assert_eq!(r.nvlink_tx_kib, None);
            assert_eq!(r.nvlink_rx_per_link_kib, None);
            assert!(r.sm_util_pct.is_some() && r.power_mw.is_some());
            assert_eq!(r.mig_mode, Some(r.gpu_index == 3));
        }
    }
    // Refusals are remembered, not counted as errors.
    assert_eq!(src.query_errors(), 0);
}

#[test]
fn an_nvswitch_machine_is_one_island_of_eight() {
    let fake = Fake::load("dgx-a100");
    let src = fake.open(false);
    let topo = src.discover_topology().unwrap();
    assert_eq!(topo.gpus.len(), 8);
    assert_eq!(topo.gpus[4].pci_bus_id, "00000000:87:00.0");
    assert_eq!(topo.pairs.len(), 28);
    assert!(topo.pairs.iter().all(|p| p.level == Level::NvLink));
    // 12 links per GPU, all to switches.
    assert_eq!(topo.nvlink_peers.len(), 96);
    assert!(topo.nvlink_peers.iter().all(|p| p.remote_gpu.is_none()));

    let catalog = GpuCatalog::default();
    let spec = marshal_agent::node_spec(&topo, "n0", 128_000, 1 << 20, &catalog).unwrap();
    assert_eq!(spec.gpu_model.as_deref(), Some("A100-80"));
    assert_eq!((spec.gpus, spec.nvlink_domain), (8, 8));
    // MIG off everywhere is said, not left open.
    assert_eq!(spec.mig_gpus, Some(vec![]));

    let fake = Fake::load_again(fake, "hgx-h100");
    let topo = fake.open(false).discover_topology().unwrap();
    assert!(topo.pairs.iter().all(|p| p.level == Level::NvLink));
    let spec = marshal_agent::node_spec(&topo, "n1", 128_000, 1 << 20, &catalog).unwrap();
    assert_eq!(spec.gpu_model.as_deref(), Some("H100"));
    assert_eq!((spec.gpus, spec.nvlink_domain), (8, 8));
}

#[test]
fn bridged_pairs_are_islands_of_two_over_pcie_levels() {
    let fake = Fake::load("pcie-bridged");
    let topo = fake.open(false).discover_topology().unwrap();
    assert_eq!(topo.level(0, 1), Some(Level::NvLink));
    assert_eq!(topo.level(3, 2), Some(Level::NvLink));
    // Across the pairs: PCIe only, different switches on one socket.
    for (a, b) in [(0, 2), (0, 3), (1, 2), (1, 3)] {
        assert_eq!(topo.level(a, b), Some(Level::Node), "{a}-{b}");
    }
    // Four links from each GPU, each to its partner.
    assert_eq!(topo.nvlink_peers.len(), 16);
    for p in &topo.nvlink_peers {
        assert_eq!(p.remote_gpu, Some(p.gpu ^ 1), "{p:?}");
    }
    let spec =
        marshal_agent::node_spec(&topo, "n2", 64_000, 1 << 19, &GpuCatalog::default()).unwrap();
    assert_eq!(spec.gpu_model.as_deref(), Some("A100-80"));
    assert_eq!((spec.gpus, spec.nvlink_domain), (4, 2));
    let in_mig_mode: Vec<u32> = topo
        .gpus
        .iter()
        .filter(|g| g.mig_mode)
        .map(|g| g.index)
        .collect();
    assert_eq!(in_mig_mode, [3]);
    assert_eq!(spec.mig_gpus, Some(vec![3]));
}

#[test]
fn mig_instances_are_listed_with_their_slices_and_unreadable_ones_skipped() {
    let fake = Fake::load("pcie-bridged");
    let instances = fake.open(false).mig_instances().unwrap();
    let got: Vec<(u32, &str, u8, u8)> = instances
        .iter()
        .map(|m| (m.gpu, m.profile.as_str(), m.compute, m.memory))
        .collect();
    assert_eq!(got, [(3, "3g.40gb", 3, 4), (3, "1c.2g.20gb", 1, 2)]);
    assert!(instances.iter().all(|m| m.uuid.starts_with("MIG-")));
    assert_ne!(instances[0].uuid, instances[1].uuid);
    // No MIG anywhere: no instances.
    let fake = Fake::load_again(fake, "dgx-a100");
    assert!(fake.open(false).mig_instances().unwrap().is_empty());
}

#[test]
fn xid_events_mark_their_gpu_failed_or_degraded() {
    let fake = Fake::load("dgx-a100");
    let mut src = fake.open(true);
    fake.inject_xid(2, 79); // fallen off the bus: fatal
    fake.inject_xid(5, 13); // graphics engine exception: degraded for a while
    let deadline = Instant::now() + Duration::from_secs(10);
    let rows = loop {
        let rows = src.sample_at(1_000_000);
        if rows[2].xid.is_some() && rows[5].xid.is_some() {
            break rows;
        }
        assert!(Instant::now() < deadline, "the XID watcher never delivered");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!((rows[2].xid, rows[2].health), (Some(79), Health::Failed));
    assert_eq!((rows[5].xid, rows[5].health), (Some(13), Health::Degraded));
    for r in rows.iter().filter(|r| ![2, 5].contains(&r.gpu_index)) {
        assert_eq!((r.xid, r.health), (None, Health::Ok), "GPU {}", r.gpu_index);
    }
}

#[test]
fn a_gpu_that_falls_off_the_bus_is_failed_and_the_others_go_on() {
    let fake = Fake::load("hgx-h100");
    let mut src = fake.open(false);
    fake.advance(1);
    fake.lose_gpu(4);
    for t in 0..2 {
        let rows = src.sample_at(t);
        assert_eq!(rows.len(), 8);
        let lost = &rows[4];
        assert_eq!(lost.health, Health::Failed);
        assert_eq!((lost.sm_util_pct, lost.nvlink_tx_kib), (None, None));
        // Identity known from before the loss stays, so the row says which GPU failed.
        assert!(lost.gpu_uuid.ends_with("000000000004"), "{}", lost.gpu_uuid);
        for r in rows.iter().filter(|r| r.gpu_index != 4) {
            assert_eq!(r.health, Health::Ok, "GPU {}", r.gpu_index);
            assert!(r.sm_util_pct.is_some() && r.nvlink_tx_kib.is_some());
        }
    }
    assert!(src.query_errors() > 0);
}

#[test]
fn every_nvml_handle_is_released_with_the_source() {
    let fake = Fake::load("dgx-a100");
    let src = fake.open(true);
    // The source and its XID watcher each hold one.
    let deadline = Instant::now() + Duration::from_secs(10);
    while fake.open_handles() < 2 {
        assert!(
            Instant::now() < deadline,
            "the XID watcher never opened NVML"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(src);
    assert_eq!(fake.open_handles(), 0);
}

#[test]
fn nonsense_from_a_gpu_is_nulled_and_counted_by_the_sink_and_the_rest_kept() {
    let fake = Fake::load("dgx-a100");
    let mut src = fake.open(false);
    fake.make_absurd(6);
    let dir = tempfile::tempdir().unwrap();
    let sink = TelemetrySink::open(SinkConfig::new(dir.path())).unwrap();
    for t in 1..=3 {
        fake.advance(1);
        sink.send(src.sample_at(t * 1_000_000)).unwrap();
    }
    let stats = sink.finish().unwrap();
    let v = &stats.validation;
    assert_eq!((v.rows_in, v.rows_rejected), (24, 0));
    for column in ["sm_util_pct", "mem_used_bytes", "temperature_c"] {
        assert_eq!(
            v.nulled_count(column, Issue::OutOfRange),
            3,
            "{column}: {v}"
        );
    }
    assert_eq!(v.total_nulled(), 9, "{v}");
    let (rows, _) = read_all::<GpuSample>(dir.path(), Query::new(TelemetryKind::Gpu)).unwrap();
    assert_eq!(rows.len(), 24);
    for r in &rows {
        let bad = r.gpu_index == 6;
        assert_eq!(r.sm_util_pct.is_none(), bad, "GPU {}", r.gpu_index);
        assert_eq!(r.mem_used_bytes.is_none(), bad);
        assert_eq!(r.temperature_c.is_none(), bad);
        // What the GPU reported sensibly is kept.
        assert_eq!(r.power_mw, Some(100_000 + 1000 * u32::from(r.gpu_index)));
        assert!(r.nvlink_tx_kib.is_some_and(|k| k > 0));
    }
}
