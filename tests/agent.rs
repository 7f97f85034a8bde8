//! `marshal agent --scheduler` in process, on loopback: three connected agents (the
//! library's `run_connected`, fed by the real sampling loop) against `marshal serve`'s
//! library server. Mixed jobs all complete without two workers on one GPU; a scheduler
//! restart mid-run starts no job twice; a silent agent's node goes unreachable and its
//! jobs move after the grace; `--exec` reports exit statuses and kills on cancel, and
//! its workers outlive an agent restart (or die with it under `--stop-workers-on-exit`);
//! a refused agent, and with `--fence-when-silent` a silent one, stops its workers when
//! the scheduler requeues their jobs.

mod common;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use marshal_agent::connected::{
    Backlog, ConnectedConfig, Counters, Journal, Mode, TelemetryTap, run_connected,
};
use marshal_agent::{SystemClock, run_sampling_loop_with};
use marshal_scheduler::service::client::ClientConfig;
use marshal_scheduler::service::pb::job_service_client::JobServiceClient;
use marshal_scheduler::service::pb::node_service_client::NodeServiceClient;
use marshal_scheduler::service::{self, NoModel, ServerHandle, ServiceConfig, pb, tokio, tonic};
use marshal_telemetry::{GpuSample, SinkConfig, Source, TelemetrySink};
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tokio::task::JoinHandle;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn config(db: &Path, listen: &str) -> ServiceConfig {
    ServiceConfig {
        listen: listen.into(),
        db: db.to_path_buf(),
        cluster: "three-nodes".into(),
        cycle_interval_ms: 50,
        durable_commits: false,
        ..ServiceConfig::default()
    }
}

async fn serve(config: ServiceConfig) -> ServerHandle {
    service::start(config, common::three_nodes(), Arc::new(NoModel))
        .await
        .unwrap()
}

/// A server on a fresh database in `dir` with the given node timeout and grace (ms).
async fn serve_with_liveness(dir: &Path, timeout_ms: u64, grace_ms: u64) -> ServerHandle {
    serve(ServiceConfig {
        node_timeout_ms: timeout_ms,
        node_grace_ms: grace_ms,
        ..config(&dir.join("db.redb"), "127.0.0.1:0")
    })
    .await
}

/// Eight GPUs sampled at wall time: what a node's NVML source would produce.
struct FakeGpus {
    node: Arc<str>,
}

impl Source for FakeGpus {
    fn sample(&mut self, now_us: i64) -> marshal_telemetry::Result<Vec<GpuSample>> {
        Ok((0..8)
            .map(|i| GpuSample {
                timestamp_us: now_us,
                cluster: "three-nodes".into(),
                node: self.node.clone(),
                gpu_index: i,
                gpu_uuid: format!("GPU-{i}").into(),
                gpu_type: "NVIDIA H100 80GB HBM3".into(),
                sm_util_pct: Some(40.0),
                mem_total_bytes: Some(80 << 30),
                mem_used_bytes: Some(1 << 30),
                temperature_c: Some(50.0),
                power_mw: Some(300_000),
                ..Default::default()
            })
            .collect())
    }
}

/// One in-process agent: the sampling loop on a thread, the connected loop on the
/// runtime.
struct Agent {
    node: String,
    journal: Journal,
    counters: Arc<Counters>,
    backlog: Arc<Backlog>,
    stop_sampling: Arc<AtomicBool>,
    sampler: Option<std::thread::JoinHandle<()>>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    out: PathBuf,
}

fn node_info(i: usize) -> pb::NodeInfo {
    marshal_agent::inventory_node(
        &marshal_scheduler::domain::Topology::build(&common::three_nodes()).unwrap(),
        &format!("n-{i}"),
    )
    .unwrap()
}

/// One connected agent on the simulated source for each of the three nodes.
fn start_sim_agents(rt: &tokio::runtime::Handle, addr: SocketAddr, out: &Path) -> Vec<Agent> {
    (0..3)
        .map(|i| start_agent(rt, addr, i, Mode::Simulated { speedup: 1.0 }, out))
        .collect()
}

fn start_agent(
    rt: &tokio::runtime::Handle,
    addr: SocketAddr,
    i: usize,
    mode: Mode,
    out: &Path,
) -> Agent {
    start_agent_with(rt, addr, i, mode, out, AgentOptions::default())
}

/// How a test agent differs from a plain one.
#[derive(Clone, Copy, Debug)]
struct AgentOptions {
    /// `false`: a node whose source yields no GPU rows: nothing reaches the backlog, so
    /// only Heartbeat calls keep it alive.
    sampling: bool,
    /// `--stop-workers-on-exit`.
    stop_workers_on_exit: bool,
    /// `--fence-when-silent`.
    fence_when_silent: bool,
    /// Registers with half the node's GPUs: other hardware than the inventory's.
    half_the_gpus: bool,
    /// `--stop-grace`.
    stop_grace: Duration,
}

impl Default for AgentOptions {
    fn default() -> Self {
        AgentOptions {
            sampling: true,
            stop_workers_on_exit: false,
            fence_when_silent: false,
            half_the_gpus: false,
            stop_grace: Duration::ZERO,
        }
    }
}

fn start_agent_with(
    rt: &tokio::runtime::Handle,
    addr: SocketAddr,
    i: usize,
    mode: Mode,
    out: &Path,
    options: AgentOptions,
) -> Agent {
    let node = format!("n-{i}");
    let out = out.join(&node);
    let journal: Journal = Arc::default();
    let backlog = Backlog::new(&node, 10_000);
    let counters = Arc::new(Counters::default());
    let stop_sampling = Arc::new(AtomicBool::new(false));
    let sampler = options.sampling.then(|| {
        let (stop, backlog, node, out) = (
            stop_sampling.clone(),
            backlog.clone(),
            node.clone(),
            out.clone(),
        );
        std::thread::spawn(move || {
            let sink = TelemetrySink::open(SinkConfig::new(&out)).unwrap();
            let mut source = FakeGpus { node: node.into() };
            let mut tap = TelemetryTap(backlog);
            run_sampling_loop_with(
                &mut source,
                None,
                &sink,
                Some(&mut tap),
                Duration::from_millis(100),
                &stop,
                &mut SystemClock::new(),
                None,
            )
            .unwrap();
            sink.finish().unwrap();
        })
    });
    let config = ConnectedConfig {
        client: ClientConfig {
            url: format!("http://{addr}"),
            ..Default::default()
        },
        node: if options.half_the_gpus {
            let full = node_info(i);
            pb::NodeInfo {
                gpus: full.gpus / 2,
                nvlink_domain: full.nvlink_domain / 2,
                ..full
            }
        } else {
            node_info(i)
        },
        mode,
        out: out.clone(),
        flush_interval: Duration::from_millis(100),
        backoff_max: Duration::from_millis(300),
        journal: Some(journal.clone()),
        mig: Vec::new(),
        stop_workers_on_exit: options.stop_workers_on_exit,
        log_retention: None,
        fence_when_silent: options.fence_when_silent,
        stop_grace: options.stop_grace,
    };
    let (stop, mut stop_rx) = watch::channel(false);
    let task = {
        let (backlog, counters) = (backlog.clone(), counters.clone());
        rt.spawn(async move {
            run_connected(config, backlog, counters, async move {
                let _ = stop_rx.wait_for(|s| *s).await;
            })
            .await
            .unwrap();
        })
    };
    Agent {
        node,
        journal,
        counters,
        backlog,
        stop_sampling,
        sampler,
        stop,
        task,
        out,
    }
}

