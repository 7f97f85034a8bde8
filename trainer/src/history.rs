//! What earlier jobs of the same kind measured: the predictor's "history" job feature.
//!
//! A scheduler that has run a kind of job before knows roughly how long its steps take;
//! the network's task is then the placement's effect on top of that. The history of an
//! example is the median step time of *other* jobs of the same kind, as specific as the
//! data allows: same kind, GPU type and GPU count (level 3), same kind and GPU type
//! (level 2), same kind (level 1), or nothing (level 0).
//!
//! Each entry keeps the speed factor of its own placement
//! ([`crate::ClusterContext::placement_speed`]: GPU throughput class, locality,
//! co-tenancy), and a recall answers with the *packed* step time, `step time × factor`
//! (what the job would take on the tightest placement, unshared, on the reference GPU),
//! so that measurements of the same kind on different placements agree, and the prior
//! can carry them to any other placement.
//!
//! The history also remembers how far the prior ([`crate::ClusterContext::prior_step_s`])
//! was from what the kind measured: [`StepHistory::prior_offset`] is the mean of
//! `ln(step / prior)` over other jobs of the same kind and GPU type on the same
//! [`Locality`], shrunk towards 0 by one pseudo-observation (`Σ / (n + 1)`),
//! and the prior is multiplied by its exponential. A physics prior with a form error
//! particular to a kind (a model whose all-reduce overlaps its backward pass better than
//! the line assumes) then stops repeating that error on every new placement of it. Each
//! entry's prior is the one a new job of its kind would get on its placement, taken
//! before any offset ([`StepHistory::fit_with_priors`]), so the offsets carry the
//! prior's error rather than the history's and do not feed on themselves.
//!
//! The example's own job is always left out. Without that, a training example whose key
//! holds only its own job would see its answer as a feature, the network would learn to
//! copy it, and at test time (where jobs are new) the copy would be worth much less.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::examples::median;
use crate::{StepExample, TrainerError};

/// File name of the history inside a predictor artifact directory.
pub const HISTORY_FILE: &str = "history.json";

/// One earlier measurement. A field this build does not know is refused: the history
/// feeds the network's inputs and the prior's offsets, so a field that changes what an
/// entry means (as `nodes` and `prior_s` did when they were added) must not be dropped
/// silently by an older build.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryEntry {
    pub job_id: String,
    pub model: String,
    pub gpu_type: String,
    pub num_gpus: u32,
    pub step_time_s: f64,
    /// Speed factor of the placement it was measured on (step time × speed = packed
    /// step time).
    pub speed: f64,
    /// Machines its placement spanned (0: not recorded, as in histories written before
    /// the prior's offsets; such an entry gives no offset).
    #[serde(default)]
    pub nodes: u32,
    /// The prior's step time for a new job of its kind on its placement, before any
    /// offset; `None` gives no offset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prior_s: Option<f64>,
}

/// Step times of earlier jobs, indexed at three levels of specificity.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepHistory {
    entries: Vec<HistoryEntry>,
    by_count: BTreeMap<(String, String, u32), Vec<usize>>,
    by_type: BTreeMap<(String, String), Vec<usize>>,
    by_model: BTreeMap<String, Vec<usize>>,
    /// (kind, GPU type, spans several machines) → entries with a prior.
    by_locality: BTreeMap<(String, String, Locality), Vec<usize>>,
}

/// How a gang's GPUs are spread, as far as the prior's offset is concerned: a gang on
/// one machine reduces over NVLink or PCIe; one GPU on each of several machines
/// reduces over the network alone; several GPUs on each of several machines reduce in
/// two stages (inside each machine, then across). A miss learned in one says little
/// about another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Locality {
    OneMachine,
    OneGpuPerMachine,
    SeveralGpusPerMachine,
}

impl Locality {
    /// The locality of `gpus` GPUs on `nodes` machines (several GPUs per machine when
    /// any machine has two or more).
    pub fn of(nodes: u32, gpus: u32) -> Self {
        if nodes <= 1 {
            Locality::OneMachine
        } else if gpus <= nodes {
            Locality::OneGpuPerMachine
        } else {
            Locality::SeveralGpusPerMachine
        }
    }
}

