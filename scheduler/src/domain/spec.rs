//! Cluster specifications: what a TOML file, a preset or a trace's node list describes,
//! before it is built into a [`Topology`](crate::domain::Topology).

use serde::{Deserialize, Serialize};

use crate::domain::{DomainError, GpuModel};

/// Link bandwidths in GB/s per topology level. Defaults describe an HGX-class server
/// (NVLink 4 through NVSwitch, PCIe Gen5 x16) on a 400 Gb/s InfiniBand rail fabric with a
/// 2:1 oversubscribed spine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    pub nvlink_gbps: f64,
    pub pcie_gbps: f64,
    pub rack_gbps: f64,
    pub spine_gbps: f64,
}

impl Default for LinkSpec {
    fn default() -> Self {
        LinkSpec {
            nvlink_gbps: 450.0,
            pcie_gbps: 64.0,
            rack_gbps: 50.0,
            spine_gbps: 25.0,
        }
    }
}

/// The most nodes a cluster spec may describe: ten times the largest GPU clusters
/// built, and about a hundred bytes of state per node in the scheduler.
pub const MAX_NODES: u64 = 1_000_000;
/// The most GPUs a cluster spec may describe.
pub const MAX_GPUS: u64 = 4_000_000;

/// Longest node name accepted, in bytes (the gRPC API's limit on names).
pub const MAX_NODE_NAME: usize = 256;

/// `count` identical nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeGroupSpec {
    #[serde(default = "one")]
    pub count: u32,
    /// Prefix of node names; nodes are named `<prefix>-<n>`. Ignored when `names` is set.
    #[serde(default)]
    pub name_prefix: Option<String>,
    /// Explicit names, one per node (trace node lists keep their serial numbers).
    #[serde(default)]
    pub names: Vec<String>,
    /// GPU model name; absent for CPU-only nodes.
    #[serde(default)]
    pub gpu_model: Option<String>,
    #[serde(default)]
    pub gpus: u16,
    /// GPUs per NVLink/NVSwitch island; 0 or 1 means the GPUs talk over PCIe only.
    #[serde(default)]
    pub nvlink_domain: u16,
    pub cpu_milli: u32,
    pub memory_mib: u64,
    /// Indices of the GPUs in MIG mode: they hold MIG instances only, and the others
    /// never do. Absent: MIG mode is left to the scheduler, which partitions any GPU of
    /// a MIG-capable model when a MIG worker needs it and nothing else holds the GPU
    /// (dynamic MIG, the simulator's model). A node whose agent reads MIG mode from
    /// NVML must say which (`[]` for none): MIG mode is set by an administrator and a
    /// GPU cannot both take whole-GPU workers and hold instances.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_gpus: Option<Vec<u16>>,
    /// The MIG instances an administrator made on GPUs of `mig_gpus` (static MIG): a MIG
    /// worker there takes one free instance of exactly its size, and no other. A GPU of
    /// `mig_gpus` without a layout is partitioned by the scheduler as workers come
    /// (dynamic MIG, counted in compute and memory slices).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_layout: Vec<MigLayoutSpec>,
}

/// One MIG layout, shared by the GPUs it names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigLayoutSpec {
    /// Indices of the GPUs partitioned this way (each in `mig_gpus`).
    pub gpus: Vec<u16>,
    /// The instances on each of them, by profile as NVML names them: `3g.40gb`, or
    /// `1c.3g.40gb` for a compute instance inside a GPU instance. `[]`: MIG mode with no
    /// instance made yet.
    pub instances: Vec<String>,
}

impl NodeGroupSpec {
    /// The name of the group's `n`-th node, which is node `id` of the cluster: its
    /// explicit name, else `<prefix>-<n>`, else `node-<id>`.
    pub fn node_name(&self, n: u32, id: u32) -> String {
        match (self.names.get(n as usize), &self.name_prefix) {
            (Some(name), _) => name.clone(),
            (None, Some(prefix)) => format!("{prefix}-{n}"),
            (None, None) => format!("node-{id}"),
        }
    }
}

