//! Protobuf ↔ domain conversion, at the edge only: wire types stop here, and every
//! request field is validated on the way in, with errors that name the field.

use crate::domain::{
    Checkpointing, ClusterState, CommPattern, GpuCatalog, GpuDemand, GpuModelSet, GpuShare, Job,
    JobId, MIG_COMPUTE_SLICES, MIG_MEMORY_SLICES, MigLayoutSpec, MigMode, NodeGroupSpec, Placement,
    Topology,
};
use crate::service::error::ServiceError;
use crate::service::jobs::{JobRecord, JobState};
use crate::service::pb;

/// Longest name, tenant or idempotency key accepted, in bytes.
pub const MAX_TEXT: usize = 256;
/// Longest free-text reason (Cancel, Drain, Cordon) accepted, and longest agent report
/// message kept, in bytes: each is stored on its job or node and returned by every List.
pub const MAX_REASON: usize = 1024;
/// Largest gang accepted.
pub const MAX_WORKERS: u32 = 100_000;

fn text(field: &str, value: &str) -> Result<(), ServiceError> {
    checked_text(field, value, MAX_TEXT, char::is_control)
}

/// An operator's reason: at most [`MAX_REASON`] bytes; newlines and tabs allowed, other
/// control characters not.
pub fn reason(field: &str, value: &str) -> Result<(), ServiceError> {
    checked_text(field, value, MAX_REASON, is_control_but_line_break)
}

fn checked_text(
    field: &str,
    value: &str,
    max: usize,
    forbidden: impl Fn(char) -> bool,
) -> Result<(), ServiceError> {
    if value.len() > max {
        return Err(ServiceError::invalid(
            field,
            format!("{} bytes, at most {max}", value.len()),
        ));
    }
    if value.chars().any(forbidden) {
        return Err(ServiceError::invalid(field, "contains control characters"));
    }
    Ok(())
}

/// Control characters a free-text reason may not hold: all but newline and tab.
fn is_control_but_line_break(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}

/// An agent's report message, kept whatever it holds (refusing it would lose the report):
/// control characters other than newlines and tabs become spaces, and it is cut to
/// [`MAX_REASON`] bytes on a character boundary.
pub fn report_message(value: &str) -> String {
    let mut out: String = value
        .chars()
        .map(|c| if is_control_but_line_break(c) { ' ' } else { c })
        .collect();
    out.truncate(out.floor_char_boundary(MAX_REASON));
    out
}

pub fn demand_from_pb(gpu: Option<&pb::GpuDemand>) -> Result<GpuDemand, ServiceError> {
    use pb::gpu_demand::Kind;
    Ok(match gpu.and_then(|g| g.kind.as_ref()) {
        None => GpuDemand::None,
        Some(Kind::Whole(n)) => {
            if *n == 0 || *n > 64 {
                return Err(ServiceError::invalid(
                    "spec.gpu.whole",
                    format!("{n} GPUs per worker; must be 1..=64 (leave gpu unset for CPU-only)"),
                ));
            }
            GpuDemand::Whole(*n as u16)
        }
        Some(Kind::Milli(m)) => {
            if *m == 0 || *m >= 1000 {
                return Err(ServiceError::invalid(
                    "spec.gpu.milli",
                    format!("{m} is outside 1..=999 (use whole = 1 for a whole GPU)"),
                ));
            }
            GpuDemand::Milli(*m as u16)
        }
        Some(Kind::Mig(p)) => mig_demand("spec.gpu.mig", p)?,
    })
}

/// A MIG profile from the wire, checked against the slices a GPU has.
pub fn mig_demand(field: &str, p: &pb::MigProfile) -> Result<GpuDemand, ServiceError> {
    let (c, m) = (p.compute_slices, p.memory_slices);
    if c == 0 || c > MIG_COMPUTE_SLICES as u32 || m == 0 || m > MIG_MEMORY_SLICES as u32 {
        return Err(ServiceError::invalid(
            field,
            format!(
                "{c}c/{m}m does not exist (compute 1..={MIG_COMPUTE_SLICES}, memory 1..={MIG_MEMORY_SLICES})"
            ),
        ));
    }
    Ok(GpuDemand::Mig {
        compute: c as u8,
        memory: m as u8,
    })
}

