//! Workload enrichment: traces say "N GPUs for D seconds"; the simulator needs to know
//! what each job runs. This module builds [`WorkloadKind`]s from measured tables and
//! assigns one to every job, seeded.
//!
//! # Kinds
//!
//! - **Gavel's 26 job types** (`ResNet-50 (batch size 64)`, …): throughput on K80 and
//!   P100 relative to V100 from Gavel's single-GPU measurements (`V100M16`/`V100M32` are
//!   1.0; other GPU models fall back to the catalog's class, which nothing measured per
//!   type); co-location speed = the mean, over the partners Gavel let it share a V100
//!   with, of its throughput beside the partner over its throughput alone;
//!   communication share by per-GPU batch = the Pollux curve of the model of the same
//!   architecture (ResNet-50 ↔ imagenet, ResNet-18 ↔ cifar10, Transformer ↔ bert, LM ↔
//!   deepspeech2 (both recurrent), Recommendation ↔ ncf), else the median over all
//!   Pollux points. The share falls steeply with the per-GPU batch (cifar10: 0.7 at 32
//!   samples per GPU, 0 from 257: large batches hide the all-reduce behind compute),
//!   so one share per model would be wrong for most batch sizes.
//!   Types Gavel measured only on one GPU (A3C, CycleGAN, Recommendation) have no
//!   communication.
//! - **Pollux's six applications** (`pollux/<app>`): their own communication curve,
//!   the co-location speed of the Gavel family of the same architecture (yolov3 has
//!   none: the mean over Gavel's types).
//!
//! Memory: [`WorkloadLibrary::attach_lucid_memory`] gives the Gavel kinds whose
//! architecture Lucid profiled (ResNet-18/50, LSTM, Transformer, NeuMF) their measured
//! GPU memory at their per-GPU batch, as one steady phase, when Lucid's profiles are in
//! the traces directory (they may not be redistributed). Warm-up, evaluation and
//! checkpoint phases are not in any table here; nothing invents them.
//!
//! # Assignment
//!
//! - A job of a Pollux workload (no recorded duration, an application name and a batch
//!   size) gets its application's kind and a duration from [`PolluxApps`].
//! - Any other job draws a Gavel type uniformly among those Gavel measured at its gang
//!   size (a job of more than 8 GPUs among those measured on 8), as Gavel itself does for
//!   Philly-derived traces. The draw uses a ChaCha8 stream per job id of the seed, so a
//!   job's kind does not depend on which other jobs were enriched.
//! - Work: a trace job's recorded duration (a parser's `total_work`) is wall-clock time,
//!   start-up and checkpoints included; it becomes the work that makes the job, alone on
//!   the hardware it was recorded on (a named GPU model, placed as tightly as the cluster
//!   allows), finish in that duration ([`marshal_scheduler::sim::work_for_duration`]).
//!   Without a named model the trace's GPUs count as the reference class (a V100), which
//!   is Gavel's assumption for Philly. A Pollux job's duration is profiled training time
//!   on T4s (steady iterations only), so its work is that time at T4 speed, and the
//!   simulator adds start-up and checkpoint costs on top. Pollux jobs checkpoint when
//!   preempted (AdaptDL does on every rescale), so a preemption costs them a restart,
//!   not lost work.

use std::collections::BTreeMap;

use marshal_scheduler::domain::{
    CommPattern, GpuCatalog, Job, MemPhase, MemPhaseKind, WorkloadCatalog, WorkloadId, WorkloadKind,
};
use marshal_scheduler::sim::{SpeedModel, work_for_duration};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::{
    DatasetError, GavelThroughputs, LucidProfiles, PlacementProfiles, PolluxApps,
    fit_data_parallel_share, gavel_throughputs, pollux_placement_profiles,
};

/// Gavel's GPU types and the catalog models they stand for.
const GAVEL_GPUS: [(&str, &[&str]); 3] = [
    ("k80", &["K80"]),
    ("p100", &["P100"]),
    ("v100", &["V100M16", "V100M32"]),
];

