//! The sampling loop: a tick every interval, until stopped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use marshal_telemetry::{GpuSample, Source, TelemetrySink};

use crate::{AgentError, HostSampler};

/// Where the loop gets the time from, so tests and simulated runs need not sleep.
pub trait Clock {
    /// Microseconds since the Unix epoch.
    fn now_us(&self) -> i64;
    /// Waits up to `d` (may return early).
    fn sleep(&mut self, d: Duration);
}

/// Wall time.
#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_us(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64)
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
    // Sleep in short slices so a stop request is honoured quickly.
    let slice = interval.min(Duration::from_millis(100));
    while !stop.load(Ordering::Relaxed) && max_ticks.is_none_or(|m| stats.ticks < m) {
        let started = clock.now_us();
        match source.sample(started) {
            Ok(rows) => {
                stats.rows += rows.len() as u64;
                if let Some(tap) = tap.as_deref_mut() {
                    tap.gpu_rows(&rows);
                }
                sink.send(rows)?;
            }
            Err(e) => {
                stats.source_errors += 1;
                tracing::warn!("telemetry source failed: {e}");
            }
        }
        if let Some(host) = host.as_deref_mut() {
            sink.send(vec![host.sample(started)])?;
            stats.node_rows += 1;
        }
        stats.ticks += 1;
        let due = started + interval.as_micros() as i64;
        while !stop.load(Ordering::Relaxed) && clock.now_us() < due {
            let left = Duration::from_micros((due - clock.now_us()).max(0) as u64);
            clock.sleep(left.min(slice));
        }
    }
    Ok(stats)
}