pub fn demand_to_pb(d: GpuDemand) -> Option<pb::GpuDemand> {
    use pb::gpu_demand::Kind;
    let kind = match d {
        GpuDemand::None => return None,
        GpuDemand::Whole(n) => Kind::Whole(n as u32),
        GpuDemand::Milli(m) => Kind::Milli(m as u32),
        GpuDemand::Mig { compute, memory } => Kind::Mig(pb::MigProfile {
            compute_slices: compute as u32,
            memory_slices: memory as u32,
        }),
    };
    Some(pb::GpuDemand { kind: Some(kind) })
}

fn comm_from_pb(v: i32) -> Result<CommPattern, ServiceError> {
    Ok(match pb::CommPattern::try_from(v) {
        Ok(pb::CommPattern::Unspecified | pb::CommPattern::None) => CommPattern::None,
        Ok(pb::CommPattern::DataParallel) => CommPattern::DataParallel,
        Ok(pb::CommPattern::TensorParallel) => CommPattern::TensorParallel,
        Ok(pb::CommPattern::PipelineParallel) => CommPattern::PipelineParallel,
        Err(_) => {
            return Err(ServiceError::invalid(
                "spec.comm",
                format!("unknown value {v}"),
            ));
        }
    })
}

fn comm_to_pb(c: CommPattern) -> pb::CommPattern {
    match c {
        CommPattern::None => pb::CommPattern::None,
        CommPattern::DataParallel => pb::CommPattern::DataParallel,
        CommPattern::TensorParallel => pb::CommPattern::TensorParallel,
        CommPattern::PipelineParallel => pb::CommPattern::PipelineParallel,
    }
}

/// A validated job from a request's spec. `submit_s` is the wall clock in Unix seconds.
pub fn job_from_spec(
    spec: Option<&pb::JobSpec>,
    id: JobId,
    submit_s: f64,
    catalog: &GpuCatalog,
) -> Result<(Job, Option<String>), ServiceError> {
    let spec = spec.ok_or_else(|| ServiceError::invalid("spec", "missing"))?;
    text("spec.name", &spec.name)?;
    text("spec.tenant", &spec.tenant)?;
    text("spec.idempotency_key", &spec.idempotency_key)?;
    if spec.workers == 0 || spec.workers > MAX_WORKERS {
        return Err(ServiceError::invalid(
            "spec.workers",
            format!("{} workers; must be 1..={MAX_WORKERS}", spec.workers),
        ));
    }
    let gpu = demand_from_pb(spec.gpu.as_ref())?;
    if gpu == GpuDemand::None && spec.cpu_milli == 0 && spec.memory_mib == 0 {
        return Err(ServiceError::invalid(
            "spec",
            "asks for nothing (no GPU, CPU or memory)",
        ));
    }
    let mut models = Vec::with_capacity(spec.gpu_models.len());
    for (i, name) in spec.gpu_models.iter().enumerate() {
        let id = catalog.id(name).ok_or_else(|| {
            let known: Vec<&str> = catalog.iter().map(|(_, m)| m.name.as_str()).collect();
            ServiceError::invalid(
                &format!("spec.gpu_models[{i}]"),
                format!("unknown GPU model {name:?}; known: {}", known.join(", ")),
            )
        })?;
        models.push(id);
    }
    let runtime = spec.expected_runtime_s;
    if !(runtime.is_finite() && runtime >= 0.0) {
        return Err(ServiceError::invalid(
            "spec.expected_runtime_s",
            format!("{runtime} is not a finite non-negative number"),
        ));
    }
    let job = Job {
        id,
        name: if spec.name.is_empty() {
            format!("job-{}", id.0)
        } else {
            spec.name.clone()
        },
        tenant: if spec.tenant.is_empty() {
            "default".into()
        } else {
            spec.tenant.clone()
        },
        priority: spec.priority,
        workers: spec.workers,
        gpu,
        cpu_milli: spec.cpu_milli,
        memory_mib: spec.memory_mib,
        gpu_models: GpuModelSet::of(models),
        comm: comm_from_pb(spec.comm)?,
        workload: None,
        batch_size: None,
        total_work: runtime,
        checkpoint: Checkpointing::default(),
        preemptible: spec.preemptible,
        elastic: None,
        submit_time: submit_s,
    };
    job.validate()
        .map_err(|e| ServiceError::invalid("spec", e))?;
    let key = (!spec.idempotency_key.is_empty()).then(|| spec.idempotency_key.clone());
    Ok((job, key))
}

