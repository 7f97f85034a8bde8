//! What the writer does while the file system refuses its writes (see the sink's
//! "A full disk loses no row" design note): note the refusal once, retry with a
//! backoff, stop taking rows at the memory bounds, and at shutdown retry for a grace
//! period before giving the rows up, counted.

use std::time::{Duration, Instant};

use super::{Ctx, Worker, lock};
use crate::error::TelemetryError;
use crate::writer::CommitError;

const FIRST_WAIT: Duration = Duration::from_millis(50);
const LONGEST_WAIT: Duration = Duration::from_secs(2);

/// An episode of refused writes.
#[derive(Debug)]
pub(super) struct Stall {
    since: Instant,
    next_try: Instant,
    wait: Duration,
    reason: String,
}

impl Stall {
    fn new(now: Instant, reason: String) -> Self {
        Self {
            since: now,
            next_try: now + FIRST_WAIT,
            wait: FIRST_WAIT,
            reason,
        }
    }

    pub(super) fn next_try(&self) -> Instant {
        self.next_try
    }

    /// A retry failed: wait twice as long (at most [`LONGEST_WAIT`]) before the next.
    fn retry_failed(&mut self, now: Instant) {
        self.wait = (self.wait * 2).min(LONGEST_WAIT);
        self.next_try = now + self.wait;
    }
}

impl Ctx {
    /// The file system refused a write: the first refusal of an episode is logged and
    /// counted; the rows it concerns have been kept by the caller.
    pub(super) fn refused(&mut self, e: TelemetryError) {
        let reason = e.to_string();
        let mut s = lock(&self.stats);
        s.stall = Some(reason.clone());
        match &mut self.stall {
            Some(stall) => stall.reason = reason,
            None => {
                tracing::warn!("telemetry sink: {reason}; rows are kept in memory and retried");
                s.stalls += 1;
                s.error_count += 1;
                if s.errors.len() < super::SinkStats::MAX_LISTED {
                    s.errors
                        .push(format!("{reason} (rows kept in memory and retried)"));
                }
                self.stall = Some(Stall::new(Instant::now(), reason));
            }
        }
    }
}

impl Worker {
    /// When a retry is due: tries every refused step again, oldest first, and ends the
    /// episode if none is refused any more.
    /// `force`: retry now even if the backoff says later (a flush asks).
    pub(super) fn retry_stalled(&mut self, now: Instant, force: bool) {
        if self
            .ctx
            .stall
            .as_ref()
            .is_none_or(|s| now < s.next_try && !force)
        {
            return;
        }
        let mut refusal = None;
        for file in std::mem::take(&mut self.ctx.unpublished) {
            let rows = file.rows();
            match file.publish() {
                Ok(path) => self.ctx.committed(path, rows),
                Err(CommitError::Refused(file, e)) => {
                    self.ctx.unpublished.push(file);
                    refusal.get_or_insert(e);
                }
                Err(CommitError::Failed(e)) => self.ctx.error(e, rows),
            }
        }
        for f in self.files.values_mut() {
            let result = match f.file.as_mut() {
                Some(file) if file.backlog_bytes() > 0 => file.retry(),
                Some(_) => Ok(()),
                None if f.blocked => f.create_file(&mut self.ctx).map(|file| {
                    f.file = Some(file);
                    f.blocked = false;
                }),
                None => Ok(()),
            };
            if let Err(e) = result {
                refusal.get_or_insert(e);
            }
        }
        let backlog = self.backlog_bytes() as u64;
        let stall = self.ctx.stall.as_mut().expect("checked above");
        match refusal {
            Some(e) => {
                stall.reason = e.to_string();
                stall.retry_failed(now);
                let mut s = lock(&self.ctx.stats);
                s.stall = Some(stall.reason.clone());
                s.backlog_bytes = backlog;
            }
            None => {
                tracing::info!(
                    "telemetry sink: the file system takes writes again after {:.1} s",
                    now.saturating_duration_since(stall.since).as_secs_f64()
                );
                self.ctx.stall = None;
                let mut s = lock(&self.ctx.stats);
                s.stall = None;
                s.backlog_bytes = backlog;
            }
        }
    }

    /// Whether the writer should take no new rows: the file system refuses writes and
    /// the rows or bytes waiting for it reached their bounds, or as many finished files
    /// wait to be published as may be open at once (each holds a descriptor, and a
    /// refused `fsync` or rename leaves almost no bytes waiting). Never while closing,
    /// so that shutdown takes in what producers already queued.
    pub(super) fn paused(&self) -> bool {
        self.ctx.stall.is_some()
            && !self.closing.load(std::sync::atomic::Ordering::SeqCst)
            && (self.ctx.buffered >= self.ctx.cfg.max_buffered_rows
                || self.backlog_bytes() >= self.ctx.cfg.max_backlog_bytes
                || self.ctx.unpublished.len() >= self.ctx.cfg.max_open_files)
    }

    fn backlog_bytes(&self) -> usize {
        let open: usize = (self.files.values())
            .filter_map(|f| f.file.as_ref())
            .map(|f| f.backlog_bytes())
            .sum();
        let finished: usize = self.ctx.unpublished.iter().map(|f| f.backlog_bytes()).sum();
        open + finished
    }

    /// Rows accepted and not yet in a published file, and why, while the file system
    /// refuses writes (`None` otherwise: everything sent is published).
    pub(super) fn waiting(&self) -> Option<(u64, String)> {
        let stall = self.ctx.stall.as_ref()?;
        let rows = self.rows_pending();
        (rows > 0).then(|| (rows, stall.reason.clone()))
    }

    fn rows_pending(&self) -> u64 {
        let open: u64 = self.files.values().map(|f| f.rows_pending()).sum();
        let finished: u64 = self.ctx.unpublished.iter().map(|f| f.rows()).sum();
        open + finished
    }

    /// At shutdown, after every file was closed: retries refused writes for
    /// `shutdown_grace`, then gives up what is left, counting the rows as lost.
    pub(super) fn finish_stalled(&mut self) {
        let deadline = Instant::now() + self.ctx.cfg.shutdown_grace;
        while let Some(next_try) = self.ctx.stall.as_ref().map(|s| s.next_try) {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            if next_try > now {
                std::thread::sleep(next_try.min(deadline) - now);
                continue;
            }
            self.retry_stalled(now, false);
            // Publish what the file system takes now (other partitions may still be
            // refused).
            self.close_all();
        }
        let Some(stall) = self.ctx.stall.take() else {
            return;
        };
        let mut lost = 0;
        for file in std::mem::take(&mut self.ctx.unpublished) {
            let rows = file.rows();
            match file.abandon() {
                // In place: only the directory's `fsync` failed; readers see it.
                Some(path) => self.ctx.committed(path, rows),
                None => lost += rows,
            }
        }
        for (_, f) in self.files.drain() {
            lost += f.rows_pending();
            if let Some(file) = f.file {
                file.abort();
            }
        }
        self.ctx.buffered = 0;
        let e = TelemetryError::SinkStalled {
            root: self.ctx.cfg.root.clone(),
            rows: lost,
            reason: format!(
                "gave up after retrying for {:?} at shutdown: {}",
                self.ctx.cfg.shutdown_grace, stall.reason
            ),
        };
        self.ctx.error(e, lost);
        let mut s = lock(&self.ctx.stats);
        s.stall = None;
        s.backlog_bytes = 0;
    }
}
