//! Pollux's (OSDI '21) and Sia's (SOSP '23) measured step and synchronisation times per
//! model, GPU type, placement (GPUs on each node) and per-GPU batch size:
//! `<model>/placements[-<gpu>].csv` and `scalability[-<gpu>].csv`.

use std::collections::HashSet;
use std::path::PathBuf;

use serde::Serialize;

use crate::bundled::{POLLUX_PLACEMENT_PROFILES, POLLUX_SCALABILITY_PROFILES};
use crate::resolve::{read_text_file, trace_dirs};
use crate::table::{Bad, Table};
use crate::{DatasetError, ParseReport};

const EXPECTED: &str = "placement,local_bsz,step_time,sync_time (any order) or \
                        num_nodes,num_replicas,local_bsz,step_time,sync_time";
const SIA_DIR: &str = "sia-throughput-profiles";

/// Sia's GPU types (the file-name suffix) and the hardware each was measured on. The
/// unsuffixed Pollux files are the `aws` ones.
pub const SIA_GPU_TYPES: &[(&str, &str)] = &[
    ("aws", "AWS g4dn.12xlarge, 4x NVIDIA T4 per node"),
    ("azure", "Azure ND40rs_v2, 8x NVIDIA V100 per node"),
    ("dgx", "DGX-A100, 8x A100-40GB per node"),
    (
        "dgx-ext",
        "DGX-A100, 8x A100-40GB per node (more batch sizes)",
    ),
    ("quad", "4x Quadro RTX 6000 per node"),
    ("rtx", "8x GeForce RTX 2080 Ti per node"),
];

/// Sia's models (folder names): `cifar10` is ResNet-18 and `imagenet` ResNet-50;
/// `gpt_pmp` (GPT with pipeline/model parallelism) has only `dgx-ext` and `rtx` files.
pub const SIA_MODELS: &[&str] = &[
    "bert",
    "cifar10",
    "deepspeech2",
    "gpt_pmp",
    "imagenet",
    "ncf",
    "yolov3",
];

/// One measurement: `model` training on `replicas` GPUs of `gpu_type` over `nodes`
/// nodes with `local_bsz` samples per GPU per step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepTimeProfile {
    pub model: String,
    /// A key of [`SIA_GPU_TYPES`] (or what the caller passed to the parser).
    pub gpu_type: String,
    /// GPUs on each node as the file writes it, one digit per node (`"22"`: 2 nodes × 2
    /// GPUs); `None` in `scalability*.csv`, which gives only the node and GPU counts.
    pub placement: Option<String>,
    pub nodes: u32,
    /// GPUs (data-parallel replicas) in all.
    pub replicas: u32,
    /// Per-GPU batch size (samples).
    pub local_bsz: u32,
    /// Seconds per training step (iteration), synchronisation included.
    pub step_time_s: f64,
    /// Seconds per step spent synchronising gradients (part of `step_time_s`).
    pub sync_time_s: f64,
}

impl StepTimeProfile {
    /// Samples per second of the whole job: `replicas × local_bsz / step_time_s` (0 for a
    /// zero step time, which the parser rejects).
    pub fn samples_per_s(&self) -> f64 {
        if self.step_time_s > 0.0 {
            f64::from(self.replicas) * f64::from(self.local_bsz) / self.step_time_s
        } else {
            0.0
        }
    }
}