pub fn spec_to_pb(job: &Job, catalog: &GpuCatalog, key: Option<&str>) -> pb::JobSpec {
    pb::JobSpec {
        name: job.name.clone(),
        tenant: job.tenant.clone(),
        priority: job.priority,
        workers: job.workers,
        gpu: demand_to_pb(job.gpu),
        cpu_milli: job.cpu_milli,
        memory_mib: job.memory_mib,
        gpu_models: job
            .gpu_models
            .ids()
            // A stored decision's ids may predate the inventory (`service::inventory`).
            .map(|id| {
                catalog.try_get(id).map_or_else(
                    || format!("model id {} (not in the inventory)", id.0),
                    |m| m.name.clone(),
                )
            })
            .collect(),
        comm: comm_to_pb(job.comm) as i32,
        preemptible: job.preemptible,
        expected_runtime_s: job.total_work,
        idempotency_key: key.unwrap_or_default().to_string(),
    }
}

pub fn slot_to_pb(share: &GpuShare, topo: &Topology) -> pb::GpuSlot {
    pb::GpuSlot {
        index: topo.gpu(share.gpu).index as u32,
        milli: share.milli as u32,
        mig_compute: share.mig_compute as u32,
        mig_memory: share.mig_memory as u32,
    }
}

pub fn placement_to_pb(p: &Placement, topo: &Topology) -> Vec<pb::WorkerPlacement> {
    p.workers
        .iter()
        .enumerate()
        .map(|(i, w)| pb::WorkerPlacement {
            worker: i as u32,
            node: topo.node(w.node).name.clone(),
            gpus: w.gpus.iter().map(|s| slot_to_pb(s, topo)).collect(),
        })
        .collect()
}

pub fn state_to_pb(s: JobState) -> pb::JobState {
    match s {
        JobState::Pending => pb::JobState::Pending,
        JobState::Placed => pb::JobState::Placed,
        JobState::Running => pb::JobState::Running,
        JobState::Completed => pb::JobState::Completed,
        JobState::Failed => pb::JobState::Failed,
        JobState::Preempted => pb::JobState::Preempted,
        JobState::Requeued => pb::JobState::Requeued,
        JobState::Cancelled => pb::JobState::Cancelled,
        JobState::Rejected => pb::JobState::Rejected,
    }
}

pub fn state_from_pb(field: &str, v: i32) -> Result<JobState, ServiceError> {
    let s = pb::JobState::try_from(v)
        .map_err(|_| ServiceError::invalid(field, format!("unknown job state {v}")))?;
    JobState::ALL
        .into_iter()
        .find(|&j| state_to_pb(j) == s)
        .ok_or_else(|| ServiceError::invalid(field, "JOB_STATE_UNSPECIFIED"))
}

pub fn job_to_pb(r: &JobRecord, topo: &Topology) -> pb::Job {
    pb::Job {
        id: r.job.id.0 as u64,
        spec: Some(spec_to_pb(
            &r.job,
            &topo.catalog,
            r.idempotency_key.as_deref(),
        )),
        state: state_to_pb(r.state) as i32,
        reason: r.reason.clone(),
        placement: r
            .placement
            .as_ref()
            .map(|p| placement_to_pb(p, topo))
            .unwrap_or_default(),
        submitted_at_us: r.submitted_at_us,
        updated_at_us: r.updated_at_us,
        decision_id: r.decision_id,
        attempts: r.attempts,
        last_checkpoint_unix_s: r.last_checkpoint_s.unwrap_or(0.0),
    }
}

/// A job id from the wire (u64) to the domain's u32.
pub fn job_id(field: &str, v: u64) -> Result<JobId, ServiceError> {
    if v == 0 {
        return Err(ServiceError::invalid(field, "missing (job ids start at 1)"));
    }
    u32::try_from(v)
        .map(JobId)
        .map_err(|_| ServiceError::NotFound(format!("job {v} does not exist")))
}

