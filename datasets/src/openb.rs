//! Alibaba's openb GPU-cluster trace (v2023, the FGD paper's data): node lists and pod
//! lists.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use marshal_scheduler::domain::{
    Checkpointing, ClusterSpec, CommPattern, GpuCatalog, GpuDemand, GpuModelSet, Job, JobId,
    NodeGroupSpec,
};

use crate::table::{Bad, Col, Row, Table};
use crate::{DatasetError, ParseReport, links};

const NODE_HEADER: &str = "sn,cpu_milli,memory_mib,gpu,model";
const POD_HEADER_FULL: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,\
                               pod_phase,creation_time,deletion_time,scheduled_time";
const POD_HEADER_SHORT: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli";
/// Columns only the 11-column schema has; any of them selects it.
const FULL_ONLY: [&str; 6] = [
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
];

/// openb models whose 8-GPU servers are assumed to be NVLink machines (V100 SXM2 servers,
/// and the anonymised G2/G3 whose 8-GPU shape matches HGX boards).
const NVLINK_MODELS: [&str; 4] = ["V100M16", "V100M32", "G2", "G3"];
/// openb publishes no rack layout; these are the [`ClusterSpec`] defaults.
pub(crate) const NODES_PER_RACK: u32 = 16;
pub(crate) const RACKS_PER_SPINE: u32 = 8;

/// The largest node [`ClusterSpec::validate`] accepts.
const MAX_NODE_GPUS: u16 = 64;

/// The cluster name for a file: its stem (`openb_node_list_gpu_node.csv` →
/// `openb_node_list_gpu_node`).
pub(crate) fn stem(file: &str) -> String {
    Path::new(file)
        .file_stem()
        .map_or_else(|| file.to_string(), |s| s.to_string_lossy().into_owned())
}

struct NodeCols {
    sn: Col,
    cpu: Col,
    memory: Col,
    gpu: Col,
    model: Col,
}

/// Parses an openb node list (`sn,cpu_milli,memory_mib,gpu,model`) into a cluster.
///
/// Consecutive identical nodes become one [`NodeGroupSpec`] that keeps their serial numbers
/// as `names`. A GPU node with no model or one not in [`GpuCatalog::default`], and a
/// repeated serial number, are skipped. CPU-only nodes (`gpu` = 0) get no model (one
/// given is ignored). 8-GPU V100/G2/G3 nodes are one NVLink island; every other node is
/// PCIe only. Racks hold 16 nodes and spines 8 racks, filled in file order (assumed:
/// openb publishes no rack map). The cluster is named after the file's stem.
pub fn parse_openb_nodes(
    name: &str,
    text: &str,
) -> Result<(ClusterSpec, ParseReport), DatasetError> {
    let table = Table::open(name, text, NODE_HEADER)?;
    let cols = NodeCols {
        sn: table.column("sn", NODE_HEADER)?,
        cpu: table.column("cpu_milli", NODE_HEADER)?,
        memory: table.column("memory_mib", NODE_HEADER)?,
        gpu: table.column("gpu", NODE_HEADER)?,
        model: table.column("model", NODE_HEADER)?,
    };
    let catalog = GpuCatalog::default();
    let mut report = ParseReport::new(name);
    let mut groups: Vec<NodeGroupSpec> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    table.for_each_row(&mut report, |row| {
        let node = parse_node(row, &cols, &catalog)?;
        let sn = &node.names[0];
        if !seen.insert(sn.clone()) {
            return Err(Bad::new("sn", format!("duplicate node {sn:?}")));
        }
        push_grouped(&mut groups, node);
        Ok(())
    });
    if groups.is_empty() {
        return Err(report.no_valid_rows());
    }
    let spec = ClusterSpec {
        name: stem(name),
        nodes_per_rack: NODES_PER_RACK,
        racks_per_spine: RACKS_PER_SPINE,
        links: links::v100_era(),
        gpu_models: Vec::new(),
        node_groups: groups,
    };
    spec.validate().map_err(|e| DatasetError::InvalidCluster {
        file: name.to_string(),
        reason: e.to_string(),
    })?;
    Ok((spec, report))
}