/// Architecture families shared by Gavel's types and Pollux's applications.
const FAMILY_OF_POLLUX_APP: [(&str, &str); 5] = [
    ("imagenet", "ResNet-50"),
    ("cifar10", "ResNet-18"),
    ("bert", "Transformer"),
    ("deepspeech2", "LM"),
    ("ncf", "Recommendation"),
];

/// The catalog model of Pollux's profiling testbed (AWS g4dn: T4).
const POLLUX_GPU: &str = "T4";

/// Prefix of the Pollux application kinds' names.
pub const POLLUX_KIND_PREFIX: &str = "pollux/";

/// Gavel's family of a job type: the text before ` (batch size`.
fn family(job_type: &str) -> &str {
    job_type.split(" (").next().unwrap_or(job_type)
}

/// The batch size in a Gavel job type's name, if any.
fn batch_size(job_type: &str) -> Option<u32> {
    job_type
        .split("batch size ")
        .nth(1)?
        .trim_end_matches(')')
        .parse()
        .ok()
}

/// Every kind the simulator knows, and how to assign them.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadLibrary {
    pub catalog: WorkloadCatalog,
    /// Per kind: the largest gang Gavel measured it on; 0 for kinds never drawn.
    max_scale: Vec<u32>,
    pollux: PolluxApps,
}

/// What [`WorkloadLibrary::enrich`] did.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EnrichReport {
    /// Jobs that drew a Gavel type.
    pub sampled: usize,
    /// Pollux jobs given their application and a duration.
    pub pollux: usize,
    /// Jobs without GPUs, left as they were.
    pub untouched: usize,
    /// Jobs per kind name.
    pub by_kind: BTreeMap<String, usize>,
}

impl WorkloadLibrary {
    /// The library from the bundled tables (Gavel's throughputs, Pollux's profiles).
    pub fn bundled(speed: &SpeedModel) -> Result<Self, DatasetError> {
        let (gavel, _) = gavel_throughputs()?;
        let (profiles, _) = pollux_placement_profiles()?;
        Self::from_tables(
            &gavel,
            &profiles,
            PolluxApps::bundled()?,
            speed.reference_gbps,
        )
    }

