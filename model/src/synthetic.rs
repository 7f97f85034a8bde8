//! Synthetic placement graphs with a known ground truth, for tests, benchmarks and smoke runs
//! of the training pipeline. Not a simulator: the formulas only need to depend on GPU, link
//! and job features the way real step times do (slowest GPU bounds the gang, the narrowest
//! link bounds communication).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::features::{
    GPU_FEATURES, GpuNodeFeatures, JOB_FEATURES, JobFeatures, LinkFeatures, LinkKind,
    PlacementGraph, Targets,
};

/// (HBM GiB, FP16 TFLOPS, HBM TB/s) of a few GPU types.
const GPU_TYPES: [(f32, f32, f32); 3] =
    [(32.0, 125.0, 0.9), (80.0, 312.0, 2.0), (80.0, 989.0, 3.35)];

/// `nodes` machines of `per_node` GPUs, all pairs linked: PCIe (128 Gb/s, level 1)
/// inside a machine, InfiniBand in the rack (50 Gb/s, level 2) between machines; GPU
/// features all 1, the job's prior `ln 1 = 0`.
pub fn uniform_placement(nodes: usize, per_node: usize) -> PlacementGraph {
    let n = nodes * per_node;
    let gpus = vec![
        GpuNodeFeatures {
            values: [1.0; GPU_FEATURES]
        };
        n
    ];
    let mut links = Vec::new();
    for a in 0..n {
        for b in a + 1..n {
            let link = if a / per_node == b / per_node {
                LinkFeatures::new(LinkKind::Pcie, 128.0, 1)
            } else {
                LinkFeatures::new(LinkKind::IbRack, 50.0, 2)
            };
            links.push((a as u16, b as u16, link));
        }
    }
    let mut job = [0.0; JOB_FEATURES];
    job[0] = (n as f32).log2();
    job[10] = 0.5;
    PlacementGraph {
        gpus,
        links,
        job: JobFeatures { values: job },
    }
}

/// A random placement of `gpus` GPUs: GPUs `0..k` share a node (NVLink or PCIe), the rest
/// sit on other nodes in the same rack or across the spine. All pairs are linked.
pub fn graph(rng: &mut ChaCha8Rng, gpus: usize) -> PlacementGraph {
    let (mem, tflops, bw) = GPU_TYPES[rng.random_range(0..GPU_TYPES.len())];
    let per_node = rng.random_range(1..=gpus.max(1)).min(8);
    let nvlink = rng.random_bool(0.7);
    let spine = rng.random_bool(0.3);
    let nodes: Vec<GpuNodeFeatures> = (0..gpus)
        .map(|_| {
            let mut v = [0f32; GPU_FEATURES];
            v[0] = mem;
            v[1] = mem * rng.random_range(0.5..1.0);
            v[2] = rng.random_range(0.0..30.0);
            v[3] = tflops;
            v[4] = bw;
            v[5] = 1.0;
            v[6] = f32::from(rng.random_bool(0.1));
            v[7] = f32::from(rng.random_bool(0.05));
            v[8] = rng.random_range(35.0..80.0);
            v[9] = if nvlink { per_node.min(8) as f32 } else { 1.0 };
            GpuNodeFeatures { values: v }
        })
        .collect();
    let mut links = Vec::new();
    for a in 0..gpus {
        for b in (a + 1)..gpus {
            let same_node = a / per_node == b / per_node;
            let link = match (same_node, nvlink, spine) {
                (true, true, _) => LinkFeatures::new(LinkKind::NvLink, 7200.0, 0),
                (true, false, _) => LinkFeatures::new(LinkKind::Pcie, 512.0, 1),
                (false, _, false) => LinkFeatures::new(LinkKind::IbRack, 400.0, 2),
                (false, _, true) => LinkFeatures::new(LinkKind::IbSpine, 200.0, 3),
            };
            links.push((a as u16, b as u16, link));
        }
    }
    let mut job = [0f32; JOB_FEATURES];
    job[0] = (gpus as f32).log2();
    job[1] = rng.random_range(8.0..11.0); // 100M .. 100B parameters
    job[2] = rng.random_range(5.0..10.0);
    job[3] = rng.random_range(9.0..13.0);
    job[4 + rng.random_range(0..4)] = 1.0;
    job[8] = 2.0;
    job[9] = 0.0;
    job[10] = rng.random_range(0.05..0.5);
    // A partial prior, as a featuriser with a rough compute model would give: the compute
    // term of [`targets`] on a nominal GPU, ignoring communication, the slowest GPU and
    // degradation, which the network has to learn.
    job[13] = compute_s(job[1], job[2], gpus as f32, 312.0).ln();
    PlacementGraph {
        gpus: nodes,
        links,
        job: JobFeatures { values: job },
    }
}

/// The compute term of the synthetic step time.
fn compute_s(log10_params: f32, log2_batch: f32, gpus: f32, slowest_tflops: f32) -> f32 {
    let params_b = 10f32.powf(log10_params - 9.0);
    let batch = 2f32.powf(log2_batch - 5.0);
    0.2 * params_b * batch / (gpus * slowest_tflops / 312.0)
}

/// Ground-truth targets of a graph made by [`graph`], times log-normal noise of `noise`.
pub fn targets(g: &PlacementGraph, rng: &mut ChaCha8Rng, noise: f32) -> Targets {
    let n = g.gpus.len() as f32;
    let params_b = 10f32.powf(g.job.values[1] - 9.0);
    let batch = 2f32.powf(g.job.values[2] - 5.0);
    let slowest = g
        .gpus
        .iter()
        .map(|x| x.values[3])
        .fold(f32::INFINITY, f32::min);
    let degraded = g.gpus.iter().any(|x| x.values[7] > 0.5);
    let compute = compute_s(g.job.values[1], g.job.values[2], n, slowest);
    let narrowest = g
        .links
        .iter()
        .map(|l| l.2.values[4].exp2())
        .fold(f32::INFINITY, f32::min);
    let comm = if g.links.is_empty() {
        0.0
    } else {
        g.job.values[10] * params_b * 50.0 / narrowest
    };
    let slow = if degraded { 1.3 } else { 1.0 };
    let eps: f32 = rng.random_range(-1.0..1.0) * noise;
    let step = (compute + comm) * slow * eps.exp();
    let steady = 2.0 + 16.0 * params_b / n + 0.5 * batch;
    let mut mem = [0.9 * steady, steady, 0.7 * steady, 1.2 * steady];
    for m in &mut mem {
        if rng.random_bool(0.2) {
            *m = f32::NAN;
        }
    }
    Targets {
        step_time_s: step,
        peak_mem_gib: mem,
        gpu_util_pct: 95.0 * compute / (compute + comm),
    }
}

/// `n` examples with 1–8 GPUs each, deterministic in `seed`.
pub fn dataset(n: usize, seed: u64, noise: f32) -> Vec<(PlacementGraph, Targets)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let gpus = rng.random_range(1..=8);
            let g = graph(&mut rng, gpus);
            let t = targets(&g, &mut rng, noise);
            (g, t)
        })
        .collect()
}