/// Appends a one-node group, merging it into the last group when the shapes match.
pub(crate) fn push_grouped(groups: &mut Vec<NodeGroupSpec>, node: NodeGroupSpec) {
    match groups.last_mut() {
        Some(last) if same_shape(last, &node) => {
            last.count += node.count;
            last.names.extend(node.names);
        }
        _ => groups.push(node),
    }
}

fn same_shape(a: &NodeGroupSpec, b: &NodeGroupSpec) -> bool {
    a.gpu_model == b.gpu_model
        && a.gpus == b.gpus
        && a.nvlink_domain == b.nvlink_domain
        && a.cpu_milli == b.cpu_milli
        && a.memory_mib == b.memory_mib
}

/// One node as a group of one.
fn parse_node(row: &Row<'_>, c: &NodeCols, catalog: &GpuCatalog) -> Result<NodeGroupSpec, Bad> {
    let sn = row.text(c.sn)?;
    let cpu_milli: u32 = row.uint(c.cpu)?;
    let memory_mib: u64 = row.uint(c.memory)?;
    let gpus: u16 = row.uint(c.gpu)?;
    if gpus > MAX_NODE_GPUS {
        return Err(Bad::new(
            "gpu",
            format!("{gpus} GPUs on one node (at most {MAX_NODE_GPUS})"),
        ));
    }
    let model_field = row.get(c.model)?;
    let gpu_model = match (gpus, model_field) {
        (0, _) => None,
        (_, "") => return Err(Bad::new("model", format!("{gpus} GPUs but no model"))),
        (_, model) => match catalog.id(model) {
            Some(id) => Some(catalog.get(id).name.clone()),
            None => return Err(Bad::new("model", format!("unknown GPU model {model:?}"))),
        },
    };
    let nvlink = gpu_model
        .as_deref()
        .is_some_and(|m| gpus == 8 && NVLINK_MODELS.contains(&m));
    Ok(NodeGroupSpec {
        count: 1,
        name_prefix: None,
        names: vec![sn.to_string()],
        gpu_model,
        gpus,
        nvlink_domain: if nvlink { gpus } else { 0 },
        cpu_milli,
        memory_mib,
        mig_gpus: None,
        mig_layout: Vec::new(),
    })
}

struct PodCols {
    name: Col,
    cpu: Col,
    memory: Col,
    num_gpu: Col,
    gpu_milli: Col,
    /// Present in the 11-column schema only.
    full: Option<FullCols>,
}

struct FullCols {
    gpu_spec: Col,
    qos: Col,
    creation: Col,
    deletion: Col,
}

/// Parses an openb pod list, 11-column (`name,cpu_milli,memory_mib,num_gpu,gpu_milli,
/// gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time`) or 5-column
/// (`name,cpu_milli,memory_mib,num_gpu,gpu_milli`, the multigpu variants), told apart by
/// the header.
///
/// Each pod is a one-worker job in file order with id = its index among kept rows:
/// - GPUs: `num_gpu` = 0 → CPU-only (whatever `gpu_milli` says, as in the FGD simulator);
///   one GPU with `gpu_milli` < 1000 → `Milli(gpu_milli)`; otherwise `Whole(num_gpu)`
///   (multi-GPU pods take whole GPUs, as FGD's do). `gpu_milli` outside 0..=1000, or 0
///   on a GPU pod, skips the row.
/// - `gpu_spec` (`|`-separated models) → allowed models, empty → any; a model not in
///   `catalog` skips the row.
/// - submit = `creation_time`; work = `deletion_time - creation_time` (at least 0): the
///   pod's observed lifetime. 5-column files carry no times: both are 0.
/// - qos `LS` (latency-sensitive) → priority 1 and not preemptible; other classes →
///   priority 0, preemptible. Tenant = the qos class (`default` when absent).
/// - `pod_phase` and `scheduled_time` are ignored: the FGD experiment replays every pod.
pub fn parse_openb_pods(
    name: &str,
    text: &str,
    catalog: &GpuCatalog,
) -> Result<(Vec<Job>, ParseReport), DatasetError> {
    let (rows, report) = parse_pods(name, text, catalog, false)?;
    Ok((rows.into_iter().map(|(job, _)| job).collect(), report))
}

