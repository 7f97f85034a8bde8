//! The trace files compiled into the crate (see `data/ATTRIBUTION.md` for their origin and
//! licences), so that presets and bundled traces work wherever the binary runs.

/// A bundled file: its original name (used in reports and errors) and its text.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Bundled {
    pub name: &'static str,
    pub text: &'static str,
}

/// A bundled binary file (an archive kept as published).
#[derive(Copy, Clone, Debug)]
pub(crate) struct BundledBytes {
    pub name: &'static str,
    pub bytes: &'static [u8],
}

macro_rules! bundle {
    ($file:expr) => {
        Bundled {
            name: $file,
            text: include_str!(concat!("../data/", $file)),
        }
    };
}

pub(crate) const OPENB_GPU_NODES: Bundled = bundle!("openb_node_list_gpu_node.csv");
pub(crate) const OPENB_ALL_NODES: Bundled = bundle!("openb_node_list_all_node.csv");
pub(crate) const OPENB_PODS_DEFAULT: Bundled = bundle!("openb_pod_list_default.csv");
pub(crate) const OPENB_PODS_MULTIGPU20: Bundled = bundle!("openb_pod_list_multigpu20.csv");
pub(crate) const PHILLY_JOBS: Bundled = bundle!("philly.csv");
pub(crate) const PHILLY_MACHINES: Bundled = bundle!("cluster_machine_list");
pub(crate) const PHILLY_REVISED_MACHINES: Bundled = bundle!("revised_machine_list.csv");

macro_rules! pollux_set {
    ($dir:literal) => {
        [
            bundle!(concat!("pollux/", $dir, "/workload-1.csv")),
            bundle!(concat!("pollux/", $dir, "/workload-2.csv")),
            bundle!(concat!("pollux/", $dir, "/workload-3.csv")),
            bundle!(concat!("pollux/", $dir, "/workload-4.csv")),
            bundle!(concat!("pollux/", $dir, "/workload-5.csv")),
            bundle!(concat!("pollux/", $dir, "/workload-6.csv")),
            bundle!(concat!("pollux/", $dir, "/workload-7.csv")),
            bundle!(concat!("pollux/", $dir, "/workload-8.csv")),
        ]
    };
}

/// Pollux's workloads (`simulator/workloads*/workload-<k>.csv`), by folder, k = 1..=8.
pub(crate) const POLLUX_WORKLOADS: [(&str, [Bundled; 8]); 5] = [
    ("workloads", pollux_set!("workloads")),
    ("workloads-0.5", pollux_set!("workloads-0.5")),
    ("workloads-1.5", pollux_set!("workloads-1.5")),
    ("workloads-2.0", pollux_set!("workloads-2.0")),
    ("workloads-realistic", pollux_set!("workloads-realistic")),
];

/// ElasticFlow's processed ITP traces small enough to bundle (the testbed's 195 jobs and
/// the clusters under 0.5 MB); the others are read from the traces directory.
pub(crate) const ITP_PROCESSED: [Bundled; 7] = [
    bundle!("elasticflow-traces/195job.csv"),
    bundle!("elasticflow-traces/cluster01.csv"),
    bundle!("elasticflow-traces/cluster02.csv"),
    bundle!("elasticflow-traces/cluster03.csv"),
    bundle!("elasticflow-traces/cluster05.csv"),
    bundle!("elasticflow-traces/cluster06.csv"),
    bundle!("elasticflow-traces/cluster10.csv"),
];

pub(crate) const GAVEL_PHILLY_DISTRIBUTION: Bundled = bundle!("philly_job_distribution.csv");
pub(crate) const CHRONUS_MODEL_INFO: Bundled = bundle!("model_info.json");
pub(crate) const ACME_CLUSTER_SUMMARY: Bundled = bundle!("cluster_summary.csv");
pub(crate) const HELIOS_CLUSTER_SUMMARY: Bundled = bundle!("helios_cluster_summary.csv");
pub(crate) const PAI_MACHINE_SPEC_TGZ: BundledBytes = BundledBytes {
    name: "pai_machine_spec.tar.gz",
    bytes: include_bytes!("../data/pai_machine_spec.tar.gz"),
};

/// Gavel's `scheduler/simulation_throughputs.json` (MIT), as published.
pub(crate) const GAVEL_SIMULATION_THROUGHPUTS: Bundled = Bundled {
    name: "simulation_throughputs.json",
    text: include_str!("../data/gavel/simulation_throughputs.json"),
};

/// Pollux's per-model placement profiles on AWS g4dn.12xlarge (4× T4 per node):
/// `<model>/placements.csv` (the adaptdl `osdi21-artifact` copy, Apache-2.0), by model.
pub(crate) const POLLUX_PLACEMENT_PROFILES: [(&str, Bundled); 6] = [
    ("bert", bundle!("pollux/profiles/bert/placements.csv")),
    ("cifar10", bundle!("pollux/profiles/cifar10/placements.csv")),
    (
        "deepspeech2",
        bundle!("pollux/profiles/deepspeech2/placements.csv"),
    ),
    (
        "imagenet",
        bundle!("pollux/profiles/imagenet/placements.csv"),
    ),
    ("ncf", bundle!("pollux/profiles/ncf/placements.csv")),
    ("yolov3", bundle!("pollux/profiles/yolov3/placements.csv")),
];

