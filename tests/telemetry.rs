//! End-to-end tests of `marshal telemetry` and `marshal agent`: the simulated source,
//! and the NVML source against the fake driver (`telemetry/fake-nvml`; NVML itself is
//! absent in CI).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;

use common::{fails_with, marshal, stdout_of as ok};

fn files_under(dir: &Path, suffix: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.to_string_lossy().ends_with(suffix) {
                out.push(p);
            }
        }
    }
    out
}

/// Waits for `child` to exit, at most `limit`; past that it is killed and `None` comes
/// back.
fn wait_within(
    child: &mut std::process::Child,
    limit: Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `marshal telemetry record` of the simulated telemetry of `itp-195job` into `out`.
fn record_itp_args<'a>(
    out: &'a str,
    hours: &'a str,
    interval: &'a str,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec![
        "telemetry",
        "record",
        "--source",
        "sim",
        "--trace",
        "itp-195job",
        "--hours",
        hours,
        "--interval",
        interval,
        "--out",
        out,
    ];
    args.extend_from_slice(extra);
    args
}

/// Records the simulated telemetry of `itp-195job` into `out`.
fn record_itp(out: &str, hours: &str, interval: &str, extra: &[&str]) -> String {
    ok(&record_itp_args(out, hours, interval, extra))
}

#[test]
fn record_inspect_and_compact_a_simulated_replay() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tel");
    let out_s = out.to_str().unwrap();
    let text = record_itp(out_s, "2", "60s", &["--stragglers", "0.5"]);
    // 121 ticks × 128 GPUs.
    assert!(text.contains("recorded 15488 GPU samples"), "{text}");
    let summary: Value =
        serde_json::from_str(&ok(&["telemetry", "inspect", out_s, "--format", "json"])).unwrap();
    let kinds = summary["kinds"].as_array().unwrap();
    let gpu = kinds.iter().find(|k| k["kind"] == "gpu").unwrap();
    assert_eq!(gpu["rows"], 15488);
    assert!(
        gpu["columns"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c == "mem_phase")
    );
    assert!(
        kinds
            .iter()
            .any(|k| k["kind"] == "step" && k["rows"].as_u64().unwrap() > 0)
    );
    assert_eq!(summary["gpus"].as_array().unwrap().len(), 128);
    assert!(summary["errors"].as_array().unwrap().is_empty());

    // A corrupt file is reported, not fatal.
    let victim = files_under(&out, ".parquet")
        .into_iter()
        .find(|p| p.to_string_lossy().contains("kind=gpu"))
        .expect("a GPU file");
    std::fs::write(&victim, b"PAR1 not really").unwrap();
    let summary: Value =
        serde_json::from_str(&ok(&["telemetry", "inspect", out_s, "--format", "json"])).unwrap();
    assert_eq!(summary["errors"].as_array().unwrap().len(), 1);
    std::fs::remove_file(&victim).unwrap();

    let before: u64 = files_under(&out, ".parquet").len() as u64;
    let text = ok(&["telemetry", "compact", out_s]);
    assert!(text.contains("partitions compacted"), "{text}");
    let after = files_under(&out, ".parquet").len() as u64;
    assert!(after < before, "{before} → {after}");
    let summary: Value =
        serde_json::from_str(&ok(&["telemetry", "inspect", out_s, "--format", "json"])).unwrap();
    let rows: u64 = summary["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["kind"] == "gpu")
        .map(|k| k["rows"].as_u64().unwrap())
        .sum();
    assert!(
        rows > 0 && rows < 15488,
        "compaction keeps the rows of the files left: {rows}"
    );
}

#[test]
fn recording_into_a_directory_with_telemetry_needs_append() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tel");
    let out_s = out.to_str().unwrap();
    record_itp(out_s, "0.1", "60s", &[]);
    let files = files_under(&out, ".parquet").len();
    // Again into the same directory: every sample would be read twice.
    fails_with(
        &record_itp_args(out_s, "0.1", "60s", &[]),
        "already holds telemetry",
    );
    assert_eq!(
        files_under(&out, ".parquet").len(),
        files,
        "nothing written"
    );
    let text = record_itp(out_s, "0.1", "60s", &["--append"]);
    assert!(text.contains("recorded"), "{text}");
    assert!(files_under(&out, ".parquet").len() > files);
}

