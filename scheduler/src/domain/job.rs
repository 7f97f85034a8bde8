//! Jobs as the scheduler sees them: a gang of identical workers, each asking for GPUs
//! (whole, a milli-GPU share, or a MIG profile), CPU and memory on one node.

use serde::{Deserialize, Serialize};

use crate::domain::{DomainError, GpuModelSet, MIG_COMPUTE_SLICES, MIG_MEMORY_SLICES, WorkloadId};

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct JobId(pub u32);

/// What one worker asks of the GPUs on its node.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GpuDemand {
    /// CPU-only worker.
    None,
    /// `n` whole GPUs.
    Whole(u16),
    /// A share of one GPU, in thousandths (1..=999), as GPU-sharing schedulers express it.
    Milli(u16),
    /// One MIG instance of the given size.
    Mig { compute: u8, memory: u8 },
}

impl GpuDemand {
    /// GPUs counted in thousandths, the unit every allocation metric uses.
    pub fn milli(self) -> u32 {
        match self {
            GpuDemand::None => 0,
            GpuDemand::Whole(n) => n as u32 * 1000,
            GpuDemand::Milli(m) => m as u32,
            GpuDemand::Mig { compute, .. } => compute as u32 * 1000 / MIG_COMPUTE_SLICES as u32,
        }
    }

    /// Number of distinct GPUs the worker touches.
    pub fn gpu_count(self) -> u16 {
        match self {
            GpuDemand::None => 0,
            GpuDemand::Whole(n) => n,
            GpuDemand::Milli(_) | GpuDemand::Mig { .. } => 1,
        }
    }

    pub fn is_shared(self) -> bool {
        matches!(self, GpuDemand::Milli(_) | GpuDemand::Mig { .. })
    }
}

/// How a job's workers talk to each other, which decides how much distance costs.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CommPattern {
    #[default]
    None,
    DataParallel,
    TensorParallel,
    PipelineParallel,
}

/// Checkpointing: progress made since the last checkpoint is lost on preemption or failure.
#[derive(Copy, Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Checkpointing {
    /// Seconds of running between checkpoints.
    pub interval_s: f64,
    /// Seconds each checkpoint stalls training.
    pub cost_s: f64,
    /// Seconds from (re)start until training makes progress (load, warm-up).
    pub restart_s: f64,
    /// The job writes a checkpoint when preempted (elastic frameworks such as AdaptDL
    /// do), so a preemption loses nothing; a failure still loses the work since the
    /// last periodic checkpoint.
    #[serde(default)]
    pub on_preempt: bool,
}

