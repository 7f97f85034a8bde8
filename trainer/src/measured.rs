//! Measured step times as examples, and folds that hold a part of them out of both the
//! prior's calibration and the network's training.
//!
//! On the simulator's telemetry the physics prior is the simulator's own speed model, so
//! it is exact and an evaluation there proves nothing. Measured profiles (e.g. Pollux's
//! step times per model, per-GPU batch and placement on AWS g4dn nodes) are not derived
//! from the prior; the folds here keep what is tested out of everything fitted:
//!
//! - **the job type** of a measurement is its model at its per-GPU batch
//!   (`<model>/b<batch>`, [`measured_kind`]), as the simulator's kinds are a model at a
//!   batch size; each measurement is its own job;
//! - **the prior's constants** (each model's communication share by per-GPU batch) are
//!   refitted per fold from the training side's packed/spread pairs only
//!   ([`fit_comm_catalog`]), and so are the synchronisation lines of the prior's second
//!   form ([`fit_measured_prior`]); the shares bundled in the workload catalog were
//!   fitted to these same profiles and are not used;
//! - **the history, baselines and network** see the training side only, as in every
//!   other split.

use std::collections::{BTreeMap, BTreeSet};

use marshal_scheduler::domain::{CommPattern, TopoLevel, WorkloadCatalog, WorkloadKind};

use crate::featurize::parse_level;
use crate::split::split_holding_out;
use crate::{ClusterContext, Split, StepExample, TrainerError};

/// One measured step time: `model` training with `local_bsz` samples per GPU on
/// `placement` (GPUs on each node, one digit per node, e.g. `"22"`) of `gpu_type`.
#[derive(Clone, Debug, PartialEq)]
pub struct MeasuredStep {
    pub model: String,
    pub gpu_type: String,
    pub placement: String,
    pub local_bsz: u32,
    pub step_time_s: f64,
}

/// The job type of a measurement: its model at its per-GPU batch.
pub fn measured_kind(model: &str, local_bsz: u32) -> String {
    format!("{model}/b{local_bsz}")
}

/// The model a [`measured_kind`] name was built from.
fn family(kind: &str) -> &str {
    kind.rsplit_once("/b").map_or(kind, |(f, _)| f)
}

/// The measurements as examples, and how many were skipped: placements with unequal GPU
/// counts per node (the placement graph is `nodes × GPUs per node`) or unreadable ones,
/// step times outside [`crate::examples::STEP_TIME_RANGE_S`], and global batches beyond
/// `u32`. Multi-node placements span the `rack` level (the
/// measured testbeds are one flat network); single-node ones `node` (`gpu` for one GPU).
/// Every example is data-parallel, alone on its GPUs.
pub fn measured_examples(steps: &[MeasuredStep]) -> (Vec<StepExample>, usize) {
    let mut out = Vec::new();
    for s in steps {
        let digits: Vec<u32> = s.placement.chars().filter_map(|c| c.to_digit(10)).collect();
        let uniform = !digits.is_empty()
            && digits.len() == s.placement.len()
            && digits[0] > 0
            && digits.iter().all(|&d| d == digits[0]);
        if !(uniform && crate::examples::STEP_TIME_RANGE_S.contains(&s.step_time_s))
            || s.local_bsz == 0
        {
            continue;
        }
        let (nodes, per_node) = (digits.len() as u32, digits[0]);
        let gpus = nodes * per_node;
        // A per-GPU batch in the millions is damage; its product with the GPU count
        // would overflow (a panic in a debug build, a wrong batch in a release one).
        let Some(global_batch) = s.local_bsz.checked_mul(gpus) else {
            continue;
        };
        let span = match (nodes, gpus) {
            (1, 1) => "gpu",
            (1, _) => "node",
            _ => "rack",
        };
        let kind = measured_kind(&s.model, s.local_bsz);
        out.push(StepExample {
            job_id: format!("{kind}/{}/{}", s.gpu_type, s.placement),
            model: kind,
            gpu_type: s.gpu_type.clone(),
            num_gpus: gpus,
            nodes,
            gpus_per_node: per_node,
            span: span.into(),
            batch_size: Some(global_batch),
            comm: "data-parallel".into(),
            tenants: 1,
            step_time_s: s.step_time_s,
            gpu_util_pct: None,
            peak_mem_gib: [None; 4],
            rows: 1,
        });
    }
    let skipped = steps.len() - out.len();
    (out, skipped)
}