impl Agent {
    /// An orderly stop.
    async fn stop(mut self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        self.stop_sampling.store(true, Ordering::Relaxed);
        if let Some(s) = self.sampler.take() {
            s.join().unwrap();
        }
    }

    /// Gone without a word: the connected loop dropped mid-flight, sampling stopped.
    fn vanish(mut self) {
        self.task.abort();
        self.stop_sampling.store(true, Ordering::Relaxed);
        if let Some(s) = self.sampler.take() {
            s.join().unwrap();
        }
    }
}

fn whole(n: u32) -> Option<pb::GpuDemand> {
    Some(pb::GpuDemand {
        kind: Some(pb::gpu_demand::Kind::Whole(n)),
    })
}

fn job(name: &str, workers: u32, gpu: Option<pb::GpuDemand>, runtime_s: f64) -> pb::JobSpec {
    pb::JobSpec {
        name: name.into(),
        tenant: "t".into(),
        workers,
        gpu,
        cpu_milli: 1000,
        memory_mib: 1024,
        expected_runtime_s: runtime_s,
        idempotency_key: name.into(),
        ..Default::default()
    }
}

/// ~`n` jobs of mixed shapes running `min_s..max_s` seconds.
fn mix(n: usize, min_s: f64, max_s: f64) -> Vec<pb::JobSpec> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    (0..n)
        .map(|i| {
            let t = rng.random_range(min_s..max_s);
            let name = format!("mix-{i}");
            match rng.random_range(0..100u32) {
                0..35 => job(&name, 1, whole(1), t),
                35..55 => job(&name, 1, whole(2), t),
                55..65 => job(&name, 1, whole(4), t),
                65..72 => job(&name, 1, whole(8), t),
                72..85 => job(
                    &name,
                    1,
                    Some(pb::GpuDemand {
                        kind: Some(pb::gpu_demand::Kind::Milli(if i % 2 == 0 {
                            250
                        } else {
                            500
                        })),
                    }),
                    t,
                ),
                85..90 => job(&name, 2, whole(8), t),
                90..95 => job(&name, 3, whole(2), t),
                _ => job(&name, 1, None, t),
            }
        })
        .collect()
}

