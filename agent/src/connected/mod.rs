//! Connected mode (`marshal agent --scheduler URL`): the node's side of the
//! `marshal.v1.NodeService` protocol.
//!
//! [`run_connected`] runs until its shutdown future resolves. Each session connects,
//! registers the node (with what it runs now), stops what the registration says it
//! must, then watches its assignments while a task streams telemetry from the
//! [`Backlog`]. Any failure ends the session; the next one starts after a backoff
//! ([`Backoff`]: 100 ms doubling up to `backoff_max`, reset after a registration). Jobs
//! keep running across sessions; reports owed wait for the next session.
//!
//! The sampling loop is not here: it runs on its own thread and feeds the backlog
//! through a [`TelemetryTap`], so a slow or absent scheduler never delays sampling and
//! every row still reaches the local Parquet sink.
//!
//! Liveness: the scheduler takes every telemetry sample, watch opened, report and
//! registration as a heartbeat. Every `flush_interval` the agent sends what telemetry
//! it holds, or a Heartbeat call when it holds none (a node without GPUs, a source that
//! yielded nothing), so the node stays alive to the scheduler either way. When the
//! scheduler has given this node's jobs up (a refused registration, or, with
//! `fence_when_silent`, a silence past its timeout and grace), the agent stops their
//! workers: see [`fence`].

mod backlog;
mod checkpoints;
pub mod env;
mod fence;
mod jobs;
mod metrics;
mod mig;
mod procfs;
mod records;
mod supervisor;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use marshal_scheduler::service::client::{AgentClient, Backoff, ClientConfig, ClientError};
use marshal_scheduler::service::pb;
use marshal_scheduler::service::tonic::Code;
use tokio::sync::mpsc;
use tokio::time::Instant;

pub use backlog::{Backlog, BacklogStats, DEFAULT_BACKLOG, TelemetryTap, to_pb};
use fence::{Contact, Lease};
pub use jobs::{Adoption, Applied, Exit, Incarnation, Journal, Mode, Runner};
pub use metrics::AgentMetrics;

use crate::AgentError;

/// Rows sent per telemetry call.
const CHUNK: usize = 4096;

/// How often stopping workers are looked at until they have ended.
const STOPPING_POLL: Duration = Duration::from_millis(100);

#[derive(Clone, Debug)]
pub struct ConnectedConfig {
    pub client: ClientConfig,
    /// What the node registers as.
    pub node: pb::NodeInfo,
    pub mode: Mode,
    /// The agent's directory: `assignments/<job>.<worker>.env` (one file per worker
    /// running here, removed when it ends) and, with `--exec`,
    /// `jobs/<job>.<worker>.<attempt>.log` and the workers' state in `jobs/state/`.
    pub out: PathBuf,
    /// How often held telemetry is sent (the heartbeat period).
    pub flush_interval: Duration,
    /// Longest wait between reconnection attempts.
    pub backoff_max: Duration,
    /// Every start and end of a worker, when set (tests, debugging).
    pub journal: Option<Journal>,
    /// The node's MIG instances (NVML source; empty: none to hand out).
    pub mig: Vec<marshal_telemetry::MigInstance>,
    /// At shutdown, kill the `--exec` workers (the scheduler then requeues them) instead
    /// of leaving them running for the next agent on this out directory to adopt.
    pub stop_workers_on_exit: bool,
    /// `--exec` workers' logs last written longer ago are deleted (hourly; not those of
    /// workers still here). `None`: kept for ever.
    pub log_retention: Option<Duration>,
    /// Stop the workers once the scheduler cannot have heard from this agent for its
    /// node timeout plus grace (it has requeued their jobs). Off by default: see
    /// [`fence`] for why. A refused registration fences regardless.
    pub fence_when_silent: bool,
    /// A stopped `--exec` worker's process group gets SIGTERM, and SIGKILL this long
    /// after unless it has ended (zero: SIGKILL at once).
    pub stop_grace: Duration,
}

