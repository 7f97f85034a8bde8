//! Sink throughput (per-GPU rows per second on the one writer thread) and bytes per row
//! on disk, for realistic cluster telemetry.
//!
//! Data: `NODES` nodes × 8 GPUs, one sample per second for `SECS` seconds, generated up
//! front (so the sending thread stays idle and the writer thread has a core to itself)
//! and sent either one node's tick per message (8 rows, what an agent sends) or one
//! cluster tick per message (128 rows, what a collector batching several agents sends).
//! Per GPU:
//! * utilisation: integer percent (as NVML reports it), a slowly drifting level plus
//!   noise; a quarter of the GPUs are idle (no job, 0 %, no traffic);
//! * memory: constant within a job phase (warm-up, steady, eval, checkpoint), stepping at
//!   phase changes;
//! * NVLink byte counters: monotonically increasing, at a rate that follows utilisation
//!   with 2 % noise, in KiB granularity (NVML's unit); PCIe rates noisy likewise;
//! * temperature, power (mW resolution), clocks, throttle reasons as a real board drifts.
//!
//! Two scenarios: `core` (NVLink totals, no per-link lists — what Hopper reports through
//! NVML today) and `per_link` (12 per-link counters per direction, an A100 with NVLink
//! utilisation counters set to bytes).
//!
//! Each scenario is sent twice: as `Vec<GpuSample>` rows, and as [`GpuBatch`]es (the same
//! values with interned strings; built up front like the rows, so building them is not
//! timed either).
//!
//! Reported: bytes per row on disk (with the largest columns), rows per second of the
//! writer thread's CPU time (the sink's cost per core; `SinkStats::writer_cpu`; the best
//! and the median run, since single runs spread widely on a shared VM), and criterion's
//! wall-clock throughput (which also includes fsyncing every file).
//!
//! Run: `CARGO_TARGET_DIR=/work/target-telemetry cargo bench -p marshal-telemetry`
//!
//! `SINK_BENCH_ONLY=<scenario>` runs one scenario, `SINK_BENCH_RUNS=<n>` sets the runs
//! per report (default 3) and `SINK_BENCH_ZSTD_LEVEL=<level>` the ZSTD level (default 1); with `SINK_BENCH_REPORT_ONLY=1 SINK_BENCH_RUNS=1` the bench
//! binary runs the sink once, e.g. under `valgrind --tool=callgrind --separate-threads=yes`
//! (the writer thread's instructions are the `telemetry-sink` thread's file).

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use marshal_telemetry::reader::read_metadata;
use marshal_telemetry::{
    GpuBatch, GpuBatchBuilder, GpuSample, Health, MemPhase, Records, SinkConfig, SinkStats,
    TelemetrySink, list_files,
};

/// The allocator of the `marshal` binary, which runs the agent's sink: the writer's
/// per-row-group buffers are freed and taken again, and the system allocator returns
/// them to the kernel and faults them back in.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const NODES: usize = 16;
const GPUS: usize = 8;
const SECS: i64 = 3600;
const T0_US: i64 = 1_741_910_400_000_000;

/// SplitMix64: deterministic, dependency-free noise.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn sym(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
    /// Roughly normal, mean 0, sd ≈ 1 (sum of uniforms).
    fn gauss(&mut self) -> f64 {
        (0..4).map(|_| self.sym()).sum::<f64>() * 0.866
    }
}

struct GpuState {
    busy: bool,
    level: f64,
    temp: f64,
    tx: u64,
    rx: u64,
    tx_links: Vec<u64>,
    rx_links: Vec<u64>,
}

fn phase_at(t: i64) -> MemPhase {
    match t {
        t if t < 120 => MemPhase::Warmup,
        t if t % 1200 >= 1100 => MemPhase::Eval,
        t if t % 1200 < 40 => MemPhase::Checkpoint,
        _ => MemPhase::Steady,
    }
}

