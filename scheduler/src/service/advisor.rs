//! Advise: what the policy would do on a foreign scheduler's cluster and queue.
//! Stateless: the cluster is rebuilt from the snapshot for each call, and nothing here
//! touches the primary scheduler's state (decision records aside, for Explain).

use std::sync::Arc;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::domain::{
    ClusterSpec, ClusterState, GpuDemand, GpuId, GpuModelSet, GpuShare, Job, JobId, LinkSpec,
    NodeId, Placement, Topology, WorkerPlacement,
};
use crate::framework::{Context, Pending, QuotaConfig, TenantUsage, can_ever_fit, run_cycle};
use crate::service::convert::{job_from_spec, mig_demand, node_group};
use crate::service::error::ServiceError;
use crate::service::model::{DecisionPath, ModelSlot, NoModel};
use crate::service::pb;
use crate::service::records::{
    DecisionRecord, Verdict, WorkerRecord, candidates, learned_score_note, scored_candidates,
};

pub const MAX_SNAPSHOT_NODES: usize = 20_000;
pub const MAX_PENDING: usize = 10_000;

fn prefixed(prefix: &str, e: ServiceError) -> ServiceError {
    match e {
        ServiceError::InvalidArgument(m) => ServiceError::InvalidArgument(format!("{prefix}{m}")),
        other => other,
    }
}

/// A job that holds what a snapshot says is in use, so the rebuilt state has it taken.
fn occupant(gpu: GpuDemand, cpu_milli: u32, memory_mib: u64) -> Job {
    let mut job = Job::whole_gpus(JobId(0), 1, 0.0, 0.0);
    job.name = "snapshot-usage".into();
    job.gpu = gpu;
    job.cpu_milli = cpu_milli;
    job.memory_mib = memory_mib;
    job.gpu_models = GpuModelSet::ANY;
    job
}

/// The cluster state a snapshot describes.
pub fn snapshot_state(
    snapshot: Option<&pb::ClusterSnapshot>,
) -> Result<ClusterState, ServiceError> {
    let snap = snapshot.ok_or_else(|| ServiceError::invalid("cluster", "missing"))?;
    if snap.nodes.is_empty() || snap.nodes.len() > MAX_SNAPSHOT_NODES {
        return Err(ServiceError::invalid(
            "cluster.nodes",
            format!(
                "{} nodes; must be 1..={MAX_SNAPSHOT_NODES}",
                snap.nodes.len()
            ),
        ));
    }
    let mut groups = Vec::with_capacity(snap.nodes.len());
    let mut names = std::collections::HashSet::new();
    for (i, n) in snap.nodes.iter().enumerate() {
        let g = node_group(&format!("cluster.nodes[{i}].node"), n.node.as_ref())?;
        if !names.insert(g.names[0].clone()) {
            return Err(ServiceError::invalid(
                &format!("cluster.nodes[{i}].node.name"),
                format!("{:?} appears twice", g.names[0]),
            ));
        }
        groups.push(g);
    }
    let spec = ClusterSpec {
        name: if snap.name.is_empty() {
            "snapshot".into()
        } else {
            snap.name.clone()
        },
        nodes_per_rack: if snap.nodes_per_rack == 0 {
            16
        } else {
            snap.nodes_per_rack
        },
        racks_per_spine: if snap.racks_per_spine == 0 {
            8
        } else {
            snap.racks_per_spine
        },
        links: LinkSpec::default(),
        gpu_models: vec![],
        node_groups: groups,
    };
    let topo = Topology::build(&spec).map_err(|e| ServiceError::invalid("cluster", e))?;
    let mut state = ClusterState::new(Arc::new(topo));
    for (i, n) in snap.nodes.iter().enumerate() {
        let node = NodeId(i as u32);
        let field = format!("cluster.nodes[{i}]");
        let first_gpu = state.topology().node(node).gpus.start;
        let gpus = state.topology().node(node).gpu_count() as u32;
        for (k, u) in n.gpus_used.iter().enumerate() {
            let usage = format!("{field}.gpus_used[{k}]");
            let milli_ok = match u.mig {
                Some(_) => u.milli == 0,
                None => (1..=1000).contains(&u.milli),
            };
            if u.index >= gpus || !milli_ok {
                return Err(ServiceError::invalid(
                    &usage,
                    format!(
                        "GPU {} with {} milli in use (node has {gpus} GPUs; milli 1..=1000, or 0 for a MIG instance)",
                        u.index, u.milli
                    ),
                ));
            }
            let demand = match &u.mig {
                Some(p) => mig_demand(&format!("{usage}.mig"), p)?,
                None if u.milli == 1000 => GpuDemand::Whole(1),
                None => GpuDemand::Milli(u.milli as u16),
            };
            let gpu = GpuId(first_gpu + u.index);
            let placement = Placement {
                workers: vec![WorkerPlacement {
                    node,
                    gpus: vec![GpuShare::for_demand(gpu, demand)],
                }],
            };
            state
                .allocate(&occupant(demand, 0, 0), &placement)
                .map_err(|e| ServiceError::invalid(&format!("{field}.gpus_used[{k}]"), e))?;
        }
        if n.cpu_used_milli > 0 || n.memory_used_mib > 0 {
            let placement = Placement {
                workers: vec![WorkerPlacement { node, gpus: vec![] }],
            };
            state
                .allocate(
                    &occupant(GpuDemand::None, n.cpu_used_milli, n.memory_used_mib),
                    &placement,
                )
                .map_err(|e| ServiceError::invalid(&field, e))?;
        }
        if !n.schedulable {
            state.set_node_up(node, false);
        }
    }
    Ok(state)
}

