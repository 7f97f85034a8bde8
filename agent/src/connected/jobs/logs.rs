//! Retention of `--exec` workers' logs (`OUT/jobs/<job>.<worker>.<attempt>.log`): with
//! `--retention`, logs last written longer ago are deleted, hourly, except those of
//! workers still running here or waiting for their report (a quiet worker's log can be
//! old and still be its only record). A node running many short jobs otherwise
//! collects a log per worker per attempt for good.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::SystemTime;

use super::Incarnation;

/// The log file of `inc`, relative to the logs directory.
pub(super) fn log_name(inc: &Incarnation) -> String {
    format!("{}.{}.log", inc.file_stem(), inc.attempt)
}

/// Deletes the `*.log` files directly in `dir` last modified before `before`, except
/// those of `keep`. Returns how many went; failures are logged and tried next time.
pub(super) fn prune_logs<'a>(
    dir: &Path,
    before: SystemTime,
    keep: impl Iterator<Item = &'a Incarnation>,
) -> usize {
    let keep: BTreeSet<String> = keep.map(log_name).collect();
    let wanted = |name: &str| name.ends_with(".log") && !keep.contains(name);
    marshal_scheduler::decision_log::prune_files(dir, before, wanted, "agent: worker-log retention")
        .files as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn expired_logs_go_except_those_of_live_workers() {
        let dir = tempfile::tempdir().unwrap();
        let day = Duration::from_secs(86_400);
        let inc = |job| Incarnation {
            job,
            worker: 0,
            attempt: 1,
        };
        let write = |name: &str, age: Duration| {
            let path = dir.path().join(name);
            std::fs::write(&path, b"x").unwrap();
            let f = std::fs::File::options().write(true).open(&path).unwrap();
            f.set_modified(SystemTime::now() - age).unwrap();
            path
        };
        let expired = write(&log_name(&inc(1)), 40 * day);
        let live_but_quiet = write(&log_name(&inc(2)), 40 * day);
        let recent = write(&log_name(&inc(3)), day);
        let not_a_log = write("notes.txt", 40 * day);
        std::fs::create_dir(dir.path().join("state.log")).unwrap();
        let live = [inc(2)];
        let n = prune_logs(dir.path(), SystemTime::now() - 30 * day, live.iter());
        assert_eq!(n, 1);
        assert!(!expired.exists());
        assert!(live_but_quiet.exists() && recent.exists() && not_a_log.exists());
        assert!(dir.path().join("state.log").is_dir());
    }
}