async fn jobs_client(addr: SocketAddr) -> JobServiceClient<tonic::transport::Channel> {
    JobServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

async fn submit(addr: SocketAddr, specs: &[pb::JobSpec]) -> Vec<u64> {
    let mut c = jobs_client(addr).await;
    let mut ids = Vec::new();
    for s in specs {
        let r = c
            .submit(pb::SubmitRequest {
                spec: Some(s.clone()),
            })
            .await
            .unwrap()
            .into_inner();
        ids.push(r.job.unwrap().id);
    }
    ids
}

/// All jobs, or `None` while the scheduler is unreachable.
/// Cancels job `id` as a client would.
async fn cancel(addr: SocketAddr, id: u64) {
    jobs_client(addr)
        .await
        .cancel(pb::CancelRequest {
            job_id: id,
            reason: "test".into(),
        })
        .await
        .unwrap();
}

/// Polls `done` every 20 ms until it holds; fails with `what` after `limit`.
async fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let t = Instant::now();
    while !done() {
        assert!(t.elapsed() < limit, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn list(addr: SocketAddr) -> Option<Vec<pb::Job>> {
    let mut c = JobServiceClient::connect(format!("http://{addr}"))
        .await
        .ok()?;
    let r = c
        .list(pb::ListJobsRequest {
            limit: 10_000,
            ..Default::default()
        })
        .await
        .ok()?;
    Some(r.into_inner().jobs)
}

async fn nodes(addr: SocketAddr) -> Vec<pb::NodeStatus> {
    NodeServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
        .list_nodes(pb::ListNodesRequest {})
        .await
        .unwrap()
        .into_inner()
        .nodes
}

fn is_final(j: &pb::Job) -> bool {
    use pb::JobState::*;
    matches!(
        pb::JobState::try_from(j.state),
        Ok(Completed | Failed | Cancelled | Rejected)
    )
}

/// Waits until every job is final (panics after `limit`).
async fn wait_final(addr: SocketAddr, limit: Duration) -> Vec<pb::Job> {
    let t = Instant::now();
    loop {
        if let Some(jobs) = list(addr).await
            && jobs.iter().all(is_final)
        {
            return jobs;
        }
        assert!(
            t.elapsed() < limit,
            "jobs not final after {limit:?}: {:?}",
            list(addr).await.map(|j| j
                .into_iter()
                .filter(|j| !is_final(j))
                .map(|j| (j.id, j.state, j.reason))
                .collect::<Vec<_>>())
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Replays each agent's journal: a GPU never holds more than 1000 milli at any moment,
/// and a whole-GPU worker never shares its GPUs. Returns the starts per incarnation.
fn check_journals(agents: &[&Journal]) -> HashMap<(String, u64, u32, u32), u32> {
    let mut starts = HashMap::new();
    for journal in agents {
        let journal = journal.lock().unwrap();
        let mut used: HashMap<u32, u32> = HashMap::new();
        let mut live: HashSet<(u64, u32, u32)> = HashSet::new();
        for e in journal.iter() {
            let i = e.incarnation;
            let key = (i.job, i.worker, i.attempt);
            if e.started {
                *starts
                    .entry((e.node.clone(), i.job, i.worker, i.attempt))
                    .or_insert(0) += 1;
                assert!(live.insert(key), "{} started {key:?} while it ran", e.node);
                for g in &e.gpus {
                    let u = used.entry(g.index).or_default();
                    *u += g.milli;
                    assert!(
                        *u <= 1000,
                        "{}: GPU {} over-allocated ({} milli) when job {} started",
                        e.node,
                        g.index,
                        u,
                        i.job
                    );
                }
            } else {
                assert!(
                    live.remove(&key),
                    "{} ended {key:?} that did not run",
                    e.node
                );
                for g in &e.gpus {
                    *used.get_mut(&g.index).unwrap() -= g.milli;
                }
            }
        }
    }
    starts
}

#[test]
fn three_connected_agents_complete_mixed_jobs_without_sharing_a_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let server = serve(config(&dir.path().join("db.redb"), "127.0.0.1:0")).await;
        let addr = server.addr;
        let agents = start_sim_agents(rt.handle(), addr, dir.path());
        let specs = mix(100, 0.05, 0.4);
        let ids = submit(addr, &specs).await;
        assert_eq!(ids.len(), 100);
        let jobs = wait_final(addr, Duration::from_secs(90)).await;
        for j in &jobs {
            assert_eq!(
                j.state,
                pb::JobState::Completed as i32,
                "job {} ({:?}) ended {}: {}",
                j.id,
                j.spec.as_ref().map(|s| &s.name),
                j.state,
                j.reason
            );
            assert_eq!(j.attempts, 1, "job {} placed more than once", j.id);
        }
        // Telemetry flowed to the scheduler and into Parquet.
        tokio::time::sleep(Duration::from_millis(300)).await;
        for n in nodes(addr).await {
            assert!(n.registered && !n.unreachable, "{n:?}");
            assert!(n.telemetry_samples > 0, "{n:?}");
        }
        let journals: Vec<&Journal> = agents.iter().map(|a| &a.journal).collect();
        let starts = check_journals(&journals);
        assert!(starts.values().all(|&n| n == 1));
        let workers: u32 = specs.iter().map(|s| s.workers).sum();
        assert_eq!(starts.len() as u32, workers);
        for a in agents {
            let t = a.backlog.stats();
            assert!(t.streamed > 0 && t.rejected == 0, "{}: {t:?}", a.node);
            let out = a.out.clone();
            a.stop().await;
            assert!(
                marshal_telemetry::summarize(&out)
                    .unwrap()
                    .kinds
                    .iter()
                    .any(|k| k.rows > 0)
            );
            // Every worker's environment file is gone with the worker.
            assert_eq!(
                std::fs::read_dir(out.join("assignments")).unwrap().count(),
                0
            );
        }
        server.shutdown().await.unwrap();
    });
}

#[test]
fn agents_reconnect_to_a_restarted_scheduler_and_start_no_job_twice() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let db = dir.path().join("db.redb");
        let server = serve(config(&db, "127.0.0.1:0")).await;
        let addr = server.addr;
        let agents = start_sim_agents(rt.handle(), addr, dir.path());
        let specs = mix(60, 0.2, 1.0);
        submit(addr, &specs).await;
        // Restart once about a third of the jobs are done.
        loop {
            let jobs = list(addr).await.unwrap();
            if jobs.iter().filter(|j| is_final(j)).count() >= 20 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        server.shutdown().await.unwrap();
        tokio::time::sleep(Duration::from_millis(700)).await;
        let server = serve(config(&db, &addr.to_string())).await;
        let jobs = wait_final(addr, Duration::from_secs(90)).await;
        for j in &jobs {
            assert_eq!(
                j.state,
                pb::JobState::Completed as i32,
                "job {}: {}",
                j.id,
                j.reason
            );
            assert_eq!(j.attempts, 1, "job {} placed again: {}", j.id, j.reason);
        }
        let journals: Vec<&Journal> = agents.iter().map(|a| &a.journal).collect();
        let starts = check_journals(&journals);
        assert!(starts.values().all(|&n| n == 1), "a worker started twice");
        let workers: u32 = specs.iter().map(|s| s.workers).sum();
        assert_eq!(starts.len() as u32, workers);
        for a in agents {
            let regs = a.counters.registrations.load(Ordering::Relaxed);
            assert!(regs >= 2, "{} registered {regs} times", a.node);
            a.stop().await;
        }
        server.shutdown().await.unwrap();
    });
}

#[test]
fn a_silent_agent_makes_its_node_unreachable_and_its_jobs_move_after_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let server = serve_with_liveness(dir.path(), 500, 1_500).await;
        let addr = server.addr;
        let mut agents: Vec<Option<Agent>> = start_sim_agents(rt.handle(), addr, dir.path())
            .into_iter()
            .map(Some)
            .collect();
        // Three full-node jobs long enough to outlive the timeout and grace; two more wait.
        let specs: Vec<pb::JobSpec> = (0..5)
            .map(|i| job(&format!("big-{i}"), 1, whole(8), 4.0))
            .collect();
        let ids = submit(addr, &specs).await;
        // The first job's node goes silent once the job runs there.
        let (victim, node) = loop {
            let jobs = list(addr).await.unwrap();
            let j = jobs.iter().find(|j| j.id == ids[0]).unwrap();
            if j.state == pb::JobState::Running as i32 {
                break (j.id, j.placement[0].node.clone());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let i: usize = node.trim_start_matches("n-").parse().unwrap();
        let silent = Instant::now();
        agents[i].take().unwrap().vanish();
        // Unreachable after the timeout; the job keeps its placement during the grace.
        loop {
            let n = nodes(addr)
                .await
                .into_iter()
                .find(|n| n.name == node)
                .unwrap();
            if n.unreachable {
                break;
            }
            assert!(
                silent.elapsed() < Duration::from_secs(5),
                "{node} never unreachable"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Not before the timeout (500 ms) less the last flush interval and some slack.
        assert!(silent.elapsed() >= Duration::from_millis(250));
        let j = list(addr)
            .await
            .unwrap()
            .into_iter()
            .find(|j| j.id == victim)
            .unwrap();
        assert_eq!(
            j.state,
            pb::JobState::Running as i32,
            "requeued before the grace: {}",
            j.reason
        );
        assert_eq!(j.placement[0].node, node);
        // Everything completes elsewhere; the victim was requeued once.
        let jobs = wait_final(addr, Duration::from_secs(60)).await;
        for j in &jobs {
            assert_eq!(
                j.state,
                pb::JobState::Completed as i32,
                "job {}: {}",
                j.id,
                j.reason
            );
        }
        let j = jobs.iter().find(|j| j.id == victim).unwrap();
        assert_eq!(j.attempts, 2);
        let journals: Vec<&Journal> = agents.iter().flatten().map(|a| &a.journal).collect();
        let starts = check_journals(&journals);
        assert!(
            starts
                .keys()
                .any(|(n, job, _, attempt)| *job == victim && *attempt == 2 && *n != node)
        );
        // The node comes back with a new agent: schedulable again, and used.
        agents[i] = Some(start_agent(
            rt.handle(),
            addr,
            i,
            Mode::Simulated { speedup: 1.0 },
            &dir.path().join("again"),
        ));
        let t = Instant::now();
        while nodes(addr)
            .await
            .into_iter()
            .any(|n| n.name == node && n.unreachable)
        {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "{node} never came back"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let more: Vec<pb::JobSpec> = (0..3)
            .map(|k| job(&format!("again-{k}"), 1, whole(8), 0.3))
            .collect();
        let more = submit(addr, &more).await;
        let jobs = wait_final(addr, Duration::from_secs(30)).await;
        assert!(
            jobs.iter()
                .filter(|j| more.contains(&j.id))
                .all(|j| j.state == pb::JobState::Completed as i32)
        );
        let back = agents[i].as_ref().unwrap();
        assert!(
            back.journal
                .lock()
                .unwrap()
                .iter()
                .any(|e| more.contains(&e.incarnation.job))
        );
        for a in agents.into_iter().flatten() {
            a.stop().await;
        }
        server.shutdown().await.unwrap();
    });
}

#[test]
fn an_agent_without_telemetry_stays_reachable_through_heartbeats() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let server = serve_with_liveness(dir.path(), 400, 400).await;
        let addr = server.addr;
        let agent = start_agent_with(
            rt.handle(),
            addr,
            0,
            Mode::Simulated { speedup: 1.0 },
            dir.path(),
            AgentOptions {
                sampling: false,
                ..Default::default()
            },
        );
        // Five timeouts long: without Heartbeat calls the node would turn unreachable.
        let t = Instant::now();
        let mut registered = false;
        while t.elapsed() < Duration::from_secs(2) {
            let n = nodes(addr)
                .await
                .into_iter()
                .find(|n| n.name == "n-0")
                .unwrap();
            registered |= n.registered;
            assert!(
                !(registered && n.unreachable),
                "n-0 went unreachable after {:?}",
                t.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(registered, "the agent never registered");
        assert_eq!(
            agent.backlog.stats().produced,
            0,
            "telemetry was produced after all"
        );
        agent.stop().await;
        server.shutdown().await.unwrap();
    });
}

// `--exec` needs /proc to supervise its workers: Linux only.
#[cfg(target_os = "linux")]
#[test]
fn exec_reports_exit_status_sets_the_environment_and_kills_on_cancel() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let config = ServiceConfig {
            max_attempts: 1,
            ..config(&dir.path().join("db.redb"), "127.0.0.1:0")
        };
        let server = serve(config).await;
        let addr = server.addr;
        let seen = dir.path().join("seen");
        std::fs::create_dir_all(&seen).unwrap();
        let cmd = format!(
            "env | grep -E '^(MARSHAL_|CUDA_VISIBLE_DEVICES=)' | sort > '{}'/$MARSHAL_JOB_ID.env; \
             case \"$MARSHAL_JOB_NAME\" in fail) exit 1;; long) exec sleep 30;; esac",
            seen.display()
        );
        let agent = start_agent(rt.handle(), addr, 0, Mode::Exec(cmd), dir.path());
        let ids = submit(
            addr,
            &[job("ok", 1, whole(2), 0.0), job("fail", 1, whole(1), 0.0)],
        )
        .await;
        let jobs = wait_final(addr, Duration::from_secs(30)).await;
        let by_id = |id: u64| jobs.iter().find(|j| j.id == id).unwrap();
        assert_eq!(
            by_id(ids[0]).state,
            pb::JobState::Completed as i32,
            "{}",
            by_id(ids[0]).reason
        );
        let failed = by_id(ids[1]);
        assert_eq!(
            failed.state,
            pb::JobState::Failed as i32,
            "{}",
            failed.reason
        );
        assert!(
            failed.reason.contains("exit status: 1"),
            "{}",
            failed.reason
        );
        let env = std::fs::read_to_string(seen.join(format!("{}.env", ids[0]))).unwrap();
        // A finished job has no placement any more: the GPUs are the agent's.
        let mut gpus: Vec<u32> = agent
            .journal
            .lock()
            .unwrap()
            .iter()
            .find(|e| e.incarnation.job == ids[0] && e.started)
            .unwrap()
            .gpus
            .iter()
            .map(|g| g.index)
            .collect();
        gpus.sort_unstable();
        assert_eq!(gpus.len(), 2);
        let gpus: Vec<String> = gpus.iter().map(u32::to_string).collect();
        assert!(
            env.contains(&format!("CUDA_VISIBLE_DEVICES={}\n", gpus.join(","))),
            "{env}"
        );
        assert!(
            env.contains(&format!("MARSHAL_JOB_ID={}\n", ids[0])),
            "{env}"
        );
        assert!(
            env.contains("MARSHAL_WORKER=0\n") && env.contains("MARSHAL_WORLD_SIZE=1\n"),
            "{env}"
        );
        assert!(
            env.contains("MARSHAL_NODE=n-0\n") && env.contains("MARSHAL_ATTEMPT=1\n"),
            "{env}"
        );
        // A cancelled job's process is killed.
        let long = submit(addr, &[job("long", 1, whole(1), 0.0)]).await[0];
        let t = Instant::now();
        loop {
            let j = list(addr)
                .await
                .unwrap()
                .into_iter()
                .find(|j| j.id == long)
                .unwrap();
            if j.state == pb::JobState::Running as i32 {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(10));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        cancel(addr, long).await;
        wait_until(
            Duration::from_secs(5),
            "the cancelled job was not stopped",
            || {
                agent
                    .journal
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|e| e.incarnation.job == long && !e.started)
            },
        )
        .await;
        let j = list(addr)
            .await
            .unwrap()
            .into_iter()
            .find(|j| j.id == long)
            .unwrap();
        assert_eq!(j.state, pb::JobState::Cancelled as i32);
        agent.stop().await;
        server.shutdown().await.unwrap();
    });
}

