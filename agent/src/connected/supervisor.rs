//! `--exec` workers that outlive the agent.
//!
//! A worker runs as `setsid sh -c SUPERVISOR marshal-worker CMD EXIT_FILE`: a small shell
//! that runs `sh -c CMD`, waits for it, writes its exit status to `EXIT_FILE` (to
//! `EXIT_FILE.tmp`, then renamed, so a reader sees all of it or nothing) and exits with
//! the same status. The command and the path travel as positional parameters, never
//! spliced into the script, so no quote in them can change what runs.
//!
//! `setsid` makes the shell the leader of a new session and process group, with no
//! controlling terminal: a hangup or Ctrl-C at the agent's terminal never reaches it,
//! and, orphaned from birth, the group is not sent SIGHUP when the agent exits (what
//! the kernel does to a process group that *becomes* orphaned with a stopped member).
//! `setsid` does not fork here (it forks only when already a group leader, and the
//! agent's children are not), so the pid the agent holds is the shell's, and the group
//! id equals it. A STOP ends the whole group, so nothing the command started survives:
//! SIGTERM first, then, after the stop grace (or at once once the command has ended),
//! SIGKILL, as a kubelet or Slurm's `KillWait` do, so a training job can write a
//! checkpoint. The supervising shell traps SIGTERM (a no-op handler, which the command
//! does not inherit, unlike an ignored signal): a trap waits for the foreground command,
//! so the shell outlives the command and still records its exit status.
//!
//! The agent learns of the end from the exit file in both cases it can be in:
//! - **Launched** by this agent ([`watch_launched`]): it is the shell's parent and waits
//!   for it; the wait status is the fallback when no exit file was written.
//! - **Adopted** after a restart ([`watch_adopted`]): the shell is not its child, so it
//!   cannot `waitpid`; it polls for the exit file and for the process (same pid *and*
//!   start time, not a zombie).
//!
//! Either watch kills the group when its control sender sends, and simply stops
//! watching — leaving the worker running — when the sender is dropped (the agent is
//! exiting, or its runner was dropped).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::connected::jobs::{Exit, Incarnation};
use crate::connected::procfs::{self, ProcError, ProcessIdentity};
use crate::connected::records::RecordStore;

/// `$1`: the command, `$2`: the exit file.
const SUPERVISOR: &str = "trap : TERM
sh -c \"$1\"
status=$?
printf '%s\\n' \"$status\" > \"$2.tmp\" && mv -f \"$2.tmp\" \"$2\"
exit \"$status\"";

/// How often an adopted worker is looked at.
pub const ADOPTED_POLL: Duration = Duration::from_millis(200);

/// Longest wait for a killed worker's processes to disappear.
const KILL_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("creating the log {path}: {source}")]
    Log {
        path: String,
        source: std::io::Error,
    },
    #[error("starting `setsid sh` (util-linux): {0}")]
    Spawn(std::io::Error),
    #[error("the worker started but cannot be identified: {0}")]
    Identify(ProcError),
}

/// A worker just started: its supervising shell and who it is.
#[derive(Debug)]
pub struct Launched {
    pub child: tokio::process::Child,
    pub identity: ProcessIdentity,
}

/// Starts `cmd` under a supervising shell in a new session, output to `log`, its exit
/// status to `exit_file`.
pub async fn launch(
    cmd: &str,
    env: &BTreeMap<String, String>,
    log: &Path,
    exit_file: &Path,
) -> Result<Launched, LaunchError> {
    let out = std::fs::File::create(log).map_err(|source| LaunchError::Log {
        path: log.display().to_string(),
        source,
    })?;
    let err = out.try_clone().map_err(|source| LaunchError::Log {
        path: log.display().to_string(),
        source,
    })?;
    let mut child = tokio::process::Command::new("setsid")
        .arg("sh")
        .arg("-c")
        .arg(SUPERVISOR)
        .arg("marshal-worker")
        .arg(cmd)
        .arg(exit_file)
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        // Dropping the handle must not kill: that is how the agent leaves it running.
        .kill_on_drop(false)
        .spawn()
        .map_err(LaunchError::Spawn)?;
    let identified = child
        .id()
        .ok_or_else(|| ProcError::Malformed {
            path: "the spawned worker has no pid".into(),
        })
        .and_then(procfs::identify);
    match identified {
        Ok(identity) => Ok(Launched { child, identity }),
        Err(e) => {
            // Unidentified, it could never be adopted or safely killed later: end it now.
            if let Some(pid) = child.id() {
                kill_group(pid).await;
            }
            let _ = child.kill().await;
            Err(LaunchError::Identify(e))
        }
    }
}

