//! The traces added beside openb and Philly, against the facts their `SOURCE.md` files
//! and papers publish. Bundled files are always checked; files read from the traces
//! directory (`../shared/traces` or `$MARSHAL_TRACES_DIR`) are checked when it is there
//! and skipped with a message otherwise. Each file is parsed once.

use std::collections::{BTreeMap, BTreeSet};

use marshal_datasets::{
    DatasetError, OCCUPANCY_NAMES, OccupancyUnit, PAI_BATCH_TIME_NAMES, ParseReport, TRACE_NAMES,
    UNBUNDLED_TRACE_NAMES, acme_cluster_summary, chronus_model_info, gavel_philly_distribution,
    helios_cluster_summary, load_occupancy, load_pai_batch_times, load_trace,
};
use marshal_scheduler::domain::{GpuCatalog, GpuDemand, Job};

mod common;
use common::from_traces_dir;

fn trace(name: &str) -> Option<(Vec<Job>, ParseReport)> {
    from_traces_dir(name, load_trace(name, &GpuCatalog::default()))
}

/// Ids 0.., submit times rebased and sorted, every job valid.
fn assert_well_formed(name: &str, jobs: &[Job]) {
    assert_eq!(jobs.first().map(|j| j.submit_time), Some(0.0), "{name}");
    assert!(
        jobs.windows(2)
            .all(|w| w[0].submit_time <= w[1].submit_time),
        "{name}"
    );
    for (i, j) in jobs.iter().enumerate() {
        assert_eq!(j.id.0 as usize, i, "{name}");
        assert!(j.validate().is_ok(), "{name}: {:?}", j.validate());
    }
}

fn gpu_histogram(jobs: &[Job]) -> BTreeMap<u32, usize> {
    let mut histogram = BTreeMap::new();
    for j in jobs {
        *histogram.entry(j.gpu_count()).or_insert(0) += 1;
    }
    histogram
}

#[test]
fn pollux_workloads_are_bundled_and_span_eight_hours() {
    let names: Vec<_> = TRACE_NAMES
        .iter()
        .filter(|n| n.starts_with("pollux-"))
        .collect();
    assert_eq!(names.len(), 40);
    for name in names {
        let (jobs, report) = load_trace(name, &GpuCatalog::default()).unwrap();
        assert_eq!(report.rows_skipped, 0, "{report}");
        let expected = match name.split('-').nth(1) {
            Some("0.5x") => 80,
            Some("1.5x") => 240,
            Some("2.0x") => 320,
            _ => 160,
        };
        assert_eq!(jobs.len(), expected, "{name}");
        assert_well_formed(name, &jobs);
        // "8 workloads x 160 jobs over 8 h".
        assert!(jobs.last().unwrap().submit_time < 8.0 * 3600.0, "{name}");
        assert!(jobs.iter().all(|j| j.total_work == 0.0), "{name}");
        let apps: BTreeSet<_> = jobs
            .iter()
            .map(|j| j.name.split('-').next().unwrap())
            .collect();
        assert!(
            apps.is_subset(&BTreeSet::from([
                "bert",
                "cifar10",
                "deepspeech2",
                "imagenet",
                "ncf",
                "yolov3"
            ])),
            "{name}: {apps:?}"
        );
    }
}

#[test]
fn itp_bundled_traces_match_the_published_line_counts() {
    // SOURCE.md: lines per file, a header included.
    let expected = [
        ("itp-195job", 195),
        ("itp-cluster01", 1_595),
        ("itp-cluster02", 5_778),
        ("itp-cluster03", 3_011),
        ("itp-cluster05", 3_629),
        ("itp-cluster06", 2_396),
        ("itp-cluster10", 260),
    ];
    for (name, count) in expected {
        assert!(TRACE_NAMES.contains(&name));
        let (jobs, report) = load_trace(name, &GpuCatalog::default()).unwrap();
        assert_eq!(
            (report.rows_read, report.rows_skipped),
            (count, 0),
            "{name}"
        );
        assert_eq!(jobs.len(), count);
        assert_well_formed(name, &jobs);
        assert!(
            jobs.iter()
                .all(|j| j.total_work > 0.0 && j.gpu == GpuDemand::Whole(1))
        );
    }
    let (testbed, _) = load_trace("itp-195job", &GpuCatalog::default()).unwrap();
    assert_eq!(
        gpu_histogram(&testbed),
        BTreeMap::from([(1, 118), (2, 1), (4, 45), (8, 28), (16, 3)])
    );
    assert!(testbed[0].name.starts_with("deepspeech2-"));
}