/// What the incumbent scheduler did with one pod, as its log records it (times in the
/// file's clock, seconds, like [`Job::submit_time`] of [`parse_openb_pods`]).
#[derive(Clone, Debug, PartialEq)]
pub struct RecordedRun {
    pub created: f64,
    /// `scheduled_time`; `None` when empty (the pod was never scheduled, e.g. `Pending`).
    pub scheduled: Option<f64>,
    pub deleted: f64,
    /// The node it ran on, from an optional `node` column (openb publishes none).
    pub node: Option<String>,
}

/// Parses an 11-column openb pod list as [`parse_openb_pods`] does, keeping with each job
/// what the incumbent did: `scheduled_time` and, when the file has a `node` column, the
/// node. A row whose `scheduled_time` is not a number, is before `creation_time` or after
/// `deletion_time` is skipped with its line, like every malformed row. A 5-column file
/// records no times: an error.
pub fn parse_openb_recorded(
    name: &str,
    text: &str,
    catalog: &GpuCatalog,
) -> Result<(Vec<(Job, RecordedRun)>, ParseReport), DatasetError> {
    let (rows, report) = parse_pods(name, text, catalog, true)?;
    let rows = rows
        .into_iter()
        .map(|(job, run)| Some((job, run?)))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| DatasetError::Malformed {
            file: name.to_string(),
            line: 1,
            field: "header".into(),
            reason: "a 5-column pod list records no creation, deletion or scheduled times".into(),
        })?;
    Ok((rows, report))
}

type PodRow = (Job, Option<RecordedRun>);

fn parse_pods(
    name: &str,
    text: &str,
    catalog: &GpuCatalog,
    recorded: bool,
) -> Result<(Vec<PodRow>, ParseReport), DatasetError> {
    let table = Table::open(name, text, POD_HEADER_FULL)?;
    let is_full = FULL_ONLY.iter().any(|c| table.has(c));
    let expected = if is_full {
        POD_HEADER_FULL
    } else {
        POD_HEADER_SHORT
    };
    let full = if is_full {
        Some(FullCols {
            gpu_spec: table.column("gpu_spec", expected)?,
            qos: table.column("qos", expected)?,
            creation: table.column("creation_time", expected)?,
            deletion: table.column("deletion_time", expected)?,
        })
    } else {
        None
    };
    let scheduled = if recorded && is_full {
        Some(table.column("scheduled_time", expected)?)
    } else {
        None
    };
    let node = (recorded && table.has("node"))
        .then(|| table.column("node", expected))
        .transpose()?;
    let cols = PodCols {
        name: table.column("name", expected)?,
        cpu: table.column("cpu_milli", expected)?,
        memory: table.column("memory_mib", expected)?,
        num_gpu: table.column("num_gpu", expected)?,
        gpu_milli: table.column("gpu_milli", expected)?,
        full,
    };
    let mut report = ParseReport::new(name);
    let mut jobs = Vec::new();
    // A pod name is its identity in the trace (and in a recorded run's outcomes), so a
    // second row with the same name is skipped, not merged or renamed.
    let mut first_line: HashMap<String, usize> = HashMap::new();
    table.for_each_row(&mut report, |row| {
        let id = JobId(u32::try_from(jobs.len()).map_err(|_| Bad::new("name", "too many rows"))?);
        let job = parse_pod(row, &cols, catalog, id)?;
        job.validate()
            .map_err(|e| Bad::new("record", e.to_string()))?;
        if let Some(first) = first_line.get(&job.name) {
            return Err(Bad::new(
                "name",
                format!("duplicate pod name {:?} (first on line {first})", job.name),
            ));
        }
        let run = match (&cols.full, scheduled) {
            (Some(f), Some(s)) => Some(recorded_run(row, f, s, node)?),
            _ => None,
        };
        first_line.insert(job.name.clone(), row.line);
        jobs.push((job, run));
        Ok(())
    });
    if jobs.is_empty() {
        return Err(report.no_valid_rows());
    }
    Ok((jobs, report))
}

