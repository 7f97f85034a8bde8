//! GPU models, the catalog that names them, and MIG profiles.
//!
//! Throughput is a *class* relative to a V100 (= 1.0). K80 and P100 are calibrated: the
//! geometric mean, over Gavel's 26 job types, of their measured single-GPU throughput
//! relative to a V100 (`marshal-datasets`' calibration test keeps them in step with the data). The
//! other classes are estimates from published training benchmarks; models that appear
//! only in anonymised traces (openb's `G2`, `G3`) get the class of the generation their
//! memory and node shape suggest.

use serde::{Deserialize, Serialize};

use crate::domain::DomainError;

/// Index of a model in a [`GpuCatalog`]. Small so that sets of models fit in a `u64`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GpuModelId(pub u8);

/// A MIG profile, in the units the hardware partitions by: 1/7 of the SMs and 1/8 of memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigProfile {
    pub name: String,
    pub compute_slices: u8,
    pub memory_slices: u8,
}

/// Compute slices of a MIG-capable GPU (A100/H100 partition their SMs in sevenths).
pub const MIG_COMPUTE_SLICES: u8 = 7;
/// Memory slices of a MIG-capable GPU.
pub const MIG_MEMORY_SLICES: u8 = 8;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuModel {
    pub name: String,
    pub memory_gib: f64,
    /// Relative training throughput class, V100 = 1.0.
    pub throughput: f64,
    #[serde(default)]
    pub mig_profiles: Vec<MigProfile>,
}

impl GpuModel {
    pub fn supports_mig(&self) -> bool {
        !self.mig_profiles.is_empty()
    }

    /// The MIG instance `profile` names on this model, as NVML names MIG devices: a
    /// GPU-instance profile of the catalog (`3g.40gb`), or a compute instance inside one
    /// (`1c.3g.40gb`: one compute slice, with all of the 3g.40gb's memory and the 3g's
    /// share of the GPU). `None` for a name this model has no profile for.
    pub fn mig_instance(&self, profile: &str) -> Option<MigInstanceShape> {
        let find = |name: &str| {
            self.mig_profiles
                .iter()
                .find(|p| p.name.eq_ignore_ascii_case(name))
        };
        let (compute, gpu_instance) = match profile.split_once('.') {
            Some((c, rest)) if c.ends_with(['c', 'C']) => {
                let gi = find(rest)?;
                let c: u8 = c[..c.len() - 1].parse().ok()?;
                (c, gi)
            }
            _ => {
                let gi = find(profile)?;
                (gi.compute_slices, gi)
            }
        };
        (1..=gpu_instance.compute_slices)
            .contains(&compute)
            .then_some(MigInstanceShape {
                compute,
                memory: gpu_instance.memory_slices,
                gpu_instance_compute: gpu_instance.compute_slices,
            })
    }
}

/// What a MIG instance gives a job, and what it takes of its GPU.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct MigInstanceShape {
    /// Compute slices the job gets (what a MIG demand asks for).
    pub compute: u8,
    /// Memory slices the job gets.
    pub memory: u8,
    /// Compute slices the instance takes of its GPU: those of its GPU instance, more than
    /// `compute` for a compute instance smaller than its GPU instance.
    pub gpu_instance_compute: u8,
}

/// The GPU models a cluster can hold. At most 64 so that [`GpuModelSet`] is one word.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuCatalog {
    models: Vec<GpuModel>,
}

fn mig(profiles: &[(&str, u8, u8)]) -> Vec<MigProfile> {
    profiles
        .iter()
        .map(|&(name, compute_slices, memory_slices)| MigProfile {
            name: name.to_string(),
            compute_slices,
            memory_slices,
        })
        .collect()
}

fn model(name: &str, memory_gib: f64, throughput: f64, mig_profiles: Vec<MigProfile>) -> GpuModel {
    GpuModel {
        name: name.to_string(),
        memory_gib,
        throughput,
        mig_profiles,
    }
}

