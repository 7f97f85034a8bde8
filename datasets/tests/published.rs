//! The bundled traces against the facts their papers and SOURCE.md files publish.

use std::collections::BTreeMap;

use marshal_datasets::{
    CLUSTER_PRESETS, cluster_preset, load_trace, parse_philly, philly_cluster, philly_window,
};
use marshal_scheduler::domain::{
    ClusterSpec, GpuCatalog, GpuDemand, GpuId, Job, TopoLevel, Topology,
};

fn nodes_per_model(spec: &ClusterSpec) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for g in &spec.node_groups {
        let model = g.gpu_model.clone().unwrap_or_else(|| "cpu".to_string());
        *counts.entry(model).or_insert(0) += g.count as u64;
    }
    counts
}

#[test]
fn openb_gpu_nodes_match_the_published_counts() {
    let spec = cluster_preset("openb").unwrap();
    assert_eq!(spec.name, "openb");
    assert_eq!(spec.node_count(), 1_213);
    assert_eq!(spec.gpu_count(), 6_212);
    let expected: BTreeMap<String, u64> = [
        ("G2", 549),
        ("T4", 404),
        ("P100", 134),
        ("V100M16", 55),
        ("G3", 39),
        ("V100M32", 30),
        ("A10", 2),
    ]
    .into_iter()
    .map(|(m, n)| (m.to_string(), n))
    .collect();
    assert_eq!(nodes_per_model(&spec), expected);
    // Serial numbers are kept, in file order.
    assert_eq!(spec.node_groups[0].names[0], "openb-node-0000");
    // Only 8-GPU V100/G2/G3 servers are NVLink islands.
    for g in &spec.node_groups {
        let nvlink = g.gpus == 8
            && matches!(
                g.gpu_model.as_deref(),
                Some("V100M16" | "V100M32" | "G2" | "G3")
            );
        assert_eq!(g.nvlink_domain, if nvlink { 8 } else { 0 }, "{g:?}");
    }
    let topo = Topology::build(&spec).unwrap();
    assert_eq!(topo.gpu_count(), 6_212);
    assert_eq!(topo.racks().len(), 1_213usize.div_ceil(16));
}

#[test]
fn openb_all_nodes_include_the_cpu_only_ones() {
    let spec = cluster_preset("openb-all").unwrap();
    assert_eq!(spec.node_count(), 1_523);
    assert_eq!(spec.gpu_count(), 6_212);
    assert_eq!(nodes_per_model(&spec)["cpu"], 310);
}

fn gpu_summary(jobs: &[Job]) -> (usize, usize, usize, u64) {
    let gpu_pods = jobs.iter().filter(|j| j.gpu != GpuDemand::None).count();
    let shared = jobs.iter().filter(|j| j.gpu.is_shared()).count();
    let milli = jobs.iter().map(Job::gpu_milli).sum();
    (jobs.len(), gpu_pods, shared, milli)
}

#[test]
fn openb_default_pods_match_the_published_counts() {
    let catalog = GpuCatalog::default();
    for name in ["openb-default", "openb"] {
        let (jobs, report) = load_trace(name, &catalog).unwrap();
        assert_eq!(report.rows_read, 8_152);
        assert_eq!(report.rows_skipped, 0, "{report}");
        assert_eq!(gpu_summary(&jobs), (8_152, 7_064, 3_078, 6_086_800));
        assert_eq!(jobs.len() - 7_064, 1_088);
        let last = jobs.iter().map(|j| j.submit_time).fold(0.0, f64::max);
        assert!(
            last < 150.0 * 86_400.0,
            "creation spans 0..149 days, got {last}"
        );
        assert!(jobs.iter().all(|j| j.validate().is_ok()));
        assert!(jobs.iter().enumerate().all(|(i, j)| j.id.0 as usize == i));
    }
}

#[test]
fn openb_multigpu20_is_the_five_column_schema() {
    let (jobs, report) = load_trace("openb-multigpu20", &GpuCatalog::default()).unwrap();
    assert_eq!(report.rows_skipped, 0, "{report}");
    assert_eq!(gpu_summary(&jobs), (8_324, 7_236, 3_078, 7_086_800));
    assert!(
        jobs.iter()
            .all(|j| j.submit_time == 0.0 && j.total_work == 0.0)
    );
}

