//! Adoption: a restarted agent takes over the `--exec` workers an earlier agent on the
//! same out directory left running, and reports those that ended while none watched.

use marshal_scheduler::service::pb;
use tokio::sync::oneshot;

use super::{Exit, Live, Runner};
use crate::connected::procfs::ProcessIdentity;
use crate::connected::records::{RecordStore, Unreadable, WorkerRecord};
use crate::connected::supervisor::{self, Seen};

/// What [`Runner::adopt_survivors`] found in the state directory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Adoption {
    /// Still running: adopted and watched.
    pub running: usize,
    /// Ended with a recorded exit status while no agent watched: reported from it.
    pub finished: usize,
    /// Gone without an exit status (killed, or the node rebooted): reported FAILED.
    pub lost: usize,
    /// Records that could not be read (each logged with its path).
    pub unreadable: usize,
}

impl Runner {
    /// Adopts the `--exec` workers an earlier agent on this out directory left: every
    /// record in `OUT/jobs/state`. Call once, before the first registration, so that it
    /// lists them. A worker still running (same pid, same start time, same boot) is
    /// watched as if started here and keeps its MIG instances; one that ended with an
    /// exit status is reported from it; one gone without is reported FAILED as lost.
    ///
    /// A record that cannot be read is logged with its path and skipped. If its file
    /// name still says which worker it was about (`<job>.<worker>.<attempt>.json`), that
    /// worker is reported from its exit status if it left one, FAILED as lost
    /// otherwise: the agent cannot find or kill a process it cannot identify, so it
    /// does not pretend the job still runs. A file whose name says nothing is left
    /// alone.
    pub fn adopt_survivors(&mut self) -> Adoption {
        let mut found = Adoption::default();
        let Some(store) = self.records.clone() else {
            return found;
        };
        let (records, unreadable) = match store.load_all() {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "worker records not read: none adopted");
                return found;
            }
        };
        for record in records {
            match self.adopt(record, &store) {
                Kept::Running => found.running += 1,
                Kept::Finished => found.finished += 1,
                Kept::Lost => found.lost += 1,
            }
        }
        for bad in unreadable {
            found.unreadable += 1;
            self.give_up_on(bad, &store);
        }
        found
    }

    /// Takes over one recorded worker: watched when it runs, its end queued as an exit
    /// when it has ended.
    fn adopt(&mut self, record: WorkerRecord, store: &RecordStore) -> Kept {
        let inc = record.incarnation();
        let identity = ProcessIdentity {
            pid: record.pid,
            start_ticks: record.start_ticks,
        };
        let seen = if record.boot_id == self.boot_id {
            supervisor::look_at(identity, &inc, store)
        } else {
            // Started under another boot: whatever holds its pid now is a stranger.
            Ok(match store.exit_status(&inc) {
                Ok(Some(status)) => Seen::Finished(supervisor::outcome_of(status)),
                _ => Seen::Vanished,
            })
        };
        let gpus: Vec<pb::GpuSlot> = record.gpus.iter().map(pb::GpuSlot::from).collect();
        for uuid in &record.mig_uuids {
            if let Err(why) = self.mig.restore(inc, uuid) {
                tracing::warn!(job = inc.job, worker = inc.worker, %why, "MIG claim not restored");
            }
        }
        self.journal_entry(inc, &gpus, true, true);
        self.backlog.set_job(&gpus, Some(inc.job));
        let mut live = Live {
            gpus,
            kill: None,
            task: None,
        };
        let (kept, ended) = match seen {
            Ok(Seen::Running) | Err(_) => {
                if let Err(e) = &seen {
                    // Not knowing is not an end: it is watched, and the watch retries.
                    tracing::warn!(job = inc.job, worker = inc.worker, error = %e, "cannot look at a recorded worker; adopting it");
                }
                let (kill, control) = oneshot::channel();
                live.kill = Some(kill);
                live.task = Some(tokio::spawn(supervisor::watch_adopted(
                    identity,
                    inc,
                    store.clone(),
                    control,
                    self.exits.clone(),
                    self.stop_grace,
                )));
                self.owe(
                    inc,
                    pb::JobState::Running,
                    format!("running: {} (adopted, pid {})", record.command, record.pid),
                );
                (Kept::Running, None)
            }
            Ok(Seen::Finished(outcome)) => (Kept::Finished, Some(outcome)),
            Ok(Seen::Vanished) => (
                Kept::Lost,
                Some(Err(if record.boot_id == self.boot_id {
                    format!(
                        "lost while the agent was down: process {} is gone and recorded no exit status (it or its supervising shell was killed)",
                        record.pid
                    )
                } else {
                    "lost while the agent was down: the node rebooted".to_string()
                })),
            ),
        };
        self.live.insert(inc, live);
        if let Some(outcome) = ended {
            let _ = self.exits.send(Exit {
                incarnation: inc,
                outcome,
            });
        }
        kept
    }

    /// An unreadable record: logged; the worker its file name names (if any) is
    /// reported from its exit status, or as lost. If the record still names a process
    /// that runs (same pid, start time and boot), that process group is killed: this
    /// agent cannot supervise it, and the scheduler, told it failed, gives its GPUs to
    /// other work.
    fn give_up_on(&mut self, bad: Unreadable, store: &RecordStore) {
        tracing::error!(path = %bad.path.display(), error = %bad.error, "unreadable worker record skipped");
        let Some(inc) = bad.incarnation else {
            return;
        };
        if self.live.contains_key(&inc) {
            return;
        }
        let killed = bad.process.as_ref().and_then(|p| {
            let identity = ProcessIdentity {
                pid: p.pid,
                start_ticks: p.start_ticks,
            };
            let running = p.boot_id == self.boot_id
                && crate::connected::procfs::is_running(identity).unwrap_or(false);
            running.then(|| {
                tracing::warn!(
                    job = inc.job,
                    worker = inc.worker,
                    pid = p.pid,
                    "killing the process of an unreadable worker record"
                );
                tokio::spawn(supervisor::kill_group(p.pid));
                p.pid
            })
        });
        let outcome = match (store.exit_status(&inc), killed) {
            (Ok(Some(status)), _) => supervisor::outcome_of(status),
            (_, Some(pid)) => Err(format!(
                "its state record {} is unreadable ({}), so the agent cannot supervise it: its process group {pid} was killed",
                bad.path.display(),
                bad.error
            )),
            _ => Err(format!(
                "lost while the agent was down: its state record {} is unreadable ({}); a process of it still running is no longer supervised",
                bad.path.display(),
                bad.error
            )),
        };
        self.journal_entry(inc, &[], true, true);
        self.live.insert(
            inc,
            Live {
                gpus: Vec::new(),
                kill: None,
                task: None,
            },
        );
        let _ = self.exits.send(Exit {
            incarnation: inc,
            outcome,
        });
    }
}