/// A history lookup: the median packed step time and how specific it is (1..=3).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Recalled {
    pub packed_step_s: f64,
    pub level: u8,
}

impl StepHistory {
    /// The history of the training examples (valid and test examples must not be in it);
    /// `speed` gives each example's placement speed factor (see the module docs).
    pub fn fit(train: &[StepExample], speed: impl Fn(&StepExample) -> f64) -> Self {
        Self::from_entries(Self::entries(train, speed).map(|(h, _)| h).collect())
    }

    /// One entry per usable example, beside it.
    fn entries(
        train: &[StepExample],
        speed: impl Fn(&StepExample) -> f64,
    ) -> impl Iterator<Item = (HistoryEntry, &StepExample)> {
        train
            .iter()
            .map(move |e| (e, speed(e)))
            .filter(|(e, s)| {
                e.step_time_s.is_finite() && e.step_time_s > 0.0 && s.is_finite() && *s > 0.0
            })
            .map(|(e, speed)| {
                let entry = HistoryEntry {
                    job_id: e.job_id.clone(),
                    model: e.model.clone(),
                    gpu_type: e.gpu_type.clone(),
                    num_gpus: e.num_gpus,
                    step_time_s: e.step_time_s,
                    speed,
                    nodes: e.nodes,
                    prior_s: None,
                };
                (entry, e)
            })
    }

    /// [`Self::fit`], then each entry's prior from `prior(example, history)`: the prior
    /// a *new* job of its kind would get on its placement (asked under a job id no entry
    /// has, so the history's recall leaves nothing out), on the history without priors
    /// (so without offsets). A prior that is not a finite positive number is left out.
    ///
    /// Why a new job's prior: the offset is meant to carry the prior's form error (what
    /// the placement does to a kind that the physics misses), which a new job meets. An
    /// entry's own leave-its-job-out prior would add the history's recall error
    /// instead: on a kind with a single job, its recall falls back to a coarser level or
    /// to the FLOP count, and that miss would then be served to every later job.
    pub fn fit_with_priors(
        train: &[StepExample],
        speed: impl Fn(&StepExample) -> f64,
        prior: impl Fn(&StepExample, &StepHistory) -> f64,
    ) -> Self {
        let plain = Self::fit(train, &speed);
        let ids: std::collections::BTreeSet<&str> =
            train.iter().map(|e| e.job_id.as_str()).collect();
        let unused = (0u64..)
            .map(|i| format!("(new job {i})"))
            .find(|id| !ids.contains(id.as_str()))
            .expect("a job id no example has");
        let entries = Self::entries(train, &speed)
            .map(|(h, e)| {
                let as_new = StepExample {
                    job_id: unused.clone(),
                    ..e.clone()
                };
                let p = prior(&as_new, &plain);
                HistoryEntry {
                    prior_s: Some(p).filter(|p| p.is_finite() && *p > 0.0),
                    ..h
                }
            })
            .collect();
        Self::from_entries(entries)
    }

    /// `ln` of the factor the prior of `e` is multiplied by: the mean of
    /// `ln(step / prior)` over the other jobs of `e`'s kind and GPU type on `e`'s
    /// [`Locality`], over their count plus one; 0 without any.
    pub fn prior_offset(&self, e: &StepExample) -> f64 {
        let key = (
            e.model.clone(),
            e.gpu_type.clone(),
            Locality::of(e.nodes, e.num_gpus),
        );
        let Some(ids) = self.by_locality.get(&key) else {
            return 0.0;
        };
        let (sum, n) = ids
            .iter()
            .map(|&i| &self.entries[i])
            .filter(|h| h.job_id != e.job_id)
            .filter_map(|h| Some((h.step_time_s / h.prior_s?).ln()))
            .fold((0.0, 0usize), |(s, n), r| (s + r, n + 1));
        sum / (n + 1) as f64
    }