/// Counters of a connected agent, readable while it runs.
#[derive(Debug, Default)]
pub struct Counters {
    pub sessions: AtomicU64,
    pub registrations: AtomicU64,
    pub reports: AtomicU64,
    pub starts: AtomicU64,
    /// Workers stopped by fencing.
    pub fenced: AtomicU64,
    /// Stops confirmed to the scheduler (`ReportStopped`).
    pub stops_confirmed: AtomicU64,
    /// 1 while a session is registered, else 0.
    pub registered: AtomicU64,
    /// Workers running now, and stopped ones still within their grace.
    pub workers: AtomicU64,
    pub workers_stopping: AtomicU64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnectedStats {
    pub sessions: u64,
    pub registrations: u64,
    pub reports: u64,
    pub starts: u64,
    pub fenced: u64,
    pub telemetry: BacklogStats,
}

impl Counters {
    fn note_workers(&self, runner: &Runner) {
        self.workers
            .store(runner.live().count() as u64, Ordering::Relaxed);
        self.workers_stopping
            .store(runner.stopping_count() as u64, Ordering::Relaxed);
    }

    pub fn snapshot(&self, backlog: &Backlog) -> ConnectedStats {
        ConnectedStats {
            sessions: self.sessions.load(Ordering::Relaxed),
            registrations: self.registrations.load(Ordering::Relaxed),
            reports: self.reports.load(Ordering::Relaxed),
            starts: self.starts.load(Ordering::Relaxed),
            fenced: self.fenced.load(Ordering::Relaxed),
            telemetry: backlog.stats(),
        }
    }
}

/// Runs the connected agent until `shutdown` resolves, then tries once, for at most a
/// second, to deliver the reports still owed and the telemetry still held.
///
/// It first adopts the `--exec` workers an earlier agent on the same out directory left
/// running ([`Runner::adopt_survivors`]), so the first registration lists them. At
/// shutdown it leaves `--exec` workers running for the next agent to adopt, unless
/// `stop_workers_on_exit`; simulated jobs end with it (the scheduler requeues them at
/// the next registration or after the heartbeat grace).
pub async fn run_connected(
    config: ConnectedConfig,
    backlog: Arc<Backlog>,
    counters: Arc<Counters>,
    shutdown: impl Future<Output = ()>,
) -> Result<ConnectedStats, AgentError> {
    if config.flush_interval.is_zero() || config.backoff_max.is_zero() {
        return Err(AgentError::Config(
            "flush_interval and backoff_max must be positive".into(),
        ));
    }
    if let Mode::Simulated { speedup } = config.mode
        && !(speedup.is_finite() && speedup > 0.0)
    {
        return Err(AgentError::Config("the speedup must be positive".into()));
    }
    // A malformed URL or token fails every attempt the same way: say so once, not retry.
    config
        .client
        .validate()
        .map_err(|e| AgentError::Config(e.to_string()))?;
    let (exit_tx, mut exits) = mpsc::unbounded_channel();
    let mut runner = Runner::new(
        &config.node.name,
        config.mode.clone(),
        &config.out,
        exit_tx,
        backlog.clone(),
        config.journal.clone(),
        config.mig.clone(),
    )
    .map_err(|e| AgentError::Config(format!("the agent's directory: {e}")))?
    .with_log_retention(config.log_retention)
    .with_stop_grace(config.stop_grace);
    let adopted = runner.adopt_survivors();
    if adopted != Adoption::default() {
        tracing::info!(
            running = adopted.running,
            finished = adopted.finished,
            lost = adopted.lost,
            unreadable = adopted.unreadable,
            "workers left by an earlier agent"
        );
    }
    let mut backoff = Backoff::new(config.backoff_max);
    let mut client_slot: Option<AgentClient> = None;
    let stop_grace = match config.mode {
        Mode::Exec(_) => config.stop_grace,
        _ => Duration::ZERO,
    };
    let contact = Arc::new(Contact::new(config.fence_when_silent, stop_grace));
    tokio::pin!(shutdown);
    'outer: loop {
        counters.sessions.fetch_add(1, Ordering::Relaxed);
        let mut registered = false;
        let ended = tokio::select! {
            _ = &mut shutdown => break 'outer,
            _ = contact.due() => {
                fence(&mut runner, &contact, &counters).await;
                Err(None)
            }
            r = session(&config, &mut runner, &mut exits, &backlog, &counters, &contact, &mut registered, &mut client_slot) => r.map_err(Some),
        };
        counters.registered.store(0, Ordering::Relaxed);
        counters.note_workers(&runner);
        if registered {
            backoff.reset();
        }
        let delay = backoff.next_delay();
        match ended {
            Err(Some(e)) => {
                tracing::warn!(error = %e, retry_in = ?delay, "scheduler session ended")
            }
            Err(None) => tracing::warn!(retry_in = ?delay, "scheduler session ended by fencing"),
            Ok(()) => tracing::warn!(retry_in = ?delay, "scheduler closed the assignment stream"),
        }
        let wake = tokio::time::sleep(delay);
        tokio::pin!(wake);
        loop {
            tokio::select! {
                _ = &mut shutdown => break 'outer,
                _ = &mut wake => break,
                _ = contact.due() => fence(&mut runner, &contact, &counters).await,
                Some(e) = exits.recv() => runner.exited(e),
            }
            counters.note_workers(&runner);
        }
    }
    // Exits first, so that the workers that ended are reported, not just dropped.
    while let Ok(e) = exits.try_recv() {
        runner.exited(e);
    }
    runner.shut_down(config.stop_workers_on_exit).await;
    while let Ok(e) = exits.try_recv() {
        runner.exited(e);
    }
    if let Some(mut client) = client_slot {
        // Best effort, briefly: the reports owed and the rows held (the rows are in
        // Parquet whatever happens here).
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            if !runner.reports.is_empty() || !runner.stops_to_confirm.is_empty() {
                flush_reports(&mut runner, &mut client, &counters, None).await?;
            }
            loop {
                let batch = backlog.take(CHUNK);
                if batch.is_empty() {
                    return Ok::<(), ClientError>(());
                }
                match client.telemetry(batch.clone()).await {
                    Ok(ack) => backlog.acked(&ack),
                    Err(e) => {
                        backlog.put_back(batch);
                        return Err(e);
                    }
                }
            }
        })
        .await;
    }
    counters
        .starts
        .store(runner.starts, std::sync::atomic::Ordering::Relaxed);
    Ok(counters.snapshot(&backlog))
}

