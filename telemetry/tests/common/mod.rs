//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use marshal_telemetry::{GpuSample, Health, MemPhase, NetPort, NodeSample, StepProfile};

/// 2025-03-14T00:00:00Z in µs.
pub const DAY0_US: i64 = 1_741_910_400_000_000;
pub const SEC: i64 = 1_000_000;

/// A fully populated GPU sample (every nullable field set, some varied by `i`).
pub fn gpu(node: &str, gpu_index: u16, ts: i64) -> GpuSample {
    let i = ts / SEC;
    GpuSample {
        timestamp_us: ts,
        cluster: "c1".into(),
        node: node.into(),
        gpu_index,
        gpu_uuid: format!("GPU-{node}-{gpu_index}").into(),
        gpu_type: "NVIDIA H100 80GB HBM3".into(),
        sm_util_pct: Some((i % 101) as f32),
        mem_util_pct: Some(((i * 7) % 101) as f32),
        mem_used_bytes: Some(40 << 30),
        mem_total_bytes: Some(80 << 30),
        nvlink_tx_kib: Some(1000 * i as u64),
        nvlink_rx_kib: Some(2000 * i as u64),
        nvlink_tx_per_link_kib: Some(vec![1, 2, 3, i as u64]),
        nvlink_rx_per_link_kib: if i % 2 == 0 { Some(vec![]) } else { None },
        pcie_tx_kib_per_s: Some(12345),
        pcie_rx_kib_per_s: None,
        temperature_c: Some(55.0),
        power_mw: Some(412_500),
        sm_clock_mhz: Some(1980),
        mem_clock_mhz: Some(2619),
        throttle_reasons: Some(4),
        ecc_corrected: Some(3),
        ecc_uncorrected: Some(0),
        xid: if i % 5 == 0 { Some(79) } else { None },
        health: if i % 5 == 0 {
            Health::Failed
        } else {
            Health::Ok
        },
        job_id: Some(format!("job-{}", gpu_index % 2).into()),
        worker: if gpu_index.is_multiple_of(2) {
            Some("rank-0".into())
        } else {
            None
        },
        mem_phase: Some(MemPhase::ALL[(i % 4) as usize]),
        mig_mode: Some(false),
    }
}

/// `gpus` GPUs on each node, one sample per second for `secs` seconds from `start`,
/// time-major (as a sampler produces them).
pub fn gpu_series(nodes: &[&str], gpus: u16, start: i64, secs: i64) -> Vec<GpuSample> {
    let mut v = Vec::new();
    for s in 0..secs {
        for n in nodes {
            for g in 0..gpus {
                v.push(gpu(n, g, start + s * SEC));
            }
        }
    }
    v
}

pub fn node_sample(node: &str, ts: i64) -> NodeSample {
    NodeSample {
        timestamp_us: ts,
        cluster: "c1".into(),
        node: node.into(),
        net_ports: Some(vec![
            NetPort {
                port: Arc::from("ib0"),
                tx_bytes: ts as u64 / 10,
                rx_bytes: ts as u64 / 20,
            },
            NetPort {
                port: Arc::from("eth0"),
                tx_bytes: 1,
                rx_bytes: 2,
            },
        ]),
        host_mem_used_bytes: Some(100 << 30),
        host_mem_total_bytes: Some(512 << 30),
        cpu_util_pct: Some(37.5),
    }
}

pub fn step(job: &str, step: u64, ts: i64) -> StepProfile {
    StepProfile {
        timestamp_us: ts,
        job_id: job.into(),
        step,
        step_time_s: 0.25 + step as f64 * 1e-3,
        phase: Some(MemPhase::Steady),
        peak_mem_bytes: Some(70 << 30),
        gpu_type: "NVIDIA A100-SXM4-80GB".into(),
        num_gpus: 8,
        placement: "2x4".into(),
        model: Some("ResNet-50 (batch size 64)".into()),
        batch_size: Some(512),
        comm: Some("data-parallel".into()),
        span: Some("rack".into()),
        tenants: Some(1),
        gpu_util_pct: Some(87.0),
    }
}

/// Sort key for comparing GPU rows independent of file order.
pub fn gpu_key(s: &GpuSample) -> (String, u16, i64) {
    (s.node.to_string(), s.gpu_index, s.timestamp_us)
}
