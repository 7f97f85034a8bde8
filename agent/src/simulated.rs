//! Simulated telemetry: per-GPU samples and step profiles of the jobs a simulator replay
//! ran, so that the trainer has realistic data with ground truth, and an agent can run
//! without a GPU.
//!
//! The replay log says which job ran on which GPUs when; the speed model says how fast.
//! From those, at any simulated time, each GPU's sample follows its job's phase:
//!
//! - **warm-up** (the job's restart delay after each start): memory ramps from 10 % to
//!   the steady level, the SMs idle at 15 %;
//! - **steady**: SM utilisation = `base_util_pct` × the compute share of a step on this
//!   placement, `(1 − c) / (1 − c + c·ref/bw)` with the job's communication share `c` and
//!   the bandwidth `bw` of the level its gang spans (the speed model's own terms, so the
//!   utilisation and the simulated speed agree); NVLink counters grow at the link's
//!   bandwidth for the communicating share of the time when the gang is inside one
//!   NVLink island, PCIe counters (towards the NIC) when it spans nodes;
//! - **evaluation** every `eval_every_s` for `eval_s`: memory at `eval_mem_fraction` of
//!   steady (no gradients or optimiser state), SMs at the steady level;
//! - **checkpoint** (the last `cost_s` of each checkpoint cycle): SMs at 5 %, memory
//!   steady, PCIe carrying the model state to the host.
//!
//! Steady memory per GPU is the kind's measured peak ([`WorkloadKind::peak_memory_gib`])
//! where there is one, else `default_mem_fraction` of the GPU, scaled by the worker's
//! share of a shared GPU and capped at the GPU's memory.
//!
//! Injected faults (seeded, per run or per node): **stragglers** — one GPU of a gang
//! computes at `straggler_speed`, the others wait for it (their utilisation falls by that
//! factor and the job's steps take `1 / straggler_speed` longer); **degraded links** — a
//! node's links run at `degraded_link_speed` of their bandwidth, its GPUs report
//! `degraded` health and its jobs communicate longer. Noise: utilisation and memory are
//! multiplied by `1 + noise·z`, `z` a deterministic function of (seed, GPU, time), so
//! the same seed gives the same data in any sampling order.
//!
//! Ground truth comes with the data: each step profile row carries the true step time
//! (the job's reference step time over its speed and fault factors) and phase.
//!
//! What is *not* modelled from data: the phase schedule (warm-up, evaluation, checkpoint
//! timing), the evaluation memory fraction, power and temperature (a linear function of
//! utilisation between idle and board power) — they follow the documented parameters,
//! not a measurement. Values are quantised as NVML reports them (whole percents, MiB,
//! whole degrees, milliwatts).

use std::sync::Arc;

use marshal_scheduler::domain::{
    CommPattern, Job, JobId, NodeId, Placement, TopoLevel, Topology, WorkloadKind,
};
use marshal_scheduler::sim::{LogEntry, LogKind, SpeedModel};
use marshal_telemetry::{GpuSample, Health, MemPhase, Source, StepProfile};

use crate::AgentError;

/// Parameters of the simulated series (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct SimTelemetryOptions {
    pub cluster: String,
    /// Wall-clock time (µs since the epoch) of simulated time 0.
    pub epoch_us: i64,
    pub seed: u64,
    /// Relative standard deviation of utilisation and memory noise.
    pub noise: f64,
    /// Share of runs with a straggling GPU.
    pub straggler_fraction: f64,
    pub straggler_speed: f64,
    /// Share of nodes whose links are degraded.
    pub degraded_node_fraction: f64,
    pub degraded_link_speed: f64,
    pub base_util_pct: f64,
    pub default_mem_fraction: f64,
    pub eval_every_s: f64,
    pub eval_s: f64,
    pub eval_mem_fraction: f64,
}

