//! End-to-end tests of the `marshal` binary on small bundled fixtures.

use std::path::PathBuf;

use serde_json::Value;

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
        .display()
        .to_string()
}

mod common;

use common::{fails_with, marshal, stdout_of};

fn json(args: &[&str]) -> Value {
    serde_json::from_str(&stdout_of(args)).expect("stdout is JSON")
}

const RUN_KEYS: [&str; 16] = [
    "policy",
    "trace",
    "cluster",
    "seed",
    "jobs",
    "gpus",
    "jct_mean_s",
    "jct_p50_s",
    "jct_p99_s",
    "queue_mean_s",
    "makespan_s",
    "gpu_alloc_pct",
    "locality_pct",
    "preemptions",
    "events",
    "wall_s",
];

#[test]
fn replay_json_has_the_stable_keys_and_accounts_for_every_job() {
    let philly = fixture("philly-150.csv");
    let cluster = fixture("small-cluster.toml");
    let v = json(&[
        "sim",
        "--cluster",
        &cluster,
        "--trace",
        &philly,
        "--policy",
        "tiresias",
        "--format",
        "json",
    ]);
    for key in RUN_KEYS {
        assert!(v.get(key).is_some(), "missing key {key}");
    }
    assert_eq!(v["policy"], "tiresias");
    assert_eq!(v["jobs"], 150);
    assert_eq!(v["gpus"], 32);
    assert_eq!(v["seed"], 42);
    let (completed, rejected) = (
        v["completed"].as_u64().unwrap(),
        v["rejected"].as_u64().unwrap(),
    );
    assert_eq!(completed + rejected, 150);
    assert!(v["jct_p99_s"].as_f64().unwrap() >= v["jct_p50_s"].as_f64().unwrap());
}

#[test]
fn inflation_json_reports_the_allocation_curve() {
    let pods = fixture("openb-300.csv");
    let v = json(&[
        "sim",
        "--cluster",
        "openb",
        "--trace",
        &pods,
        "--policy",
        "fgd",
        "--mode",
        "inflation",
        "--format",
        "json",
    ]);
    let curve = v["alloc_pct_by_arrived"].as_object().expect("curve");
    for load in (10..=130).step_by(10) {
        let alloc = curve[&load.to_string()].as_f64().expect("every decile");
        assert!(
            alloc <= load as f64 + 0.5 && alloc <= 100.0,
            "{load}: {alloc}"
        );
    }
    assert!(v["unallocated_gpus_at_100"].as_f64().unwrap() >= 0.0);
}

#[test]
fn several_seeds_give_a_mean_and_the_runs_and_a_seed_is_reproducible() {
    let philly = fixture("philly-150.csv");
    let cluster = fixture("small-cluster.toml");
    let args = [
        "sim",
        "--cluster",
        &cluster,
        "--trace",
        &philly,
        "--policy",
        "random",
        "--format",
        "json",
    ];
    let v = json(&[&args[..], &["--seeds", "3"]].concat());
    assert_eq!(v["runs"].as_array().unwrap().len(), 3);
    assert_eq!(v["mean"]["seeds"], 3);
    let seeds: Vec<u64> = v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["seed"].as_u64().unwrap())
        .collect();
    assert_eq!(seeds, vec![42, 43, 44]);

    let strip = |mut v: Value| {
        v.as_object_mut().unwrap().remove("wall_s");
        v
    };
    assert_eq!(
        strip(json(&args)),
        strip(json(&args)),
        "same seed, same result"
    );
}

#[test]
fn the_table_lists_every_policy_asked_for() {
    let philly = fixture("philly-150.csv");
    let cluster = fixture("small-cluster.toml");
    let out = marshal(&[
        "sim",
        "--cluster",
        &cluster,
        "--trace",
        &philly,
        "--policy",
        "fifo,best-fit,sjf-oracle",
    ]);
    assert!(out.status.success());
    let table = String::from_utf8(out.stdout).unwrap();
    for policy in ["fifo", "best-fit", "sjf-oracle"] {
        assert!(
            table.lines().any(|l| l.starts_with(policy)),
            "{policy} missing from\n{table}"
        );
    }
}