/// The job `id`, as the scheduler lists it.
#[cfg(target_os = "linux")]
async fn job_state(addr: SocketAddr, id: u64) -> pb::Job {
    list(addr)
        .await
        .unwrap()
        .into_iter()
        .find(|j| j.id == id)
        .unwrap()
}

/// Waits until every job in `ids` is RUNNING on `attempt` (panics after 10 s).
#[cfg(target_os = "linux")]
async fn wait_running(addr: SocketAddr, ids: &[u64], attempt: u32) {
    let t = Instant::now();
    for &id in ids {
        loop {
            let j = job_state(addr, id).await;
            if j.state == pb::JobState::Running as i32 && j.attempts == attempt {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "job {id} not running on attempt {attempt}: {j:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Whether a process with this pid runs (a zombie does not).
#[cfg(target_os = "linux")]
fn process_runs(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let state = s[s.rfind(')')? + 1..]
                .split_whitespace()
                .next()?
                .to_string();
            Some(state != "Z" && state != "X")
        })
        .unwrap_or(false)
}

#[cfg(target_os = "linux")]
#[test]
fn exec_workers_outlive_an_agent_restart_and_are_reported_once_by_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let config = ServiceConfig {
            max_attempts: 1,
            ..config(&dir.path().join("db.redb"), "127.0.0.1:0")
        };
        let server = serve(config).await;
        let addr = server.addr;
        let seen = dir.path().join("seen");
        std::fs::create_dir_all(&seen).unwrap();
        // Each run leaves a line: a worker started twice would leave two.
        let cmd = format!(
            "echo run >> '{}'/$MARSHAL_JOB_ID.runs; sleep 3; \
             case \"$MARSHAL_JOB_NAME\" in fail) exit 3;; esac",
            seen.display()
        );
        let first = start_agent(rt.handle(), addr, 0, Mode::Exec(cmd.clone()), dir.path());
        let ids = submit(
            addr,
            &[job("ok", 1, whole(2), 0.0), job("fail", 1, whole(1), 0.0)],
        )
        .await;
        wait_running(addr, &ids, 1).await;
        let first_journal = first.journal.clone();
        first.stop().await;
        // The agent is gone; its workers are not, and the jobs stay where they are.
        for &id in &ids {
            let j = job_state(addr, id).await;
            assert_eq!(j.state, pb::JobState::Running as i32, "{j:?}");
        }
        let state_dir = dir.path().join("n-0/jobs/state");
        assert_eq!(std::fs::read_dir(&state_dir).unwrap().count(), 2);
        let second = start_agent(rt.handle(), addr, 0, Mode::Exec(cmd), dir.path());
        let jobs = wait_final(addr, Duration::from_secs(20)).await;
        let by_id = |id: u64| jobs.iter().find(|j| j.id == id).unwrap();
        let ok = by_id(ids[0]);
        assert_eq!(ok.state, pb::JobState::Completed as i32, "{}", ok.reason);
        let failed = by_id(ids[1]);
        assert_eq!(
            failed.state,
            pb::JobState::Failed as i32,
            "{}",
            failed.reason
        );
        assert!(
            failed.reason.contains("exit status: 3"),
            "{}",
            failed.reason
        );
        // Placed once, started once, and the second agent started nothing.
        for j in [ok, failed] {
            assert_eq!(j.attempts, 1, "job {} placed again", j.id);
            let runs = std::fs::read_to_string(seen.join(format!("{}.runs", j.id))).unwrap();
            assert_eq!(runs, "run\n", "job {}", j.id);
        }
        let starts = |journal: &Journal, adopted: bool| -> Vec<u64> {
            let mut jobs: Vec<u64> = journal
                .lock()
                .unwrap()
                .iter()
                .filter(|e| e.started && e.adopted == adopted)
                .map(|e| e.incarnation.job)
                .collect();
            jobs.sort_unstable();
            jobs
        };
        assert_eq!(starts(&first_journal, false), ids);
        assert_eq!(starts(&second.journal, false), Vec::<u64>::new());
        assert_eq!(starts(&second.journal, true), ids);
        // One end each, seen by the second agent; with the reports taken, the state
        // records are gone.
        let ends = second
            .journal
            .lock()
            .unwrap()
            .iter()
            .filter(|e| !e.started)
            .count();
        assert_eq!(ends, 2);
        wait_until(Duration::from_secs(5), "state records left", || {
            std::fs::read_dir(&state_dir).unwrap().count() == 0
        })
        .await;
        second.stop().await;
        server.shutdown().await.unwrap();
    });
}

