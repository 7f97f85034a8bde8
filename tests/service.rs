//! The online service on loopback: three simulated agents and a client submitting 1,000
//! jobs of mixed sizes (in process, and against the `marshal serve` binary killed with
//! SIGKILL mid-run and restarted), malformed and unauthorised requests, TLS and mutual
//! TLS, the advisor and Explain.

mod common;

use common::node_info;

use std::collections::{HashMap, HashSet};
use std::io::BufRead as _;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use marshal_scheduler::service::pb::admin_service_client::AdminServiceClient;
use marshal_scheduler::service::pb::advisor_service_client::AdvisorServiceClient;
use marshal_scheduler::service::pb::job_service_client::JobServiceClient;
use marshal_scheduler::service::pb::node_service_client::NodeServiceClient;
use marshal_scheduler::service::{self, NoModel, ServiceConfig, pb, tokio, tonic, tonic_health};
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request};

const NODES: usize = 3;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn config(db: &Path) -> ServiceConfig {
    ServiceConfig {
        listen: "127.0.0.1:0".into(),
        db: db.to_path_buf(),
        cluster: "three-nodes".into(),
        cycle_interval_ms: 100,
        metrics_listen: Some("127.0.0.1:0".into()),
        ..ServiceConfig::default()
    }
}

async fn connect(addr: SocketAddr) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
}