    pub fn from_tables(
        gavel: &GavelThroughputs,
        pollux_profiles: &PlacementProfiles,
        pollux: PolluxApps,
        reference_gbps: f64,
    ) -> Result<Self, DatasetError> {
        let invalid = |e: marshal_scheduler::domain::DomainError| DatasetError::Enrichment {
            what: "workload library".into(),
            reason: e.to_string(),
        };
        let fit = fit_data_parallel_share(pollux_profiles, reference_gbps);
        let app_shares = fit.as_ref().map(|f| f.share_by_model()).unwrap_or_default();
        let app_curves = fit.as_ref().map(|f| f.share_curves()).unwrap_or_default();
        let curve_of_family = |fam: &str| {
            FAMILY_OF_POLLUX_APP
                .iter()
                .find(|(_, f)| *f == fam)
                .and_then(|(app, _)| app_curves.get(*app).cloned())
                .unwrap_or_default()
        };
        let median_share = fit.as_ref().map_or(0.0, |f| f.share);
        let share_of_family = |fam: &str| {
            FAMILY_OF_POLLUX_APP
                .iter()
                .find(|(_, f)| *f == fam)
                .and_then(|(app, _)| app_shares.get(*app).copied())
                .unwrap_or(median_share)
        };

        let mut colocation: BTreeMap<String, f64> = BTreeMap::new();
        for job in gavel.job_types() {
            if let Some(speed) = colocation_speed(gavel, job) {
                colocation.insert(job.to_string(), speed);
            }
        }
        let mean_colocation = mean(colocation.values().copied()).unwrap_or(1.0);
        let family_colocation = |fam: &str| {
            mean(
                colocation
                    .iter()
                    .filter(|(job, _)| family(job) == fam)
                    .map(|(_, &s)| s),
            )
            .unwrap_or(mean_colocation)
        };

        let mut kinds = Vec::new();
        let mut max_scale = Vec::new();
        for job in gavel.job_types() {
            let Some(v100) = gavel.single("v100", job, 1).filter(|&t| t > 0.0) else {
                continue;
            };
            let mut relative = BTreeMap::new();
            for (gavel_gpu, ours) in GAVEL_GPUS {
                if let Some(t) = gavel.single(gavel_gpu, job, 1).filter(|&t| t > 0.0) {
                    for name in ours {
                        relative.insert(name.to_string(), t / v100);
                    }
                }
            }
            let scale = gavel
                .scales("v100", job)
                .into_iter()
                .filter(|&s| gavel.single("v100", job, s).is_some_and(|t| t > 0.0))
                .max()
                .unwrap_or(1);
            let fam = family(job);
            kinds.push(WorkloadKind {
                name: job.to_string(),
                family: fam.to_string(),
                comm: if scale > 1 {
                    CommPattern::DataParallel
                } else {
                    CommPattern::None
                },
                relative_throughput: relative,
                comm_share: if scale > 1 { share_of_family(fam) } else { 0.0 },
                comm_share_by_local_batch: if scale > 1 {
                    curve_of_family(fam)
                } else {
                    Vec::new()
                },
                colocation_speed: colocation.get(job).copied().unwrap_or(mean_colocation),
                reference_step_time_s: Some(1.0 / v100),
                memory: Vec::new(),
                source: "gavel simulation_throughputs.json; comm share: pollux placements".into(),
            });
            max_scale.push(scale);
        }
        for app in pollux.names() {
            let fam = FAMILY_OF_POLLUX_APP
                .iter()
                .find(|(a, _)| *a == app)
                .map(|(_, f)| *f);
            kinds.push(WorkloadKind {
                name: format!("{POLLUX_KIND_PREFIX}{app}"),
                family: app.to_string(),
                comm: CommPattern::DataParallel,
                relative_throughput: BTreeMap::new(),
                comm_share: app_shares.get(app).copied().unwrap_or(median_share),
                comm_share_by_local_batch: app_curves.get(app).cloned().unwrap_or_default(),
                colocation_speed: fam.map_or(mean_colocation, family_colocation),
                // Pollux's step time depends on each job's batch; no one value per kind.
                reference_step_time_s: None,
                memory: Vec::new(),
                source: "pollux placements, scalability and validation curves".into(),
            });
            max_scale.push(0);
        }
        Ok(WorkloadLibrary {
            catalog: WorkloadCatalog::new(kinds).map_err(invalid)?,
            max_scale,
            pollux,
        })
    }

    /// The Gavel kinds a job of `gpus` GPUs may draw.
    pub fn candidates(&self, gpus: u32) -> Vec<WorkloadId> {
        let need = gpus.clamp(1, 8);
        self.catalog
            .iter()
            .filter(|(id, _)| self.max_scale[id.0 as usize] >= need)
            .map(|(id, _)| id)
            .collect()
    }

    /// Sets the memory of every Gavel kind whose family Lucid measured: the GPU memory
    /// at the kind's per-GPU batch, from a least-squares line through Lucid's
    /// measurements of that model without mixed precision (memory grows linearly with
    /// the batch: weights and optimiser state plus activations), never below the
    /// smallest measurement. One steady phase. Returns the number of kinds set.
    pub fn attach_lucid_memory(&mut self, lucid: &LucidProfiles) -> usize {
        const LUCID_MODEL: [(&str, &str); 5] = [
            ("ResNet-50", "ResNet50"),
            ("ResNet-18", "ResNet18"),
            ("LM", "LSTM"),
            ("Transformer", "Transformer"),
            ("Recommendation", "NeuMF"),
        ];
        let mut kinds: Vec<WorkloadKind> = self.catalog.iter().map(|(_, k)| k.clone()).collect();
        let mut set = 0;
        for kind in &mut kinds {
            let Some((_, model)) = LUCID_MODEL.iter().find(|(f, _)| *f == kind.family) else {
                continue;
            };
            let (Some(batch), points) = (
                batch_size(&kind.name),
                lucid
                    .singles
                    .iter()
                    .filter(|s| s.job.model == *model && !s.job.amp && s.gmem_mib > 0.0)
                    .map(|s| (f64::from(s.job.batch_size), s.gmem_mib))
                    .collect::<Vec<_>>(),
            ) else {
                continue;
            };
            let Some(mib) = linear_at(&points, f64::from(batch)) else {
                continue;
            };
            kind.memory = vec![MemPhase {
                kind: MemPhaseKind::Steady,
                time_share: 1.0,
                peak_gib: mib / 1024.0,
            }];
            kind.source.push_str("; memory: lucid single_data.csv");
            set += 1;
        }
        if let Ok(catalog) = WorkloadCatalog::new(kinds) {
            self.catalog = catalog;
        }
        set
    }