/// The policy that decided, its recommendations and the decision records behind them.
pub type Advice = (String, Vec<pb::Recommendation>, Vec<DecisionRecord>);

/// What the server's configuration adds to every `Advise` call's policy.
#[derive(Clone, Debug, Default)]
pub struct AdviseOptions {
    /// [`crate::service::ServiceConfig::cpu_nodes_first`].
    pub cpu_nodes_first: bool,
    /// The server's per-tenant quota, counted against the snapshot's
    /// `ClusterSnapshot.tenants` (`[quota]`).
    pub quota: Option<Arc<QuotaConfig>>,
}

impl AdviseOptions {
    pub fn of(config: &crate::service::ServiceConfig) -> Self {
        AdviseOptions {
            cpu_nodes_first: config.cpu_nodes_first,
            quota: config.quota.clone().map(Arc::new),
        }
    }
}

/// A tenant name longer than any a scheduler would use; refused rather than stored.
const MAX_TENANT_BYTES: usize = 256;

/// What the snapshot says each tenant holds.
fn tenant_holdings(snapshot: Option<&pb::ClusterSnapshot>) -> Result<TenantUsage, ServiceError> {
    let mut usage = TenantUsage::default();
    let mut seen = std::collections::HashSet::new();
    for (i, t) in snapshot.map_or(&[][..], |s| &s.tenants).iter().enumerate() {
        let field = |f: &str| format!("cluster.tenants[{i}].{f}");
        if t.tenant.len() > MAX_TENANT_BYTES {
            return Err(ServiceError::invalid(
                &field("tenant"),
                format!("{} bytes; at most {MAX_TENANT_BYTES}", t.tenant.len()),
            ));
        }
        if !seen.insert(t.tenant.as_str()) {
            return Err(ServiceError::invalid(
                &field("tenant"),
                format!("{:?} is listed twice", t.tenant),
            ));
        }
        usage.hold(&t.tenant, t.gpu_milli, t.cpu_milli);
    }
    Ok(usage)
}

