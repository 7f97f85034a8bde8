//! Fidelity to the published FGD results (Weng et al., ATC'23; the curves in
//! `hkust-adsl/kubernetes-scheduler-simulator`'s expected results): openb `default`,
//! inflation to 130 %, seeds 42..=51. Each policy must leave a number of unallocated GPUs
//! at 100 % arrived load within 10 % of the published mean, and the six must rank as
//! published.

use std::sync::Arc;

use marshal_scheduler::domain::Topology;
use marshal_scheduler::policies;
use marshal_scheduler::sim::{SimConfig, run_inflation};

/// Published mean unallocated GPUs at 100 % arrived load (6,212 × (1 − alloc %)), from
/// `analysis_allo_discrete.csv`, best to worst.
const PUBLISHED: [(&str, f64); 6] = [
    ("fgd", 296.5),
    ("best-fit", 443.4),
    ("gpu-packing", 510.7),
    ("gpu-clustering", 518.7),
    ("dot-product", 582.6),
    ("random", 850.9),
];

#[test]
fn openb_default_inflation_matches_the_published_fgd_results() {
    let spec = marshal_datasets::cluster_preset("openb").unwrap();
    let topo = Arc::new(Topology::build(&spec).unwrap());
    let (pods, _) = marshal_datasets::load_trace("openb-default", &topo.catalog).unwrap();
    let measured: Vec<(&str, f64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = PUBLISHED
            .iter()
            .map(|&(name, _)| {
                let (topo, pods) = (topo.clone(), &pods);
                scope.spawn(move || {
                    let policy = policies::build(name, pods).unwrap();
                    let total: f64 = (42..52)
                        .map(|seed| {
                            let (r, _) = run_inflation(
                                &policy,
                                topo.clone(),
                                pods,
                                "openb",
                                &SimConfig::inflation(seed),
                            )
                            .unwrap();
                            r.unallocated_gpus_at_100.unwrap()
                        })
                        .sum();
                    (name, total / 10.0)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (&(name, published), &(_, ours)) in PUBLISHED.iter().zip(&measured) {
        let error = (ours - published).abs() / published;
        assert!(
            error <= 0.10,
            "{name}: {ours:.0} unallocated vs published {published:.0}"
        );
    }
    // gpu-packing and gpu-clustering differ by 8 GPUs in the paper, inside one seed
    // standard deviation (≈35 GPUs); our seeds happen to keep their order too.
    for pair in measured.windows(2) {
        assert!(
            pair[0].1 < pair[1].1,
            "ranking differs from the paper: {measured:?}"
        );
    }
}
