//! The bounded backlog between the sampling loop and the telemetry stream.
//!
//! The sampling loop pushes every tick's GPU rows here (converted to
//! [`pb::TelemetrySample`]) and never waits: when the backlog is full the oldest rows
//! are dropped from it and counted in [`BacklogStats::dropped`]. They are not lost —
//! every row is in the local Parquet sink regardless — they are only not streamed. The
//! streaming task takes rows in chunks while connected; after a disconnection the rows
//! held (the most recent `capacity`) are sent on reconnect, oldest first.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use marshal_scheduler::service::pb;
use marshal_telemetry::{GpuSample, Health};

use crate::RowTap;

/// Rows held for streaming by default: about 10 minutes of an 8-GPU node sampled every
/// 100 ms, or 2 hours at the default 1 s interval; roughly 6 MiB.
pub const DEFAULT_BACKLOG: usize = 65_536;

#[derive(Debug)]
pub struct Backlog {
    node: String,
    capacity: usize,
    rows: Mutex<VecDeque<pb::TelemetrySample>>,
    /// GPU index → the scheduler job the agent runs there (the `job_id` streamed).
    gpu_jobs: Mutex<HashMap<u32, u64>>,
    produced: AtomicU64,
    streamed: AtomicU64,
    rejected: AtomicU64,
    dropped: AtomicU64,
}