/// The pid an `--exec` worker of `pid_command` wrote: the job runs once its worker is
/// spawned, and the shell writes its pid a moment later.
async fn worker_pid(pids: &Path, job: u64, attempt: u32) -> u32 {
    let pid_file = pids.join(format!("{job}.{attempt}"));
    let mut pid = None;
    wait_until(Duration::from_secs(10), "the worker's pid file", || {
        pid = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok());
        pid.is_some()
    })
    .await;
    pid.unwrap()
}

/// A worker command that writes its pid to `pids/<job>.<attempt>` and sleeps a minute.
fn pid_command(pids: &Path) -> String {
    std::fs::create_dir_all(pids).unwrap();
    format!(
        "echo $$ > '{}'/$MARSHAL_JOB_ID.$MARSHAL_ATTEMPT; exec sleep 60",
        pids.display()
    )
}

/// An agent whose registration is refused (its node now reports half its GPUs) stops
/// the workers it adopted when the scheduler requeues their jobs: not at the refusal,
/// and not never (before, they ran on while the job ran again elsewhere).
#[cfg(target_os = "linux")]
#[test]
fn a_refused_agent_stops_its_workers_when_the_scheduler_requeues_their_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        // A timeout far off: only the refusal takes the node out.
        let server = serve_with_liveness(dir.path(), 60_000, 1_500).await;
        let addr = server.addr;
        let pids = dir.path().join("pids");
        let cmd = pid_command(&pids);
        let first = start_agent(rt.handle(), addr, 0, Mode::Exec(cmd.clone()), dir.path());
        let id = submit(addr, &[job("long", 1, whole(1), 0.0)]).await[0];
        wait_running(addr, &[id], 1).await;
        let pid = worker_pid(&pids, id, 1).await;
        // Stopped, the agent leaves the worker running for the next one to adopt.
        first.stop().await;
        assert!(process_runs(pid));
        let refused_from = Instant::now();
        let options = AgentOptions {
            half_the_gpus: true,
            ..Default::default()
        };
        let second = start_agent_with(rt.handle(), addr, 0, Mode::Exec(cmd), dir.path(), options);
        wait_until(Duration::from_secs(15), "the fenced worker gone", || {
            !process_runs(pid)
        })
        .await;
        // The refusal said 1.5 s (the agent fences 5 % early): not at the refusal.
        let fenced_after = refused_from.elapsed();
        assert!(
            fenced_after >= Duration::from_millis(1_000),
            "fenced {fenced_after:?} after the agent started"
        );
        assert_eq!(second.counters.fenced.load(Ordering::Relaxed), 1);
        assert!(second.journal.lock().unwrap().iter().any(|e| e.adopted));
        // The scheduler requeued the job meanwhile (the refused node takes no work).
        let mut requeued = false;
        for _ in 0..250 {
            let j = job_state(addr, id).await;
            if j.attempts >= 2 || j.state == pb::JobState::Requeued as i32 {
                requeued = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(requeued, "{:?}", job_state(addr, id).await);
        second.stop().await;
        server.shutdown().await.unwrap();
    });
}

/// With `--fence-when-silent`, an agent that cannot reach the scheduler stops its workers
/// once the scheduler's timeout and grace (said at registration) have passed since it was
/// last answered; an agent without it leaves them running.
#[cfg(target_os = "linux")]
#[test]
fn fence_when_silent_stops_workers_after_the_timeout_and_grace_and_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let server = serve_with_liveness(dir.path(), 1_000, 1_000).await;
        let addr = server.addr;
        let pids = dir.path().join("pids");
        let cmd = pid_command(&pids);
        let fencing = AgentOptions {
            fence_when_silent: true,
            ..Default::default()
        };
        let agents = [
            start_agent_with(
                rt.handle(),
                addr,
                0,
                Mode::Exec(cmd.clone()),
                dir.path(),
                fencing,
            ),
            start_agent(rt.handle(), addr, 1, Mode::Exec(cmd), dir.path()),
        ];
        // Both nodes registered before the jobs arrive: one full-node job on each.
        wait_until(Duration::from_secs(10), "two registrations", || {
            agents
                .iter()
                .all(|a| a.counters.registrations.load(Ordering::Relaxed) > 0)
        })
        .await;
        let ids = submit(
            addr,
            &[job("a", 1, whole(8), 0.0), job("b", 1, whole(8), 0.0)],
        )
        .await;
        wait_running(addr, &ids, 1).await;
        let mut by_node = HashMap::new();
        for &id in &ids {
            let j = job_state(addr, id).await;
            by_node.insert(j.placement[0].node.clone(), worker_pid(&pids, id, 1).await);
        }
        let (fenced, kept) = (by_node["n-0"], by_node["n-1"]);
        let silent_from = Instant::now();
        server.shutdown().await.unwrap();
        wait_until(Duration::from_secs(15), "the fenced worker gone", || {
            !process_runs(fenced)
        })
        .await;
        // 2 s less 5 % from the last answered call, about a flush interval before.
        let fenced_after = silent_from.elapsed();
        assert!(
            fenced_after >= Duration::from_millis(1_000),
            "fenced {fenced_after:?} after the scheduler stopped"
        );
        assert_eq!(agents[0].counters.fenced.load(Ordering::Relaxed), 1);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            process_runs(kept),
            "the agent without fencing stopped its worker"
        );
        assert_eq!(agents[1].counters.fenced.load(Ordering::Relaxed), 0);
        for a in agents {
            a.stop().await;
        }
        // The worker's own pid (its command exec'd `sleep`), not its group's leader.
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &kept.to_string()])
            .status();
    });
}