#[test]
fn itp_traces_from_the_traces_directory_total_56652_jobs() {
    let mut total = 0;
    for name in UNBUNDLED_TRACE_NAMES
        .iter()
        .filter(|n| n.starts_with("itp-raw-"))
    {
        let Some((jobs, report)) = trace(name) else {
            return;
        };
        assert_eq!(report.rows_skipped, 0, "{report}");
        assert_well_formed(name, &jobs);
        total += jobs.len();
        if *name == "itp-raw-cluster10" {
            // The processed copy keeps the raw jobs, adding a model to their names.
            let (processed, _) = load_trace("itp-cluster10", &GpuCatalog::default()).unwrap();
            assert_eq!(processed.len(), jobs.len());
            for (raw, p) in jobs.iter().zip(&processed) {
                assert!(p.name.ends_with(&format!("-{}", raw.name)), "{}", p.name);
                assert_eq!(
                    (raw.submit_time, raw.workers, raw.total_work),
                    (p.submit_time, p.workers, p.total_work)
                );
            }
        }
    }
    // 9 clusters, 56,652 jobs (cluster07, 12,699 jobs, is withheld).
    assert_eq!(total, 56_652);
    for (name, count) in [
        ("itp-cluster04", 15_802),
        ("itp-cluster08", 13_047),
        ("itp-cluster09", 11_134),
    ] {
        let Some((jobs, report)) = trace(name) else {
            return;
        };
        assert_eq!((jobs.len(), report.rows_skipped), (count, 0), "{name}");
    }
    match load_trace("itp-cluster07", &GpuCatalog::default()) {
        Err(DatasetError::TraceNotFound { file, .. }) => {
            assert_eq!(
                file,
                "microsoft-itp-elasticflow/elasticflow-traces/cluster07.csv"
            );
        }
        other => panic!("cluster07 is withheld: {other:?}"),
    }
}

#[test]
fn sia_workloads_from_the_traces_directory() {
    let names: Vec<_> = UNBUNDLED_TRACE_NAMES
        .iter()
        .filter(|n| n.starts_with("sia-"))
        .collect();
    assert_eq!(names.len(), 10 + 8 + 10 + 5 * 10);
    for name in names {
        let Some((jobs, report)) = trace(name) else {
            return;
        };
        assert_eq!(report.rows_skipped, 0, "{report}");
        let set = name.split('-').nth(1).unwrap();
        let expected = match set {
            "newtrace" => 960,
            "saturn" | "philly" => 160,
            rate => rate.trim_start_matches("rate").parse::<usize>().unwrap() * 8,
        };
        assert_eq!(jobs.len(), expected, "{name}");
        assert_well_formed(name, &jobs);
        let span = if set == "newtrace" { 48.0 } else { 8.0 } * 3600.0;
        assert!(jobs.last().unwrap().submit_time < span, "{name}");
    }
}

