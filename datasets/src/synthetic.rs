//! Synthetic workloads for training diversity: jobs drawn from a real trace, arriving as
//! a Poisson or bursty process at a chosen offered load on a chosen cluster.
//!
//! The job mix is a bootstrap of the template trace: each synthetic job is a copy of a
//! uniformly drawn trace job (shape and duration together), so the joint distribution of
//! GPU count and duration is the trace's own rather than a product of fitted marginals.
//! The arrival rate follows from the target load: with `G` reference GPUs and `E[g·d]` the mean
//! GPU-seconds of a drawn job, `λ = load · G / E[g·d]` jobs per second. Bursty arrivals
//! are a two-state Markov-modulated Poisson process whose mean rate is the same `λ`.

use marshal_scheduler::domain::{Job, JobId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::DatasetError;
use crate::table::MAX_TRACE_SECONDS;

#[derive(Copy, Clone, Debug, PartialEq)]
pub enum Arrivals {
    Poisson,
    /// Alternating calm and burst periods (exponential lengths, means in seconds); the
    /// rate in a burst is `factor` times the calm rate.
    Bursty {
        factor: f64,
        mean_burst_s: f64,
        mean_calm_s: f64,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct SyntheticSpec {
    pub jobs: usize,
    /// GPU time asked for over the cluster's GPU time, e.g. 0.8.
    pub load: f64,
    /// The cluster's GPUs weighted by throughput class (reference GPUs): trace durations
    /// are reference-GPU time, so this is the capacity the load is relative to.
    pub cluster_capacity: f64,
    pub arrivals: Arrivals,
    pub seed: u64,
}

/// The most jobs one synthetic workload holds: several times the largest public trace
/// (Alibaba's 2020 GPU trace has about 1.2 M), and about a gigabyte of jobs in memory.
pub const MAX_JOBS: usize = 5_000_000;

/// The latest arrival a synthetic workload may have, a century: a lower load spreads
/// the jobs beyond any replay, and beyond what the trace formats' timestamps hold.
const MAX_ARRIVAL_S: f64 = 100.0 * 365.25 * 86_400.0;

impl SyntheticSpec {
    pub fn validate(&self) -> Result<(), DatasetError> {
        let bad = |reason: String| Err(DatasetError::InvalidSynthetic { reason });
        if self.jobs == 0 || self.jobs > MAX_JOBS {
            return bad(format!("{} jobs: need 1 ..= {MAX_JOBS}", self.jobs));
        }
        if !(self.load.is_finite() && self.load > 0.0) {
            return bad(format!("load {} must be a positive number", self.load));
        }
        if !(self.cluster_capacity.is_finite() && self.cluster_capacity > 0.0) {
            return bad("the cluster has no GPU capacity".into());
        }
        if let Arrivals::Bursty {
            factor,
            mean_burst_s,
            mean_calm_s,
        } = self.arrivals
        {
            if !(factor.is_finite() && factor >= 1.0) {
                return bad(format!("burst factor {factor} must be a finite number ≥ 1"));
            }
            // Shorter periods switch faster than arrivals come and, near 0, faster than
            // the clock can tell times apart: the process would never advance.
            for (what, mean_s) in [("burst", mean_burst_s), ("calm", mean_calm_s)] {
                if !(mean_s.is_finite() && (1.0..=MAX_TRACE_SECONDS).contains(&mean_s)) {
                    return bad(format!(
                        "mean {what} length {} h must be between 1 s and 10^12 s",
                        mean_s / 3600.0
                    ));
                }
            }
        }
        Ok(())
    }
}

/// `spec.jobs` jobs drawn from `template`, arriving from time 0.
pub fn synthesize(template: &[Job], spec: &SyntheticSpec) -> Result<Vec<Job>, DatasetError> {
    spec.validate()?;
    let usable: Vec<&Job> = template
        .iter()
        .filter(|j| j.total_work > 0.0 && j.gpu_milli() > 0)
        .collect();
    if usable.is_empty() {
        return Err(DatasetError::InvalidSynthetic {
            reason: "the template has no GPU job with a duration to draw from".into(),
        });
    }
    let mean_gpu_s = usable
        .iter()
        .map(|j| j.gpu_milli() as f64 / 1000.0 * j.total_work)
        .sum::<f64>()
        / usable.len() as f64;
    let rate = spec.load * spec.cluster_capacity / mean_gpu_s;
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    let mut arrivals = ArrivalProcess::new(spec.arrivals, rate, &mut rng);
    let mut jobs = Vec::with_capacity(spec.jobs);
    for i in 0..spec.jobs {
        let t = if i == 0 { 0.0 } else { arrivals.next(&mut rng) };
        if !t.is_finite() || t > MAX_ARRIVAL_S {
            return Err(DatasetError::InvalidSynthetic {
                reason: format!(
                    "load {:?} is too low for {} jobs: job {i} would arrive after {t:.3e} s, \
                     more than a century",
                    spec.load, spec.jobs
                ),
            });
        }
        let drawn = usable[rng.random_range(0..usable.len())];
        jobs.push(Job {
            id: JobId(i as u32),
            name: format!("synthetic-{i}"),
            submit_time: t,
            ..drawn.clone()
        });
    }
    Ok(jobs)
}

#[derive(Debug)]
struct ArrivalProcess {
    /// Rates in calm and burst periods (equal for Poisson).
    rates: [f64; 2],
    /// Mean lengths of calm and burst periods (infinite for Poisson).
    means: [f64; 2],
    bursting: bool,
    now: f64,
    switch_at: f64,
}

fn exponential(rng: &mut ChaCha8Rng, mean: f64) -> f64 {
    -mean * rng.random_range(f64::EPSILON..1.0).ln()
}

impl ArrivalProcess {
    fn new(arrivals: Arrivals, rate: f64, rng: &mut ChaCha8Rng) -> Self {
        match arrivals {
            Arrivals::Poisson => ArrivalProcess {
                rates: [rate, rate],
                means: [f64::INFINITY, f64::INFINITY],
                bursting: false,
                now: 0.0,
                switch_at: f64::INFINITY,
            },
            Arrivals::Bursty {
                factor,
                mean_burst_s,
                mean_calm_s,
            } => {
                // Share of time in bursts; the calm rate makes the mean rate `rate`.
                let f = mean_burst_s / (mean_burst_s + mean_calm_s);
                let calm = rate / (1.0 + f * (factor - 1.0));
                ArrivalProcess {
                    rates: [calm, calm * factor],
                    means: [mean_calm_s, mean_burst_s],
                    bursting: false,
                    now: 0.0,
                    switch_at: exponential(rng, mean_calm_s),
                }
            }
        }
    }

    /// Time of the next arrival. Exponential gaps are memoryless, so at a switch of
    /// period the gap is redrawn at the new rate.
    fn next(&mut self, rng: &mut ChaCha8Rng) -> f64 {
        loop {
            let gap = exponential(rng, 1.0 / self.rates[self.bursting as usize]);
            if self.now + gap <= self.switch_at {
                self.now += gap;
                return self.now;
            }
            self.now = self.switch_at;
            self.bursting = !self.bursting;
            self.switch_at = self.now + exponential(rng, self.means[self.bursting as usize]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template() -> Vec<Job> {
        (0..100)
            .map(|i| {
                Job::whole_gpus(
                    JobId(i),
                    [1, 1, 1, 2, 4, 8][i as usize % 6],
                    0.0,
                    600.0 + 60.0 * i as f64,
                )
            })
            .collect()
    }

    fn spec(arrivals: Arrivals) -> SyntheticSpec {
        SyntheticSpec {
            jobs: 20_000,
            load: 0.8,
            cluster_capacity: 256.0,
            arrivals,
            seed: 5,
        }
    }

    fn realised_load(jobs: &[Job], gpus: u32) -> f64 {
        let gpu_s: f64 = jobs
            .iter()
            .map(|j| j.gpu_count() as f64 * j.total_work)
            .sum();
        gpu_s / (gpus as f64 * jobs.last().unwrap().submit_time)
    }

    fn gap_cv(jobs: &[Job]) -> f64 {
        let gaps: Vec<f64> = jobs
            .windows(2)
            .map(|w| w[1].submit_time - w[0].submit_time)
            .collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        var.sqrt() / mean
    }

    #[test]
    fn poisson_arrivals_hit_the_target_load_and_are_seeded() {
        let jobs = synthesize(&template(), &spec(Arrivals::Poisson)).unwrap();
        let load = realised_load(&jobs, 256);
        assert!((load - 0.8).abs() < 0.05, "{load}");
        assert!((gap_cv(&jobs) - 1.0).abs() < 0.05, "Poisson gaps have CV 1");
        assert_eq!(
            jobs,
            synthesize(&template(), &spec(Arrivals::Poisson)).unwrap()
        );
        assert!(
            jobs.windows(2)
                .all(|w| w[0].submit_time <= w[1].submit_time)
        );
    }

    #[test]
    fn bursty_arrivals_keep_the_load_but_cluster_in_time() {
        let bursty = Arrivals::Bursty {
            factor: 8.0,
            mean_burst_s: 3_600.0,
            mean_calm_s: 4.0 * 3_600.0,
        };
        let jobs = synthesize(&template(), &spec(bursty)).unwrap();
        let load = realised_load(&jobs, 256);
        assert!((load - 0.8).abs() < 0.1, "{load}");
        assert!(
            gap_cv(&jobs) > 1.3,
            "bursts make gaps more variable: {}",
            gap_cv(&jobs)
        );
    }

    #[test]
    fn burst_periods_too_short_for_the_clock_or_beyond_a_trace_are_refused() {
        let bursty = |mean_burst_s: f64, mean_calm_s: f64| Arrivals::Bursty {
            factor: 2.0,
            mean_burst_s,
            mean_calm_s,
        };
        // 1e-12 h used to loop for ever: each switch moved the clock by nothing.
        for (burst, calm, what) in [
            (3.6e-9, 3_600.0, "mean burst length"),
            (3_600.0, 0.5, "mean calm length"),
            (3_600.0, 1e13, "mean calm length"),
            (f64::NAN, 3_600.0, "mean burst length"),
        ] {
            let err = synthesize(&template(), &spec(bursty(burst, calm)))
                .unwrap_err()
                .to_string();
            assert!(err.contains(what) && err.contains("between 1 s"), "{err}");
        }
        assert!(synthesize(&template(), &spec(bursty(1.0, 1.0))).is_ok());
    }

    #[test]
    fn the_mix_follows_the_template() {
        let jobs = synthesize(&template(), &spec(Arrivals::Poisson)).unwrap();
        let single = jobs.iter().filter(|j| j.gpu_count() == 1).count() as f64 / jobs.len() as f64;
        assert!((single - 0.5).abs() < 0.02, "{single}");
    }

    #[test]
    fn bad_specs_and_templates_are_refused() {
        let mut s = spec(Arrivals::Poisson);
        s.load = f64::NAN;
        assert!(synthesize(&template(), &s).is_err());
        let no_work: Vec<Job> = (0..3)
            .map(|i| Job::whole_gpus(JobId(i), 1, 0.0, 0.0))
            .collect();
        let err = synthesize(&no_work, &spec(Arrivals::Poisson))
            .unwrap_err()
            .to_string();
        assert!(err.contains("duration"), "{err}");
    }

    #[test]
    fn a_load_too_low_or_too_many_jobs_is_refused_before_anything_overflows() {
        let mut s = spec(Arrivals::Poisson);
        s.load = 1e-300;
        let err = synthesize(&template(), &s).unwrap_err().to_string();
        assert!(err.contains("too low") && err.contains("century"), "{err}");
        s.load = 0.8;
        s.jobs = MAX_JOBS + 1;
        let err = synthesize(&template(), &s).unwrap_err().to_string();
        assert!(err.contains("5000001 jobs"), "{err}");
    }
}
