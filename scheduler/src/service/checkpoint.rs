//! Checkpoint reports from agents: when a running job last wrote a checkpoint, so that
//! a move (consolidation, rebalancing) counts the work it would throw away.

use crate::domain::ClusterState;
use crate::service::error::ServiceError;
use crate::service::jobs::{JobRecord, JobState};
use crate::sim::SpeedModel;

/// How far an agent's clock may run ahead of the scheduler's: a checkpoint reported
/// this much in the future (or this much before the placement started) is accepted.
pub const CLOCK_SKEW_S: f64 = 60.0;

const FIELD: &str = "last_checkpoint_unix_s";

/// The checkpoint time a report carries, checked: `None` for 0 (unknown). Only RUNNING
/// reports may carry one, and it must lie within the current placement (`placed_at_s`)
/// and now, give or take [`CLOCK_SKEW_S`].
pub fn reported(
    value: f64,
    state: JobState,
    placed_at_s: f64,
    now_s: f64,
) -> Result<Option<f64>, ServiceError> {
    if value == 0.0 {
        return Ok(None);
    }
    if state != JobState::Running {
        return Err(ServiceError::invalid(
            FIELD,
            format!("only RUNNING reports carry one (this one is {state})"),
        ));
    }
    if !value.is_finite() {
        return Err(ServiceError::invalid(
            FIELD,
            format!("{value} is not finite"),
        ));
    }
    if value > now_s + CLOCK_SKEW_S {
        return Err(ServiceError::invalid(
            FIELD,
            format!(
                "{value:.3} is {:.0} s in the future (more than {CLOCK_SKEW_S} s of clock skew)",
                value - now_s
            ),
        ));
    }
    if value < placed_at_s - CLOCK_SKEW_S {
        return Err(ServiceError::invalid(
            FIELD,
            format!("{value:.3} is before the job's placement started ({placed_at_s:.3})"),
        ));
    }
    Ok(Some(value))
}

/// Wall-clock seconds since `r`'s last reported checkpoint at `now_s`; 0 when none
/// was reported.
pub fn since_checkpoint_s(r: &JobRecord, now_s: f64) -> f64 {
    r.last_checkpoint_s.map_or(0.0, |c| (now_s - c).max(0.0))
}

/// The work a move of `r` at `now_s` would throw away, in reference-GPU seconds as the
/// framework counts it (`Running::lost_work_s`): the time since its last checkpoint at
/// its placement's speed under `speed` (the generic model consolidation predicts
/// with in the service) and the checkpoint duty cycle, so that consolidation's cost is
/// that time redone at the new speed. 0 when no checkpoint was reported: the service
/// cannot know, and counts a move as losing nothing.
pub fn lost_work(r: &JobRecord, now_s: f64, state: &ClusterState, speed: &SpeedModel) -> f64 {
    let wall = since_checkpoint_s(r, now_s);
    match &r.placement {
        Some(p) if wall > 0.0 => {
            let c = &r.job.checkpoint;
            let duty = c.interval_s / (c.interval_s + c.cost_s);
            wall * speed.speed(&r.job, p, state) * duty
        }
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLACED: f64 = 1_000.0;
    const NOW: f64 = 5_000.0;

    fn check(value: f64, state: JobState) -> Result<Option<f64>, ServiceError> {
        reported(value, state, PLACED, NOW)
    }

    #[test]
    fn zero_is_unknown_and_a_time_within_the_placement_is_kept() {
        assert_eq!(check(0.0, JobState::Running), Ok(None));
        assert_eq!(check(0.0, JobState::Completed), Ok(None));
        assert_eq!(check(4_000.0, JobState::Running), Ok(Some(4_000.0)));
        // Within the skew allowance on either side.
        assert_eq!(check(NOW + 30.0, JobState::Running), Ok(Some(NOW + 30.0)));
        assert_eq!(
            check(PLACED - 30.0, JobState::Running),
            Ok(Some(PLACED - 30.0))
        );
    }

    #[test]
    fn bad_values_are_refused_naming_the_field() {
        for (value, state, why) in [
            (f64::NAN, JobState::Running, "not finite"),
            (f64::INFINITY, JobState::Running, "not finite"),
            (NOW + 120.0, JobState::Running, "in the future"),
            (
                PLACED - 120.0,
                JobState::Running,
                "before the job's placement",
            ),
            (-1.0, JobState::Running, "before the job's placement"),
            (4_000.0, JobState::Completed, "only RUNNING"),
        ] {
            match check(value, state) {
                Err(ServiceError::InvalidArgument(m)) => {
                    assert!(m.starts_with("last_checkpoint_unix_s: "), "{m}");
                    assert!(m.contains(why), "{value}: {m}");
                }
                other => panic!("{value} {state}: {other:?}"),
            }
        }
    }
}