    pub fn pollux_apps(&self) -> &PolluxApps {
        &self.pollux
    }

    /// Assigns a kind and work to every GPU job of `jobs` (see the module docs).
    /// `recorded_on` names the catalog's GPU model the trace's durations were measured
    /// on (Pollux jobs are always T4 measurements).
    pub fn enrich(
        &self,
        jobs: &mut [Job],
        seed: u64,
        catalog: &GpuCatalog,
        recorded_on: Option<&str>,
        speed: &SpeedModel,
    ) -> Result<EnrichReport, DatasetError> {
        let model = |name: &str| {
            catalog
                .id(name)
                .map(|id| catalog.get(id).clone())
                .ok_or_else(|| DatasetError::Enrichment {
                    what: "recorded hardware".into(),
                    reason: format!("no GPU model {name:?} in the catalog"),
                })
        };
        let recorded_on = recorded_on.map(model).transpose()?;
        let t4 = model(POLLUX_GPU)?;
        let mut report = EnrichReport::default();
        let speed = SpeedModel {
            workloads: self.catalog.clone(),
            ..speed.clone()
        };
        let candidates: BTreeMap<u32, Vec<WorkloadId>> = [1, 2, 4, 8]
            .into_iter()
            .map(|n| (n, self.candidates(n)))
            .collect();
        for job in jobs.iter_mut() {
            if job.gpu_count() == 0 {
                report.untouched += 1;
                continue;
            }
            let app = job.name.split('-').next().unwrap_or("");
            let mut hardware = recorded_on.as_ref();
            let mut wall_clock = true;
            let duration = if job.total_work == 0.0
                && let Some(batch) = job.batch_size
                && let Some(id) = self.catalog.id(&format!("{POLLUX_KIND_PREFIX}{app}"))
            {
                let d = self
                    .pollux
                    .duration(app, job.gpu_count(), batch)
                    .ok_or_else(|| DatasetError::Enrichment {
                        what: format!("job {}", job.name),
                        reason: format!(
                            "no Pollux profile for {app} on {} GPUs at batch {batch}",
                            job.gpu_count()
                        ),
                    })?;
                job.workload = Some(id);
                hardware = Some(&t4);
                wall_clock = false;
                // AdaptDL, which Pollux's jobs run on, checkpoints on every rescale.
                job.checkpoint.on_preempt = true;
                report.pollux += 1;
                d
            } else {
                let pool = &candidates[&job.gpu_count().clamp(1, 8).next_power_of_two().min(8)];
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                rng.set_stream(u64::from(job.id.0));
                let id = pool[rng.random_range(0..pool.len())];
                job.workload = Some(id);
                report.sampled += 1;
                job.total_work
            };
            let Some(kind) = job.workload.and_then(|id| self.catalog.get(id)) else {
                continue;
            };
            *report.by_kind.entry(kind.name.clone()).or_default() += 1;
            if job.gpu_count() > 1 {
                job.comm = kind.comm;
            }
            if job.batch_size.is_none() {
                // Gavel's batch sizes are per GPU (it scales out with the same per-GPU
                // batch); the job records the global batch.
                job.batch_size = batch_size(&kind.name).and_then(|b| b.checked_mul(job.workers));
            }
            let throughput = hardware.map_or(1.0, |m| speed.gpu_throughput(job, m));
            job.total_work = if wall_clock {
                work_for_duration(job, duration, throughput)
            } else {
                duration * throughput
            };
        }
        Ok(report)
    }
}

/// Mean over the partners Gavel let `job` share a V100 with of its throughput beside
/// the partner over its throughput alone.
fn colocation_speed(gavel: &GavelThroughputs, job: &str) -> Option<f64> {
    let alone = gavel.single("v100", job, 1).filter(|&t| t > 0.0)?;
    let ratios = gavel.job_types().into_iter().filter_map(|other| {
        let (mine, _) = gavel.colocated("v100", job, other)?;
        (mine > 0.0).then(|| (mine / alone).min(1.0))
    });
    mean(ratios)
}