#[test]
fn bad_arguments_are_clear_errors() {
    fails_with(
        &["telemetry", "inspect", "/nonexistent/telemetry"],
        "/nonexistent/telemetry",
    );
    fails_with(
        &[
            "agent",
            "--source",
            "sim",
            "--out",
            "/tmp/x",
            "--interval",
            "0s",
        ],
        "positive duration",
    );
    fails_with(
        &[
            "telemetry",
            "record",
            "--source",
            "sim",
            "--out",
            "/tmp/x",
            "--stragglers",
            "2",
        ],
        "straggler fraction",
    );
    // A URL no retry can fix is refused at once, not retried forever.
    let dir = tempfile::tempdir().unwrap();
    fails_with(
        &[
            "agent",
            "--source",
            "sim",
            "--trace",
            "pollux-1",
            "--out",
            dir.path().to_str().unwrap(),
            "--scheduler",
            "localhost:50051",
        ],
        "scheduler URL \"localhost:50051\": no scheme",
    );
}

#[test]
fn nvml_without_a_driver_is_a_clear_error() {
    if Path::new("/dev/nvidia0").exists() {
        eprintln!("skipped: this machine has an NVIDIA GPU");
        return;
    }
    let out = marshal(&["telemetry", "topology"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("NVML"), "{err}");
}

/// The fake NVML library, built beside this test binary as a dev-dependency.
fn fake_nvml() -> String {
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().join("libmarshal_fake_nvml.so");
    assert!(path.exists(), "{} is missing", path.display());
    path.to_string_lossy().into_owned()
}

/// `marshal args` with NVML from the fake driver pretending to be `machine`.
fn with_fake_nvml(machine: &str, args: &[&str]) -> std::process::Output {
    with_fake_nvml_env(machine, &[], args)
}

/// [`with_fake_nvml`] with more of the fake's variables set.
fn with_fake_nvml_env(machine: &str, env: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_marshal"))
        .args(args)
        .args(["--nvml-lib", &fake_nvml()])
        .env("FAKE_NVML_MACHINE", machine)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// `marshal telemetry record --source nvml` from the fake driver into `out`.
fn record_fake_nvml(
    machine: &str,
    env: &[(&str, &str)],
    out: &Path,
    interval: &str,
    duration: &str,
) -> std::process::Output {
    #[rustfmt::skip]
    let args = [
        "telemetry", "record", "--source", "nvml", "--interval", interval,
        "--duration", duration, "--out", out.to_str().unwrap(),
    ];
    with_fake_nvml_env(machine, env, &args)
}

#[test]
fn nvml_nonsense_is_recorded_as_nulls_and_said_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("t");
    let out = record_fake_nvml(
        "a100-mig",
        &[("FAKE_NVML_ABSURD_GPU", "1")],
        &out_dir,
        "100ms",
        "300ms",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // Three ticks of two GPU rows and a host row; one GPU reports nonsense in three columns.
    assert!(
        err.contains(
            "warning: telemetry validation: 0 of 9 rows rejected; 9 values nulled \
             (mem_used_bytes out of range ×3, sm_util_pct out of range ×3, \
             temperature_c out of range ×3)"
        ),
        "{err}"
    );
    // A clean recording says nothing of the kind.
    let clean = record_fake_nvml("a100-mig", &[], &dir.path().join("clean"), "100ms", "200ms");
    assert!(clean.status.success());
    assert!(!String::from_utf8_lossy(&clean.stderr).contains("validation"));
}

#[test]
fn nvml_topology_of_a_bridged_server_becomes_a_node_spec() {
    let out = with_fake_nvml("pcie-bridged", &["telemetry", "topology"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let spec = &v["node_spec"];
    assert_eq!(spec["gpu_model"], "A100-80");
    assert_eq!(
        (spec["gpus"].as_u64(), spec["nvlink_domain"].as_u64()),
        (Some(4), Some(2))
    );
    assert_eq!(spec["mig_gpus"], serde_json::json!([3]));
    // The instances NVML lists, as the inventory declares them (the unreadable one left out).
    assert_eq!(
        spec["mig_layout"],
        serde_json::json!([{"gpus": [3], "instances": ["3g.40gb", "1c.2g.20gb"]}])
    );
    // What it prints is an inventory node group that builds.
    let group: marshal_scheduler::domain::NodeGroupSpec =
        serde_json::from_value(spec.clone()).unwrap();
    let cluster = marshal_scheduler::domain::ClusterSpec {
        name: "c".into(),
        nodes_per_rack: 1,
        racks_per_spine: 1,
        links: Default::default(),
        gpu_models: vec![],
        node_groups: vec![group],
    };
    let topo = marshal_scheduler::domain::Topology::build(&cluster).unwrap();
    assert_eq!(topo.mig_instances().len(), 2);
    let pairs = v["discovered"]["pairs"].as_array().unwrap();
    let level = |a: u64, b: u64| {
        pairs
            .iter()
            .find(|p| p["a"].as_u64() == Some(a) && p["b"].as_u64() == Some(b))
            .map(|p| p["level"].as_str().unwrap().to_string())
    };
    assert_eq!(level(0, 1).as_deref(), Some("nv_link"));
    assert_eq!(level(2, 3).as_deref(), Some("nv_link"));
    assert_eq!(level(1, 2).as_deref(), Some("node"));

    // A driver that cannot initialise is named, with the file it was loaded from.
    let out = with_fake_nvml("no-such-machine", &["telemetry", "topology"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("libmarshal_fake_nvml.so") && err.contains("driver is not loaded"),
        "{err}"
    );
}

#[test]
fn nvml_recording_of_an_hgx_h100_has_a_row_per_gpu_and_link_counts() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("t");
    let out = record_fake_nvml("hgx-h100", &[], &out_dir, "200ms", "600ms");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_str(&ok(&[
        "telemetry",
        "inspect",
        out_dir.to_str().unwrap(),
        "--format",
        "json",
    ]))
    .unwrap();
    let gpus = summary["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 8, "{summary}");
    for g in gpus {
        assert_eq!(g["gpu_type"], "NVIDIA H100 80GB HBM3");
        assert!(g["rows"].as_u64().unwrap() >= 3, "{g}");
    }
    // Every row has NVLink figures for all 18 links (Hopper's field values).
    let (rows, report) = marshal_telemetry::read_all::<marshal_telemetry::GpuSample>(
        &out_dir,
        marshal_telemetry::Query::new(marshal_telemetry::TelemetryKind::Gpu),
    )
    .unwrap();
    assert!(report.errors.is_empty(), "{report:?}");
    for r in &rows {
        let links = r.nvlink_tx_per_link_kib.as_ref().map(Vec::len);
        assert_eq!(links, Some(18), "GPU {} has no NVLink figures", r.gpu_index);
        assert_eq!(r.nvlink_rx_per_link_kib.as_ref().map(Vec::len), Some(18));
    }
    let rows = rows.len();
    assert!(rows >= 24, "{rows} rows");
}

#[test]
fn the_agent_finalises_its_last_file_on_sigterm() {
    if Command::new("kill").arg("-0").arg("1").output().is_err() {
        eprintln!("skipped: no `kill` command to send SIGTERM with");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("agent");
    let mut child = Command::new(env!("CARGO_BIN_EXE_marshal"))
        .args([
            "agent",
            "--source",
            "sim",
            "--trace",
            "pollux-1",
            "--interval",
            "100ms",
            "--speedup",
            "600",
            "--out",
            out.to_str().unwrap(),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until it has started sampling (the replay comes first; slow on a busy
    // machine), then let it sample for a while.
    let stderr = child.stderr.take().unwrap();
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if line.contains("sampling every") {
                let _ = started_tx.send(());
            }
        }
    });
    started_rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the agent starts sampling");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the agent runs until stopped"
    );
    Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    let status = wait_within(&mut child, Duration::from_secs(20)).expect("the agent did not stop");
    assert!(status.success());
    assert!(
        files_under(&out, ".tmp").is_empty(),
        "no unfinished file is left"
    );
    let summary: Value = serde_json::from_str(&ok(&[
        "telemetry",
        "inspect",
        out.to_str().unwrap(),
        "--format",
        "json",
    ]))
    .unwrap();
    let gpus = summary["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 4, "one g4dn node's GPUs");
    assert!(gpus[0]["rows"].as_u64().unwrap() >= 5);
}

#[test]
fn predictor_baselines_are_evaluated_on_recorded_step_profiles() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tel");
    let out_s = out.to_str().unwrap();
    record_itp(out_s, "60", "10m", &[]);
    let text = ok(&["eval", "predictor", "--telemetry", out_s]);
    assert!(text.contains("held-out jobs"), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("held-out jobs"))
        .unwrap();
    let mapes: Vec<f64> = line
        .split_whitespace()
        .filter_map(|w| w.strip_suffix('%')?.parse().ok())
        .collect();
    assert_eq!(mapes.len(), 2, "{line}");
    assert!(mapes.iter().all(|m| m.is_finite() && *m >= 0.0), "{line}");
    fails_with(
        &[
            "eval",
            "predictor",
            "--telemetry",
            out_s,
            "--model",
            "/nonexistent",
            "--cluster",
            "elasticflow-128",
        ],
        "/nonexistent",
    );

    // Train a (tiny) predictor end to end, save it, load it back for evaluation.
    let model = dir.path().join("model");
    let text = ok(&[
        "train",
        "predictor",
        "--telemetry",
        out_s,
        "--cluster",
        "elasticflow-128",
        "--out",
        model.to_str().unwrap(),
        "--max-epochs",
        "3",
    ]);
    assert!(text.contains("held-out jobs: learned"), "{text}");
    for file in [
        "meta.json",
        "config.json",
        "normalization.json",
        "history.json",
    ] {
        assert!(model.join(file).is_file(), "{file} missing");
    }
    let meta = std::fs::read_to_string(model.join("meta.json")).unwrap();
    assert!(meta.contains("holdout_jobs_step_time_mape"), "{meta}");
    let text = ok(&[
        "eval",
        "predictor",
        "--telemetry",
        out_s,
        "--model",
        model.to_str().unwrap(),
        "--cluster",
        "elasticflow-128",
    ]);
    assert!(
        text.contains("learned predictor on held-out jobs"),
        "{text}"
    );
    // A corrupted artifact is refused with a reason, not a crash.
    std::fs::write(model.join("meta.json"), b"{ not json").unwrap();
    fails_with(
        &[
            "eval",
            "predictor",
            "--telemetry",
            out_s,
            "--model",
            model.to_str().unwrap(),
            "--cluster",
            "elasticflow-128",
        ],
        "meta.json",
    );
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    fails_with(
        &["eval", "predictor", "--telemetry", empty.to_str().unwrap()],
        "no usable step profiles in",
    );
    fails_with(
        &["eval", "predictor", "--telemetry", empty.to_str().unwrap()],
        "no step-profile files",
    );
    // Recorded on A100s: a cluster of H100s knows nothing of their GPUs.
    fails_with(
        &[
            "train",
            "predictor",
            "--telemetry",
            out_s,
            "--cluster",
            "dgx-h100-64",
            "--out",
            dir.path().join("h100").to_str().unwrap(),
        ],
        "all are examples of GPU types that cluster `dgx-h100-64` does not have: \"A100",
    );
}

#[test]
fn prune_deletes_the_days_older_than_asked_and_leaves_other_files() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tel");
    let out_s = out.to_str().unwrap();
    record_itp(out_s, "0.1", "60s", &[]); // dated November 2023
    let files = files_under(&out, ".parquet");
    assert!(!files.is_empty());

    let text = ok(&["telemetry", "prune", out_s, "--older-than", "3000d"]);
    assert!(text.contains("0 files"), "{text}");
    assert_eq!(files_under(&out, ".parquet").len(), files.len());

    // Someone's note beside the data is not telemetry: it stays, with its directory.
    let note = files[0].parent().unwrap().join("NOTES.txt");
    std::fs::write(&note, "keep me").unwrap();
    let text = ok(&["telemetry", "prune", out_s, "--older-than", "1d"]);
    assert!(text.contains(&format!("{} files", files.len())), "{text}");
    assert!(files_under(&out, ".parquet").is_empty());
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "keep me");

    fails_with(
        &["telemetry", "prune", out_s, "--older-than", "0d"],
        "positive duration",
    );
}

#[test]
fn an_agent_whose_connected_side_cannot_start_exits_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    // Where the agent keeps its assignments there is a file: no retry fixes that.
    std::fs::write(dir.path().join("assignments"), "in the way").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_marshal"))
        .args([
            "agent",
            "--source",
            "sim",
            "--trace",
            "pollux-1",
            "--out",
            dir.path().to_str().unwrap(),
            "--scheduler",
            "http://127.0.0.1:1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_within(&mut child, Duration::from_secs(60))
        .expect("the agent kept sampling after its connected side failed");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success());
    assert!(
        err.contains("connected agent") && err.contains("assignments"),
        "{err}"
    );
}

#[test]
fn a_directory_another_agent_holds_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // What a running agent holds.
    let lock = std::fs::File::create(dir.path().join(".marshal-writer.lock")).unwrap();
    lock.try_lock().unwrap();
    let out = dir.path().to_str().unwrap();
    fails_with(
        &[
            "agent", "--source", "sim", "--trace", "pollux-1", "--out", out,
        ],
        "in use by another marshal agent or recording",
    );
    fails_with(
        &record_itp_args(out, "0.1", "60s", &["--append"]),
        "in use by another marshal agent or recording",
    );
    // Once it is gone, the directory is free.
    drop(lock);
    record_itp(out, "0.1", "60s", &["--append"]);
}