    fn from_entries(entries: Vec<HistoryEntry>) -> Self {
        let mut h = StepHistory::default();
        for (i, e) in entries.iter().enumerate() {
            h.by_count
                .entry((e.model.clone(), e.gpu_type.clone(), e.num_gpus))
                .or_default()
                .push(i);
            h.by_type
                .entry((e.model.clone(), e.gpu_type.clone()))
                .or_default()
                .push(i);
            h.by_model.entry(e.model.clone()).or_default().push(i);
            if e.nodes > 0 && e.prior_s.is_some() {
                h.by_locality
                    .entry((
                        e.model.clone(),
                        e.gpu_type.clone(),
                        Locality::of(e.nodes, e.num_gpus),
                    ))
                    .or_default()
                    .push(i);
            }
        }
        h.entries = entries;
        h
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The most specific history of `e`'s kind, leaving out `e`'s own job.
    pub fn recall(&self, e: &StepExample) -> Option<Recalled> {
        let others = |ids: Option<&Vec<usize>>| {
            let times: Vec<f64> = ids?
                .iter()
                .map(|&i| &self.entries[i])
                .filter(|h| h.job_id != e.job_id)
                .map(|h| h.step_time_s * h.speed)
                .collect();
            median(times)
        };
        let levels = [
            (
                3,
                others(
                    self.by_count
                        .get(&(e.model.clone(), e.gpu_type.clone(), e.num_gpus)),
                ),
            ),
            (
                2,
                others(self.by_type.get(&(e.model.clone(), e.gpu_type.clone()))),
            ),
            (1, others(self.by_model.get(&e.model))),
        ];
        levels.into_iter().find_map(|(level, t)| {
            t.map(|packed_step_s| Recalled {
                packed_step_s,
                level,
            })
        })
    }

    /// Writes the history as JSON (an artifact keeps it beside the weights, since the
    /// network's inputs depend on it).
    pub fn save(&self, path: &Path) -> Result<(), TrainerError> {
        std::fs::write(path, self.to_json()?)
            .map_err(|e| TrainerError::Invalid(format!("writing {}: {e}", path.display())))
    }

    /// What [`StepHistory::save`] writes (an artifact keeps it as an attachment,
    /// checksummed with the weights).
    pub fn to_json(&self) -> Result<String, TrainerError> {
        serde_json::to_string(&self.entries)
            .map_err(|e| TrainerError::Invalid(format!("serialising history: {e}")))
    }

    /// Reads a history written by [`StepHistory::save`]; a damaged file is an error that
    /// names it.
    pub fn load(path: &Path) -> Result<Self, TrainerError> {
        let bytes = marshal_model::artifact::read_regular_file(path)
            .map_err(|e| TrainerError::Invalid(format!("reading {}: {e}", path.display())))?;
        let entries: Vec<HistoryEntry> = serde_json::from_slice(&bytes).map_err(|e| {
            TrainerError::Invalid(format!("{}: not a step history: {e}", path.display()))
        })?;
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if let Some(bad) = entries.iter().find(|e| {
            !(positive(e.step_time_s) && positive(e.speed) && e.prior_s.is_none_or(positive))
        }) {
            return Err(TrainerError::Invalid(format!(
                "{}: job {} has step time {}, speed {} and prior {:?}, not positive numbers",
                path.display(),
                bad.job_id,
                bad.step_time_s,
                bad.speed,
                bad.prior_s
            )));
        }
        Ok(Self::from_entries(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example(job: &str, model: &str, gpus: u32, t: f64) -> StepExample {
        crate::baselines::tests::ex(job, model, gpus, 1, "node", t)
    }

    #[test]
    fn recalls_the_most_specific_history_of_other_jobs() {
        let train = [
            example("a", "bert", 4, 1.0),
            example("b", "bert", 4, 3.0),
            example("c", "bert", 8, 10.0),
        ];
        let h = StepHistory::fit(&train, |_| 1.0);
        // A new 4-GPU bert job: median of a and b at level 3.
        let r = h.recall(&example("new", "bert", 4, 0.0)).unwrap();
        assert_eq!((r.packed_step_s, r.level), (2.0, 3));
        // Job a itself sees only b at its own count.
        let r = h.recall(&train[0]).unwrap();
        assert_eq!((r.packed_step_s, r.level), (3.0, 3));
        // Job c alone at 8 GPUs: falls back to the kind on V100 without itself.
        let r = h.recall(&train[2]).unwrap();
        assert_eq!((r.packed_step_s, r.level), (2.0, 2));
        assert_eq!(h.recall(&example("x", "gpt", 1, 0.0)), None);
    }

    #[test]
    fn recalls_step_times_normalised_by_their_placement_speed() {
        // b ran at half speed (spread): its packed time is 3.0 × 0.5 = 1.5.
        let train = [example("a", "bert", 4, 1.0), example("b", "bert", 4, 3.0)];
        let h = StepHistory::fit(&train, |e| if e.job_id == "b" { 0.5 } else { 1.0 });
        let r = h.recall(&example("new", "bert", 4, 0.0)).unwrap();
        assert_eq!(r.packed_step_s, 1.25);
        // A non-finite speed drops the example instead of poisoning the median.
        let h = StepHistory::fit(&train, |e| if e.job_id == "b" { f64::NAN } else { 1.0 });
        assert_eq!(h.len(), 1);
    }

    fn spread(job: &str, model: &str, t: f64) -> StepExample {
        crate::baselines::tests::ex(job, model, 8, 2, "rack", t)
    }

    #[test]
    fn the_prior_offset_is_the_shrunk_mean_log_miss_of_other_jobs_on_the_same_locality() {
        let train = [
            spread("a", "bert", 2.0),
            spread("b", "bert", 4.0),
            spread("c", "bert", 8.0),
            // Another locality, kind and GPU type: none of them counts for a spread bert
            // (8 GPUs on 2 machines).
            example("d", "bert", 4, 100.0),
            spread("e", "gpt", 100.0),
            StepExample {
                gpu_type: "T4".into(),
                ..spread("f", "bert", 100.0)
            },
        ];
        // A prior of 1 s everywhere: the misses are ln 2, ln 4, ln 8.
        let h = StepHistory::fit_with_priors(&train, |_| 1.0, |_, _| 1.0);
        let ln2 = 2f64.ln();
        let new = spread("new", "bert", 0.0);
        assert!((h.prior_offset(&new) - 6.0 * ln2 / 4.0).abs() < 1e-12);
        // Job a sees b and c only.
        assert!((h.prior_offset(&train[0]) - 5.0 * ln2 / 3.0).abs() < 1e-12);
        // One other job on its locality: half its miss.
        assert!(
            (h.prior_offset(&example("new", "bert", 4, 0.0)) - 100f64.ln() / 2.0).abs() < 1e-12
        );
        // One GPU on each of two machines is a locality of its own: none measured.
        let pair = crate::baselines::tests::ex("new", "bert", 2, 2, "rack", 0.0);
        assert_eq!(h.prior_offset(&pair), 0.0);
        assert_eq!(h.prior_offset(&spread("new", "ncf", 0.0)), 0.0);
        // Without priors (a plain fit) there is no offset.
        assert_eq!(StepHistory::fit(&train, |_| 1.0).prior_offset(&new), 0.0);
    }

    #[test]
    fn localities_separate_one_machine_one_gpu_per_machine_and_several() {
        assert_eq!(Locality::of(1, 8), Locality::OneMachine);
        assert_eq!(Locality::of(0, 1), Locality::OneMachine);
        assert_eq!(Locality::of(2, 2), Locality::OneGpuPerMachine);
        assert_eq!(Locality::of(4, 4), Locality::OneGpuPerMachine);
        assert_eq!(Locality::of(2, 3), Locality::SeveralGpusPerMachine);
        assert_eq!(Locality::of(2, 16), Locality::SeveralGpusPerMachine);
    }

    #[test]
    fn entries_priors_are_a_new_jobs_on_the_history_without_offsets() {
        // Jobs a and a-again are one job on two placements; b another.
        let train = [
            spread("a", "bert", 2.0),
            crate::baselines::tests::ex("a", "bert", 4, 2, "rack", 3.0),
            spread("b", "bert", 4.0),
        ];
        let h = StepHistory::fit_with_priors(
            &train,
            |_| 1.0,
            |e, h| {
                assert_eq!(h.prior_offset(e), 0.0);
                // Asked as a new job: the recall leaves no entry out.
                assert!(!["a", "b"].contains(&e.job_id.as_str()));
                // Each entry is asked on its own placement.
                match (e.num_gpus, e.step_time_s) {
                    (8, 2.0) => 1.0,
                    (4, 3.0) => 1.5,
                    _ => f64::NAN,
                }
            },
        );
        // b's prior is not a number: a's two entries count, ln 2 each.
        let new = spread("new", "bert", 0.0);
        assert!((h.prior_offset(&new) - 2.0 * 2f64.ln() / 3.0).abs() < 1e-12);
        // Job a itself sees neither of its entries.
        assert_eq!(h.prior_offset(&train[0]), 0.0);
    }

    #[test]
    fn saves_loads_and_names_a_damaged_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(HISTORY_FILE);
        let h = StepHistory::fit(&[example("a", "bert", 4, 1.5)], |_| 0.8);
        h.save(&path).unwrap();
        assert_eq!(StepHistory::load(&path).unwrap(), h);
        let with_priors = StepHistory::fit_with_priors(
            &[spread("a", "bert", 2.0), spread("b", "bert", 4.0)],
            |_| 0.8,
            |_, _| 1.0,
        );
        with_priors.save(&path).unwrap();
        let loaded = StepHistory::load(&path).unwrap();
        assert_eq!(loaded, with_priors);
        assert!(loaded.prior_offset(&spread("new", "bert", 0.0)) > 0.0);
        // A history written before entries kept their placement and prior loads without
        // offsets.
        let load = |text: &str| {
            std::fs::write(&path, text).unwrap();
            StepHistory::load(&path)
        };
        let old = load(
            r#"[{"job_id":"a","model":"bert","gpu_type":"V100M32","num_gpus":8,"step_time_s":2.0,"speed":1.0}]"#,
        )
        .unwrap();
        assert_eq!(old.len(), 1);
        assert_eq!(old.prior_offset(&spread("new", "bert", 0.0)), 0.0);
        let refusal = |text: &str| load(text).unwrap_err().to_string();
        // A prior that is not a positive number is refused, named.
        assert!(refusal(
            r#"[{"job_id":"a","model":"bert","gpu_type":"V100M32","num_gpus":8,"step_time_s":2.0,"speed":1.0,"nodes":2,"prior_s":-1.0}]"#,
        )
        .contains("prior"));
        // A history written before entries kept their speed is refused.
        assert!(refusal(
            r#"[{"job_id":"a","model":"bert","gpu_type":"V100","num_gpus":4,"step_time_s":1.5}]"#,
        )
        .contains("speed"));
        assert!(load(
            r#"[{"job_id":"a","model":"bert","gpu_type":"V100","num_gpus":4,"step_time_s":1.5,"speed":0.0}]"#,
        )
        .is_err());
        let err = refusal("[{\"job_id\":");
        assert!(err.contains(HISTORY_FILE), "{err}");
        // A field this build does not know could change what the entry means: refused,
        // naming the file and the field.
        let err = refusal(
            r#"[{"job_id":"a","model":"bert","gpu_type":"V100","num_gpus":4,"step_time_s":1.5,"speed":1.0,"speed_is_inverse":true}]"#,
        );
        assert!(
            err.contains(HISTORY_FILE) && err.contains("unknown field `speed_is_inverse`"),
            "{err}"
        );
    }
}