/// The least-squares line through `points` at `x` (the only value for one point), not
/// below the smallest `y`.
fn linear_at(points: &[(f64, f64)], x: f64) -> Option<f64> {
    let n = points.len() as f64;
    let floor = points.iter().map(|p| p.1).reduce(f64::min)?;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    Some((my + slope * (x - mx)).max(floor))
}

fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    (n > 0).then(|| sum / n as f64)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use marshal_scheduler::domain::{ClusterSpec, GpuCatalog, JobId, Topology};
    use marshal_scheduler::policies;
    use marshal_scheduler::sim::{LogKind, SimConfig, run_replay};

    use super::*;

    fn library() -> WorkloadLibrary {
        WorkloadLibrary::bundled(&SpeedModel::default()).unwrap()
    }

    #[test]
    fn gavel_kinds_reproduce_gavels_measurements() {
        let lib = library();
        let (gavel, _) = gavel_throughputs().unwrap();
        assert_eq!(lib.catalog.len(), 26 + 6);
        for (_, kind) in lib
            .catalog
            .iter()
            .filter(|(_, k)| !k.name.starts_with(POLLUX_KIND_PREFIX))
        {
            let v100 = gavel.single("v100", &kind.name, 1).unwrap();
            let k80 = gavel.single("k80", &kind.name, 1).unwrap();
            if k80 > 0.0 {
                assert!((kind.relative_throughput["K80"] - k80 / v100).abs() < 1e-12);
            }
            assert_eq!(kind.relative_throughput["V100M32"], 1.0);
            assert!(kind.colocation_speed > 0.0 && kind.colocation_speed <= 1.0);
        }
        let resnet = lib
            .catalog
            .get(lib.catalog.id("ResNet-50 (batch size 64)").unwrap())
            .unwrap();
        let imagenet = lib
            .catalog
            .get(lib.catalog.id("pollux/imagenet").unwrap())
            .unwrap();
        assert_eq!(resnet.comm_share, imagenet.comm_share);
        assert_eq!(resnet.comm, CommPattern::DataParallel);
        let a3c = lib.catalog.get(lib.catalog.id("A3C").unwrap()).unwrap();
        assert_eq!((a3c.comm, a3c.comm_share), (CommPattern::None, 0.0));
    }

    #[test]
    fn multi_gpu_jobs_draw_only_types_measured_at_their_size() {
        let lib = library();
        let single = lib.candidates(1);
        let eight = lib.candidates(8);
        assert_eq!(single.len(), 26);
        assert!(!eight.is_empty() && eight.len() < single.len());
        assert_eq!(lib.candidates(64), eight);
        for id in &eight {
            let name = &lib.catalog.get(*id).unwrap().name;
            assert!(
                !name.starts_with("A3C") && !name.starts_with("Recommendation"),
                "{name}"
            );
        }
    }

    #[test]
    fn enrichment_is_seeded_and_per_job() {
        let lib = library();
        let speed = SpeedModel::default();
        let jobs: Vec<Job> = (0..200)
            .map(|i| Job::whole_gpus(JobId(i), 1 << (i % 5), 0.0, 3600.0))
            .collect();
        let kinds = |seed, jobs: &mut [Job]| {
            lib.enrich(jobs, seed, &GpuCatalog::default(), None, &speed)
                .unwrap();
            jobs.iter().map(|j| j.workload).collect::<Vec<_>>()
        };
        let a = kinds(7, &mut jobs.clone());
        assert_eq!(a, kinds(7, &mut jobs.clone()));
        assert_ne!(a, kinds(8, &mut jobs.clone()));
        // Enriching a subset gives its jobs the same kinds.
        let mut tail = jobs[100..].to_vec();
        assert_eq!(kinds(7, &mut tail), a[100..].to_vec());
        let distinct: std::collections::BTreeSet<_> = a.iter().collect();
        assert!(distinct.len() > 10, "{} kinds", distinct.len());
    }

    /// The work assigned to a job makes it finish in its recorded duration when it runs
    /// alone on the hardware it was recorded on, whatever kind it drew.
    #[test]
    fn recorded_durations_hold_on_the_recorded_hardware() {
        let lib = library();
        let spec = ClusterSpec::from_toml(
            "name='k80s'\nnodes_per_rack=4\n[[nodes]]\ncount=4\ngpu_model='K80'\ngpus=8\n\
             cpu_milli=64000\nmemory_mib=256000\n",
        )
        .unwrap();
        let topo = Arc::new(Topology::build(&spec).unwrap());
        let durations = [5000.0, 20_000.0, 90_000.0, 7200.0];
        let mut jobs: Vec<Job> = durations
            .iter()
            .enumerate()
            .map(|(i, &d)| Job::whole_gpus(JobId(i as u32), [1, 2, 4, 8][i], i as f64 * 1e6, d))
            .collect();
        let speed = SpeedModel::default();
        lib.enrich(&mut jobs, 3, &topo.catalog, Some("K80"), &speed)
            .unwrap();
        let config = SimConfig {
            speed: SpeedModel {
                workloads: lib.catalog.clone(),
                ..speed
            },
            ..SimConfig::replay(1)
        };
        let policy = policies::build("topo-pack", &jobs).unwrap();
        let (_, log) = run_replay(&policy, topo, &jobs, "t", &config).unwrap();
        for (job, d) in jobs.iter().zip(durations) {
            let start = log
                .iter()
                .find(|e| e.job == job.id && matches!(e.what, LogKind::Start(_)))
                .unwrap()
                .time;
            let end = log
                .iter()
                .find(|e| e.job == job.id && matches!(e.what, LogKind::Finish))
                .unwrap()
                .time;
            assert!(
                ((end - start) - d).abs() < 1e-6 * d,
                "{}: ran {} s, recorded {d} s",
                job.name,
                end - start
            );
        }
        assert!(jobs.iter().all(|j| j.workload.is_some()));
    }

    #[test]
    fn pollux_jobs_get_their_application_and_duration() {
        let lib = library();
        let (mut jobs, _) = crate::load_trace("pollux-1", &GpuCatalog::default()).unwrap();
        let report = lib
            .enrich(
                &mut jobs,
                1,
                &GpuCatalog::default(),
                None,
                &SpeedModel::default(),
            )
            .unwrap();
        assert_eq!(report.pollux, 160);
        for job in &jobs {
            let kind = lib.catalog.get(job.workload.unwrap()).unwrap();
            assert_eq!(
                kind.name,
                format!("pollux/{}", job.name.split('-').next().unwrap())
            );
            assert!(job.total_work > 0.0);
        }
    }

    #[test]
    fn memory_is_a_least_squares_line_in_the_batch() {
        let points = [(32.0, 3000.0), (64.0, 5000.0), (128.0, 9000.0)];
        assert!((linear_at(&points, 96.0).unwrap() - 7000.0).abs() < 1e-9);
        assert_eq!(linear_at(&points, 1.0), Some(3000.0));
        assert_eq!(linear_at(&[(8.0, 100.0)], 64.0), Some(100.0));
        assert_eq!(linear_at(&[], 1.0), None);
    }

    #[test]
    fn lucid_memory_fills_the_kinds_it_measured_when_present() {
        let Ok((lucid, _)) = crate::load_lucid_profiles() else {
            eprintln!("skipped: Lucid's profiles are not in the traces directory");
            return;
        };
        let mut lib = library();
        let set = lib.attach_lucid_memory(&lucid);
        assert!(set >= 15, "{set} kinds");
        let small = lib
            .catalog
            .get(lib.catalog.id("ResNet-50 (batch size 16)").unwrap())
            .unwrap();
        let large = lib
            .catalog
            .get(lib.catalog.id("ResNet-50 (batch size 128)").unwrap())
            .unwrap();
        let (s, l) = (
            small.peak_memory_gib().unwrap(),
            large.peak_memory_gib().unwrap(),
        );
        assert!(s > 0.5 && s < l && l < 80.0, "{s} {l}");
        let a3c = lib.catalog.get(lib.catalog.id("A3C").unwrap()).unwrap();
        assert!(a3c.memory.is_empty());
    }
}
