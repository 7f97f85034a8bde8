//! Load generator for the online service: submit-and-place throughput and latency on
//! loopback.
//!
//! ```sh
//! cargo run --release -p marshal-scheduler --features service --example loadgen -- \
//!     [--jobs 20000] [--concurrency 64] [--nodes 1250] [--policy topo-pack] [--seed 42]
//!     [--no-fsync]
//! ```
//!
//! Starts a server in process on 127.0.0.1 (a fresh redb file in the temp directory,
//! every commit durable), registers `--nodes` nodes of 8 × H100, then `--concurrency`
//! clients submit `--jobs` jobs of a seeded mix (1/2/4/8 whole GPUs, GPU shares, two-node
//! gangs). A job counts as placed when its Submit reply says PLACED: the reply comes
//! after the placement is durable. Each client then reports the job completed, as the
//! node's agent would, so the cluster does not fill up. Latency is Submit's round trip.
//!
//! The server and the clients run on separate Tokio runtimes (threads named
//! `marshal-srv` and `loadgen-cli`), so that the CPU time each side used can be read
//! from Linux's per-thread accounting (`/proc/self/task/*/schedstat`) and reported per
//! job: the server's own ceiling per core, which the wall-clock rate hides when the
//! clients share its cores.

use std::sync::Arc;
use std::time::{Duration, Instant};

use marshal_scheduler::domain::ClusterSpec;
use marshal_scheduler::service::pb::job_service_client::JobServiceClient;
use marshal_scheduler::service::pb::node_service_client::NodeServiceClient;
use marshal_scheduler::service::{self, NoModel, ServiceConfig, pb, tokio, tonic};
use rand::{Rng, SeedableRng};

/// The allocator the `marshal` binary uses, so the server measured here is the one
/// deployed.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Args {
    jobs: usize,
    concurrency: usize,
    nodes: u32,
    policy: String,
    seed: u64,
    fsync: bool,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        jobs: 20_000,
        concurrency: 64,
        nodes: 1250,
        policy: "topo-pack".into(),
        seed: 42,
        fsync: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--no-fsync" {
            a.fsync = false;
            continue;
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--jobs" => a.jobs = num(&value)? as usize,
            "--concurrency" => a.concurrency = num(&value)?.max(1) as usize,
            "--nodes" => a.nodes = num(&value)?.max(1) as u32,
            "--policy" => a.policy = value,
            "--seed" => a.seed = num(&value)?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(a)
}

fn spec_for(rng: &mut rand_chacha::ChaCha8Rng) -> pb::JobSpec {
    use pb::gpu_demand::Kind;
    let r: u32 = rng.random_range(0..100);
    let (workers, kind) = match r {
        0..40 => (1, Kind::Whole(1)),
        40..60 => (1, Kind::Whole(2)),
        60..72 => (1, Kind::Whole(4)),
        72..80 => (1, Kind::Whole(8)),
        80..97 => (1, Kind::Milli(if r.is_multiple_of(2) { 250 } else { 500 })),
        _ => (2, Kind::Whole(8)),
    };
    pb::JobSpec {
        workers,
        gpu: Some(pb::GpuDemand { kind: Some(kind) }),
        cpu_milli: 1000,
        memory_mib: 4096,
        ..Default::default()
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// Mean, the bucket holding the 99th percentile and the highest non-empty bucket of a
/// histogram in Prometheus text format, from the server's own metrics.
fn histogram_summary(metrics: &str, name: &str) -> Option<String> {
    let value = |line: &str| line.rsplit(' ').next()?.parse::<f64>().ok();
    let sum = metrics
        .lines()
        .find(|l| l.starts_with(&format!("{name}_sum ")))
        .and_then(value)?;
    let count = metrics
        .lines()
        .find(|l| l.starts_with(&format!("{name}_count ")))
        .and_then(value)?;
    // Cumulative buckets: (upper bound, observations at or below it).
    let buckets: Vec<(f64, f64)> = metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}_bucket{{le=\"")))
        .filter_map(|l| {
            let le = l.split('"').nth(1)?;
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((bound, value(l)?))
        })
        .collect();
    if count == 0.0 {
        return None;
    }
    let p99 = buckets.iter().find(|(_, c)| *c >= 0.99 * count)?.0;
    let max = buckets.iter().find(|(_, c)| *c >= count)?.0;
    Some(format!(
        "{count:.0} × mean {:.3} ms, p99 ≤ {:.3} ms, max ≤ {:.3} ms",
        sum / count * 1e3,
        p99 * 1e3,
        max * 1e3
    ))
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("loadgen: {e}");
            std::process::exit(2);
        }
    };
    let dir = std::env::temp_dir().join(format!("marshal-loadgen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let cluster = ClusterSpec::from_toml(&format!(
        "name = \"loadgen\"\n[[nodes]]\ncount = {}\nname_prefix = \"node\"\ngpu_model = \"H100\"\ngpus = 8\nnvlink_domain = 8\ncpu_milli = 224000\nmemory_mib = 2097152\n",
        a.nodes
    ))
    .expect("cluster spec");
    let config = ServiceConfig {
        listen: "127.0.0.1:0".into(),
        db: dir.join("loadgen.redb"),
        policy: a.policy.clone(),
        durable_commits: a.fsync,
        // The load generator's agents only report jobs (no telemetry heartbeat): keep
        // idle nodes from timing out in a long run.
        node_timeout_ms: 86_400_000,
        ..ServiceConfig::default()
    };
    let runtime = |name: &str| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name(name)
            // Blocking-pool threads must outlive the run, or their CPU time is lost
            // from the per-thread accounting when they exit.
            .thread_keep_alive(Duration::from_secs(3600))
            .build()
            .expect("runtime")
    };
    let (server, clients) = (runtime(SERVER_THREADS), runtime(CLIENT_THREADS));
    let result = run(a, config, cluster, &server, &clients);
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = result {
        eprintln!("loadgen: {e}");
        std::process::exit(1);
    }
}