impl NodeGroupSpec {
    /// The layout that names GPU `index`, if one does.
    pub fn mig_layout_of(&self, index: u16) -> Option<&MigLayoutSpec> {
        self.mig_layout.iter().find(|l| l.gpus.contains(&index))
    }

    /// Layouts only for GPUs in MIG mode, each GPU in one at most, a MIG GPU holding at
    /// most 7 instances. Profile names and sizes need the GPU model: `Topology::build`
    /// checks them.
    fn check_mig_layout(&self) -> Result<(), String> {
        let mut seen = Vec::new();
        for layout in &self.mig_layout {
            if layout.gpus.is_empty() {
                return Err("a mig_layout names no GPU".into());
            }
            if layout.instances.len() > crate::domain::MIG_COMPUTE_SLICES as usize {
                return Err(format!(
                    "mig_layout for GPUs {:?}: {} instances (a GPU holds at most {})",
                    layout.gpus,
                    layout.instances.len(),
                    crate::domain::MIG_COMPUTE_SLICES
                ));
            }
            for &gpu in &layout.gpus {
                let in_mig_mode = self.mig_gpus.as_ref().is_some_and(|m| m.contains(&gpu));
                if !in_mig_mode {
                    return Err(format!(
                        "mig_layout names GPU {gpu}, which is not in mig_gpus"
                    ));
                }
                if seen.contains(&gpu) {
                    return Err(format!("mig_layout names GPU {gpu} twice"));
                }
                seen.push(gpu);
            }
        }
        Ok(())
    }
}

fn one() -> u32 {
    1
}

/// A whole cluster. Nodes fill racks in order, racks fill spines in order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    pub name: String,
    #[serde(default = "default_nodes_per_rack")]
    pub nodes_per_rack: u32,
    #[serde(default = "default_racks_per_spine")]
    pub racks_per_spine: u32,
    #[serde(default)]
    pub links: LinkSpec,
    /// Models beyond (or overriding) the built-in catalog.
    #[serde(default)]
    pub gpu_models: Vec<GpuModel>,
    #[serde(rename = "nodes")]
    pub node_groups: Vec<NodeGroupSpec>,
}

fn default_nodes_per_rack() -> u32 {
    16
}

fn default_racks_per_spine() -> u32 {
    8
}

impl ClusterSpec {
    pub fn from_toml(text: &str) -> Result<Self, DomainError> {
        let spec: ClusterSpec =
            toml::from_str(text).map_err(|e| DomainError::Invalid(e.to_string()))?;
        spec.validate()?;
        Ok(spec)
    }

