//! From the two replays' logs to per-job rows, the side-by-side report and the
//! allocation over time.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::domain::{GpuDemand, Job, JobId, Placement, TopoLevel, Topology};
use crate::shadow::recorded::{INCUMBENT, Prepared};
use crate::shadow::{LiveReport, Logs, Recorded, origin};
use crate::sim::{LogEntry, LogKind, percentile};

/// One job of the log: what the incumbent did (recorded and replayed) and what Marshal
/// would have done. Times are seconds in the log's clock; placements are
/// `node:gpu[,gpu…]` per worker (`@milli` for a share), `;`-separated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRow {
    pub job_id: u32,
    pub name: String,
    /// GPUs asked for: a count, or a fraction of one GPU.
    pub gpus: f64,
    pub created_s: f64,
    pub recorded_start_s: Option<f64>,
    pub recorded_end_s: f64,
    pub recorded_node: Option<String>,
    /// `completed`, `rejected` (never fits this cluster), `not_replayed` (the incumbent
    /// never scheduled it: no run time) or `unfinished`.
    pub incumbent_status: String,
    pub incumbent_start_s: Option<f64>,
    /// How much later than recorded the replay could start it (0: on time).
    pub incumbent_delay_s: Option<f64>,
    pub incumbent_placement: Option<String>,
    pub incumbent_finish_s: Option<f64>,
    pub marshal_status: String,
    pub marshal_start_s: Option<f64>,
    pub marshal_placement: Option<String>,
    pub marshal_finish_s: Option<f64>,
    /// Which path decided Marshal's (first) placement.
    pub marshal_path: Option<String>,
    /// Why Marshal rejected it, when it did.
    pub marshal_reason: Option<String>,
    pub preemptions: u32,
    /// Marshal's start minus the incumbent's (negative: Marshal starts it sooner).
    pub start_delta_s: Option<f64>,
}

/// One side's measures. Keys shared with `marshal sim`'s output mean the same, except
/// that waits and JCTs count from the job's *creation* on both sides.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SideSummary {
    pub policy: String,
    pub jobs: u64,
    pub completed: u64,
    /// Never fit the cluster, or could not be placed even on the idle cluster.
    pub rejected: u64,
    pub jct_mean_s: Option<f64>,
    pub jct_p50_s: Option<f64>,
    pub jct_p95_s: Option<f64>,
    pub jct_p99_s: Option<f64>,
    /// Wait from creation to first start.
    pub queue_mean_s: Option<f64>,
    pub queue_p50_s: Option<f64>,
    pub queue_p95_s: Option<f64>,
    pub queue_p99_s: Option<f64>,
    /// From the first creation to this side's last finish.
    pub makespan_s: Option<f64>,
    /// Time-averaged share of GPU capacity allocated over the common window.
    pub gpu_alloc_pct: f64,
    pub gpu_hours_allocated: f64,
    /// GPU capacity left unallocated over the common window.
    pub gpu_hours_idle: f64,
    pub locality_pct: Option<f64>,
    pub preemptions: u64,
}

/// Marshal minus incumbent, for each measure both sides have.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Effect {
    pub queue_mean_s: Option<f64>,
    pub queue_p50_s: Option<f64>,
    pub queue_p95_s: Option<f64>,
    pub queue_p99_s: Option<f64>,
    pub jct_mean_s: Option<f64>,
    pub jct_p50_s: Option<f64>,
    pub jct_p95_s: Option<f64>,
    pub jct_p99_s: Option<f64>,
    pub gpu_hours_idle: f64,
    pub rejected: i64,
    /// Jobs both sides started: Marshal sooner, later, at the same time.
    pub started_sooner: u64,
    pub started_later: u64,
    pub started_same: u64,
}