const SERVER_THREADS: &str = "marshal-srv";
const CLIENT_THREADS: &str = "loadgen-cli";

/// Bytes this process has caused to be written to storage so far (Linux's
/// `/proc/self/io` `write_bytes`; `None` elsewhere): what the durable commits cost the
/// disk, page write-back included.
fn storage_bytes_written() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))?
        .trim()
        .parse()
        .ok()
}

/// CPU seconds used so far by this process's threads whose name starts with `prefix`
/// (Linux; `None` elsewhere).
fn cpu_seconds_of_threads(prefix: &str) -> Option<f64> {
    let mut ns = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let path = task.path();
        let Ok(name) = std::fs::read_to_string(path.join("comm")) else {
            continue;
        };
        if !name.starts_with(prefix) {
            continue;
        }
        let stat = std::fs::read_to_string(path.join("schedstat")).ok()?;
        ns += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(ns as f64 / 1e9)
}

fn run(
    a: Args,
    config: ServiceConfig,
    cluster: ClusterSpec,
    server: &tokio::runtime::Runtime,
    clients: &tokio::runtime::Runtime,
) -> Result<(), String> {
    let handle = server
        .block_on(service::start(config, cluster, Arc::new(NoModel)))
        .map_err(|e| e.to_string())?;
    let result = clients.block_on(load(&a, &handle));
    let metrics = handle.core.metrics.render();
    server
        .block_on(handle.shutdown())
        .map_err(|e| e.to_string())?;
    let (latencies, not_placed, wall, cpu, written) = result?;
    let commits = metrics
        .lines()
        .find(|l| l.starts_with("marshal_commit_duration_seconds_count"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("?")
        .to_string();
    println!(
        "jobs {} placed-on-submit {} (not placed at once: {not_placed}), concurrency {}, {} nodes × 8 H100, policy {}, fsync {}",
        a.jobs,
        latencies.len(),
        a.concurrency,
        a.nodes,
        a.policy,
        a.fsync
    );
    println!(
        "wall {:.2} s, submit-and-place throughput {:.0} jobs/s (each job also reported completed)",
        wall.as_secs_f64(),
        latencies.len() as f64 / wall.as_secs_f64()
    );
    println!(
        "submit latency p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; {commits} durable commits",
        percentile(&latencies, 0.5).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        latencies.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
    for (name, what) in [
        ("marshal_cycle_duration_seconds", "cycle"),
        ("marshal_commit_duration_seconds", "commit"),
    ] {
        if let Some(h) = histogram_summary(&metrics, name) {
            println!("{what}: {h}");
        }
    }
    let gauge = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or("?")
            .to_string()
    };
    println!(
        "at the end: {} jobs still active, {} waiting",
        gauge("marshal_active_jobs "),
        gauge("marshal_queue_depth ")
    );
    if let Some(bytes) = written {
        println!(
            "written to storage during the load: {:.1} MB ({:.0} bytes per job)",
            bytes as f64 / 1e6,
            bytes as f64 / latencies.len().max(1) as f64
        );
    }
    if let Some((server_s, client_s)) = cpu {
        let per_job = |s: f64| s / latencies.len().max(1) as f64;
        println!(
            "CPU during the load: server {server_s:.2} s ({:.0} µs per job, so {:.0} jobs/s per core), \
             clients {client_s:.2} s ({:.0} µs per job)",
            per_job(server_s) * 1e6,
            1.0 / per_job(server_s),
            per_job(client_s) * 1e6,
        );
    }
    Ok(())
}

/// What the load produced: latencies of placed jobs, jobs not placed at once, wall
/// time, (server, client) CPU seconds spent during it, and bytes written to storage.
type Outcome = (
    Vec<Duration>,
    usize,
    Duration,
    Option<(f64, f64)>,
    Option<u64>,
);

async fn load(a: &Args, handle: &service::ServerHandle) -> Result<Outcome, String> {
    let url = format!("http://{}", handle.addr);
    let channels: Vec<tonic::transport::Channel> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(
                tonic::transport::Endpoint::from_shared(url.clone())
                    .map_err(|e| e.to_string())?
                    .connect()
                    .await
                    .map_err(|e| e.to_string())?,
            );
        }
        v
    };
    let mut nodes = NodeServiceClient::new(channels[0].clone());
    for i in 0..a.nodes {
        nodes
            .register(pb::RegisterNodeRequest {
                node: Some(pb::NodeInfo {
                    name: format!("node-{i}"),
                    gpu_model: "H100".into(),
                    gpus: 8,
                    nvlink_domain: 8,
                    cpu_milli: 224_000,
                    memory_mib: 2_097_152,
                    mig: None,
                    mig_layout: None,
                }),
                running: vec![],
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string())?;
    }
    let per_client = a.jobs.div_ceil(a.concurrency);
    let cpu_before =
        cpu_seconds_of_threads(SERVER_THREADS).zip(cpu_seconds_of_threads(CLIENT_THREADS));
    let written_before = storage_bytes_written();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..a.concurrency {
        let ch = channels[c % channels.len()].clone();
        let n = per_client.min(a.jobs.saturating_sub(c * per_client));
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(a.seed + c as u64);
        tasks.push(tokio::spawn(async move {
            let mut jobs = JobServiceClient::new(ch.clone());
            let mut agent = NodeServiceClient::new(ch);
            let mut latencies = Vec::with_capacity(n);
            let mut not_placed = 0usize;
            for _ in 0..n {
                let spec = spec_for(&mut rng);
                let t = Instant::now();
                let job = jobs
                    .submit(pb::SubmitRequest { spec: Some(spec) })
                    .await
                    .map_err(|e| e.to_string())?
                    .into_inner()
                    .job
                    .ok_or("no job in reply")?;
                let took = t.elapsed();
                if job.state != pb::JobState::Placed as i32 {
                    not_placed += 1;
                    continue;
                }
                latencies.push(took);
                // Every node of a multi-node job reports, as its agent would: the job
                // ends (and frees its GPUs) only when the last node has.
                let mut nodes: Vec<&str> = job.placement.iter().map(|w| w.node.as_str()).collect();
                nodes.sort_unstable();
                nodes.dedup();
                for node in nodes {
                    agent
                        .report_job(pb::ReportJobRequest {
                            node: node.to_string(),
                            job_id: job.id,
                            state: pb::JobState::Completed as i32,
                            message: String::new(),
                            attempt: job.attempts,
                            last_checkpoint_unix_s: 0.0,
                        })
                        .await
                        .map_err(|e| e.to_string())?;
                }
            }
            Ok::<_, String>((latencies, not_placed))
        }));
    }
    let mut latencies = Vec::with_capacity(a.jobs);
    let mut not_placed = 0;
    for t in tasks {
        let (l, np) = t.await.map_err(|e| e.to_string())??;
        latencies.extend(l);
        not_placed += np;
    }
    let wall = started.elapsed();
    let cpu_after =
        cpu_seconds_of_threads(SERVER_THREADS).zip(cpu_seconds_of_threads(CLIENT_THREADS));
    let cpu = cpu_before
        .zip(cpu_after)
        .map(|((s0, c0), (s1, c1))| (s1 - s0, c1 - c0));
    let written = written_before
        .zip(storage_bytes_written())
        .map(|(b, a)| a.saturating_sub(b));
    latencies.sort();
    Ok((latencies, not_placed, wall, cpu, written))
}
