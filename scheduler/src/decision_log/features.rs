//! The featurised decision a log row carries, so the trainer can retrain from the log.
//!
//! The learned policy's featuriser (`policies::learned::features`) runs for every decision
//! of `policy = "learned"`, with or without a usable model; its output is logged as it was
//! scored, not re-derived later from a cluster state the log does not hold. Four nullable
//! columns (null for heuristic policies and in files written before they existed):
//!
//! | column | type | meaning |
//! |---|---|---|
//! | `features_version` | u32 | the policy feature layout (`POLICY_SCHEMA_VERSION`) |
//! | `job_features` | list<f32> | the job and cluster-context slots |
//! | `candidate_features` | list<f32> | each candidate's slots, candidate after candidate |
//! | `taken_candidate` | u32 | index of the candidate that was executed |

use std::sync::Arc;

use arrow_array::builder::{Float32Builder, ListBuilder, UInt32Builder};
use arrow_array::{Array, ArrayRef, Float32Array, ListArray, RecordBatch, UInt32Array};
use arrow_schema::{DataType, Field};
use marshal_model::policy::{
    CANDIDATE_FEATURES, DecisionFeatures, JOB_FEATURES, MAX_CANDIDATES, POLICY_SCHEMA_VERSION,
};

/// A featurised decision as logged.
#[derive(Clone, Debug, PartialEq)]
pub struct LoggedFeatures {
    /// Feature layout version the slots follow.
    pub version: u32,
    pub job: Vec<f32>,
    /// `CANDIDATE_FEATURES` values per candidate, candidate after candidate.
    pub candidates: Vec<f32>,
    /// The candidate executed (the network's or the fallback's choice).
    pub taken: u32,
}

impl LoggedFeatures {
    /// The log form of a decision of this build's layout.
    pub fn of(d: &DecisionFeatures, taken: usize) -> LoggedFeatures {
        LoggedFeatures {
            version: POLICY_SCHEMA_VERSION,
            job: d.job.to_vec(),
            candidates: d.candidates.iter().flatten().copied().collect(),
            taken: taken as u32,
        }
    }

    /// The decision back in the model's form, or why it cannot be used by this build
    /// (another layout version, wrong lengths, a taken index out of range).
    pub fn decision(&self) -> Result<(DecisionFeatures, usize), String> {
        if self.version != POLICY_SCHEMA_VERSION {
            return Err(format!(
                "feature layout {} (this build reads {POLICY_SCHEMA_VERSION})",
                self.version
            ));
        }
        let job: [f32; JOB_FEATURES] = self
            .job
            .as_slice()
            .try_into()
            .map_err(|_| format!("{} job features, expected {JOB_FEATURES}", self.job.len()))?;
        if self.candidates.is_empty() || !self.candidates.len().is_multiple_of(CANDIDATE_FEATURES) {
            return Err(format!(
                "{} candidate values, not a positive multiple of {CANDIDATE_FEATURES}",
                self.candidates.len()
            ));
        }
        let candidates: Vec<[f32; CANDIDATE_FEATURES]> = self
            .candidates
            .chunks_exact(CANDIDATE_FEATURES)
            .map(|c| c.try_into().expect("chunks_exact yields full chunks"))
            .collect();
        if candidates.len() > MAX_CANDIDATES {
            return Err(format!("{} candidates", candidates.len()));
        }
        let taken = self.taken as usize;
        if taken >= candidates.len() {
            return Err(format!("taken candidate {taken} of {}", candidates.len()));
        }
        // A serving build logs only finite features; one NaN from a damaged or foreign
        // file would make a retraining loss NaN, blamed on the learning rate.
        if let Some(i) = job.iter().position(|v| !v.is_finite()) {
            return Err(format!("job feature {i} is {}", job[i]));
        }
        if let Some(i) = self.candidates.iter().position(|v| !v.is_finite()) {
            return Err(format!(
                "candidate {} feature {} is {}",
                i / CANDIDATE_FEATURES,
                i % CANDIDATE_FEATURES,
                self.candidates[i]
            ));
        }
        Ok((DecisionFeatures { job, candidates }, taken))
    }
}

fn list_type() -> DataType {
    DataType::List(Arc::new(Field::new_list_field(DataType::Float32, true)))
}

/// The four schema fields, in column order.
pub(super) fn fields() -> Vec<Field> {
    vec![
        Field::new("features_version", DataType::UInt32, true),
        Field::new("job_features", list_type(), true),
        Field::new("candidate_features", list_type(), true),
        Field::new("taken_candidate", DataType::UInt32, true),
    ]
}

