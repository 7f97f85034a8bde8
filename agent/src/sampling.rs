//! The sampling loop: a tick every interval, until stopped.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use marshal_telemetry::{GpuSample, Records, Source, TelemetryError, TelemetrySink, TrySendError};

use crate::{AgentError, HostSampler};

/// Where the loop gets the time from, so tests and simulated runs need not sleep.
pub trait Clock {
    /// Microseconds since the Unix epoch.
    fn now_us(&self) -> i64;
    /// Waits up to `d` (may return early).
    fn sleep(&mut self, d: Duration);
}

/// How far the wall clock may part from the monotonic one before it counts as a step.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(1);

/// Wall time for timestamps, never stepping backwards.
///
/// It advances with the monotonic clock from a reading of the wall clock. When the wall
/// clock steps *forwards* by more than [`MAX_CLOCK_SKEW`] (an NTP step, a VM resumed
/// after a pause), the clock follows it. When it steps *backwards*, the clock does not:
/// timestamps keep advancing from where they were, and follow the wall clock again once
/// it has caught up. So a GPU's samples never repeat or go back in time, and a tick is
/// never due an hour late because the wall clock went back an hour. Steps are logged
/// and counted ([`SystemClock::steps`]).
#[derive(Debug)]
pub struct SystemClock {
    wall_us: fn() -> i64,
    /// Monotonic instant and the timestamp it stands for.
    anchor: Cell<(Instant, i64)>,
    steps: Cell<u64>,
    /// The wall clock is behind: already counted, not logged again until it catches up.
    behind: Cell<bool>,
}

fn wall_now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl SystemClock {
    pub fn new() -> Self {
        Self::with_wall_clock(wall_now_us)
    }

    /// A clock reading the wall time from `wall_us` (tests step it).
    pub fn with_wall_clock(wall_us: fn() -> i64) -> Self {
        Self {
            wall_us,
            anchor: Cell::new((Instant::now(), wall_us())),
            steps: Cell::new(0),
            behind: Cell::new(false),
        }
    }

    /// Wall-clock steps seen so far (forwards followed, backwards not).
    pub fn steps(&self) -> u64 {
        self.steps.get()
    }
}

impl Clock for SystemClock {
    fn now_us(&self) -> i64 {
        let (at, stamp) = self.anchor.get();
        let steady = stamp.saturating_add(at.elapsed().as_micros() as i64);
        let wall = (self.wall_us)();
        let skew = MAX_CLOCK_SKEW.as_micros() as i64;
        if wall > steady.saturating_add(skew) {
            tracing::warn!(
                "the wall clock stepped forwards by {:.1} s: timestamps follow it",
                (wall - steady) as f64 / 1e6
            );
            self.anchor.set((Instant::now(), wall));
            self.steps.set(self.steps.get() + 1);
            self.behind.set(false);
            return wall;
        }
        if wall < steady.saturating_sub(skew) {
            if !self.behind.replace(true) {
                tracing::warn!(
                    "the wall clock stepped backwards by {:.1} s: timestamps keep advancing \
                     from where they were until it catches up",
                    (steady - wall) as f64 / 1e6
                );
                self.steps.set(self.steps.get() + 1);
            }
        } else {
            self.behind.set(false);
        }
        steady
    }

    fn sleep(&mut self, d: Duration) {
        std::thread::sleep(d);
    }
}

/// A clock that advances only when slept on: simulated time at full speed.
#[derive(Debug)]
pub struct ManualClock {
    pub now_us: i64,
}

impl Clock for ManualClock {
    fn now_us(&self) -> i64 {
        self.now_us
    }