#[test]
fn chronus_traces_hold_30940_jobs_of_11_vcs() {
    // Rows with 0 GPUs are skipped (184, 194 and 205 of them).
    for (name, zero_gpu) in [
        ("chronus-mix1", 184),
        ("chronus-mix2", 194),
        ("chronus-slo", 205),
    ] {
        let Some((jobs, report)) = trace(name) else {
            return;
        };
        assert_eq!(report.rows_read, 30_940, "{name}");
        assert_eq!(report.rows_skipped, zero_gpu, "{report}");
        assert!(report.skipped.iter().all(|s| s.field == "num_gpu"));
        assert_well_formed(name, &jobs);
        let vcs: BTreeSet<_> = jobs.iter().map(|j| j.tenant.as_str()).collect();
        assert_eq!(vcs.len(), 11, "{name}");
        // Submissions at minutes 1..20,151 (about 14 days); durations up to 4,317 min.
        assert!(jobs.last().unwrap().submit_time <= 20_150.0 * 60.0);
        let longest = jobs.iter().map(|j| j.total_work).fold(0.0, f64::max);
        assert_eq!(longest, 4_317.0 * 60.0, "{name}");
        if name == "chronus-slo" {
            assert!(
                jobs.iter().all(|j| j.priority == 2),
                "SLO: every job is strict"
            );
        }
    }
}

#[test]
fn chronus_model_info_is_bundled() {
    let (entries, report) = chronus_model_info().unwrap();
    assert_eq!((report.rows_read, report.rows_skipped), (50, 0));
    let models: BTreeSet<_> = entries.iter().map(|e| e.model.as_str()).collect();
    assert_eq!(
        models,
        BTreeSet::from([
            "alexnet",
            "inception_v3",
            "mobilenet_v2",
            "resnet101",
            "vgg16"
        ])
    );
    assert!(
        entries
            .iter()
            .filter(|e| e.nodes == 1)
            .all(|e| e.efficiency == 1.0)
    );
}

#[test]
fn dlrm_trace_has_23871_instances_of_156_apps() {
    let Some((jobs, report)) = trace("dlrm") else {
        return;
    };
    assert_eq!(
        (report.rows_read, report.rows_skipped),
        (23_871, 0),
        "{report}"
    );
    assert_well_formed("dlrm", &jobs);
    let gpu = jobs.iter().filter(|j| j.gpu != GpuDemand::None).count();
    assert_eq!(
        (gpu, jobs.len() - gpu),
        (7_386, 16_485),
        "HN and CN instances"
    );
    let apps: BTreeSet<_> = jobs.iter().map(|j| j.tenant.as_str()).collect();
    assert_eq!(apps.len(), 156);
    // 16,591 rows have a creation time; the other 7,280 were running at the start.
    let at_start = jobs.iter().filter(|j| j.submit_time == 0.0).count();
    assert_eq!(at_start, 23_871 - 16_591);
    assert!(jobs.iter().all(|j| !j.preemptible && j.total_work >= 0.0));
}

#[test]
fn gavel_distribution_is_bundled() {
    let (shapes, report) = gavel_philly_distribution().unwrap();
    assert_eq!((report.rows_read, report.rows_skipped), (33_192, 0));
    let mut gpus = BTreeMap::new();
    for s in &shapes {
        *gpus.entry(s.gpus).or_insert(0) += 1;
    }
    assert_eq!(
        gpus,
        BTreeMap::from([(1, 25_304), (2, 665), (4, 3_076), (8, 4_147)])
    );
    // Durations 1 h .. 60 d.
    let min = shapes.iter().map(|s| s.duration_s).fold(f64::MAX, f64::min);
    let max = shapes.iter().map(|s| s.duration_s).fold(0.0, f64::max);
    assert_eq!(min, 3_600.0);
    assert!((60.0 * 86_400.0..61.0 * 86_400.0).contains(&max), "{max}");
}

