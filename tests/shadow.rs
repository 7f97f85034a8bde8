//! `marshal shadow`: replay of a recorded log against Marshal's decisions, and the live
//! advisor-only server with its shadow log.

mod common;

use std::io::BufRead as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::{fails_with, marshal, stdout_of};
use marshal_scheduler::service::pb::advisor_service_client::AdvisorServiceClient;
use marshal_scheduler::service::{pb, tokio, tonic, tonic_health};
use serde_json::Value;

const OPENB_PODS: &str = include_str!("../datasets/data/openb_pod_list_default.csv");

/// The header and the first `n` pods of the bundled openb default pod list.
fn openb_slice(dir: &Path, n: usize) -> String {
    let text: Vec<&str> = OPENB_PODS.lines().take(n + 1).collect();
    let path = dir.join("openb-slice.csv");
    std::fs::write(&path, text.join("\n") + "\n").unwrap();
    path.display().to_string()
}

/// `marshal shadow` replaying `log` on `cluster` with `best-fit` as Marshal's policy, a
/// JSON report and its files in `out`.
fn best_fit_replay<'a>(log: &'a Path, cluster: &'a Path, out: &'a Path) -> Vec<&'a str> {
    best_fit(&["--trace", log.to_str().unwrap()], cluster, out, "json")
}

/// `marshal shadow` on `source` (the log's flags) and `cluster`, `best-fit` as Marshal's
/// policy, a `format` report and its files in `out`.
fn best_fit<'a>(
    source: &[&'a str],
    cluster: &'a Path,
    out: &'a Path,
    format: &'a str,
) -> Vec<&'a str> {
    let mut args = vec!["shadow"];
    args.extend(source);
    args.extend([
        "--cluster",
        cluster.to_str().unwrap(),
        "--policy",
        "best-fit",
        "--format",
        format,
        "--out",
        out.to_str().unwrap(),
    ]);
    args
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn replay_of_an_openb_slice_honours_recorded_starts_and_is_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let trace = openb_slice(dir.path(), 400);
    let run = |out: &str| {
        let out = dir.path().join(out);
        let stdout = stdout_of(&[
            "shadow",
            "--trace",
            &trace,
            "--cluster",
            "openb",
            "--policy",
            "topo-pack",
            "--seed",
            "7",
            "--format",
            "json",
            "--out",
            out.to_str().unwrap(),
        ]);
        (serde_json::from_str::<Value>(&stdout).unwrap(), out)
    };
    let (report, out_a) = run("a");
    let (_, out_b) = run("b");
    for f in ["report.json", "records.jsonl", "allocation.csv"] {
        assert_eq!(
            std::fs::read(out_a.join(f)).unwrap(),
            std::fs::read(out_b.join(f)).unwrap(),
            "{f} differs between two runs with the same seed"
        );
    }
    assert_eq!(report, read_json(&out_a.join("report.json")));
    assert_eq!(report["jobs_in_log"], 400);
    // The same keys as `marshal sim` where they overlap, on both sides.
    for side in ["incumbent", "marshal"] {
        for key in [
            "policy",
            "jobs",
            "completed",
            "rejected",
            "jct_mean_s",
            "jct_p50_s",
            "jct_p99_s",
            "queue_mean_s",
            "makespan_s",
            "gpu_alloc_pct",
            "locality_pct",
            "preemptions",
            "jct_p95_s",
            "queue_p99_s",
            "gpu_hours_idle",
        ] {
            assert!(
                report[side].get(key).is_some(),
                "{side}.{key} missing: {report}"
            );
        }
    }
    assert_eq!(report["marshal"]["policy"], "topo-pack");
    let rows = records(&out_a.join("records.jsonl"));
    assert_eq!(rows.len(), 400, "one row per job of the log");
    let mut replayed = 0;
    for r in &rows {
        match r["recorded_start_s"].as_f64() {
            None => {
                assert_eq!(r["incumbent_status"], "not_replayed");
                assert_eq!(r["marshal_status"], "not_replayed");
            }
            Some(recorded) => {
                replayed += 1;
                let start = r["incumbent_start_s"]
                    .as_f64()
                    .expect("replayed jobs start");
                assert!(start >= recorded, "{r}: started before its recorded time");
                assert_eq!(r["incumbent_delay_s"].as_f64(), Some(start - recorded));
                assert!(r["marshal_start_s"].as_f64().unwrap() >= r["created_s"].as_f64().unwrap());
                assert!(
                    r["marshal_path"]
                        .as_str()
                        .unwrap()
                        .starts_with("heuristic:topo-pack")
                );
            }
        }
    }
    assert_eq!(report["replayed"], replayed);
    assert_eq!(report["not_replayed"], 400 - replayed);
    let table = stdout_of(&["shadow", "--trace", &trace, "--cluster", "openb"]);
    assert!(
        table.contains("queue_p95_s") && table.contains("incumbent"),
        "{table}"
    );
}