impl Default for GpuCatalog {
    /// The models found in the bundled traces plus current data-centre parts.
    fn default() -> Self {
        let a100_40 = mig(&[
            ("1g.5gb", 1, 1),
            ("2g.10gb", 2, 2),
            ("3g.20gb", 3, 4),
            ("4g.20gb", 4, 4),
            ("7g.40gb", 7, 8),
        ]);
        let gb80 = mig(&[
            ("1g.10gb", 1, 1),
            ("1g.20gb", 1, 2),
            ("2g.20gb", 2, 2),
            ("3g.40gb", 3, 4),
            ("4g.40gb", 4, 4),
            ("7g.80gb", 7, 8),
        ]);
        let models = vec![
            model("K80", 12.0, 0.297, vec![]),
            model("P100", 16.0, 0.943, vec![]),
            model("P40", 24.0, 0.5, vec![]),
            model("T4", 16.0, 0.45, vec![]),
            model("V100M16", 16.0, 1.0, vec![]),
            model("V100M32", 32.0, 1.0, vec![]),
            model("A10", 24.0, 0.8, vec![]),
            // Sia's `rtx` testbed: about 0.7 of a V100 in mixed-precision training.
            model("RTX2080Ti", 11.0, 0.7, vec![]),
            // Sia's `quad` testbed (Quadro RTX 6000): about 0.85 of a V100.
            model("RTX6000", 24.0, 0.85, vec![]),
            // openb's anonymised 8-GPU models; their node shapes match A100/V100-class
            // servers, so they get the V100-to-A100 range.
            model("G2", 32.0, 1.0, vec![]),
            model("G3", 80.0, 2.0, vec![]),
            model("L4", 24.0, 0.6, vec![]),
            model("A100-40", 40.0, 2.0, a100_40),
            model("A100-80", 80.0, 2.2, gb80.clone()),
            model("H100", 80.0, 3.5, gb80),
            model("H200", 141.0, 4.0, vec![]),
            // Philly publishes only per-GPU memory; its durations were measured on these
            // GPUs, so both are the reference class.
            model("philly-12g", 12.0, 1.0, vec![]),
            model("philly-24g", 24.0, 1.0, vec![]),
        ];
        GpuCatalog { models }
    }
}

impl GpuCatalog {
    pub fn new(models: Vec<GpuModel>) -> Result<Self, DomainError> {
        let mut catalog = GpuCatalog { models: Vec::new() };
        for m in models {
            catalog.add(m)?;
        }
        Ok(catalog)
    }

    /// Adds a model, or replaces the one of the same name.
    pub fn add(&mut self, model: GpuModel) -> Result<GpuModelId, DomainError> {
        if !(model.throughput.is_finite() && model.throughput > 0.0) {
            return Err(DomainError::Invalid(format!(
                "GPU model {}: throughput must be a positive number, got {}",
                model.name, model.throughput
            )));
        }
        if !(model.memory_gib.is_finite() && model.memory_gib > 0.0) {
            return Err(DomainError::Invalid(format!(
                "GPU model {}: memory_gib must be a positive number, got {}",
                model.name, model.memory_gib
            )));
        }
        if let Some(id) = self.id(&model.name) {
            self.models[id.0 as usize] = model;
            return Ok(id);
        }
        if self.models.len() >= 64 {
            return Err(DomainError::Invalid(
                "a catalog holds at most 64 GPU models".into(),
            ));
        }
        self.models.push(model);
        Ok(GpuModelId((self.models.len() - 1) as u8))
    }

    pub fn id(&self, name: &str) -> Option<GpuModelId> {
        self.models
            .iter()
            .position(|m| m.name.eq_ignore_ascii_case(name))
            .map(|i| GpuModelId(i as u8))
    }

    pub fn require(&self, name: &str) -> Result<GpuModelId, DomainError> {
        self.id(name)
            .ok_or_else(|| DomainError::UnknownGpuModel(name.to_string()))
    }

    pub fn get(&self, id: GpuModelId) -> &GpuModel {
        &self.models[id.0 as usize]
    }

    /// [`Self::get`] for an id that may come from elsewhere (a stored record).
    pub fn try_get(&self, id: GpuModelId) -> Option<&GpuModel> {
        self.models.get(id.0 as usize)
    }

    pub fn len(&self) -> usize {
        self.models.len()
    }

    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (GpuModelId, &GpuModel)> {
        self.models
            .iter()
            .enumerate()
            .map(|(i, m)| (GpuModelId(i as u8), m))
    }
}

/// A set of GPU models; the empty set means "any model".
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuModelSet(u64);

impl GpuModelSet {
    pub const ANY: GpuModelSet = GpuModelSet(0);

    pub fn of(ids: impl IntoIterator<Item = GpuModelId>) -> Self {
        GpuModelSet(ids.into_iter().fold(0, |bits, id| bits | (1u64 << id.0)))
    }

    pub fn is_any(self) -> bool {
        self.0 == 0
    }

    pub fn allows(self, id: GpuModelId) -> bool {
        self.0 == 0 || self.0 & (1u64 << id.0) != 0
    }