/// Parses one profile file of `model` on `gpu_type`: `placements*.csv` (`placement,
/// local_bsz,step_time,sync_time`) or `scalability*.csv` (`num_nodes,num_replicas,
/// local_bsz,step_time,sync_time`), columns in any order (the files differ), rows in file
/// order.
///
/// Skipped rows: a placement that is not digits 1–9 (one per node, at most 64 nodes),
/// a batch size that is not a whole number ≥ 1, a step time that is not a finite
/// positive number, a sync time that is not finite and ≥ 0, 0 nodes or fewer GPUs than
/// nodes, a repeated (placement or node/GPU counts, batch size).
pub fn parse_step_profiles(
    name: &str,
    model: &str,
    gpu_type: &str,
    text: &str,
) -> Result<(Vec<StepTimeProfile>, ParseReport), DatasetError> {
    let table = Table::open(name, text, EXPECTED)?;
    let layout_cols = if table.has("placement") {
        Ok(table.column("placement", EXPECTED)?)
    } else {
        Err((
            table.column("num_nodes", EXPECTED)?,
            table.column("num_replicas", EXPECTED)?,
        ))
    };
    let bsz = table.column("local_bsz", EXPECTED)?;
    let step = table.column("step_time", EXPECTED)?;
    let sync = table.column("sync_time", EXPECTED)?;
    let mut report = ParseReport::new(name);
    let mut profiles = Vec::new();
    let mut seen = HashSet::new();
    table.for_each_row(&mut report, |row| {
        let (layout, nodes, replicas) = match layout_cols {
            Ok(col) => {
                let text = row.text(col)?;
                let (nodes, replicas) = parse_placement(text).ok_or_else(|| {
                    Bad::new(
                        "placement",
                        format!("{text:?} is not per-node GPU digits 1-9"),
                    )
                })?;
                (Some(text.to_string()), nodes, replicas)
            }
            Err((n, r)) => {
                let nodes: u32 = row.uint(n)?;
                let replicas: u32 = row.uint(r)?;
                if nodes == 0 || replicas < nodes {
                    return Err(Bad::new(
                        "num_replicas",
                        format!("{replicas} GPUs on {nodes} nodes"),
                    ));
                }
                // As for a placement string (at most 64 nodes of at most 9 GPUs): the
                // shape sizes what is built from it downstream.
                if nodes > MAX_PLACEMENT_NODES || replicas > MAX_PLACEMENT_NODES * 9 {
                    return Err(Bad::new(
                        "num_nodes",
                        format!(
                            "{replicas} GPUs on {nodes} nodes: at most {MAX_PLACEMENT_NODES} nodes of 9 GPUs"
                        ),
                    ));
                }
                (None, nodes, replicas)
            }
        };
        let local_bsz: u32 = row.uint(bsz)?;
        if local_bsz == 0 {
            return Err(Bad::new("local_bsz", "batch size 0"));
        }
        let step_time_s = row.seconds(step)?;
        if step_time_s == 0.0 {
            return Err(Bad::new("step_time", "a step takes no time"));
        }
        let sync_time_s = row.seconds(sync)?;
        let key = (layout.clone(), nodes, replicas, local_bsz);
        if !seen.insert(key) {
            return Err(Bad::new(
                "local_bsz",
                format!("repeated batch size {local_bsz} for this placement"),
            ));
        }
        profiles.push(StepTimeProfile {
            model: model.to_string(),
            gpu_type: gpu_type.to_string(),
            placement: layout,
            nodes,
            replicas,
            local_bsz,
            step_time_s,
            sync_time_s,
        });
        Ok(())
    });
    if profiles.is_empty() {
        return Err(report.no_valid_rows());
    }
    Ok((profiles, report))
}

/// The most nodes a measured placement may span (Sia's largest runs span 16).
const MAX_PLACEMENT_NODES: u32 = 64;

/// `"22"` → (2 nodes, 4 GPUs).
fn parse_placement(s: &str) -> Option<(u32, u32)> {
    if s.is_empty() || s.len() > MAX_PLACEMENT_NODES as usize {
        return None;
    }
    let mut gpus = 0;
    for c in s.chars() {
        match c.to_digit(10) {
            Some(d @ 1..=9) => gpus += d,
            _ => return None,
        }
    }
    Some((s.len() as u32, gpus))
}

/// Placement profiles of several models and GPU types, for lookups.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PlacementProfiles {
    /// Sorted by (model, GPU type, placement, batch size).
    profiles: Vec<StepTimeProfile>,
}

