//! Named clusters: the two trace clusters as published, and two reference clusters.

use marshal_scheduler::domain::{ClusterSpec, LinkSpec, NodeGroupSpec};

use crate::bundled::{Bundled, OPENB_ALL_NODES, OPENB_GPU_NODES};
use crate::{DatasetError, links, parse_openb_nodes, philly_cluster};

/// The names [`cluster_preset`] knows.
pub const CLUSTER_PRESETS: &[&str] = &[
    "openb",
    "openb-all",
    "dgx-h100-64",
    "philly",
    "pollux-64",
    "elasticflow-128",
    "dlrm-peak",
    "nd40rs-v100-64",
    "dgx-a100-64",
    "rtx2080ti-64",
    "quadro-rtx6000-32",
];

/// A named cluster:
/// - `openb`: openb's 1,213 GPU nodes (6,212 GPUs), from `openb_node_list_gpu_node.csv`;
/// - `openb-all`: all 1,523 openb nodes, CPU-only ones included;
/// - `dgx-h100-64`: 8 DGX H100 (8 GPUs on one NVSwitch island, 224 cores, 2 TiB) in
///   2 racks of 4 on one spine, with NVLink 4, PCIe Gen5 and 400 Gb/s InfiniBand;
/// - `philly`: Microsoft Philly's machines ([`philly_cluster`]);
/// - `pollux-64`: Pollux's testbed, 16 AWS g4dn.12xlarge (4 T4 on PCIe, 48 vCPUs,
///   192 GiB) in racks of 4, for the Pollux/Sia workloads;
/// - `elasticflow-128`: ElasticFlow's testbed (pkusys/ElasticFlow README), 16 nodes of
///   8 A100 (NVSwitch), 96 cores and 900 GB, one HDR InfiniBand HCA per GPU (Azure
///   ND96asr A100 v4), in racks of 8, for the ITP traces (`itp-195job` is its testbed trace);
/// - `dlrm-peak`: a cluster for Alibaba's DLRM serving trace, whose real size is not
///   published: 450 GPU nodes (`HN`: 8 A10 on PCIe, 128 cores, 1 TiB) and 2,150 CPU
///   nodes (`CN`: 192 cores, 1 TiB), about 5 % above the trace's peak concurrent
///   demand as its recorded starts and deletions give it (3,412 GPUs and 28,962 cores
///   on `HN` instances; 393,616 cores and 1,950 TiB on `CN` instances). The trace does
///   not name the GPU model; A10 is an assumption (serving DLRMs needs no NVLink).
/// - `nd40rs-v100-64`, `dgx-a100-64`, `rtx2080ti-64`, `quadro-rtx6000-32`: 8 nodes of
///   Sia's `azure`, `dgx`, `rtx` and `quad` testbeds (8 V100-32GB on NVLink 2; a DGX
///   A100's 8 A100-40GB on NVSwitch with HDR InfiniBand; 8 RTX 2080 Ti on PCIe; 4
///   Quadro RTX 6000 on PCIe), for evaluating on Sia's measured step times
///   ([`crate::load_sia_placement_profiles`]).
pub fn cluster_preset(name: &str) -> Result<ClusterSpec, DatasetError> {
    match name {
        "openb" => openb(OPENB_GPU_NODES, "openb"),
        "openb-all" => openb(OPENB_ALL_NODES, "openb-all"),
        "dgx-h100-64" => Ok(dgx_h100_64()),
        "philly" => philly_cluster(),
        "pollux-64" => Ok(pollux_64()),
        "elasticflow-128" => Ok(elasticflow_128()),
        "dlrm-peak" => Ok(dlrm_peak()),
        "nd40rs-v100-64" => Ok(eight_nodes(
            "nd40rs-v100-64",
            links::nd40rs_v2(),
            "V100M32",
            (8, 8),
            (40_000, 672 * 1024),
        )),
        // The DGX A100's fabric is the ND96asr's: NVSwitch, one HDR HCA per GPU.
        "dgx-a100-64" => Ok(eight_nodes(
            "dgx-a100-64",
            links::nd96asr_a100(),
            "A100-40",
            (8, 8),
            (128_000, 1024 * 1024),
        )),
        "rtx2080ti-64" => Ok(eight_nodes(
            "rtx2080ti-64",
            links::rtx_2080ti(),
            "RTX2080Ti",
            (8, 0),
            (48_000, 384 * 1024),
        )),
        "quadro-rtx6000-32" => Ok(eight_nodes(
            "quadro-rtx6000-32",
            links::quadro_rtx6000(),
            "RTX6000",
            (4, 0),
            (32_000, 256 * 1024),
        )),
        _ => Err(DatasetError::UnknownCluster {
            name: name.to_string(),
            known: CLUSTER_PRESETS.iter().map(ToString::to_string).collect(),
        }),
    }
}

