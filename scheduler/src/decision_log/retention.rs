//! Retention of the decision log: its finished files last modified before a horizon are
//! deleted, so that a server running for months does not fill its disk with a file per
//! flush. Age is the file's modification time (the time it was written): decision files
//! are named by decision id, not time, and the rows' own times would mean reading every
//! file. Only the writer's own finished files go (`part-*.parquet` in `decisions/` and
//! `outcomes/`); hidden temporary files and anything else are left alone.

use std::path::Path;
use std::time::SystemTime;

use super::{DECISIONS_DIR, OUTCOMES_DIR};

/// What a sweep did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    pub files: u64,
    /// Files that could not be examined or deleted (logged; tried again next sweep).
    pub errors: u64,
}

/// Deletes the decision log's files under `dir` last modified before `before`.
pub fn prune_log(dir: &Path, before: SystemTime) -> Pruned {
    let mut done = Pruned::default();
    for sub in [DECISIONS_DIR, OUTCOMES_DIR] {
        let one = prune_files(
            &dir.join(sub),
            before,
            |name| name.starts_with("part-") && name.ends_with(".parquet"),
            "decision log retention",
        );
        done.files += one.files;
        done.errors += one.errors;
    }
    done
}

/// Deletes the plain files directly in `dir` whose name `wanted` accepts and that were
/// last modified before `before` (a missing `dir` has none). Failures are logged, with
/// `what` saying whose retention it is, and counted; a later sweep tries again. Shared
/// by the decision log and the agent's worker logs.
pub fn prune_files(
    dir: &Path,
    before: SystemTime,
    wanted: impl Fn(&str) -> bool,
    what: &str,
) -> Pruned {
    let mut done = Pruned::default();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return done,
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "{what}: cannot list");
            done.errors += 1;
            return done;
        }
    };
    for entry in entries.flatten() {
        if !wanted(&entry.file_name().to_string_lossy()) {
            continue;
        }
        let path = entry.path();
        let expired = entry
            .metadata()
            .and_then(|m| Ok(m.is_file() && m.modified()? < before));
        match expired.and_then(|old| {
            if old {
                std::fs::remove_file(&path).map(|()| true)
            } else {
                Ok(false)
            }
        }) {
            Ok(true) => done.files += 1,
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(file = %path.display(), %error, "{what}: cannot delete");
                done.errors += 1;
            }
        }
    }
    if done.files > 0 {
        tracing::info!(dir = %dir.display(), files = done.files, "{what}: deleted expired files");
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn touch(path: &Path, age: Duration) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"x").unwrap();
        let f = std::fs::File::options().write(true).open(path).unwrap();
        f.set_modified(SystemTime::now() - age).unwrap();
    }

    #[test]
    fn only_the_writers_expired_files_are_deleted() {
        let tmp = tempfile::tempdir().unwrap();
        let day = Duration::from_secs(86_400);
        let old = tmp
            .path()
            .join("decisions/part-00000000000000000001-000000.parquet");
        let new = tmp
            .path()
            .join("decisions/part-00000000000000000009-000001.parquet");
        let old_outcome = tmp
            .path()
            .join("outcomes/part-00000001700000000000-000002.parquet");
        let foreign = tmp.path().join("decisions/notes.parquet");
        let hidden = tmp.path().join("decisions/.part-1.parquet.tmp-7");
        touch(&old, 40 * day);
        touch(&new, day);
        touch(&old_outcome, 40 * day);
        touch(&foreign, 40 * day);
        touch(&hidden, 40 * day);
        let done = prune_log(tmp.path(), SystemTime::now() - 30 * day);
        assert_eq!(
            done,
            Pruned {
                files: 2,
                errors: 0
            }
        );
        assert!(!old.exists() && !old_outcome.exists());
        assert!(new.exists() && foreign.exists() && hidden.exists());
        // A log directory not created yet is not an error.
        let none = prune_log(&tmp.path().join("absent"), SystemTime::now());
        assert_eq!(none, Pruned::default());
    }
}