fn median(v: Vec<f64>) -> Option<f64> {
    crate::examples::median(v)
}

/// A workload catalog for `kinds` (every job type that will be featurised, test side
/// included, so that none falls back to the simulator's defaults, which were fitted to
/// measured profiles) whose numbers come from `train` alone:
///
/// - for each job type and GPU count with a single-node (packed) and a multi-node
///   (spread) example in `train`, the communication share `c` for which
///   `(1 − c + c·ref/bw(spread)) / (1 − c + c·ref/bw(packed))` equals the measured
///   spread/packed step-time ratio (the calibration `marshal datasets calibrate` runs on
///   all the profiles), clamped to [0, 0.95];
/// - each model's curve is the mean share per per-GPU batch of its pairs; each kind of
///   the model gets the curve, and the median of the model's shares as its scalar;
/// - a model with no pair in `train` gets the median of all training shares, flat; with
///   no pair at all the prior assumes no communication cost (share 0): it has nothing to
///   calibrate it on.
pub fn fit_comm_catalog<'a>(
    ctx: &ClusterContext,
    train: &[StepExample],
    kinds: impl IntoIterator<Item = &'a str>,
) -> Result<WorkloadCatalog, TrainerError> {
    let level = |e: &StepExample| {
        parse_level(&e.span).unwrap_or(if e.nodes > 1 {
            TopoLevel::Rack
        } else {
            TopoLevel::Node
        })
    };
    // (kind, GPUs) → (packed times and level, spread times and level).
    type Sides = (Vec<f64>, Option<TopoLevel>, Vec<f64>, Option<TopoLevel>);
    let mut groups: BTreeMap<(&str, u32), Sides> = BTreeMap::new();
    for e in train.iter().filter(|e| e.num_gpus > 1 && e.tenants <= 1) {
        let g = groups.entry((e.model.as_str(), e.num_gpus)).or_default();
        if e.nodes == 1 {
            g.0.push(e.step_time_s);
            g.1 = g.1.max(Some(level(e)));
        } else {
            g.2.push(e.step_time_s);
            g.3 = g.3.max(Some(level(e)));
        }
    }
    let reference = ctx.reference_gbps();
    // Model → per-GPU batch → shares.
    let mut shares: BTreeMap<String, BTreeMap<u64, Vec<f64>>> = BTreeMap::new();
    for ((kind, gpus), (packed, packed_level, spread, spread_level)) in groups {
        let (Some(p), Some(lp), Some(s), Some(ls)) =
            (median(packed), packed_level, median(spread), spread_level)
        else {
            continue;
        };
        let k = |l: TopoLevel| reference / ctx.level_gbps(l).max(1e-6);
        let (kp, ks) = (k(lp), k(ls));
        let ratio = s / p;
        let c = (ratio - 1.0) / ((ks - 1.0) - ratio * (kp - 1.0));
        if !c.is_finite() {
            continue;
        }
        let local = train
            .iter()
            .find(|e| e.model == kind && e.num_gpus == gpus)
            .and_then(|e| e.batch_size)
            .map_or(0.0, |b| f64::from(b) / f64::from(gpus));
        if local > 0.0 {
            shares
                .entry(family(kind).to_string())
                .or_default()
                .entry(local.to_bits())
                .or_default()
                .push(c.clamp(0.0, 0.95));
        }
    }
    let all: Vec<f64> = shares
        .values()
        .flat_map(|by_batch| by_batch.values().flatten().copied())
        .collect();
    let fallback = median(all).unwrap_or(0.0);
    let names: BTreeSet<&str> = kinds.into_iter().collect();
    let mut out = Vec::new();
    for name in names {
        let (curve, scalar) = match shares.get(family(name)) {
            Some(by_batch) => {
                let mut curve: Vec<(f64, f64)> = by_batch
                    .iter()
                    .map(|(b, v)| (f64::from_bits(*b), v.iter().sum::<f64>() / v.len() as f64))
                    .collect();
                curve.sort_by(|a, b| a.0.total_cmp(&b.0));
                let scalar = median(by_batch.values().flatten().copied().collect());
                (curve, scalar.unwrap_or(fallback))
            }
            None => (Vec::new(), fallback),
        };
        out.push(WorkloadKind {
            name: name.to_string(),
            family: family(name).to_string(),
            comm: CommPattern::DataParallel,
            relative_throughput: BTreeMap::new(),
            comm_share: scalar,
            comm_share_by_local_batch: curve,
            colocation_speed: 1.0,
            reference_step_time_s: None,
            memory: Vec::new(),
            source: "fitted to a training split's measured packed/spread pairs".into(),
        });
    }
    WorkloadCatalog::new(out).map_err(|e| TrainerError::Invalid(e.to_string()))
}

