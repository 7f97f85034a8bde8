//! A live shadow log joined with what the incumbent did with the same jobs: the jobs and
//! recorded runs [`run_shadow`](super::run_shadow) replays, and Marshal's
//! recommendations against the incumbent's starts read straight from the log.
//!
//! Clocks: the log's `at_us` is the advisor's wall clock (Unix time, µs); outcomes are
//! Unix seconds. Both are compared in whole µs, so a start recorded at the instant of a
//! recommendation counts as the same time rather than a rounding error apart.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::Recorded;
use crate::domain::{Job, JobId};

/// One recommendation of a shadow log, as much of it as the join needs.
#[derive(Clone, Debug)]
pub struct Advice {
    /// The caller's job id.
    pub job: String,
    /// When it was made (Unix µs).
    pub at_us: i64,
    pub spec: Job,
    /// The nodes of its placement (one per worker) when it was a PLACE; `None` for WAIT
    /// and REJECT.
    pub placed_on: Option<Vec<String>>,
}

/// What the incumbent did with one job (Unix seconds), as the operator exported it.
#[derive(Clone, Debug, PartialEq)]
pub struct IncumbentOutcome {
    pub job: String,
    /// `None`: never scheduled.
    pub scheduled: Option<f64>,
    /// `None`: still running when exported; it ends at the export horizon (the latest
    /// time in the log or the outcomes), like the DLRM trace's undeleted instances.
    pub deleted: Option<f64>,
    pub node: Option<String>,
}

/// How the join went: what was matched, and what was not (never silently dropped).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LiveReport {
    pub log_decisions: u64,
    /// Distinct caller job ids in the log.
    pub log_jobs: u64,
    pub outcome_rows: u64,
    /// Malformed outcome rows the parser skipped (set by the caller, which parsed them).
    pub outcome_rows_skipped: u64,
    /// Jobs in both: the ones replayed.
    pub joined: u64,
    pub log_jobs_without_outcome: u64,
    pub outcomes_not_in_log: u64,
    /// Joined jobs the incumbent started before Marshal was first asked about them:
    /// their submit time is moved back to that start, so that both sides may start
    /// them then.
    pub started_before_first_advice: u64,
    /// Time 0 of the replay (Unix seconds): the earliest record, or an earlier recorded
    /// start.
    pub origin_unix_s: f64,
    pub recommendation: RecommendationVsIncumbent,
}

/// Marshal's first PLACE recommendation against the incumbent's recorded start, per
/// joined job, without simulation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RecommendationVsIncumbent {
    /// Marshal recommended a placement before the incumbent started the job.
    pub sooner: u64,
    pub later: u64,
    pub same: u64,
    /// Marshal never recommended a placement (whatever the incumbent did).
    pub never: u64,
    /// Marshal recommended a placement; the incumbent never started the job.
    pub incumbent_never: u64,
    /// Mean of (recorded start − first PLACE) over the sooner, later and same jobs:
    /// positive means Marshal would have placed them sooner.
    pub lead_mean_s: Option<f64>,
    /// Jobs with both a recorded node and a PLACE recommendation.
    pub node_compared: u64,
    /// Of those, recommendations whose every worker is on the recorded node.
    pub node_agree: u64,
    pub node_agree_share: Option<f64>,
}

/// The replay's input built from a log and the outcomes.
#[derive(Debug)]
pub struct LiveJoin {
    /// Joined jobs in the order the log first asked about them, numbered 0.., named by
    /// the caller's id, submitted (seconds from the origin) when first asked about.
    pub jobs: Vec<Job>,
    /// What the incumbent did with each, in the same clock.
    pub recorded: Vec<Recorded>,
    pub report: LiveReport,
    /// Caller ids in the log without an outcome, and outcome ids not in the log.
    pub log_only: Vec<String>,
    pub outcomes_only: Vec<String>,
}

/// One job as the log saw it.
struct Asked<'a> {
    first: &'a Advice,
    first_place: Option<&'a Advice>,
}

fn to_us(seconds: f64) -> i64 {
    (seconds * 1e6).round() as i64
}

/// The log's jobs in the order first asked about, and each id's index in that order.
fn group(advice: &[Advice]) -> (Vec<Asked<'_>>, HashMap<&str, usize>) {
    let mut order: Vec<Asked> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for a in advice {
        let i = *index.entry(a.job.as_str()).or_insert_with(|| {
            order.push(Asked {
                first: a,
                first_place: None,
            });
            order.len() - 1
        });
        let asked = &mut order[i];
        if a.placed_on.is_some() && asked.first_place.is_none() {
            asked.first_place = Some(a);
        }
    }
    (order, index)
}