/// SIGKILL to the worker's process group, and to the pid itself in case `setsid` has
/// not yet made it a group leader (a STOP right after the start).
pub(crate) async fn kill_group(pid: u32) {
    signal_group(pid, "-KILL").await;
}

/// `signal` to process group `pid` only.
async fn signal_group_only(pid: u32, signal: &str) {
    kill(&[signal, "--", &format!("-{pid}")]).await;
}

/// `signal` to process group `pid` and to the pid itself.
async fn signal_group(pid: u32, signal: &str) {
    kill(&[signal, "--", &format!("-{pid}"), &pid.to_string()]).await;
}

async fn kill(args: &[&str]) {
    let _ = tokio::process::Command::new("kill")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
}

/// SIGTERM to the group, then waits up to `grace` for `ended` to say the supervising
/// shell is gone (or a zombie). Nothing to wait for with no grace.
async fn terminate(pid: u32, grace: Duration, mut ended: impl FnMut() -> bool) {
    if grace.is_zero() {
        return;
    }
    signal_group(pid, "-TERM").await;
    let deadline = tokio::time::Instant::now() + grace;
    while !ended() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The outcome of a recorded exit status (`sh` gives 128 + N for a command killed by
/// signal N).
pub fn outcome_of(status: i32) -> Result<(), String> {
    match status {
        0 => Ok(()),
        129..=192 => Err(format!(
            "exited with exit status: {status} (signal {})",
            status - 128
        )),
        s => Err(format!("exited with exit status: {s}")),
    }
}

/// What a look at a worker found.
#[derive(Debug, PartialEq)]
pub enum Seen {
    /// It recorded an exit status (or an unreadable one: a failure).
    Finished(Result<(), String>),
    Running,
    /// Gone without recording an exit status.
    Vanished,
}

/// Looks at a worker the agent is not the parent of. The exit file is read again after
/// finding the process gone: the shell writes it just before exiting.
pub fn look_at(
    identity: ProcessIdentity,
    inc: &Incarnation,
    store: &RecordStore,
) -> Result<Seen, ProcError> {
    let recorded = || match store.exit_status(inc) {
        Ok(Some(status)) => Some(Seen::Finished(outcome_of(status))),
        Ok(None) => None,
        Err(e) => Some(Seen::Finished(Err(format!(
            "its exit status is unreadable: {e}"
        )))),
    };
    if let Some(seen) = recorded() {
        return Ok(seen);
    }
    if procfs::is_running(identity)? {
        return Ok(Seen::Running);
    }
    Ok(recorded().unwrap_or(Seen::Vanished))
}

/// Watches a worker this agent launched: waits for it (reports its end) or for a stop
/// (SIGTERM, `grace`, SIGKILL; reports nothing); a dropped control sender leaves it
/// running.
pub async fn watch_launched(
    mut launched: Launched,
    inc: Incarnation,
    store: RecordStore,
    control: oneshot::Receiver<()>,
    exits: mpsc::UnboundedSender<Exit>,
    grace: Duration,
) {
    let status = tokio::select! {
        s = launched.child.wait() => s,
        stop = control => {
            if stop.is_ok() {
                let pid = launched.identity.pid;
                // The shell is this agent's child and is not reaped until the SIGKILL
                // has gone out: its pid, and so the group id, cannot be reused before.
                let gone_or_zombie = || procfs::stat(pid).map_or(true, |s| s.is_none_or(|s| s.state == 'Z'));
                terminate(pid, grace, gone_or_zombie).await;
                kill_group(pid).await;
                let _ = launched.child.kill().await;
            }
            return;
        }
    };
    let outcome = match store.exit_status(&inc) {
        Ok(Some(code)) => outcome_of(code),
        Ok(None) => match status {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(format!("exited with {s} (no exit status recorded)")),
            Err(e) => Err(format!("waiting for the process: {e}")),
        },
        Err(e) => Err(format!("its exit status is unreadable: {e}")),
    };
    let _ = exits.send(Exit {
        incarnation: inc,
        outcome,
    });
}

/// Watches a worker adopted from an earlier agent, by polling: reports its end, or
/// stops it on request (SIGTERM, `grace`, SIGKILL) and waits until it is gone, so its
/// GPUs are free when the scheduler's next START for them arrives.
pub async fn watch_adopted(
    identity: ProcessIdentity,
    inc: Incarnation,
    store: RecordStore,
    mut control: oneshot::Receiver<()>,
    exits: mpsc::UnboundedSender<Exit>,
    grace: Duration,
) {
    let mut warned = false;
    loop {
        tokio::select! {
            stop = &mut control => {
                if stop.is_ok() {
                    kill_adopted(identity, grace).await;
                }
                return;
            }
            _ = tokio::time::sleep(ADOPTED_POLL) => {}
        }
        let outcome = match look_at(identity, &inc, &store) {
            Ok(Seen::Running) => continue,
            Ok(Seen::Finished(outcome)) => outcome,
            Ok(Seen::Vanished) => Err(format!(
                "process {} ended without recording an exit status (its supervising shell was killed)",
                identity.pid
            )),
            Err(e) => {
                // Not knowing is not an end: keep the worker, say so once.
                if !warned {
                    warned = true;
                    tracing::warn!(job = inc.job, worker = inc.worker, error = %e, "cannot look at an adopted worker");
                }
                continue;
            }
        };
        let _ = exits.send(Exit {
            incarnation: inc,
            outcome,
        });
        return;
    }
}

/// Stops an adopted worker's group, unless its pid now names another process (the
/// group id cannot be reused while the group has members, so a pid that names no
/// process may still lead our group's survivors and is killed as a group).
async fn kill_adopted(identity: ProcessIdentity, grace: Duration) {
    match procfs::stat(identity.pid) {
        Ok(Some(s)) if s.start_ticks != identity.start_ticks => return,
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(pid = identity.pid, error = %e, "cannot confirm an adopted worker before killing it; left alone");
            return;
        }
    }
    terminate(identity.pid, grace, || {
        !procfs::is_running(identity).unwrap_or(false)
    })
    .await;
    // The shell may have ended in the grace and init reaped it. Its group's survivors,
    // if any, keep the group id from reuse and are killed as a group. A pid that now
    // names another process means the group has no member left (Linux reuses no pid
    // that still names a group), so nothing of ours remains to kill.
    match procfs::stat(identity.pid) {
        Ok(Some(s)) if s.start_ticks == identity.start_ticks => kill_group(identity.pid).await,
        Ok(Some(_)) => return,
        _ => signal_group_only(identity.pid, "-KILL").await,
    }
    let deadline = tokio::time::Instant::now() + KILL_WAIT;
    while procfs::is_running(identity).unwrap_or(false) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn inc() -> Incarnation {
        Incarnation {
            job: 1,
            worker: 0,
            attempt: 1,
        }
    }

    #[tokio::test]
    async fn quotes_in_the_command_reach_sh_intact_and_the_status_is_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let store = RecordStore::open(dir.path().join("state")).unwrap();
        let log = dir.path().join("w.log");
        let cmd = r#"echo "it's \"quoted\" $MARSHAL_X"; exit 3"#;
        let env = BTreeMap::from([("MARSHAL_X".to_string(), "x'y".to_string())]);
        let launched = launch(cmd, &env, &log, &store.exit_path(&inc()))
            .await
            .unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (_keep, control) = oneshot::channel();
        tokio::spawn(watch_launched(
            launched,
            inc(),
            store.clone(),
            control,
            tx,
            Duration::ZERO,
        ));
        let exit = rx.recv().await.unwrap();
        assert_eq!(exit.outcome, Err("exited with exit status: 3".into()));
        assert_eq!(store.exit_status(&inc()).unwrap(), Some(3));
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "it's \"quoted\" x'y\n"
        );
    }

    /// Waits (up to 10 s) for the file `path`.
    async fn appears(path: &Path) {
        let t = std::time::Instant::now();
        while !path.exists() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{path:?} never appeared"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn a_stop_gives_the_command_its_grace_and_the_shell_still_records_its_status() {
        let dir = tempfile::tempdir().unwrap();
        let store = RecordStore::open(dir.path().join("state")).unwrap();
        let (saved, ready) = (dir.path().join("saved"), dir.path().join("ready"));
        // Checkpoints on SIGTERM, taking a moment, then exits 0.
        let cmd = format!(
            "trap 'sleep 0.3; echo saved > \"{}\"; exit 0' TERM; touch \"{}\"; sleep 30 & wait",
            saved.display(),
            ready.display()
        );
        let log = dir.path().join("w.log");
        let launched = launch(&cmd, &BTreeMap::new(), &log, &store.exit_path(&inc()))
            .await
            .unwrap();
        let identity = launched.identity;
        let (tx, _rx) = mpsc::unbounded_channel();
        let (control_tx, control) = oneshot::channel();
        let grace = Duration::from_secs(20);
        let watch = tokio::spawn(watch_launched(
            launched,
            inc(),
            store.clone(),
            control,
            tx,
            grace,
        ));
        appears(&ready).await;
        let t = std::time::Instant::now();
        control_tx.send(()).unwrap();
        watch.await.unwrap();
        assert_eq!(std::fs::read_to_string(&saved).unwrap(), "saved\n");
        // Over when the command was, not at the grace's end.
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        assert!(!procfs::is_running(identity).unwrap());
        // The supervising shell outlived the SIGTERM and recorded the command's status.
        assert_eq!(store.exit_status(&inc()).unwrap(), Some(0));
    }

    /// Launches `cmd` in `dir` and leaves it running, as an agent that exits does.
    async fn left_running(cmd: &str, dir: &Path) -> (RecordStore, ProcessIdentity) {
        let store = RecordStore::open(dir.join("state")).unwrap();
        let log = dir.join("w.log");
        let launched = launch(cmd, &BTreeMap::new(), &log, &store.exit_path(&inc()))
            .await
            .unwrap();
        let identity = launched.identity;
        let (tx, _rx) = mpsc::unbounded_channel();
        let (control_tx, control) = oneshot::channel();
        let watch = tokio::spawn(watch_launched(
            launched,
            inc(),
            store.clone(),
            control,
            tx,
            Duration::ZERO,
        ));
        drop(control_tx);
        watch.await.unwrap();
        (store, identity)
    }

    #[tokio::test]
    async fn a_command_that_ignores_sigterm_is_killed_when_the_grace_ends() {
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("ready");
        let cmd = format!("trap '' TERM; touch \"{}\"; sleep 30", ready.display());
        // Left running, then adopted, as by a restarted agent: the same grace applies.
        let (store, identity) = left_running(&cmd, dir.path()).await;
        appears(&ready).await;
        let (tx, _rx) = mpsc::unbounded_channel();
        let (control_tx, control) = oneshot::channel();
        let grace = Duration::from_millis(400);
        let watch = tokio::spawn(watch_adopted(
            identity,
            inc(),
            store.clone(),
            control,
            tx,
            grace,
        ));
        let t = std::time::Instant::now();
        control_tx.send(()).unwrap();
        watch.await.unwrap();
        assert!(
            t.elapsed() >= grace,
            "killed before its grace: {:?}",
            t.elapsed()
        );
        assert!(!procfs::is_running(identity).unwrap());
        assert_eq!(store.exit_status(&inc()).unwrap(), None);
    }

    #[tokio::test]
    async fn a_dropped_control_leaves_the_worker_running_and_a_kill_ends_its_group() {
        let dir = tempfile::tempdir().unwrap();
        // The command's own child (`sleep`) must die with the group too.
        let child_pid = dir.path().join("child");
        let cmd = format!("sleep 30 & echo $! > '{}'; wait", child_pid.display());
        let (store, identity) = left_running(&cmd, dir.path()).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(look_at(identity, &inc(), &store).unwrap(), Seen::Running);
        // Adopted now, as a restarted agent would: a kill ends the whole group.
        let (tx, _rx) = mpsc::unbounded_channel();
        let (control_tx, control) = oneshot::channel();
        let watch = tokio::spawn(watch_adopted(
            identity,
            inc(),
            store.clone(),
            control,
            tx,
            Duration::ZERO,
        ));
        control_tx.send(()).unwrap();
        watch.await.unwrap();
        assert!(!procfs::is_running(identity).unwrap());
        assert_eq!(store.exit_status(&inc()).unwrap(), None);
        let sleep: u32 = std::fs::read_to_string(&child_pid)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let t = std::time::Instant::now();
        while procfs::stat(sleep).unwrap().is_some_and(|s| s.state != 'Z') {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the command's child survived"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