/// Stops every worker: the scheduler has requeued (or is about to requeue) their jobs.
/// They report nothing; their jobs are the scheduler's to run elsewhere.
async fn fence(runner: &mut Runner, contact: &Contact, counters: &Counters) {
    let why = contact.lease().why();
    let workers = runner.live().count();
    if workers > 0 {
        tracing::warn!(
            workers,
            why,
            "fencing: the scheduler has given this node's jobs up; stopping their workers so that none runs twice"
        );
    }
    // Counted first: a reader that sees the workers gone sees them counted.
    counters.fenced.fetch_add(workers as u64, Ordering::Relaxed);
    runner.stop_all().await;
    contact.update(Lease::fenced);
}

/// Whether the scheduler refused a report for good (the job moved on, or the report is
/// stale); anything else is retried in a later session.
fn refused(e: &ClientError) -> bool {
    matches!(e, ClientError::Call(s) if matches!(s.code(), Code::FailedPrecondition | Code::NotFound | Code::InvalidArgument))
}

async fn flush_reports(
    runner: &mut Runner,
    client: &mut AgentClient,
    counters: &Counters,
    contact: Option<&Contact>,
) -> Result<(), ClientError> {
    let owed: Vec<((u64, u32), (pb::JobState, String))> = runner
        .reports
        .iter()
        .map(|(k, v)| (*k, v.clone()))
        .collect();
    for ((job, attempt), (state, message)) in owed {
        let checkpoint = if state == pb::JobState::Running {
            runner.last_checkpoint(job, attempt)
        } else {
            0.0
        };
        let sent = Instant::now();
        let result = client
            .report_checkpoint(job, attempt, state, &message, checkpoint)
            .await;
        if result.is_ok()
            && let Some(contact) = contact
        {
            contact.update(|l| l.answered(sent));
        }
        match result {
            Ok(_) => counters.reports.fetch_add(1, Ordering::Relaxed),
            Err(e) if refused(&e) => {
                tracing::info!(job, attempt, error = %e, "report refused; dropped");
                0
            }
            Err(e) => return Err(e),
        };
        runner.settle_report(job, attempt, state);
    }
    let confirmations: Vec<(u64, u32)> = runner.stops_to_confirm.iter().copied().collect();
    for (job, attempt) in confirmations {
        let sent = Instant::now();
        match client.report_stopped(job, attempt).await {
            Ok(awaited) => {
                if let Some(contact) = contact {
                    contact.update(|l| l.answered(sent));
                }
                counters.stops_confirmed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(job, attempt, awaited, "stop confirmed");
            }
            // A scheduler that predates ReportStopped never asks for it; nothing waits.
            Err(e)
                if refused(&e)
                    || matches!(&e, ClientError::Call(s) if s.code() == Code::Unimplemented) =>
            {
                tracing::info!(job, attempt, error = %e, "stop confirmation refused; dropped");
            }
            Err(e) => return Err(e),
        }
        runner.stops_to_confirm.remove(&(job, attempt));
    }
    Ok(())
}