impl PlacementProfiles {
    /// Collects profiles (those without a placement, from `scalability*.csv`, are left
    /// out: they cannot be looked up by placement).
    pub fn new(profiles: impl IntoIterator<Item = StepTimeProfile>) -> Self {
        let mut profiles: Vec<_> = profiles
            .into_iter()
            .filter(|p| p.placement.is_some())
            .collect();
        profiles.sort_by(|a, b| a.key().cmp(&b.key()));
        PlacementProfiles { profiles }
    }

    /// Every profile, sorted by model, GPU type, placement and batch size.
    pub fn profiles(&self) -> &[StepTimeProfile] {
        &self.profiles
    }

    /// The measurements of `model` on `gpu_type` with `placement` (per-node GPU digits as
    /// in the files, e.g. `"4"`, `"44"`, `"1111"`), one per batch size, ascending.
    pub fn lookup(&self, model: &str, gpu_type: &str, placement: &str) -> &[StepTimeProfile] {
        let key = (model, gpu_type, placement);
        let start = self.profiles.partition_point(|p| p.group() < key);
        let end = self.profiles.partition_point(|p| p.group() <= key);
        &self.profiles[start..end]
    }

    /// The measurement at one per-GPU batch size, if taken.
    pub fn get(
        &self,
        model: &str,
        gpu_type: &str,
        placement: &str,
        local_bsz: u32,
    ) -> Option<&StepTimeProfile> {
        self.lookup(model, gpu_type, placement)
            .iter()
            .find(|p| p.local_bsz == local_bsz)
    }

    /// The models, sorted.
    pub fn models(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.profiles.iter().map(|p| p.model.as_str()).collect();
        v.dedup();
        v
    }

    /// The GPU types measured for `model`, sorted.
    pub fn gpu_types(&self, model: &str) -> Vec<&str> {
        let mut v: Vec<&str> = self
            .profiles
            .iter()
            .filter(|p| p.model == model)
            .map(|p| p.gpu_type.as_str())
            .collect();
        v.dedup();
        v
    }

    /// The placements measured for `model` on `gpu_type`, in string order.
    pub fn placements(&self, model: &str, gpu_type: &str) -> Vec<&str> {
        let mut v: Vec<&str> = self
            .profiles
            .iter()
            .filter(|p| p.model == model && p.gpu_type == gpu_type)
            .filter_map(|p| p.placement.as_deref())
            .collect();
        v.dedup();
        v
    }
}

impl StepTimeProfile {
    fn group(&self) -> (&str, &str, &str) {
        (
            &self.model,
            &self.gpu_type,
            self.placement.as_deref().unwrap_or(""),
        )
    }

    fn key(&self) -> (&str, &str, &str, u32) {
        let (m, g, p) = self.group();
        (m, g, p, self.local_bsz)
    }
}

/// Pollux's placement profiles (bundled): `<model>/placements.csv` of bert, cifar10,
/// deepspeech2, imagenet, ncf and yolov3 on AWS g4dn.12xlarge nodes (4× T4), GPU type
/// `aws`; one report per file.
pub fn pollux_placement_profiles() -> Result<(PlacementProfiles, Vec<ParseReport>), DatasetError> {
    let mut all = Vec::new();
    let mut reports = Vec::new();
    for (model, file) in POLLUX_PLACEMENT_PROFILES {
        let name = format!(
            "pollux/{model}/{}",
            file.name.rsplit('/').next().unwrap_or("")
        );
        let (profiles, report) = parse_step_profiles(&name, model, "aws", file.text)?;
        all.extend(profiles);
        reports.push(report);
    }
    Ok((PlacementProfiles::new(all), reports))
}

/// Pollux's bundled scalability profiles (`<model>/scalability.csv`, AWS g4dn): step
/// times by node and GPU count (6–16 nodes, 6–64 GPUs), without a per-node layout
/// (`placement` is `None`). One report per file.
pub fn pollux_scalability_profiles()
-> Result<(Vec<StepTimeProfile>, Vec<ParseReport>), DatasetError> {
    let mut all = Vec::new();
    let mut reports = Vec::new();
    for (model, file) in POLLUX_SCALABILITY_PROFILES {
        let name = format!("pollux/{model}/scalability.csv");
        let (profiles, report) = parse_step_profiles(&name, model, "aws", file.text)?;
        all.extend(profiles);
        reports.push(report);
    }
    Ok((all, reports))
}