    pub fn validate(&self) -> Result<(), DomainError> {
        let invalid = |msg: String| {
            Err(DomainError::Invalid(format!(
                "cluster {}: {msg}",
                self.name
            )))
        };
        if self.nodes_per_rack == 0 || self.racks_per_spine == 0 {
            return invalid("nodes_per_rack and racks_per_spine must be at least 1".into());
        }
        if self.node_groups.is_empty() {
            return invalid("no nodes".into());
        }
        let links = &self.links;
        for (name, v) in [
            ("nvlink_gbps", links.nvlink_gbps),
            ("pcie_gbps", links.pcie_gbps),
            ("rack_gbps", links.rack_gbps),
            ("spine_gbps", links.spine_gbps),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return invalid(format!("links.{name} must be a positive number, got {v}"));
            }
        }
        for (i, g) in self.node_groups.iter().enumerate() {
            if g.count == 0 {
                return invalid(format!("node group {i}: count must be at least 1"));
            }
            if !g.names.is_empty() && g.names.len() != g.count as usize {
                return invalid(format!(
                    "node group {i}: {} names for {} nodes",
                    g.names.len(),
                    g.count
                ));
            }
            if g.gpus > 0 && g.gpu_model.is_none() {
                return invalid(format!("node group {i}: {} GPUs but no gpu_model", g.gpus));
            }
            if g.gpus > 64 {
                return invalid(format!(
                    "node group {i}: {} GPUs per node (at most 64)",
                    g.gpus
                ));
            }
            if let Some(mig) = &g.mig_gpus {
                if let Some(&bad) = mig.iter().find(|&&i| i >= g.gpus) {
                    return invalid(format!(
                        "node group {i}: mig_gpus names GPU {bad}, but the nodes have {} GPUs",
                        g.gpus
                    ));
                }
                let mut sorted = mig.clone();
                sorted.sort_unstable();
                if let Some(twice) = sorted.windows(2).find(|w| w[0] == w[1]) {
                    return invalid(format!(
                        "node group {i}: mig_gpus names GPU {} twice",
                        twice[0]
                    ));
                }
            }
            if let Err(why) = g.check_mig_layout() {
                return invalid(format!("node group {i}: {why}"));
            }
            if g.nvlink_domain > 1 && g.gpus % g.nvlink_domain != 0 {
                return invalid(format!(
                    "node group {i}: {} GPUs do not split into NVLink islands of {}",
                    g.gpus, g.nvlink_domain
                ));
            }
        }
        if self.node_count() > MAX_NODES || self.gpu_count() > MAX_GPUS {
            return invalid(format!(
                "{} nodes with {} GPUs: at most {MAX_NODES} nodes and {MAX_GPUS} GPUs",
                self.node_count(),
                self.gpu_count()
            ));
        }
        // A node is addressed by its name (an agent registers under it, records are kept
        // by it), so two nodes of one name would leave one of them unreachable.
        let mut seen: std::collections::HashMap<String, usize> = Default::default();
        let mut id = 0u32;
        for (i, g) in self.node_groups.iter().enumerate() {
            for n in 0..g.count {
                let name = g.node_name(n, id);
                id += 1;
                if name.is_empty() || name.len() > MAX_NODE_NAME {
                    return invalid(format!(
                        "node group {i}: node name of {} bytes (must be 1..={MAX_NODE_NAME})",
                        name.len()
                    ));
                }
                if name.chars().any(char::is_control) {
                    return invalid(format!(
                        "node group {i}: node name {name:?} contains control characters"
                    ));
                }
                if let Some(first) = seen.insert(name.clone(), i) {
                    return invalid(format!(
                        "node name {name:?} is used twice (node groups {first} and {i})"
                    ));
                }
            }
        }
        Ok(())
    }

    pub fn node_count(&self) -> u64 {
        self.node_groups.iter().map(|g| g.count as u64).sum()
    }

    pub fn gpu_count(&self) -> u64 {
        self.node_groups
            .iter()
            .map(|g| g.count as u64 * g.gpus as u64)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DGX: &str = r#"
name = "two-dgx"
nodes_per_rack = 1

[[nodes]]
count = 2
name_prefix = "dgx"
gpu_model = "H100"
gpus = 8
nvlink_domain = 8
cpu_milli = 224000
memory_mib = 2097152
"#;

    #[test]
    fn parses_a_toml_cluster() {
        let spec = ClusterSpec::from_toml(DGX).unwrap();
        assert_eq!(spec.gpu_count(), 16);
        assert_eq!(spec.node_count(), 2);
        assert_eq!(spec.links, LinkSpec::default());
    }

    #[test]
    fn rejects_unknown_fields_and_inconsistent_groups() {
        let typo = DGX.replace("gpus = 8", "gpu = 8");
        assert!(ClusterSpec::from_toml(&typo).is_err());
        let bad_island = DGX.replace("nvlink_domain = 8", "nvlink_domain = 3");
        let err = ClusterSpec::from_toml(&bad_island).unwrap_err().to_string();
        assert!(err.contains("NVLink islands"), "{err}");
        let no_model = DGX.replace("gpu_model = \"H100\"", "");
        assert!(ClusterSpec::from_toml(&no_model).is_err());
        let mig = |list: &str| DGX.replace("gpus = 8", &format!("gpus = 8\nmig_gpus = {list}"));
        let err = ClusterSpec::from_toml(&mig("[1, 8]"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("names GPU 8, but the nodes have 8 GPUs"),
            "{err}"
        );
        let err = ClusterSpec::from_toml(&mig("[3, 1, 3]"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("names GPU 3 twice"), "{err}");
        let spec = ClusterSpec::from_toml(&mig("[7, 0]")).unwrap();
        assert_eq!(spec.node_groups[0].mig_gpus, Some(vec![7, 0]));
        assert_eq!(
            ClusterSpec::from_toml(DGX).unwrap().node_groups[0].mig_gpus,
            None
        );
    }

    #[test]
    fn a_mig_layout_names_gpus_in_mig_mode_once_each() {
        let ok = format!(
            "{DGX}mig_gpus = [1, 2, 3]\n\
             [[nodes.mig_layout]]\ngpus = [1, 3]\ninstances = [\"3g.40gb\", \"1c.2g.20gb\"]\n\
             [[nodes.mig_layout]]\ngpus = [2]\ninstances = []\n"
        );
        let spec = ClusterSpec::from_toml(&ok).unwrap();
        let group = &spec.node_groups[0];
        assert_eq!(group.mig_layout.len(), 2);
        assert_eq!(group.mig_layout_of(3).unwrap().instances.len(), 2);
        assert!(group.mig_layout_of(2).unwrap().instances.is_empty());
        assert!(group.mig_layout_of(0).is_none());
        for (bad, says) in [
            ("[1, 4]", "GPU 4, which is not in mig_gpus"),
            ("[1, 1]", "names GPU 1 twice"),
            ("[]", "names no GPU"),
        ] {
            let spec = ok.replace("gpus = [1, 3]", &format!("gpus = {bad}"));
            let err = ClusterSpec::from_toml(&spec).unwrap_err().to_string();
            assert!(err.contains(says), "{bad}: {err}");
        }
        let eight = ok.replace(
            "instances = []",
            &format!("instances = [{}]", ["\"1g.10gb\""; 8].join(", ")),
        );
        let err = ClusterSpec::from_toml(&eight).unwrap_err().to_string();
        assert!(err.contains("8 instances (a GPU holds at most 7)"), "{err}");
        let open = ok.replace("mig_gpus = [1, 2, 3]\n", "");
        let err = ClusterSpec::from_toml(&open).unwrap_err().to_string();
        assert!(err.contains("GPU 1, which is not in mig_gpus"), "{err}");
    }

    #[test]
    fn node_names_must_be_unique_and_usable_as_names() {
        let twice = format!("{DGX}\n{}", &DGX[DGX.find("[[nodes]]").unwrap()..]);
        let err = ClusterSpec::from_toml(&twice).unwrap_err().to_string();
        assert!(
            err.contains("node name \"dgx-0\" is used twice (node groups 0 and 1)"),
            "{err}"
        );
        let named = |names: &str| DGX.replace("name_prefix = \"dgx\"", &format!("names = {names}"));
        let err = ClusterSpec::from_toml(&named(r#"["a", "a"]"#)).unwrap_err();
        assert!(err.to_string().contains("\"a\" is used twice"), "{err}");
        let err = ClusterSpec::from_toml(&named(r#"["a", "c\nd"]"#)).unwrap_err();
        assert!(err.to_string().contains("control characters"), "{err}");
        let err = ClusterSpec::from_toml(&named(r#"["a", ""]"#)).unwrap_err();
        assert!(err.to_string().contains("0 bytes"), "{err}");
        let long = format!(r#"["a", "{}"]"#, "x".repeat(MAX_NODE_NAME + 1));
        assert!(ClusterSpec::from_toml(&named(&long)).is_err());
        assert_eq!(
            ClusterSpec::from_toml(&named(r#"["a", "b"]"#))
                .unwrap()
                .node_count(),
            2
        );
    }

    #[test]
    fn a_cluster_too_large_to_hold_in_memory_is_refused_before_it_is_built() {
        let huge = DGX.replace("count = 2", "count = 100000000");
        let err = ClusterSpec::from_toml(&huge).unwrap_err().to_string();
        assert!(err.contains("at most 1000000 nodes"), "{err}");
        let largest = DGX.replace("count = 2", "count = 500000");
        assert_eq!(
            ClusterSpec::from_toml(&largest).unwrap().gpu_count(),
            4_000_000
        );
    }
}