/// Aborts the telemetry task when the session ends, however it ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn stream_telemetry(
    mut client: AgentClient,
    backlog: Arc<Backlog>,
    contact: Arc<Contact>,
    every: Duration,
    failed: tokio::sync::oneshot::Sender<ClientError>,
) {
    let mut warned = false;
    loop {
        tokio::time::sleep(every).await;
        let mut sent = false;
        loop {
            let batch = backlog.take(CHUNK);
            if batch.is_empty() {
                break;
            }
            sent = true;
            let full = batch.len() == CHUNK;
            let sent = Instant::now();
            match client.telemetry(batch.clone()).await {
                Ok(ack) => {
                    contact.update(|l| l.answered(sent));
                    backlog.acked(&ack);
                    if ack.rejected > 0 && !warned {
                        warned = true;
                        tracing::warn!(
                            rejected = ack.rejected,
                            first_error = %ack.first_error,
                            "the scheduler refused telemetry rows"
                        );
                    }
                }
                Err(e) => {
                    backlog.put_back(batch);
                    let _ = failed.send(e);
                    return;
                }
            }
            if !full {
                break;
            }
        }
        if !sent {
            let at = Instant::now();
            if let Err(e) = client.heartbeat().await {
                let _ = failed.send(e);
                return;
            }
            contact.update(|l| l.answered(at));
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn session(
    config: &ConnectedConfig,
    runner: &mut Runner,
    exits: &mut mpsc::UnboundedReceiver<Exit>,
    backlog: &Arc<Backlog>,
    counters: &Counters,
    contact: &Arc<Contact>,
    registered: &mut bool,
    client_slot: &mut Option<AgentClient>,
) -> Result<(), ClientError> {
    let mut client = AgentClient::connect(&config.client, &config.node.name).await?;
    *client_slot = Some(client.clone());
    // Exits that happened while disconnected are reported in this registration's list.
    while let Ok(e) = exits.try_recv() {
        runner.exited(e);
    }
    let sent = Instant::now();
    let reg = match client
        .register(
            config.node.clone(),
            runner.running_list(),
            runner.stopping_list(),
            runner.confirms_stops(),
        )
        .await
    {
        Ok(reg) => reg,
        Err(e) => {
            if let Some(requeue_in) = e.requeue_in() {
                if runner.live().next().is_some() {
                    tracing::warn!(
                        requeue_in = ?requeue_in,
                        "registration refused: the scheduler requeues this node's jobs then, and their workers here are stopped then unless a registration succeeds first"
                    );
                }
                contact.update(|l| l.refused(sent, requeue_in));
            }
            return Err(e);
        }
    };
    contact.update(|l| {
        l.registered(
            sent,
            Duration::from_millis(reg.node_timeout_ms),
            Duration::from_millis(reg.node_grace_ms),
        )
    });
    if contact.lease().grace_cut_for_silence() {
        tracing::warn!(
            stop_grace = ?config.stop_grace,
            node_timeout_ms = reg.node_timeout_ms,
            node_grace_ms = reg.node_grace_ms,
            "the stop grace is more than half the scheduler's timeout plus grace: fencing on silence starts at half of that, and workers get less than their grace"
        );
    }
    *registered = true;
    counters.registrations.fetch_add(1, Ordering::Relaxed);
    counters.registered.store(1, Ordering::Relaxed);
    for r in &reg.stop {
        tracing::info!(
            job = r.job_id,
            attempt = r.attempt,
            "the scheduler did not place this here; stopping it"
        );
        runner.stop_job(r.job_id, r.attempt).await;
    }
    let sent = Instant::now();
    let mut watch = client.assignments().await?;
    contact.update(|l| l.answered(sent));
    let (failed_tx, mut failed) = tokio::sync::oneshot::channel();
    let _telemetry = AbortOnDrop(tokio::spawn(stream_telemetry(
        client.clone(),
        backlog.clone(),
        contact.clone(),
        config.flush_interval,
        failed_tx,
    )));
    flush_reports(runner, &mut client, counters, Some(contact)).await?;
    let mut snapshot: Option<Vec<pb::Assignment>> = Some(Vec::new());
    let mut retry = tokio::time::interval(config.flush_interval.max(Duration::from_millis(200)));
    loop {
        tokio::select! {
            m = watch.message() => {
                let Some(a) = m? else { return Ok(()) };
                match pb::AssignmentAction::try_from(a.action) {
                    Ok(pb::AssignmentAction::Start) => match &mut snapshot {
                        Some(held) => held.push(a),
                        None => runner.start(&a).await,
                    },
                    Ok(pb::AssignmentAction::Stop) => runner.apply_stop(&a).await,
                    Ok(pb::AssignmentAction::Synced) => {
                        if let Some(held) = snapshot.take() {
                            runner.sync(&held).await;
                        }
                    }
                    _ => tracing::warn!(action = a.action, "unknown assignment action; ignored"),
                }
                counters.starts.store(runner.starts, Ordering::Relaxed);
            }
            Some(e) = exits.recv() => runner.exited(e),
            e = &mut failed => {
                return Err(e.unwrap_or_else(|_| ClientError::Call(marshal_scheduler::service::tonic::Status::unavailable("telemetry task ended"))));
            }
            _ = retry.tick() => {
                runner.reap_stopped();
                runner.poll_checkpoints();
                runner.sweep_logs();
            }
            // While a stopped worker ends, look often: the scheduler holds its job's
            // next START until this agent confirms the end, whatever the report interval.
            _ = tokio::time::sleep(STOPPING_POLL), if runner.stopping_count() > 0 => {
                runner.reap_stopped();
            }
        }
        counters.note_workers(runner);
        if !runner.reports.is_empty() || !runner.stops_to_confirm.is_empty() {
            flush_reports(runner, &mut client, counters, Some(contact)).await?;
        }
    }
}