/// [`advise`] for an RPC: on a blocking thread (building a cluster and running a cycle
/// is CPU work, kept off the I/O threads), with `model`'s decision path and current
/// setup when the call's policy is the learned one, at the current time.
///
/// `slots` bounds the calls computed at once (`max_concurrent_advise`): each holds a
/// blocking thread and its cluster, so a burst would otherwise take up to tokio's 512
/// blocking threads. Calls beyond it wait their turn, in order.
pub async fn advise_off_thread(
    req: pb::AdviseRequest,
    default_policy: &str,
    model: &dyn ModelSlot,
    options: &AdviseOptions,
    slots: &Arc<tokio::sync::Semaphore>,
) -> Result<Advice, tonic::Status> {
    let name = if req.policy.is_empty() {
        default_policy
    } else {
        &req.policy
    };
    let path = if name == crate::policies::learned::LEARNED {
        model.decision_path(name)
    } else {
        NoModel.decision_path(name)
    };
    let policy = default_policy.to_string();
    let learned = model.policy_update(0).map(|u| u.setup);
    let now = crate::service::core::now_us();
    let options = options.clone();
    in_slot(slots, move || {
        advise(&req, &policy, &path, learned.as_ref(), &options, now)
    })
    .await?
    .map_err(tonic::Status::from)
}

/// `work` on a blocking thread once one of `slots` is free, holding it until `work`
/// ends. The slot goes with the computation: a cancelled call drops this future, not the
/// blocking task, which keeps its slot until it ends (otherwise cancelling calls would
/// get round the bound).
async fn in_slot<T: Send + 'static>(
    slots: &Arc<tokio::sync::Semaphore>,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tonic::Status> {
    let slot = slots
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| tonic::Status::unavailable("the advisor is shutting down"))?;
    tokio::task::spawn_blocking(move || {
        let done = work();
        drop(slot);
        done
    })
    .await
    .map_err(|e| tonic::Status::internal(format!("advise task: {e}")))
}

/// `max_concurrent_advise` as a count of calls (0: the number of CPUs).
pub fn advise_slots(configured: usize) -> Arc<tokio::sync::Semaphore> {
    let n = match configured {
        0 => std::thread::available_parallelism().map_or(2, std::num::NonZero::get),
        n => n,
    };
    Arc::new(tokio::sync::Semaphore::new(n))
}