/// A job moved off a drained node starts on the other node only once its worker on the
/// first has ended: the worker takes 2 s of its stop grace to checkpoint, and until the
/// first agent confirms the stop the scheduler holds the second one's START (before,
/// both ran for those 2 s).
#[cfg(target_os = "linux")]
#[test]
fn a_moved_job_starts_elsewhere_only_after_its_stopped_worker_has_ended() {
    moved_job_starts_after_its_stopped_worker(false);
}

/// The same with the scheduler restarted right after the drain, while the first worker
/// still checkpoints: the restarted scheduler takes the wait up from its database, so
/// its watch snapshot does not start the job on the second node at once (before, it
/// did).
#[cfg(target_os = "linux")]
#[test]
fn a_restarted_scheduler_still_holds_a_moved_job_until_its_stopped_worker_has_ended() {
    moved_job_starts_after_its_stopped_worker(true);
}

#[cfg(target_os = "linux")]
fn moved_job_starts_after_its_stopped_worker(restart: bool) {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let db = dir.path().join("db.redb");
        let mut server = serve(config(&db, "127.0.0.1:0")).await;
        let addr = server.addr;
        let marks = dir.path().join("marks");
        std::fs::create_dir_all(&marks).unwrap();
        let at = |what: &str| {
            format!(
                "date +%s%N > '{}'/{what}.$MARSHAL_JOB_ID.$MARSHAL_ATTEMPT",
                marks.display()
            )
        };
        // Long enough, with a restart, for the agents to be back before it ends.
        let checkpoint_s = if restart { 5 } else { 2 };
        let cmd = format!(
            "trap 'sleep {checkpoint_s}; {}; exit 0' TERM; {}; sleep 60 & wait",
            at("ended"),
            at("started")
        );
        let options = AgentOptions {
            stop_grace: Duration::from_secs(20),
            ..Default::default()
        };
        let agents: Vec<Agent> = (0..2)
            .map(|i| {
                start_agent_with(
                    rt.handle(),
                    addr,
                    i,
                    Mode::Exec(cmd.clone()),
                    dir.path(),
                    options,
                )
            })
            .collect();
        wait_until(Duration::from_secs(10), "two registrations", || {
            agents
                .iter()
                .all(|a| a.counters.registrations.load(Ordering::Relaxed) > 0)
        })
        .await;
        let id = submit(addr, &[job("ckpt", 1, whole(8), 0.0)]).await[0];
        wait_running(addr, &[id], 1).await;
        let first = job_state(addr, id).await.placement[0].node.clone();
        NodeServiceClient::connect(format!("http://{addr}"))
            .await
            .unwrap()
            .drain(pb::DrainRequest {
                node: first.clone(),
                reason: "maintenance".into(),
            })
            .await
            .unwrap();
        if restart {
            server.shutdown().await.unwrap();
            tokio::time::sleep(Duration::from_millis(700)).await;
            server = serve(config(&db, &addr.to_string())).await;
        }
        let read = |what: &str, attempt: u32| -> Option<u128> {
            std::fs::read_to_string(marks.join(format!("{what}.{id}.{attempt}")))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        let t = Instant::now();
        while read("started", 2).is_none() {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "attempt 2 never started"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (ended, started) = (read("ended", 1), read("started", 2).unwrap());
        assert!(
            ended.is_some_and(|e| e <= started),
            "attempt 2 started at {started} ns while attempt 1 ended at {ended:?}"
        );
        let second = job_state(addr, id).await.placement[0].node.clone();
        assert_ne!(first, second);
        if !restart {
            let on_first = agents.iter().find(|a| a.node == first).unwrap();
            assert_eq!(on_first.counters.stops_confirmed.load(Ordering::Relaxed), 1);
        }
        cancel(addr, id).await;
        for a in agents {
            a.stop().await;
        }
        server.shutdown().await.unwrap();
    });
}

#[cfg(target_os = "linux")]
#[test]
fn stop_workers_on_exit_kills_exec_workers_and_the_job_is_placed_again() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let server = serve(config(&dir.path().join("db.redb"), "127.0.0.1:0")).await;
        let addr = server.addr;
        let pids = dir.path().join("pids");
        let cmd = pid_command(&pids);
        let options = AgentOptions {
            stop_workers_on_exit: true,
            ..Default::default()
        };
        let first = start_agent_with(
            rt.handle(),
            addr,
            0,
            Mode::Exec(cmd.clone()),
            dir.path(),
            options,
        );
        let id = submit(addr, &[job("long", 1, whole(1), 0.0)]).await[0];
        wait_running(addr, &[id], 1).await;
        let pid = worker_pid(&pids, id, 1).await;
        assert!(process_runs(pid));
        first.stop().await;
        assert!(
            !process_runs(pid),
            "the worker outlived --stop-workers-on-exit"
        );
        assert_eq!(
            std::fs::read_dir(dir.path().join("n-0/jobs/state"))
                .unwrap()
                .count(),
            0
        );
        // The next agent has nothing to adopt: the scheduler places the job again.
        let second = start_agent_with(rt.handle(), addr, 0, Mode::Exec(cmd), dir.path(), options);
        wait_running(addr, &[id], 2).await;
        assert!(second.journal.lock().unwrap().iter().all(|e| !e.adopted));
        cancel(addr, id).await;
        second.stop().await;
        server.shutdown().await.unwrap();
    });
}

/// An `--exec` worker gets `MARSHAL_CHECKPOINT_FILE`; each time it touches the file,
/// the agent reports the file's time as the job's last checkpoint (polled at its
/// report interval), and the scheduler shows it on the job.
#[cfg(target_os = "linux")]
#[test]
fn a_touched_checkpoint_file_is_reported_as_the_jobs_last_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let server = serve(config(&dir.path().join("db.redb"), "127.0.0.1:0")).await;
        let addr = server.addr;
        let named = dir.path().join("checkpoint-path");
        let cmd = format!(
            "printf %s \"$MARSHAL_CHECKPOINT_FILE\" > '{}'; sleep 1; \
             touch \"$MARSHAL_CHECKPOINT_FILE\"; exec sleep 30",
            named.display()
        );
        let agent = start_agent(rt.handle(), addr, 0, Mode::Exec(cmd), dir.path());
        let id = submit(addr, &[job("ckpt", 1, whole(1), 0.0)]).await[0];
        let reported_after = |after: f64| async move {
            let t = Instant::now();
            loop {
                let j = job_state(addr, id).await;
                if j.last_checkpoint_unix_s > after {
                    return j.last_checkpoint_unix_s;
                }
                assert!(
                    t.elapsed() < Duration::from_secs(20),
                    "no checkpoint after {after} reported: {j:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let first = reported_after(0.0).await;
        let file = PathBuf::from(std::fs::read_to_string(&named).unwrap());
        assert!(
            file.starts_with(dir.path().join("n-0")),
            "{}",
            file.display()
        );
        let mtime = |p: &Path| {
            std::fs::metadata(p)
                .unwrap()
                .modified()
                .unwrap()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs_f64()
        };
        assert_eq!(first, mtime(&file));
        // Written again, a second later: the newer time is reported. (A time ahead of
        // the agent's clock would be reported as now.)
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let next = std::time::SystemTime::now();
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(next)
            .unwrap();
        let second = reported_after(first).await;
        assert_eq!(second, mtime(&file));
        assert!(second >= first + 1.0);
        cancel(addr, id).await;
        wait_until(
            Duration::from_secs(5),
            "the ended worker's checkpoint file stays",
            || !file.exists(),
        )
        .await;
        agent.stop().await;
        server.shutdown().await.unwrap();
    });
}

