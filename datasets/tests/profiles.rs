//! The throughput and profile tables against facts read from the raw files and their
//! `SOURCE.md`. Bundled tables are always checked; tables read from the traces directory
//! (`../shared/traces` or `$MARSHAL_TRACES_DIR`) are checked when it is there and skipped
//! with a message otherwise.

use marshal_datasets::{
    GenAiMetric, LucidJob, SIA_GPU_TYPES, gavel_throughputs, load_gavel_throughputs,
    load_genai_series, load_lucid_profiles, load_sia_placement_profiles,
    load_sia_scalability_profiles, neighbour_noise, pollux_placement_profiles, repeat_noise,
};

mod common;
use common::from_traces_dir;

const RN18_16: &str = "ResNet-18 (batch size 16)";

#[test]
fn gavel_simulation_throughputs_are_bundled_and_complete() {
    let (t, report) = gavel_throughputs().unwrap();
    // 83 (job, scale) entries per worker type, 77 for k80_unconsolidated; 10,338
    // co-location values; none invalid.
    assert_eq!((report.rows_read, report.rows_skipped), (492 + 10_338, 0));
    assert_eq!(t.single_count(), 492);
    assert_eq!(t.colocated_count(), 10_338);
    assert_eq!(
        t.gpu_types(),
        vec![
            "k80",
            "k80_unconsolidated",
            "p100",
            "p100_unconsolidated",
            "v100",
            "v100_unconsolidated"
        ]
    );
    let jobs = t.job_types();
    assert_eq!(jobs.len(), 26, "{jobs:?}");
    assert!(jobs.contains(&"A3C") && jobs.contains(&"CycleGAN"));
    assert_eq!(jobs.iter().filter(|j| j.starts_with("LM ")).count(), 5);
    assert_eq!(
        t.scales("v100", "ResNet-50 (batch size 64)"),
        vec![1, 2, 4, 8]
    );
    // Spot values from the raw JSON.
    assert_eq!(t.single("k80", RN18_16, 1), Some(4.795294551566172));
    assert_eq!(
        t.single("v100", "ResNet-50 (batch size 64)", 4),
        Some(9.451949566394442)
    );
    assert_eq!(
        t.single("v100_unconsolidated", "ResNet-50 (batch size 64)", 4),
        Some(11.136430014818272)
    );
    assert_eq!(
        t.single("k80_unconsolidated", "ResNet-50 (batch size 64)", 2),
        None
    );
    assert_eq!(t.single("k80", "ResNet-50 (batch size 128)", 2), Some(0.0));
    assert_eq!(
        t.colocated("k80", RN18_16, "ResNet-18 (batch size 32)"),
        Some((2.539979567443098, 3.1201925448827033))
    );
    assert_eq!(
        t.colocated("k80", "Transformer (batch size 128)", "A3C"),
        Some((0.39990103622805456, 2.043379861825071))
    );
    // Multi-GPU co-locations are all zero in the file.
    assert_eq!(
        t.colocated_scaled("v100", RN18_16, 2, RN18_16, 2),
        Some((0.0, 0.0))
    );
}

#[test]
fn gavel_physical_throughputs_from_the_traces_dir() {
    let Some((t, report)) =
        from_traces_dir("gavel-physical", load_gavel_throughputs("gavel-physical"))
    else {
        return;
    };
    assert_eq!(report.rows_skipped, 0);
    assert_eq!(t.job_types().len(), 26);
    assert_eq!(t.single("k80", RN18_16, 1), Some(4.907044539018749));
}

#[test]
fn sia_placement_profiles_from_the_traces_dir() {
    let (pollux, _) = pollux_placement_profiles().unwrap();
    let Some((t, reports)) = from_traces_dir("sia profiles", load_sia_placement_profiles()) else {
        return;
    };
    // 6 models × 6 GPU types + gpt_pmp's dgx-ext and rtx.
    assert_eq!(reports.len(), 38);
    assert!(reports.iter().all(|r| r.rows_skipped == 0));
    assert_eq!(t.profiles().len(), 16_363);
    assert_eq!(t.models().len(), 7);
    let gpus: Vec<&str> = SIA_GPU_TYPES.iter().map(|g| g.0).collect();
    let mut sorted = gpus.clone();
    sorted.sort_unstable();
    assert_eq!(t.gpu_types("cifar10"), sorted);
    assert_eq!(t.gpu_types("gpt_pmp"), vec!["dgx-ext", "rtx"]);
    // imagenet/placements-dgx-ext.csv line 2.
    let p = t.get("imagenet", "dgx-ext", "1", 20).unwrap();
    assert_eq!(
        (p.step_time_s, p.sync_time_s),
        (0.15168879926204681, 0.0007743360064923763)
    );
    // gpt_pmp/placements-rtx.csv line 2: `1,0.099,0.3275,8`.
    assert_eq!(t.get("gpt_pmp", "rtx", "8", 1).unwrap().step_time_s, 0.099);
    let widest = t.lookup("gpt_pmp", "dgx-ext", "8888888888888888");
    assert!(!widest.is_empty() && widest.iter().all(|p| (p.nodes, p.replicas) == (16, 128)));
    // The `aws` files are the bundled Pollux ones.
    for model in pollux.models() {
        assert_eq!(
            t.profiles()
                .iter()
                .filter(|p| p.model == model && p.gpu_type == "aws")
                .count(),
            pollux
                .profiles()
                .iter()
                .filter(|p| p.model == model)
                .count(),
            "{model}"
        );
    }
}

