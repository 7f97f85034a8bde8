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

/// Azure ND40rs_v2 (one of Sia's testbeds): 8 V100-32GB SXM2 on NVLink 2 (6 × 25 GB/s per
/// GPU, a hybrid cube mesh that the topology approximates as one island), PCIe Gen3 x16,
/// 100 Gb/s EDR InfiniBand on a flat fabric.
pub(crate) fn nd40rs_v2() -> LinkSpec {
    LinkSpec {
        nvlink_gbps: 150.0,
        pcie_gbps: 16.0,
        rack_gbps: 12.5,
        spine_gbps: 12.5,
    }
}

/// A server of 8 GeForce RTX 2080 Ti on PCIe Gen3 x16 (Sia's `rtx` testbed). No NVLink;
/// its figure is unused (islands of 0) and set to the PCIe figure. Sia does not publish
/// the network between these nodes: 100 Gb/s on a flat fabric is an assumption.
pub(crate) fn rtx_2080ti() -> LinkSpec {
    LinkSpec {
        nvlink_gbps: 16.0,
        pcie_gbps: 16.0,
        rack_gbps: 12.5,
        spine_gbps: 12.5,
    }
}

/// A server of 4 Quadro RTX 6000 on PCIe Gen3 x16 (Sia's `quad` testbed, measured on one
/// machine only). No NVLink is assumed (Sia does not say whether the cards are bridged);
/// the network is not published and never used by its single-machine profiles: 100 Gb/s
/// is an assumption.
pub(crate) fn quadro_rtx6000() -> LinkSpec {
    rtx_2080ti()
}
