//! Per-tenant quotas: a hard constraint on what a tenant's running jobs may hold.
//!
//! DESIGN's filter step names quota beside type, health and fit. A [`QuotaConfig`]
//! limits the GPUs (whole or in shares) and CPU cores each tenant's jobs hold at once,
//! as Kubernetes' ResourceQuota, Slurm's `GrpTRES` and the virtual clusters of
//! Philly and Helios do. The cycle checks a pending job against its tenant's limit
//! before anything else is tried for it ([`TenantUsage::admits`]):
//!
//! - over the limit, the job waits with the reason, and nothing is preempted, moved or
//!   held for it: it is not short of room, its tenant is at its limit;
//! - a job that asks more than its tenant's whole limit can never run and is refused;
//! - the queue goes on past it (a strict FIFO does not stop at it), as Slurm's
//!   `QOSGrpGRES` pending reason does not hold back other tenants' jobs.
//!
//! What a tenant holds is summed over its running jobs at the start of each cycle and
//! kept up to date as the cycle places and preempts. Quotas bind placement only: jobs
//! already running when a limit is lowered keep running (as with ResourceQuota), and a
//! job moved by rebalancing or consolidation holds what it held. A job cannot preempt
//! its own tenant's jobs to get under the limit; preemption makes room, not quota.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::domain::Job;

/// Limits by tenant (`Job::tenant`), and a default for tenants not named.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaConfig {
    /// Tenant name → its limits.
    #[serde(default)]
    pub tenants: BTreeMap<String, Limits>,
    /// The limits of a tenant not in `tenants`; absent: no limit.
    #[serde(default)]
    pub default: Option<Limits>,
}

/// What one tenant's running jobs may hold at once; an absent limit is no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// GPUs, whole or in shares (2.5: two whole GPUs and a half, or five halves).
    pub gpus: Option<f64>,
    /// CPU cores.
    pub cpu_cores: Option<f64>,
}

impl QuotaConfig {
    /// A quota file (`[default]`, `[tenants.NAME]`), parsed and checked; the error says
    /// where in the text (line and column) or which key is wrong.
    pub fn from_toml(text: &str) -> Result<Self, String> {
        let quota: QuotaConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        quota.validate()?;
        Ok(quota)
    }