#[test]
fn cluster_summaries_are_bundled() {
    let (acme, report) = acme_cluster_summary().unwrap();
    assert_eq!(report.rows_skipped, 0);
    let clusters: Vec<_> = acme.iter().map(|c| c.cluster.as_str()).collect();
    assert_eq!(clusters, vec!["Seren", "Kalos", "Philly", "Helios", "PAI"]);
    assert_eq!(acme[2].get("job_num"), Some(112_956.0));
    assert_eq!(acme[2].get("max_gpu"), Some(128.0));
    assert_eq!(
        acme[2].get("avg_run_time_cpu"),
        None,
        "Philly ran no CPU jobs"
    );

    let (helios, report) = helios_cluster_summary().unwrap();
    assert_eq!(report.rows_skipped, 0);
    let total = helios.iter().find(|c| c.cluster == "total").unwrap();
    // 3.36 M jobs on 6,220 GPUs, the sum of the four clusters.
    assert_eq!(total.get("job_num"), Some(3_362_981.0));
    assert_eq!(total.get("gpu_num"), Some(6_220.0));
    let sum = |column| {
        helios
            .iter()
            .filter(|c| c.cluster != "total")
            .map(|c| c.get(column).unwrap())
            .sum::<f64>()
    };
    assert_eq!(sum("job_num"), 3_362_981.0);
    // The published file's GPU total is 2 above its clusters' sum (1,022 + 997 + 2,080 +
    // 2,119); kept as published.
    assert_eq!(sum("gpu_num"), 6_218.0);
    // Acme's Helios row agrees with Helios' own total.
    assert_eq!(acme[3].get("job_num"), total.get("job_num"));
}

#[test]
fn occupancy_series_from_the_traces_directory() {
    if let Some((philly, report)) = from_traces_dir("philly-nodes", load_occupancy("philly-nodes"))
    {
        // Per minute from 2017-10-03 00:00 to 2017-12-15 18:42 UTC; the total is 420
        // nodes but for two days at 552 (all machines) and an hour at 174.
        assert_eq!((report.rows_read, report.rows_skipped), (105_644, 0));
        assert_eq!(philly.unit, OccupancyUnit::Nodes);
        assert_eq!(philly.points[0].time, 1_506_988_800);
        assert_eq!(philly.points.last().unwrap().time, 1_513_363_320);
        let mut totals = BTreeMap::new();
        for p in &philly.points {
            *totals.entry(p.total).or_insert(0) += 1;
        }
        assert_eq!(
            totals,
            BTreeMap::from([(174, 60), (420, 102_704), (552, 2_880)])
        );
    }
    assert_eq!(OCCUPANCY_NAMES.len(), 17);
    if let Some((vc, report)) = from_traces_dir("helios-vc3sl", load_occupancy("helios-vc3sl")) {
        // Per minute through May 2020: 44,640 rows; the VC has 64 GPUs.
        assert_eq!((report.rows_read, report.rows_skipped), (44_640, 0));
        assert!(report.source.ends_with("cluster_sequence_vc.csv.gz"));
        assert_eq!(vc.unit, OccupancyUnit::Gpus);
        assert_eq!(vc.points[0].time, 1_588_291_200);
        assert_eq!((vc.points[0].active, vc.points[0].total), (59, 64));
        assert_eq!(vc.points[44_639].time - vc.points[0].time, 44_639 * 60);
    }
    // Not a VC name, so a path (relative to the current directory), never joined to the
    // traces directory.
    let err = load_occupancy("helios-../../etc").unwrap_err();
    assert!(
        matches!(&err, DatasetError::Io { path, .. } if path.to_str() == Some("helios-../../etc")),
        "{err}"
    );
    let err = load_occupancy("nope").unwrap_err();
    assert!(err.to_string().contains("philly-nodes"), "{err}");
}

#[test]
fn pai_batch_times_from_the_traces_directory() {
    for (name, rows) in PAI_BATCH_TIME_NAMES
        .iter()
        .zip([3_000, 2_402, 2_489, 21_829])
    {
        let Some((samples, report)) = from_traces_dir(name, load_pai_batch_times(name)) else {
            return;
        };
        assert_eq!((report.rows_read, report.rows_skipped), (rows, 0), "{name}");
        let workers: BTreeSet<_> = samples.iter().map(|s| s.worker).collect();
        assert_eq!(workers.len(), 10, "{name}");
        let slowest = samples
            .iter()
            .map(|s| s.batch_time_norm)
            .fold(0.0, f64::max);
        assert_eq!(slowest, 1000.0, "{name}");
    }
    let err = load_pai_batch_times("pai-job0").unwrap_err();
    assert!(matches!(err, DatasetError::UnknownName { .. }), "{err}");
}