/// Joins `advice` (in log order) with `outcomes` by job id.
pub fn join_live(advice: &[Advice], outcomes: &[IncumbentOutcome]) -> LiveJoin {
    let (order, index) = group(advice);
    let by_job: HashMap<&str, &IncumbentOutcome> =
        outcomes.iter().map(|o| (o.job.as_str(), o)).collect();
    let joined: Vec<(&Asked, &IncumbentOutcome)> = order
        .iter()
        .filter_map(|a| by_job.get(a.first.job.as_str()).map(|o| (a, *o)))
        .collect();
    let times = outcomes
        .iter()
        .flat_map(|o| [o.scheduled, o.deleted])
        .flatten()
        .map(to_us);
    let horizon = advice
        .iter()
        .map(|a| a.at_us)
        .chain(times)
        .max()
        .unwrap_or(0);
    let origin = advice
        .iter()
        .map(|a| a.at_us)
        .chain(joined.iter().filter_map(|(_, o)| o.scheduled.map(to_us)))
        .min()
        .unwrap_or(0);
    let rel = |us: i64| us.saturating_sub(origin) as f64 / 1e6;
    let mut out = LiveJoin {
        jobs: Vec::with_capacity(joined.len()),
        recorded: Vec::with_capacity(joined.len()),
        report: LiveReport {
            log_decisions: advice.len() as u64,
            log_jobs: order.len() as u64,
            outcome_rows: outcomes.len() as u64,
            joined: joined.len() as u64,
            origin_unix_s: origin as f64 / 1e6,
            ..LiveReport::default()
        },
        log_only: order
            .iter()
            .filter(|a| !by_job.contains_key(a.first.job.as_str()))
            .map(|a| a.first.job.clone())
            .collect(),
        outcomes_only: outcomes
            .iter()
            .filter(|o| !index.contains_key(o.job.as_str()))
            .map(|o| o.job.clone())
            .collect(),
    };
    out.report.log_jobs_without_outcome = out.log_only.len() as u64;
    out.report.outcomes_not_in_log = out.outcomes_only.len() as u64;
    let mut leads = Vec::new();
    for (k, (asked, outcome)) in joined.iter().enumerate() {
        let start = outcome.scheduled.map(to_us);
        let mut submit = asked.first.at_us;
        if let Some(s) = start
            && s < submit
        {
            out.report.started_before_first_advice += 1;
            submit = s;
        }
        let mut job = asked.first.spec.clone();
        job.id = JobId(k as u32);
        job.name = asked.first.job.clone();
        job.submit_time = rel(submit);
        out.jobs.push(job);
        let end = match (outcome.deleted, start) {
            (Some(d), _) => to_us(d),
            (None, Some(_)) => horizon,
            // Never scheduled: it has no run time, and is not replayed.
            (None, None) => submit,
        };
        out.recorded.push(Recorded {
            scheduled: start.map(rel),
            ended: rel(end.max(submit)),
            node: outcome.node.clone(),
        });
        compare(&mut out.report.recommendation, asked, outcome, &mut leads);
    }
    let r = &mut out.report.recommendation;
    r.lead_mean_s = (!leads.is_empty()).then(|| leads.iter().sum::<f64>() / leads.len() as f64);
    r.node_agree_share =
        (r.node_compared > 0).then(|| r.node_agree as f64 / r.node_compared as f64);
    out
}

