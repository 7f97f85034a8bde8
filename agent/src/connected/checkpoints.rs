//! Checkpoint files of `--exec` workers. Each worker gets `MARSHAL_CHECKPOINT_FILE`, a
//! path of its own under the agent's directory (`jobs/checkpoints/<job>.<worker>.<attempt>`),
//! and touches (or writes) it whenever it has written a checkpoint. The agent polls
//! the files' modification times and reports the newest of a job's workers on this
//! node as the job's last checkpoint in a RUNNING report, so that the scheduler knows
//! how much work moving the job would lose. The agent never creates the file: until
//! the worker does, nothing is reported.
//!
//! A modification time in the future (a file copied with `cp -p` or `rsync -t`, `touch -d`,
//! an NFS server whose clock is ahead) says only that a checkpoint exists now: it is
//! reported as now, and the file counts as changed whenever its time changes, not only
//! when it grows. (Compared with "newer than the last seen", one future time would hide
//! every later checkpoint of the attempt, and the scheduler refuses times ahead of its
//! clock, so none would have been reported at all.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::connected::Incarnation;

/// The variable that tells a worker where its checkpoint file is.
pub const ENV_VAR: &str = "MARSHAL_CHECKPOINT_FILE";

#[derive(Debug)]
pub struct Checkpoints {
    dir: PathBuf,
    /// (job, attempt) → the newest file time seen, and the time reported for it.
    seen: BTreeMap<(u64, u32), Seen>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Seen {
    /// The newest modification time among the job's files (Unix seconds).
    file: f64,
    /// What was reported: `file`, or the agent's clock when `file` was ahead of it.
    reported: f64,
}

impl Checkpoints {
    pub fn open(dir: PathBuf) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        Ok(Checkpoints {
            dir,
            seen: BTreeMap::new(),
        })
    }

    /// The file of incarnation `i` (per attempt: a file left by an earlier placement
    /// never counts for a later one).
    pub fn path(&self, i: &Incarnation) -> PathBuf {
        self.dir
            .join(format!("{}.{}.{}", i.job, i.worker, i.attempt))
    }

    /// A new start of `i`: a file left by an earlier run of the same incarnation (an
    /// agent that died before it was cleaned up) is not this run's checkpoint.
    pub fn reset(&mut self, i: &Incarnation) {
        let _ = std::fs::remove_file(self.path(i));
    }

    /// The (job, attempt)s of `live` whose newest checkpoint file time changed since
    /// the last poll, with the time to report (never later than now); remembered.
    pub fn poll<'a>(
        &mut self,
        live: impl Iterator<Item = &'a Incarnation>,
    ) -> Vec<((u64, u32), f64)> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let mut newest: BTreeMap<(u64, u32), f64> = BTreeMap::new();
        for i in live {
            if let Some(t) = modified_unix_s(&self.path(i)) {
                let e = newest.entry((i.job, i.attempt)).or_insert(t);
                *e = e.max(t);
            }
        }
        let mut changed = Vec::new();
        for (key, file) in newest {
            if self.seen.get(&key).is_some_and(|s| s.file == file) {
                continue;
            }
            let reported = file.min(now);
            self.seen.insert(key, Seen { file, reported });
            changed.push((key, reported));
        }
        changed
    }

    /// The newest checkpoint reported for `job` at `attempt`; 0 (the protocol's
    /// "unknown") when none.
    pub fn last(&self, job: u64, attempt: u32) -> f64 {
        self.seen.get(&(job, attempt)).map_or(0.0, |s| s.reported)
    }

    /// `i` ended: its file goes, and the job's time once `others` (whether another
    /// worker of the same job and attempt still runs here) is false.
    pub fn forget(&mut self, i: &Incarnation, others: bool) {
        let _ = std::fs::remove_file(self.path(i));
        if !others {
            self.seen.remove(&(i.job, i.attempt));
        }
    }
}

fn modified_unix_s(path: &Path) -> Option<f64> {
    let modified = std::fs::metadata(path).ok()?.modified().ok()?;
    Some(modified.duration_since(UNIX_EPOCH).ok()?.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;

    fn touch(path: &Path, unix_s: u64) {
        let f = std::fs::File::create(path).unwrap();
        f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(unix_s))
            .unwrap();
    }

    #[test]
    fn a_touched_file_is_reported_once_per_change_and_the_newest_worker_wins() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Checkpoints::open(dir.path().join("checkpoints")).unwrap();
        let w0 = Incarnation {
            job: 5,
            worker: 0,
            attempt: 2,
        };
        let w1 = Incarnation { worker: 1, ..w0 };
        let live = [w0, w1];
        // Nothing written yet: nothing to report.
        assert!(c.poll(live.iter()).is_empty());
        assert_eq!(c.last(5, 2), 0.0);

        touch(&c.path(&w0), 1_000);
        touch(&c.path(&w1), 1_500);
        assert_eq!(c.poll(live.iter()), vec![((5, 2), 1_500.0)]);
        // Unchanged: not again.
        assert!(c.poll(live.iter()).is_empty());
        touch(&c.path(&w0), 2_000);
        assert_eq!(c.poll(live.iter()), vec![((5, 2), 2_000.0)]);
        assert_eq!(c.last(5, 2), 2_000.0);

        c.forget(&w0, true);
        assert!(!c.path(&w0).exists());
        assert_eq!(c.last(5, 2), 2_000.0);
        c.forget(&w1, false);
        assert_eq!(c.last(5, 2), 0.0);
    }

    #[test]
    fn a_time_in_the_future_is_reported_as_now_and_hides_no_later_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Checkpoints::open(dir.path().to_path_buf()).unwrap();
        let w = Incarnation {
            job: 3,
            worker: 0,
            attempt: 1,
        };
        let now = || {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_secs()
        };
        // Copied with its times from a machine an hour ahead.
        touch(&c.path(&w), now() + 3_600);
        let polled = c.poll([w].iter());
        assert_eq!(polled.len(), 1);
        let reported = polled[0].1;
        assert!(
            reported <= now() as f64 + 1.0,
            "{reported} is in the future"
        );
        assert_eq!(c.last(3, 1), reported);
        assert!(c.poll([w].iter()).is_empty(), "unchanged: not again");
        // The worker's next checkpoint, by this machine's clock, is reported.
        let next = now();
        touch(&c.path(&w), next);
        assert_eq!(c.poll([w].iter()), vec![((3, 1), next as f64)]);
    }

    #[test]
    fn a_file_left_by_an_earlier_run_is_cleared_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Checkpoints::open(dir.path().to_path_buf()).unwrap();
        let w = Incarnation {
            job: 1,
            worker: 0,
            attempt: 1,
        };
        touch(&c.path(&w), 1_000);
        c.reset(&w);
        assert!(c.poll([w].iter()).is_empty());
    }
}