/// One held-out part of the measured examples.
#[derive(Clone, Debug, PartialEq)]
pub struct MeasuredFold {
    /// What is held out, e.g. `4 GPUs within rack` or `model bert`.
    pub label: String,
    /// The group the fold belongs to (`unseen shape` or `unseen model`).
    pub group: &'static str,
    pub split: Split,
}

impl MeasuredFold {
    /// The prior's workload catalog for this fold: [`fit_comm_catalog`] on the training
    /// side only (not validation, whose residuals calibrate the interval, nor the test),
    /// with an entry for every job type on any side.
    pub fn prior_catalog(&self, ctx: &ClusterContext) -> Result<WorkloadCatalog, TrainerError> {
        let kinds = self.kinds();
        fit_comm_catalog(ctx, &self.split.train, kinds.iter().map(String::as_str))
    }

    /// Every job type on any side of the fold, for [`fit_measured_prior`].
    pub fn kinds(&self) -> Vec<String> {
        let s = &self.split;
        let kinds: BTreeSet<&str> = s
            .train
            .iter()
            .chain(&s.valid)
            .chain(&s.test)
            .map(|e| e.model.as_str())
            .collect();
        kinds.into_iter().map(str::to_string).collect()
    }
}

/// Which form of the prior a measured evaluation fits (see `crate::featurize`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum PriorForm {
    /// Communication shares only: the step over the bottleneck link's locality factor.
    Share,
    /// Shares, and fitted synchronisation lines ([`crate::SyncFit`]) wherever the
    /// training side measures a family's gangs.
    Sync,
}

/// `base` with the prior's constants fitted on `train` alone: the communication shares
/// ([`fit_comm_catalog`], with an entry for each of `kinds`) and, for
/// [`PriorForm::Sync`], the synchronisation lines. Each training side a measured
/// evaluation trains on (a fold's, and each auxiliary calibration run's inside it) gets
/// its own, so no held-out step time reaches the prior.
pub fn fit_measured_prior(
    base: &ClusterContext,
    train: &[StepExample],
    kinds: &[String],
    form: PriorForm,
) -> Result<ClusterContext, TrainerError> {
    let ctx = base.with_kinds(fit_comm_catalog(
        base,
        train,
        kinds.iter().map(String::as_str),
    )?);
    Ok(match form {
        PriorForm::Share => ctx,
        PriorForm::Sync => {
            let sync = ctx.fit_sync(train);
            ctx.with_sync(sync)
        }
    })
}

/// Leave-one-shape-class-out: one fold per multi-GPU (span, GPU count) class, whose
/// examples are the test side; the rest split by job into training and validation
/// (`valid` of them). A class that leaves no training or validation example is skipped.
pub fn leave_one_class_out(examples: &[StepExample], seed: u64, valid: f64) -> Vec<MeasuredFold> {
    let classes: BTreeSet<(&str, u32)> = examples
        .iter()
        .filter(|e| e.num_gpus > 1)
        .map(|e| (e.span.as_str(), e.num_gpus))
        .collect();
    classes
        .into_iter()
        .map(|(span, n)| {
            let is_held = |e: &StepExample| e.span == span && e.num_gpus == n;
            let label = format!("{n} GPUs within {span}");
            held_out(examples, &is_held, seed, valid, "unseen shape", label)
        })
        .filter(usable)
        .collect()
}

/// Leave-one-model-out: one fold per model (every per-GPU batch of it), as
/// [`leave_one_class_out`] does per shape.
pub fn leave_one_model_out(examples: &[StepExample], seed: u64, valid: f64) -> Vec<MeasuredFold> {
    let models: BTreeSet<&str> = examples.iter().map(|e| family(&e.model)).collect();
    models
        .into_iter()
        .map(|m| {
            let is_held = |e: &StepExample| family(&e.model) == m;
            held_out(
                examples,
                &is_held,
                seed,
                valid,
                "unseen model",
                format!("model {m}"),
            )
        })
        .filter(usable)
        .collect()
}