impl Default for SimTelemetryOptions {
    fn default() -> Self {
        SimTelemetryOptions {
            cluster: "sim".into(),
            epoch_us: 1_700_000_000_000_000,
            seed: 42,
            noise: 0.03,
            straggler_fraction: 0.0,
            straggler_speed: 0.7,
            degraded_node_fraction: 0.0,
            degraded_link_speed: 0.25,
            base_util_pct: 92.0,
            default_mem_fraction: 0.6,
            eval_every_s: 3600.0,
            eval_s: 180.0,
            eval_mem_fraction: 0.6,
        }
    }
}

impl SimTelemetryOptions {
    pub fn validate(&self) -> Result<(), AgentError> {
        let unit = |name: &str, v: f64, zero_ok: bool| {
            let ok = v.is_finite() && v <= 1.0 && if zero_ok { v >= 0.0 } else { v > 0.0 };
            if ok {
                Ok(())
            } else {
                Err(AgentError::Config(format!(
                    "{name} = {v} must be in {}",
                    if zero_ok { "[0, 1]" } else { "(0, 1]" }
                )))
            }
        };
        unit("noise", self.noise, true)?;
        unit("straggler fraction", self.straggler_fraction, true)?;
        unit("straggler speed", self.straggler_speed, false)?;
        unit("degraded node fraction", self.degraded_node_fraction, true)?;
        unit("degraded link speed", self.degraded_link_speed, false)?;
        unit("default memory fraction", self.default_mem_fraction, false)?;
        unit("evaluation memory fraction", self.eval_mem_fraction, false)?;
        if !(self.base_util_pct.is_finite()
            && self.base_util_pct > 0.0
            && self.base_util_pct <= 100.0)
        {
            return Err(AgentError::Config(format!(
                "base utilisation {} % must be in (0, 100]",
                self.base_util_pct
            )));
        }
        if !(self.eval_every_s.is_finite()
            && self.eval_s.is_finite()
            && self.eval_s >= 0.0
            && self.eval_every_s > self.eval_s)
        {
            return Err(AgentError::Config(
                "evaluation must be shorter than its period".into(),
            ));
        }
        Ok(())
    }
}

/// One stretch of a job on its GPUs, from a start to the next stop.
#[derive(Clone, Debug)]
struct Run {
    job: usize,
    start: f64,
    end: f64,
    placement: Placement,
    span: TopoLevel,
    /// Index in the placement's GPU list of a straggling GPU.
    straggler: Option<usize>,
    degraded: bool,
}

/// Cumulative counters of one GPU.
#[derive(Clone, Debug, Default)]
struct Counters {
    nvlink_tx: u64,
    nvlink_rx: u64,
    last_t: Option<f64>,
}

/// A simulator replay turned into per-GPU telemetry.
#[derive(Debug)]
pub struct SimulatedTelemetry {
    topo: Arc<Topology>,
    jobs: Vec<Job>,
    speed: SpeedModel,
    opts: SimTelemetryOptions,
    runs: Vec<Run>,
    /// Per GPU, indices of the runs that used it, by start time.
    runs_on_gpu: Vec<Vec<usize>>,
    degraded_nodes: Vec<bool>,
    counters: Vec<Counters>,
    /// Nodes sampled (all when empty).
    nodes: Vec<NodeId>,
    uuids: Vec<Arc<str>>,
    names: Vec<Arc<str>>,
    gpu_types: Vec<Arc<str>>,
    cluster: Arc<str>,
}

/// A deterministic standard-normal-ish draw (sum of four uniforms, rescaled) from a
/// 64-bit key, so noise does not depend on the order samples are taken in.
fn gaussian(key: u64) -> f64 {
    let mut x = key;
    let mut sum = 0.0;
    for _ in 0..4 {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        sum += (splitmix64(x) >> 11) as f64 / (1u64 << 53) as f64;
    }
    // Four uniforms: mean 2, variance 1/3.
    (sum - 2.0) * 3f64.sqrt()
}