/// `marshal agent --metrics-listen` serves the connected agent's counters: registered,
/// with its node's name on every series.
#[test]
fn the_binary_agent_serves_its_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let cluster = marshal_scheduler::domain::ClusterSpec::from_toml(MIG_NODE).unwrap();
        let config = ServiceConfig {
            cluster: cluster.name.clone(),
            ..config(&dir.path().join("db.redb"), "127.0.0.1:0")
        };
        let server = service::start(config, cluster, Arc::new(NoModel))
            .await
            .unwrap();
        let mut agent = KillOnDrop(
            std::process::Command::new(env!("CARGO_BIN_EXE_marshal"))
                .args(["agent", "--source", "nvml", "--nvml-lib"])
                .arg(fake_driver())
                .args(["--node", "fake-mig-0", "--interval", "200ms", "--out"])
                .arg(dir.path().join("telemetry"))
                .args(["--scheduler", &format!("http://{}", server.addr)])
                .args(["--metrics-listen", "127.0.0.1:0"])
                .env("FAKE_NVML_MACHINE", "a100-mig")
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap(),
        );
        // The port it bound, from its log (read to the end, so the pipe never fills).
        let stderr = agent.0.stderr.take().unwrap();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if let Some(rest) = line.strip_prefix("agent: metrics at http://") {
                    let _ = addr_tx.send(rest.trim_end_matches("/metrics").to_string());
                }
            }
        });
        let metrics_addr: SocketAddr =
            tokio::task::spawn_blocking(move || addr_rx.recv_timeout(Duration::from_secs(30)))
                .await
                .unwrap()
                .expect("the agent never said where its metrics are")
                .parse()
                .unwrap();
        let registered = "marshal_agent_registered{node=\"fake-mig-0\"} 1";
        let registrations = "marshal_agent_registrations_total{node=\"fake-mig-0\"} 1";
        let t = Instant::now();
        // Both: a scrape reads the counters one after another, so one taken while the
        // agent registers can see the gauge set and the count not yet raised.
        let text = loop {
            let text = common::http_get(metrics_addr, "/metrics").await;
            if text.contains(registered) && text.contains(registrations) {
                break text;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "never registered: {text}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            text.contains(
                "marshal_agent_telemetry_rows_total{node=\"fake-mig-0\",outcome=\"produced\"}"
            ),
            "{text}"
        );
        server.shutdown().await.unwrap();
    });
}

/// One node of two A100s in MIG mode, named as the binary agent below registers it.
const MIG_NODE: &str = r#"
name = "fake-mig"

[[nodes]]
names = ["fake-mig-0"]
gpu_model = "A100-80"
gpus = 2
nvlink_domain = 0
mig_gpus = [0, 1]
cpu_milli = 1000
memory_mib = 1024

[[nodes.mig_layout]]
gpus = [0, 1]
instances = ["3g.40gb", "2g.20gb", "1g.10gb"]
"#;

/// The fake driver's `pcie-bridged` server: four A100 PCIe in NVLink-bridged pairs, GPU 3
/// in MIG mode with a 3g.40gb instance and a one-slice compute instance of a 2g.20gb.
const BRIDGED_NODE: &str = r#"
name = "fake-pcie"

[[nodes]]
names = ["fake-pcie-0"]
gpu_model = "A100-80"
gpus = 4
nvlink_domain = 2
mig_gpus = [3]
cpu_milli = 1000
memory_mib = 1024

[[nodes.mig_layout]]
gpus = [3]
instances = ["3g.40gb", "1c.2g.20gb"]
"#;

fn mig(compute_slices: u32, memory_slices: u32) -> Option<pb::GpuDemand> {
    Some(pb::GpuDemand {
        kind: Some(pb::gpu_demand::Kind::Mig(pb::MigProfile {
            compute_slices,
            memory_slices,
        })),
    })
}

/// A child process killed and reaped when dropped, so that a failed assertion leaves no
/// agent running behind the test.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // Already gone when the test stopped it itself: nothing to do.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What a run of the binary NVML agent against the fake driver left behind.
struct NvmlAgentRun {
    ids: Vec<u64>,
    jobs: Vec<pb::Job>,
    /// Per job id: `"$CUDA_VISIBLE_DEVICES $MARSHAL_MIG_UUID"` as its worker saw them.
    seen: HashMap<u64, String>,
    stderr: String,
}

impl NvmlAgentRun {
    fn job(&self, i: usize) -> &pb::Job {
        self.jobs.iter().find(|j| j.id == self.ids[i]).unwrap()
    }
}

fn fake_driver() -> PathBuf {
    let fake = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .join("libmarshal_fake_nvml.so");
    assert!(fake.exists(), "{} is missing", fake.display());
    fake
}

/// Serves `inventory`, runs `marshal agent --source nvml` on the fake driver's `machine`
/// as `node`, submits `specs` and waits until every job is final.
fn run_nvml_agent(
    inventory: &str,
    machine: &str,
    node: &str,
    specs: &[pb::JobSpec],
) -> NvmlAgentRun {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let cluster = marshal_scheduler::domain::ClusterSpec::from_toml(inventory).unwrap();
        let config = ServiceConfig {
            cluster: cluster.name.clone(),
            max_attempts: 1,
            ..config(&dir.path().join("db.redb"), "127.0.0.1:0")
        };
        let server = service::start(config, cluster, Arc::new(NoModel))
            .await
            .unwrap();
        let addr = server.addr;
        let seen_dir = dir.path().join("seen");
        std::fs::create_dir_all(&seen_dir).unwrap();
        let cmd = format!(
            "printf '%s %s' \"$CUDA_VISIBLE_DEVICES\" \"$MARSHAL_MIG_UUID\" > '{}'/$MARSHAL_JOB_ID",
            seen_dir.display()
        );
        let mut agent = KillOnDrop(
            std::process::Command::new(env!("CARGO_BIN_EXE_marshal"))
                .args(["agent", "--source", "nvml", "--nvml-lib"])
                .arg(fake_driver())
                .args(["--node", node, "--interval", "200ms", "--out"])
                .arg(dir.path().join("telemetry"))
                .args(["--scheduler", &format!("http://{addr}"), "--exec", &cmd])
                .env("FAKE_NVML_MACHINE", machine)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let ids = submit(addr, specs).await;
        let jobs = wait_final(addr, Duration::from_secs(60)).await;
        std::process::Command::new("kill")
            .arg("-TERM")
            .arg(agent.0.id().to_string())
            .status()
            .unwrap();
        let status = agent.0.wait().unwrap();
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut agent.0.stderr.take().unwrap(), &mut stderr).unwrap();
        assert!(status.success(), "{stderr}");
        server.shutdown().await.unwrap();
        let seen = ids
            .iter()
            .filter_map(|id| {
                let text = std::fs::read_to_string(seen_dir.join(id.to_string())).ok()?;
                Some((*id, text))
            })
            .collect();
        NvmlAgentRun {
            ids,
            jobs,
            seen,
            stderr,
        }
    })
}