/// The simulated cluster: produces each tick's samples, one `Vec` per node, the way
/// samplers would (fresh rows, hot in cache, on the producer's thread).
struct Cluster {
    per_link: bool,
    rng: Rng,
    cluster: Arc<str>,
    gpu_type: Arc<str>,
    nodes: Vec<Arc<str>>,
    jobs: Vec<Arc<str>>,
    uuids: Vec<Vec<Arc<str>>>,
    workers: Vec<Arc<str>>,
    state: Vec<GpuState>,
}

impl Cluster {
    fn new(per_link: bool) -> Self {
        let mut rng = Rng(42);
        let cluster: Arc<str> = "prod-a".into();
        let gpu_type: Arc<str> = "NVIDIA H100 80GB HBM3".into();
        let nodes: Vec<Arc<str>> = (0..NODES)
            .map(|n| format!("gpu-node-{n:03}").into())
            .collect();
        let jobs: Vec<Arc<str>> = (0..NODES)
            .map(|n| format!("job-{}", 1000 + n / 2).into())
            .collect();
        let uuids: Vec<Vec<Arc<str>>> = (0..NODES)
            .map(|n| {
                (0..GPUS)
                    .map(|g| format!("GPU-{:08x}-{n:03}-{g}", rng.next() as u32).into())
                    .collect()
            })
            .collect();
        let workers: Vec<Arc<str>> = (0..NODES * GPUS)
            .map(|r| format!("rank-{r}").into())
            .collect();
        let links = 12;
        let state: Vec<GpuState> = (0..NODES * GPUS)
            .map(|i| GpuState {
                busy: i % 4 != 3,
                level: 85.0 + 10.0 * rng.sym().abs(),
                temp: 45.0,
                tx: rng.next() % (1 << 40),
                rx: rng.next() % (1 << 40),
                tx_links: vec![rng.next() % (1 << 36); links],
                rx_links: vec![rng.next() % (1 << 36); links],
            })
            .collect();
        Self {
            per_link,
            rng,
            cluster,
            gpu_type,
            nodes,
            jobs,
            uuids,
            workers,
            state,
        }
    }