    pub fn ids(self) -> impl Iterator<Item = GpuModelId> {
        (0..64u8)
            .filter(move |i| self.0 & (1u64 << i) != 0)
            .map(GpuModelId)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job's GPU-model constraint ([`GpuModelSet`]) is stored as positions in the
    /// catalog: in shadow logs, decision records, and job records of a database. A
    /// model inserted before others moves them, and a stored "H100 only" would then
    /// read as another model. So the built-in catalog only grows at its end.
    #[test]
    fn the_built_in_catalog_only_grows_at_its_end() {
        let names: Vec<String> = GpuCatalog::default()
            .iter()
            .map(|(_, m)| m.name.clone())
            .collect();
        let pinned = [
            "K80",
            "P100",
            "P40",
            "T4",
            "V100M16",
            "V100M32",
            "A10",
            "RTX2080Ti",
            "RTX6000",
            "G2",
            "G3",
            "L4",
            "A100-40",
            "A100-80",
            "H100",
            "H200",
            "philly-12g",
            "philly-24g",
        ];
        assert!(names.len() >= pinned.len(), "{names:?}");
        assert_eq!(
            names[..pinned.len()],
            pinned,
            "a model was inserted or removed: add new ones at the end"
        );
    }

    #[test]
    fn catalog_lookup_is_case_insensitive_and_rejects_unknown_models() {
        let catalog = GpuCatalog::default();
        assert_eq!(catalog.id("v100m16"), catalog.id("V100M16"));
        assert!(matches!(
            catalog.require("Z9000"),
            Err(DomainError::UnknownGpuModel(name)) if name == "Z9000"
        ));
    }

    #[test]
    fn adding_a_model_with_an_existing_name_replaces_it() {
        let mut catalog = GpuCatalog::default();
        let before = catalog.len();
        let id = catalog.add(model("T4", 16.0, 0.9, vec![])).unwrap();
        assert_eq!(catalog.len(), before);
        assert_eq!(catalog.get(id).throughput, 0.9);
        assert!(catalog.add(model("bad", 1.0, f64::NAN, vec![])).is_err());
    }

    #[test]
    fn empty_model_set_allows_everything_and_explicit_sets_filter() {
        let t4 = GpuModelId(3);
        let v100 = GpuModelId(4);
        assert!(GpuModelSet::ANY.allows(t4));
        let only_v100 = GpuModelSet::of([v100]);
        assert!(only_v100.allows(v100));
        assert!(!only_v100.allows(t4));
        assert_eq!(only_v100.ids().collect::<Vec<_>>(), vec![v100]);
    }

    #[test]
    fn mig_capable_models_carry_profiles_that_fit_the_hardware() {
        let catalog = GpuCatalog::default();
        for (_, m) in catalog.iter().filter(|(_, m)| m.supports_mig()) {
            for p in &m.mig_profiles {
                assert!(p.compute_slices <= MIG_COMPUTE_SLICES);
                assert!(p.memory_slices <= MIG_MEMORY_SLICES);
            }
        }
        assert!(catalog.get(catalog.id("H100").unwrap()).supports_mig());
    }

    #[test]
    fn mig_instances_are_named_by_profile_or_by_compute_instance_within_one() {
        let catalog = GpuCatalog::default();
        let a100 = catalog.get(catalog.id("A100-80").unwrap());
        let shape = |compute, memory, gpu_instance_compute| MigInstanceShape {
            compute,
            memory,
            gpu_instance_compute,
        };
        assert_eq!(a100.mig_instance("3g.40gb"), Some(shape(3, 4, 3)));
        assert_eq!(a100.mig_instance("1c.2g.20gb"), Some(shape(1, 2, 2)));
        assert_eq!(a100.mig_instance("2c.3g.40gb"), Some(shape(2, 4, 3)));
        for unknown in [
            "3g.20gb",
            "4c.3g.40gb",
            "0c.3g.40gb",
            "xc.3g.40gb",
            "",
            "c.1g.10gb",
        ] {
            assert_eq!(a100.mig_instance(unknown), None, "{unknown}");
        }
        let t4 = catalog.get(catalog.id("T4").unwrap());
        assert_eq!(t4.mig_instance("1g.10gb"), None);
    }

    #[test]
    fn a_model_without_positive_memory_or_throughput_is_refused_by_name() {
        let mut catalog = GpuCatalog::default();
        for (memory_gib, throughput, says) in [
            (f64::NAN, 1.0, "memory_gib"),
            (-1.0, 1.0, "memory_gib"),
            (0.0, 1.0, "memory_gib"),
            (80.0, 0.0, "throughput"),
        ] {
            let err = catalog
                .add(model("X9", memory_gib, throughput, Vec::new()))
                .unwrap_err()
                .to_string();
            assert!(err.contains("X9") && err.contains(says), "{err}");
        }
        assert!(catalog.id("X9").is_none(), "nothing refused was added");
    }
}