fn openb(file: Bundled, name: &str) -> Result<ClusterSpec, DatasetError> {
    let (mut spec, _) = parse_openb_nodes(file.name, file.text)?;
    spec.name = name.to_string();
    Ok(spec)
}

fn uniform(name: &str, nodes_per_rack: u32, links: LinkSpec, group: NodeGroupSpec) -> ClusterSpec {
    ClusterSpec {
        name: name.to_string(),
        nodes_per_rack,
        racks_per_spine: 8,
        links,
        gpu_models: Vec::new(),
        node_groups: vec![group],
    }
}

fn dgx_h100_64() -> ClusterSpec {
    uniform(
        "dgx-h100-64",
        4,
        LinkSpec {
            nvlink_gbps: 450.0,
            pcie_gbps: 64.0,
            rack_gbps: 50.0,
            spine_gbps: 25.0,
        },
        NodeGroupSpec {
            count: 8,
            name_prefix: Some("dgx".to_string()),
            names: Vec::new(),
            gpu_model: Some("H100".to_string()),
            gpus: 8,
            nvlink_domain: 8,
            cpu_milli: 224_000,
            memory_mib: 2 * 1024 * 1024,
            mig_gpus: None,
            mig_layout: Vec::new(),
        },
    )
}

/// 8 nodes in one rack, each with `gpus` `gpu_model` GPUs in NVLink islands of
/// `nvlink_domain` (0: none), `cpu_milli` and `memory_mib`.
fn eight_nodes(
    name: &str,
    links: LinkSpec,
    gpu_model: &str,
    (gpus, nvlink_domain): (u16, u16),
    (cpu_milli, memory_mib): (u32, u64),
) -> ClusterSpec {
    uniform(
        name,
        8,
        links,
        NodeGroupSpec {
            count: 8,
            name_prefix: Some(name.split('-').next().unwrap_or(name).to_string()),
            names: Vec::new(),
            gpu_model: Some(gpu_model.to_string()),
            gpus,
            nvlink_domain,
            cpu_milli,
            memory_mib,
            mig_gpus: None,
            mig_layout: Vec::new(),
        },
    )
}

fn pollux_64() -> ClusterSpec {
    uniform(
        "pollux-64",
        4,
        links::g4dn(),
        NodeGroupSpec {
            count: 16,
            name_prefix: Some("g4dn".to_string()),
            names: Vec::new(),
            gpu_model: Some("T4".to_string()),
            gpus: 4,
            nvlink_domain: 0,
            cpu_milli: 48_000,
            memory_mib: 192 * 1024,
            mig_gpus: None,
            mig_layout: Vec::new(),
        },
    )
}

fn elasticflow_128() -> ClusterSpec {
    uniform(
        "elasticflow-128",
        8,
        links::nd96asr_a100(),
        NodeGroupSpec {
            count: 16,
            name_prefix: Some("nd96asr".to_string()),
            names: Vec::new(),
            gpu_model: Some("A100-40".to_string()),
            gpus: 8,
            nvlink_domain: 8,
            cpu_milli: 96_000,
            memory_mib: 900 * 1024,
            mig_gpus: None,
            mig_layout: Vec::new(),
        },
    )
}

fn dlrm_peak() -> ClusterSpec {
    let group = |count, prefix: &str, gpu_model: Option<&str>, gpus, cpu_milli| NodeGroupSpec {
        count,
        name_prefix: Some(prefix.to_string()),
        names: Vec::new(),
        gpu_model: gpu_model.map(String::from),
        gpus,
        nvlink_domain: 0,
        cpu_milli,
        memory_mib: 1024 * 1024,
        mig_gpus: None,
        mig_layout: Vec::new(),
    };
    ClusterSpec {
        name: "dlrm-peak".to_string(),
        nodes_per_rack: 16,
        racks_per_spine: 8,
        // No NVLink (islands of 0); the rate is required but never used.
        links: LinkSpec {
            nvlink_gbps: 300.0,
            pcie_gbps: 32.0,
            rack_gbps: 25.0,
            spine_gbps: 12.5,
        },
        gpu_models: Vec::new(),
        node_groups: vec![
            group(450, "hn", Some("A10"), 8, 128_000),
            group(2150, "cn", None, 0, 192_000),
        ],
    }
}