    pub fn validate(&self) -> Result<(), String> {
        let named = self
            .tenants
            .iter()
            .map(|(t, l)| (format!("quota.tenants.{t}"), l));
        let default = self
            .default
            .iter()
            .map(|l| ("quota.default".to_string(), l));
        for (key, limits) in named.chain(default) {
            for (what, value) in [("gpus", limits.gpus), ("cpu_cores", limits.cpu_cores)] {
                if let Some(v) = value
                    && !(v.is_finite() && (0.0..=1e9).contains(&v))
                {
                    return Err(format!(
                        "{key}.{what} = {v}: must be a number from 0 to 1e9"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The limits that apply to `tenant`, in thousandths (GPU milli, CPU milli).
    fn limits_of(&self, tenant: &str) -> Option<Milli> {
        let l = self.tenants.get(tenant).or(self.default.as_ref())?;
        let milli = |v: Option<f64>| v.map(|v| (v * 1000.0).round() as u64);
        Some(Milli {
            gpu: milli(l.gpus),
            cpu: milli(l.cpu_cores),
        })
    }
}

#[derive(Clone, Copy, Debug)]
struct Milli {
    gpu: Option<u64>,
    cpu: Option<u64>,
}

/// What a job holds while it runs, in thousandths of a GPU and of a core.
fn demand(job: &Job) -> (u64, u64) {
    let workers = u64::from(job.workers);
    (
        workers * u64::from(job.gpu.milli()),
        workers * u64::from(job.cpu_milli),
    )
}

/// Why a job is not placed because of its tenant's quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverQuota {
    /// Not now: its tenant's running jobs hold too much for it to start.
    Wait(Shortfall),
    /// Never: the job alone asks more than its tenant's limit.
    Never(Shortfall),
}

/// The limit a job does not fit under, in numbers: a deep queue meets it for thousands
/// of jobs every cycle, so the words are made only when asked for ([`Shortfall::describe`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shortfall {
    /// `GPUs` or `CPU cores`.
    pub what: &'static str,
    /// In thousandths.
    pub limit: u64,
    pub held: u64,
    pub asked: u64,
}

impl Shortfall {
    /// In words, for `tenant`.
    pub fn describe(&self, tenant: &str) -> String {
        let units = |m: u64| m as f64 / 1000.0;
        if self.asked > self.limit {
            format!(
                "tenant {tenant:?} may hold {} {}; the job alone asks {}",
                units(self.limit),
                self.what,
                units(self.asked)
            )
        } else {
            format!(
                "tenant {tenant:?} holds {} of its {} {}; the job asks {} more",
                units(self.held),
                units(self.limit),
                self.what,
                units(self.asked)
            )
        }
    }
}

/// What each tenant's running jobs hold, kept up to date through a cycle.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantUsage {
    held: BTreeMap<String, (u64, u64)>,
}

impl TenantUsage {
    /// The sum over `running`.
    pub fn of<'a>(running: impl IntoIterator<Item = &'a Job>) -> Self {
        let mut usage = TenantUsage::default();
        for job in running {
            usage.add(job);
        }
        usage
    }

    pub fn add(&mut self, job: &Job) {
        let (gpu, cpu) = demand(job);
        let held = self.held.entry(job.tenant.clone()).or_default();
        held.0 += gpu;
        held.1 += cpu;
    }

    /// Counts that `tenant` holds `gpu_milli` thousandths of a GPU and `cpu_milli` more.
    pub fn hold(&mut self, tenant: &str, gpu_milli: u64, cpu_milli: u64) {
        let held = self.held.entry(tenant.to_string()).or_default();
        held.0 = held.0.saturating_add(gpu_milli);
        held.1 = held.1.saturating_add(cpu_milli);
    }

    /// Adds what `other` counts.
    pub fn merge(&mut self, other: &TenantUsage) {
        for (tenant, &(gpu, cpu)) in &other.held {
            self.hold(tenant, gpu, cpu);
        }
    }

    pub fn remove(&mut self, job: &Job) {
        let (gpu, cpu) = demand(job);
        if let Some(held) = self.held.get_mut(&job.tenant) {
            held.0 = held.0.saturating_sub(gpu);
            held.1 = held.1.saturating_sub(cpu);
        }
    }

    /// What `tenant` holds: (GPU milli, CPU milli).
    pub fn held(&self, tenant: &str) -> (u64, u64) {
        self.held.get(tenant).copied().unwrap_or_default()
    }

    /// `Ok` if `job` may start within its tenant's limits, with what it holds now.
    pub fn admits(&self, quota: &QuotaConfig, job: &Job) -> Result<(), OverQuota> {
        let Some(limits) = quota.limits_of(&job.tenant) else {
            return Ok(());
        };
        let (gpu, cpu) = demand(job);
        let (held_gpu, held_cpu) = self.held(&job.tenant);
        let checks = [
            ("GPUs", limits.gpu, gpu, held_gpu),
            ("CPU cores", limits.cpu, cpu, held_cpu),
        ];
        // On the stack: this runs for every queued job of a limited tenant every cycle.
        let shortfalls = checks.map(|(what, limit, asked, held)| {
            limit.map(|limit| Shortfall {
                what,
                limit,
                held,
                asked,
            })
        });
        let mut limited = shortfalls.iter().flatten();
        // "Never" first, on any resource: a job that can never fit must not wait for
        // its tenant's GPUs to free only to be refused for its CPU then.
        if let Some(short) = limited.clone().find(|s| s.asked > s.limit) {
            return Err(OverQuota::Never(*short));
        }
        match limited.find(|s| s.held + s.asked > s.limit) {
            Some(short) => Err(OverQuota::Wait(*short)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{GpuDemand, JobId};

    fn job(tenant: &str, workers: u32, gpu: GpuDemand, cpu_milli: u32) -> Job {
        let mut j = Job::whole_gpus(JobId(1), 1, 0.0, 60.0);
        j.tenant = tenant.into();
        j.workers = workers;
        j.gpu = gpu;
        j.cpu_milli = cpu_milli;
        j
    }

    fn quota(text: &str) -> QuotaConfig {
        let q: QuotaConfig = toml::from_str(text).unwrap();
        q.validate().unwrap();
        q
    }

    #[test]
    fn a_tenant_at_its_limit_waits_and_one_asking_more_than_its_limit_never_runs() {
        let q = quota("[tenants.vision]\ngpus = 8\ncpu_cores = 64\n");
        let mut usage = TenantUsage::of([&job("vision", 2, GpuDemand::Whole(2), 8_000)]);
        assert_eq!(usage.held("vision"), (4_000, 16_000));
        // 4 held + 4 asked = 8: at the limit, allowed.
        let four = job("vision", 1, GpuDemand::Whole(4), 8_000);
        assert_eq!(usage.admits(&q, &four), Ok(()));
        usage.add(&four);
        // Half a GPU more is over.
        let share = job("vision", 1, GpuDemand::Milli(500), 1_000);
        let Err(OverQuota::Wait(short)) = usage.admits(&q, &share) else {
            panic!("a tenant at its limit started more")
        };
        let why = short.describe("vision");
        assert!(
            why.contains("holds 8 of its 8 GPUs") && why.contains("0.5 more"),
            "{why}"
        );
        // Once a job of it ends, it fits again.
        usage.remove(&four);
        assert_eq!(usage.admits(&q, &share), Ok(()));
        // Sixteen GPUs can never fit in eight.
        let big = job("vision", 2, GpuDemand::Whole(8), 8_000);
        let Err(OverQuota::Never(short)) = usage.admits(&q, &big) else {
            panic!("a job larger than its tenant's limit was admitted")
        };
        assert!(short.describe("vision").contains("alone asks 16"));
        // CPU is limited too: 16 held + 56 asked > 64.
        let cpu_heavy = job("vision", 1, GpuDemand::None, 56_000);
        let Err(OverQuota::Wait(short)) = usage.admits(&q, &cpu_heavy) else {
            panic!("the CPU limit was not applied")
        };
        assert_eq!(short.what, "CPU cores");
        // Other tenants have no limit without a default.
        let other = job("nlp", 8, GpuDemand::Whole(8), 0);
        assert_eq!(usage.admits(&q, &other), Ok(()));
    }

    #[test]
    fn a_job_that_can_never_fit_is_refused_even_while_its_tenant_is_at_another_limit() {
        let q = quota("[tenants.vision]\ngpus = 8\ncpu_cores = 64\n");
        let usage = TenantUsage::of([&job("vision", 1, GpuDemand::Whole(8), 1_000)]);
        // One GPU more would wait; a hundred cores never fit in 64.
        let greedy = job("vision", 1, GpuDemand::Whole(1), 100_000);
        let Err(OverQuota::Never(short)) = usage.admits(&q, &greedy) else {
            panic!("a job that can never fit was left to wait")
        };
        assert_eq!(short.what, "CPU cores");
    }

    #[test]
    fn the_default_limits_apply_to_tenants_not_named() {
        let q = quota("[default]\ngpus = 2\n[tenants.big]\ngpus = 100\n");
        let usage = TenantUsage::default();
        assert!(
            usage
                .admits(&q, &job("anyone", 1, GpuDemand::Whole(4), 0))
                .is_err()
        );
        assert_eq!(
            usage.admits(&q, &job("big", 1, GpuDemand::Whole(4), 0)),
            Ok(())
        );
        // No GPU limit in the default: CPU only.
        let q = quota("[default]\ncpu_cores = 4\n");
        assert_eq!(
            usage.admits(&q, &job("anyone", 1, GpuDemand::Whole(8), 4_000)),
            Ok(())
        );
    }

    #[test]
    fn bad_limits_are_refused_naming_the_key() {
        for (text, key) in [
            ("[tenants.a]\ngpus = -1\n", "tenants.a.gpus"),
            ("[default]\ncpu_cores = nan\n", "default.cpu_cores"),
        ] {
            let q: QuotaConfig = toml::from_str(text).unwrap();
            let e = q.validate().unwrap_err();
            assert!(e.contains(key), "{e}");
        }
        assert!(toml::from_str::<QuotaConfig>("[tenants.a]\ngpu = 1\n").is_err());
    }
}
