//! The machines the fake driver can pretend to be, in plain Rust.
//!
//! Every reading is a pure function of the GPU's index, the link's number and a tick
//! count that only [`Machine::advance`] moves, so a test can say what NVML must have
//! returned without reading it back from here.

use std::collections::{HashMap, VecDeque};

/// How a GPU's NVLink traffic can be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NvlinkCounters {
    /// Ampere and older, utilisation counter 0 set to count bytes.
    Bytes,
    /// Ampere and older, counter 0 set to count cycles: not a traffic figure.
    Cycles,
    /// Hopper and newer: the utilisation counters are gone; per-link field values
    /// (`NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX` with the link as `scopeId`) instead.
    FieldValues,
}

/// One GPU.
#[derive(Debug, Clone)]
pub(crate) struct Gpu {
    pub name: String,
    pub uuid: String,
    pub bus_id: String,
    pub memory_total: u64,
    /// PCIe switch and NUMA node, for the common-ancestor level of a pair.
    pub pcie_switch: u32,
    pub numa: u32,
    /// The PCI bus id at the far end of each link (a GPU or an NVSwitch).
    pub links: Vec<String>,
    /// MIG device names, when MIG is on.
    pub mig: Option<Vec<String>>,
    /// Fallen off the bus: every query answers `GPU_IS_LOST`.
    pub lost: bool,
    /// Reports nonsense: 250 % SM utilisation, more memory used than installed, 4,000 °C.
    pub absurd: bool,
}

/// A whole node as the fake driver reports it.
#[derive(Debug, Clone)]
pub(crate) struct Machine {
    pub driver_version: &'static str,
    pub gpus: Vec<Gpu>,
    pub counters: NvlinkCounters,
    pub tick: u64,
    /// XIDs waiting to be delivered: (GPU index, XID).
    pub pending_xids: VecDeque<(u32, u64)>,
    /// Event sets and the GPUs registered on each.
    pub event_sets: HashMap<usize, Vec<u32>>,
    pub next_event_set: usize,
}

const GIB: u64 = 1 << 30;

fn bus(n: u32) -> String {
    format!("00000000:{n:02X}:00.0")
}

fn gpus(name: &str, memory_total: u64, count: u32, buses: &[u32]) -> Vec<Gpu> {
    (0..count)
        .map(|i| Gpu {
            name: name.into(),
            uuid: format!("GPU-fake0000-0000-0000-0000-{i:012}"),
            bus_id: bus(buses[i as usize]),
            memory_total,
            pcie_switch: i / 2,
            numa: i / (count / 2).max(1),
            links: Vec::new(),
            mig: None,
            lost: false,
            absurd: false,
        })
        .collect()
}