/// Sia's placement profiles, read from `sia-throughput-profiles/` in the traces
/// directory: `<model>/placements-<gpu>.csv` for every model of [`SIA_MODELS`] and GPU
/// type of [`SIA_GPU_TYPES`] that has a file (the unsuffixed copies of `aws` are not
/// read twice). One report per file read; a file that fails to parse is an error.
pub fn load_sia_placement_profiles() -> Result<(PlacementProfiles, Vec<ParseReport>), DatasetError>
{
    let (all, reports) = load_sia_files("placements", "sia-placement-profiles")?;
    Ok((PlacementProfiles::new(all), reports))
}

/// Sia's scalability profiles (`<model>/scalability-<gpu>.csv`: step times by node and
/// GPU count, `placement` `None`), read like [`load_sia_placement_profiles`]. On
/// `azure` they reach 5 nodes and on `rtx` 3, beyond the placement files' 2.
pub fn load_sia_scalability_profiles()
-> Result<(Vec<StepTimeProfile>, Vec<ParseReport>), DatasetError> {
    load_sia_files("scalability", "sia-scalability-profiles")
}

/// Every `<model>/<stem>-<gpu>.csv` of Sia's profiles in the traces directory; `name`
/// names the trace in errors.
fn load_sia_files(
    stem: &str,
    name: &str,
) -> Result<(Vec<StepTimeProfile>, Vec<ParseReport>), DatasetError> {
    let name = name.to_string();
    let dirs = trace_dirs();
    let Some(root) = dirs.iter().map(|d| d.join(SIA_DIR)).find(|d| d.is_dir()) else {
        return Err(DatasetError::TraceNotFound {
            name,
            file: format!("{SIA_DIR}/"),
            searched: dirs,
        });
    };
    let mut all = Vec::new();
    let mut reports = Vec::new();
    for model in SIA_MODELS {
        for (gpu, _) in SIA_GPU_TYPES {
            let path: PathBuf = root.join(model).join(format!("{stem}-{gpu}.csv"));
            if !path.is_file() {
                continue;
            }
            let text = read_text_file(&path)?;
            let (profiles, report) =
                parse_step_profiles(&path.display().to_string(), model, gpu, &text)?;
            all.extend(profiles);
            reports.push(report);
        }
    }
    if all.is_empty() {
        return Err(DatasetError::TraceNotFound {
            name,
            file: format!("{SIA_DIR}/<model>/{stem}-<gpu>.csv"),
            searched: vec![root],
        });
    }
    Ok((all, reports))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_files_parse_by_header_and_skip_bad_rows() {
        let text = "local_bsz,step_time,sync_time,placement
32,0.04,0.0004,1
64,0.06,0.0003,1
32,0.05,0.01,22
32,0.05,0.01,22
0,0.05,0.01,2
16,nan,0.01,2
16,0.05,-1,2
16,0,0.01,2
16,0.05,0.01,20
16,0.05,0.01,x
16,0.05
";
        let (profiles, report) = parse_step_profiles("p.csv", "cifar10", "rtx", text).unwrap();
        assert_eq!(profiles.len(), 3);
        assert_eq!(
            profiles[2],
            StepTimeProfile {
                model: "cifar10".into(),
                gpu_type: "rtx".into(),
                placement: Some("22".into()),
                nodes: 2,
                replicas: 4,
                local_bsz: 32,
                step_time_s: 0.05,
                sync_time_s: 0.01,
            }
        );
        assert!((profiles[2].samples_per_s() - 4.0 * 32.0 / 0.05).abs() < 1e-9);
        let got: Vec<_> = report.skipped_at();
        assert_eq!(
            got,
            vec![
                (5, "local_bsz"),
                (6, "local_bsz"),
                (7, "step_time"),
                (8, "sync_time"),
                (9, "step_time"),
                (10, "placement"),
                (11, "placement"),
                (12, "placement"),
            ]
        );
        let table = PlacementProfiles::new(profiles);
        assert_eq!(table.lookup("cifar10", "rtx", "1").len(), 2);
        assert_eq!(
            table.get("cifar10", "rtx", "1", 64).map(|p| p.step_time_s),
            Some(0.06)
        );
        assert!(table.lookup("cifar10", "rtx", "4").is_empty());
        assert_eq!(table.placements("cifar10", "rtx"), vec!["1", "22"]);
    }

    #[test]
    fn scalability_files_and_bad_headers() {
        let text = "num_nodes,num_replicas,local_bsz,step_time,sync_time
4,4,20,0.16,0.03
2,1,20,0.16,0.03
4000000000,4000000000,20,0.16,0.03
";
        let (profiles, report) = parse_step_profiles("s.csv", "imagenet", "azure", text).unwrap();
        assert_eq!((profiles.len(), report.rows_skipped), (1, 2));
        // A shape beyond any measured placement is a bad row, not a 4-billion-node graph.
        let bad = &report.skipped[1];
        assert_eq!((bad.line, bad.field.as_str()), (4, "num_nodes"));
        assert!(bad.reason.contains("at most 64 nodes"), "{}", bad.reason);
        assert_eq!(
            (
                profiles[0].nodes,
                profiles[0].replicas,
                profiles[0].placement.clone()
            ),
            (4, 4, None)
        );
        let err = parse_step_profiles("h.csv", "m", "g", "local_bsz,step_time\n1,2\n").unwrap_err();
        assert!(
            matches!(&err, DatasetError::Malformed { field, .. } if field == "num_nodes"),
            "{err}"
        );
        let err = parse_step_profiles(
            "e.csv",
            "m",
            "g",
            "placement,local_bsz,step_time,sync_time\n",
        )
        .unwrap_err();
        assert!(matches!(err, DatasetError::NoValidRows { .. }));
    }

    #[test]
    fn bundled_pollux_profiles_are_the_t4_files() {
        let (table, reports) = pollux_placement_profiles().unwrap();
        assert_eq!(reports.len(), 6);
        assert!(reports.iter().all(|r| r.rows_skipped == 0), "{reports:?}");
        // SOURCE.md line counts minus the header: 540 + 1183 + 754 + 864 + 1661 + 540.
        assert_eq!(table.profiles().len(), 5_542);
        assert_eq!(
            table.models(),
            vec![
                "bert",
                "cifar10",
                "deepspeech2",
                "imagenet",
                "ncf",
                "yolov3"
            ]
        );
        // cifar10/placements.csv line 2: `1,32,0.0427886962890625,0.0004995360016822816`.
        let p = table.get("cifar10", "aws", "1", 32).unwrap();
        assert_eq!(
            (p.step_time_s, p.sync_time_s),
            (0.0427886962890625, 0.0004995360016822816)
        );
        assert_eq!(table.placements("bert", "aws").len(), 108);
    }

    #[test]
    fn bundled_pollux_scalability_runs_have_node_and_gpu_counts_only() {
        let (runs, reports) = pollux_scalability_profiles().unwrap();
        assert_eq!(reports.len(), 6);
        assert!(reports.iter().all(|r| r.rows_skipped == 0), "{reports:?}");
        // SOURCE.md line counts minus the header: 180 + 329 + 198 + 288 + 458 + 108.
        assert_eq!(runs.len(), 1_561);
        assert!(runs.iter().all(|r| r.placement.is_none()));
        assert!(
            runs.iter()
                .all(|r| (6..=16).contains(&r.nodes) && r.replicas <= 64)
        );
        // bert/scalability.csv line 2: `6,6,4,1.4923269003629684,1.0928203125`.
        let first = &runs[0];
        assert_eq!(
            (
                first.model.as_str(),
                first.nodes,
                first.replicas,
                first.local_bsz
            ),
            ("bert", 6, 6, 4)
        );
        assert_eq!(first.step_time_s, 1.4923269003629684);
    }
}
