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

#[test]
fn telemetry_files_open_in_pyarrow_with_the_documented_schema() {
    let python = match python_with_pyarrow() {
        Ok(p) => p,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
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
    let check = Command::new(&python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop_check.py"))
        .arg(&out)
        .arg((61 * 64).to_string())
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "pyarrow check failed:\n{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    eprintln!("{}", String::from_utf8_lossy(&check.stdout));
}