#[test]
fn recorded_nodes_without_room_delay_the_start_and_bad_rows_name_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = dir.path().join("nodes.csv");
    std::fs::write(
        &nodes,
        "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,V100M32\nn1,64000,262144,2,V100M32\n",
    )
    .unwrap();
    let pods = dir.path().join("pods.csv");
    std::fs::write(
        &pods,
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time,node\n\
         p0,1000,1024,2,1000,,BE,Running,0,100,0,n0\n\
         p1,1000,1024,1,1000,,BE,Running,5,40,10,n0\n\
         p2,1000,1024,1,1000,,BE,Pending,6,30,,\n\
         p3,1000,1024,1,1000,,BE,Running,6,30,abc,n1\n\
         p4,1000,1024,1,1000,,BE,Running,6,30,50,n1\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    let cmd = common::marshal(&best_fit_replay(&pods, &nodes, &out));
    assert!(
        cmd.status.success(),
        "{}",
        String::from_utf8_lossy(&cmd.stderr)
    );
    let stderr = String::from_utf8_lossy(&cmd.stderr);
    assert!(
        stderr.contains("pods.csv:5:") && stderr.contains("scheduled_time"),
        "{stderr}"
    );
    assert!(
        stderr.contains("pods.csv:6:") && stderr.contains("outside"),
        "{stderr}"
    );
    let report = read_json(&out.join("report.json"));
    assert_eq!(report["jobs_in_log"], 3);
    assert_eq!(report["not_replayed"], 1);
    assert_eq!(report["incumbent_recorded_start_delayed"], 1, "{report}");
    assert_eq!(report["incumbent_delay_max_s"], 90.0);
    let rows = records(&out.join("records.jsonl"));
    assert_eq!(rows.len(), 3);
    assert_eq!(
        rows[1]["incumbent_start_s"], 100.0,
        "p1 waits for room on n0"
    );
    assert!(
        rows[1]["incumbent_placement"]
            .as_str()
            .unwrap()
            .starts_with("n0:")
    );
    assert_eq!(
        rows[1]["marshal_start_s"], 5.0,
        "Marshal puts p1 on n1 at once"
    );
    assert_eq!(rows[1]["start_delta_s"], -95.0);
    assert_eq!(rows[2]["incumbent_status"], "not_replayed");
}

