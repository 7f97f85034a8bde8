//! Workload kinds: what a job *is* (a model, a communication pattern, a memory profile)
//! and what that means for its speed on each GPU model, on a spread placement and beside
//! another tenant.
//!
//! Traces say "N GPUs for D seconds"; a [`WorkloadKind`] fills in the rest from measured
//! profiles (the `marshal-datasets` crate builds them from Gavel's and Pollux's tables and
//! assigns one to each job). Kinds live in a [`WorkloadCatalog`] that travels with the
//! simulator's speed model; a job refers to its kind by [`WorkloadId`]. The scheduler
//! holds only the numbers, never the tables they came from, so it does not depend on
//! the datasets crate.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::domain::{CommPattern, DomainError};

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WorkloadId(pub u16);

/// The phases of a training job's memory use, in the order they occur.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemPhaseKind {
    /// Loading data and weights, building the graph: memory ramps up.
    Warmup,
    /// Training steps.
    Steady,
    /// Evaluation passes (activations without gradients).
    Eval,
    /// Writing a checkpoint (host staging buffers on top of the steady state).
    Checkpoint,
}

#[derive(Copy, Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemPhase {
    pub kind: MemPhaseKind,
    /// Share of the job's running time spent in this phase.
    pub time_share: f64,
    /// Peak GPU memory per worker in this phase, GiB.
    pub peak_gib: f64,
}

/// One kind of job, with everything the speed model needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkloadKind {
    /// Unique, e.g. `ResNet-50 (batch size 64)` or `pollux/cifar10`.
    pub name: String,
    /// The model architecture, e.g. `ResNet-50`.
    pub family: String,
    pub comm: CommPattern,
    /// Throughput on one GPU of a model (by catalog name) relative to the reference
    /// class (a V100 = 1.0). Models not listed fall back to the catalog's class.
    pub relative_throughput: BTreeMap<String, f64>,
    /// Share of a step spent communicating over a link of the speed model's reference
    /// bandwidth; the same meaning as the speed model's per-pattern defaults. Used when
    /// the job's per-GPU batch is unknown or no curve was measured.
    pub comm_share: f64,
    /// The share by per-GPU batch size, ascending: larger batches compute longer per
    /// step and hide more of the all-reduce, so the share falls with the batch.
    #[serde(default)]
    pub comm_share_by_local_batch: Vec<(f64, f64)>,
    /// Speed while sharing a GPU with one other tenant, relative to running alone.
    pub colocation_speed: f64,
    /// Seconds per training step on one reference-class GPU, alone, where measured:
    /// the step time on a placement is this over the speed model's speed there.
    #[serde(default)]
    pub reference_step_time_s: Option<f64>,
    /// Memory phases; empty when nothing was measured for this kind.
    pub memory: Vec<MemPhase>,
    /// Where the numbers came from (tables and fits), for people reading results.
    pub source: String,
}

impl WorkloadKind {
    pub fn validate(&self) -> Result<(), DomainError> {
        let bad = |what: String| {
            Err(DomainError::Invalid(format!(
                "workload {}: {what}",
                self.name
            )))
        };
        for (gpu, &t) in &self.relative_throughput {
            if !(t.is_finite() && t > 0.0) {
                return bad(format!("throughput {t} on {gpu} is not positive"));
            }
        }
        if !(self.comm_share.is_finite() && (0.0..1.0).contains(&self.comm_share)) {
            return bad(format!(
                "communication share {} is outside [0, 1)",
                self.comm_share
            ));
        }
        if !(self.colocation_speed.is_finite()
            && self.colocation_speed > 0.0
            && self.colocation_speed <= 1.0)
        {
            return bad(format!(
                "co-location speed {} is outside (0, 1]",
                self.colocation_speed
            ));
        }
        let curve = &self.comm_share_by_local_batch;
        let curve_ok = curve
            .iter()
            .all(|&(b, c)| b.is_finite() && b > 0.0 && c.is_finite() && (0.0..1.0).contains(&c))
            && curve.windows(2).all(|w| w[0].0 < w[1].0);
        if !curve_ok {
            return bad(
                "the communication curve needs ascending positive batches and shares in [0, 1)"
                    .into(),
            );
        }
        if let Some(t) = self.reference_step_time_s
            && !(t.is_finite() && t > 0.0)
        {
            return bad(format!("reference step time {t} is not positive"));
        }
        let shares: f64 = self.memory.iter().map(|p| p.time_share).sum();
        let phases_ok = self.memory.iter().all(|p| {
            p.time_share.is_finite()
                && p.time_share >= 0.0
                && p.peak_gib.is_finite()
                && p.peak_gib >= 0.0
        });
        if !phases_ok || (!self.memory.is_empty() && (shares - 1.0).abs() > 1e-6) {
            return bad(
                "memory phases need finite non-negative values whose time shares sum to 1".into(),
            );
        }
        Ok(())
    }