/// The four columns for `rows`.
pub(super) fn columns<'a>(rows: impl Iterator<Item = Option<&'a LoggedFeatures>>) -> Vec<ArrayRef> {
    let mut version = UInt32Builder::new();
    let mut job = ListBuilder::new(Float32Builder::new());
    let mut cands = ListBuilder::new(Float32Builder::new());
    let mut taken = UInt32Builder::new();
    for f in rows {
        match f {
            Some(f) => {
                version.append_value(f.version);
                job.values().append_slice(&f.job);
                job.append(true);
                cands.values().append_slice(&f.candidates);
                cands.append(true);
                taken.append_value(f.taken);
            }
            None => {
                version.append_null();
                job.append_null();
                cands.append_null();
                taken.append_null();
            }
        }
    }
    vec![
        Arc::new(version.finish()),
        Arc::new(job.finish()),
        Arc::new(cands.finish()),
        Arc::new(taken.finish()),
    ]
}

/// Reads the feature columns of a batch; `None` per row when the file predates them.
pub(super) struct FeatureColumns<'a> {
    cols: Option<(
        &'a UInt32Array,
        &'a ListArray,
        &'a ListArray,
        &'a UInt32Array,
    )>,
}

impl<'a> FeatureColumns<'a> {
    pub(super) fn of(b: &'a RecordBatch) -> Result<FeatureColumns<'a>, String> {
        if b.column_by_name("features_version").is_none() {
            return Ok(FeatureColumns { cols: None });
        }
        Ok(FeatureColumns {
            cols: Some((
                super::column(b, "features_version")?,
                super::column(b, "job_features")?,
                super::column(b, "candidate_features")?,
                super::column(b, "taken_candidate")?,
            )),
        })
    }

    pub(super) fn row(&self, i: usize) -> Result<Option<LoggedFeatures>, String> {
        let Some((version, job, cands, taken)) = self.cols else {
            return Ok(None);
        };
        // The writer sets all four or none; a mix is another writer's file, or damage,
        // and reading it as "no features" would hide that.
        let nulls = [
            version.is_null(i),
            job.is_null(i),
            cands.is_null(i),
            taken.is_null(i),
        ];
        if nulls.iter().all(|&n| n) {
            return Ok(None);
        }
        if nulls.iter().any(|&n| n) {
            return Err(
                "the feature columns are null in some and set in others (the log writes all four or none)"
                    .into(),
            );
        }
        let floats = |l: &ListArray, name: &str| -> Result<Vec<f32>, String> {
            let v = l.value(i);
            let f = v
                .as_any()
                .downcast_ref::<Float32Array>()
                .ok_or_else(|| format!("column {name} does not hold f32 lists"))?;
            // `values()` ignores the validity bitmap: a null would read as 0.0, a finite
            // value that the decision's checks accept.
            if f.null_count() > 0 {
                return Err(format!("column {name} holds a null value"));
            }
            Ok(f.values().to_vec())
        };
        Ok(Some(LoggedFeatures {
            version: version.value(i),
            job: floats(job, "job_features")?,
            candidates: floats(cands, "candidate_features")?,
            taken: taken.value(i),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(k: usize) -> DecisionFeatures {
        DecisionFeatures {
            job: [0.25; JOB_FEATURES],
            candidates: (0..k).map(|c| [c as f32; CANDIDATE_FEATURES]).collect(),
        }
    }

    #[test]
    fn a_logged_decision_converts_back_and_bad_ones_say_why() {
        let d = decision(3);
        let logged = LoggedFeatures::of(&d, 2);
        assert_eq!(logged.decision().unwrap(), (d, 2));

        let mut bad = logged.clone();
        bad.version += 1;
        assert!(bad.decision().unwrap_err().contains("layout"));
        let mut bad = logged.clone();
        bad.taken = 3;
        assert!(
            bad.decision()
                .unwrap_err()
                .contains("taken candidate 3 of 3")
        );
        let mut bad = logged.clone();
        bad.candidates.pop();
        assert!(bad.decision().unwrap_err().contains("multiple"));
        let mut bad = logged.clone();
        bad.job.push(1.0);
        assert!(bad.decision().unwrap_err().contains("job features"));
        let mut bad = logged.clone();
        bad.job[1] = f32::NAN;
        assert_eq!(bad.decision().unwrap_err(), "job feature 1 is NaN");
        let mut bad = logged;
        bad.candidates[CANDIDATE_FEATURES + 2] = f32::INFINITY;
        assert_eq!(bad.decision().unwrap_err(), "candidate 1 feature 2 is inf");
    }
}
