//! Train / validation / test splits with no job on two sides.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::StepExample;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Split {
    pub train: Vec<StepExample>,
    pub valid: Vec<StepExample>,
    pub test: Vec<StepExample>,
}

/// A stable 64-bit hash of a job id (FNV-1a), so the split does not depend on the order
/// examples arrive in.
fn job_hash(id: &str) -> u64 {
    id.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Each job's examples go to one side, drawn with probabilities `valid` and `test`
/// (the rest train) from a stream seeded by `seed` and the job's hash.
pub fn split_by_job(examples: &[StepExample], seed: u64, valid: f64, test: f64) -> Split {
    let mut split = Split::default();
    for e in examples {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ job_hash(&e.job_id));
        let u: f64 = rng.random();
        let side = if u < test {
            &mut split.test
        } else if u < test + valid {
            &mut split.valid
        } else {
            &mut split.train
        };
        side.push(e.clone());
    }
    split
}

/// Placements unseen in training: every example whose (span, GPU count) shape is in
/// `held_out` is tested on; its job's other examples are dropped from training, so no
/// job leaks; the rest split by job as [`split_by_job`] for validation.
pub fn split_unseen_placements(
    examples: &[StepExample],
    held_out: &[(&str, u32)],
    seed: u64,
    valid: f64,
) -> Split {
    split_holding_out(
        examples,
        &|e| {
            held_out
                .iter()
                .any(|&(span, n)| e.span == span && e.num_gpus == n)
        },
        seed,
        valid,
    )
}

/// Tests on every example `is_held` picks; its jobs' other examples are dropped from
/// training, so no job leaks; the rest split by job as [`split_by_job`] for validation.
pub fn split_holding_out(
    examples: &[StepExample],
    is_held: &dyn Fn(&StepExample) -> bool,
    seed: u64,
    valid: f64,
) -> Split {
    let test_jobs: std::collections::BTreeSet<&str> = examples
        .iter()
        .filter(|e| is_held(e))
        .map(|e| e.job_id.as_str())
        .collect();
    let rest: Vec<StepExample> = examples
        .iter()
        .filter(|e| !test_jobs.contains(e.job_id.as_str()))
        .cloned()
        .collect();
    let mut split = split_by_job(&rest, seed, valid, 0.0);
    split.test = examples.iter().filter(|e| is_held(e)).cloned().collect();
    split
}