    fn tick(&mut self, t: i64) -> Vec<Vec<GpuSample>> {
        let Self {
            per_link,
            rng,
            cluster,
            gpu_type,
            nodes,
            jobs,
            uuids,
            workers,
            state,
        } = self;
        let per_link = *per_link;
        let rng: &mut Rng = rng;
        let links = 12;
        let mut out = Vec::with_capacity(NODES);
        {
            let ts = T0_US + t * 1_000_000;
            let phase = phase_at(t);
            for n in 0..NODES {
                let mut batch = Vec::with_capacity(GPUS);
                for g in 0..GPUS {
                    let s = &mut state[n * GPUS + g];
                    let util = if s.busy {
                        s.level = (s.level + 0.3 * rng.gauss()).clamp(60.0, 99.0);
                        let target = match phase {
                            MemPhase::Warmup => 40.0,
                            MemPhase::Checkpoint => 5.0,
                            MemPhase::Eval => 65.0,
                            MemPhase::Steady => s.level,
                        };
                        (target + 2.0 * rng.gauss()).round().clamp(0.0, 100.0)
                    } else {
                        0.0
                    };
                    let mem_used: u64 = if s.busy {
                        match phase {
                            MemPhase::Warmup => 31 << 30,
                            MemPhase::Steady => 71 << 30,
                            MemPhase::Eval => 74 << 30,
                            MemPhase::Checkpoint => 76 << 30,
                        }
                    } else {
                        512 << 20
                    };
                    // 150 GB/s at full load, 2 % noise, KiB granularity.
                    let rate = |u: f64, rng: &mut Rng| -> u64 {
                        let bytes = u / 100.0 * 150e9 * (1.0 + 0.02 * rng.gauss());
                        (bytes.max(0.0) as u64 / 1024) * 1024
                    };
                    let (dtx, drx) = (rate(util, rng), rate(util, rng));
                    s.tx += dtx;
                    s.rx += drx;
                    if per_link {
                        for l in 0..links {
                            s.tx_links[l] += (dtx / links as u64 / 1024) * 1024;
                            s.rx_links[l] += (drx / links as u64 / 1024) * 1024;
                        }
                    }
                    s.temp += 0.05 * (35.0 + util * 0.4 - s.temp) + 0.2 * rng.gauss();
                    let power_mw =
                        (70_000.0 + util * 6_300.0 + 4_000.0 * rng.gauss()).max(50_000.0) as u32;
                    let pcie = |rng: &mut Rng| {
                        if util > 0.0 {
                            ((2e9 * (1.0 + 0.1 * rng.gauss())).max(0.0) as u64 / 1024) * 1024
                        } else {
                            0
                        }
                    };
                    batch.push(GpuSample {
                        timestamp_us: ts,
                        cluster: cluster.clone(),
                        node: nodes[n].clone(),
                        gpu_index: g as u16,
                        gpu_uuid: uuids[n][g].clone(),
                        gpu_type: gpu_type.clone(),
                        sm_util_pct: Some(util as f32),
                        mem_util_pct: Some(
                            (util * 0.55 + 1.5 * rng.gauss()).round().clamp(0.0, 100.0) as f32,
                        ),
                        mem_used_bytes: Some(mem_used),
                        mem_total_bytes: Some(80 << 30),
                        // Stored in NVML's units (schema 2): KiB, KiB/s, mW.
                        nvlink_tx_kib: Some(s.tx / 1024),
                        nvlink_rx_kib: Some(s.rx / 1024),
                        nvlink_tx_per_link_kib: per_link
                            .then(|| s.tx_links.iter().map(|b| b / 1024).collect()),
                        nvlink_rx_per_link_kib: per_link
                            .then(|| s.rx_links.iter().map(|b| b / 1024).collect()),
                        pcie_tx_kib_per_s: Some((pcie(rng) / 1024) as u32),
                        pcie_rx_kib_per_s: Some((pcie(rng) / 1024) as u32),
                        temperature_c: Some(s.temp.round() as f32),
                        power_mw: Some(power_mw),
                        sm_clock_mhz: Some(if util > 0.0 { 1980 } else { 345 }),
                        mem_clock_mhz: Some(2619),
                        throttle_reasons: Some(if util > 0.0 { 0 } else { 1 }),
                        ecc_corrected: Some(0),
                        ecc_uncorrected: Some(0),
                        xid: None,
                        health: Health::Ok,
                        job_id: s.busy.then(|| jobs[n].clone()),
                        worker: s.busy.then(|| workers[n * GPUS + g].clone()),
                        mem_phase: s.busy.then_some(phase),
                        mig_mode: Some(false),
                    });
                }
                out.push(batch);
            }
        }
        out
    }
}

fn config(dir: &Path) -> SinkConfig {
    let mut cfg = SinkConfig::new(dir);
    cfg.max_file_age = Duration::from_secs(3600);
    if let Some(level) = std::env::var("SINK_BENCH_ZSTD_LEVEL")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        cfg.write.zstd_level = level;
    }
    cfg
}

/// The whole stream, generated up front (so the producer thread only sends while the sink
/// works), in messages of `nodes_per_msg` nodes' rows of one tick.
fn generate(per_link: bool, nodes_per_msg: usize) -> Vec<Vec<GpuSample>> {
    let mut cluster = Cluster::new(per_link);
    let mut out = Vec::new();
    for t in 0..SECS {
        out.extend(cluster.tick(t).chunks(nodes_per_msg).map(|c| c.concat()));
    }
    out
}

/// The same messages as [`GpuBatch`]es of one builder (one sampler's interned strings).
fn to_batches(messages: &[Vec<GpuSample>]) -> Vec<GpuBatch> {
    let mut b = GpuBatchBuilder::new();
    messages
        .iter()
        .map(|m| {
            for s in m {
                b.push_sample(s);
            }
            b.take()
        })
        .collect()
}

/// Writes every message through a fresh sink.
fn write<M: Into<Records>>(dir: &Path, messages: Vec<M>) -> SinkStats {
    let sink = TelemetrySink::open(config(dir)).unwrap();
    for m in messages {
        sink.send(m).unwrap();
    }
    let stats = sink.finish().unwrap();
    assert_eq!(stats.error_count, 0, "{:?}", stats.errors);
    stats
}