impl Default for Checkpointing {
    /// Half-hourly checkpoints of 30 s and a one-minute restart: common defaults of large
    /// training launchers.
    fn default() -> Self {
        Checkpointing {
            interval_s: 1800.0,
            cost_s: 30.0,
            restart_s: 60.0,
            on_preempt: false,
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Elastic {
    pub min_workers: u32,
    pub max_workers: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub id: JobId,
    pub name: String,
    /// Queue or tenant the job is charged to.
    pub tenant: String,
    /// Larger is more important.
    pub priority: i32,
    pub workers: u32,
    pub gpu: GpuDemand,
    pub cpu_milli: u32,
    pub memory_mib: u64,
    pub gpu_models: GpuModelSet,
    pub comm: CommPattern,
    /// What the job runs, when known: selects measured throughputs, communication and
    /// co-location behaviour from the speed model's workload catalog.
    #[serde(default)]
    pub workload: Option<WorkloadId>,
    /// Global batch size, when the trace records it.
    #[serde(default)]
    pub batch_size: Option<u32>,
    /// Work in seconds at speed 1.0 (reference-class GPUs, ideally placed).
    pub total_work: f64,
    pub checkpoint: Checkpointing,
    pub preemptible: bool,
    pub elastic: Option<Elastic>,
    /// Seconds from the start of the trace.
    pub submit_time: f64,
}

impl Job {
    pub fn validate(&self) -> Result<(), DomainError> {
        let bad = |what: String| Err(DomainError::Invalid(format!("job {}: {what}", self.name)));
        if self.workers == 0 {
            return bad("a job needs at least one worker".into());
        }
        match self.gpu {
            GpuDemand::Whole(0) => return bad("Whole(0) GPUs; use None for CPU-only".into()),
            GpuDemand::Milli(m) if m == 0 || m >= 1000 => {
                return bad(format!("GPU share {m} milli is outside 1..=999"));
            }
            GpuDemand::Mig { compute, memory }
                if compute == 0
                    || compute > MIG_COMPUTE_SLICES
                    || memory == 0
                    || memory > MIG_MEMORY_SLICES =>
            {
                return bad(format!("MIG profile {compute}c/{memory}m does not exist"));
            }
            _ => {}
        }
        if !(self.total_work.is_finite() && self.total_work >= 0.0) {
            return bad(format!(
                "total work {} is not a finite non-negative number",
                self.total_work
            ));
        }
        if !(self.submit_time.is_finite() && self.submit_time >= 0.0) {
            return bad(format!(
                "submit time {} is not a finite non-negative number",
                self.submit_time
            ));
        }
        let c = &self.checkpoint;
        let finite = [c.interval_s, c.cost_s, c.restart_s]
            .iter()
            .all(|v| v.is_finite());
        if !finite || c.interval_s <= 0.0 || c.cost_s < 0.0 || c.restart_s < 0.0 {
            return bad("checkpoint interval must be positive, costs non-negative".into());
        }
        if let Some(e) = self.elastic
            && (e.min_workers == 0 || e.min_workers > self.workers || e.max_workers < self.workers)
        {
            return bad(format!(
                "elastic range {}..={} does not contain {} workers",
                e.min_workers, e.max_workers, self.workers
            ));
        }
        Ok(())
    }

    /// Total GPUs in thousandths across the gang.
    pub fn gpu_milli(&self) -> u64 {
        self.workers as u64 * self.gpu.milli() as u64
    }

    /// GPUs the gang occupies (a shared GPU counts as one).
    pub fn gpu_count(&self) -> u32 {
        self.workers.saturating_mul(self.gpu.gpu_count() as u32)
    }

    /// A whole-GPU job of `gpus` GPUs spread as one worker per GPU: the shape of trace
    /// jobs that record only a GPU count.
    pub fn whole_gpus(id: JobId, gpus: u32, submit_time: f64, total_work: f64) -> Job {
        Job {
            id,
            name: format!("job-{}", id.0),
            tenant: "default".into(),
            priority: 0,
            workers: gpus.max(1),
            gpu: GpuDemand::Whole(1),
            cpu_milli: 0,
            memory_mib: 0,
            gpu_models: GpuModelSet::ANY,
            comm: if gpus > 1 {
                CommPattern::DataParallel
            } else {
                CommPattern::None
            },
            workload: None,
            batch_size: None,
            total_work,
            checkpoint: Checkpointing::default(),
            preemptible: true,
            elastic: None,
            submit_time,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demand_counts_milli_and_gpus() {
        assert_eq!(GpuDemand::Whole(4).milli(), 4000);
        assert_eq!(GpuDemand::Milli(460).milli(), 460);
        assert_eq!(
            GpuDemand::Mig {
                compute: 7,
                memory: 8
            }
            .milli(),
            1000
        );
        assert_eq!(GpuDemand::Milli(460).gpu_count(), 1);
        let job = Job::whole_gpus(JobId(1), 16, 0.0, 10.0);
        assert_eq!(job.gpu_count(), 16);
        assert_eq!(job.gpu_milli(), 16_000);
        assert_eq!(job.comm, CommPattern::DataParallel);
    }

    #[test]
    fn validation_names_the_bad_field() {
        let mut job = Job::whole_gpus(JobId(1), 2, 0.0, 10.0);
        assert!(job.validate().is_ok());
        job.gpu = GpuDemand::Milli(1000);
        assert!(
            job.validate()
                .unwrap_err()
                .to_string()
                .contains("1000 milli")
        );
        job.gpu = GpuDemand::Whole(1);
        job.total_work = f64::NAN;
        assert!(
            job.validate()
                .unwrap_err()
                .to_string()
                .contains("total work")
        );
        job.total_work = 1.0;
        job.elastic = Some(Elastic {
            min_workers: 3,
            max_workers: 4,
        });
        assert!(job.validate().unwrap_err().to_string().contains("elastic"));
    }
}