/// The estimated effect of running Marshal instead of the incumbent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ShadowReport {
    pub mode: String,
    pub trace: String,
    pub cluster: String,
    pub gpus: u64,
    pub seed: u64,
    /// Marshal's policy.
    pub policy: String,
    /// How the incumbent replay places jobs: the recorded node, else this heuristic.
    pub incumbent_placer: String,
    pub jobs_in_log: u64,
    pub replayed: u64,
    /// Never scheduled by the incumbent: no recorded run time, so in neither replay.
    pub not_replayed: u64,
    /// Recorded starts the cluster model could not honour (no room then): started later.
    pub incumbent_recorded_start_delayed: u64,
    pub incumbent_delay_mean_s: Option<f64>,
    pub incumbent_delay_max_s: Option<f64>,
    /// Recorded nodes this cluster has no node of that name for.
    pub incumbent_recorded_node_unknown: u64,
    /// The common window both sides' allocation is measured over.
    pub window_s: f64,
    pub incumbent: SideSummary,
    pub marshal: SideSummary,
    pub effect: Effect,
    /// The learned policy only: share of its placements the fallback heuristic made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_rate: Option<f64>,
    /// A live shadow log's join with the incumbent's outcomes, and Marshal's
    /// recommendations against them (only when the log came from live mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<LiveReport>,
}

#[derive(Clone, Debug, Default)]
struct Fate {
    start: Option<f64>,
    placement: Option<Placement>,
    finish: Option<f64>,
    rejected: Option<String>,
    preemptions: u32,
}

fn fates(log: &[LogEntry], by_id: &HashMap<JobId, usize>, n: usize) -> Vec<Fate> {
    let mut out = vec![Fate::default(); n];
    for e in log {
        let Some(&i) = by_id.get(&e.job) else {
            continue;
        };
        let f = &mut out[i];
        match &e.what {
            LogKind::Start(p) if f.start.is_none() => {
                f.start = Some(e.time);
                f.placement = Some(p.clone());
            }
            LogKind::Start(_) => {}
            // A migration is an interruption too (a checkpoint-restart).
            LogKind::Preempt | LogKind::Migrate | LogKind::Fail => f.preemptions += 1,
            LogKind::Finish => f.finish = Some(e.time),
            LogKind::Reject(why) => f.rejected = Some(why.clone()),
        }
    }
    out
}

fn status(replayed: bool, f: &Fate) -> &'static str {
    match (replayed, f.finish, &f.rejected) {
        (false, _, _) => "not_replayed",
        (_, Some(_), _) => "completed",
        (_, None, Some(_)) => "rejected",
        _ => "unfinished",
    }
}

/// `node:gpu,gpu;node:gpu@milli`.
pub(crate) fn placement_text(p: &Placement, topo: &Topology) -> String {
    p.workers
        .iter()
        .map(|w| {
            let gpus: Vec<String> = w
                .gpus
                .iter()
                .map(|s| {
                    let index = topo.gpu(s.gpu).index;
                    if s.milli < 1000 {
                        format!("{index}@{}", s.milli)
                    } else {
                        index.to_string()
                    }
                })
                .collect();
            format!("{}:{}", topo.node(w.node).name, gpus.join(","))
        })
        .collect::<Vec<_>>()
        .join(";")
}

fn gpus_asked(job: &Job) -> f64 {
    match job.gpu {
        GpuDemand::Milli(m) => f64::from(m) / 1000.0,
        _ => f64::from(job.gpu_count()),
    }
}

fn milli(p: &Placement) -> i64 {
    p.workers
        .iter()
        .flat_map(|w| &w.gpus)
        .map(|s| i64::from(s.milli))
        .sum()
}

/// The allocated milli-GPUs as steps `(time, change)`, in log order.
fn alloc_steps(log: &[LogEntry]) -> Vec<(f64, i64)> {
    let mut held: HashMap<JobId, i64> = HashMap::new();
    let mut steps = Vec::with_capacity(log.len());
    for e in log {
        match &e.what {
            LogKind::Start(p) => {
                let m = milli(p);
                held.insert(e.job, m);
                steps.push((e.time, m));
            }
            LogKind::Finish | LogKind::Preempt | LogKind::Migrate | LogKind::Fail => {
                if let Some(m) = held.remove(&e.job) {
                    steps.push((e.time, -m));
                }
            }
            LogKind::Reject(_) => {}
        }
    }
    steps
}

