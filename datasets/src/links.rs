//! Link bandwidths (GB/s, one direction) for clusters whose traces publish none. These are
//! assumptions from the hardware generation, not measurements; they only matter relative
//! to each other (the speed model compares levels).

use marshal_scheduler::domain::LinkSpec;

/// 2017–2020 GPU servers (P100/T4/V100 era) on a 100 Gb/s fabric: NVLink 2 at
/// 6 × 25 GB/s, PCIe Gen3 x16 at ~16 GB/s, 100 Gb/s (12.5 GB/s) inside a rack and a
/// 2:1 oversubscribed spine. Used for openb (Alibaba publishes no network) and Philly
/// (Jeon et al. report 100 Gb/s InfiniBand inside an RDMA domain).
pub(crate) fn v100_era() -> LinkSpec {
    LinkSpec {
        nvlink_gbps: 150.0,
        pcie_gbps: 16.0,
        rack_gbps: 12.5,
        spine_gbps: 6.25,
    }
}

/// AWS g4dn.12xlarge (Pollux's testbed): 4 T4 on PCIe Gen3, 50 Gb/s networking in a flat
/// VPC, so the rack and spine levels cost the same. No NVLink; its figure is unused
/// (islands of 0) and set to the PCIe figure.
pub(crate) fn g4dn() -> LinkSpec {
    LinkSpec {
        nvlink_gbps: 16.0,
        pcie_gbps: 16.0,
        rack_gbps: 6.25,
        spine_gbps: 6.25,
    }
}

/// Azure ND96asr A100 v4 (ElasticFlow's testbed): 8 A100 on NVSwitch (NVLink 3, 300 GB/s
/// per direction), PCIe Gen4 x16 (~32 GB/s), one 200 Gb/s HDR InfiniBand HCA per GPU
/// (25 GB/s) on a non-blocking fabric, so the rack and spine levels cost the same.
pub(crate) fn nd96asr_a100() -> LinkSpec {
    LinkSpec {
        nvlink_gbps: 300.0,
        pcie_gbps: 32.0,
        rack_gbps: 25.0,
        spine_gbps: 25.0,
    }
}