/// A node's hardware as a one-node group of a cluster spec.
pub fn node_group(field: &str, info: Option<&pb::NodeInfo>) -> Result<NodeGroupSpec, ServiceError> {
    let info = info.ok_or_else(|| ServiceError::invalid(field, "missing"))?;
    if info.name.is_empty() {
        return Err(ServiceError::invalid(&format!("{field}.name"), "missing"));
    }
    text(&format!("{field}.name"), &info.name)?;
    if info.gpus > 64 {
        return Err(ServiceError::invalid(
            &format!("{field}.gpus"),
            format!("{} GPUs; at most 64 per node", info.gpus),
        ));
    }
    if info.gpus > 0 && info.gpu_model.is_empty() {
        return Err(ServiceError::invalid(
            &format!("{field}.gpu_model"),
            format!("missing for a node with {} GPUs", info.gpus),
        ));
    }
    let island = info.nvlink_domain;
    if island > 1 && (island > info.gpus || info.gpus % island != 0) {
        return Err(ServiceError::invalid(
            &format!("{field}.nvlink_domain"),
            format!(
                "{} GPUs do not split into NVLink islands of {island}",
                info.gpus
            ),
        ));
    }
    let mig_gpus = match &info.mig {
        None => None,
        Some(modes) => {
            let mut gpus = Vec::with_capacity(modes.gpus.len());
            for &g in &modes.gpus {
                if g >= info.gpus || gpus.contains(&(g as u16)) {
                    return Err(ServiceError::invalid(
                        &format!("{field}.mig.gpus"),
                        format!(
                            "GPU {g} is not one of the node's {} GPUs or is listed twice",
                            info.gpus
                        ),
                    ));
                }
                gpus.push(g as u16);
            }
            gpus.sort_unstable();
            Some(gpus)
        }
    };
    let mig_layout = match &info.mig_layout {
        None => Vec::new(),
        Some(layout) => {
            let on = mig_gpus.as_deref().ok_or_else(|| {
                ServiceError::invalid(
                    &format!("{field}.mig_layout"),
                    "set without mig (the GPUs in MIG mode)",
                )
            })?;
            reported_mig_layouts(&format!("{field}.mig_layout"), layout, on)?
        }
    };
    Ok(NodeGroupSpec {
        count: 1,
        name_prefix: None,
        names: vec![info.name.clone()],
        gpu_model: (info.gpus > 0).then(|| info.gpu_model.clone()),
        gpus: info.gpus as u16,
        nvlink_domain: island as u16,
        cpu_milli: info.cpu_milli,
        memory_mib: info.memory_mib,
        mig_gpus,
        mig_layout,
    })
}

/// A node's reported MIG instances as inventory layouts: one per GPU in MIG mode (`on`),
/// listing its instances (none for a GPU with none). Instances must be on GPUs in MIG
/// mode, with a profile name and a size that exists.
fn reported_mig_layouts(
    field: &str,
    layout: &pb::MigLayout,
    on: &[u16],
) -> Result<Vec<MigLayoutSpec>, ServiceError> {
    if layout.instances.len() > on.len() * MIG_COMPUTE_SLICES as usize {
        return Err(ServiceError::invalid(
            &format!("{field}.instances"),
            format!(
                "{} instances on {} GPUs in MIG mode (at most {MIG_COMPUTE_SLICES} each)",
                layout.instances.len(),
                on.len()
            ),
        ));
    }
    let mut per_gpu: Vec<MigLayoutSpec> = on
        .iter()
        .map(|&g| MigLayoutSpec {
            gpus: vec![g],
            instances: Vec::new(),
        })
        .collect();
    for (i, instance) in layout.instances.iter().enumerate() {
        let at = |what: &str| format!("{field}.instances[{i}].{what}");
        let slot = on
            .iter()
            .position(|&g| g as u32 == instance.gpu)
            .ok_or_else(|| {
                ServiceError::invalid(
                    &at("gpu"),
                    format!("GPU {} is not in MIG mode", instance.gpu),
                )
            })?;
        if instance.profile.is_empty() {
            return Err(ServiceError::invalid(&at("profile"), "missing"));
        }
        text(&at("profile"), &instance.profile)?;
        let size = instance
            .size
            .as_ref()
            .ok_or_else(|| ServiceError::invalid(&at("size"), "missing"))?;
        mig_demand(&at("size"), size)?;
        per_gpu[slot].instances.push(instance.profile.clone());
    }
    Ok(per_gpu)
}

/// A node's MIG modes as its registration carries them: `None` while the inventory
/// leaves MIG open, else the indices of the GPUs in MIG mode.
pub fn mig_modes(topo: &Topology, node: crate::domain::NodeId) -> Option<pb::MigModes> {
    let gpus = || topo.node(node).gpu_ids().map(|g| topo.gpu(g));
    if gpus().any(|g| g.mig == MigMode::Open) {
        return None;
    }
    Some(pb::MigModes {
        gpus: gpus()
            .filter(|g| g.mig == MigMode::On)
            .map(|g| g.index as u32)
            .collect(),
    })
}