fn parse_pod(row: &Row<'_>, c: &PodCols, catalog: &GpuCatalog, id: JobId) -> Result<Job, Bad> {
    let name = row.text(c.name)?;
    let cpu_milli: u32 = row.uint(c.cpu)?;
    let memory_mib: u64 = row.uint(c.memory)?;
    let num_gpu: u16 = row.uint(c.num_gpu)?;
    let gpu_milli: u16 = row.uint(c.gpu_milli)?;
    if gpu_milli > 1000 {
        return Err(Bad::new(
            "gpu_milli",
            format!("{gpu_milli} is outside 0..=1000"),
        ));
    }
    let gpu = match (num_gpu, gpu_milli) {
        (0, _) => GpuDemand::None,
        (n, 0) => {
            return Err(Bad::new(
                "gpu_milli",
                format!("0 on a pod that asks for {n} GPUs"),
            ));
        }
        (1, m) if m < 1000 => GpuDemand::Milli(m),
        (n, _) => GpuDemand::Whole(n),
    };
    let mut job = Job {
        id,
        name: name.to_string(),
        tenant: "default".to_string(),
        priority: 0,
        workers: 1,
        gpu,
        cpu_milli,
        memory_mib,
        gpu_models: GpuModelSet::ANY,
        comm: CommPattern::None,
        workload: None,
        batch_size: None,
        total_work: 0.0,
        checkpoint: Checkpointing::default(),
        preemptible: true,
        elastic: None,
        submit_time: 0.0,
    };
    if let Some(f) = &c.full {
        job.gpu_models = gpu_models(row.get(f.gpu_spec)?, catalog)?;
        let qos = row.get(f.qos)?;
        if !qos.is_empty() {
            job.tenant = qos.to_string();
        }
        if qos == "LS" {
            job.priority = 1;
            job.preemptible = false;
        }
        let creation = row.time_s(f.creation)?;
        let deletion = row.time_s(f.deletion)?;
        job.submit_time = creation;
        job.total_work = (deletion - creation).max(0.0);
    }
    Ok(job)
}

fn recorded_run(
    row: &Row<'_>,
    f: &FullCols,
    scheduled: Col,
    node: Option<Col>,
) -> Result<RecordedRun, Bad> {
    let created = row.time_s(f.creation)?;
    let deleted = row.time_s(f.deletion)?;
    let scheduled_at = match row.get(scheduled)? {
        "" => None,
        _ => Some(row.time_s(scheduled)?),
    };
    if let Some(t) = scheduled_at
        && !(created..=deleted).contains(&t)
    {
        return Err(Bad::new(
            "scheduled_time",
            format!("{t} is outside creation_time..=deletion_time ({created}..={deleted})"),
        ));
    }
    let node = node
        .map(|c| row.get(c))
        .transpose()?
        .filter(|n| !n.is_empty())
        .map(String::from);
    Ok(RecordedRun {
        created,
        scheduled: scheduled_at,
        deleted,
        node,
    })
}