#[test]
fn philly_jobs_match_the_published_counts() {
    let (jobs, report) = load_trace("philly", &GpuCatalog::default()).unwrap();
    assert_eq!(report.rows_read, 82_247);
    assert_eq!(report.rows_skipped, 0, "{report}");
    assert_eq!(jobs.len(), 82_247);
    let mut histogram = BTreeMap::new();
    for j in &jobs {
        *histogram.entry(j.gpu_count()).or_insert(0) += 1;
    }
    let expected: BTreeMap<u32, usize> = [
        (1, 76_627),
        (2, 1_818),
        (4, 1_870),
        (8, 1_643),
        (12, 7),
        (16, 199),
        (24, 7),
        (32, 67),
        (64, 6),
        (128, 3),
    ]
    .into_iter()
    .collect();
    assert_eq!(histogram, expected);
    // 2017-09-04 10:30:41 to 2017-12-22 08:02:11.
    assert_eq!(jobs[0].submit_time, 0.0);
    assert_eq!(jobs.last().unwrap().submit_time, 9_408_690.0);
    assert!(
        jobs.windows(2)
            .all(|w| w[0].submit_time <= w[1].submit_time)
    );
    let vcs: std::collections::BTreeSet<_> = jobs.iter().map(|j| j.tenant.as_str()).collect();
    assert_eq!(vcs.len(), 15);
}

#[test]
fn philly_weeks_partition_the_trace() {
    let catalog = GpuCatalog::default();
    let (all, _) = load_trace("philly", &catalog).unwrap();
    // By name (each parses the whole file, so only a few here) ...
    for k in [0, 7, 15] {
        let (week, report) = load_trace(&format!("philly-week{k}"), &catalog).unwrap();
        assert!(report.source.contains(&format!("week {k}")));
        assert_eq!(week, philly_window(&all, 7.0 * k as f64, 7.0));
    }
    // ... and every week, which together hold every job once.
    let mut total = 0;
    for k in 0..16 {
        let week = philly_window(&all, 7.0 * k as f64, 7.0);
        assert!(!week.is_empty(), "week {k}");
        assert!(
            week.iter()
                .all(|j| (0.0..7.0 * 86_400.0).contains(&j.submit_time))
        );
        assert!(week.iter().enumerate().all(|(i, j)| j.id.0 as usize == i));
        total += week.len();
    }
    assert_eq!(total, all.len());
}

#[test]
fn philly_window_rebases_to_the_window_start() {
    let text = "timestamp,duration,num_gpus,gpu_time,cluster
2017-10-01 00:00:00,10,1,10,a
2017-10-02 06:00:00,10,2,20,b
2017-10-03 00:00:00,10,4,40,c
2017-10-03 12:00:00,10,1,10,d
";
    let (jobs, _) = parse_philly("w.csv", text).unwrap();
    let window = philly_window(&jobs, 1.0, 2.0);
    let got: Vec<_> = window
        .iter()
        .map(|j| (j.id.0, j.tenant.as_str(), j.submit_time))
        .collect();
    assert_eq!(
        got,
        vec![
            (0, "b", 6.0 * 3_600.0),
            (1, "c", 86_400.0),
            (2, "d", 86_400.0 + 43_200.0)
        ]
    );
}

/// GPUs per machine computed straight from the two files, without the crate's parser.
fn philly_gpus_from_files() -> (u64, u64) {
    let listed = include_str!("../data/cluster_machine_list");
    let revised = include_str!("../data/revised_machine_list.csv");
    let corrected: BTreeMap<&str, u64> = revised
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<_> = l.split(',').collect();
            Some((f.get(1)?.trim(), f.get(2)?.trim().parse().ok()?))
        })
        .collect();
    let (mut machines, mut gpus) = (0, 0);
    for line in listed.lines().skip(1).filter(|l| !l.trim().is_empty()) {
        let id = line.split(',').next().unwrap().trim();
        let n = corrected[id];
        if n > 0 {
            machines += 1;
            gpus += n;
        }
    }
    (machines, gpus)
}

#[test]
fn philly_cluster_uses_the_corrected_gpu_counts() {
    let spec = philly_cluster().unwrap();
    assert_eq!(spec, cluster_preset("philly").unwrap());
    assert_eq!(
        (spec.node_count(), spec.gpu_count()),
        philly_gpus_from_files()
    );
    assert_eq!((spec.node_count(), spec.gpu_count()), (539, 3_205));
    let mut per_model = BTreeMap::new();
    for g in &spec.node_groups {
        *per_model.entry(g.gpu_model.clone().unwrap()).or_insert(0) +=
            g.count as u64 * g.gpus as u64;
    }
    assert_eq!(per_model["philly-12g"], 2_235);
    assert_eq!(per_model["philly-24g"], 970);
    assert!(spec.node_groups.iter().all(|g| g.nvlink_domain == 0));
}