/// A node's fixed MIG instances as its registration carries them: `None` unless every
/// GPU of the node is known to be in MIG mode or not and each in MIG mode has a fixed
/// layout (an inventory that leaves any of it to the scheduler lists no instances).
pub fn mig_layout(topo: &Topology, node: crate::domain::NodeId) -> Option<pb::MigLayout> {
    mig_modes(topo, node)?;
    let mut instances = Vec::new();
    for g in topo.node(node).gpu_ids() {
        let gpu = topo.gpu(g);
        if gpu.mig != MigMode::On {
            continue;
        }
        for slot in topo.gpu_mig_instances(g)? {
            instances.push(pb::MigInstanceInfo {
                gpu: gpu.index as u32,
                profile: slot.profile.clone(),
                size: Some(pb::MigProfile {
                    compute_slices: slot.compute as u32,
                    memory_slices: slot.memory as u32,
                }),
            });
        }
    }
    Some(pb::MigLayout { instances })
}

/// The number of GPUs of `state`'s node `i` and its idle ones, for status replies.
pub fn node_counts(state: &ClusterState, node: crate::domain::NodeId) -> (u32, u32, u64) {
    let n = state.topology().node(node);
    let free = state.node_free_milli(node) as u64;
    let cap = n.gpu_count() as u64 * 1000;
    (
        n.gpu_count() as u32,
        state.node_idle_gpus(node) as u32,
        cap.saturating_sub(free),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> pb::JobSpec {
        pb::JobSpec {
            workers: 2,
            gpu: demand_to_pb(GpuDemand::Whole(4)),
            ..Default::default()
        }
    }

    #[test]
    fn reasons_are_bounded_and_report_messages_kept_but_cut() {
        reason("reason", "maintenance\nticket 42").unwrap();
        let err = reason("reason", &"r".repeat(MAX_REASON + 1)).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("reason: {} bytes, at most {MAX_REASON}", MAX_REASON + 1)
        );
        assert!(reason("reason", "a\u{7}b").is_err());
        let kept = report_message(&format!("exit 1\u{1b}[31m{}", "é".repeat(MAX_REASON)));
        assert!(
            kept.len() <= MAX_REASON && kept.starts_with("exit 1 [31m"),
            "{kept}"
        );
        assert_eq!(report_message("exit 1\nkilled"), "exit 1\nkilled");
    }

    #[test]
    fn a_valid_spec_round_trips() {
        let catalog = GpuCatalog::default();
        let mut s = spec();
        s.gpu_models = vec!["H100".into()];
        s.comm = pb::CommPattern::TensorParallel as i32;
        let (job, key) = job_from_spec(Some(&s), JobId(3), 10.0, &catalog).unwrap();
        assert_eq!(job.gpu, GpuDemand::Whole(4));
        assert_eq!(job.name, "job-3");
        assert_eq!(key, None);
        let back = spec_to_pb(&job, &catalog, None);
        assert_eq!(back.gpu_models, vec!["H100".to_string()]);
        assert_eq!(back.workers, 2);
        assert_eq!(back.comm, s.comm);
    }

    #[test]
    fn bad_fields_are_named() {
        let catalog = GpuCatalog::default();
        let err = |s: pb::JobSpec| {
            job_from_spec(Some(&s), JobId(1), 0.0, &catalog)
                .unwrap_err()
                .to_string()
        };
        let mut s = spec();
        s.workers = 0;
        assert!(err(s).starts_with("spec.workers:"));
        let mut s = spec();
        s.gpu = Some(pb::GpuDemand {
            kind: Some(pb::gpu_demand::Kind::Milli(1000)),
        });
        assert!(err(s).starts_with("spec.gpu.milli:"));
        let mut s = spec();
        s.gpu_models = vec!["H100".into(), "Z9000".into()];
        assert!(err(s).starts_with("spec.gpu_models[1]: unknown GPU model \"Z9000\""));
        let mut s = spec();
        s.expected_runtime_s = f64::NAN;
        assert!(err(s).starts_with("spec.expected_runtime_s:"));
        let mut s = spec();
        s.comm = 42;
        assert!(err(s).starts_with("spec.comm:"));
        let mut s = spec();
        s.name = "x".repeat(300);
        assert!(err(s).starts_with("spec.name:"));
        assert_eq!(
            job_from_spec(None, JobId(1), 0.0, &catalog).unwrap_err(),
            ServiceError::invalid("spec", "missing")
        );
        assert!(job_id("job_id", 0).is_err());
    }
}