fn with_token<T>(msg: T, token: &str) -> Request<T> {
    let mut r = Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

fn whole(n: u32) -> Option<pb::GpuDemand> {
    Some(pb::GpuDemand {
        kind: Some(pb::gpu_demand::Kind::Whole(n)),
    })
}

/// The i-th job of the seeded mix: mostly small whole-GPU jobs, GPU shares, gangs
/// across nodes, CPU-only jobs, and about 1 % too large to ever fit (rejected).
fn job_spec(rng: &mut rand_chacha::ChaCha8Rng, i: usize) -> pb::JobSpec {
    let r: u32 = rng.random_range(0..100);
    let (workers, gpu, cpu) = match r {
        0..35 => (1, whole(1), 1000),
        35..55 => (1, whole(2), 1000),
        55..65 => (1, whole(4), 1000),
        65..72 => (1, whole(8), 1000),
        72..85 => (
            1,
            Some(pb::GpuDemand {
                kind: Some(pb::gpu_demand::Kind::Milli(if r.is_multiple_of(2) {
                    250
                } else {
                    500
                })),
            }),
            500,
        ),
        85..90 => (2, whole(8), 1000),
        90..95 => (3, whole(2), 1000),
        95..99 => (1, None, 4000),
        _ => (4, whole(8), 1000),
    };
    pb::JobSpec {
        name: format!("mix-{i}"),
        tenant: "test".into(),
        workers,
        gpu,
        cpu_milli: cpu,
        memory_mib: 8192,
        preemptible: true,
        idempotency_key: format!("key-{i}"),
        ..Default::default()
    }
}

fn too_large(s: &pb::JobSpec) -> bool {
    s.workers * 8 > 24 && s.gpu == whole(8)
}

/// What the simulated agents saw. Each agent keeps its own node's GPU ledger from the
/// assignments it receives, independently of the server, and records any GPU that
/// would be over-allocated.
#[derive(Default, Debug)]
struct Ledger {
    used: HashMap<(usize, u32), u32>,
    /// (node, job, worker, attempt) → the GPU slots it holds.
    running: HashMap<(usize, u64, u32, u32), Vec<pb::GpuSlot>>,
    /// Jobs finished whose completion report is not acknowledged yet: (node, job, attempt).
    unreported: HashSet<(usize, u64, u32)>,
    completed: HashSet<u64>,
    /// Incarnations with a completion task on a node: (node, job, attempt). Like a real
    /// agent, a node reports once for all of a job's workers it runs.
    reporting: HashSet<(usize, u64, u32)>,
    errors: Vec<String>,
    starts: u64,
    telemetry_acks: u64,
    /// While set, jobs do not finish (so the test can compare the agents' view with a
    /// restarted server's before anything moves).
    hold: bool,
}

impl Ledger {
    fn start(&mut self, node: usize, a: &pb::Assignment) -> bool {
        let key = (node, a.job_id, a.worker, a.attempt);
        let finished_here = self.reporting.contains(&(node, a.job_id, a.attempt))
            && !self
                .running
                .keys()
                .any(|k| k.0 == node && k.1 == a.job_id && k.3 == a.attempt);
        if self.running.contains_key(&key) || finished_here {
            return false; // a repeated START (snapshot + event around a reconnect)
        }
        for g in &a.gpus {
            let used = self.used.entry((node, g.index)).or_default();
            *used += g.milli;
            if *used > 1000 {
                self.errors.push(format!(
                    "n-{node} GPU {} over-allocated ({} milli) by job {} attempt {}",
                    g.index, used, a.job_id, a.attempt
                ));
            }
        }
        self.starts += 1;
        self.running.insert(key, a.gpus.clone());
        true
    }

    /// Stops every worker of one incarnation on `node`.
    fn stop(&mut self, node: usize, job: u64, attempt: u32) {
        let keys: Vec<_> = self
            .running
            .keys()
            .filter(|k| k.0 == node && k.1 == job && k.3 == attempt)
            .copied()
            .collect();
        for k in keys {
            for g in self.running.remove(&k).unwrap_or_default() {
                *self.used.entry((node, g.index)).or_default() -= g.milli;
            }
        }
    }

    fn jobs_on(&self, node: usize) -> Vec<pb::RunningJob> {
        let mut ids: HashSet<(u64, u32)> = self
            .running
            .keys()
            .filter(|k| k.0 == node)
            .map(|k| (k.1, k.3))
            .collect();
        ids.extend(
            self.unreported
                .iter()
                .filter(|k| k.0 == node)
                .map(|k| (k.1, k.2)),
        );
        ids.into_iter()
            .map(|(job_id, attempt)| pb::RunningJob { job_id, attempt })
            .collect()
    }
}

type Shared = Arc<Mutex<Ledger>>;

/// Reports a job's completion until the server acknowledges it (or says it no longer
/// expects it there), following the server across restarts.
async fn complete(
    addr: watch::Receiver<SocketAddr>,
    ledger: Shared,
    node: usize,
    job: u64,
    attempt: u32,
) {
    tokio::time::sleep(Duration::from_millis(5 + job % 15)).await;
    // Finishing and the hold are decided under one lock, so a test that sets the hold
    // while a job runs keeps it running.
    loop {
        {
            let mut l = ledger.lock().unwrap();
            if !l.hold {
                let held = l
                    .running
                    .keys()
                    .any(|k| k.0 == node && k.1 == job && k.3 == attempt);
                if !held {
                    return; // stopped (preempted, drained, reconciled) before it finished
                }
                l.stop(node, job, attempt);
                l.unreported.insert((node, job, attempt));
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    loop {
        let target = *addr.borrow();
        if let Ok(ch) = connect(target).await {
            let r = NodeServiceClient::new(ch)
                .report_job(pb::ReportJobRequest {
                    node: format!("n-{node}"),
                    job_id: job,
                    state: pb::JobState::Completed as i32,
                    message: "exit 0".into(),
                    attempt,
                    last_checkpoint_unix_s: 0.0,
                })
                .await;
            match r {
                Ok(_) => {
                    let mut l = ledger.lock().unwrap();
                    l.unreported.remove(&(node, job, attempt));
                    l.completed.insert(job);
                    return;
                }
                Err(s)
                    if s.code() == Code::FailedPrecondition
                        && !s.message().contains("has not registered") =>
                {
                    // The server no longer has this incarnation here (requeued after a
                    // restart); it runs again elsewhere or later.
                    ledger
                        .lock()
                        .unwrap()
                        .unreported
                        .remove(&(node, job, attempt));
                    return;
                }
                Err(_) => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn apply(ledger: &Shared, node: usize, a: &pb::Assignment, addr: &watch::Receiver<SocketAddr>) {
    if a.action == pb::AssignmentAction::Start as i32 {
        let first_here = {
            let mut l = ledger.lock().unwrap();
            l.start(node, a) && l.reporting.insert((node, a.job_id, a.attempt))
        };
        if first_here {
            tokio::spawn(complete(
                addr.clone(),
                ledger.clone(),
                node,
                a.job_id,
                a.attempt,
            ));
        }
    } else if a.action == pb::AssignmentAction::Stop as i32 {
        ledger.lock().unwrap().stop(node, a.job_id, a.attempt);
    }
}

/// One agent session: register (reporting what it runs), stream telemetry, follow the
/// node's assignments until the stream breaks.
async fn agent_session(
    node: usize,
    addr: &watch::Receiver<SocketAddr>,
    ledger: &Shared,
) -> Result<(), tonic::Status> {
    let target = *addr.borrow();
    let ch = connect(target)
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut client = NodeServiceClient::new(ch);
    let running = ledger.lock().unwrap().jobs_on(node);
    let reg = client
        .register(pb::RegisterNodeRequest {
            node: Some(node_info(node)),
            running,
            ..Default::default()
        })
        .await?
        .into_inner();
    {
        let mut l = ledger.lock().unwrap();
        for r in &reg.stop {
            l.stop(node, r.job_id, r.attempt);
            l.unreported.remove(&(node, r.job_id, r.attempt));
        }
    }
    let samples: Vec<pb::TelemetrySample> = (0..8)
        .map(|g| pb::TelemetrySample {
            node: format!("n-{node}"),
            gpu_index: g,
            timestamp_us: 1_700_000_000_000_000 + g as i64,
            sm_util_pct: 50.0,
            mem_used_bytes: 1 << 30,
            mem_total_bytes: 80 << 30,
            temperature_c: 60.0,
            power_w: 300.0,
            health: pb::GpuHealth::Ok as i32,
            job_id: 0,
        })
        .collect();
    let ack = client
        .stream_telemetry(tokio_stream_iter(samples))
        .await?
        .into_inner();
    ledger.lock().unwrap().telemetry_acks += ack.accepted;
    let mut stream = client
        .watch_assignments(pb::WatchAssignmentsRequest {
            node: format!("n-{node}"),
        })
        .await?
        .into_inner();
    // The stream opens with the node's complete set: reconcile to it (stop what is not
    // in it: STOPs sent while this agent was away never reached it), then follow.
    let mut snapshot = Vec::new();
    while let Some(a) = stream.message().await? {
        if a.action == pb::AssignmentAction::Synced as i32 {
            break;
        }
        snapshot.push(a);
    }
    {
        let mut l = ledger.lock().unwrap();
        let keep: HashSet<(u64, u32)> = snapshot.iter().map(|a| (a.job_id, a.attempt)).collect();
        let stale: Vec<(u64, u32)> = l
            .running
            .keys()
            .filter(|k| k.0 == node && !keep.contains(&(k.1, k.3)))
            .map(|k| (k.1, k.3))
            .collect();
        for (job, attempt) in stale {
            l.stop(node, job, attempt);
        }
    }
    for a in &snapshot {
        apply(ledger, node, a, addr);
    }
    while let Some(a) = stream.message().await? {
        apply(ledger, node, &a, addr);
    }
    Err(tonic::Status::unavailable("assignment stream ended"))
}

fn tokio_stream_iter(
    items: Vec<pb::TelemetrySample>,
) -> impl tonic::codegen::tokio_stream::Stream<Item = pb::TelemetrySample> {
    tonic::codegen::tokio_stream::iter(items)
}

/// An agent: sessions until `stop`, reconnecting (to wherever `addr` points) on errors.
async fn agent(
    node: usize,
    addr: watch::Receiver<SocketAddr>,
    ledger: Shared,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = agent_session(node, &addr, &ledger) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Submits jobs `range` with idempotency keys, retrying through restarts; returns
/// key index → job id.
async fn submit_all(
    addr: watch::Receiver<SocketAddr>,
    specs: Arc<Vec<pb::JobSpec>>,
    range: std::ops::Range<usize>,
    acked: Arc<Mutex<HashMap<usize, u64>>>,
) {
    for i in range {
        loop {
            let target = *addr.borrow();
            if let Ok(ch) = connect(target).await {
                let mut client = JobServiceClient::new(ch);
                match client
                    .submit(pb::SubmitRequest {
                        spec: Some(specs[i].clone()),
                    })
                    .await
                {
                    Ok(r) => {
                        let id = r.into_inner().job.unwrap().id;
                        acked.lock().unwrap().insert(i, id);
                        break;
                    }
                    // Only a transport failure (the server being killed) may interrupt a
                    // valid submission.
                    Err(s) => assert!(
                        !matches!(
                            s.code(),
                            Code::InvalidArgument
                                | Code::NotFound
                                | Code::FailedPrecondition
                                | Code::AlreadyExists
                                | Code::Unauthenticated
                        ),
                        "job {i}: {s:?}"
                    ),
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn list_all(addr: SocketAddr) -> Vec<pb::Job> {
    let mut client = JobServiceClient::new(connect(addr).await.unwrap());
    let mut all = Vec::new();
    let mut after = 0;
    loop {
        let page = client
            .list(pb::ListJobsRequest {
                after_id: after,
                limit: 500,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        all.extend(page.jobs);
        if page.next_after_id == 0 {
            return all;
        }
        after = page.next_after_id;
    }
}

/// Waits until every job is final; returns the jobs.
async fn wait_final(
    addr: watch::Receiver<SocketAddr>,
    expect: usize,
    limit: Duration,
) -> Vec<pb::Job> {
    let deadline = Instant::now() + limit;
    loop {
        let target = *addr.borrow();
        let jobs = list_all(target).await;
        let done = jobs
            .iter()
            .filter(|j| {
                j.state == pb::JobState::Completed as i32
                    || j.state == pb::JobState::Rejected as i32
            })
            .count();
        if jobs.len() >= expect && done == jobs.len() {
            return jobs;
        }
        assert!(
            Instant::now() < deadline,
            "{done} of {} jobs final after {limit:?}",
            jobs.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const JOBS: usize = 1000;

fn mix() -> Arc<Vec<pb::JobSpec>> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(42);
    Arc::new((0..JOBS).map(|i| job_spec(&mut rng, i)).collect())
}

/// The agents and the eight submitters both 1,000-job runs start with.
struct Load {
    stop_tx: watch::Sender<bool>,
    ledger: Shared,
    agents: Vec<tokio::task::JoinHandle<()>>,
    specs: Arc<Vec<pb::JobSpec>>,
    acked: Arc<Mutex<HashMap<usize, u64>>>,
    submitters: Vec<tokio::task::JoinHandle<()>>,
}

fn launch(addr: &watch::Receiver<SocketAddr>) -> Load {
    let (stop_tx, stop) = watch::channel(false);
    let ledger: Shared = Arc::default();
    let agents = (0..NODES)
        .map(|n| tokio::spawn(agent(n, addr.clone(), ledger.clone(), stop.clone())))
        .collect();
    let specs = mix();
    let acked = Arc::new(Mutex::new(HashMap::new()));
    let submitters = (0..8)
        .map(|k| {
            let range = k * JOBS / 8..(k + 1) * JOBS / 8;
            tokio::spawn(submit_all(
                addr.clone(),
                specs.clone(),
                range,
                acked.clone(),
            ))
        })
        .collect();
    Load {
        stop_tx,
        ledger,
        agents,
        specs,
        acked,
        submitters,
    }
}

/// The checks both 1,000-job runs end with.
async fn check_outcome(
    addr: SocketAddr,
    specs: &[pb::JobSpec],
    acked: &HashMap<usize, u64>,
    ledger: &Shared,
) {
    let jobs = list_all(addr).await;
    assert_eq!(
        jobs.len(),
        JOBS,
        "every key gives exactly one job (none lost or doubled)"
    );
    let by_id: HashMap<u64, &pb::Job> = jobs.iter().map(|j| (j.id, j)).collect();
    for (i, s) in specs.iter().enumerate() {
        let id = acked[&i];
        let job = by_id[&id];
        assert_eq!(
            job.spec.as_ref().unwrap().idempotency_key,
            s.idempotency_key
        );
        let want = if too_large(s) {
            pb::JobState::Rejected
        } else {
            pb::JobState::Completed
        };
        assert_eq!(
            job.state, want as i32,
            "job {id} ({}): {}",
            s.name, job.reason
        );
    }
    {
        let l = ledger.lock().unwrap();
        assert!(
            l.errors.is_empty(),
            "agents saw over-allocation: {:?}",
            l.errors
        );
        assert!(
            l.used.values().all(|&u| u == 0),
            "GPUs still held: {:?}",
            l.used
        );
        assert!(l.telemetry_acks >= (NODES * 8) as u64);
    }
    let mut nodes = NodeServiceClient::new(connect(addr).await.unwrap());
    let status = nodes
        .list_nodes(pb::ListNodesRequest {})
        .await
        .unwrap()
        .into_inner();
    for n in status.nodes {
        assert!(n.registered, "{n:?}");
        assert_eq!(n.allocated_milli, 0, "{n:?}");
        assert_eq!(n.idle_gpus, 8, "{n:?}");
    }
}

#[test]
fn three_agents_and_a_thousand_mixed_jobs_all_complete_without_over_allocation() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let handle = service::start(
            config(&dir.path().join("db.redb")),
            common::three_nodes(),
            Arc::new(NoModel),
        )
        .await
        .unwrap();
        let (_addr_tx, addr) = watch::channel(handle.addr);
        let Load {
            stop_tx,
            ledger,
            agents,
            specs,
            acked,
            submitters,
        } = launch(&addr);
        for s in submitters {
            s.await.unwrap();
        }
        wait_final(addr.clone(), JOBS, Duration::from_secs(60)).await;
        let acked = acked.lock().unwrap().clone();
        check_outcome(handle.addr, &specs, &acked, &ledger).await;
        // Resubmitting a key returns the job already there.
        let again = JobServiceClient::new(connect(handle.addr).await.unwrap())
            .submit(pb::SubmitRequest {
                spec: Some(specs[7].clone()),
            })
            .await
            .unwrap()
            .into_inner()
            .job
            .unwrap();
        assert_eq!(again.id, acked[&7]);
        // Metrics are served and count what happened.
        let text = common::http_get(handle.metrics_addr.unwrap(), "/metrics").await;
        assert!(
            text.contains(&format!("marshal_jobs_submitted_total {JOBS}")),
            "{text}"
        );
        assert!(
            text.contains("marshal_decisions_total{path=\"heuristic\"}"),
            "{text}"
        );
        assert!(
            text.contains("marshal_submit_to_place_seconds_bucket"),
            "{text}"
        );
        assert!(text.contains("marshal_fallback_ratio 0"), "{text}");
        stop_tx.send(true).unwrap();
        for a in agents {
            a.await.unwrap();
        }
        handle.shutdown().await.unwrap();
    });
}

/// A child killed when the test ends, also when it fails (so no server outlives it).
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `marshal serve` as a child process; returns it with its bound address.
fn spawn_server(dir: &Path) -> (Reap, SocketAddr) {
    spawn_server_with(dir, &[])
}

/// [`spawn_server`] with more arguments after `--config`.
fn spawn_server_with(dir: &Path, args: &[&str]) -> (Reap, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_marshal"))
        .args(["serve", "--config"])
        .arg(dir.join("serve.toml"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("marshal serve starts");
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    // Keep draining, so the server never writes into a closed pipe.
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    let addr = line
        .trim()
        .strip_prefix("marshal serve: listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .unwrap();
    (Reap(child), addr)
}

#[test]
fn jobs_survive_kill_9_of_the_server_and_agents_reconcile() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cluster.toml"), common::THREE_NODES).unwrap();
    std::fs::write(
        dir.path().join("serve.toml"),
        format!(
            "listen = \"127.0.0.1:0\"\ndb = {:?}\ncluster = {:?}\ncycle_interval_ms = 100\n",
            dir.path().join("db.redb"),
            dir.path().join("cluster.toml")
        ),
    )
    .unwrap();
    let (mut child, first) = spawn_server(dir.path());
    runtime().block_on(async {
        let (addr_tx, addr) = watch::channel(first);
        let Load {
            stop_tx,
            ledger,
            agents,
            specs,
            acked,
            submitters,
        } = launch(&addr);
        // Mid-run: some jobs done, some running, some queued, some not yet submitted.
        // Hold the agents' jobs at a moment when some run, then kill.
        loop {
            if acked.lock().unwrap().len() >= 300 {
                let mut l = ledger.lock().unwrap();
                if !l.running.is_empty() {
                    l.hold = true;
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        child.0.kill().unwrap(); // SIGKILL
        child.0.wait().unwrap();
        let before: HashMap<usize, u64> = acked.lock().unwrap().clone();
        let (restarted, second) = spawn_server(dir.path());
        child = restarted;
        // Before any agent reconnects: every GPU an agent holds is allocated to the same
        // job on the restarted server (nothing lost), and nothing is allocated twice.
        let held: Vec<(usize, u64, u32, u32)> =
            ledger.lock().unwrap().running.keys().copied().collect();
        assert!(!held.is_empty(), "the crash should hit running jobs");
        let server_jobs: HashMap<u64, pb::Job> = list_all(second)
            .await
            .into_iter()
            .map(|j| (j.id, j))
            .collect();
        let mut live_milli: HashMap<String, u64> = HashMap::new();
        for (node, job, worker, attempt) in &held {
            let j = &server_jobs[job];
            let active =
                j.state == pb::JobState::Placed as i32 || j.state == pb::JobState::Running as i32;
            if !active {
                // Only a gang's other workers may outlive their job: the STOP for them was
                // durable but the crash kept it from the agent; registration stops them.
                assert!(
                    *worker != 0 && j.state == pb::JobState::Completed as i32,
                    "job {job} runs on n-{node} but the restarted server has it {:?}: {}",
                    pb::JobState::try_from(j.state),
                    j.reason
                );
                continue;
            }
            assert_eq!(j.attempts, *attempt, "job {job}");
            let w = &j.placement[*worker as usize];
            assert_eq!(w.node, format!("n-{node}"));
            *live_milli.entry(w.node.clone()).or_default() +=
                w.gpus.iter().map(|g| g.milli as u64).sum::<u64>();
        }
        let status = NodeServiceClient::new(connect(second).await.unwrap())
            .list_nodes(pb::ListNodesRequest {})
            .await
            .unwrap()
            .into_inner();
        for n in &status.nodes {
            let held = live_milli.get(&n.name).copied().unwrap_or(0);
            assert!(n.allocated_milli >= held, "{n:?}: the agent holds {held}");
        }
        addr_tx.send(second).unwrap();
        ledger.lock().unwrap().hold = false;
        for s in submitters {
            s.await.unwrap();
        }
        wait_final(addr.clone(), JOBS, Duration::from_secs(90)).await;
        let acked = acked.lock().unwrap().clone();
        for (i, id) in &before {
            assert_eq!(
                acked[i], *id,
                "job acknowledged before the crash kept its id"
            );
        }
        check_outcome(second, &specs, &acked, &ledger).await;
        stop_tx.send(true).unwrap();
        for a in agents {
            a.await.unwrap();
        }
    });
    // SIGTERM: a graceful shutdown that exits 0.
    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(child.0.wait().unwrap().success());
}

/// `marshal serve` restarted on its database without the `cluster` it was written under
/// falls back to the default preset (`dgx-0` to `dgx-7`), which has none of its nodes:
/// it refuses to start, naming the database and both inventories, and changes nothing;
/// restarted with its cluster, every job is as it was.
#[test]
fn a_restart_without_the_cluster_is_refused_and_the_jobs_wait_for_the_right_one() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster.toml");
    std::fs::write(&cluster, common::THREE_NODES).unwrap();
    let db = dir.path().join("db.redb");
    let write_config = |cluster: Option<&Path>| {
        let line = cluster.map_or(String::new(), |c| format!("cluster = {c:?}\n"));
        std::fs::write(
            dir.path().join("serve.toml"),
            format!(
                "listen = \"127.0.0.1:0\"\ndb = {db:?}\n{line}cycle_interval_ms = 100\nrequire_registration = false\n"
            ),
        )
        .unwrap();
    };
    let jobs_of = |addr: SocketAddr, ids: &[u64]| -> Vec<pb::Job> {
        runtime().block_on(async {
            let mut client = JobServiceClient::new(connect(addr).await.unwrap());
            let mut jobs = Vec::new();
            for &job_id in ids {
                let r = client.get(pb::GetJobRequest { job_id }).await.unwrap();
                jobs.push(r.into_inner().job.unwrap());
            }
            jobs
        })
    };
    let stop = |mut server: Reap| {
        let kill = Command::new("kill")
            .args(["-TERM", &server.0.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        assert!(server.0.wait().unwrap().success());
    };

    write_config(Some(&cluster));
    let (server, addr) = spawn_server(dir.path());
    // Four jobs of a whole node on three nodes: three placed, one waiting.
    let ids: Vec<u64> = runtime().block_on(async {
        let mut client = JobServiceClient::new(connect(addr).await.unwrap());
        let mut ids = Vec::new();
        for _ in 0..4 {
            let spec = pb::JobSpec {
                workers: 1,
                gpu: whole(8),
                cpu_milli: 1000,
                ..Default::default()
            };
            let r = client
                .submit(pb::SubmitRequest { spec: Some(spec) })
                .await
                .unwrap();
            ids.push(r.into_inner().job.unwrap().id);
        }
        ids
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let before = loop {
        let jobs = jobs_of(addr, &ids);
        let placed = jobs.iter().filter(|j| !j.placement.is_empty()).count();
        if placed == 3 {
            break jobs;
        }
        assert!(Instant::now() < deadline, "not placed: {jobs:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    stop(server);

    // Refused before it listens: exits unsuccessfully; returns what it wrote to stderr.
    let refused_start = || -> String {
        let mut child = Command::new(env!("CARGO_BIN_EXE_marshal"))
            .args(["serve", "--config"])
            .arg(dir.path().join("serve.toml"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("marshal serve started on a cluster that would move its jobs");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };

    // Without `cluster`: the default preset, which has none of the database's nodes.
    write_config(None);
    let stderr = refused_start();
    for part in [
        &format!("database {}", db.display())[..],
        "its 4 unfinished jobs were written under an inventory of 3 nodes: n-0, n-1, n-2",
        "given now (8 nodes: dgx-0, dgx-1, dgx-2, …) has none of them",
        "the default preset \"dgx-h100-64\"",
    ] {
        assert!(stderr.contains(part), "{part:?} missing: {stderr}");
    }

    // With it: every job as it was, on the same nodes.
    write_config(Some(&cluster));
    let (server, addr) = spawn_server(dir.path());
    let after = jobs_of(addr, &ids);
    let summary = |jobs: &[pb::Job]| -> Vec<(i32, Vec<String>)> {
        jobs.iter()
            .map(|j| {
                (
                    j.state,
                    j.placement.iter().map(|w| w.node.clone()).collect(),
                )
            })
            .collect()
    };
    assert_eq!(summary(&after), summary(&before));
    stop(server);

    // A cluster without the node of one placed job: refused unless accepted, naming the
    // job; accepted, that job waits and the others keep their nodes.
    let two = dir.path().join("two.toml");
    std::fs::write(&two, common::THREE_NODES.replace("count = 3", "count = 2")).unwrap();
    write_config(Some(&two));
    let stderr = refused_start();
    let on_n2 = before
        .iter()
        .find(|j| j.placement.iter().any(|w| w.node == "n-2"))
        .unwrap()
        .id;
    for part in [
        &format!("job {on_n2} would be requeued (node n-2")[..],
        "--accept-inventory-change",
        "Nothing was changed",
    ] {
        assert!(stderr.contains(part), "{part:?} missing: {stderr}");
    }
    let (server, addr) = spawn_server_with(dir.path(), &["--accept-inventory-change"]);
    for j in jobs_of(addr, &ids) {
        let nodes: Vec<&str> = j.placement.iter().map(|w| w.node.as_str()).collect();
        if j.id == on_n2 {
            assert!(nodes.is_empty(), "still placed on {nodes:?}");
        } else {
            assert!(!nodes.contains(&"n-2"), "job {} on {nodes:?}", j.id);
        }
    }
    stop(server);
}

const CLIENT_TOKEN: &str = "client-token-0123456789abcdef0123456789";
const AGENT_TOKEN: &str = "agent-token-0123456789abcdef01234567890";

const NODE0_TOKEN: &str = "node-0-token-0123456789abcdef0123456789";
const NODE1_TOKEN: &str = "node-1-token-0123456789abcdef0123456789";

/// A node's own token acts as that node only: a compromised node cannot register,
/// heartbeat, report, drain or send telemetry as another; the unbound agent token (an
/// operator's) still can.
#[test]
fn a_node_token_acts_as_its_own_node_only() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let tokens = |cfg: &mut ServiceConfig| {
            cfg.security.client_tokens = vec![CLIENT_TOKEN.into()];
            cfg.security.agent_tokens = vec![AGENT_TOKEN.into()];
            cfg.security.node_tokens = [
                ("n-0".to_string(), NODE0_TOKEN.to_string()),
                ("n-1".to_string(), NODE1_TOKEN.to_string()),
            ]
            .into();
        };
        // A token for a node the inventory lacks, or one token in two places: refused.
        let mut unknown = config(&dir.path().join("u.redb"));
        tokens(&mut unknown);
        unknown
            .security
            .node_tokens
            .insert("n-9".into(), "x".repeat(40));
        match service::start(unknown, common::three_nodes(), Arc::new(NoModel)).await {
            Ok(_) => panic!("started with a token for an unknown node"),
            Err(e) => assert!(e.to_string().contains("\"n-9\""), "{e}"),
        }
        let mut twice = config(&dir.path().join("t.redb"));
        tokens(&mut twice);
        twice
            .security
            .node_tokens
            .insert("n-2".into(), AGENT_TOKEN.into());
        match service::start(twice, common::three_nodes(), Arc::new(NoModel)).await {
            Ok(_) => panic!("started with a token in two places"),
            Err(e) => assert!(
                e.to_string().contains("every token must be distinct"),
                "{e}"
            ),
        }

        let mut cfg = config(&dir.path().join("db.redb"));
        tokens(&mut cfg);
        let handle = service::start(cfg, common::three_nodes(), Arc::new(NoModel))
            .await
            .unwrap();
        let mut nodes = NodeServiceClient::new(connect(handle.addr).await.unwrap());
        let register = |i: usize, token: &str| {
            with_token(
                pb::RegisterNodeRequest {
                    node: Some(node_info(i)),
                    running: vec![],
                    ..Default::default()
                },
                token,
            )
        };
        nodes.register(register(0, NODE0_TOKEN)).await.unwrap();
        let e = code(nodes.register(register(1, NODE0_TOKEN)).await);
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(
            e.message()
                .contains("bound to node n-0 (by its token or client certificate), not n-1"),
            "{e:?}"
        );
        nodes.register(register(1, NODE1_TOKEN)).await.unwrap();
        let as_n1 = |token: &str| with_token(pb::HeartbeatRequest { node: "n-1".into() }, token);
        assert_eq!(
            code(nodes.heartbeat(as_n1(NODE0_TOKEN)).await).code(),
            Code::PermissionDenied
        );
        nodes.heartbeat(as_n1(NODE1_TOKEN)).await.unwrap();
        nodes.heartbeat(as_n1(AGENT_TOKEN)).await.unwrap();
        let drain = |token: &str| {
            with_token(
                pb::DrainRequest {
                    node: "n-1".into(),
                    reason: "maintenance".into(),
                },
                token,
            )
        };
        assert_eq!(
            code(nodes.drain(drain(NODE0_TOKEN)).await).code(),
            Code::PermissionDenied
        );
        nodes.drain(drain(AGENT_TOKEN)).await.unwrap();
        // Telemetry: another node's samples are refused one by one, with the reason.
        let sample = |node: &str| pb::TelemetrySample {
            node: node.into(),
            gpu_index: 0,
            timestamp_us: 1,
            health: pb::GpuHealth::Ok as i32,
            ..Default::default()
        };
        let samples = vec![sample("n-0"), sample("n-1")];
        let ack = nodes
            .stream_telemetry(with_token(
                tonic::codegen::tokio_stream::iter(samples),
                NODE0_TOKEN,
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!((ack.accepted, ack.rejected), (1, 1), "{ack:?}");
        assert!(ack.first_error.contains("bound to node n-0"), "{ack:?}");
        handle.shutdown().await.unwrap();
    });
}

/// A peer that vanished without closing its connection answers no PING: the server
/// drops the connection after `keepalive_ms` + `keepalive_timeout_ms` (and, with
/// keepalive off, keeps it, which is what left dead agents' watch streams open).
#[test]
fn a_connection_that_answers_no_ping_is_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        for (keepalive_ms, closes) in [(200, true), (0, false)] {
            let mut cfg = config(&dir.path().join(format!("db-{keepalive_ms}.redb")));
            cfg.keepalive_ms = keepalive_ms;
            cfg.keepalive_timeout_ms = 200;
            let handle = service::start(cfg, common::three_nodes(), Arc::new(NoModel))
                .await
                .unwrap();
            let mut peer = tokio::net::TcpStream::connect(handle.addr).await.unwrap();
            // The HTTP/2 client preface and an empty SETTINGS frame, then silence.
            peer.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
                .await
                .unwrap();
            peer.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
            let mut pings = 0;
            let ended = tokio::time::timeout(Duration::from_secs(3), async {
                let mut header = [0u8; 9];
                loop {
                    if peer.read_exact(&mut header).await.is_err() {
                        return; // closed
                    }
                    let len = u32::from_be_bytes([0, header[0], header[1], header[2]]);
                    pings += usize::from(header[3] == 6 && header[4] & 1 == 0);
                    let mut payload = vec![0u8; len as usize];
                    if peer.read_exact(&mut payload).await.is_err() {
                        return;
                    }
                }
            })
            .await
            .is_ok();
            assert_eq!(ended, closes, "keepalive_ms = {keepalive_ms}");
            assert_eq!(
                pings > 0,
                closes,
                "keepalive_ms = {keepalive_ms}: {pings} pings"
            );
            drop(peer);
            handle.shutdown().await.unwrap();
        }
    });
}

#[test]
fn a_decision_log_dir_that_cannot_be_written_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    runtime().block_on(async {
        let mut cfg = config(&dir.path().join("db.redb"));
        cfg.decision_log_dir = Some(file.clone());
        let Err(err) = service::start(cfg, common::three_nodes(), Arc::new(NoModel)).await else {
            panic!("started with a file as the decision log directory");
        };
        let err = err.to_string();
        assert!(
            err.starts_with(&format!(
                "configuration: decision_log_dir {}",
                file.display()
            )),
            "{err}"
        );
    });
}

#[test]
fn malformed_and_unauthorised_requests_get_precise_status_codes() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        // Tokens for one audience only would leave the other's services open.
        for (clients, agents, open) in [
            (true, false, "agent_tokens and node_tokens are empty"),
            (false, true, "client_tokens is empty"),
        ] {
            let mut half = config(&dir.path().join("half.redb"));
            if clients {
                half.security.client_tokens = vec![CLIENT_TOKEN.into()];
            }
            if agents {
                half.security.agent_tokens = vec![AGENT_TOKEN.into()];
            }
            match service::start(half, common::three_nodes(), Arc::new(NoModel)).await {
                Ok(_) => panic!("a server with one audience's tokens started"),
                Err(e) => assert!(e.to_string().contains(open), "{e}"),
            }
        }
        let mut cfg = config(&dir.path().join("db.redb"));
        cfg.security.client_tokens = vec![CLIENT_TOKEN.into()];
        cfg.security.agent_tokens = vec![AGENT_TOKEN.into()];
        let handle = service::start(cfg, common::three_nodes(), Arc::new(NoModel))
            .await
            .unwrap();
        let ch = connect(handle.addr).await.unwrap();
        let mut jobs = JobServiceClient::new(ch.clone());
        let mut nodes = NodeServiceClient::new(ch.clone());
        let good = pb::JobSpec {
            workers: 1,
            gpu: whole(1),
            ..Default::default()
        };
        // Authentication.
        let e = code(
            jobs.submit(pb::SubmitRequest {
                spec: Some(good.clone()),
            })
            .await,
        );
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        let e = code(
            jobs.submit(with_token(
                pb::SubmitRequest {
                    spec: Some(good.clone()),
                },
                AGENT_TOKEN,
            ))
            .await,
        );
        assert_eq!(
            e.code(),
            Code::Unauthenticated,
            "agent token on the job service: {e:?}"
        );
        let e = code(
            nodes
                .list_nodes(with_token(pb::ListNodesRequest {}, CLIENT_TOKEN))
                .await,
        );
        assert_eq!(
            e.code(),
            Code::Unauthenticated,
            "client token on the node service: {e:?}"
        );
        // The refusals are counted per method: the metrics layer sits outside the
        // authentication.
        let text = common::http_get(handle.metrics_addr.unwrap(), "/metrics").await;
        for (method, calls) in [
            ("marshal.v1.JobService\",grpc_method=\"Submit", 2),
            ("marshal.v1.NodeService\",grpc_method=\"ListNodes", 1),
        ] {
            let line = format!(
                "marshal_grpc_server_handled_total{{grpc_service=\"{method}\",grpc_code=\"Unauthenticated\"}} {calls}"
            );
            assert!(text.contains(&line), "{line} not in {text}");
        }
        // Validation names the field.
        let bad = |f: fn(&mut pb::JobSpec)| {
            let mut s = good.clone();
            f(&mut s);
            with_token(pb::SubmitRequest { spec: Some(s) }, CLIENT_TOKEN)
        };
        for (req, field) in [
            (bad(|s| s.workers = 0), "spec.workers"),
            (
                bad(|s| s.gpu_models = vec!["H100".into(), "Z9000".into()]),
                "spec.gpu_models[1]",
            ),
            (
                bad(|s| s.expected_runtime_s = f64::INFINITY),
                "spec.expected_runtime_s",
            ),
            (
                bad(|s| {
                    s.gpu = Some(pb::GpuDemand {
                        kind: Some(pb::gpu_demand::Kind::Milli(0)),
                    })
                }),
                "spec.gpu.milli",
            ),
            (bad(|s| s.comm = 99), "spec.comm"),
        ] {
            let e = code(jobs.submit(req).await);
            assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
            assert!(e.message().starts_with(field), "{field}: {e:?}");
        }
        let e = code(
            jobs.submit(with_token(pb::SubmitRequest { spec: None }, CLIENT_TOKEN))
                .await,
        );
        assert_eq!(
            (e.code(), e.message()),
            (Code::InvalidArgument, "spec: missing")
        );
        let e = code(
            jobs.get(with_token(pb::GetJobRequest { job_id: 999 }, CLIENT_TOKEN))
                .await,
        );
        assert_eq!(e.code(), Code::NotFound, "{e:?}");
        let e = code(
            jobs.list(with_token(
                pb::ListJobsRequest {
                    limit: 50_000,
                    ..Default::default()
                },
                CLIENT_TOKEN,
            ))
            .await,
        );
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        // A valid job: submitted, cancelled, then cancelling again is a precondition error.
        let job = jobs
            .submit(with_token(
                pb::SubmitRequest {
                    spec: Some(good.clone()),
                },
                CLIENT_TOKEN,
            ))
            .await
            .unwrap()
            .into_inner()
            .job
            .unwrap();
        assert_eq!(
            job.state,
            pb::JobState::Pending as i32,
            "no node registered yet"
        );
        // A reason is stored and listed: one too long to list is refused.
        let e = code(
            jobs.cancel(with_token(
                pb::CancelRequest {
                    job_id: job.id,
                    reason: "r".repeat(3_500_000),
                },
                CLIENT_TOKEN,
            ))
            .await,
        );
        assert_eq!(e.code(), Code::InvalidArgument, "{}", &e.message()[..80]);
        assert!(
            e.message()
                .starts_with("reason: 3500000 bytes, at most 1024"),
            "{}",
            &e.message()[..80]
        );
        jobs.cancel(with_token(
            pb::CancelRequest {
                job_id: job.id,
                reason: "test".into(),
            },
            CLIENT_TOKEN,
        ))
        .await
        .unwrap();
        let e = code(
            jobs.cancel(with_token(
                pb::CancelRequest {
                    job_id: job.id,
                    reason: String::new(),
                },
                CLIENT_TOKEN,
            ))
            .await,
        );
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("already cancelled"), "{e:?}");
        // Successes and errors the handler returned are counted too: a success once
        // its trailers have passed (through tonic's own response body).
        let text = common::http_get(handle.metrics_addr.unwrap(), "/metrics").await;
        for (method, code, calls) in [
            ("Submit", "Ok", 1),
            ("Submit", "InvalidArgument", 6),
            ("Cancel", "Ok", 1),
            ("Cancel", "FailedPrecondition", 1),
            ("Get", "NotFound", 1),
        ] {
            let line = format!(
                "marshal_grpc_server_handled_total{{grpc_service=\"marshal.v1.JobService\",grpc_method=\"{method}\",grpc_code=\"{code}\"}} {calls}"
            );
            assert!(text.contains(&line), "{line} not in {text}");
        }
        // Nodes. An error quoting a huge name stays small enough for any client.
        let e = code(
            nodes
                .drain(with_token(
                    pb::DrainRequest {
                        node: "g".repeat(100_000),
                        reason: String::new(),
                    },
                    AGENT_TOKEN,
                ))
                .await,
        );
        assert_eq!(e.code(), Code::NotFound, "{}", &e.message()[..80]);
        assert!(e.message().len() < 1100, "{} bytes", e.message().len());
        let mut unknown = node_info(0);
        unknown.name = "ghost".into();
        let e = code(
            nodes
                .register(with_token(
                    pb::RegisterNodeRequest {
                        node: Some(unknown),
                        running: vec![],
                        ..Default::default()
                    },
                    AGENT_TOKEN,
                ))
                .await,
        );
        assert_eq!(e.code(), Code::NotFound, "{e:?}");
        let mut wrong = node_info(0);
        wrong.gpus = 4;
        wrong.nvlink_domain = 4;
        let e = code(
            nodes
                .register(with_token(
                    pb::RegisterNodeRequest {
                        node: Some(wrong),
                        running: vec![],
                        ..Default::default()
                    },
                    AGENT_TOKEN,
                ))
                .await,
        );
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("inventory says 8 × H100"), "{e:?}");
        let mut odd = node_info(0);
        odd.nvlink_domain = 3;
        let e = code(
            nodes
                .register(with_token(
                    pb::RegisterNodeRequest {
                        node: Some(odd),
                        running: vec![],
                        ..Default::default()
                    },
                    AGENT_TOKEN,
                ))
                .await,
        );
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().starts_with("node.nvlink_domain"), "{e:?}");
        let e = code(
            nodes
                .report_job(with_token(
                    pb::ReportJobRequest {
                        node: "n-0".into(),
                        job_id: 1,
                        state: pb::JobState::Completed as i32,
                        message: String::new(),
                        attempt: 0,
                        last_checkpoint_unix_s: 0.0,
                    },
                    AGENT_TOKEN,
                ))
                .await,
        );
        assert_eq!(
            e.code(),
            Code::FailedPrecondition,
            "report before registering: {e:?}"
        );
        let e = code(
            nodes
                .watch_assignments(with_token(
                    pb::WatchAssignmentsRequest { node: "n-1".into() },
                    AGENT_TOKEN,
                ))
                .await,
        );
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        nodes
            .register(with_token(
                pb::RegisterNodeRequest {
                    node: Some(node_info(0)),
                    running: vec![pb::RunningJob {
                        job_id: 77,
                        attempt: 1,
                    }],
                    ..Default::default()
                },
                AGENT_TOKEN,
            ))
            .await
            .map(|r| {
                assert_eq!(
                    r.into_inner().stop,
                    vec![pb::RunningJob {
                        job_id: 77,
                        attempt: 1
                    }],
                    "unknown job: stop it"
                )
            })
            .unwrap();
        // Bad telemetry is counted and explained, not fatal.
        let samples = vec![
            pb::TelemetrySample {
                node: "n-0".into(),
                gpu_index: 0,
                timestamp_us: 1,
                sm_util_pct: 10.0,
                health: pb::GpuHealth::Ok as i32,
                ..Default::default()
            },
            pb::TelemetrySample {
                node: "n-0".into(),
                gpu_index: 9,
                timestamp_us: 1,
                ..Default::default()
            },
            pb::TelemetrySample {
                node: "n-0".into(),
                gpu_index: 0,
                timestamp_us: 1,
                sm_util_pct: f32::NAN,
                ..Default::default()
            },
            pb::TelemetrySample {
                node: "n-2".into(),
                gpu_index: 0,
                timestamp_us: 1,
                ..Default::default()
            },
        ];
        let mut req = Request::new(tonic::codegen::tokio_stream::iter(samples));
        req.metadata_mut().insert(
            "authorization",
            format!("Bearer {AGENT_TOKEN}").parse().unwrap(),
        );
        let ack = nodes.stream_telemetry(req).await.unwrap().into_inner();
        assert_eq!((ack.accepted, ack.rejected), (1, 3));
        assert!(ack.first_error.contains("gpu_index 9"), "{ack:?}");
        // The job left pending before now runs on the registered node? It was cancelled;
        // a failed GPU quarantines the node.
        let failed = vec![pb::TelemetrySample {
            node: "n-0".into(),
            gpu_index: 3,
            timestamp_us: 1,
            health: pb::GpuHealth::Failed as i32,
            ..Default::default()
        }];
        let mut req = Request::new(tonic::codegen::tokio_stream::iter(failed));
        req.metadata_mut().insert(
            "authorization",
            format!("Bearer {AGENT_TOKEN}").parse().unwrap(),
        );
        nodes.stream_telemetry(req).await.unwrap();
        let n0 = nodes
            .list_nodes(with_token(pb::ListNodesRequest {}, AGENT_TOKEN))
            .await
            .unwrap()
            .into_inner()
            .nodes
            .remove(0);
        assert!(n0.quarantined && n0.reason.contains("GPU 3"), "{n0:?}");
        // Admin and advisor.
        let mut admin = AdminServiceClient::new(ch.clone());
        let info = admin
            .model_info(with_token(pb::ModelInfoRequest {}, CLIENT_TOKEN))
            .await
            .unwrap()
            .into_inner();
        assert!(
            !info.loaded && info.detail.contains("no learned model"),
            "{info:?}"
        );
        let e = code(
            admin
                .reload_model(with_token(
                    pb::ReloadModelRequest {
                        path: "/nowhere".into(),
                    },
                    CLIENT_TOKEN,
                ))
                .await,
        );
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        let mut advisor = AdvisorServiceClient::new(ch.clone());
        let e = code(
            advisor
                .explain(with_token(
                    pb::ExplainRequest { decision_id: 0 },
                    CLIENT_TOKEN,
                ))
                .await,
        );
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        let e = code(
            advisor
                .explain(with_token(
                    pb::ExplainRequest { decision_id: 12345 },
                    CLIENT_TOKEN,
                ))
                .await,
        );
        assert_eq!(e.code(), Code::NotFound, "{e:?}");
        let e = code(
            advisor
                .advise(with_token(pb::AdviseRequest::default(), CLIENT_TOKEN))
                .await,
        );
        assert_eq!(
            (e.code(), e.message()),
            (Code::InvalidArgument, "cluster: missing")
        );
        // Garbage on the socket does not take the server down.
        {
            use tokio::io::AsyncWriteExt;
            let mut s = tokio::net::TcpStream::connect(handle.addr).await.unwrap();
            let _ = s
                .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\xff\xff\xff garbage")
                .await;
        }
        let mut health = tonic_health_client(ch.clone());
        let h = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: "marshal.v1.JobService".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            h.status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32
        );
        handle.shutdown().await.unwrap();
    });
}

/// The error a call was expected to fail with.
fn code<T>(r: Result<tonic::Response<T>, tonic::Status>) -> tonic::Status {
    match r {
        Ok(_) => panic!("the call succeeded; an error was expected"),
        Err(s) => s,
    }
}

/// A shutdown tells health watchers NOT_SERVING and ends their streams instead of
/// waiting for them through its grace period; and a server that had stopped persisting
/// changes says so from `shutdown` (the exit status of `marshal serve`).
#[test]
fn shutdown_says_not_serving_ends_health_watches_and_reports_unpersisted_changes() {
    let dir = tempfile::tempdir().unwrap();
    let not_serving = tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    runtime().block_on(async {
        for (round, healthy) in [(0, true), (1, false)] {
            let handle = service::start(
                config(&dir.path().join(format!("db-{round}.redb"))),
                common::three_nodes(),
                Arc::new(NoModel),
            )
            .await
            .unwrap();
            let ch = connect(handle.addr).await.unwrap();
            let mut watch = tonic_health_client(ch)
                .watch(tonic_health::pb::HealthCheckRequest {
                    service: "marshal.v1.JobService".into(),
                })
                .await
                .unwrap()
                .into_inner();
            let first = watch.message().await.unwrap().unwrap().status;
            assert_eq!(first, serving);
            let seen = tokio::spawn(async move {
                let mut seen = Vec::new();
                while let Ok(Some(s)) = watch.message().await {
                    seen.push(s.status);
                }
                seen
            });
            if !healthy {
                // The scheduling loop ends (as after a panic): changes stop being
                // persisted.
                let ended = tokio::spawn(async { panic!("injected: the loop ended") })
                    .await
                    .unwrap_err();
                handle.core.driver_ended(Err(ended));
            }
            let started = std::time::Instant::now();
            let shut = handle.shutdown().await;
            if healthy {
                // The NOT_SERVING below can only come from the shutdown itself.
                shut.unwrap();
            } else {
                let e = shut.unwrap_err();
                assert!(
                    e.to_string().contains("not persisted") && e.to_string().contains("injected"),
                    "{e}"
                );
            }
            // Well inside the 10 s grace: nothing waited for the watch.
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{:?}",
                started.elapsed()
            );
            let seen = tokio::time::timeout(Duration::from_secs(5), seen)
                .await
                .expect("the health watch did not end")
                .unwrap();
            assert_eq!(seen.last(), Some(&not_serving), "{seen:?}");
        }
    });
}

fn tonic_health_client(ch: Channel) -> tonic_health::pb::health_client::HealthClient<Channel> {
    tonic_health::pb::health_client::HealthClient::new(ch)
}

fn snapshot_node(name: &str, used: &[u32], schedulable: bool) -> pb::SnapshotNode {
    pb::SnapshotNode {
        node: Some(pb::NodeInfo {
            name: name.into(),
            gpu_model: "H100".into(),
            gpus: 8,
            nvlink_domain: 8,
            cpu_milli: 224_000,
            memory_mib: 2_097_152,
            mig: None,
            mig_layout: None,
        }),
        schedulable,
        gpus_used: used
            .iter()
            .map(|&index| pb::GpuUsage {
                index,
                milli: 1000,
                mig: None,
            })
            .collect(),
        cpu_used_milli: 0,
        memory_used_mib: 0,
    }
}

fn pending(id: &str, workers: u32, gpus: u32, waited_s: f64) -> pb::PendingJob {
    pb::PendingJob {
        id: id.into(),
        spec: Some(pb::JobSpec {
            workers,
            gpu: whole(gpus),
            ..Default::default()
        }),
        waited_s,
    }
}

#[test]
fn advise_is_stateless_and_explain_tells_why() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let handle = service::start(
            config(&dir.path().join("db.redb")),
            common::three_nodes(),
            Arc::new(NoModel),
        )
        .await
        .unwrap();
        let ch = connect(handle.addr).await.unwrap();
        let mut advisor = AdvisorServiceClient::new(ch.clone());
        let request = pb::AdviseRequest {
            cluster: Some(pb::ClusterSnapshot {
                name: "foreign".into(),
                nodes: vec![
                    snapshot_node("a", &[0, 1, 2, 3, 4, 5], true),
                    snapshot_node("b", &[], true),
                    snapshot_node("c", &[], false),
                ],
                ..Default::default()
            }),
            pending: vec![
                pending("p1", 1, 4, 30.0),
                pending("p2", 1, 2, 20.0),
                pending("p3", 2, 8, 10.0),
                pending("p4", 4, 8, 5.0),
            ],
            policy: String::new(),
        };
        let first = advisor.advise(request.clone()).await.unwrap().into_inner();
        assert_eq!(first.policy, "topo-pack");
        let recs: HashMap<&str, &pb::Recommendation> = first
            .recommendations
            .iter()
            .map(|r| (r.job_id.as_str(), r))
            .collect();
        let verdict = |id: &str| pb::Verdict::try_from(recs[id].verdict).unwrap();
        assert_eq!(verdict("p1"), pb::Verdict::Place);
        assert_eq!(recs["p1"].placement[0].node, "b", "only b has 4 idle GPUs");
        assert_eq!(verdict("p2"), pb::Verdict::Place);
        for r in &first.recommendations {
            for w in &r.placement {
                assert_ne!(w.node, "c", "c is not schedulable");
                if w.node == "a" {
                    assert!(
                        w.gpus.iter().all(|g| g.index >= 6),
                        "a's GPUs 0-5 are in use: {w:?}"
                    );
                }
            }
        }
        assert_eq!(verdict("p3"), pb::Verdict::Wait, "{:?}", recs["p3"]);
        assert_eq!(verdict("p4"), pb::Verdict::Reject, "{:?}", recs["p4"]);
        assert!(recs["p1"].confidence.is_none());
        assert_eq!(recs["p1"].path, "heuristic:topo-pack");
        // Stateless: the same question gets the same answer.
        let second = advisor.advise(request).await.unwrap().into_inner();
        assert_eq!(first.recommendations.len(), second.recommendations.len());
        for (a, b) in first.recommendations.iter().zip(&second.recommendations) {
            assert_eq!((a.verdict, &a.placement), (b.verdict, &b.placement));
            assert_ne!(a.decision_id, b.decision_id);
        }
        let why = advisor
            .explain(pb::ExplainRequest {
                decision_id: recs["p1"].decision_id,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(why.source, "advise");
        assert_eq!(why.job, "p1");
        assert_eq!(why.verdict, pb::Verdict::Place as i32);
        assert_eq!(why.idle_gpus, 10, "a: 2, b: 8 (c is down)");
        assert_eq!(why.feasible_nodes, 1);
        assert!(
            why.candidates.iter().any(|c| c.node == "b" && c.chosen),
            "{why:?}"
        );
        let bad = pb::AdviseRequest {
            cluster: Some(pb::ClusterSnapshot {
                nodes: vec![snapshot_node("a", &[9], true)],
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = advisor.advise(bad).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(
            e.message().starts_with("cluster.nodes[0].gpus_used[0]"),
            "{e:?}"
        );

        // Primary mode: a placement's decision, the event stream, drain and uncordon.
        let mut jobs = JobServiceClient::new(ch.clone());
        let mut nodes = NodeServiceClient::new(ch.clone());
        let mut events = jobs
            .watch_events(pb::WatchEventsRequest { job_ids: vec![] })
            .await
            .unwrap()
            .into_inner();
        nodes
            .register(pb::RegisterNodeRequest {
                node: Some(node_info(0)),
                running: vec![],
                ..Default::default()
            })
            .await
            .unwrap();
        let job = jobs
            .submit(pb::SubmitRequest {
                spec: Some(pb::JobSpec {
                    workers: 1,
                    gpu: whole(2),
                    ..Default::default()
                }),
            })
            .await
            .unwrap()
            .into_inner()
            .job
            .unwrap();
        assert_eq!(job.state, pb::JobState::Placed as i32, "{job:?}");
        assert_eq!(job.placement[0].node, "n-0");
        let mut seen = Vec::new();
        while seen.len() < 2 {
            let e = events.message().await.unwrap().unwrap();
            if e.job_id == job.id {
                seen.push(pb::JobState::try_from(e.state).unwrap());
            }
        }
        assert_eq!(seen, vec![pb::JobState::Pending, pb::JobState::Placed]);
        let why = advisor
            .explain(pb::ExplainRequest {
                decision_id: job.decision_id,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (why.source.as_str(), why.job.as_str()),
            ("cycle", job.id.to_string().as_str())
        );
        assert_eq!(why.placement, job.placement);
        let drained = nodes
            .drain(pb::DrainRequest {
                node: "n-0".into(),
                reason: "maintenance".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(drained.cordoned && drained.jobs == 0, "{drained:?}");
        let got = jobs
            .get(pb::GetJobRequest { job_id: job.id })
            .await
            .unwrap()
            .into_inner()
            .job
            .unwrap();
        assert_eq!(got.state, pb::JobState::Requeued as i32, "{got:?}");
        nodes
            .cordon(pb::CordonRequest {
                node: "n-0".into(),
                cordon: false,
                reason: String::new(),
            })
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let got = jobs
                .get(pb::GetJobRequest { job_id: job.id })
                .await
                .unwrap()
                .into_inner()
                .job
                .unwrap();
            if got.state == pb::JobState::Placed as i32 {
                assert_eq!(got.attempts, 2);
                break;
            }
            assert!(Instant::now() < deadline, "not placed again: {got:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The event stream is counted when it ends, not when it opened: dropped by the
        // client before its trailers, it is `Cancelled`.
        let watched = |text: &str, code: &str| {
            text.contains(&format!(
                "marshal_grpc_server_handled_total{{grpc_service=\"marshal.v1.JobService\",grpc_method=\"WatchEvents\",grpc_code=\"{code}\"}} 1"
            ))
        };
        let metrics_addr = handle.metrics_addr.unwrap();
        let text = common::http_get(metrics_addr, "/metrics").await;
        assert!(!watched(&text, "Ok") && !watched(&text, "Cancelled"), "{text}");
        drop(events);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = common::http_get(metrics_addr, "/metrics").await;
            if watched(&text, "Cancelled") {
                assert!(!watched(&text, "Ok"), "{text}");
                break;
            }
            assert!(Instant::now() < deadline, "the dropped stream was not counted: {text}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        handle.shutdown().await.unwrap();
    });
}

struct Pki {
    ca: String,
    server_cert: String,
    server_key: String,
    client_cert: String,
    client_key: String,
    /// A certificate naming no node (an operator's).
    operator_cert: String,
    operator_key: String,
}

fn pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf("localhost");
    // Named like the inventory's node n-1, for `bind_node_certificates`.
    let (client_cert, client_key) = leaf("n-1");
    let (operator_cert, operator_key) = leaf("operator.example");
    Pki {
        ca: ca.pem(),
        server_cert,
        server_key,
        client_cert,
        client_key,
        operator_cert,
        operator_key,
    }
}

/// Writes `text` to `dir/name`, readable by its owner only (as keys must be).
fn write_file(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = dir.join(name);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
    path
}

/// Start-up errors name the file or the address at fault: rustls and the socket layer
/// name neither ("transport error", "Address already in use").
#[test]
fn start_errors_name_the_pem_file_or_the_address_at_fault() {
    let dir = tempfile::tempdir().unwrap();
    let p = pki();
    let write = |name: &str, text: &str| write_file(dir.path(), name, text);
    let start_error = |cfg: ServiceConfig| {
        runtime().block_on(async {
            match service::start(cfg, common::three_nodes(), Arc::new(NoModel)).await {
                Ok(h) => {
                    h.shutdown().await.unwrap();
                    panic!("started")
                }
                Err(e) => e.to_string(),
            }
        })
    };
    let db = dir.path().join("db.redb");
    let cert = write("server.pem", &p.server_cert);
    let key = write("server.key", &p.server_key);
    let empty = write("empty.pem", "");

    let mut cfg = config(&db);
    cfg.security.tls_cert = Some(empty.clone());
    cfg.security.tls_key = Some(key.clone());
    let e = start_error(cfg);
    assert!(e.contains(&format!("{} is empty", empty.display())), "{e}");

    let mut cfg = config(&db);
    cfg.security.tls_cert = Some(cert.clone());
    cfg.security.tls_key = Some(cert.clone());
    let e = start_error(cfg);
    assert!(
        e.contains(&format!("{} holds no PEM private key", cert.display())),
        "{e}"
    );

    let mut cfg = config(&db);
    cfg.security.tls_cert = Some(cert.clone());
    cfg.security.tls_key = Some(key.clone());
    cfg.security.client_ca = Some(key.clone());
    let e = start_error(cfg);
    assert!(
        e.contains(&format!("{} holds no PEM certificate", key.display())),
        "{e}"
    );

    // A private key every user can read is refused, naming the file and its mode.
    let open_key = dir.path().join("open.key");
    std::fs::write(&open_key, &p.server_key).unwrap();
    std::fs::set_permissions(
        &open_key,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let mut cfg = config(&db);
    cfg.security.tls_cert = Some(cert.clone());
    cfg.security.tls_key = Some(open_key.clone());
    let e = start_error(cfg);
    assert!(
        e.contains(&format!("{} holds a TLS private key", open_key.display()))
            && e.contains("mode 0644"),
        "{e}"
    );

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let mut cfg = config(&db);
    cfg.metrics_listen = Some(addr.to_string());
    let e = start_error(cfg);
    assert!(
        e.contains(&format!("cannot listen on metrics_listen {addr}")),
        "{e}"
    );
    let mut cfg = config(&db);
    cfg.listen = addr.to_string();
    let e = start_error(cfg);
    assert!(
        e.contains(&format!("cannot listen on listen {addr}")),
        "{e}"
    );
}

/// A configuration with mutual TLS from `p` (its files written into `dir`) and
/// `bind_node_certificates`.
fn bound_mutual_tls(dir: &Path, p: &Pki) -> ServiceConfig {
    let write = |name: &str, text: &str| write_file(dir, name, text);
    let mut cfg = config(&dir.join("db.redb"));
    cfg.security.tls_cert = Some(write("server.pem", &p.server_cert));
    cfg.security.tls_key = Some(write("server.key", &p.server_key));
    cfg.security.client_ca = Some(write("ca.pem", &p.ca));
    cfg.security.bind_node_certificates = true;
    cfg
}

#[test]
fn tls_and_mutual_tls_refuse_clients_without_the_right_credentials() {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let dir = tempfile::tempdir().unwrap();
    let p = pki();
    runtime().block_on(async {
        let cfg = bound_mutual_tls(dir.path(), &p);
        let handle = service::start(cfg, common::three_nodes(), Arc::new(NoModel))
            .await
            .unwrap();
        let url = format!("https://127.0.0.1:{}", handle.addr.port());
        let tls = || {
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&p.ca))
                .domain_name("localhost")
        };
        let call = |ch: Channel| async move {
            JobServiceClient::new(ch)
                .list(pb::ListJobsRequest::default())
                .await
                .map(|_| ())
        };
        let with_cert = Endpoint::from_shared(url.clone())
            .unwrap()
            .tls_config(tls().identity(Identity::from_pem(&p.client_cert, &p.client_key)))
            .unwrap()
            .connect()
            .await
            .unwrap();
        call(with_cert.clone()).await.unwrap();
        // The agent-side client over mutual TLS: register, then a report the server
        // refuses for a precise reason (nothing is placed there).
        let agent_config = service::client::ClientConfig {
            url: url.clone(),
            token: None,
            ca_pem: Some(p.ca.clone().into_bytes()),
            identity: Some((
                p.client_cert.clone().into_bytes(),
                p.client_key.clone().into_bytes(),
            )),
            domain: Some("localhost".into()),
            ..Default::default()
        };
        let mut agent = service::client::AgentClient::connect(&agent_config, "n-1")
            .await
            .unwrap();
        let reg = agent
            .register(node_info(1), vec![], vec![], None)
            .await
            .unwrap();
        assert!(reg.status.unwrap().registered);
        // Its certificate names n-1: it cannot act as another node.
        let as_other = NodeServiceClient::new(with_cert.clone())
            .heartbeat(pb::HeartbeatRequest { node: "n-0".into() })
            .await
            .unwrap_err();
        assert_eq!(as_other.code(), Code::PermissionDenied, "{as_other:?}");
        assert!(
            as_other.message().contains("bound to node n-1"),
            "{}",
            as_other.message()
        );
        NodeServiceClient::new(with_cert.clone())
            .heartbeat(pb::HeartbeatRequest { node: "n-1".into() })
            .await
            .unwrap();
        match agent.report(5, 1, pb::JobState::Running, "").await {
            Err(service::client::ClientError::Call(s)) => {
                assert_eq!(s.code(), Code::NotFound, "{s:?}")
            }
            other => panic!("{other:?}"),
        }
        // No client certificate: the handshake (or the first call) fails.
        let without = Endpoint::from_shared(url.clone())
            .unwrap()
            .tls_config(tls())
            .unwrap()
            .connect()
            .await;
        match without {
            Err(_) => {}
            Ok(ch) => assert!(
                call(ch).await.is_err(),
                "mutual TLS let a client without a certificate in"
            ),
        }
        // Plaintext against a TLS port.
        match connect(handle.addr).await {
            Err(_) => {}
            Ok(ch) => assert!(call(ch).await.is_err(), "plaintext accepted on a TLS port"),
        }
        handle.shutdown().await.unwrap();
    });
}

/// Node tokens and node certificates together: a call whose token belongs to one node
/// and whose certificate to another is refused, and with `require_node_certificates` so
/// is a certificate that names no node, whatever its token.
#[test]
fn a_node_token_and_certificate_must_agree_and_strictly_name_a_node() {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let dir = tempfile::tempdir().unwrap();
    let p = pki();
    runtime().block_on(async {
        let mut cfg = bound_mutual_tls(dir.path(), &p);
        cfg.security.require_node_certificates = true;
        let (t0, t1) = ("0".repeat(32), "1".repeat(32));
        cfg.security.client_tokens = vec![CLIENT_TOKEN.into()];
        cfg.security.node_tokens = [
            ("n-0".to_string(), t0.clone()),
            ("n-1".to_string(), t1.clone()),
        ]
        .into_iter()
        .collect();
        let handle = service::start(cfg, common::three_nodes(), Arc::new(NoModel))
            .await
            .unwrap();
        let url = format!("https://127.0.0.1:{}", handle.addr.port());
        let channel = |cert: &str, key: &str| {
            let tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&p.ca))
                .domain_name("localhost")
                .identity(Identity::from_pem(cert, key));
            let endpoint = Endpoint::from_shared(url.clone())
                .unwrap()
                .tls_config(tls)
                .unwrap();
            async move { endpoint.connect().await }
        };
        let heartbeat = |ch: Channel, node: &str, token: &str| {
            let mut req = tonic::Request::new(pb::HeartbeatRequest { node: node.into() });
            req.metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
            async move { NodeServiceClient::new(ch).heartbeat(req).await }
        };
        let n1 = channel(&p.client_cert, &p.client_key).await.unwrap();
        let e = heartbeat(n1.clone(), "n-0", &t0).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(
            e.message()
                .contains("the token belongs to node n-0 but the client certificate to node n-1"),
            "{}",
            e.message()
        );
        let e = heartbeat(n1.clone(), "n-1", &t0).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        // Its own token with its own certificate gets past authentication.
        if let Err(e) = heartbeat(n1, "n-1", &t1).await {
            assert!(
                !matches!(e.code(), Code::PermissionDenied | Code::Unauthenticated),
                "{e:?}"
            );
        }
        // A certificate naming no node is refused, even with a valid node token.
        let operator = channel(&p.operator_cert, &p.operator_key).await.unwrap();
        let e = heartbeat(operator, "n-1", &t1).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(
            e.message().contains("require_node_certificates"),
            "{}",
            e.message()
        );
        handle.shutdown().await.unwrap();
    });
}

/// A peer that connects and says nothing holds no place for long: with one connection
/// allowed, a client behind a silent one is served once the silent one is closed for
/// sending no preface within `handshake_timeout_ms` (before, never).
#[test]
fn a_silent_connection_cannot_hold_the_servers_last_place() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let mut cfg = config(&dir.path().join("db.redb"));
        cfg.max_connections = 1;
        cfg.handshake_timeout_ms = 300;
        let handle = service::start(cfg, common::three_nodes(), Arc::new(NoModel))
            .await
            .unwrap();
        let silent = tokio::net::TcpStream::connect(handle.addr).await.unwrap();
        // Let the server take the silent connection first.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = Instant::now();
        let ch = Endpoint::from_shared(format!("http://{}", handle.addr))
            .unwrap()
            .connect_timeout(Duration::from_secs(10))
            .connect_lazy();
        let listed = tokio::time::timeout(
            Duration::from_secs(10),
            NodeServiceClient::new(ch).list_nodes(pb::ListNodesRequest {}),
        )
        .await
        .expect("the client was never served")
        .unwrap();
        assert_eq!(listed.into_inner().nodes.len(), 3);
        assert!(
            started.elapsed() >= Duration::from_millis(200),
            "served beside the silent connection: the limit did not hold"
        );
        // The silent one was closed (after the server's own HTTP/2 settings).
        tokio::time::timeout(Duration::from_secs(5), async {
            let mut silent = silent;
            let mut buf = [0u8; 256];
            while let Ok(1..) = tokio::io::AsyncReadExt::read(&mut silent, &mut buf).await {}
        })
        .await
        .expect("the silent connection is still open");
        handle.shutdown().await.unwrap();
    });
}