/// Pollux's per-model scalability profiles (`<model>/scalability.csv`: step times by node
/// and GPU count, up to 16 nodes), the adaptdl `osdi21-artifact` copy (Apache-2.0).
pub(crate) const POLLUX_SCALABILITY_PROFILES: [(&str, Bundled); 6] = [
    ("bert", bundle!("pollux/profiles/bert/scalability.csv")),
    (
        "cifar10",
        bundle!("pollux/profiles/cifar10/scalability.csv"),
    ),
    (
        "deepspeech2",
        bundle!("pollux/profiles/deepspeech2/scalability.csv"),
    ),
    (
        "imagenet",
        bundle!("pollux/profiles/imagenet/scalability.csv"),
    ),
    ("ncf", bundle!("pollux/profiles/ncf/scalability.csv")),
    ("yolov3", bundle!("pollux/profiles/yolov3/scalability.csv")),
];

/// Pollux's validation curves (`<model>/validation-<batch>.csv`: training progress by
/// iteration at each global batch size), the adaptdl `osdi21-artifact` copy (Apache-2.0).
pub(crate) const POLLUX_VALIDATION_CURVES: &[(&str, u32, Bundled)] = &[
    (
        "bert",
        12,
        bundle!("pollux/profiles/bert/validation-12.csv"),
    ),
    (
        "bert",
        24,
        bundle!("pollux/profiles/bert/validation-24.csv"),
    ),
    (
        "bert",
        48,
        bundle!("pollux/profiles/bert/validation-48.csv"),
    ),
    (
        "bert",
        96,
        bundle!("pollux/profiles/bert/validation-96.csv"),
    ),
    (
        "bert",
        192,
        bundle!("pollux/profiles/bert/validation-192.csv"),
    ),
    (
        "bert",
        384,
        bundle!("pollux/profiles/bert/validation-384.csv"),
    ),
    (
        "cifar10",
        128,
        bundle!("pollux/profiles/cifar10/validation-128.csv"),
    ),
    (
        "cifar10",
        256,
        bundle!("pollux/profiles/cifar10/validation-256.csv"),
    ),
    (
        "cifar10",
        512,
        bundle!("pollux/profiles/cifar10/validation-512.csv"),
    ),
    (
        "cifar10",
        1024,
        bundle!("pollux/profiles/cifar10/validation-1024.csv"),
    ),
    (
        "cifar10",
        2048,
        bundle!("pollux/profiles/cifar10/validation-2048.csv"),
    ),
    (
        "cifar10",
        4096,
        bundle!("pollux/profiles/cifar10/validation-4096.csv"),
    ),
    (
        "deepspeech2",
        20,
        bundle!("pollux/profiles/deepspeech2/validation-20.csv"),
    ),
    (
        "deepspeech2",
        40,
        bundle!("pollux/profiles/deepspeech2/validation-40.csv"),
    ),
    (
        "deepspeech2",
        80,
        bundle!("pollux/profiles/deepspeech2/validation-80.csv"),
    ),
    (
        "deepspeech2",
        160,
        bundle!("pollux/profiles/deepspeech2/validation-160.csv"),
    ),
    (
        "deepspeech2",
        320,
        bundle!("pollux/profiles/deepspeech2/validation-320.csv"),
    ),
    (
        "deepspeech2",
        640,
        bundle!("pollux/profiles/deepspeech2/validation-640.csv"),
    ),
    (
        "imagenet",
        200,
        bundle!("pollux/profiles/imagenet/validation-200.csv"),
    ),
    (
        "imagenet",
        400,
        bundle!("pollux/profiles/imagenet/validation-400.csv"),
    ),
    (
        "imagenet",
        800,
        bundle!("pollux/profiles/imagenet/validation-800.csv"),
    ),
    (
        "imagenet",
        1600,
        bundle!("pollux/profiles/imagenet/validation-1600.csv"),
    ),
    (
        "imagenet",
        3200,
        bundle!("pollux/profiles/imagenet/validation-3200.csv"),
    ),
    (
        "imagenet",
        6400,
        bundle!("pollux/profiles/imagenet/validation-6400.csv"),
    ),
    (
        "imagenet",
        12800,
        bundle!("pollux/profiles/imagenet/validation-12800.csv"),
    ),
    (
        "ncf",
        256,
        bundle!("pollux/profiles/ncf/validation-256.csv"),
    ),
    (
        "ncf",
        512,
        bundle!("pollux/profiles/ncf/validation-512.csv"),
    ),
    (
        "ncf",
        1024,
        bundle!("pollux/profiles/ncf/validation-1024.csv"),
    ),
    (
        "ncf",
        2048,
        bundle!("pollux/profiles/ncf/validation-2048.csv"),
    ),
    (
        "ncf",
        4096,
        bundle!("pollux/profiles/ncf/validation-4096.csv"),
    ),
    (
        "ncf",
        8192,
        bundle!("pollux/profiles/ncf/validation-8192.csv"),
    ),
    (
        "ncf",
        16384,
        bundle!("pollux/profiles/ncf/validation-16384.csv"),
    ),
    (
        "ncf",
        32768,
        bundle!("pollux/profiles/ncf/validation-32768.csv"),
    ),
    (
        "yolov3",
        8,
        bundle!("pollux/profiles/yolov3/validation-8.csv"),
    ),
    (
        "yolov3",
        16,
        bundle!("pollux/profiles/yolov3/validation-16.csv"),
    ),
    (
        "yolov3",
        32,
        bundle!("pollux/profiles/yolov3/validation-32.csv"),
    ),
    (
        "yolov3",
        64,
        bundle!("pollux/profiles/yolov3/validation-64.csv"),
    ),
    (
        "yolov3",
        128,
        bundle!("pollux/profiles/yolov3/validation-128.csv"),
    ),
    (
        "yolov3",
        256,
        bundle!("pollux/profiles/yolov3/validation-256.csv"),
    ),
    (
        "yolov3",
        512,
        bundle!("pollux/profiles/yolov3/validation-512.csv"),
    ),
];