/// Integral of the allocated milli-GPUs over `[from, to)` split into buckets of `width`.
fn integrate(steps: &[(f64, i64)], from: f64, to: f64, width: f64) -> Vec<f64> {
    let buckets = (((to - from) / width).ceil().max(1.0)) as usize;
    let mut out = vec![0.0; buckets];
    let mut level = 0i64;
    let mut t = from;
    let add = |a: f64, b: f64, level: i64, out: &mut Vec<f64>| {
        let mut a = a.max(from);
        let b = b.min(to);
        while a < b {
            let k = (((a - from) / width) as usize).min(buckets - 1);
            let edge = (from + (k + 1) as f64 * width).min(b);
            let edge = if edge <= a { b } else { edge };
            out[k] += level as f64 * (edge - a);
            a = edge;
        }
    };
    for &(time, delta) in steps {
        if time > t {
            add(t, time, level, &mut out);
            t = time;
        }
        level += delta;
    }
    add(t, to, level, &mut out);
    out
}

/// Most points of [`allocation_series`]: hourly for about 11 years. A longer window (an
/// export with a job "ending" in the year 3000) gets wider buckets instead of a series
/// that would not fit in memory.
pub const MAX_ALLOCATION_POINTS: u64 = 100_000;

/// GPU capacity allocated per hour from the first creation, in percent, for each log:
/// `(hour at the bucket's start, incumbent %, marshal %)`. Buckets are one hour wide, or
/// the fewest whole hours that keep the series within [`MAX_ALLOCATION_POINTS`].
pub fn allocation_series(topo: &Topology, jobs: &[Job], logs: &Logs<'_>) -> Vec<(u64, f64, f64)> {
    let from = origin(jobs);
    let to = window_end(from, logs);
    let cap = f64::from(topo.gpu_count()) * 1000.0;
    let hours_per_bucket = hours_per_bucket(to - from);
    let width = 3600.0 * hours_per_bucket;
    let a = integrate(&alloc_steps(logs[0]), from, to, width);
    let b = integrate(&alloc_steps(logs[1]), from, to, width);
    a.iter()
        .zip(&b)
        .enumerate()
        .map(|(k, (x, y))| {
            let span = (to - (from + k as f64 * width))
                .min(width)
                .max(f64::MIN_POSITIVE);
            (
                k as u64 * hours_per_bucket as u64,
                x / (cap * span) * 100.0,
                y / (cap * span) * 100.0,
            )
        })
        .collect()
}

/// Whole hours per bucket for a window of `seconds`: 1, or the fewest that keep the
/// series within [`MAX_ALLOCATION_POINTS`].
fn hours_per_bucket(seconds: f64) -> f64 {
    let hours = (seconds / 3600.0).ceil().max(1.0);
    (hours / MAX_ALLOCATION_POINTS as f64).ceil().max(1.0)
}

fn window_end(from: f64, logs: &Logs<'_>) -> f64 {
    logs.iter()
        .flat_map(|l| l.iter().map(|e| e.time))
        .fold(from, f64::max)
}

/// Both replays and what they were replayed from.
pub(crate) struct Sides<'a> {
    pub topo: &'a Topology,
    pub jobs: &'a [Job],
    pub recorded: &'a [Recorded],
    pub prepared: &'a Prepared,
    pub incumbent: &'a [LogEntry],
    pub marshal: &'a [LogEntry],
    pub paths: &'a HashMap<JobId, String>,
}