#[test]
fn dgx_h100_64_is_eight_nvswitch_nodes_in_two_racks() {
    let topo = Topology::build(&cluster_preset("dgx-h100-64").unwrap()).unwrap();
    assert_eq!(topo.gpu_count(), 64);
    assert_eq!(topo.nodes().len(), 8);
    assert_eq!(topo.racks().len(), 2);
    assert_eq!(topo.spines().len(), 1);
    assert_eq!(topo.nodes()[0].name, "dgx-0");
    assert_eq!(topo.distance(GpuId(0), GpuId(7)), TopoLevel::NvlinkIsland);
    assert_eq!(topo.distance(GpuId(0), GpuId(8)), TopoLevel::Rack);
    assert_eq!(topo.distance(GpuId(0), GpuId(32)), TopoLevel::Spine);
    assert_eq!(topo.links.nvlink_gbps, 450.0);
    assert_eq!(topo.links.rack_gbps, 50.0);
}

#[test]
fn pollux_64_is_sixteen_pcie_t4_nodes_in_racks_of_four() {
    let topo = Topology::build(&cluster_preset("pollux-64").unwrap()).unwrap();
    assert_eq!(topo.gpu_count(), 64);
    assert_eq!(topo.racks().len(), 4);
    assert_eq!(topo.distance(GpuId(0), GpuId(1)), TopoLevel::Node);
    let t4 = topo.catalog.id("T4").unwrap();
    assert!(topo.gpus().iter().all(|g| g.model == t4));
}

#[test]
fn every_preset_builds_a_topology() {
    for name in CLUSTER_PRESETS {
        let spec = cluster_preset(name).unwrap();
        let topo = Topology::build(&spec).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(topo.gpu_count() as u64, spec.gpu_count(), "{name}");
    }
}

#[test]
fn elasticflow_128_is_sixteen_a100_nodes_on_nvswitch() {
    let topo = Topology::build(&cluster_preset("elasticflow-128").unwrap()).unwrap();
    assert_eq!(topo.gpu_count(), 128);
    assert_eq!(topo.nodes().len(), 16);
    assert_eq!(topo.max_gpus_within(TopoLevel::NvlinkIsland), 8);
    assert_eq!(topo.racks().len(), 2);
}

#[test]
fn sias_testbeds_have_their_gpus_and_islands() {
    for (name, gpu, island) in [
        ("nd40rs-v100-64", "V100M32", 8),
        ("dgx-a100-64", "A100-40", 8),
        ("rtx2080ti-64", "RTX2080Ti", 1),
        ("quadro-rtx6000-32", "RTX6000", 1),
    ] {
        let topo = Topology::build(&cluster_preset(name).unwrap()).unwrap();
        let per_node = if name.starts_with("quadro") { 4 } else { 8 };
        assert_eq!(
            (topo.gpu_count(), topo.nodes().len()),
            (8 * per_node, 8),
            "{name}"
        );
        assert_eq!(
            topo.max_gpus_within(TopoLevel::NvlinkIsland),
            island,
            "{name}"
        );
        let model = topo.nodes()[0].model.unwrap();
        assert_eq!(topo.catalog.get(model).name, gpu, "{name}");
    }
}

#[test]
fn dlrm_peak_holds_the_dlrm_traces_peak_demand_with_headroom() {
    let spec = cluster_preset("dlrm-peak").unwrap();
    let topo = Topology::build(&spec).unwrap();
    assert_eq!((topo.gpu_count(), topo.nodes().len()), (3600, 2600));
    let a10 = topo.catalog.id("A10").unwrap();
    assert!(topo.gpus().iter().all(|g| g.model == a10));
    let cores: u64 = spec
        .node_groups
        .iter()
        .map(|g| u64::from(g.count) * u64::from(g.cpu_milli) / 1000)
        .sum();
    // Peaks of the recorded schedule (README, Shadow mode): 3,412 GPUs and
    // 28,962 + 393,616 cores at once.
    assert!(topo.gpu_count() as f64 >= 1.05 * 3412.0);
    assert!(cores as f64 >= 1.05 * (28_962.0 + 393_616.0), "{cores}");
}