    /// The communication share at `local_batch` samples per GPU: interpolated linearly
    /// in log batch size along the measured curve, flat beyond its ends.
    pub fn comm_share_at(&self, local_batch: Option<f64>) -> f64 {
        let curve = &self.comm_share_by_local_batch;
        let (Some(b), Some(first), Some(last)) = (local_batch, curve.first(), curve.last()) else {
            return self.comm_share;
        };
        if !(b.is_finite() && b > 0.0) {
            return self.comm_share;
        }
        if b <= first.0 {
            return first.1;
        }
        if b >= last.0 {
            return last.1;
        }
        for w in curve.windows(2) {
            if b <= w[1].0 {
                let t = (b.ln() - w[0].0.ln()) / (w[1].0.ln() - w[0].0.ln());
                return w[0].1 + t * (w[1].1 - w[0].1);
            }
        }
        last.1
    }

    /// The largest per-worker peak over the phases, GiB.
    pub fn peak_memory_gib(&self) -> Option<f64> {
        self.memory.iter().map(|p| p.peak_gib).reduce(f64::max)
    }
}

/// The kinds a simulation knows, indexed by [`WorkloadId`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkloadCatalog {
    kinds: Vec<WorkloadKind>,
}

impl WorkloadCatalog {
    pub fn new(kinds: Vec<WorkloadKind>) -> Result<Self, DomainError> {
        if kinds.len() > u16::MAX as usize {
            return Err(DomainError::Invalid(format!(
                "{} workload kinds is too many",
                kinds.len()
            )));
        }
        let mut names = std::collections::BTreeSet::new();
        for kind in &kinds {
            kind.validate()?;
            if !names.insert(kind.name.as_str()) {
                return Err(DomainError::Invalid(format!(
                    "workload {} is listed twice",
                    kind.name
                )));
            }
        }
        Ok(WorkloadCatalog { kinds })
    }

    pub fn get(&self, id: WorkloadId) -> Option<&WorkloadKind> {
        self.kinds.get(id.0 as usize)
    }

    pub fn id(&self, name: &str) -> Option<WorkloadId> {
        self.kinds
            .iter()
            .position(|k| k.name == name)
            .map(|i| WorkloadId(i as u16))
    }

    pub fn iter(&self) -> impl Iterator<Item = (WorkloadId, &WorkloadKind)> {
        self.kinds
            .iter()
            .enumerate()
            .map(|(i, k)| (WorkloadId(i as u16), k))
    }

    pub fn len(&self) -> usize {
        self.kinds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn kind(name: &str) -> WorkloadKind {
        WorkloadKind {
            name: name.into(),
            family: "ResNet-50".into(),
            comm: CommPattern::DataParallel,
            relative_throughput: BTreeMap::from([("K80".into(), 0.25)]),
            comm_share: 0.3,
            comm_share_by_local_batch: vec![(16.0, 0.6), (64.0, 0.2)],
            colocation_speed: 0.7,
            reference_step_time_s: Some(0.2),
            memory: vec![
                MemPhase {
                    kind: MemPhaseKind::Warmup,
                    time_share: 0.1,
                    peak_gib: 4.0,
                },
                MemPhase {
                    kind: MemPhaseKind::Steady,
                    time_share: 0.9,
                    peak_gib: 9.5,
                },
            ],
            source: "test".into(),
        }
    }

    #[test]
    fn catalog_refuses_bad_and_repeated_kinds() {
        assert!(WorkloadCatalog::new(vec![kind("a"), kind("b")]).is_ok());
        assert!(WorkloadCatalog::new(vec![kind("a"), kind("a")]).is_err());
        let mut bad = kind("c");
        bad.comm_share = 1.0;
        assert!(
            WorkloadCatalog::new(vec![bad])
                .unwrap_err()
                .to_string()
                .contains("communication share")
        );
        let mut bad = kind("d");
        bad.memory[0].time_share = 0.5;
        assert!(WorkloadCatalog::new(vec![bad]).is_err());
        let mut bad = kind("e");
        bad.relative_throughput.insert("P100".into(), f64::NAN);
        assert!(WorkloadCatalog::new(vec![bad]).is_err());
    }

    #[test]
    fn the_share_follows_the_curve_in_log_batch() {
        let k = kind("a");
        assert_eq!(k.comm_share_at(None), 0.3);
        assert_eq!(k.comm_share_at(Some(8.0)), 0.6);
        assert_eq!(k.comm_share_at(Some(128.0)), 0.2);
        assert!((k.comm_share_at(Some(32.0)) - 0.4).abs() < 1e-12);
        assert_eq!(k.comm_share_at(Some(f64::NAN)), 0.3);
        let mut bad = kind("b");
        bad.comm_share_by_local_batch = vec![(64.0, 0.2), (16.0, 0.6)];
        assert!(bad.validate().is_err());
    }

    #[test]
    fn kinds_are_found_by_name_and_id() {
        let catalog = WorkloadCatalog::new(vec![kind("a"), kind("b")]).unwrap();
        let id = catalog.id("b").unwrap();
        assert_eq!(id, WorkloadId(1));
        assert_eq!(catalog.get(id).unwrap().name, "b");
        assert_eq!(catalog.get(WorkloadId(7)), None);
        assert_eq!(catalog.get(id).unwrap().peak_memory_gib(), Some(9.5));
    }
}
