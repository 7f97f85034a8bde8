//! The telemetry files open in pyarrow with the documented schema. Installs pyarrow into
//! a virtual environment under the target directory on first run; skips with a message
//! when Python or the package index is not available.

use std::path::{Path, PathBuf};
use std::process::Command;

fn python_with_pyarrow() -> Result<PathBuf, String> {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pyarrow-venv");
    let python = venv.join("bin/python");
    let has_pyarrow = |p: &Path| {
        Command::new(p)
            .args(["-c", "import pyarrow"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if has_pyarrow(&python) {
        return Ok(python);
    }
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .output()
        .map_err(|e| format!("no python3 ({e})"))?;
    if !made.status.success() {
        return Err(format!(
            "python3 -m venv failed: {}",
            String::from_utf8_lossy(&made.stderr)
        ));
    }
    let pip = Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "pyarrow"])
        .output()
        .map_err(|e| format!("pip did not run ({e})"))?;
    if !pip.status.success() || !has_pyarrow(&python) {
        return Err(format!(
            "pip install pyarrow failed: {}",
            String::from_utf8_lossy(&pip.stderr)
        ));
    }
    Ok(python)
}

/// Python with pyarrow, or `None` after saying why the test is skipped.
fn python_or_skip() -> Option<PathBuf> {
    python_with_pyarrow()
        .map_err(|why| eprintln!("skipped: {why}"))
        .ok()
}

/// At the default ZSTD level and at one of ZSTD's fast levels (which parquet-rs's own
/// writer cannot produce).
#[test]
fn telemetry_files_open_in_pyarrow_with_the_documented_schema() {
    let Some(python) = python_or_skip() else {
        return;
    };
    for level in ["1", "-5"] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("tel");
        let rec = Command::new(env!("CARGO_BIN_EXE_marshal"))
            .args([
                "telemetry",
                "record",
                "--source",
                "sim",
                "--trace",
                "pollux-1",
                "--hours",
                "1",
                "--interval",
                "60s",
                "--zstd-level",
                level,
                "--out",
            ])
            .arg(&out)
            .output()
            .unwrap();
        assert!(
            rec.status.success(),
            "{}",
            String::from_utf8_lossy(&rec.stderr)
        );
        // 61 ticks × 64 GPUs.
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop_check.py");
        run_check(
            Command::new(&python)
                .arg(script)
                .arg(&out)
                .arg((61 * 64).to_string()),
        );
    }
}

/// Runs a pyarrow check and prints what it says; its failure fails the test.
fn run_check(command: &mut Command) {
    let check = command.output().unwrap();
    assert!(
        check.status.success(),
        "pyarrow check failed:\n{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    eprintln!("{}", String::from_utf8_lossy(&check.stdout));
}

/// Per-link NVLink counters (lists: a dozen links, empty, null, and a whole file of
/// nulls) and MIG mode (runs of both values and of nulls, and a whole file of nulls)
/// read back in pyarrow as written. The simulated source has neither, so the samples
/// are written through the sink here.
#[test]
fn per_link_counters_and_mig_mode_open_in_pyarrow() {
    use marshal_telemetry::{GpuSample, SinkConfig, TelemetrySink};

    let Some(python) = python_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tel");
    let sink = TelemetrySink::open(SinkConfig::new(&out)).unwrap();
    // 2025-03-14T00:00:00Z, one sample a second for an hour, two GPUs; the rule for
    // each row's lists is repeated in the Python check below.
    let t0 = 1_741_910_400_000_000i64;
    let samples: Vec<GpuSample> = (0..3600i64)
        .flat_map(|s| {
            (0..2u16).map(move |gpu| {
                let links = |base: u64| match (gpu, s % 7) {
                    (1, _) => None,
                    (_, 0) => None,
                    (_, 1) => Some(vec![]),
                    _ => Some((0..12).map(|k| base + s as u64 * 100 + k).collect()),
                };
                GpuSample {
                    timestamp_us: t0 + s * 1_000_000,
                    cluster: "c1".into(),
                    node: format!("n{gpu}").into(),
                    gpu_index: gpu,
                    gpu_uuid: format!("GPU-{gpu}").into(),
                    gpu_type: "NVIDIA A100-SXM4-80GB".into(),
                    nvlink_tx_per_link_kib: links(1 << 40),
                    nvlink_rx_per_link_kib: links(7),
                    mig_mode: match (gpu, s / 600) {
                        (1, _) | (_, 2) => None,
                        (_, 1 | 4) => Some(true),
                        _ => Some(false),
                    },
                    ..Default::default()
                }
            })
        })
        .collect();
    sink.send(samples).unwrap();
    sink.finish().unwrap();
    let script = r#"
import sys, pyarrow.dataset as ds
part = ds.HivePartitioning.discover(infer_dictionary=True)
t = ds.dataset(sys.argv[1] + "/kind=gpu", format="parquet", partitioning=part).to_table()
assert t.num_rows == 7200, t.num_rows
t0 = 1_741_910_400_000_000
checked = 0
for ts, gpu, tx, rx, mig in zip(t.column("timestamp").cast("int64").to_pylist(), t.column("gpu_index").to_pylist(),
                                t.column("nvlink_tx_per_link_kib").to_pylist(), t.column("nvlink_rx_per_link_kib").to_pylist(),
                                t.column("mig_mode").to_pylist()):
    s = (ts - t0) // 1_000_000
    want_mig = None if gpu == 1 or s // 600 == 2 else s // 600 in (1, 4)
    assert mig == want_mig, (ts, gpu, mig)
    def want(base):
        if gpu == 1 or s % 7 == 0:
            return None
        if s % 7 == 1:
            return []
        return [base + s * 100 + k for k in range(12)]
    assert tx == want(1 << 40), (ts, gpu, tx)
    assert rx == want(7), (ts, gpu, rx)
    checked += 1
print(f"per-link lists and MIG mode: {checked} rows as written")
"#;
    run_check(Command::new(&python).args(["-c", script]).arg(&out));
}