/// Folds that train on `examples` and test on a second set of measurements, `other`
/// (e.g. a separate experiment on the same testbed): one fold for the measurements of
/// `other` whose (span, GPU count) class occurs in `examples`, labelled `<label>, seen
/// shape classes`, and one for the rest, `<label>, new shape classes`. Both folds have the
/// same training and validation sides. An empty part gives no fold.
pub fn test_on_other_set(
    examples: &[StepExample],
    other: &[StepExample],
    seed: u64,
    valid: f64,
    label: &str,
) -> Vec<MeasuredFold> {
    let trained: BTreeSet<(&str, u32)> = examples
        .iter()
        .map(|e| (e.span.as_str(), e.num_gpus))
        .collect();
    let (seen, new): (Vec<StepExample>, Vec<StepExample>) = other
        .iter()
        .cloned()
        .partition(|e| trained.contains(&(e.span.as_str(), e.num_gpus)));
    [(seen, "seen shape classes"), (new, "new shape classes")]
        .into_iter()
        .map(|(part, which)| {
            let held: BTreeSet<String> = part.iter().map(|e| e.job_id.clone()).collect();
            let all: Vec<StepExample> = examples.iter().cloned().chain(part).collect();
            let is_held = |e: &StepExample| held.contains(&e.job_id);
            held_out(
                &all,
                &is_held,
                seed,
                valid,
                "other set",
                format!("{label}, {which}"),
            )
        })
        .filter(usable)
        .collect()
}

fn held_out(
    examples: &[StepExample],
    is_held: &dyn Fn(&StepExample) -> bool,
    seed: u64,
    valid: f64,
    group: &'static str,
    label: String,
) -> MeasuredFold {
    MeasuredFold {
        label,
        group,
        split: split_holding_out(examples, is_held, seed, valid),
    }
}