    fn sleep(&mut self, d: Duration) {
        self.now_us += d.as_micros() as i64;
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoopStats {
    pub ticks: u64,
    pub rows: u64,
    /// Per-node rows.
    pub node_rows: u64,
    /// Ticks whose source failed (logged and skipped; the loop goes on).
    pub source_errors: u64,
    /// GPU and node rows the sink could not take before the next tick was due (its
    /// file system refused writes and its memory bound was reached): dropped here,
    /// counted, never accepted by the sink.
    pub rows_refused: u64,
    /// The sink's refusals, in episodes: warned when one begins and when it ends (a
    /// second full disk weeks after the first is said too).
    pub sink_refusing: marshal_telemetry::episodes::Episode,
}

/// Another consumer of the GPU rows the loop produces (streaming to the scheduler),
/// called on the sampling thread with each tick's rows before the sink gets them. It
/// must not block: sampling goes on whatever the consumer's state.
pub trait RowTap {
    fn gpu_rows(&mut self, rows: &[GpuSample]);
}

/// Samples `source` (and the host, when given) every `interval` into `sink` until
/// `stop` is set or `max_ticks` ticks have run. A failing tick is logged and counted,
/// not fatal; a sink that cannot accept rows any more (its writer died) is.
pub fn run_sampling_loop(
    source: &mut dyn Source,
    host: Option<&mut HostSampler>,
    sink: &TelemetrySink,
    interval: Duration,
    stop: &AtomicBool,
    clock: &mut dyn Clock,
    max_ticks: Option<u64>,
) -> Result<LoopStats, AgentError> {
    run_sampling_loop_with(source, host, sink, None, interval, stop, clock, max_ticks)
}

/// [`run_sampling_loop`] with a second consumer of the GPU rows.
#[allow(clippy::too_many_arguments)]
pub fn run_sampling_loop_with(
    source: &mut dyn Source,
    mut host: Option<&mut HostSampler>,
    sink: &TelemetrySink,
    mut tap: Option<&mut dyn RowTap>,
    interval: Duration,
    stop: &AtomicBool,
    clock: &mut dyn Clock,
    max_ticks: Option<u64>,
) -> Result<LoopStats, AgentError> {
    if interval.is_zero() {
        return Err(AgentError::Config(
            "the sampling interval must be positive".into(),
        ));
    }
    let mut stats = LoopStats::default();
    let mut source_failing = marshal_telemetry::episodes::Episode::default();
    // Sleep in short slices so a stop request is honoured quickly.
    let slice = interval.min(Duration::from_millis(100));
    while !stop.load(Ordering::Relaxed) && max_ticks.is_none_or(|m| stats.ticks < m) {
        let started = clock.now_us();
        let due = started + interval.as_micros() as i64;
        match source.sample(started) {
            Ok(rows) => {
                if let Some(ticks) = source_failing.succeeded() {
                    tracing::warn!("telemetry source recovered after {ticks} failed samples");
                }
                stats.rows += rows.len() as u64;
                if let Some(tap) = tap.as_deref_mut() {
                    tap.gpu_rows(&rows);
                }
                offer(sink, rows, until(clock, due), &mut stats)?;
            }
            Err(e) => {
                stats.source_errors += 1;
                if source_failing.failed() {
                    tracing::warn!("telemetry source failed: {e} (said once until it recovers)");
                }
            }
        }
        if let Some(host) = host.as_deref_mut() {
            let row = vec![host.sample(started)];
            offer(sink, row, until(clock, due), &mut stats)?;
            stats.node_rows += 1;
        }
        stats.ticks += 1;
        while !stop.load(Ordering::Relaxed) && clock.now_us() < due {
            clock.sleep(until(clock, due).min(slice));
        }
    }
    Ok(stats)
}

fn until(clock: &dyn Clock, due_us: i64) -> Duration {
    Duration::from_micros((due_us - clock.now_us()).max(0) as u64)
}

/// Hands rows to the sink, waiting for room until the next tick is due at most. The
/// loop keeps its pace: rows the sink cannot take by then are dropped and counted
/// (the sink never accepted them; what it accepted it keeps, see its full-disk rule).
fn offer(
    sink: &TelemetrySink,
    rows: impl Into<Records>,
    wait: Duration,
    stats: &mut LoopStats,
) -> Result<(), AgentError> {
    match sink.send_timeout(rows, wait) {
        Ok(()) => {
            if let Some(refusals) = stats.sink_refusing.succeeded() {
                tracing::warn!(
                    "the telemetry sink takes rows again, after refusing {refusals} batches ({} rows dropped so far)",
                    stats.rows_refused
                );
            }
            Ok(())
        }
        Err(TrySendError::Full(rows)) => {
            if stats.sink_refusing.failed() {
                tracing::warn!(
                    "the telemetry sink takes no rows (see its errors): this tick's rows are \
                     dropped, and later ones while it stays full"
                );
            }
            stats.rows_refused += rows.len() as u64;
            Ok(())
        }
        Err(TrySendError::Closed(_)) => Err(TelemetryError::SinkClosed {
            root: sink.root().to_path_buf(),
            reason: "the writer thread has stopped".into(),
        }
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicI64;

    static WALL_US: AtomicI64 = AtomicI64::new(1_000_000_000_000_000);

    fn stepped_wall() -> i64 {
        WALL_US.load(Ordering::SeqCst)
    }

    #[test]
    fn timestamps_follow_forward_steps_and_never_go_back() {
        let clock = SystemClock::with_wall_clock(stepped_wall);
        let t0 = clock.now_us();
        assert_eq!(clock.steps(), 0);
        // A step back of an hour: timestamps keep advancing from where they were.
        WALL_US.fetch_sub(3_600_000_000, Ordering::SeqCst);
        let t1 = clock.now_us();
        assert!(t1 >= t0 && t1 - t0 < 1_000_000, "{t0} → {t1}");
        let t2 = clock.now_us();
        assert!(t2 >= t1);
        assert_eq!(clock.steps(), 1, "one step, counted once");
        // A step forward of two hours (past where the steady time is): followed.
        WALL_US.fetch_add(7_200_000_000, Ordering::SeqCst);
        let t3 = clock.now_us();
        assert_eq!(t3, stepped_wall());
        assert_eq!(clock.steps(), 2);
        // Small differences are not steps.
        let t4 = clock.now_us();
        assert!(t4 >= t3 && t4 - t3 < 1_000_000);
        assert_eq!(clock.steps(), 2);
    }
}
