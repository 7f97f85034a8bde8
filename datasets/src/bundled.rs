//! The trace files compiled into the crate (see `data/ATTRIBUTION.md` for their origin and
//! licences), so that presets and bundled traces work wherever the binary runs.

/// A bundled file: its original name (used in reports and errors) and its text.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Bundled {
    pub name: &'static str,
    pub text: &'static str,
}

macro_rules! bundle {
    ($file:literal) => {
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