/// Recommendations for `req`, with the decision records behind them (ids unset: the
/// caller numbers them).
pub fn advise(
    req: &pb::AdviseRequest,
    default_policy: &str,
    path: &DecisionPath,
    learned: Option<&crate::policies::learned::LearnedSetup>,
    options: &AdviseOptions,
    now_us: i64,
) -> Result<Advice, ServiceError> {
    let cpu_nodes_first = options.cpu_nodes_first;
    let mut state = snapshot_state(req.cluster.as_ref())?;
    let held = tenant_holdings(req.cluster.as_ref())?;
    if req.pending.len() > MAX_PENDING {
        return Err(ServiceError::invalid(
            "pending",
            format!("{} jobs; at most {MAX_PENDING} per call", req.pending.len()),
        ));
    }
    let policy_name = if req.policy.is_empty() {
        default_policy
    } else {
        &req.policy
    };
    // `learned` runs on the server's current model, reporting each decision's path.
    let trace = crate::policies::learned::TraceSink::default();
    let learned = learned.map(|s| crate::policies::learned::LearnedSetup {
        trace: Some(trace.clone()),
        ..s.clone()
    });
    let (mut policy, _) =
        crate::policies::learned::build_policy(policy_name, &[], learned.as_ref()).map_err(
            |e| match e {
                crate::policies::learned::PolicyError::NoSetup => ServiceError::invalid(
                    "policy",
                    "learned: this server has no learned model (its policy is a heuristic)",
                ),
                e => ServiceError::invalid("policy", e),
            },
        )?;
    if cpu_nodes_first {
        policy = policy.with_cpu_nodes_first();
    }
    policy.quota = options.quota.as_deref().cloned();
    let now_s = now_us as f64 / 1e6;
    let mut jobs = Vec::with_capacity(req.pending.len());
    for (i, p) in req.pending.iter().enumerate() {
        if p.id.is_empty() {
            return Err(ServiceError::invalid(
                &format!("pending[{i}].id"),
                "missing",
            ));
        }
        if !(p.waited_s.is_finite() && p.waited_s >= 0.0) {
            return Err(ServiceError::invalid(
                &format!("pending[{i}].waited_s"),
                "must be a finite non-negative number",
            ));
        }
        let submit = (now_s - p.waited_s).max(0.0);
        let (job, _) = job_from_spec(
            p.spec.as_ref(),
            JobId(i as u32 + 1),
            submit,
            &state.topology().catalog,
        )
        .map_err(|e| prefixed(&format!("pending[{i}]."), e))?;
        jobs.push(job);
    }
    let before = state.clone();
    let topo = state.topology_arc().clone();
    let mut verdicts: Vec<(Verdict, String, Option<Placement>)> = vec![
        (
            Verdict::Wait,
            "does not fit the free capacity now".into(),
            None
        );
        jobs.len()
    ];
    let mut schedulable = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        match can_ever_fit(job, &topo) {
            Ok(()) => schedulable.push(i),
            Err(why) => verdicts[i] = (Verdict::Reject, why, None),
        }
    }
    let pending: Vec<Pending> = schedulable
        .iter()
        .map(|&i| Pending {
            job: &jobs[i],
            stats: crate::framework::JobStats {
                queued_since: jobs[i].submit_time,
                remaining_work: jobs[i].total_work,
                ..Default::default()
            },
        })
        .collect();
    // A fixed seed: the same snapshot and queue always get the same advice.
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let mut ctx = Context {
        held_elsewhere: Some(&held),
        ..Context::new(now_s, &mut rng)
    };
    let decisions = run_cycle(&policy, &mut state, &pending, &[], &mut ctx);
    for (k, placement) in decisions.placed {
        verdicts[schedulable[k]] = (Verdict::Place, String::new(), Some(placement));
    }
    for (k, why) in decisions.rejected {
        verdicts[schedulable[k]] = (Verdict::Reject, why, None);
    }
    for (k, why) in decisions.deferred {
        verdicts[schedulable[k]] = (
            Verdict::Wait,
            format!("{why} (it fits the free capacity now)"),
            None,
        );
    }
    for (k, short) in decisions.over_quota {
        let tenant = &pending[k].job.tenant;
        verdicts[schedulable[k]] = (
            Verdict::Wait,
            format!("waiting: {}", short.describe(tenant)),
            None,
        );
    }
    for (k, why) in decisions.errors {
        verdicts[schedulable[k]] = (Verdict::Wait, format!("placement error: {why}"), None);
    }
    let traces: std::collections::HashMap<JobId, crate::policies::learned::DecisionTrace> =
        std::mem::take(&mut *trace.lock().unwrap_or_else(|e| e.into_inner()))
            .into_iter()
            .map(|t| (t.job, t))
            .collect();
    let learned_policy = learned.is_some() && policy_name == crate::policies::learned::LEARNED;
    let mut recs = Vec::with_capacity(jobs.len());
    let mut records = Vec::with_capacity(jobs.len());
    for ((p, job), (verdict, reason, placement)) in req.pending.iter().zip(&jobs).zip(verdicts) {
        let empty = Placement::default();
        let (feasible, mut list, ids) = candidates(
            job,
            &before,
            placement.as_ref().unwrap_or(&empty),
            cpu_nodes_first,
        );
        let heuristic_scored = !learned_policy
            && crate::service::records::score_candidates(
                policy.placer.as_ref(),
                job,
                &before,
                &ids,
                &mut list,
                now_s,
            );
        let workers = placement
            .as_ref()
            .map(|pl| WorkerRecord::of(pl, &topo))
            .unwrap_or_default();
        let path = match traces.get(&job.id) {
            Some(t) => DecisionPath {
                kind: if t.path.is_learned() {
                    "learned"
                } else {
                    "fallback"
                },
                label: t.path.label().to_string(),
                confidence: t.margin.map(f64::from),
            },
            None => path.clone(),
        };
        let scored = traces
            .get(&job.id)
            .map(|t| scored_candidates(t, placement.as_ref(), &topo))
            .unwrap_or_default();
        let score_note = if learned_policy {
            learned_score_note(&mut list, &scored, &path.label)
        } else {
            crate::service::records::heuristic_score_note(&policy.name, heuristic_scored)
        };
        recs.push(pb::Recommendation {
            job_id: p.id.clone(),
            verdict: crate::service::records::verdict_to_pb(verdict) as i32,
            placement: WorkerRecord::to_pb(&workers),
            reason: reason.clone(),
            decision_id: 0,
            path: path.label.clone(),
            confidence: path.confidence,
        });
        records.push(DecisionRecord {
            id: 0,
            source: "advise".into(),
            at_us: now_us,
            job: p.id.clone(),
            spec: job.clone(),
            policy: policy.name.clone(),
            path: path.label.clone(),
            confidence: path.confidence,
            verdict,
            reason,
            placement: workers,
            queue_depth: req.pending.len() as u32,
            idle_gpus: before.idle_gpus(),
            feasible_nodes: feasible,
            candidates: list,
            model_version: None,
            gate_threshold: None,
            score_note,
            scored,
            migration: None,
            // Advise decisions are not in the Parquet log (it logs the cycle's own).
            features: None,
        });
    }
    Ok((policy.name.clone(), recs, records))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_beyond_max_concurrent_advise_waits_for_a_slot() {
        assert_eq!(advise_slots(3).available_permits(), 3);
        assert!(advise_slots(0).available_permits() >= 1);
        let slots = Arc::new(tokio::sync::Semaphore::new(0));
        let options = AdviseOptions::default();
        let call = advise_off_thread(
            pb::AdviseRequest::default(),
            "topo-pack",
            &NoModel,
            &options,
            &slots,
        );
        tokio::pin!(call);
        let waited = tokio::time::timeout(std::time::Duration::from_millis(200), &mut call).await;
        assert!(waited.is_err(), "computed without a slot");
        slots.add_permits(1);
        // Now it runs (and refuses the empty request, which has no cluster).
        let done = tokio::time::timeout(std::time::Duration::from_secs(5), call).await;
        assert!(matches!(done, Ok(Err(_))), "{done:?}");
        assert_eq!(slots.available_permits(), 1, "the slot was not given back");
    }

    #[tokio::test]
    async fn a_cancelled_call_keeps_its_slot_until_its_computation_ends() {
        let slots = Arc::new(tokio::sync::Semaphore::new(1));
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let (started, computing) = tokio::sync::oneshot::channel();
        let call = tokio::spawn({
            let slots = slots.clone();
            async move {
                in_slot(&slots, move || {
                    let _ = started.send(());
                    wait.recv().ok()
                })
                .await
            }
        });
        computing.await.expect("the computation started");
        call.abort();
        assert!(call.await.unwrap_err().is_cancelled());
        assert_eq!(
            slots.available_permits(),
            0,
            "the cancelled call gave its slot back while its computation still ran"
        );
        release.send(()).expect("the computation waits");
        let freed = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while slots.available_permits() == 0 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(
            freed.is_ok(),
            "the slot was not given back when the computation ended"
        );
    }

    fn node(
        name: &str,
        gpu_model: &str,
        gpus: u32,
        cpu_milli: u32,
        used: (u32, u32),
    ) -> pb::SnapshotNode {
        pb::SnapshotNode {
            node: Some(pb::NodeInfo {
                name: name.into(),
                gpu_model: gpu_model.into(),
                gpus,
                nvlink_domain: 0,
                cpu_milli,
                memory_mib: 1 << 20,
                mig: None,
                mig_layout: None,
            }),
            schedulable: true,
            gpus_used: (0..used.0)
                .map(|index| pb::GpuUsage {
                    index,
                    milli: 1000,
                    mig: None,
                })
                .collect(),
            cpu_used_milli: used.1,
            memory_used_mib: 0,
        }
    }

    /// With the server's quota, what the snapshot says a tenant holds counts: its job
    /// waits with the reason, another tenant's is placed; a tenant listed twice is
    /// refused by field.
    #[test]
    fn advise_counts_the_snapshots_tenant_holdings_against_the_quota() {
        let request = |tenants: Vec<pb::TenantHolding>| pb::AdviseRequest {
            cluster: Some(pb::ClusterSnapshot {
                nodes: vec![node("h", "H100", 8, 128_000, (4, 0))],
                tenants,
                ..Default::default()
            }),
            pending: ["vision", "nlp"]
                .into_iter()
                .map(|tenant| pb::PendingJob {
                    id: tenant.into(),
                    spec: Some(pb::JobSpec {
                        tenant: tenant.into(),
                        ..crate::service::testkit::whole_gpu_job(1, 1)
                    }),
                    waited_s: 1.0,
                })
                .collect(),
            policy: String::new(),
        };
        let options = AdviseOptions {
            cpu_nodes_first: false,
            quota: Some(Arc::new(
                QuotaConfig::from_toml("[tenants.vision]\ngpus = 4\n").unwrap(),
            )),
        };
        let path = NoModel.decision_path("best-fit");
        let verdicts = |req: &pb::AdviseRequest, options: &AdviseOptions| {
            let (_, recs, _) = advise(req, "best-fit", &path, None, options, 10_000_000).unwrap();
            recs.into_iter()
                .map(|r| (r.verdict, r.reason))
                .collect::<Vec<_>>()
        };
        let holding = |tenant: &str, gpus: u64| pb::TenantHolding {
            tenant: tenant.into(),
            gpu_milli: gpus * 1000,
            cpu_milli: 0,
        };
        let place = pb::Verdict::Place as i32;
        let held = request(vec![holding("vision", 4), holding("nlp", 4)]);
        let v = verdicts(&held, &options);
        assert_eq!(v[0].0, pb::Verdict::Wait as i32);
        assert_eq!(
            v[0].1,
            "waiting: tenant \"vision\" holds 4 of its 4 GPUs; the job asks 1 more"
        );
        assert_eq!(v[1].0, place, "nlp has no limit");
        // Below its limit, or without the quota, vision's job is placed.
        assert_eq!(
            verdicts(&request(vec![holding("vision", 3)]), &options)[0].0,
            place
        );
        assert_eq!(verdicts(&held, &AdviseOptions::default())[0].0, place);
        let twice = request(vec![holding("nlp", 1), holding("nlp", 2)]);
        let e = advise(&twice, "best-fit", &path, None, &options, 10_000_000).unwrap_err();
        assert!(e.to_string().contains("cluster.tenants[1].tenant"), "{e}");
    }

    /// The node `advise` recommends for a 4-core CPU-only job beside a GPU node whose
    /// GPUs are all taken and a few cores left (best fit's tightest node).
    fn recommended_node(cpu_nodes_first: bool) -> String {
        let req = pb::AdviseRequest {
            cluster: Some(pb::ClusterSnapshot {
                name: "mixed".into(),
                nodes: vec![
                    node("gpu", "A10", 8, 128_000, (8, 100_000)),
                    node("cpu", "", 0, 192_000, (0, 0)),
                ],
                ..Default::default()
            }),
            pending: vec![pb::PendingJob {
                id: "etl".into(),
                spec: Some(pb::JobSpec {
                    workers: 1,
                    cpu_milli: 4000,
                    ..Default::default()
                }),
                waited_s: 1.0,
            }],
            policy: "best-fit".into(),
        };
        let path = NoModel.decision_path("best-fit");
        let (_, recs, _) = advise(
            &req,
            "best-fit",
            &path,
            None,
            &AdviseOptions {
                cpu_nodes_first,
                quota: None,
            },
            10_000_000,
        )
        .unwrap();
        assert_eq!(recs.len(), 1);
        recs[0].placement[0].node.clone()
    }

    #[test]
    fn a_snapshot_carries_mig_modes_and_the_instances_in_use() {
        let slice = |index| pb::GpuUsage {
            index,
            milli: 0,
            mig: Some(pb::MigProfile {
                compute_slices: 3,
                memory_slices: 4,
            }),
        };
        let snapshot = |used: Vec<pb::GpuUsage>| {
            let mut n = node("a100", "A100-80", 2, 64_000, (0, 0));
            n.node.as_mut().unwrap().mig = Some(pb::MigModes { gpus: vec![1] });
            n.gpus_used = used;
            pb::ClusterSnapshot {
                nodes: vec![n],
                ..Default::default()
            }
        };
        let whole = |index| pb::GpuUsage {
            index,
            milli: 1000,
            mig: None,
        };
        let state = snapshot_state(Some(&snapshot(vec![slice(1), whole(0)]))).unwrap();
        assert_eq!(state.mig_free(GpuId(1)), (4, 4));
        assert_eq!(state.idle_gpus(), 0, "GPU 0 is taken, GPU 1 is in MIG mode");
        assert!(state.gpu_fits(
            GpuId(1),
            GpuDemand::Mig {
                compute: 3,
                memory: 4
            }
        ));
        // A whole GPU in use on a GPU in MIG mode, or an instance on one that is not.
        for (used, field) in [
            (whole(1), "gpus_used[0]"),
            (slice(0), "gpus_used[0]"),
            (
                pb::GpuUsage {
                    milli: 5,
                    ..slice(1)
                },
                "gpus_used[0]",
            ),
        ] {
            let err = snapshot_state(Some(&snapshot(vec![used]))).unwrap_err();
            assert!(err.to_string().contains(field), "{err}");
        }
        // With the node's instances listed, a MIG demand fits only a free instance of its
        // size, and a usage of a size it has no free instance of is refused.
        let with_layout = |used: Vec<pb::GpuUsage>, profiles: &[(&str, u32, u32)]| {
            let mut snap = snapshot(used);
            snap.nodes[0].node.as_mut().unwrap().mig_layout = Some(pb::MigLayout {
                instances: profiles
                    .iter()
                    .map(
                        |&(profile, compute_slices, memory_slices)| pb::MigInstanceInfo {
                            gpu: 1,
                            profile: profile.into(),
                            size: Some(pb::MigProfile {
                                compute_slices,
                                memory_slices,
                            }),
                        },
                    )
                    .collect(),
            });
            snapshot_state(Some(&snap))
        };
        let layout = [("3g.40gb", 3, 4), ("1c.2g.20gb", 1, 2)];
        let state = with_layout(vec![slice(1)], &layout).unwrap();
        let fits = |compute, memory| state.gpu_fits(GpuId(1), GpuDemand::Mig { compute, memory });
        assert!(!fits(3, 4) && fits(1, 2) && !fits(2, 2));
        let err = with_layout(vec![slice(1), slice(1)], &layout).unwrap_err();
        assert!(err.to_string().contains("gpus_used[1]"), "{err}");
        let err = with_layout(vec![], &[("3g.47gb", 3, 4)]).unwrap_err();
        assert!(
            err.to_string().contains("no MIG profile \"3g.47gb\""),
            "{err}"
        );
    }

    #[test]
    fn cpu_nodes_first_moves_cpu_only_recommendations_off_gpu_nodes() {
        assert_eq!(recommended_node(false), "gpu");
        assert_eq!(recommended_node(true), "cpu");
    }
}
