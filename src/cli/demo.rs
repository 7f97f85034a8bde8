//! `marshal demo`: the baselines and the shipped learned policy side by side on bundled
//! traces.

use clap::Args;

use crate::cli::output::{self, Format};
use crate::cli::sim::{Experiment, ModeArg, SimArgs};

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Seeds per policy.
    #[arg(long, allow_negative_numbers = true, default_value_t = 3)]
    seeds: u64,
}

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    let stdout = &mut std::io::stdout().lock();
    let fgd_policies: Vec<String> = [
        "random",
        "dot-product",
        "gpu-clustering",
        "gpu-packing",
        "best-fit",
        "fgd",
        "topo-pack",
        "learned",
    ]
    .map(String::from)
    .to_vec();
    let inflation = SimArgs {
        mode: ModeArg::Inflation,
        seeds: args.seeds,
        ..SimArgs::replay(
            "openb-default",
            Some("openb".into()),
            fgd_policies.clone(),
            42,
        )
    };
    let experiment = Experiment::load(&inflation)?;
    let groups = experiment.run_all(&fgd_policies, 42, args.seeds)?;
    output::print(&groups, Format::Table, stdout)?;
    print_fallback_rate(&experiment, &groups);
    println!(
        "(published, 10 seeds: random 851, dot-product 583, gpu-clustering 519, gpu-packing 511, best-fit 443, fgd 296 unallocated GPUs at 100 %)\n"
    );

    let replay_policies: Vec<String> = [
        "fifo",
        "best-fit",
        "topo-pack",
        "tiresias",
        "priority",
        "sjf-oracle",
        "learned",
    ]
    .map(String::from)
    .to_vec();
    let replay = SimArgs {
        cluster: Some("dgx-h100-64".into()),
        trace: "philly-week4".into(),
        policy: replay_policies.clone(),
        mode: ModeArg::Replay,
        seeds: 1,
        ..inflation
    };
    println!(
        "The whole Philly trace keeps its own 3,205-GPU cluster about 12 % busy, so queues never form \
         there; the demo replays week 4 (11,437 jobs) on a 64-GPU H100 cluster instead, where they do.\n"
    );
    let experiment = Experiment::load(&replay)?;
    let groups = experiment.run_all(&replay_policies, 42, 1)?;
    output::print(&groups, Format::Table, stdout)?;
    print_fallback_rate(&experiment, &groups);

    // Pollux's eight 160-job workloads on Pollux's testbed, beside the published figure.
    let pollux_policies: Vec<String> = ["fifo", "best-fit", "topo-pack", "tiresias", "sjf-oracle"]
        .map(String::from)
        .to_vec();
    let mut means = vec![0.0; pollux_policies.len()];
    for k in 1..=8 {
        let args = SimArgs::replay(
            &format!("pollux-{k}"),
            Some("pollux-64".into()),
            pollux_policies.clone(),
            42,
        );
        let groups = Experiment::load(&args)?.run_all(&pollux_policies, 42, 1)?;
        for (mean, runs) in means.iter_mut().zip(&groups) {
            *mean += runs[0].jct_mean_s.unwrap_or(f64::NAN) / 3600.0 / 8.0;
        }
    }
    println!(
        "\nPollux's workloads 1–8 (160 jobs each, enriched from Pollux's profiles) on pollux-64 \
         (16 × 4 T4), mean JCT over the eight workloads, hours:"
    );
    for (policy, mean) in pollux_policies.iter().zip(&means) {
        println!("  {policy:<12} {mean:6.2}");
    }
    println!(
        "  (published by Pollux on the same workloads: Tiresias 1.12, Optimus 1.58, Pollux 0.76)"
    );
    Ok(())
}

/// The learned policy's line: which heuristic it falls back to and how often it did.
fn print_fallback_rate(experiment: &Experiment, groups: &[Vec<marshal_scheduler::sim::SimResult>]) {
    let Some(setup) = &experiment.learned else {
        return;
    };
    for runs in groups {
        let rates: Vec<f64> = runs.iter().filter_map(|r| r.fallback_rate).collect();
        if !rates.is_empty() {
            println!(
                "learned (shipped model, gate from its artifact): the fallback ({}) decided {:.1} % of placements{}",
                setup.fallback,
                100.0 * rates.iter().sum::<f64>() / rates.len() as f64,
                match &setup.model.scorer {
                    Err(why) => format!(" — no model: {why}"),
                    Ok(_) => String::new(),
                }
            );
        }
    }
}
