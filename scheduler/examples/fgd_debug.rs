use marshal_scheduler::domain::*;
use marshal_scheduler::framework::Context;
use marshal_scheduler::policies;
use marshal_scheduler::sim::*;
use rand::SeedableRng;
use std::sync::Arc;
fn main() {
    let spec = marshal_datasets::cluster_preset("openb").unwrap();
    let topo = Arc::new(Topology::build(&spec).unwrap());
    let (jobs, _) = marshal_datasets::load_trace("openb", &topo.catalog).unwrap();
    let name = std::env::args().nth(1).unwrap();
    let fgd = policies::Fgd::from_workload(&jobs);
    println!("typical shapes {}", fgd.target_shapes());
    let g2 = topo.catalog.id("G2");
    for lefts in [
        vec![1000u16; 8],
        vec![1000, 1000, 1000, 1000, 0, 0, 0, 0],
        vec![1000, 1000, 1000, 1000, 1000, 1000, 1000, 0],
        vec![1000, 1000, 1000, 0, 0, 0, 0, 0],
    ] {
        let f = fgd.fragmentation(g2, 96000, &lefts);
        let mut after = lefts.clone();
        let i = after.iter().position(|&l| l == 1000).unwrap();
        after[i] = 0;
        let f2 = fgd.fragmentation(g2, 96000 - 11300, &after);
        println!(
            "{:?}: frag {f:.1} -> {f2:.1} score {}",
            lefts,
            ((1.0 / (1.0 + (-(f - f2) / 1000.0).exp())) * 100.0) as i64
        );
    }
    let policy = policies::build(&name, &jobs).unwrap();
    let config = SimConfig::inflation(42);
    let tasks = inflation_arrivals(&jobs, topo.gpu_count() as u64 * 1000, 130.0, &config);
    let mut state = ClusterState::new(topo.clone());
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let mut arrived = 0u64;
    let mut fails = 0;
    for t in &tasks {
        arrived += t.gpu_milli();
        let mut ctx = Context::new(0.0, &mut rng);
        let ok = policy
            .placer
            .place(t, &mut state, &mut ctx)
            .ok()
            .and_then(|p| state.allocate(t, &p).ok());
        if ok.is_none() {
            fails += 1;
            if fails < 15 {
                println!(
                    "fail at {:.1}%: {:?} cpu {} mem {} idle {}",
                    arrived as f64 / 62120.0,
                    t.gpu,
                    t.cpu_milli,
                    t.memory_mib,
                    state.idle_gpus()
                );
            }
        }
    }
    // node usage histogram
    let mut full = 0;
    let mut partial = 0;
    let mut empty = 0;
    for n in topo.node_ids() {
        let idle = state.node_idle_gpus(n) as u32;
        let g = topo.node(n).gpu_count() as u32;
        if state.node_free_milli(n) == 0 {
            full += 1
        } else if idle == g {
            empty += 1
        } else {
            partial += 1
        }
    }
    println!(
        "fails {fails} alloc {:.2}% full {full} partial {partial} empty {empty}",
        state.allocated_milli() as f64 / 62120.0
    );
}
#[allow(dead_code)]
fn unused() {}