fn usable(f: &MeasuredFold) -> bool {
    !(f.split.train.is_empty() || f.split.valid.is_empty() || f.split.test.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use marshal_scheduler::domain::{ClusterSpec, Topology};

    /// Four T4-like GPUs per node on PCIe (16 GB/s), 6.25 GB/s between nodes.
    fn ctx() -> ClusterContext {
        let spec = ClusterSpec::from_toml(
            "name='g'\nnodes_per_rack=4\n[links]\nnvlink_gbps=16.0\npcie_gbps=16.0\n\
             rack_gbps=6.25\nspine_gbps=6.25\n[[nodes]]\ncount=8\ngpu_model='T4'\ngpus=4\n\
             nvlink_domain=0\ncpu_milli=1\nmemory_mib=1\n",
        )
        .unwrap();
        ClusterContext::new(&Topology::build(&spec).unwrap(), WorkloadCatalog::default())
    }

    fn step(model: &str, placement: &str, bsz: u32, t: f64) -> MeasuredStep {
        MeasuredStep {
            model: model.into(),
            gpu_type: "T4".into(),
            placement: placement.into(),
            local_bsz: bsz,
            step_time_s: t,
        }
    }

    /// Two models, each at two batch sizes, on uniform placements of 1 to 8 GPUs.
    fn steps() -> Vec<MeasuredStep> {
        let mut v = Vec::new();
        for (model, base) in [("bert", 0.2), ("cifar10", 0.05)] {
            for bsz in [32, 64] {
                let compute = base * f64::from(bsz) / 32.0;
                for (placement, comm) in [
                    ("1", 0.0),
                    ("2", 0.01),
                    ("4", 0.02),
                    ("11", 0.05),
                    ("22", 0.08),
                    ("1111", 0.1),
                    ("44", 0.12),
                    ("2222", 0.15),
                ] {
                    v.push(step(model, placement, bsz, compute + comm));
                }
            }
        }
        v
    }

    #[test]
    fn measurements_become_examples_with_their_shape_and_job_type() {
        let mut s = steps();
        s.push(step("bert", "31", 32, 1.0)); // unequal nodes
        s.push(step("bert", "x", 32, 1.0));
        s.push(step("bert", "2", 32, 0.0));
        s.push(step("bert", "2", 32, 1e39));
        s.push(step("bert", "2222", u32::MAX / 4, 1.0)); // × 8 GPUs overflows
        let (examples, skipped) = measured_examples(&s);
        assert_eq!((examples.len(), skipped), (32, 5));
        let e = examples
            .iter()
            .find(|e| e.job_id == "bert/b64/T4/2222")
            .unwrap();
        assert_eq!(
            (e.model.as_str(), e.num_gpus, e.nodes, e.gpus_per_node),
            ("bert/b64", 8, 4, 2)
        );
        assert_eq!((e.span.as_str(), e.batch_size), ("rack", Some(512)));
        let spans: BTreeSet<(&str, u32)> = examples
            .iter()
            .map(|e| (e.span.as_str(), e.num_gpus))
            .collect();
        assert!(spans.contains(&("gpu", 1)) && spans.contains(&("node", 4)));
        // Every measurement is its own job.
        let jobs: BTreeSet<&str> = examples.iter().map(|e| e.job_id.as_str()).collect();
        assert_eq!(jobs.len(), examples.len());
    }

    #[test]
    fn no_fold_leaks_its_held_out_part_into_training_or_validation() {
        let (examples, _) = measured_examples(&steps());
        let folds = leave_one_class_out(&examples, 7, 0.2);
        let labels: Vec<&str> = folds.iter().map(|f| f.label.as_str()).collect();
        // Every multi-GPU class (node 2, node 4, rack 2, rack 4, rack 8) once.
        assert_eq!(
            labels,
            [
                "2 GPUs within node",
                "4 GPUs within node",
                "2 GPUs within rack",
                "4 GPUs within rack",
                "8 GPUs within rack"
            ]
        );
        for f in &folds {
            let held: BTreeSet<(&str, u32)> = f
                .split
                .test
                .iter()
                .map(|e| (e.span.as_str(), e.num_gpus))
                .collect();
            assert_eq!(held.len(), 1, "{}", f.label);
            for e in f.split.train.iter().chain(&f.split.valid) {
                assert!(!held.contains(&(e.span.as_str(), e.num_gpus)), "{e:?}");
                assert!(f.split.test.iter().all(|t| t.job_id != e.job_id));
            }
            // Nothing is lost: every example is on exactly one side.
            let sides = f.split.train.len() + f.split.valid.len() + f.split.test.len();
            assert_eq!(sides, examples.len());
        }
        let folds = leave_one_model_out(&examples, 7, 0.2);
        assert_eq!(folds.len(), 2);
        for f in &folds {
            let m = family(&f.split.test[0].model);
            assert!(f.split.test.iter().all(|e| family(&e.model) == m));
            assert!(
                f.split
                    .train
                    .iter()
                    .chain(&f.split.valid)
                    .all(|e| family(&e.model) != m)
            );
        }
    }

    #[test]
    fn another_set_is_tested_whole_with_seen_and_new_shapes_apart() {
        let (examples, _) = measured_examples(&steps());
        // Larger gangs: 6 nodes × 1 (a class the examples lack) and 4 × 2 (one they have),
        // with job ids of their own.
        let mut extra = Vec::new();
        for p in ["111111", "2222"] {
            extra.push(step("bert", p, 32, 1.0));
        }
        let (mut other, _) = measured_examples(&extra);
        for e in &mut other {
            e.job_id = format!("scalability:{}", e.job_id);
        }
        let folds = test_on_other_set(&examples, &other, 3, 0.2, "larger");
        let labels: Vec<&str> = folds.iter().map(|f| f.label.as_str()).collect();
        assert_eq!(
            labels,
            ["larger, seen shape classes", "larger, new shape classes"]
        );
        assert_eq!(folds[0].split.test.len(), 1);
        assert_eq!(folds[0].split.test[0].num_gpus, 8);
        assert_eq!(folds[1].split.test[0].num_gpus, 6);
        for f in &folds {
            // Training and validation are the first set, whole, on both folds.
            assert_eq!(f.split.train.len() + f.split.valid.len(), examples.len());
            assert_eq!(f.split.train, folds[0].split.train);
            assert!(
                f.split
                    .train
                    .iter()
                    .all(|e| !e.job_id.starts_with("scalability:"))
            );
        }
    }

    #[test]
    fn the_prior_is_calibrated_on_the_training_side_only() {
        let ctx = ctx();
        let (examples, _) = measured_examples(&steps());
        let folds = leave_one_class_out(&examples, 7, 0.2);
        let fold = folds
            .iter()
            .find(|f| f.label == "4 GPUs within rack")
            .unwrap();
        let catalog = fold.prior_catalog(&ctx).unwrap();
        // Every job type of the data is in the catalog, test ones included, so none
        // falls back to the simulator's defaults.
        for e in &examples {
            assert!(catalog.id(&e.model).is_some(), "{}", e.model);
        }
        // The held-out answers, or the validation ones, do not move the constants.
        let mut other = fold.clone();
        for e in other.split.test.iter_mut().chain(&mut other.split.valid) {
            e.step_time_s *= 50.0;
        }
        assert_eq!(other.prior_catalog(&ctx).unwrap(), catalog);
        // The training answers do: the fit reads its data.
        let mut leaked = fold.clone();
        leaked.split.train.extend(fold.split.test.iter().map(|e| {
            let mut e = e.clone();
            e.step_time_s *= 50.0;
            e
        }));
        assert_ne!(leaked.prior_catalog(&ctx).unwrap(), catalog);
        let mut moved = fold.clone();
        for e in moved.split.train.iter_mut().filter(|e| e.nodes > 1) {
            e.step_time_s *= 2.0;
        }
        assert_ne!(moved.prior_catalog(&ctx).unwrap(), catalog);
    }

    #[test]
    fn the_sync_prior_reads_the_training_side_only() {
        let ctx = ctx();
        let (examples, _) = measured_examples(&steps());
        let folds = leave_one_class_out(&examples, 7, 0.2);
        let fold = folds
            .iter()
            .find(|f| f.label == "8 GPUs within rack")
            .unwrap();
        let kinds = fold.kinds();
        let fit = |f: &MeasuredFold, form| {
            let ctx = fit_measured_prior(&ctx, &f.split.train, &kinds, form).unwrap();
            let history = crate::StepHistory::fit(&f.split.train, |e| ctx.history_speed(e));
            fold.split
                .test
                .iter()
                .map(|e| ctx.prior_step_s(e, &history))
                .collect::<Vec<_>>()
        };
        let sync = fit(fold, PriorForm::Sync);
        // Held-out and validation answers do not move the prior.
        let mut other = fold.clone();
        for e in other.split.test.iter_mut().chain(&mut other.split.valid) {
            e.step_time_s *= 50.0;
        }
        assert_eq!(fit(&other, PriorForm::Sync), sync);
        // Training answers do, and the two forms differ.
        let mut moved = fold.clone();
        for e in moved.split.train.iter_mut().filter(|e| e.nodes > 1) {
            e.step_time_s *= 2.0;
        }
        assert_ne!(fit(&moved, PriorForm::Sync), sync);
        assert_ne!(fit(fold, PriorForm::Share), sync);
        // The data's communication grows with the gang (0.1 s on 4 nodes, 0.15 s on
        // 4 × 2): the sync form extrapolates the growth to the held-out 8-GPU gangs
        // (0.12 s on 2 × 4, 0.15 s on 4 × 2), the share form cannot.
        let mape = |p: &[f64]| {
            let truth: Vec<f64> = fold.split.test.iter().map(|e| e.step_time_s).collect();
            crate::mape(p, &truth)
        };
        let share = fit(fold, PriorForm::Share);
        assert!(
            mape(&sync) < mape(&share),
            "{} vs {}",
            mape(&sync),
            mape(&share)
        );
    }

    #[test]
    fn a_fitted_share_reproduces_its_pair_and_an_empty_fit_assumes_no_communication() {
        let ctx = ctx();
        // One pair: 2 GPUs packed 1.0 s, spread 1.3 s.
        let (train, _) = measured_examples(&[
            step("bert", "2", 32, 1.0),
            step("bert", "11", 32, 1.3),
            step("bert", "1", 32, 0.9),
        ]);
        let catalog = fit_comm_catalog(&ctx, &train, ["bert/b32", "gpt/b8"]).unwrap();
        let bert = catalog.get(catalog.id("bert/b32").unwrap()).unwrap();
        let c = bert.comm_share_at(Some(32.0));
        assert!(c > 0.0 && c < 0.95, "{c}");
        let k = |l| ctx.reference_gbps() / ctx.level_gbps(l);
        let ratio = (1.0 - c + c * k(TopoLevel::Rack)) / (1.0 - c + c * k(TopoLevel::Node));
        assert!((ratio - 1.3).abs() < 1e-9, "{ratio}");
        // A model without pairs gets the training median, flat.
        let gpt = catalog.get(catalog.id("gpt/b8").unwrap()).unwrap();
        assert!((gpt.comm_share - c).abs() < 1e-12 && gpt.comm_share_by_local_batch.is_empty());
        // No pair at all: share 0.
        let (single, _) = measured_examples(&[step("bert", "1", 32, 0.9)]);
        let empty = fit_comm_catalog(&ctx, &single, ["bert/b32"]).unwrap();
        assert_eq!(
            empty.get(empty.id("bert/b32").unwrap()).unwrap().comm_share,
            0.0
        );
    }
}