/// The binary agent with the NVML source, against the fake driver (`telemetry/fake-nvml`):
/// it registers the node NVML discovered, lists the MIG instances, and starts each MIG
/// job with `CUDA_VISIBLE_DEVICES` set to an instance of exactly the placed size.
#[test]
fn an_nvml_agent_registers_its_discovered_node_and_runs_mig_jobs_on_their_instances() {
    let run = run_nvml_agent(
        MIG_NODE,
        "a100-mig",
        "fake-mig-0",
        &[
            job("big-slice", 1, mig(3, 4), 0.0),
            job("small-slice", 1, mig(1, 1), 0.0),
        ],
    );
    let stderr = &run.stderr;
    assert!(stderr.contains("6 MIG instances to hand out"), "{stderr}");
    assert!(
        stderr.contains("node fake-mig-0 (2 × A100-80, MIG mode on GPUs [0, 1])"),
        "{stderr}"
    );
    // 3g.40gb is each GPU's first instance (slot 0), 1g.10gb its third (slot 2).
    for (i, slot) in [0, 2].into_iter().enumerate() {
        let j = run.job(i);
        assert_eq!(
            j.state,
            pb::JobState::Completed as i32,
            "{}: {}",
            j.id,
            j.reason
        );
        let seen = &run.seen[&j.id];
        let (visible, uuid) = seen.split_once(' ').unwrap();
        assert_eq!(visible, uuid, "{seen}");
        assert!(
            uuid.starts_with("MIG-fake000") && uuid[12..].starts_with(&format!("-{slot:04}-")),
            "{}: {seen}",
            j.id
        );
    }
}

/// A server with one GPU in MIG mode: the MIG jobs go to that GPU's instances even though
/// GPU 0 is free (with MIG mode left open the scheduler picked GPU 0, where no instance
/// exists, and the start failed), whole-GPU jobs get only the other three, and a job that
/// needs all four is refused at once instead of failing on the node. So is a MIG job of
/// a size the GPU has the slices for but no instance of (with slices counted, it went to
/// GPU 3 and its start failed).
#[test]
fn the_scheduler_keeps_mig_jobs_on_mig_mode_gpus_and_whole_gpu_jobs_off_them() {
    let run = run_nvml_agent(
        BRIDGED_NODE,
        "pcie-bridged",
        "fake-pcie-0",
        &[
            job("slice", 1, mig(3, 4), 0.0),
            job("three-gpus", 1, whole(3), 0.0),
            job("four-gpus", 1, whole(4), 0.0),
            job("small-slice", 1, mig(1, 2), 0.0),
            job("no-instance", 1, mig(2, 2), 0.0),
        ],
    );
    let stderr = &run.stderr;
    assert!(
        stderr.contains("node fake-pcie-0 (4 × A100-80, MIG mode on GPUs [3])"),
        "{stderr}"
    );
    // What a completed job saw as its devices.
    let seen_by = |j: &pb::Job| {
        assert_eq!(j.state, pb::JobState::Completed as i32, "{}", j.reason);
        run.seen[&j.id].clone()
    };
    let (slice, three, four) = (run.job(0), run.job(1), run.job(2));
    let seen = seen_by(slice);
    assert!(seen.starts_with("MIG-fake0003-0000-"), "{seen}");
    assert_eq!(seen_by(three).trim(), "0,1,2");
    assert_eq!(four.state, pb::JobState::Rejected as i32, "{}", four.reason);
    assert!(!run.seen.contains_key(&four.id));
    let (small, none) = (run.job(3), run.job(4));
    let seen = seen_by(small);
    assert!(seen.starts_with("MIG-fake0003-0001-"), "{seen}");
    assert_eq!(none.state, pb::JobState::Rejected as i32, "{}", none.reason);
    assert!(
        none.reason.contains("no node can hold one worker"),
        "{}",
        none.reason
    );
    assert!(!run.seen.contains_key(&none.id));
}

/// Registers the binary NVML agent on the fake `pcie-bridged` server against a server
/// whose inventory is `inventory`, and waits for the agent to log `refusal`.
fn assert_bridged_node_refused(inventory: &str, refusal: &str) {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let cluster = marshal_scheduler::domain::ClusterSpec::from_toml(inventory).unwrap();
        let server = service::start(
            config(&dir.path().join("db.redb"), "127.0.0.1:0"),
            cluster,
            Arc::new(NoModel),
        )
        .await
        .unwrap();
        let log = dir.path().join("agent.log");
        let agent = KillOnDrop(
            std::process::Command::new(env!("CARGO_BIN_EXE_marshal"))
                .args(["agent", "--source", "nvml", "--nvml-lib"])
                .arg(fake_driver())
                .args(["--node", "fake-pcie-0", "--interval", "200ms", "--out"])
                .arg(dir.path().join("telemetry"))
                .args(["--scheduler", &format!("http://{}", server.addr)])
                .env("FAKE_NVML_MACHINE", "pcie-bridged")
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap(),
        );
        wait_until(
            Duration::from_secs(30),
            "the agent logs the refused registration",
            || std::fs::read_to_string(&log).is_ok_and(|t| t.contains(refusal)),
        )
        .await;
        drop(agent);
        server.shutdown().await.unwrap();
    });
}

/// An inventory that leaves MIG mode open for a node whose GPUs NVML reports in MIG mode
/// is refused at registration, with what to declare.
#[test]
fn an_nvml_node_with_mig_mode_the_inventory_leaves_open_is_refused_with_the_fix() {
    assert_bridged_node_refused(
        &BRIDGED_NODE.replace("mig_gpus = [3]\n", "").replace(
            "\n[[nodes.mig_layout]]\ngpus = [3]\ninstances = [\"3g.40gb\", \"1c.2g.20gb\"]\n",
            "",
        ),
        "declare mig_gpus = [3] in its node group",
    );
}

/// So is one that leaves the MIG instances to the scheduler (it would place MIG jobs of
/// sizes the node has no instance of), and one that lists other instances than NVML.
#[test]
fn an_nvml_node_whose_mig_instances_the_inventory_does_not_list_is_refused_with_the_fix() {
    let layout = "\n[[nodes.mig_layout]]\ngpus = [3]\ninstances = [\"3g.40gb\", \"1c.2g.20gb\"]\n";
    assert_bridged_node_refused(
        &BRIDGED_NODE.replace(layout, ""),
        // The log quotes the status message, escaping its quotes.
        r#"declare in its node group [[nodes.mig_layout]] gpus = [3], instances = [\"3g.40gb\", \"1c.2g.20gb\"]"#,
    );
    assert_bridged_node_refused(
        &BRIDGED_NODE.replace("\"1c.2g.20gb\"", "\"1g.10gb\""),
        "GPU 3 has MIG instances [3g.40gb, 1c.2g.20gb]; the inventory's layout lists [3g.40gb, 1g.10gb]",
    );
}