impl Machine {
    /// The named preset, or `None`.
    pub fn preset(name: &str) -> Option<Self> {
        let dgx_buses = [0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD];
        let (driver_version, gpus, counters) = match name {
            // DGX A100: 8 GPUs, each with 12 links spread over 6 NVSwitches.
            "dgx-a100" => {
                let mut g = gpus("NVIDIA A100-SXM4-80GB", 80 * GIB, 8, &dgx_buses);
                for gpu in &mut g {
                    gpu.links = (0..12).map(|l| bus(0xC0 + l / 2)).collect();
                }
                ("570.86.16", g, NvlinkCounters::Bytes)
            }
            // HGX H100: 8 GPUs, 18 links each over 4 NVSwitches, a driver with the
            // renumbered field ids.
            "hgx-h100" => {
                let mut g = gpus("NVIDIA H100 80GB HBM3", 81_559 << 20, 8, &dgx_buses);
                for gpu in &mut g {
                    gpu.links = (0..18).map(|l| bus(0xD0 + l % 4)).collect();
                }
                ("580.95.05", g, NvlinkCounters::FieldValues)
            }
            // A one-socket PCIe server: 4 A100 PCIe, two per PCIe switch, joined in
            // pairs (0–1, 2–3) by NVLink bridges (4 links from each GPU straight to its
            // partner), counters left counting cycles; GPU 3 in MIG mode with two
            // instances and an unreadable third.
            "pcie-bridged" => {
                let buses = [0x17, 0x31, 0xB1, 0xCA];
                let mut g = gpus("NVIDIA A100 80GB PCIe", 80 * GIB, 4, &buses);
                for (i, gpu) in g.iter_mut().enumerate() {
                    let partner = bus(buses[i ^ 1]);
                    gpu.links = vec![partner; 4];
                    // One socket: pairs on different switches meet at the NUMA node.
                    gpu.numa = 0;
                }
                g[3].mig = Some(vec![
                    "NVIDIA A100 80GB PCIe MIG 3g.40gb".into(),
                    "NVIDIA A100 80GB PCIe MIG 1c.2g.20gb".into(),
                    "NVIDIA A100 80GB PCIe MIG garbage".into(),
                ]);
                ("550.54.15", g, NvlinkCounters::Cycles)
            }
            // Two A100 SXM without NVLink, both in MIG mode with the same layout (3 + 2 + 1
            // compute slices, 4 + 2 + 1 memory slices): any GPU the scheduler picks for a
            // MIG demand of one of these sizes has an instance of it.
            "a100-mig" => {
                let mut g = gpus("NVIDIA A100-SXM4-80GB", 80 * GIB, 2, &[0x07, 0x0F]);
                for gpu in &mut g {
                    gpu.mig = Some(
                        ["3g.40gb", "2g.20gb", "1g.10gb"]
                            .map(|p| format!("NVIDIA A100-SXM4-80GB MIG {p}"))
                            .to_vec(),
                    );
                }
                ("570.86.16", g, NvlinkCounters::Bytes)
            }
            _ => return None,
        };
        Some(Self {
            driver_version,
            gpus,
            counters,
            tick: 0,
            pending_xids: VecDeque::new(),
            event_sets: HashMap::new(),
            next_event_set: 1,
        })
    }

    /// Moves every counter on by one tick.
    pub fn advance(&mut self) {
        self.tick += 1;
    }

    /// Cumulative NVLink data sent on link `link` of GPU `gpu`, KiB.
    pub fn nvlink_tx_kib(&self, gpu: u32, link: u32) -> u64 {
        self.tick * (1000 + 100 * u64::from(gpu) + u64::from(link))
    }

    /// Cumulative NVLink data received, KiB.
    pub fn nvlink_rx_kib(&self, gpu: u32, link: u32) -> u64 {
        self.tick * (2000 + 100 * u64::from(gpu) + u64::from(link))
    }

    /// NVML's topology level (`nvmlGpuTopologyLevel_t`) between two GPUs.
    pub fn common_ancestor(&self, a: u32, b: u32) -> u32 {
        let (ga, gb) = (&self.gpus[a as usize], &self.gpus[b as usize]);
        if ga.pcie_switch == gb.pcie_switch {
            10 // SINGLE
        } else if ga.numa == gb.numa {
            40 // NODE
        } else {
            50 // SYSTEM
        }
    }
}

/// Per-GPU readings: (SM %, memory %, memory used, PCIe tx KiB/s, PCIe rx KiB/s,
/// temperature °C, power mW); for an absurd GPU, SM at 250 %, 81 GiB used and 4,000 °C.
pub(crate) fn readings(gpu: &Gpu, index: u32) -> (u32, u32, u64, u32, u32, u32, u32) {
    if gpu.absurd {
        let normal = readings(
            &Gpu {
                absurd: false,
                ..gpu.clone()
            },
            index,
        );
        return (
            250,
            normal.1,
            gpu.memory_total + GIB,
            normal.3,
            normal.4,
            4000,
            normal.6,
        );
    }
    let gpu = index;
    (
        10 + 10 * gpu,
        5 * gpu,
        u64::from(gpu) * GIB,
        1000 * gpu,
        2000 * gpu,
        40 + gpu,
        100_000 + 1000 * gpu,
    )
}