#[test]
fn an_unknown_policy_is_refused_with_the_known_names() {
    let out = marshal(&["sim", "--trace", "openb", "--policy", "bestfit"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown policy \"bestfit\"") && err.contains("best-fit"),
        "{err}"
    );
}

#[test]
fn malformed_rows_are_skipped_and_reported_with_file_line_and_field() {
    let dir = std::env::temp_dir().join(format!("marshal-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("bad.csv");
    std::fs::write(
        &trace,
        "timestamp,duration,num_gpus,gpu_time,cluster\n\
         2017-10-10 00:01:55,73.0,1,73.0,vc\n\
         2017-10-10 00:02:55,NaN,1,1.0,vc\n\
         2017-10-10 00:03:55,60.0,two,1.0,vc\n\
         2017-10-10 00:04:55,60.0,64,3840.0,vc\n",
    )
    .unwrap();
    let cluster = fixture("small-cluster.toml");
    let fifo_on_trace = [
        "sim",
        "--cluster",
        &cluster,
        "--trace",
        trace.to_str().unwrap(),
        "--policy",
        "fifo",
    ];
    let out = marshal(&[&fifo_on_trace[..], &["--format", "json"]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("bad.csv") && err.contains("line 3") && err.contains("duration"),
        "{err}"
    );
    assert!(err.contains("line 4") && err.contains("num_gpus"), "{err}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["jobs"], 2, "two rows kept");
    assert_eq!(v["rejected"], 1, "the 64-GPU job cannot fit 32 GPUs");

    std::fs::write(&trace, "").unwrap();
    fails_with(&fifo_on_trace, "bad.csv");
    // A byte that is not UTF-8 (a Latin-1 export) is placed at its line.
    std::fs::write(
        &trace,
        b"timestamp,duration,num_gpus,gpu_time,cluster\n\
          2017-10-10 00:01:55,73.0,1,73.0,vc\n\
          2017-10-10 00:02:55,73.0,1,73.0,v\xe9\n",
    )
    .unwrap();
    fails_with(
        &fifo_on_trace,
        "bad.csv, line 3, field `encoding`: byte 34 of the line (0xe9) is not UTF-8",
    );
    // A negative seed is refused as a value, not mistaken for a flag.
    fails_with(
        &["sim", "--trace", "openb", "--seed", "-1"],
        "invalid value '-1' for '--seed <SEED>'",
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn missing_files_and_unknown_clusters_are_clear_errors() {
    fails_with(
        &[
            "sim",
            "--trace",
            "/nonexistent/trace.csv",
            "--policy",
            "fifo",
        ],
        "/nonexistent/trace.csv",
    );
    let out = marshal(&[
        "sim",
        "--cluster",
        "no-such-cluster",
        "--trace",
        "openb",
        "--policy",
        "fifo",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no-such-cluster") && err.contains("dgx-h100-64"),
        "{err}"
    );
}

#[test]
fn list_names_policies_traces_and_clusters() {
    let out = marshal(&["list"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("fgd") && text.contains("philly-week4") && text.contains("openb"));
    assert!(text.contains("learned"), "{text}");
}

#[test]
fn datasets_describe_reports_the_published_facts() {
    let v = json(&["datasets", "describe", "philly", "--format", "json"]);
    assert_eq!(v["jobs"], 82_247);
    assert_eq!(v["gpus_per_job"]["1"], 76_627);
    assert_eq!(v["gpus_per_job"]["128"], 3);
    assert_eq!(v["cluster_gpus"], 3_205);
    let load = v["load_pct"].as_f64().unwrap();
    assert!((10.0..14.0).contains(&load), "{load}");
}

#[test]
fn a_written_sample_replays() {
    let dir = std::env::temp_dir().join(format!("marshal-sample-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("sample.csv");
    let philly = fixture("philly-150.csv");
    let v = json(&[
        "datasets",
        "sample",
        &philly,
        "--jobs",
        "40",
        "--seed",
        "3",
        "--out",
        out.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert_eq!(v["jobs"], 40);
    let cluster = fixture("small-cluster.toml");
    let run = json(&[
        "sim",
        "--cluster",
        &cluster,
        "--trace",
        out.to_str().unwrap(),
        "--policy",
        "fifo",
        "--format",
        "json",
    ]);
    assert_eq!(run["jobs"], 40);
    assert_eq!(
        run["completed"].as_u64().unwrap() + run["rejected"].as_u64().unwrap(),
        40
    );
    let out = marshal(&["datasets", "sample", &philly, "--jobs", "151"]);
    assert!(!out.status.success(), "more jobs than the trace has");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn calibration_reports_the_fitted_constants() {
    let out = marshal(&["datasets", "calibrate"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("data-parallel communication share at 16 GB/s: 0.34"),
        "{text}"
    );
    assert!(text.contains("GPU class k80: 0.297"), "{text}");
}

#[test]
fn pollux_workloads_replay_only_with_enrichment() {
    fails_with(
        &[
            "sim",
            "--trace",
            "pollux-1",
            "--cluster",
            "pollux-64",
            "--policy",
            "fifo",
            "--workloads",
            "none",
        ],
        "no job durations",
    );
    // Enriched (the default), every job completes with a positive JCT.
    let out = marshal(&[
        "sim", "--trace", "pollux-1", "--policy", "tiresias", "--format", "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["cluster"], "pollux-64");
    assert_eq!(v["completed"], 160);
    assert!(v["jct_mean_s"].as_f64().unwrap() > 600.0);
    let out = marshal(&[
        "sim",
        "--trace",
        "pollux-1",
        "--cluster",
        "pollux-64",
        "--policy",
        "fifo",
        "--mode",
        "inflation",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `marshal sim` of the 150-job Philly sample on the small cluster, `topo-pack`, JSON.
fn philly_sample_sim() -> Vec<String> {
    let (philly, cluster) = (fixture("philly-150.csv"), fixture("small-cluster.toml"));
    [
        "sim",
        "--cluster",
        &cluster,
        "--trace",
        &philly,
        "--policy",
        "topo-pack",
        "--format",
        "json",
    ]
    .map(String::from)
    .to_vec()
}

#[test]
fn trace_gpu_scales_work_to_the_recorded_hardware() {
    let base = philly_sample_sim();
    let base: Vec<&str> = base.iter().map(String::as_str).collect();
    let as_is = json(&base);
    let on_a100 = json(&[&base[..], &["--trace-gpu", "A100-40"]].concat());
    let (a, b) = (
        as_is["jct_mean_s"].as_f64().unwrap(),
        on_a100["jct_mean_s"].as_f64().unwrap(),
    );
    assert!(
        b > 1.5 * a,
        "recorded on GPUs twice as fast, the jobs take longer here: {a} vs {b}"
    );
    let out = marshal(&[&base[..], &["--trace-gpu", "Z9000"]].concat());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Z9000"));
}

/// `--quota`: Philly's virtual clusters are its tenants; limited to a few GPUs each,
/// jobs queue behind their own tenant's and wait longer, and one asking more than the
/// limit is refused. A bad quota file is refused naming it.
#[test]
fn a_quota_file_limits_each_tenant_and_a_bad_one_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let quota = dir.path().join("quota.toml");
    std::fs::write(&quota, "[default]\ngpus = 2\n").unwrap();
    let base = philly_sample_sim();
    let base: Vec<&str> = base.iter().map(String::as_str).collect();
    let free = json(&base);
    let limited = json(&[&base[..], &["--quota", quota.to_str().unwrap()]].concat());
    let mean = |v: &Value| v["jct_mean_s"].as_f64().unwrap();
    assert!(
        mean(&limited) > mean(&free),
        "limited to 2 GPUs per virtual cluster, jobs wait longer: {} vs {}",
        mean(&limited),
        mean(&free)
    );
    assert!(
        limited["rejected"].as_u64().unwrap() > free["rejected"].as_u64().unwrap(),
        "jobs of more than 2 GPUs are refused: {limited}"
    );
    std::fs::write(&quota, "[default]\ngpus = -1\n").unwrap();
    let out = marshal(&[&base[..], &["--quota", quota.to_str().unwrap()]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("quota.toml") && err.contains("default.gpus"),
        "{err}"
    );
}

#[test]
fn datasets_workloads_lists_the_enrichment_kinds() {
    let out = marshal(&["datasets", "workloads", "--format", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let kinds = v.as_array().unwrap();
    assert_eq!(kinds.len(), 32);
    let resnet = kinds
        .iter()
        .find(|k| k["name"] == "ResNet-50 (batch size 64)")
        .unwrap();
    assert_eq!(resnet["comm"], "data-parallel");
    assert!(resnet["relative_throughput"]["K80"].as_f64().unwrap() < 0.5);
}

#[test]
fn eval_compares_policies_with_intervals_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let plots = dir.path().join("plots");
    let v = json(&[
        "eval",
        "--policies",
        "fifo,topo-pack",
        "--trace",
        &fixture("philly-150.csv"),
        "--cluster",
        &fixture("small-cluster.toml"),
        "--seeds",
        "3",
        "--format",
        "json",
        "--plots",
        plots.to_str().unwrap(),
    ]);
    let policies = v.as_array().unwrap();
    assert_eq!(policies.len(), 2);
    for p in policies {
        let mean = &p["mean"];
        for key in RUN_KEYS.iter().filter(|k| **k != "seed") {
            assert!(mean.get(*key).is_some(), "missing {key}");
        }
        assert_eq!(p["runs"].as_array().unwrap().len(), 3);
        assert!(mean["ci95"]["jct_mean_s"].as_f64().unwrap() >= 0.0);
    }
    // The baseline's paired difference from itself is exactly zero.
    assert_eq!(
        policies[0]["mean"]["vs_fifo"]["jct_mean_s"]["mean_pct"],
        0.0
    );
    let svg = std::fs::read_to_string(plots.join("jct_cdf.svg")).unwrap();
    assert_eq!(svg.matches("<polyline").count(), 2);
    fails_with(
        &[
            "eval",
            "--policies",
            "fifo",
            "--trace",
            "philly",
            "--seeds",
            "1",
        ],
        "confidence intervals need two seeds",
    );
}

/// `marshal eval --quota` gives every policy the same limits: with two GPUs per
/// virtual cluster, jobs wait longer under each policy than without.
#[test]
fn eval_applies_a_quota_to_every_policy() {
    let dir = tempfile::tempdir().unwrap();
    let quota = dir.path().join("quota.toml");
    std::fs::write(&quota, "[default]\ngpus = 2\n").unwrap();
    let (trace, cluster) = (fixture("philly-150.csv"), fixture("small-cluster.toml"));
    let base = [
        "eval",
        "--policies",
        "fifo,topo-pack",
        "--trace",
        &trace,
        "--cluster",
        &cluster,
        "--seeds",
        "2",
        "--format",
        "json",
    ];
    let free = json(&base);
    let limited = json(&[&base[..], &["--quota", quota.to_str().unwrap()]].concat());
    for i in 0..2 {
        let mean = |v: &Value| v[i]["mean"]["jct_mean_s"].as_f64().unwrap();
        assert!(
            mean(&limited) > mean(&free),
            "policy {i}: {} limited vs {} free",
            mean(&limited),
            mean(&free)
        );
    }
}

#[test]
fn a_closed_stdout_stops_the_command_quietly() {
    use std::process::{Command, Stdio};
    // The reader goes away before the command prints (it parses the trace first), as
    // with `| head -1` on a longer output.
    let mut child = Command::new(env!("CARGO_BIN_EXE_marshal"))
        .args(["datasets", "describe", "philly"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(141), "{stderr}");
}