/// Counts one joined job's recommendation against the incumbent's start and node.
fn compare(
    r: &mut RecommendationVsIncumbent,
    asked: &Asked,
    outcome: &IncumbentOutcome,
    leads: &mut Vec<f64>,
) {
    let Some(place) = asked.first_place else {
        r.never += 1;
        return;
    };
    match outcome.scheduled.map(to_us) {
        None => r.incumbent_never += 1,
        Some(start) => {
            let lead = start.saturating_sub(place.at_us);
            match lead.cmp(&0) {
                std::cmp::Ordering::Greater => r.sooner += 1,
                std::cmp::Ordering::Less => r.later += 1,
                std::cmp::Ordering::Equal => r.same += 1,
            }
            leads.push(lead as f64 / 1e6);
        }
    }
    if let (Some(node), Some(nodes)) = (&outcome.node, &place.placed_on) {
        r.node_compared += 1;
        if !nodes.is_empty() && nodes.iter().all(|n| n == node) {
            r.node_agree += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_700_000_000_000_000;

    fn advice(job: &str, at_s: f64, placed_on: Option<Vec<String>>) -> Advice {
        Advice {
            job: job.into(),
            at_us: T0 + to_us(at_s),
            spec: Job::whole_gpus(JobId(99), 1, 0.0, 0.0),
            placed_on,
        }
    }

    fn wait(job: &str, at_s: f64) -> Advice {
        advice(job, at_s, None)
    }

    fn place(job: &str, at_s: f64, nodes: &[&str]) -> Advice {
        advice(
            job,
            at_s,
            Some(nodes.iter().map(|s| s.to_string()).collect()),
        )
    }

    fn outcome(
        job: &str,
        start: Option<f64>,
        end: Option<f64>,
        node: Option<&str>,
    ) -> IncumbentOutcome {
        let unix = |s: f64| T0 as f64 / 1e6 + s;
        IncumbentOutcome {
            job: job.into(),
            scheduled: start.map(unix),
            deleted: end.map(unix),
            node: node.map(String::from),
        }
    }

    #[test]
    fn joins_by_id_counts_the_unmatched_and_times_from_the_first_record() {
        let log = [
            wait("a", 0.0),
            place("b", 5.0, &["n1"]),
            place("a", 10.0, &["n0"]),
            place("lost", 12.0, &["n0"]),
            place("a", 20.0, &["n1"]),
        ];
        let outs = [
            outcome("b", Some(5.0), Some(50.0), Some("n1")),
            outcome("a", Some(30.0), None, Some("n1")),
            outcome("other", Some(1.0), Some(100.0), None),
        ];
        let j = join_live(&log, &outs);
        assert_eq!(j.log_only, ["lost"]);
        assert_eq!(j.outcomes_only, ["other"]);
        let r = &j.report;
        assert_eq!((r.log_decisions, r.log_jobs, r.outcome_rows), (5, 3, 3));
        assert_eq!(
            (r.joined, r.log_jobs_without_outcome, r.outcomes_not_in_log),
            (2, 1, 1)
        );
        let names: Vec<&str> = j.jobs.iter().map(|j| j.name.as_str()).collect();
        assert_eq!(names, ["a", "b"], "log order");
        assert_eq!((j.jobs[0].id, j.jobs[1].id), (JobId(0), JobId(1)));
        assert_eq!(j.jobs[0].submit_time, 0.0);
        assert_eq!(j.jobs[1].submit_time, 5.0);
        assert_eq!(j.recorded[0].scheduled, Some(30.0));
        // Still running: ends at the latest time anywhere (the other job's 100 s).
        assert_eq!(j.recorded[0].ended, 100.0);
        assert_eq!(j.recorded[1].ended, 50.0);
        assert_eq!(j.recorded[1].node.as_deref(), Some("n1"));
        // `a`'s first PLACE (10 s, n0), not its later one (20 s, n1), is compared.
        let r = &j.report.recommendation;
        assert_eq!((r.sooner, r.same), (1, 1));
        assert_eq!(r.lead_mean_s, Some(10.0), "leads 20 s and 0 s");
        assert_eq!((r.node_compared, r.node_agree), (2, 1));
    }

    #[test]
    fn first_place_against_the_recorded_start_and_node() {
        let log = [
            place("sooner", 0.0, &["n0"]),
            wait("later", 0.0),
            place("later", 40.0, &["n0", "n1"]),
            place("same", 3.0, &["n2"]),
            wait("never", 0.0),
            place("unstarted", 0.0, &["n0"]),
        ];
        let outs = [
            outcome("sooner", Some(10.0), Some(20.0), Some("n0")),
            outcome("later", Some(20.0), Some(60.0), Some("n0")),
            outcome("same", Some(3.0), Some(9.0), None),
            outcome("never", Some(1.0), Some(9.0), Some("n0")),
            outcome("unstarted", None, None, Some("n0")),
        ];
        let r = join_live(&log, &outs).report.recommendation;
        assert_eq!((r.sooner, r.later, r.same), (1, 1, 1));
        assert_eq!((r.never, r.incumbent_never), (1, 1));
        // Leads: +10 s, −20 s, 0 s.
        assert_eq!(r.lead_mean_s, Some(-10.0 / 3.0));
        // sooner agrees (n0), later spans n0 and n1 (disagrees), unstarted agrees.
        assert_eq!((r.node_compared, r.node_agree), (3, 2));
        assert_eq!(r.node_agree_share, Some(2.0 / 3.0));
    }

    #[test]
    fn a_start_before_the_first_advice_moves_the_submit_time_back() {
        let log = [place("x", 10.0, &["n0"]), wait("y", 12.0)];
        let outs = [
            outcome("x", Some(4.0), Some(30.0), None),
            outcome("y", None, None, None),
        ];
        let j = join_live(&log, &outs);
        assert_eq!(j.report.started_before_first_advice, 1);
        assert_eq!(j.report.origin_unix_s, T0 as f64 / 1e6 + 4.0);
        assert_eq!(j.jobs[0].submit_time, 0.0);
        assert_eq!(j.recorded[0].scheduled, Some(0.0));
        assert_eq!(j.recorded[0].ended, 26.0);
        assert_eq!(j.jobs[1].submit_time, 8.0);
        assert_eq!(
            (j.recorded[1].scheduled, j.recorded[1].ended),
            (None, 8.0),
            "never scheduled: no run time"
        );
        assert!(crate::shadow::shadow_jobs(&j.jobs, &j.recorded).is_ok());
    }
}