impl Sides<'_> {
    fn fates(&self) -> (Vec<bool>, Vec<Fate>, Vec<Fate>) {
        let by_id = self.prepared.by_id();
        let mut replayed = vec![false; self.jobs.len()];
        for &i in &self.prepared.index {
            replayed[i] = true;
        }
        let n = self.jobs.len();
        (
            replayed,
            fates(self.incumbent, &by_id, n),
            fates(self.marshal, &by_id, n),
        )
    }

    pub fn rows(&self) -> Vec<JobRow> {
        let (replayed, inc, mar) = self.fates();
        let text = |p: &Option<Placement>| p.as_ref().map(|p| placement_text(p, self.topo));
        self.jobs
            .iter()
            .zip(self.recorded)
            .enumerate()
            .map(|(i, (job, rec))| {
                let (fi, fm) = (&inc[i], &mar[i]);
                JobRow {
                    job_id: job.id.0,
                    name: job.name.clone(),
                    gpus: gpus_asked(job),
                    created_s: job.submit_time,
                    recorded_start_s: rec.scheduled,
                    recorded_end_s: rec.ended,
                    recorded_node: rec.node.clone(),
                    incumbent_status: status(replayed[i], fi).into(),
                    incumbent_start_s: fi.start,
                    incumbent_delay_s: fi.start.zip(rec.scheduled).map(|(s, r)| s - r),
                    incumbent_placement: text(&fi.placement),
                    incumbent_finish_s: fi.finish,
                    marshal_status: status(replayed[i], fm).into(),
                    marshal_start_s: fm.start,
                    marshal_placement: text(&fm.placement),
                    marshal_finish_s: fm.finish,
                    marshal_path: self.paths.get(&job.id).cloned(),
                    marshal_reason: fm.rejected.clone(),
                    preemptions: fm.preemptions,
                    start_delta_s: fm.start.zip(fi.start).map(|(m, s)| m - s),
                }
            })
            .collect()
    }

    pub fn report(
        &self,
        trace: &str,
        seed: u64,
        policy: &str,
        incumbent_placer: &str,
        rows: &[JobRow],
    ) -> ShadowReport {
        let (_, inc, mar) = self.fates();
        let from = origin(self.jobs);
        let to = window_end(from, &[self.incumbent, self.marshal]);
        let incumbent = self.side(INCUMBENT, &inc, self.incumbent, from, to);
        let marshal = self.side(policy, &mar, self.marshal, from, to);
        let mut delays: Vec<f64> = rows
            .iter()
            .filter_map(|r| r.incumbent_delay_s)
            .filter(|&d| d > 0.0)
            .collect();
        let d =
            |f: fn(&SideSummary) -> Option<f64>| f(&marshal).zip(f(&incumbent)).map(|(m, i)| m - i);
        let deltas: Vec<f64> = rows.iter().filter_map(|r| r.start_delta_s).collect();
        let effect = Effect {
            queue_mean_s: d(|s| s.queue_mean_s),
            queue_p50_s: d(|s| s.queue_p50_s),
            queue_p95_s: d(|s| s.queue_p95_s),
            queue_p99_s: d(|s| s.queue_p99_s),
            jct_mean_s: d(|s| s.jct_mean_s),
            jct_p50_s: d(|s| s.jct_p50_s),
            jct_p95_s: d(|s| s.jct_p95_s),
            jct_p99_s: d(|s| s.jct_p99_s),
            gpu_hours_idle: marshal.gpu_hours_idle - incumbent.gpu_hours_idle,
            rejected: marshal.rejected as i64 - incumbent.rejected as i64,
            started_sooner: deltas.iter().filter(|&&x| x < 0.0).count() as u64,
            started_later: deltas.iter().filter(|&&x| x > 0.0).count() as u64,
            started_same: deltas.iter().filter(|&&x| x == 0.0).count() as u64,
        };
        ShadowReport {
            mode: "shadow".into(),
            trace: trace.into(),
            cluster: self.topo.name.clone(),
            gpus: u64::from(self.topo.gpu_count()),
            seed,
            policy: policy.into(),
            incumbent_placer: incumbent_placer.into(),
            jobs_in_log: self.jobs.len() as u64,
            replayed: self.prepared.index.len() as u64,
            not_replayed: (self.jobs.len() - self.prepared.index.len()) as u64,
            incumbent_recorded_start_delayed: delays.len() as u64,
            incumbent_delay_mean_s: mean(&delays),
            incumbent_delay_max_s: percentile(&mut delays, 1.0),
            incumbent_recorded_node_unknown: 0,
            window_s: to - from,
            incumbent,
            marshal,
            effect,
            fallback_rate: None,
            live: None,
        }
    }

    fn side(
        &self,
        policy: &str,
        fates: &[Fate],
        log: &[LogEntry],
        from: f64,
        to: f64,
    ) -> SideSummary {
        let mut jct = Vec::new();
        let mut queue = Vec::new();
        let (mut multi, mut local) = (0u64, 0u64);
        let mut last = None::<f64>;
        for &i in &self.prepared.index {
            let (job, f) = (&self.jobs[i], &fates[i]);
            if let Some(s) = f.start {
                queue.push(s - job.submit_time);
            }
            if let Some(e) = f.finish {
                jct.push(e - job.submit_time);
                last = Some(last.map_or(e, |l: f64| l.max(e)));
            }
            if let Some(p) = &f.placement
                && job.gpu_count() > 1
            {
                multi += 1;
                let tight = self
                    .topo
                    .tightest_level_for(job.gpu_count())
                    .max(TopoLevel::NvlinkIsland);
                if p.span(self.topo) <= tight {
                    local += 1;
                }
            }
        }
        let cap = f64::from(self.topo.gpu_count()) * 1000.0;
        let allocated: f64 = integrate(&alloc_steps(log), from, to, (to - from).max(1.0))
            .iter()
            .sum();
        let window = to - from;
        SideSummary {
            policy: policy.into(),
            jobs: self.prepared.index.len() as u64,
            completed: jct.len() as u64,
            rejected: fates.iter().filter(|f| f.rejected.is_some()).count() as u64,
            jct_mean_s: mean(&jct),
            jct_p50_s: percentile(&mut jct, 0.5),
            jct_p95_s: percentile(&mut jct, 0.95),
            jct_p99_s: percentile(&mut jct, 0.99),
            queue_mean_s: mean(&queue),
            queue_p50_s: percentile(&mut queue, 0.5),
            queue_p95_s: percentile(&mut queue, 0.95),
            queue_p99_s: percentile(&mut queue, 0.99),
            makespan_s: last.map(|l| l - from),
            gpu_alloc_pct: if window > 0.0 {
                allocated / (cap * window) * 100.0
            } else {
                0.0
            },
            gpu_hours_allocated: allocated / 1000.0 / 3600.0,
            gpu_hours_idle: (cap * window - allocated).max(0.0) / 1000.0 / 3600.0,
            locality_pct: (multi > 0).then(|| local as f64 / multi as f64 * 100.0),
            preemptions: fates.iter().map(|f| u64::from(f.preemptions)).sum(),
        }
    }
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integration_splits_steps_across_buckets() {
        // 1000 milli from t=10 to t=70, 500 more from 30 to 40; hourly-like buckets of 50.
        let steps = [(10.0, 1000), (30.0, 500), (40.0, -500), (70.0, -1000)];
        let b = integrate(&steps, 0.0, 100.0, 50.0);
        assert_eq!(b, vec![1000.0 * 40.0 + 500.0 * 10.0, 1000.0 * 20.0]);
        assert_eq!(integrate(&steps, 0.0, 100.0, 100.0), vec![65_000.0]);
    }

    #[test]
    fn a_window_of_centuries_gets_wider_buckets_not_a_series_too_large_to_hold() {
        assert_eq!(hours_per_bucket(0.0), 1.0);
        assert_eq!(hours_per_bucket(3600.0 * 99_999.5), 1.0);
        assert_eq!(hours_per_bucket(3600.0 * 100_001.0), 2.0);
        for seconds in [1e9, 1e12, 1e15] {
            let width = 3600.0 * hours_per_bucket(seconds);
            let points = integrate(&[(0.0, 1000)], 0.0, seconds, width).len() as u64;
            assert!(
                points <= MAX_ALLOCATION_POINTS,
                "{seconds} s: {points} points"
            );
        }
    }
}