/// What became of one recorded worker.
enum Kept {
    Running,
    Finished,
    Lost,
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::{Duration, Instant};

    use tokio::sync::mpsc;

    use super::*;
    use crate::connected::Backlog;
    use crate::connected::jobs::tests::{mig_start, start};
    use crate::connected::jobs::{Incarnation, Mode};
    use crate::connected::procfs;
    use crate::connected::records::{HeldGpu, RecordStore, WorkerRecord};

    /// A runner on an existing out directory: what a restarted agent builds.
    fn runner_in(
        dir: &Path,
        mode: Mode,
        mig: Vec<marshal_telemetry::MigInstance>,
    ) -> (Runner, mpsc::UnboundedReceiver<Exit>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let backlog = Backlog::new("n-0", 8);
        let r = Runner::new("n-0", mode, dir, tx, backlog, None, mig).unwrap();
        (r, rx)
    }

    fn records(dir: &Path) -> RecordStore {
        RecordStore::open(dir.join("jobs/state")).unwrap()
    }

    fn state_files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir.join("jobs/state"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// The next exit, within `limit`.
    async fn next_exit(rx: &mut mpsc::UnboundedReceiver<Exit>, limit: Duration) -> Exit {
        tokio::time::timeout(limit, rx.recv())
            .await
            .expect("no exit in time")
            .unwrap()
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_worker_left_running_is_adopted_and_its_exit_status_reported_once() {
        let dir = tempfile::tempdir().unwrap();
        let runs = dir.path().join("runs");
        let cmd = format!("echo run >> '{}'; sleep 1; exit 3", runs.display());
        let (mut first, _rx) = runner_in(dir.path(), Mode::Exec(cmd.clone()), Vec::new());
        first.start(&start(5, 1, &[2])).await;
        first.shut_down(false).await;
        drop(first);
        assert_eq!(state_files(dir.path()), vec!["5.0.1.json"]);
        // The next agent on the same directory: adopted, listed, not started again.
        let (mut second, mut rx) = runner_in(dir.path(), Mode::Exec(cmd), Vec::new());
        let adopted = second.adopt_survivors();
        assert_eq!(
            adopted,
            Adoption {
                running: 1,
                ..Default::default()
            }
        );
        assert_eq!(
            second.running_list(),
            vec![pb::RunningJob {
                job_id: 5,
                attempt: 1
            }]
        );
        assert_eq!(second.live().copied().collect::<Vec<_>>().len(), 1);
        // The scheduler's snapshot re-sends its START: ignored, it runs already.
        second.sync(&[start(5, 1, &[2])]).await;
        assert_eq!(second.starts, 0);
        let exit = next_exit(&mut rx, Duration::from_secs(10)).await;
        second.exited(exit);
        let (state, msg) = second.reports[&(5, 1)].clone();
        assert_eq!(state, pb::JobState::Failed);
        assert!(msg.contains("exit status: 3"), "{msg}");
        assert_eq!(std::fs::read_to_string(&runs).unwrap(), "run\n");
        // Until the report is taken, the record and exit status stay (another restart
        // would report them again); then they go.
        assert_eq!(state_files(dir.path()), vec!["5.0.1.exit", "5.0.1.json"]);
        second.settle_report(5, 1, state);
        assert!(state_files(dir.path()).is_empty());
        assert!(
            tokio::time::timeout(Duration::from_millis(300), rx.recv())
                .await
                .is_err(),
            "reported twice"
        );
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn an_exit_while_no_agent_ran_is_reported_from_its_status() {
        let dir = tempfile::tempdir().unwrap();
        let (mut first, _rx) = runner_in(dir.path(), Mode::Exec("exit 0".into()), Vec::new());
        first.start(&start(6, 2, &[0])).await;
        first.shut_down(false).await;
        drop(first);
        let store = records(dir.path());
        let i = Incarnation {
            job: 6,
            worker: 0,
            attempt: 2,
        };
        let t = Instant::now();
        while store.exit_status(&i).unwrap().is_none() {
            assert!(t.elapsed() < Duration::from_secs(5));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (mut second, mut rx) = runner_in(dir.path(), Mode::Exec("exit 0".into()), Vec::new());
        assert_eq!(second.adopt_survivors().finished, 1);
        second.exited(next_exit(&mut rx, Duration::from_secs(1)).await);
        assert_eq!(second.reports[&(6, 2)].0, pb::JobState::Completed);
        assert!(second.live().next().is_none());
    }

    fn record_of(i: Incarnation, pid: u32, start_ticks: u64, boot_id: &str) -> WorkerRecord {
        WorkerRecord {
            job: i.job,
            worker: i.worker,
            attempt: i.attempt,
            gpus: vec![HeldGpu {
                index: 1,
                milli: 1000,
                mig_compute: 0,
                mig_memory: 0,
            }],
            mig_uuids: Vec::new(),
            pid,
            start_ticks,
            boot_id: boot_id.into(),
            command: "sleep 100".into(),
            version: crate::connected::records::RECORD_VERSION,
        }
    }

    fn inc(job: u64) -> Incarnation {
        Incarnation {
            job,
            worker: 0,
            attempt: 1,
        }
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_reused_pid_a_vanished_process_and_a_reboot_are_lost_workers() {
        let dir = tempfile::tempdir().unwrap();
        let store = records(dir.path());
        let boot = procfs::boot_id().unwrap();
        // A live process (this test) under the recorded pid, started at another time:
        // the pid was reused, the worker is not it.
        let me = procfs::identify(std::process::id()).unwrap();
        store
            .write(&record_of(inc(1), me.pid, me.start_ticks + 1, &boot))
            .unwrap();
        // No process at all: Linux never hands out a pid above 2^22.
        store
            .write(&record_of(inc(2), 4_194_305, 1, &boot))
            .unwrap();
        // Recorded under another boot; the same pid and start time as this very
        // process, which must not fool it.
        store
            .write(&record_of(
                inc(3),
                me.pid,
                me.start_ticks,
                "an-earlier-boot",
            ))
            .unwrap();
        let (mut r, mut rx) = runner_in(dir.path(), Mode::Exec("true".into()), Vec::new());
        assert_eq!(
            r.adopt_survivors(),
            Adoption {
                lost: 3,
                ..Default::default()
            }
        );
        for _ in 0..3 {
            r.exited(next_exit(&mut rx, Duration::from_secs(1)).await);
        }
        for job in [1, 2, 3] {
            let (state, msg) = &r.reports[&(job, 1)];
            assert_eq!(*state, pb::JobState::Failed, "job {job}");
            assert!(msg.contains("lost while the agent was down"), "{msg}");
        }
        assert!(r.reports[&(3, 1)].1.contains("rebooted"));
        assert!(r.live().next().is_none());
        // Nobody was killed: this process is still here to check.
        assert!(procfs::is_running(me).unwrap());
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn an_unreadable_record_is_skipped_and_its_named_worker_reported_lost() {
        let dir = tempfile::tempdir().unwrap();
        let store = records(dir.path());
        let state = dir.path().join("jobs/state");
        std::fs::write(state.join("8.0.1.json"), b"{\"job\": 8, \"work").unwrap();
        std::fs::write(state.join("9.0.1.json"), b"not json").unwrap();
        std::fs::write(store.exit_path(&inc(9)), b"0\n").unwrap();
        std::fs::write(state.join("scratch.json"), b"???").unwrap();
        let (mut r, mut rx) = runner_in(dir.path(), Mode::Exec("true".into()), Vec::new());
        assert_eq!(
            r.adopt_survivors(),
            Adoption {
                unreadable: 3,
                ..Default::default()
            }
        );
        for _ in 0..2 {
            r.exited(next_exit(&mut rx, Duration::from_secs(1)).await);
        }
        let (state8, msg) = r.reports[&(8, 1)].clone();
        assert_eq!(state8, pb::JobState::Failed);
        assert!(
            msg.contains("lost while the agent was down") && msg.contains("8.0.1.json"),
            "{msg}"
        );
        // Its exit status survived the record: that is what is reported.
        assert_eq!(r.reports[&(9, 1)].0, pb::JobState::Completed);
        // A file that names no worker is left alone.
        assert!(rx.try_recv().is_err());
        r.settle_report(8, 1, state8);
        r.settle_report(9, 1, pb::JobState::Completed);
        assert_eq!(state_files(dir.path()), vec!["scratch.json"]);
    }

    /// A record this agent cannot read whole (a layout it does not know) whose process
    /// still runs: the process is killed, not left running unsupervised on GPUs the
    /// scheduler is about to give to other work.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn the_running_process_of_an_unreadable_record_is_killed_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let (mut first, _rx) = runner_in(dir.path(), Mode::Exec("sleep 30".into()), Vec::new());
        first.start(&start(4, 1, &[0])).await;
        first.shut_down(false).await;
        drop(first);
        let path = dir.path().join("jobs/state/4.0.1.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let written: WorkerRecord = serde_json::from_str(&text).unwrap();
        let identity = procfs::ProcessIdentity {
            pid: written.pid,
            start_ticks: written.start_ticks,
        };
        assert!(procfs::is_running(identity).unwrap());
        std::fs::write(&path, text.replace("\"gpus\"", "\"slots\"")).unwrap();
        let (mut second, mut rx) = runner_in(dir.path(), Mode::Exec("sleep 30".into()), Vec::new());
        assert_eq!(second.adopt_survivors().unreadable, 1);
        second.exited(next_exit(&mut rx, Duration::from_secs(1)).await);
        let (state, msg) = second.reports[&(4, 1)].clone();
        assert_eq!(state, pb::JobState::Failed);
        assert!(
            msg.contains("was killed") && msg.contains("4.0.1.json"),
            "{msg}"
        );
        let t = Instant::now();
        while procfs::is_running(identity).unwrap() {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the worker still runs"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn an_adopted_worker_keeps_its_mig_instance_and_a_stop_still_kills_it() {
        let instance = marshal_telemetry::MigInstance {
            gpu: 3,
            uuid: "MIG-4b7c".into(),
            profile: "1g.10gb".into(),
            compute: 1,
            memory: 1,
        };
        let dir = tempfile::tempdir().unwrap();
        let mode = Mode::Exec("exec sleep 30".into());
        let (mut first, _rx) = runner_in(dir.path(), mode.clone(), vec![instance.clone()]);
        first.start(&mig_start(1)).await;
        first.shut_down(false).await;
        drop(first);
        let record = records(dir.path()).load_all().unwrap().0.remove(0);
        assert_eq!(record.mig_uuids, vec!["MIG-4b7c".to_string()]);
        let worker = ProcessIdentity {
            pid: record.pid,
            start_ticks: record.start_ticks,
        };
        assert!(procfs::is_running(worker).unwrap());
        let (mut second, mut rx) = runner_in(dir.path(), mode, vec![instance]);
        assert_eq!(second.adopt_survivors().running, 1);
        // The adopted worker holds the only instance: a second MIG job cannot have it.
        second.start(&mig_start(2)).await;
        let exit = next_exit(&mut rx, Duration::from_secs(1)).await;
        assert_eq!(exit.incarnation.job, 2);
        second.exited(exit);
        assert!(second.reports[&(2, 1)].1.contains("no free MIG instance"));
        // A STOP kills the adopted worker's group (in the background: waited for here,
        // as a START on its GPU would) and reports nothing.
        let t = Instant::now();
        second.stop_job(1, 1).await;
        second.wait_stopped(|_, _| true).await;
        assert!(t.elapsed() < Duration::from_secs(5));
        assert!(!procfs::is_running(worker).unwrap());
        assert!(state_files(dir.path()).is_empty());
        assert!(!second.reports.contains_key(&(1, 1)));
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn stopping_workers_on_exit_kills_them_and_leaves_nothing_to_adopt() {
        let dir = tempfile::tempdir().unwrap();
        let mode = Mode::Exec("exec sleep 30".into());
        let (mut first, mut rx) = runner_in(dir.path(), mode.clone(), Vec::new());
        first.start(&start(4, 1, &[0])).await;
        let record = records(dir.path()).load_all().unwrap().0.remove(0);
        let worker = ProcessIdentity {
            pid: record.pid,
            start_ticks: record.start_ticks,
        };
        first.shut_down(true).await;
        assert!(!procfs::is_running(worker).unwrap());
        assert!(state_files(dir.path()).is_empty());
        assert!(
            tokio::time::timeout(Duration::from_millis(200), rx.recv())
                .await
                .is_err()
        );
        let (mut second, _rx) = runner_in(dir.path(), mode, Vec::new());
        assert_eq!(second.adopt_survivors(), Adoption::default());
    }
}