#[test]
fn sia_scalability_profiles_from_the_traces_dir() {
    let Some((profiles, reports)) =
        from_traces_dir("sia scalability", load_sia_scalability_profiles())
    else {
        return;
    };
    assert_eq!(reports.len(), 38);
    // The `dgx-ext` files repeat (nodes, GPUs, batch) rows, which are skipped as such;
    // every other file parses whole.
    let skipped: Vec<_> = reports
        .iter()
        .filter(|r| r.rows_skipped > 0)
        .map(|r| (&r.source, &r.skipped[0].reason))
        .collect();
    assert!(
        skipped
            .iter()
            .all(|(file, why)| file.ends_with("-dgx-ext.csv") && why.starts_with("repeated")),
        "{skipped:?}"
    );
    assert!(profiles.iter().all(|p| p.placement.is_none()));
    // imagenet/scalability-azure.csv line 2: `20,0.1607…,0.0384…,4,4`.
    let first = profiles
        .iter()
        .find(|p| p.model == "imagenet" && p.gpu_type == "azure")
        .unwrap();
    assert_eq!(
        (
            first.local_bsz,
            first.nodes,
            first.replicas,
            first.step_time_s
        ),
        (20, 4, 4, 0.16073721647262573)
    );
    let widest = |gpu: &str| {
        profiles
            .iter()
            .filter(|p| p.gpu_type == gpu && p.model != "gpt_pmp")
            .map(|p| p.nodes)
            .max()
    };
    assert_eq!(
        (widest("azure"), widest("rtx"), widest("dgx")),
        (Some(5), Some(3), Some(2))
    );
}

#[test]
fn lucid_profiles_from_the_traces_dir() {
    let Some((t, reports)) = from_traces_dir("lucid", load_lucid_profiles()) else {
        return;
    };
    assert!(reports.iter().all(|r| r.rows_skipped == 0), "{reports:?}");
    // SOURCE.md: 66 configurations of 14 models; 1,388 co-located pairs.
    assert_eq!(t.singles.len(), 66);
    assert_eq!(t.models().len(), 14);
    assert_eq!(t.pairs.len(), 1_388);
    assert!(t.pairs.iter().all(|p| p.gpus_a == 1 && p.gpus_b == 1));
    let bert = LucidJob {
        model: "BERT".into(),
        dataset: "SQuAD".into(),
        batch_size: 32,
        amp: false,
    };
    let s = t.single(&bert).unwrap();
    assert_eq!((s.speed, s.gmem_mib, s.label), (84.872, 20162.0, 2));
    let mobilenet = LucidJob {
        model: "MobileNetV3".into(),
        dataset: "ImageNet".into(),
        batch_size: 32,
        amp: false,
    };
    let resnet = LucidJob {
        model: "ResNet18".into(),
        dataset: "CIFAR-10".into(),
        batch_size: 64,
        amp: true,
    };
    // colocate_info.csv row 5.
    assert_eq!(t.colocated(&resnet, &mobilenet), Some((0.819, 0.978)));
}

#[test]
fn genai_series_from_the_traces_dir() {
    const POD: &str = "23b8eba99c14e73d454503a55ae96989";
    let Some((duty, report)) = from_traces_dir(
        "genai duty cycle",
        load_genai_series(GenAiMetric::GpuDutyCycle),
    ) else {
        return;
    };
    // SOURCE.md: 157,417 samples of 143 containers.
    assert_eq!((report.rows_read, report.rows_skipped), (157_417, 0));
    assert_eq!(duty.pods.len(), 143);
    let s = duty.pod(POD).unwrap().summary().unwrap();
    assert_eq!((s.samples, s.start_s), (1441, 1_662_858_720.0));
    assert!((s.mean - 12.223151332852684).abs() < 1e-9, "{s:?}");
    assert_eq!(
        (s.p50, s.p95, s.max),
        (0.0, 77.63333333333334, 97.83333333333331)
    );
    let Some((memory, report)) = from_traces_dir(
        "genai GPU memory",
        load_genai_series(GenAiMetric::GpuMemoryUsedBytes),
    ) else {
        return;
    };
    assert_eq!((report.rows_read, report.rows_skipped), (161_413, 0));
    assert_eq!(memory.pods.len(), 144);
    let m = memory.pod(POD).unwrap().summary().unwrap();
    assert_eq!((m.samples, m.max), (1441, 45_659_193_344.0));
}

/// Sia's `dgx` and `dgx-ext` files measure the same testbed: the rows they share are
/// either copies or repeats, and the repeats differ by a few per cent, less than the
/// roughness between neighbouring batch sizes (which a repeat does not see).
#[test]
fn sia_dgx_repeats_give_a_noise_estimate() {
    let Some((t, _)) = from_traces_dir("sia profiles", load_sia_placement_profiles()) else {
        return;
    };
    let of = |gpu: &str| -> Vec<_> {
        t.profiles()
            .iter()
            .filter(|p| p.gpu_type == gpu && p.model != "gpt_pmp")
            .cloned()
            .collect()
    };
    let (dgx, ext) = (of("dgx"), of("dgx-ext"));
    let repeats = repeat_noise(&dgx, &ext);
    let e = repeats.estimate.unwrap();
    assert!(repeats.copies > 500 && e.residuals > 1000, "{repeats:?}");
    assert!((0.005..0.05).contains(&e.mean_abs_error), "{e:?}");
    let smooth = neighbour_noise(&dgx).unwrap();
    assert!(
        smooth.mean_abs_error > e.mean_abs_error,
        "{smooth:?} vs {e:?}"
    );
    // The same pairs the other way round give the same estimate.
    let back = repeat_noise(&ext, &dgx).estimate.unwrap();
    assert!((back.mean_abs_error / e.mean_abs_error - 1.0).abs() < 0.05);
}
