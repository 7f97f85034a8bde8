//! The learned policy in the online service: model info, reload by RPC (a good artifact
//! replaces the model, a corrupt one is refused and the current model keeps deciding),
//! automatic reload when the artifact directory changes, per-decision paths and scores
//! in Explain, and the Parquet decision log read back with its outcomes. Loopback only.

mod common;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use marshal_scheduler::decision_log::read_decision_log;
use marshal_scheduler::service::pb::admin_service_client::AdminServiceClient;
use marshal_scheduler::service::pb::advisor_service_client::AdvisorServiceClient;
use marshal_scheduler::service::pb::job_service_client::JobServiceClient;
use marshal_scheduler::service::pb::node_service_client::NodeServiceClient;
use marshal_scheduler::service::{self, ServiceConfig, model_slot, pb, tokio, tonic};
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

fn shipped_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/policy-default")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// Rewrites the artifact's gate threshold (a valid artifact with other content).
fn set_margin_threshold(dir: &Path, t: f64) {
    let path = dir.join("meta.json");
    let mut meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    meta["margin_threshold"] = serde_json::json!(t);
    std::fs::write(&path, serde_json::to_string_pretty(&meta).unwrap()).unwrap();
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn config(dir: &Path, model: &Path, log: PathBuf) -> ServiceConfig {
    ServiceConfig {
        listen: "127.0.0.1:0".into(),
        db: dir.join("marshal.redb"),
        cluster: "three-nodes".into(),
        policy: "learned".into(),
        model: Some(model.to_path_buf()),
        model_poll_ms: 100,
        cycle_interval_ms: 50,
        decision_log_dir: Some(log),
        decision_log_flush_ms: 100,
        durable_commits: false,
        ..ServiceConfig::default()
    }
}

async fn connect(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// A server for `config` on the three-node cluster, with the model slot on `model`: its
/// handle, a channel to it and an admin client.
async fn serve(
    config: ServiceConfig,
    model: &Path,
) -> (service::ServerHandle, Channel, AdminServiceClient<Channel>) {
    let slot = model_slot(&config, model);
    let handle = service::start(config, common::three_nodes(), slot)
        .await
        .unwrap();
    let ch = connect(handle.addr).await;
    let admin = AdminServiceClient::new(ch.clone());
    (handle, ch, admin)
}

fn whole(n: u32) -> Option<pb::GpuDemand> {
    Some(pb::GpuDemand {
        kind: Some(pb::gpu_demand::Kind::Whole(n)),
    })
}

fn job_spec(i: usize) -> pb::JobSpec {
    let (workers, gpus) = match i % 5 {
        0 => (1, 1),
        1 => (1, 2),
        2 => (1, 4),
        3 => (2, 4),
        _ => (1, 8),
    };
    pb::JobSpec {
        name: format!("job-{i}"),
        workers,
        gpu: whole(gpus),
        cpu_milli: 1000,
        comm: pb::CommPattern::DataParallel as i32,
        ..Default::default()
    }
}

async fn register(ch: &Channel) {
    let mut nodes = NodeServiceClient::new(ch.clone());
    for i in 0..3 {
        nodes
            .register(pb::RegisterNodeRequest {
                node: Some(common::node_info(i)),
                running: vec![],
                ..Default::default()
            })
            .await
            .unwrap();
    }
}

/// Submits `range` and completes every job once placed (as an agent would), until all
/// of them are final. Returns the ids.
async fn run_jobs(ch: &Channel, range: std::ops::Range<usize>) -> Vec<u64> {
    let mut jobs = JobServiceClient::new(ch.clone());
    let mut agent = NodeServiceClient::new(ch.clone());
    let mut ids = Vec::new();
    for i in range {
        let job = jobs
            .submit(pb::SubmitRequest {
                spec: Some(job_spec(i)),
            })
            .await
            .unwrap()
            .into_inner()
            .job
            .unwrap();
        ids.push(job.id);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut done: HashSet<u64> = HashSet::new();
    while done.len() < ids.len() {
        assert!(
            Instant::now() < deadline,
            "jobs did not finish: {done:?} of {ids:?}"
        );
        for &id in &ids {
            if done.contains(&id) {
                continue;
            }
            let job = jobs
                .get(pb::GetJobRequest { job_id: id })
                .await
                .unwrap()
                .into_inner()
                .job
                .unwrap();
            let state = pb::JobState::try_from(job.state).unwrap();
            match state {
                pb::JobState::Placed | pb::JobState::Running => {
                    agent
                        .report_job(pb::ReportJobRequest {
                            node: job.placement[0].node.clone(),
                            job_id: id,
                            state: pb::JobState::Completed as i32,
                            message: "exit 0".into(),
                            attempt: job.attempts,
                            last_checkpoint_unix_s: 0.0,
                        })
                        .await
                        .unwrap();
                }
                pb::JobState::Completed => {
                    done.insert(id);
                }
                pb::JobState::Pending | pb::JobState::Requeued | pb::JobState::Preempted => {}
                other => panic!("job {id} ended {other:?}: {}", job.reason),
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ids
}

async fn info(admin: &mut AdminServiceClient<Channel>) -> pb::ModelInfo {
    admin
        .model_info(pb::ModelInfoRequest {})
        .await
        .unwrap()
        .into_inner()
}

async fn explain(ch: &Channel, decision_id: u64) -> pb::Explanation {
    AdvisorServiceClient::new(ch.clone())
        .explain(pb::ExplainRequest { decision_id })
        .await
        .unwrap()
        .into_inner()
}

/// The decision ids of `ids` (the placement each job got).
async fn decisions_of(ch: &Channel, ids: &[u64]) -> Vec<u64> {
    let mut jobs = JobServiceClient::new(ch.clone());
    let mut out = Vec::new();
    for &id in ids {
        let job = jobs
            .get(pb::GetJobRequest { job_id: id })
            .await
            .unwrap()
            .into_inner()
            .job
            .unwrap();
        out.push(job.decision_id);
    }
    out
}

#[test]
fn learned_model_reloads_by_rpc_and_poll_and_the_decision_log_reads_back() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b, bad) = (
        tmp.path().join("model-a"),
        tmp.path().join("model-b"),
        tmp.path().join("model-bad"),
    );
    copy_dir(&shipped_model(), &a);
    copy_dir(&shipped_model(), &b);
    // Two valid artifacts that differ, whatever threshold the shipped model has.
    set_margin_threshold(&a, 0.1);
    set_margin_threshold(&b, 0.0);
    copy_dir(&shipped_model(), &bad);
    let weights = std::fs::read(bad.join("weights.bpk")).unwrap();
    std::fs::write(bad.join("weights.bpk"), &weights[..weights.len() / 2]).unwrap();
    let log = tmp.path().join("decision-log");
    let config = config(tmp.path(), &a, log.clone());
    runtime().block_on(async move {
        let (handle, ch, mut admin) = serve(config, &a).await;
        register(&ch).await;

        let first = info(&mut admin).await;
        assert!(first.loaded, "{}", first.detail);
        assert_eq!(first.policy, "learned");
        assert_eq!(first.name, "model-a");
        assert_eq!(first.fallback, "topo-pack");
        assert_eq!(first.version.len(), 16);
        assert!(
            first.detail.contains("margin is below 0.100"),
            "{}",
            first.detail
        );

        // 20 jobs on model A.
        let ids_a = run_jobs(&ch, 0..20).await;

        // Advise runs on the server's current model and labels each recommendation.
        let advice = advise(&ch, "").await;
        assert_eq!(advice.policy, "learned");
        assert_eq!(advice.recommendations.len(), 3);
        for r in &advice.recommendations {
            assert_eq!(r.verdict, pb::Verdict::Place as i32, "{r:?}");
            assert!(
                r.path == "learned" || r.path.starts_with("fallback:"),
                "{}",
                r.path
            );
            assert!(r.confidence.is_some(), "the network scored {r:?}");
            // Explain shows the network's scores for every candidate, as for the cycle.
            let e = explain(&ch, r.decision_id).await;
            assert!(e.score_note.starts_with("learned:"), "{}", e.score_note);
            assert!(!e.scored_candidates.is_empty());
            assert!(e.scored_candidates.iter().all(|c| c.probability.is_some()));
            assert_eq!(e.scored_candidates.iter().filter(|c| c.chosen).count(), 1);
            assert!(e.candidates.iter().any(|c| c.score.is_some()), "{e:?}");
        }
        // Heuristics: a scored placer's node scores, or "no score" said explicitly.
        let advice = advise(&ch, "best-fit").await;
        let e = explain(&ch, advice.recommendations[0].decision_id).await;
        assert!(e.score_note.starts_with("best-fit:"), "{}", e.score_note);
        assert!(!e.candidates.is_empty());
        assert!(e.candidates.iter().all(|c| c.score.is_some()), "{e:?}");
        let advice = advise(&ch, "topo-pack").await;
        let e = explain(&ch, advice.recommendations[0].decision_id).await;
        assert!(e.score_note.starts_with("no score"), "{}", e.score_note);
        assert!(e.candidates.iter().all(|c| c.score.is_none()));

        // A good artifact by RPC: the model changes.
        let reloaded = admin
            .reload_model(pb::ReloadModelRequest {
                path: b.display().to_string(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(reloaded.loaded);
        assert_eq!(reloaded.name, "model-b");
        assert_ne!(reloaded.version, first.version);
        assert_eq!(reloaded.reloads, 1);
        assert!(
            reloaded.detail.contains("margin is below 0.000"),
            "{}",
            reloaded.detail
        );
        let version_b = reloaded.version.clone();

        // A corrupt artifact: refused with the reason, model B stays.
        let refused = admin
            .reload_model(pb::ReloadModelRequest {
                path: bad.display().to_string(),
            })
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument);
        assert!(
            refused.message().contains("checksum"),
            "{}",
            refused.message()
        );
        assert!(
            refused.message().contains("current model is kept"),
            "{}",
            refused.message()
        );
        // A directory outside the reload roots (by default the configured artifact's
        // parent): refused before it is read.
        let denied = admin
            .reload_model(pb::ReloadModelRequest {
                path: "/etc".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
        assert!(
            denied.message().contains("model_reload_roots"),
            "{}",
            denied.message()
        );
        let after = info(&mut admin).await;
        assert!(after.loaded);
        assert_eq!(after.version, version_b);
        assert_eq!(after.rejected_reloads, 1);
        assert!(
            after.last_error.contains("checksum"),
            "{}",
            after.last_error
        );
        assert!(
            after.detail.contains("last reload rejected"),
            "{}",
            after.detail
        );

        // Model B still decides: 20 more jobs, every decision made by version B.
        let ids_b = run_jobs(&ch, 20..40).await;
        let mut learned = 0;
        for d in decisions_of(&ch, &ids_b).await {
            let e = explain(&ch, d).await;
            assert_eq!(e.model_version, version_b, "decision {d}");
            assert_eq!(e.gate_threshold, Some(0.0));
            assert!(
                e.path == "learned" || e.path.starts_with("fallback:"),
                "{}",
                e.path
            );
            if e.path == "learned" {
                learned += 1;
                // Scored: the gate's margin is the confidence, each candidate has its
                // network score, and the chosen one is marked.
                let margin = e.confidence.expect("a learned decision has a confidence");
                assert!((0.0..=1.0).contains(&margin));
                assert!(e.score_note.starts_with("learned:"), "{}", e.score_note);
                assert!(!e.scored_candidates.is_empty());
                assert!(
                    e.scored_candidates
                        .iter()
                        .all(|c| c.probability.is_some() && c.logit.is_some())
                );
                assert_eq!(e.scored_candidates.iter().filter(|c| c.chosen).count(), 1);
                let chosen_node = &e.placement[0].node;
                let c = e
                    .candidates
                    .iter()
                    .find(|c| &c.node == chosen_node)
                    .unwrap();
                assert!(c.score.is_some(), "the chosen node has a score");
            }
        }
        assert!(learned > 0, "no decision of model B took the learned path");

        // Automatic reload: the watched directory is now model-b; copying model A's
        // artifact over it is picked up by the poll (same content as A, same version).
        copy_dir(&a, &b);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = info(&mut admin).await;
            if now.version == first.version {
                assert_eq!(now.reloads, 2);
                assert_eq!(now.name, "model-b");
                assert!(now.last_error.is_empty());
                break;
            }
            assert!(
                Instant::now() < deadline,
                "not reloaded by the poll: {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let ids_c = run_jobs(&ch, 40..50).await;
        for d in decisions_of(&ch, &ids_c).await {
            assert_eq!(explain(&ch, d).await.model_version, first.version);
        }
        let metrics = handle.core.metrics.render();
        assert!(
            metrics.contains("marshal_model_reloads_total{outcome=\"loaded\"} 2"),
            "{metrics}"
        );
        // 1, or more if a poll caught the copy half-written (refused, then loaded).
        assert!(metrics.contains("marshal_model_reloads_total{outcome=\"rejected\"}"));
        handle.shutdown().await.unwrap();

        // The decision log: one row per placement, an outcome for every completed job.
        let data = read_decision_log(&log).unwrap();
        // Every file names the database that wrote it.
        assert!(
            data.database.is_some() && data.skipped.is_empty(),
            "{:?} {:?}",
            data.database,
            data.skipped
        );
        let all: Vec<u64> = ids_a.iter().chain(&ids_b).chain(&ids_c).copied().collect();
        let places: Vec<_> = data
            .decisions
            .iter()
            .filter(|d| d.verdict == "place")
            .collect();
        assert_eq!(places.len(), 50, "one placement decision per job");
        let jobs: HashSet<&str> = places.iter().map(|d| d.job_id.as_str()).collect();
        assert_eq!(jobs.len(), 50);
        for id in &all {
            assert!(
                jobs.contains(id.to_string().as_str()),
                "job {id} has a decision row"
            );
        }
        for d in &places {
            assert_eq!(d.policy, "learned");
            assert!(d.path == "learned" || d.path.starts_with("fallback:"));
            assert!(d.model_version.is_some());
            assert!(!d.nodes.is_empty() && !d.gpus.is_empty());
            assert_eq!(d.gpu_kind, "whole");
            assert_eq!(
                d.gpu_milli_placed,
                u64::from(d.workers) * u64::from(d.gpu_milli_per_worker)
            );
            assert!(d.feasible_nodes <= 3 && d.idle_gpus <= 24);
        }
        let versions: HashSet<&str> = places
            .iter()
            .filter_map(|d| d.model_version.as_deref())
            .collect();
        assert_eq!(
            versions,
            HashSet::from([first.version.as_str(), version_b.as_str()])
        );
        let joined = data.joined();
        let by_decision: HashMap<u64, _> =
            joined.iter().map(|(d, o)| (d.decision_id, *o)).collect();
        for d in &places {
            let o = by_decision[&d.decision_id].expect("a completed job has an outcome");
            assert_eq!(o.state, "completed");
            assert_eq!(o.job_id, d.job_id);
            assert!(o.run_s.is_some_and(|r| r >= 0.0) && o.wait_s >= 0.0);
        }
        assert_eq!(data.outcomes.len(), 50);

        // Every placement carries its featurised candidates, and the trainer retrains
        // the served model from the log.
        for d in &places {
            let f = d
                .features
                .as_ref()
                .expect("a learned-policy row has features");
            let (decision, taken) = f.decision().unwrap();
            assert!(taken < decision.candidates.len());
        }
        let retrained = tmp.path().join("retrained");
        let opts = marshal_trainer::policy::LogTrainOptions {
            epochs: 2,
            ..Default::default()
        };
        let trained = marshal_trainer::policy::retrain_from_log(
            &shipped_model(),
            &data,
            &retrained,
            &opts,
            &mut |_, _| {},
        )
        .unwrap();
        assert_eq!(trained.report.decisions, 50);
        assert_eq!(trained.report.used, 50, "{:?}", trained.report);
        let artifact = marshal_model::policy::load_policy(&retrained).unwrap();
        assert_eq!(artifact.meta.training["log_samples"], 50.0);
    });
}

#[test]
fn a_missing_model_and_an_unwritable_log_do_not_stop_scheduling() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-model-here");
    let log = tmp.path().join("log");
    let config = ServiceConfig {
        require_registration: false,
        ..config(tmp.path(), &missing, log.clone())
    };
    runtime().block_on(async move {
        let (handle, ch, mut admin) = serve(config, &missing).await;
        // The log directory goes bad after start (a directory that cannot be written at
        // start is refused then): a file where it was.
        std::fs::remove_dir_all(&log).unwrap();
        std::fs::write(&log, b"not a directory").unwrap();
        let i = info(&mut admin).await;
        assert!(!i.loaded);
        assert!(i.detail.contains("no usable model"), "{}", i.detail);
        assert!(
            i.detail.contains("topo-pack decides every placement"),
            "{}",
            i.detail
        );

        let mut jobs = JobServiceClient::new(ch.clone());
        for k in 0..5 {
            let job = jobs
                .submit(pb::SubmitRequest {
                    spec: Some(spec_of(k)),
                })
                .await
                .unwrap()
                .into_inner()
                .job
                .unwrap();
            assert_eq!(job.state, pb::JobState::Placed as i32, "{}", job.reason);
            let e = explain(&ch, job.decision_id).await;
            assert_eq!(e.path, "fallback:no-model");
            assert_eq!(e.confidence, None);
            assert!(e.score_note.starts_with("no score"), "{}", e.score_note);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while handle.core.decision_log_stats().write_errors == 0 {
            assert!(Instant::now() < deadline, "the write error was not counted");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let metrics = handle.core.metrics.render();
        assert!(
            metrics.contains("marshal_decision_log_write_errors_total"),
            "{metrics}"
        );
        assert!(!metrics.contains("marshal_decision_log_write_errors_total 0\n"));
        // Still scheduling after the error.
        let job = jobs
            .submit(pb::SubmitRequest {
                spec: Some(spec_of(5)),
            })
            .await
            .unwrap()
            .into_inner()
            .job
            .unwrap();
        assert_eq!(job.state, pb::JobState::Placed as i32);
        handle.shutdown().await.unwrap();
    });
}

fn spec_of(i: usize) -> pb::JobSpec {
    pb::JobSpec {
        name: format!("small-{i}"),
        workers: 1,
        gpu: whole(1),
        cpu_milli: 1000,
        ..Default::default()
    }
}

async fn advise(ch: &Channel, policy: &str) -> pb::AdviseResponse {
    AdvisorServiceClient::new(ch.clone())
        .advise(pb::AdviseRequest {
            cluster: Some(pb::ClusterSnapshot {
                name: "snap".into(),
                nodes_per_rack: 2,
                racks_per_spine: 0,
                nodes: (0..2)
                    .map(|i| pb::SnapshotNode {
                        node: Some(pb::NodeInfo {
                            name: format!("s-{i}"),
                            gpu_model: "H100".into(),
                            gpus: 8,
                            nvlink_domain: 8,
                            cpu_milli: 224_000,
                            memory_mib: 2_097_152,
                            mig: None,
                            mig_layout: None,
                        }),
                        schedulable: true,
                        gpus_used: vec![pb::GpuUsage {
                            index: 0,
                            milli: 1000,
                            mig: None,
                        }],
                        cpu_used_milli: 0,
                        memory_used_mib: 0,
                    })
                    .collect(),
                ..Default::default()
            }),
            pending: (0..3)
                .map(|k| pb::PendingJob {
                    id: format!("p{k}"),
                    spec: Some(job_spec(k)),
                    waited_s: 1.0,
                })
                .collect(),
            policy: policy.into(),
        })
        .await
        .unwrap()
        .into_inner()
}

#[test]
fn a_promoted_artifact_is_swapped_in_atomically_and_picked_up_by_the_poll() {
    let tmp = tempfile::tempdir().unwrap();
    let (current, candidate) = (tmp.path().join("model"), tmp.path().join("candidate"));
    copy_dir(&shipped_model(), &current);
    copy_dir(&shipped_model(), &candidate);
    set_margin_threshold(&current, 0.1);
    set_margin_threshold(&candidate, 0.0);
    let config = config(tmp.path(), &current, tmp.path().join("decision-log"));
    runtime().block_on(async move {
        let (handle, _, mut admin) = serve(config, &current).await;
        let first = info(&mut admin).await;
        assert!(first.loaded, "{}", first.detail);

        // What `marshal model promote` does once the candidate has won.
        let prev = marshal_trainer::promote::install(&candidate, &current).unwrap();
        assert_eq!(prev, Some(tmp.path().join("model.prev")));
        let want = marshal_trainer::promote::artifact_hash(&candidate).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = info(&mut admin).await;
            if now.version == want {
                // One reload, and no poll ever saw a missing or partial directory.
                assert_eq!((now.reloads, now.rejected_reloads), (1, 0), "{now:?}");
                assert!(
                    now.detail.contains("margin is below 0.000"),
                    "{}",
                    now.detail
                );
                break;
            }
            assert_eq!(now.rejected_reloads, 0, "{now:?}");
            assert!(
                Instant::now() < deadline,
                "not reloaded by the poll: {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_ne!(want, first.version);
        handle.shutdown().await.unwrap();
    });
}

/// `ReloadModel` of the watched directory must be refused for want of promotion.
async fn reload_refused_unpromoted(admin: &mut AdminServiceClient<Channel>, why: &str) {
    let err = admin
        .reload_model(pb::ReloadModelRequest {
            path: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains(why) && err.message().contains("model.promotion.json"),
        "{}",
        err.message()
    );
}

/// Polls `ModelInfo` until `done` holds (10 s at most).
async fn wait_for(
    admin: &mut AdminServiceClient<Channel>,
    done: impl Fn(&pb::ModelInfo) -> bool,
) -> pb::ModelInfo {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = info(admin).await;
        if done(&now) {
            return now;
        }
        assert!(Instant::now() < deadline, "not reached: {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn with_require_promotion_the_server_loads_only_what_promote_installed() {
    use marshal_trainer::promote::{PromoteOptions, promote};
    use marshal_trainer::testkit::{inflation_spec, tiny_artifact};
    let tmp = tempfile::tempdir().unwrap();
    let current = tmp.path().join("model");
    let (candidate, stray) = (tmp.path().join("candidate"), tmp.path().join("stray"));
    // Closed gates: each artifact schedules as its inflation fallback, so on the tiny
    // inflation episodes the `fgd` candidate beats the `random` current one.
    tiny_artifact(&current, "random", 1, 1.5);
    tiny_artifact(&candidate, "fgd", 2, 1.5);
    tiny_artifact(&stray, "fgd", 3, 1.5);
    let config = ServiceConfig {
        require_promotion: true,
        ..config(tmp.path(), &current, tmp.path().join("decision-log"))
    };
    runtime().block_on(async move {
        let (handle, _, mut admin) = serve(config, &current).await;
        // Never promoted: refused at start, the fallback decides.
        let first = info(&mut admin).await;
        assert!(!first.loaded, "{first:?}");
        assert!(
            first.detail.contains("no promotion record")
                && first.detail.contains("marshal model promote"),
            "{}",
            first.detail
        );
        reload_refused_unpromoted(&mut admin, "no promotion record").await;

        // `marshal model promote`: the candidate wins, is installed and recorded; the
        // poll loads it.
        let (cand, cur) = (candidate.clone(), current.clone());
        let record = tokio::task::spawn_blocking(move || {
            promote(
                &cand,
                &cur,
                &[inflation_spec()],
                &PromoteOptions::default(),
                &mut |_| {},
            )
        })
        .await
        .unwrap()
        .unwrap();
        assert!(record.promoted, "{record:?}");
        let want = record.candidate_hash.clone();
        let loaded = wait_for(&mut admin, |m| m.loaded && m.version == want).await;
        assert_eq!(loaded.reloads, 1, "{loaded:?}");

        // An unpromoted artifact copied over it is refused; the promoted model stays.
        copy_dir(&stray, &current);
        let refused = wait_for(&mut admin, |m| {
            m.last_error.contains("was written for artifact")
        })
        .await;
        assert!(refused.loaded && refused.version == want, "{refused:?}");
        assert!(refused.rejected_reloads > loaded.rejected_reloads);
        reload_refused_unpromoted(&mut admin, "modified or replaced").await;
        assert_eq!(info(&mut admin).await.version, want);
        handle.shutdown().await.unwrap();
    });
}

#[test]
fn with_promotion_public_keys_the_server_loads_only_a_signed_promotion() {
    use marshal_model::policy::{generate_key_pair, public_key_path};
    use marshal_trainer::promote::{PromoteOptions, promote_signed};
    use marshal_trainer::testkit::{inflation_spec, tiny_artifact};
    let tmp = tempfile::tempdir().unwrap();
    let current = tmp.path().join("model");
    let (candidate, second, loser) = (
        tmp.path().join("candidate"),
        tmp.path().join("second"),
        tmp.path().join("loser"),
    );
    // As above: an `fgd` candidate beats a `random` current artifact.
    tiny_artifact(&current, "random", 1, 1.5);
    tiny_artifact(&candidate, "fgd", 2, 1.5);
    tiny_artifact(&second, "fgd", 4, 1.5);
    tiny_artifact(&loser, "random", 3, 1.5);
    let key = tmp.path().join("promo.key");
    let signer = generate_key_pair(&key).unwrap();
    let config = ServiceConfig {
        require_promotion: true,
        promotion_public_keys: vec![public_key_path(&key)],
        ..config(tmp.path(), &current, tmp.path().join("decision-log"))
    };
    config.validate().unwrap();
    let (cur_dir, key_file) = (current.clone(), key.clone());
    let promote_with = move |cand: PathBuf, sign: bool| {
        let (cur, key) = (cur_dir.clone(), key_file.clone());
        tokio::task::spawn_blocking(move || {
            let signer = sign.then(|| marshal_model::policy::read_signing_key(&key).unwrap());
            promote_signed(
                &cand,
                &cur,
                &[inflation_spec()],
                &PromoteOptions::default(),
                signer.as_ref(),
                &mut |_| {},
            )
            .unwrap()
        })
    };
    runtime().block_on(async move {
        let (handle, _, mut admin) = serve(config, &current).await;
        assert!(!info(&mut admin).await.loaded);

        // Promoted without a key: installed and recorded, but refused for want of a
        // signature, with the reason in ModelInfo and on ReloadModel.
        let unsigned = promote_with(candidate, false).await.unwrap();
        assert!(
            unsigned.promoted && unsigned.signature.is_none(),
            "{unsigned:?}"
        );
        let refused = wait_for(&mut admin, |m| m.last_error.contains("is not signed")).await;
        assert!(!refused.loaded, "{refused:?}");
        let rejected = refused.rejected_reloads;
        assert!(rejected >= 1, "{refused:?}");
        reload_refused_unpromoted(&mut admin, "is not signed").await;
        assert!(info(&mut admin).await.rejected_reloads > rejected);

        // The unsigned promotion rolled back by hand (a `random` artifact again), then a
        // signed promotion: the poll loads it.
        copy_dir(&loser, &current);
        let signed = promote_with(second, true).await.unwrap();
        assert!(signed.promoted, "{signed:?}");
        assert_eq!(
            signed.signature.as_ref().map(|s| s.key_id.as_str()),
            Some(signer.key_id())
        );
        let want = signed.candidate_hash.clone();
        let loaded = wait_for(&mut admin, |m| m.loaded && m.version == want).await;
        assert_eq!(loaded.reloads, 1, "{loaded:?}");
        handle.shutdown().await.unwrap();
    });
}