#[test]
fn dlrm_serving_log_replays_with_instances_running_at_the_start_and_cpu_only_roles() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster.toml");
    std::fs::write(
        &cluster,
        "name = \"tiny-dlrm\"\nnodes_per_rack = 2\nracks_per_spine = 1\n\
         [[nodes]]\nname_prefix = \"hn\"\ngpu_model = \"A10\"\ngpus = 2\ncpu_milli = 16000\nmemory_mib = 1048576\n\
         [[nodes]]\nname_prefix = \"cn\"\ncpu_milli = 64000\nmemory_mib = 1048576\n",
    )
    .unwrap();
    let log = dir.path().join("dlrm.csv");
    std::fs::write(
        &log,
        "instance_sn,role,app_name,cpu_request,cpu_limit,gpu_request,gpu_limit,rdma_request,\
         rdma_limit,memory_request,memory_limit,disk_request,disk_limit,max_instance_per_node,\
         creation_time,scheduled_time,deletion_time\n\
         i0,HN,app_0,8,8,1,1,25,25,40.0,40.0,640.0,800.0,8,,,1000.0\n\
         i1,HN,app_0,8,8,1,1,25,25,40.0,40.0,640.0,800.0,8,10.0,10.0,500.0\n\
         i2,HN,app_0,8,8,1,1,25,25,40.0,40.0,640.0,800.0,8,20.0,600.0,900.0\n\
         i3,CN,app_1,48,48,0,0,1,1,240.0,240.0,255.0,300.0,-1,30.0,40.0,200.0\n\
         i4,CN,app_1,48,48,0,0,1,1,240.0,240.0,255.0,300.0,-1,50.0,60.0,300.0\n\
         i5,CN,app_1,48,48,0,0,1,1,240.0,240.0,255.0,300.0,-1,70.0,,400.0\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    let stdout = stdout_of(&best_fit_replay(&log, &cluster, &out));
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["jobs_in_log"], 6);
    assert_eq!(report["not_replayed"], 1, "i5 was never scheduled");
    // i4's recorded start (60 s) finds i3's 48 cores still held in this cluster model:
    // it waits until i3 ends at 200 s.
    assert_eq!(report["incumbent_recorded_start_delayed"], 1, "{report}");
    assert_eq!(report["incumbent_delay_max_s"], 140.0);
    let rows = records(&out.join("records.jsonl"));
    let row = |name: &str| rows.iter().find(|r| r["name"] == name).unwrap().clone();
    // Running when the trace began: created and started at 0 on both sides.
    let i0 = row("i0");
    assert_eq!(
        (i0["created_s"].as_f64(), i0["recorded_start_s"].as_f64()),
        (Some(0.0), Some(0.0))
    );
    assert_eq!(i0["marshal_start_s"], 0.0);
    // i2 waited 580 s under the incumbent although a GPU was free from 500 s, when
    // i1 ended: Marshal starts it then and runs it its recorded 300 s.
    let i2 = row("i2");
    assert_eq!(i2["incumbent_start_s"], 600.0);
    assert_eq!(i2["marshal_start_s"], 500.0);
    assert_eq!(i2["start_delta_s"], -100.0);
    assert_eq!(i2["marshal_finish_s"], 800.0);
    // The GPU node's 16 cores are taken by i0 and i1: CPU-only instances go to the CPU
    // node.
    let i3 = row("i3");
    assert_eq!(i3["marshal_start_s"], 30.0);
    assert_eq!(i3["marshal_status"], "completed");
    assert!(
        i3["marshal_placement"].as_str().unwrap().starts_with("cn"),
        "{i3}"
    );
    assert_eq!(row("i5")["marshal_status"], "not_replayed");
}

struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn snapshot_node(name: &str, used: &[u32]) -> pb::SnapshotNode {
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
        schedulable: true,
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

/// Starts `marshal shadow --listen 127.0.0.1:0 --log LOG` with `policy_args`; the server
/// (killed when the first value drops) and the address it is bound to.
fn start_advisor(log: &Path, policy_args: &[&str]) -> (Reap, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_marshal"))
        .args(["shadow", "--listen", "127.0.0.1:0"])
        .args(policy_args)
        .arg("--log")
        .arg(log)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("marshal shadow starts");
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let reap = Reap(child);
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("marshal shadow: advisor listening on ")
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    (reap, addr)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn connect(addr: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// An Advise call on the snapshot `nodes` for `pending` jobs `(id, whole GPUs)`, each
/// having waited 12 s.
fn advise_request(
    nodes: Vec<pb::SnapshotNode>,
    pending: &[(&str, u32)],
    policy: &str,
) -> pb::AdviseRequest {
    pb::AdviseRequest {
        cluster: Some(pb::ClusterSnapshot {
            name: "foreign".into(),
            nodes,
            ..Default::default()
        }),
        pending: pending
            .iter()
            .map(|&(id, gpus)| pb::PendingJob {
                id: id.into(),
                spec: Some(pb::JobSpec {
                    workers: 1,
                    gpu: Some(pb::GpuDemand {
                        kind: Some(pb::gpu_demand::Kind::Whole(gpus)),
                    }),
                    ..Default::default()
                }),
                waited_s: 12.0,
            })
            .collect(),
        policy: policy.into(),
    }
}

#[test]
fn live_mode_follows_require_promotion_in_its_config() {
    let dir = tempfile::tempdir().unwrap();
    let (log, config) = (dir.path().join("shadow.jsonl"), dir.path().join("s.toml"));
    std::fs::write(&config, "policy = \"learned\"\nrequire_promotion = true\n").unwrap();
    // The policy comes from the file (no `--policy`). The shipped model was never
    // promoted: refused, the fallback answers.
    let (_reap, addr) = start_advisor(
        &log,
        &[
            "--config",
            config.to_str().unwrap(),
            "--model",
            concat!(env!("CARGO_MANIFEST_DIR"), "/models/policy-default"),
        ],
    );
    let rec = runtime().block_on(async {
        let ch = connect(&addr).await;
        let nodes = vec![snapshot_node("a", &[]), snapshot_node("b", &[0])];
        AdvisorServiceClient::new(ch)
            .advise(advise_request(nodes, &[("slurm-1", 1)], ""))
            .await
            .unwrap()
            .into_inner()
            .recommendations
            .remove(0)
    });
    assert_eq!(rec.path, "fallback:no-model", "{rec:?}");
    assert_eq!(rec.verdict, pb::Verdict::Place as i32);
}

#[test]
fn live_mode_answers_advise_and_appends_every_recommendation_to_the_shadow_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("shadow.jsonl");
    let (_reap, addr) = start_advisor(
        &log,
        &[
            "--policy",
            "learned",
            "--model",
            concat!(env!("CARGO_MANIFEST_DIR"), "/models/policy-default"),
        ],
    );
    let (rec, learned) = runtime().block_on(async {
        let ch = connect(&addr).await;
        let health = tonic_health::pb::health_client::HealthClient::new(ch.clone())
            .check(tonic_health::pb::HealthCheckRequest {
                service: "marshal.v1.AdvisorService".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(health.status, 1, "SERVING");
        let request = |id: &str, gpus: u32, policy: &str| {
            let nodes = vec![
                snapshot_node("a", &[0, 1, 2, 3, 4, 5, 6, 7]),
                snapshot_node("b", &[0]),
            ];
            advise_request(nodes, &[(id, gpus)], policy)
        };
        let mut client = AdvisorServiceClient::new(ch);
        // A call may name a heuristic; one that names none gets the server's policy.
        let resp = client
            .advise(request("slurm-17", 4, "topo-pack"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(resp.policy, "topo-pack");
        let heuristic = resp.recommendations.into_iter().next().unwrap();
        let resp = client
            .advise(request("slurm-18", 1, ""))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(resp.policy, "learned");
        (heuristic, resp.recommendations.into_iter().next().unwrap())
    });
    // The shipped model answered (the network, or its gate handing over), not "no model".
    assert!(
        learned.path == "learned" || learned.path.starts_with("fallback:"),
        "{learned:?}"
    );
    assert_ne!(learned.path, "fallback:no-model");
    assert_eq!(learned.verdict, pb::Verdict::Place as i32);
    assert_eq!(learned.placement[0].node, "b", "node a is full");
    assert_eq!(rec.job_id, "slurm-17");
    assert_eq!(rec.verdict, pb::Verdict::Place as i32);
    assert_eq!(rec.placement[0].node, "b", "node a is full");
    assert_eq!(rec.decision_id, 1);
    assert_eq!(rec.path, "heuristic:topo-pack");
    let lines: Vec<Value> = records(&log);
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1]["job"], "slurm-18");
    assert_eq!(lines[1]["policy"], "learned");
    assert_eq!(lines[1]["path"], learned.path.as_str());
    assert_eq!(lines[0]["job"], "slurm-17");
    assert_eq!(lines[0]["verdict"], "Place");
    assert_eq!(lines[0]["source"], "advise");
    assert_eq!(lines[0]["placement"][0]["node"], "b");

    let summary: Value = serde_json::from_str(&stdout_of(&[
        "shadow",
        "--report-log",
        log.to_str().unwrap(),
        "--format",
        "json",
    ]))
    .unwrap();
    assert_eq!(summary["decisions"], 2);
    assert_eq!(summary["jobs_placed"], 2);
    let bad = dir.path().join("bad.jsonl");
    let text = std::fs::read_to_string(&log).unwrap() + "{\"not\": \"a record\"}\n";
    std::fs::write(&bad, text).unwrap();
    fails_with(
        &["shadow", "--report-log", bad.to_str().unwrap()],
        "bad.jsonl:3:",
    );
    // A summary replays nothing, so options that steer a replay are refused, not ignored;
    // so are the replay's options in live mode.
    for flag in [
        &["--policy", "learned"][..],
        &["--incumbent-placer", "fifo"],
        &["--cpu-nodes-first"],
    ] {
        let mut args = vec!["shadow", "--report-log", log.to_str().unwrap()];
        args.extend_from_slice(flag);
        fails_with(&args, &format!("{} only apply with --outcomes", flag[0]));
    }
    fails_with(
        &[
            "shadow",
            "--listen",
            "127.0.0.1:0",
            "--incumbent-placer",
            "fifo",
            "--cluster",
            "openb",
        ],
        "--cluster, --incumbent-placer do not apply with --listen",
    );
    // A record torn by a crash mid-append is left out with a warning, not fatal.
    let torn = dir.path().join("torn.jsonl");
    let text = std::fs::read_to_string(&log).unwrap() + "{\"id\":3,\"job\":\"slu";
    std::fs::write(&torn, text).unwrap();
    let (summary, stderr) = summarise_log(&torn);
    assert_eq!(summary["decisions"], 2);
    assert!(
        stderr.contains("torn.jsonl:3: left out a torn last record"),
        "{stderr}"
    );
    // Line breaks of another system and a byte-order mark read like the advisor's own.
    let original = std::fs::read_to_string(&log).unwrap();
    for (name, text) in [
        ("cr.jsonl", original.replace('\n', "\r")),
        ("crlf.jsonl", original.replace('\n', "\r\n")),
        ("bom.jsonl", format!("\u{feff}{original}")),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        assert_eq!(summarise_log(&path).0["decisions"], 2, "{name}");
    }
    // Records that parse but cannot be replayed (edited or damaged: the advisor writes
    // none) are left out by line, and the rest of the log is kept.
    let mut first = lines[0].clone();
    first["at_us"] = Value::from(-5);
    let mut second = lines[0].clone();
    second["spec"]["workers"] = Value::from(u32::MAX);
    let mut third = lines[0].clone();
    third["spec"]["workers"] = Value::from(0);
    let damaged = dir.path().join("damaged.jsonl");
    std::fs::write(&damaged, format!("{original}{first}\n{second}\n{third}\n")).unwrap();
    let (summary, stderr) = summarise_log(&damaged);
    assert_eq!(summary["decisions"], 2);
    for (line, why) in [
        (3, "at_us -5 is not between 1970"),
        (4, "4294967295 workers"),
        (5, "at least one worker"),
    ] {
        assert!(
            stderr.contains(&format!(
                "damaged.jsonl:{line}: left out job \"slurm-17\": "
            )) && stderr.contains(why),
            "line {line}: {stderr}"
        );
    }
}

/// SIGTERM ends live mode gracefully: the process exits 0 within a bound, stops
/// listening, and every recommendation answered before the signal is in the shadow log,
/// each a whole record (the log is flushed per call, so the signal costs none).
#[test]
fn live_mode_exits_cleanly_on_sigterm_with_every_answered_recommendation_logged() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("shadow.jsonl");
    let (mut server, addr) = start_advisor(&log, &["--policy", "topo-pack"]);
    let answered: Vec<(u64, String)> = runtime().block_on(async {
        let mut client = AdvisorServiceClient::new(connect(&addr).await);
        let mut answered = Vec::new();
        for i in 0..5 {
            let job = format!("slurm-{i}");
            let nodes = vec![snapshot_node("a", &[]), snapshot_node("b", &[0])];
            let rec = client
                .advise(advise_request(nodes, &[(&job, 1)], ""))
                .await
                .unwrap()
                .into_inner()
                .recommendations
                .remove(0);
            assert_eq!(rec.verdict, pb::Verdict::Place as i32);
            answered.push((rec.decision_id, job));
        }
        answered
    });
    let kill = Command::new("kill")
        .args(["-TERM", &server.0.id().to_string()])
        .status()
        .expect("the kill command runs");
    assert!(kill.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = server.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "marshal shadow still runs 20 s after SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(
        status.code(),
        Some(0),
        "a graceful shutdown exits 0: {status:?}"
    );
    assert!(
        std::net::TcpStream::connect(&addr).is_err(),
        "nothing listens on {addr} any more"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.ends_with('\n'), "the last record is whole: {text:?}");
    let logged: Vec<(u64, String)> = records(&log)
        .iter()
        .map(|r| {
            assert_eq!(r["source"], "advise");
            (
                r["id"].as_u64().unwrap(),
                r["job"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(logged, answered);
}

/// `shadow --report-log <log> --format json`, which must succeed: its summary and stderr.
fn summarise_log(log: &Path) -> (Value, String) {
    let out = marshal(&[
        "shadow",
        "--report-log",
        log.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{out:?}");
    let summary = serde_json::from_slice(&out.stdout).unwrap();
    (summary, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Unix seconds with exactly the µs of `at_us` (how an operator's export writes them).
fn unix_s(at_us: i64, plus_s: i64) -> String {
    let us = at_us + plus_s * 1_000_000;
    format!("{}.{:06}", us / 1_000_000, us % 1_000_000)
}

#[test]
fn live_log_with_the_incumbents_outcomes_replays_and_compares_recommendations() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("shadow.jsonl");
    let (reap, addr) = start_advisor(&log, &["--policy", "best-fit"]);
    runtime().block_on(async {
        let mut client = AdvisorServiceClient::new(connect(&addr).await);
        let full: &[u32] = &[0, 1, 2, 3, 4, 5, 6, 7];
        // 1: j1 fits on b, j2 (8 GPUs) waits. 2: a is free, j2 goes there. 3: j3 fits on
        // b; j4 and `lost` (8 GPUs each) wait.
        let calls = [
            (full, &[0][..], vec![("j1", 4), ("j2", 8)]),
            (&[][..], &[0, 1, 2, 3, 4][..], vec![("j2", 8)]),
            (full, &[0][..], vec![("j3", 1), ("j4", 8), ("lost", 8)]),
        ];
        for (a, b, pending) in calls {
            let nodes = vec![snapshot_node("a", a), snapshot_node("b", b)];
            client
                .advise(advise_request(nodes, &pending, ""))
                .await
                .unwrap();
        }
    });
    drop(reap);
    let lines = records(&log);
    let verdicts: Vec<(&str, &str)> = lines
        .iter()
        .map(|l| (l["job"].as_str().unwrap(), l["verdict"].as_str().unwrap()))
        .collect();
    assert_eq!(
        verdicts,
        [
            ("j1", "Place"),
            ("j2", "Wait"),
            ("j2", "Place"),
            ("j3", "Place"),
            ("j4", "Wait"),
            ("lost", "Wait"),
        ]
    );
    let at = |i: usize| lines[i]["at_us"].as_i64().unwrap();
    let (t1, t2, t3) = (at(0), at(2), at(3));
    assert!(t2 > t1, "separate calls are µs apart at least");
    // j1: started 30 s after Marshal's PLACE, on the node it recommended (b).
    // j2: started when first asked, before Marshal's PLACE (t2), on a as recommended.
    // j3: started at the instant of the PLACE, on c (Marshal said b).
    // j4: never placed by Marshal. `ghost` is not in the log; one row is malformed.
    let outcomes = dir.path().join("outcomes.csv");
    std::fs::write(
        &outcomes,
        format!(
            "job,scheduled_time,deletion_time,node\n\
             j1,{},{},b\nj2,{},{},a\nj3,{},{},c\nj4,{},{},a\nbroken,abc,5,a\nghost,{},{},a\n",
            unix_s(t1, 30),
            unix_s(t1, 330),
            unix_s(t1, 0),
            unix_s(t1, 600),
            unix_s(t3, 0),
            unix_s(t3, 100),
            unix_s(t3, 700),
            unix_s(t3, 800),
            unix_s(t1, 1),
            unix_s(t1, 2),
        ),
    )
    .unwrap();
    let cluster = dir.path().join("nodes.csv");
    let node = |n: &str| format!("{n},224000,2097152,8,H100\n");
    std::fs::write(
        &cluster,
        format!(
            "sn,cpu_milli,memory_mib,gpu,model\n{}{}{}",
            node("a"),
            node("b"),
            node("c")
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let source = [
        "--report-log",
        log.to_str().unwrap(),
        "--outcomes",
        outcomes.to_str().unwrap(),
    ];
    let args = |format| best_fit(&source, &cluster, &out, format);
    let cmd = common::marshal(&args("json"));
    let stderr = String::from_utf8_lossy(&cmd.stderr);
    assert!(cmd.status.success(), "{stderr}");
    assert!(
        stderr.contains("outcomes.csv:6:") && stderr.contains("scheduled_time"),
        "{stderr}"
    );
    assert!(
        stderr.contains("lost") && stderr.contains("ghost"),
        "{stderr}"
    );
    let report: Value = serde_json::from_slice(&cmd.stdout).unwrap();
    assert_eq!(report["jobs_in_log"], 4, "{report}");
    assert_eq!(report["replayed"], 4);
    assert_eq!(report["not_replayed"], 0);
    assert_eq!(report["incumbent_recorded_start_delayed"], 0);
    let live = &report["live"];
    assert_eq!(live["log_decisions"], 6);
    assert_eq!(live["log_jobs"], 5);
    assert_eq!(live["outcome_rows"], 5);
    assert_eq!(live["outcome_rows_skipped"], 1);
    assert_eq!(live["joined"], 4);
    assert_eq!(live["log_jobs_without_outcome"], 1);
    assert_eq!(live["outcomes_not_in_log"], 1);
    assert_eq!(live["started_before_first_advice"], 0);
    let rec = &live["recommendation"];
    assert_eq!(
        [&rec["sooner"], &rec["later"], &rec["same"], &rec["never"]],
        [1, 1, 1, 1]
    );
    assert_eq!(rec["incumbent_never"], 0);
    let lead = (30.0 + (t1 - t2) as f64 / 1e6 + 0.0) / 3.0;
    assert!(
        (rec["lead_mean_s"].as_f64().unwrap() - lead).abs() < 1e-9,
        "{rec} vs {lead}"
    );
    assert_eq!(rec["node_compared"], 3);
    assert_eq!(rec["node_agree"], 2);
    assert!((rec["node_agree_share"].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-12);
    // The replay's files, as in replay mode: one record per joined job, named by id.
    let rows = records(&out.join("records.jsonl"));
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["j1", "j2", "j3", "j4"]);
    assert_eq!(rows[0]["created_s"], 0.0, "j1 was asked about first");
    assert_eq!(rows[2]["recorded_node"], "c");
    assert!(out.join("allocation.csv").exists());
    assert_eq!(read_json(&out.join("report.json")), report);
    let table = stdout_of(&args("table"));
    assert!(
        table.contains("1 sooner, 1 later, 1 same, 1 never recommended")
            && table.contains("recommended node = recorded node: 2 of 3 (66.7 %)"),
        "{table}"
    );
    // A missing column is an error naming it; without --cluster there is no cluster.
    std::fs::write(&outcomes, "job,scheduled_time\nj1,5\n").unwrap();
    fails_with(&args("json"), "deletion_time");
    fails_with(&[&["shadow"][..], &source].concat(), "--cluster");
}