/// Counters of the rows that went through the backlog.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BacklogStats {
    /// Rows the sampling loop produced.
    pub produced: u64,
    /// Rows the scheduler accepted.
    pub streamed: u64,
    /// Rows the scheduler refused (see the agent's log for the first reason).
    pub rejected: u64,
    /// Rows never streamed: pushed out of the full backlog (they are in Parquet).
    pub dropped: u64,
    /// Rows held now.
    pub held: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Backlog {
    /// A backlog for `node` holding at most `capacity` rows (at least 1).
    pub fn new(node: &str, capacity: usize) -> Arc<Self> {
        Arc::new(Backlog {
            node: node.to_string(),
            capacity: capacity.max(1),
            rows: Mutex::new(VecDeque::new()),
            gpu_jobs: Mutex::new(HashMap::new()),
            produced: AtomicU64::new(0),
            streamed: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Adds rows at the back; the oldest beyond the capacity are dropped.
    pub fn push(&self, rows: impl IntoIterator<Item = pb::TelemetrySample>) {
        let mut q = lock(&self.rows);
        let mut n = 0;
        for r in rows {
            q.push_back(r);
            n += 1;
        }
        self.produced.fetch_add(n, Ordering::Relaxed);
        let excess = q.len().saturating_sub(self.capacity);
        if excess > 0 {
            q.drain(..excess);
            self.dropped.fetch_add(excess as u64, Ordering::Relaxed);
        }
    }

    /// Converts and adds one tick's rows.
    pub fn push_samples(&self, rows: &[GpuSample]) {
        let converted: Vec<pb::TelemetrySample> = {
            let jobs = lock(&self.gpu_jobs);
            rows.iter()
                .map(|s| {
                    let job = jobs.get(&(s.gpu_index as u32)).copied().unwrap_or(0);
                    to_pb(s, &self.node, job)
                })
                .collect()
        };
        self.push(converted);
    }

    /// Takes up to `max` of the oldest rows.
    pub fn take(&self, max: usize) -> Vec<pb::TelemetrySample> {
        let mut q = lock(&self.rows);
        let n = q.len().min(max);
        q.drain(..n).collect()
    }

    /// Returns rows taken but not delivered to the front, older than everything held;
    /// beyond the capacity the oldest are dropped.
    pub fn put_back(&self, rows: Vec<pb::TelemetrySample>) {
        let mut q = lock(&self.rows);
        for r in rows.into_iter().rev() {
            q.push_front(r);
        }
        let excess = q.len().saturating_sub(self.capacity);
        if excess > 0 {
            q.drain(..excess);
            self.dropped.fetch_add(excess as u64, Ordering::Relaxed);
        }
    }

    pub(crate) fn acked(&self, ack: &pb::TelemetryAck) {
        self.streamed.fetch_add(ack.accepted, Ordering::Relaxed);
        self.rejected.fetch_add(ack.rejected, Ordering::Relaxed);
    }

    /// Rows streamed from now on name `job` on these GPUs (`None`: no job).
    pub(crate) fn set_job(&self, gpus: &[pb::GpuSlot], job: Option<u64>) {
        let mut jobs = lock(&self.gpu_jobs);
        for g in gpus {
            match job {
                Some(j) => {
                    jobs.insert(g.index, j);
                }
                None => {
                    jobs.remove(&g.index);
                }
            }
        }
    }

    /// Forgets `job` on whichever GPUs still name it.
    pub(crate) fn clear_job(&self, job: u64) {
        lock(&self.gpu_jobs).retain(|_, j| *j != job);
    }

    pub fn stats(&self) -> BacklogStats {
        BacklogStats {
            produced: self.produced.load(Ordering::Relaxed),
            streamed: self.streamed.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            held: lock(&self.rows).len() as u64,
        }
    }
}

/// The sampling loop's second consumer: feeds the backlog.
#[derive(Debug, Clone)]
pub struct TelemetryTap(pub Arc<Backlog>);

impl RowTap for TelemetryTap {
    fn gpu_rows(&mut self, rows: &[GpuSample]) {
        self.0.push_samples(rows);
    }
}

/// One Parquet row as the scheduler takes it. Metrics the source did not read are sent
/// as 0 (the wire message has no "unknown"); non-finite readings as well, and memory use
/// above the GPU's memory (a faulty GPU's reading, which the Parquet sink nulls too), so
/// that the scheduler does not refuse the row and with it the row's health, which is
/// what quarantines a failing GPU's node.
pub fn to_pb(s: &GpuSample, node: &str, job_id: u64) -> pb::TelemetrySample {
    let finite = |v: Option<f32>| v.filter(|x| x.is_finite()).unwrap_or(0.0);
    let mem_total_bytes = s.mem_total_bytes.unwrap_or(0);
    let mem_used_bytes = s
        .mem_used_bytes
        .filter(|&used| mem_total_bytes == 0 || used <= mem_total_bytes)
        .unwrap_or(0);
    pb::TelemetrySample {
        node: node.to_string(),
        gpu_index: s.gpu_index as u32,
        timestamp_us: s.timestamp_us,
        sm_util_pct: finite(s.sm_util_pct).clamp(0.0, 100.0),
        mem_used_bytes,
        mem_total_bytes,
        temperature_c: finite(s.temperature_c),
        power_w: s.power_mw.map_or(0.0, |mw| mw as f32 / 1000.0),
        health: match s.health {
            Health::Ok => pb::GpuHealth::Ok,
            Health::Degraded => pb::GpuHealth::Degraded,
            Health::Failed => pb::GpuHealth::Failed,
        } as i32,
        job_id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_the_scheduler_would_refuse_are_sent_as_unknown_and_health_goes_through() {
        let faulty = GpuSample {
            gpu_index: 3,
            sm_util_pct: Some(f32::NAN),
            temperature_c: Some(f32::INFINITY),
            mem_used_bytes: Some(90 << 30),
            mem_total_bytes: Some(80 << 30),
            health: Health::Failed,
            ..Default::default()
        };
        let row = to_pb(&faulty, "n", 7);
        assert_eq!((row.sm_util_pct, row.temperature_c), (0.0, 0.0));
        assert_eq!((row.mem_used_bytes, row.mem_total_bytes), (0, 80 << 30));
        assert_eq!(row.health, pb::GpuHealth::Failed as i32);
        // A plausible reading, or one without a total, is sent as read.
        let fine = GpuSample {
            mem_used_bytes: Some(10 << 30),
            mem_total_bytes: Some(80 << 30),
            ..faulty.clone()
        };
        assert_eq!(to_pb(&fine, "n", 7).mem_used_bytes, 10 << 30);
        let no_total = GpuSample {
            mem_total_bytes: None,
            ..faulty
        };
        assert_eq!(to_pb(&no_total, "n", 7).mem_used_bytes, 90 << 30);
    }

    fn row(t: i64) -> pb::TelemetrySample {
        pb::TelemetrySample {
            node: "n".into(),
            timestamp_us: t,
            ..Default::default()
        }
    }

    #[test]
    fn the_backlog_keeps_the_most_recent_rows_and_counts_the_rest() {
        let b = Backlog::new("n", 3);
        b.push((1..=5).map(row));
        let s = b.stats();
        assert_eq!((s.produced, s.dropped, s.held), (5, 2, 3));
        let taken = b.take(2);
        assert_eq!(
            taken.iter().map(|r| r.timestamp_us).collect::<Vec<_>>(),
            vec![3, 4]
        );
        // Delivery failed: back to the front, older than what arrived since.
        b.push([row(6)]);
        b.put_back(taken);
        // 3, 4, 5, 6 is one too many: the oldest (3) goes.
        let all: Vec<i64> = b.take(10).iter().map(|r| r.timestamp_us).collect();
        assert_eq!(all, vec![4, 5, 6]);
        let s = b.stats();
        assert_eq!((s.produced, s.dropped, s.held), (6, 3, 0));
        b.acked(&pb::TelemetryAck {
            accepted: 2,
            rejected: 1,
            first_error: String::new(),
        });
        assert_eq!((b.stats().streamed, b.stats().rejected), (2, 1));
    }

    #[test]
    fn rows_name_the_scheduler_job_on_their_gpu() {
        let b = Backlog::new("node-a", 10);
        let slot = |i| pb::GpuSlot {
            index: i,
            milli: 1000,
            ..Default::default()
        };
        b.set_job(&[slot(1)], Some(42));
        let mut s = GpuSample {
            timestamp_us: 7,
            gpu_index: 1,
            sm_util_pct: Some(f32::NAN),
            power_mw: Some(300_000),
            health: Health::Degraded,
            ..Default::default()
        };
        b.push_samples(std::slice::from_ref(&s));
        s.gpu_index = 0;
        b.push_samples(&[s]);
        let rows = b.take(10);
        assert_eq!(rows[0].node, "node-a");
        assert_eq!((rows[0].job_id, rows[1].job_id), (42, 0));
        assert_eq!(rows[0].sm_util_pct, 0.0);
        assert_eq!(rows[0].health, pb::GpuHealth::Degraded as i32);
        b.clear_job(42);
        b.push_samples(&[GpuSample {
            gpu_index: 1,
            ..Default::default()
        }]);
        assert_eq!(b.take(1)[0].job_id, 0);
    }
}