/// A deterministic draw, uniform on [0, 1), from a 64-bit key: decides which runs
/// straggle and which nodes are degraded, so `P(uniform < f) = f` must hold for the
/// requested shares to be the shares injected. (It once rescaled [`gaussian`], the mean
/// of four uniforms, which put a requested 10 % at 0.1 %.)
fn uniform(key: u64) -> f64 {
    (splitmix64(key.wrapping_add(0x9E37_79B9_7F4A_7C15)) >> 11) as f64 / (1u64 << 53) as f64
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Board power of a GPU model, W (public datasheets; unknown models 300 W).
fn board_power_w(model: &str) -> f64 {
    let m = model.to_ascii_uppercase();
    if m.starts_with("T4") {
        70.0
    } else if m.starts_with("L4") {
        72.0
    } else if m.starts_with("P100") {
        250.0
    } else if m.starts_with("A100") {
        400.0
    } else if m.starts_with("H100") || m.starts_with("H200") {
        700.0
    } else if m.starts_with("A10") {
        150.0
    } else {
        300.0
    }
}

impl SimulatedTelemetry {
    /// `log` is the replay's log of `jobs` on `topo` (as [`marshal_scheduler::sim::run_replay`]
    /// returns it); `speed` the model the replay ran with.
    pub fn new(
        topo: Arc<Topology>,
        jobs: Vec<Job>,
        log: &[LogEntry],
        speed: SpeedModel,
        opts: SimTelemetryOptions,
    ) -> Result<Self, AgentError> {
        opts.validate()?;
        let index_of = |id: JobId| jobs.iter().position(|j| j.id == id);
        let mut open: std::collections::BTreeMap<usize, (f64, Placement)> = Default::default();
        let mut runs = Vec::new();
        for e in log {
            let Some(j) = index_of(e.job) else {
                return Err(AgentError::Config(format!(
                    "the log names job {:?}, which is not in the job list",
                    e.job
                )));
            };
            match &e.what {
                LogKind::Start(p) => {
                    open.insert(j, (e.time, p.clone()));
                }
                LogKind::Preempt | LogKind::Migrate | LogKind::Fail | LogKind::Finish => {
                    if let Some((start, placement)) = open.remove(&j) {
                        runs.push((j, start, e.time, placement));
                    }
                }
                LogKind::Reject(_) => {}
            }
        }
        for (j, (start, placement)) in open {
            runs.push((j, start, f64::INFINITY, placement));
        }
        let degraded_nodes: Vec<bool> = (0..topo.nodes().len())
            .map(|n| {
                uniform(opts.seed ^ 0xDE6A_DED0 ^ ((n as u64) << 20)) < opts.degraded_node_fraction
            })
            .collect();
        let mut runs_on_gpu = vec![Vec::new(); topo.gpus().len()];
        let runs: Vec<Run> = runs
            .into_iter()
            .enumerate()
            .map(|(i, (job, start, end, placement))| {
                let gpus: Vec<_> = placement.gpu_ids().collect();
                for g in &gpus {
                    runs_on_gpu[g.0 as usize].push(i);
                }
                let key = opts.seed ^ 0x5712_A661 ^ ((i as u64) << 24);
                let straggler = (gpus.len() > 1 && uniform(key) < opts.straggler_fraction)
                    .then(|| (uniform(key ^ 1) * gpus.len() as f64) as usize % gpus.len());
                let degraded = placement
                    .workers
                    .iter()
                    .any(|w| degraded_nodes[w.node.0 as usize]);
                Run {
                    job,
                    start,
                    end,
                    span: placement.span(&topo),
                    placement,
                    straggler,
                    degraded,
                }
            })
            .collect();
        for list in &mut runs_on_gpu {
            list.sort_by(|&a, &b| runs[a].start.total_cmp(&runs[b].start));
        }
        let names = topo
            .nodes()
            .iter()
            .map(|n| Arc::from(n.name.as_str()))
            .collect();
        let gpu_types = topo
            .gpus()
            .iter()
            .map(|g| Arc::from(topo.catalog.get(g.model).name.as_str()))
            .collect();
        let uuids = topo
            .gpus()
            .iter()
            .enumerate()
            .map(|(i, _)| Arc::from(format!("GPU-sim-{:08x}-{i:06}", opts.seed as u32)))
            .collect();
        Ok(SimulatedTelemetry {
            counters: vec![Counters::default(); topo.gpus().len()],
            cluster: Arc::from(opts.cluster.as_str()),
            topo,
            jobs,
            speed,
            opts,
            runs,
            runs_on_gpu,
            degraded_nodes,
            nodes: Vec::new(),
            uuids,
            names,
            gpu_types,
        })
    }

    /// Samples only the node named `name` (what an agent on that node sees).
    pub fn only_node(&mut self, name: &str) -> Result<(), AgentError> {
        let id = self
            .topo
            .nodes()
            .iter()
            .position(|n| n.name == name)
            .ok_or_else(|| AgentError::Config(format!("no node {name:?} in the cluster")))?;
        self.nodes = vec![NodeId(id as u32)];
        Ok(())
    }

    /// Simulated seconds until the last job stops.
    pub fn horizon_s(&self) -> f64 {
        self.runs
            .iter()
            .map(|r| if r.end.is_finite() { r.end } else { r.start })
            .fold(0.0, f64::max)
    }

    fn kind(&self, job: &Job) -> Option<&WorkloadKind> {
        self.speed.kind(job)
    }

    /// The phase of `run` at time `t` (inside the run).
    pub fn phase(&self, run_index: usize, t: f64) -> MemPhase {
        let run = &self.runs[run_index];
        let job = &self.jobs[run.job];
        let c = &job.checkpoint;
        let since = t - run.start;
        if since < c.restart_s {
            return MemPhase::Warmup;
        }
        let productive = since - c.restart_s;
        if productive % (c.interval_s + c.cost_s) >= c.interval_s {
            return MemPhase::Checkpoint;
        }
        if productive % self.opts.eval_every_s >= self.opts.eval_every_s - self.opts.eval_s {
            return MemPhase::Eval;
        }
        MemPhase::Steady
    }

    fn active_runs(&self, gpu: usize, t: f64) -> impl Iterator<Item = usize> + '_ {
        self.runs_on_gpu[gpu]
            .iter()
            .copied()
            .take_while(move |&r| self.runs[r].start <= t)
            .filter(move |&r| t < self.runs[r].end)
    }

    /// Bandwidth of the level a run's gang spans, degraded if its links are.
    fn run_bandwidth(&self, run: &Run) -> f64 {
        let bw = self.topo.bandwidth(run.span.max(TopoLevel::NvlinkIsland));
        if run.degraded {
            bw * self.opts.degraded_link_speed
        } else {
            bw
        }
    }

    /// Share of a step spent computing on this run's placement.
    fn compute_share(&self, run: &Run) -> f64 {
        let job = &self.jobs[run.job];
        let c = if job.gpu_count() > 1 {
            self.speed.comm_share(job)
        } else {
            0.0
        };
        let comm = c * self.speed.reference_gbps / self.run_bandwidth(run);
        (1.0 - c) / (1.0 - c + comm)
    }

    /// Steady memory of one worker share of `run` on `gpu`, bytes.
    fn steady_bytes(&self, run: &Run, gpu: usize, total: f64) -> f64 {
        let job = &self.jobs[run.job];
        let share = run
            .placement
            .workers
            .iter()
            .flat_map(|w| &w.gpus)
            .find(|s| s.gpu.0 as usize == gpu)
            .map_or(1.0, |s| f64::from(s.milli) / 1000.0);
        // A measured peak is the worker's own; the default is a share of the GPU it holds.
        match self.kind(job).and_then(|k| k.peak_memory_gib()) {
            Some(gib) => (gib * (1u64 << 30) as f64).min(total),
            None => self.opts.default_mem_fraction * total * share,
        }
    }

    /// True step time of `run` at `t`, seconds, if its kind has a reference step time.
    fn step_time(&self, run: &Run, t: f64) -> Option<f64> {
        let job = &self.jobs[run.job];
        let reference = self.kind(job)?.reference_step_time_s?;
        let topo = &self.topo;
        let mut throughput = f64::INFINITY;
        let mut tenants = 1u16;
        for g in run.placement.gpu_ids() {
            throughput = throughput.min(
                self.speed
                    .gpu_throughput(job, topo.catalog.get(topo.gpu(g).model)),
            );
            tenants = tenants.max(self.active_runs(g.0 as usize, t).count() as u16);
        }
        let locality = self.speed.locality(topo, job, run.span)
            * if run.degraded {
                // The same formula with the degraded bandwidth.
                let c = self.speed.comm_share(job);
                let bw = self.topo.bandwidth(run.span.max(TopoLevel::NvlinkIsland));
                (1.0 - c + c * self.speed.reference_gbps / bw)
                    / (1.0 - c + c * self.speed.reference_gbps / self.run_bandwidth(run))
            } else {
                1.0
            };
        let straggle = if run.straggler.is_some() {
            self.opts.straggler_speed
        } else {
            1.0
        };
        let speed = throughput * locality * self.speed.interference_factor(job, tenants) * straggle;
        (speed > 0.0).then(|| reference / speed)
    }

    /// Every sampled GPU at simulated time `t` (seconds).
    pub fn sample_at(&mut self, t: f64) -> Vec<GpuSample> {
        let nodes: Vec<NodeId> = if self.nodes.is_empty() {
            (0..self.topo.nodes().len() as u32).map(NodeId).collect()
        } else {
            self.nodes.clone()
        };
        let timestamp_us = self.opts.epoch_us + (t * 1e6) as i64;
        let tick = (t * 1000.0) as u64;
        let mut out = Vec::new();
        for node in nodes {
            let n = self.topo.node(node).clone();
            for g in n.gpus.clone() {
                out.push(self.sample_gpu(g as usize, node, t, tick, timestamp_us));
            }
        }
        out
    }

    fn sample_gpu(
        &mut self,
        g: usize,
        node: NodeId,
        t: f64,
        tick: u64,
        timestamp_us: i64,
    ) -> GpuSample {
        let topo = self.topo.clone();
        let gpu = topo.gpu(marshal_scheduler::domain::GpuId(g as u32));
        let model = topo.catalog.get(gpu.model);
        let total = model.memory_gib * (1u64 << 30) as f64;
        let node_info = topo.node(node);
        let has_nvlink = node_info.island_size > 1;
        let key = self.opts.seed ^ ((g as u64) << 40) ^ tick;
        let noise = |k: u64| (1.0 + self.opts.noise * gaussian(key ^ k)).max(0.0);

        let mut util = 0.0;
        let mut mem = 0.0;
        let mut nvlink_rate = 0.0;
        let mut pcie_tx = 0.0;
        let mut pcie_rx = 0.0;
        let mut job_id = None;
        let mut worker = None;
        let mut phase = None;
        let active: Vec<usize> = self.active_runs(g, t).collect();
        for &r in &active {
            let run = &self.runs[r];
            let job = &self.jobs[run.job];
            let p = self.phase(r, t);
            let steady = self.steady_bytes(run, g, total);
            let compute = self.compute_share(run);
            let position = run.placement.gpu_ids().position(|x| x.0 as usize == g);
            let waits = run.straggler.is_some_and(|s| Some(s) != position);
            let straggle = if waits {
                self.opts.straggler_speed
            } else {
                1.0
            };
            let comm_time = 1.0 - compute;
            let bw_bytes = self.run_bandwidth(run) * 1e9;
            let (u, m) = match p {
                MemPhase::Warmup => {
                    let ramp =
                        ((t - run.start) / job.checkpoint.restart_s.max(1e-9)).clamp(0.0, 1.0);
                    (15.0, steady * (0.1 + 0.9 * ramp))
                }
                MemPhase::Checkpoint => {
                    pcie_tx += steady / job.checkpoint.cost_s.max(1.0);
                    (5.0, steady)
                }
                MemPhase::Eval => (
                    self.opts.base_util_pct * compute * straggle,
                    steady * self.opts.eval_mem_fraction,
                ),
                MemPhase::Steady => {
                    if job.gpu_count() > 1 {
                        if run.span <= TopoLevel::NvlinkIsland && has_nvlink {
                            nvlink_rate += comm_time * bw_bytes;
                        } else {
                            pcie_tx += comm_time * bw_bytes;
                            pcie_rx += comm_time * bw_bytes;
                        }
                    }
                    (self.opts.base_util_pct * compute * straggle, steady)
                }
            };
            util += u / active.len() as f64;
            mem += m;
            if job_id.is_none() {
                job_id = Some(Arc::from(job.name.as_str()));
                worker = run
                    .placement
                    .workers
                    .iter()
                    .position(|w| w.gpus.iter().any(|s| s.gpu.0 as usize == g))
                    .map(|w| Arc::from(w.to_string().as_str()));
                phase = Some(p);
            }
        }
        // NVML reports whole percents, memory in MiB steps, whole degrees and watts to
        // the milliwatt; the simulated series are quantised the same way.
        let util = (util * noise(1)).clamp(0.0, 100.0).round();
        const MIB: f64 = (1u64 << 20) as f64;
        let mem = ((mem * noise(2)).clamp(0.0, total) / MIB).round() * MIB;
        let counters = &mut self.counters[g];
        let dt = counters.last_t.map_or(0.0, |last| (t - last).max(0.0));
        counters.last_t = Some(t);
        let bytes = (nvlink_rate * dt) as u64;
        counters.nvlink_tx = counters.nvlink_tx.wrapping_add(bytes);
        counters.nvlink_rx = counters.nvlink_rx.wrapping_add(bytes);
        let power = board_power_w(&model.name);
        let degraded = self.degraded_nodes[node.0 as usize];
        GpuSample {
            timestamp_us,
            cluster: self.cluster.clone(),
            node: self.names[node.0 as usize].clone(),
            gpu_index: gpu.index,
            gpu_uuid: self.uuids[g].clone(),
            gpu_type: self.gpu_types[g].clone(),
            sm_util_pct: Some(util as f32),
            mem_util_pct: Some((util * 0.6).round() as f32),
            mem_used_bytes: Some(mem as u64),
            mem_total_bytes: Some(total as u64),
            // NVML's units: KiB counters (the byte count floored), KiB/s, milliwatts.
            nvlink_tx_kib: has_nvlink.then_some(counters.nvlink_tx / 1024),
            nvlink_rx_kib: has_nvlink.then_some(counters.nvlink_rx / 1024),
            nvlink_tx_per_link_kib: None,
            nvlink_rx_per_link_kib: None,
            pcie_tx_kib_per_s: Some((pcie_tx / 1024.0).round() as u32),
            pcie_rx_kib_per_s: Some((pcie_rx / 1024.0).round() as u32),
            temperature_c: Some((30.0 + 0.5 * util).round() as f32),
            power_mw: Some(((power * (0.2 + 0.8 * util / 100.0)) * 1000.0).round() as u32),
            sm_clock_mhz: Some(1410),
            mem_clock_mhz: Some(1215),
            throttle_reasons: Some(0),
            ecc_corrected: Some(0),
            ecc_uncorrected: Some(0),
            xid: None,
            health: if degraded {
                Health::Degraded
            } else {
                Health::Ok
            },
            job_id,
            worker,
            mem_phase: phase,
            mig_mode: Some(false),
        }
    }

    /// One step profile per running job (whose kind has a reference step time) at `t`:
    /// its true step time and phase, and peak memory per GPU.
    pub fn step_profiles_at(&self, t: f64) -> Vec<StepProfile> {
        let timestamp_us = self.opts.epoch_us + (t * 1e6) as i64;
        let mut out = Vec::new();
        for (r, run) in self.runs.iter().enumerate() {
            if !(run.start <= t && t < run.end) {
                continue;
            }
            if !self.nodes.is_empty()
                && !run
                    .placement
                    .workers
                    .iter()
                    .any(|w| self.nodes.contains(&w.node))
            {
                continue;
            }
            let Some(step_time) = self.step_time(run, t) else {
                continue;
            };
            let job = &self.jobs[run.job];
            let first = run.placement.gpu_ids().next().map_or(0, |g| g.0 as usize);
            let total = self
                .topo
                .catalog
                .get(
                    self.topo
                        .gpu(marshal_scheduler::domain::GpuId(first as u32))
                        .model,
                )
                .memory_gib
                * (1u64 << 30) as f64;
            let phase = self.phase(r, t);
            let steady = self.steady_bytes(run, first, total);
            let peak = match phase {
                MemPhase::Eval => steady * self.opts.eval_mem_fraction,
                _ => steady,
            };
            let productive = (t - run.start - job.checkpoint.restart_s).max(0.0);
            let tenants = run
                .placement
                .gpu_ids()
                .map(|g| self.active_runs(g.0 as usize, t).count() as u16)
                .max()
                .unwrap_or(1);
            // The mean over the gang of what the samples report, before noise.
            let util = match phase {
                MemPhase::Warmup => 15.0,
                MemPhase::Checkpoint => 5.0,
                MemPhase::Steady | MemPhase::Eval => {
                    let gpus = run.placement.gpu_ids().count().max(1) as f64;
                    let waiting = if run.straggler.is_some() {
                        gpus - 1.0
                    } else {
                        0.0
                    };
                    let factor = (gpus - waiting + waiting * self.opts.straggler_speed) / gpus;
                    self.opts.base_util_pct * self.compute_share(run) * factor / tenants as f64
                }
            };
            let nodes = run
                .placement
                .workers
                .iter()
                .map(|w| w.node)
                .collect::<std::collections::BTreeSet<_>>()
                .len();
            let per_node = run.placement.gpu_ids().count().div_ceil(nodes.max(1));
            out.push(StepProfile {
                timestamp_us,
                job_id: Arc::from(job.name.as_str()),
                step: (productive / step_time) as u64,
                step_time_s: step_time,
                phase: Some(phase),
                peak_mem_bytes: Some(peak as u64),
                gpu_type: self.gpu_types[first].clone(),
                num_gpus: job.gpu_count(),
                placement: Arc::from(format!("{nodes}x{per_node}").as_str()),
                model: self.kind(job).map(|k| Arc::from(k.name.as_str())),
                batch_size: job.batch_size,
                comm: Some(Arc::from(comm_name(job.comm))),
                span: Some(Arc::from(level_name(run.span))),
                tenants: Some(tenants),
                gpu_util_pct: Some(util as f32),
            });
        }
        out
    }
}