fn gpu_models(spec: &str, catalog: &GpuCatalog) -> Result<GpuModelSet, Bad> {
    let mut ids = Vec::new();
    for model in spec.split('|').map(str::trim).filter(|m| !m.is_empty()) {
        match catalog.id(model) {
            Some(id) => ids.push(id),
            None => {
                return Err(Bad::new("gpu_spec", format!("unknown GPU model {model:?}")));
            }
        }
    }
    Ok(GpuModelSet::of(ids))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: &str = "sn,cpu_milli,memory_mib,gpu,model
n0,64000,262144,2,P100
n1,64000,262144,2,P100
n2,96000,393216,8,G2
n3,96000,393216,8,G2
n4,64000,262144,2,P100
n5,32000,131072,0,
n6,96000,393216,4,V100M16
";

    #[test]
    fn consecutive_identical_nodes_form_one_group_keeping_names() {
        let (spec, report) = parse_openb_nodes("nodes.csv", NODES).unwrap();
        assert_eq!(report.rows_read, 7);
        assert_eq!(report.rows_skipped, 0);
        assert_eq!(spec.name, "nodes");
        let shapes: Vec<_> = spec
            .node_groups
            .iter()
            .map(|g| (g.count, g.gpus, g.gpu_model.as_deref(), g.nvlink_domain))
            .collect();
        assert_eq!(
            shapes,
            vec![
                (2, 2, Some("P100"), 0),
                (2, 8, Some("G2"), 8),
                (1, 2, Some("P100"), 0),
                (1, 0, None, 0),
                (1, 4, Some("V100M16"), 0),
            ]
        );
        assert_eq!(spec.node_groups[1].names, vec!["n2", "n3"]);
        assert_eq!(spec.gpu_count(), 2 * 2 + 16 + 2 + 4);
    }

    #[test]
    fn bad_node_rows_are_skipped_with_line_and_field() {
        let text = format!(
            "{NODES}n7,abc,1,1,T4\nn8,1000,1,2,Z9000\nn9,1000,1,2,\nn0,1000,1,1,T4\nn10,-5,1,1,T4\n"
        );
        let (spec, report) = parse_openb_nodes("nodes.csv", &text).unwrap();
        assert_eq!(spec.node_count(), 7);
        assert_eq!(report.rows_read, 12);
        assert_eq!(report.rows_skipped, 5);
        let got: Vec<_> = report.skipped_at();
        assert_eq!(
            got,
            vec![
                (9, "cpu_milli"),
                (10, "model"),
                (11, "model"),
                (12, "sn"),
                (13, "cpu_milli")
            ]
        );
        assert!(report.skipped[1].reason.contains("Z9000"));
        assert!(report.skipped[4].reason.contains("negative"));
    }

    #[test]
    fn node_list_without_header_or_rows_is_an_error_naming_the_file() {
        let err = parse_openb_nodes("bad.csv", "n0,64000,262144,2,P100\n").unwrap_err();
        assert!(
            matches!(&err, DatasetError::Malformed { file, line: 1, field, .. }
                if file == "bad.csv" && field == "sn"),
            "{err}"
        );
        let err = parse_openb_nodes("none.csv", "sn,cpu_milli,memory_mib,gpu,model\nx,1,1,1,Z\n")
            .unwrap_err();
        assert!(
            matches!(&err, DatasetError::NoValidRows { file, rows_skipped: 1, .. } if file == "none.csv")
        );
        assert!(err.to_string().contains("unknown GPU model"), "{err}");
        let err = parse_openb_nodes("empty.csv", "").unwrap_err();
        assert!(err.to_string().contains("empty.csv"), "{err}");
    }

    const PODS: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
p0,12000,16384,1,1000,,LS,Running,0,100,0
p1,6000,12288,1,460,T4|P100,BE,Running,50,40,50
p2,4000,8192,0,0,,Burstable,Pending,60,70,
p3,8000,8192,4,1000,V100M32,,Failed,70,170,70
";

    #[test]
    fn a_second_pod_with_the_same_name_is_skipped_naming_the_first() {
        let catalog = GpuCatalog::default();
        let text = format!("{PODS}p1,1000,1024,0,0,,BE,Running,80,90,80\n");
        let (jobs, report) = parse_openb_pods("pods.csv", &text, &catalog).unwrap();
        assert_eq!(jobs.len(), 4);
        assert_eq!(jobs[1].cpu_milli, 6000, "the first p1 is kept");
        assert_eq!(report.skipped.len(), 1);
        assert_eq!(
            (report.skipped[0].line, report.skipped[0].field.as_str()),
            (6, "name")
        );
        assert!(
            report.skipped[0]
                .reason
                .contains("duplicate pod name \"p1\" (first on line 3)"),
            "{}",
            report.skipped[0].reason
        );
    }

    #[test]
    fn pods_map_to_one_worker_jobs() {
        let catalog = GpuCatalog::default();
        let (jobs, report) = parse_openb_pods("pods.csv", PODS, &catalog).unwrap();
        assert_eq!(report.rows_kept(), 4);
        assert_eq!(jobs.len(), 4);
        let ids: Vec<_> = jobs.iter().map(|j| j.id.0).collect();
        assert_eq!(ids, vec![0, 1, 2, 3]);
        let p0 = &jobs[0];
        assert_eq!(p0.gpu, GpuDemand::Whole(1));
        assert_eq!(
            (p0.priority, p0.preemptible, p0.tenant.as_str()),
            (1, false, "LS")
        );
        assert_eq!((p0.submit_time, p0.total_work), (0.0, 100.0));
        let p1 = &jobs[1];
        assert_eq!(p1.gpu, GpuDemand::Milli(460));
        assert!(p1.preemptible);
        assert_eq!(p1.total_work, 0.0, "deletion before creation clamps to 0");
        assert!(p1.gpu_models.allows(catalog.id("T4").unwrap()));
        assert!(!p1.gpu_models.allows(catalog.id("V100M16").unwrap()));
        assert_eq!(jobs[2].gpu, GpuDemand::None);
        assert_eq!(jobs[3].gpu, GpuDemand::Whole(4));
        assert_eq!(jobs[3].tenant, "default");
        assert!(
            jobs.iter()
                .all(|j| j.workers == 1 && j.comm == CommPattern::None)
        );
    }

    #[test]
    fn recorded_pods_keep_scheduled_times_and_nodes() {
        let catalog = GpuCatalog::default();
        let (rows, report) = parse_openb_recorded("pods.csv", PODS, &catalog).unwrap();
        assert_eq!(
            report.rows_skipped, 1,
            "p1 was deleted before it was scheduled"
        );
        assert_eq!(report.skipped[0].line, 3);
        assert_eq!(report.skipped[0].field, "scheduled_time");
        let runs: Vec<_> = rows.iter().map(|(_, r)| (r.scheduled, r.deleted)).collect();
        assert_eq!(
            runs,
            [(Some(0.0), 100.0), (None, 70.0), (Some(70.0), 170.0)]
        );
        let with_node = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,\
                         creation_time,deletion_time,scheduled_time,node\n\
                         p0,1,1,1,1000,,BE,Running,0,9,2,n7\n";
        let (rows, _) = parse_openb_recorded("n.csv", with_node, &catalog).unwrap();
        assert_eq!(rows[0].1.node.as_deref(), Some("n7"));
        let short = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,1,1000\n";
        let err = parse_openb_recorded("short.csv", short, &catalog).unwrap_err();
        assert!(err.to_string().contains("records no"), "{err}");
    }

    #[test]
    fn five_column_pods_have_no_times_or_constraints() {
        let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,2,1000\np1,1000,1024,1,250\n";
        let (jobs, _) = parse_openb_pods("short.csv", text, &GpuCatalog::default()).unwrap();
        assert_eq!(jobs[0].gpu, GpuDemand::Whole(2));
        assert_eq!(jobs[1].gpu, GpuDemand::Milli(250));
        assert!(jobs.iter().all(|j| j.submit_time == 0.0
            && j.total_work == 0.0
            && j.gpu_models.is_any()
            && j.tenant == "default"));
    }

    #[test]
    fn bad_pod_rows_are_skipped_with_line_and_field() {
        let text = format!(
            "{PODS}p4,1000,1024,1,1500,,BE,Running,0,1,0
p5,1000,1024,1,0,,BE,Running,0,1,0
p6,1000,1024,1,500,H9000,BE,Running,0,1,0
p7,1000,1024,1,500,,BE,Running,NaN,1,0
p8,1000,1024,x,500,,BE,Running,0,1,0
p9,1000,1024,1,500,,BE
pb,1000,1024,1,500,,BE,Running,0,1e308,0
"
        );
        let (jobs, report) = parse_openb_pods("pods.csv", &text, &GpuCatalog::default()).unwrap();
        assert_eq!(jobs.len(), 4);
        assert_eq!(report.rows_read, 11);
        assert_eq!(report.rows_skipped, 7);
        let got: Vec<_> = report.skipped_at();
        assert_eq!(
            got,
            vec![
                (6, "gpu_milli"),
                (7, "gpu_milli"),
                (8, "gpu_spec"),
                (9, "creation_time"),
                (10, "num_gpu"),
                (11, "creation_time"),
                (12, "deletion_time"),
            ]
        );
        assert!(report.skipped[6].reason.contains("beyond any trace"));
        assert!(report.skipped[2].reason.contains("H9000"));
        assert!(report.skipped[3].reason.contains("not a number"));
        assert!(report.skipped[5].reason.contains("missing"));
    }

    #[test]
    fn pod_header_missing_a_column_is_an_error_naming_file_and_column() {
        let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,creation_time\n";
        let err = parse_openb_pods("cut.csv", text, &GpuCatalog::default()).unwrap_err();
        assert!(
            matches!(&err, DatasetError::Malformed { file, field, .. }
                if file == "cut.csv" && field == "deletion_time"),
            "{err}"
        );
        let err = parse_openb_pods("hdr.csv", "name,cpu\n", &GpuCatalog::default()).unwrap_err();
        assert!(err.to_string().contains("cpu_milli"), "{err}");
    }
}