/// Bytes on disk per row, the largest columns, and rows per second of writer CPU.
fn report<M: Into<Records> + Clone>(name: &str, data: &[M]) {
    let mut cpu = Vec::new();
    let mut wall = Vec::new();
    let mut rows = 0;
    let dir = tempfile::tempdir().unwrap();
    let runs: usize = std::env::var("SINK_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    for run in 0..runs {
        let d = tempfile::tempdir().unwrap();
        let target = if run == 0 { dir.path() } else { d.path() };
        let messages = data.to_vec();
        let start = Instant::now();
        let stats = write(target, messages);
        wall.push(start.elapsed().as_secs_f64());
        cpu.push(stats.writer_cpu.as_secs_f64());
        rows = stats.rows_written;
    }
    let listing = list_files(dir.path()).unwrap();
    let bytes: u64 = listing.files.iter().map(|f| f.bytes).sum();
    let rate = |secs: &mut Vec<f64>| {
        secs.sort_by(f64::total_cmp);
        let m = rows as f64 / 1e6;
        (m / secs[0], m / secs[secs.len() / 2])
    };
    let ((best_cpu, median_cpu), (best_wall, median_wall)) = (rate(&mut cpu), rate(&mut wall));
    println!(
        "[{name}] {rows} rows in {} files: {bytes} bytes = {:.2} bytes/row on disk; \
         {best_cpu:.2} M rows/s per writer-CPU-second, {best_wall:.2} M rows/s wall incl. \
         fsync (best of {runs}; medians {median_cpu:.2} and {median_wall:.2})",
        listing.files.len(),
        bytes as f64 / rows as f64,
    );
    let mut per_col: Vec<(String, i64)> = Vec::new();
    for f in &listing.files {
        let md = read_metadata(&f.path).unwrap();
        for rg in md.row_groups() {
            for c in rg.columns() {
                let name = c.column_path().string();
                match per_col.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, b)) => *b += c.compressed_size(),
                    None => per_col.push((name, c.compressed_size())),
                }
            }
        }
    }
    per_col.sort_by_key(|(_, b)| -b);
    let cols: Vec<String> = per_col
        .iter()
        .take(12)
        .map(|(n, b)| format!("{n} {:.2}", *b as f64 / rows as f64))
        .collect();
    println!("[{name}] bytes/row by column: {}", cols.join(", "));
}

fn bench(c: &mut Criterion) {
    for (name, per_link, nodes_per_msg) in [
        ("core_8_rows_per_msg", false, 1),
        ("core_128_rows_per_msg", false, NODES),
        ("per_link_128_rows_per_msg", true, NODES),
    ] {
        // `SINK_BENCH_ONLY=<name>` runs one scenario (e.g. `batch_core_128_rows_per_msg`).
        let only = std::env::var("SINK_BENCH_ONLY").ok();
        let batch_name = format!("batch_{name}");
        let wanted = |n: &str| only.as_deref().is_none_or(|o| o == n);
        if !wanted(name) && !wanted(&batch_name) {
            continue;
        }
        let data = generate(per_link, nodes_per_msg);
        if wanted(name) {
            bench_one(c, name, &data);
        }
        if wanted(&batch_name) {
            let batches = to_batches(&data);
            bench_one(c, &batch_name, &batches);
        }
    }
}

/// `SINK_BENCH_REPORT_ONLY=1` prints the bytes and CPU figures and skips criterion.
fn bench_one<M: Into<Records> + Clone>(c: &mut Criterion, name: &str, data: &[M]) {
    let rows = SECS as u64 * (NODES * GPUS) as u64;
    report(name, data);
    if std::env::var_os("SINK_BENCH_REPORT_ONLY").is_some() {
        return;
    }
    {
        let mut group = c.benchmark_group("sink");
        group.throughput(Throughput::Elements(rows));
        group.sample_size(10);
        group.measurement_time(Duration::from_secs(20));
        group.bench_function(name, |b| {
            b.iter_batched(
                || (tempfile::tempdir().unwrap(), data.to_vec()),
                |(dir, data)| {
                    let stats = write(dir.path(), data);
                    black_box((dir, stats))
                },
                BatchSize::PerIteration,
            )
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