fn comm_name(comm: CommPattern) -> &'static str {
    match comm {
        CommPattern::None => "none",
        CommPattern::DataParallel => "data-parallel",
        CommPattern::TensorParallel => "tensor-parallel",
        CommPattern::PipelineParallel => "pipeline-parallel",
    }
}

fn level_name(level: TopoLevel) -> &'static str {
    match level {
        TopoLevel::Gpu => "gpu",
        TopoLevel::NvlinkIsland => "nvlink-island",
        TopoLevel::Node => "node",
        TopoLevel::Rack => "rack",
        TopoLevel::Spine => "spine",
        TopoLevel::Cluster => "cluster",
    }
}

impl Source for SimulatedTelemetry {
    fn sample(&mut self, now_us: i64) -> marshal_telemetry::Result<Vec<GpuSample>> {
        let t = (now_us - self.opts.epoch_us) as f64 / 1e6;
        Ok(self.sample_at(t.max(0.0)))
    }
}

#[cfg(test)]
mod tests {
    use super::uniform;

    #[test]
    fn uniform_draws_give_the_requested_shares() {
        let n = 20_000u64;
        for share in [0.01, 0.1, 0.3, 0.5, 0.9] {
            let hits = (0..n)
                .filter(|&i| uniform(0x5712_A661 ^ (i << 24)) < share)
                .count() as f64;
            let got = hits / n as f64;
            // Five standard errors of a binomial share.
            let tolerance = 5.0 * (share * (1.0 - share) / n as f64).sqrt();
            assert!((got - share).abs() < tolerance, "asked {share}, drew {got}");
        }
    }
}
