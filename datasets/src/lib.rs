//! Public GPU-cluster traces as Marshal's domain types: jobs ([`Job`]) and clusters
//! ([`ClusterSpec`]).
//!
//! # What is here
//!
//! Job traces (each row a [`Job`]; all return the jobs and a [`ParseReport`]):
//! - Alibaba openb (v2023, the FGD paper): node lists → [`parse_openb_nodes`], pod lists
//!   (11- and 5-column) → [`parse_openb_pods`]; with the incumbent's scheduled times
//!   (shadow mode) → [`parse_openb_recorded`], [`load_recorded_trace`].
//! - An incumbent's outcomes for a live shadow log (`job,scheduled_time,deletion_time`)
//!   → [`parse_incumbent_outcomes`]; that CSV written from Slurm's `sacct` →
//!   [`parse_sacct`], or from `kubectl get pods -o json` → [`parse_kubectl_pods`], then
//!   [`write_incumbent_outcomes`].
//! - Microsoft Philly (2017, Pollux's copy): jobs → [`parse_philly`], 7-day windows →
//!   [`philly_window`], machines → [`philly_cluster`].
//! - Microsoft ITP (ElasticFlow's release, raw and processed) → [`parse_itp`].
//! - Pollux's and Sia's workloads → [`parse_pollux`], [`parse_sia`] (no durations: see
//!   there).
//! - Chronus' Philly-derived SLO traces → [`parse_chronus`]; its per-model scaling
//!   efficiencies → [`parse_chronus_model_info`], [`chronus_model_info`].
//! - Alibaba's disaggregated DLRM serving trace (v2025) → [`parse_dlrm`].
//!
//! Tables that are not jobs:
//! - Gavel's Philly (duration, GPUs) distribution → [`JobShape`]s:
//!   [`parse_gavel_distribution`], [`gavel_philly_distribution`].
//! - Occupancy series (Philly nodes, Helios per-VC GPUs) → [`OccupancySeries`]:
//!   [`parse_occupancy`], [`load_occupancy`].
//! - Per-cluster statistics of Acme and Helios → [`ClusterSummary`]:
//!   [`parse_cluster_summary`], [`acme_cluster_summary`], [`helios_cluster_summary`].
//! - What exists of Alibaba PAI v2020: machines → [`parse_pai_machine_spec`],
//!   [`pai_machine_spec`]; per-worker mini-batch times → [`parse_pai_batch_times`],
//!   [`load_pai_batch_times`]. (Its job tables are not obtainable.)
//!
//! Throughput and profile tables (what the simulator's speed model is calibrated from):
//! - Gavel's throughputs per GPU type × job type × GPU count, alone and co-located →
//!   [`GavelThroughputs`]: [`parse_gavel_throughputs`], [`gavel_throughputs`] (bundled),
//!   [`load_gavel_throughputs`].
//! - Pollux's and Sia's step and sync times by model, GPU type, placement and batch size
//!   → [`PlacementProfiles`]: [`parse_step_profiles`], [`pollux_placement_profiles`]
//!   (bundled, T4), [`load_sia_placement_profiles`], [`load_sia_scalability_profiles`].
//! - Lucid's single-job and co-location profiles → [`LucidProfiles`]:
//!   [`parse_lucid_single`], [`parse_lucid_colocation`], [`load_lucid_profiles`].
//! - Alibaba GenAI per-pod GPU duty cycle and memory series → [`GenAiSeries`]:
//!   [`parse_genai_series`], [`parse_genai_archive`], [`load_genai_series`].
//!
//! Named clusters ([`cluster_preset`], [`CLUSTER_PRESETS`]) and name-or-path resolution
//! for a CLI ([`load_cluster`], [`load_trace`], [`TRACE_NAMES`] bundled,
//! [`UNBUNDLED_TRACE_NAMES`] read from the traces directory).
//!
//! # Design decisions
//!
//! - **Bundled, not fetched.** The files the presets and bundled traces need are compiled
//!   in with `include_str!` (about 7.9 MB; origin and licences in `data/ATTRIBUTION.md`),
//!   so a binary works anywhere and tests never depend on `../shared` existing. Files
//!   whose licence does not allow redistribution (Sia's workloads, the DLRM trace: no
//!   licence) or that are large (Chronus, the big ITP clusters, the occupancy series,
//!   the other openb variants) are read from the traces directory when asked for by
//!   name, with an error saying where they were looked for.
//! - **Skip bad rows, fail bad files.** A row with a malformed field (not a number, NaN,
//!   negative, out of range, an unknown GPU model, …) is skipped and counted in a
//!   [`ParseReport`] with its 1-based line, field and reason, so one bad row in 80,000
//!   does not lose a trace, and nothing is dropped silently. A missing or unknown header,
//!   an empty file or a file with no usable row is a [`DatasetError`] naming the file.
//!   Nothing here panics on input.
//! - **Columns by name.** Columns are found by header name, which is also how the two
//!   openb pod schemas and the trace formats of a file path are told apart.
//! - **Mappings are documented where they happen**: on [`parse_openb_pods`] (GPU shares,
//!   qos → priority/preemption, lifetimes as work), [`parse_philly`] (one worker per GPU,
//!   times rebased), [`philly_cluster`] (Hu et al.'s corrected GPU counts) and on each
//!   newer parser. Job traces that publish a GPU count and a duration all map the same
//!   way: [`Job::whole_gpus`], `total_work` = the duration, jobs sorted by submission
//!   (stable) and numbered in that order, times rebased to the first submission.
//!   A model or application name goes into [`Job::name`] as `<model>-<id>`; a user or
//!   virtual cluster becomes the tenant.
//! - **Compressed files without a dependency.** Helios' series are `.csv.gz` and PAI's
//!   machine spec a `.tar.gz`; a small checked gzip/DEFLATE decoder and tar reader
//!   (`gzip.rs`, CRC-verified, no panics on corrupt input) reads them.
//! - **Published facts are tests.** Node, GPU, pod and job counts the papers and
//!   `SOURCE.md` files state are asserted against the bundled files.
//!
//! # Assumptions (no trace publishes these)
//!
//! - Rack layout: 16 nodes per rack and 8 racks per spine, filled in file order, for openb
//!   and Philly.
//! - NVLink: openb's 8-GPU V100/G2/G3 servers are one NVLink island each; other openb
//!   servers and all Philly servers are PCIe only.
//! - Link bandwidths: V100-era figures (NVLink 2, PCIe Gen3, 100 Gb/s fabric, 2:1 spine)
//!   for openb and Philly; AWS g4dn figures for `pollux-64`.
//! - Philly nodes get 32 cores and 256 GiB, which its jobs (0 CPU, 0 memory) never
//!   constrain.
//! - DLRM: `cpu_request` is in cores and `memory_request` in GiB (the trace states no
//!   units); an instance never deleted lives until the latest time in the file.
//! - Pollux and Sia workloads give no duration: their jobs have `total_work` 0 until
//!   [`WorkloadLibrary::enrich`] assigns work from the application's profiles.

mod bundled;
mod calibrate;
mod chronus;
mod dlrm;
mod error;
mod gavel;
mod gavel_throughputs;
mod genai;
mod gzip;
mod incumbent_export;
mod itp;
mod jobs;
mod links;
mod lucid;
mod measurement_noise;
mod occupancy;
mod openb;
mod outcomes;
mod pai;
mod philly;
mod placement_profiles;
mod pollux;
mod pollux_apps;
mod presets;
mod report;
mod resolve;
mod summary;
mod synthetic;
mod table;
mod workloads;
mod write;

#[cfg(doc)]
use marshal_scheduler::domain::{ClusterSpec, Job};

pub use calibrate::{
    CommFit, CommFitPoint, fit_data_parallel_share, gavel_gpu_classes, predicted_ratio,
};
pub use chronus::{ScalingEfficiency, chronus_model_info, parse_chronus, parse_chronus_model_info};
pub use dlrm::{parse_dlrm, parse_dlrm_recorded};
pub use error::DatasetError;
pub use gavel::{JobShape, gavel_philly_distribution, parse_gavel_distribution};
pub use gavel_throughputs::{
    GAVEL_THROUGHPUT_NAMES, GavelThroughputs, gavel_throughputs, load_gavel_throughputs,
    parse_gavel_throughputs,
};
pub use genai::{
    GenAiMetric, GenAiSeries, PodSeries, PodSummary, load_genai_series, parse_genai_archive,
    parse_genai_series,
};
pub use incumbent_export::{
    IncumbentExport, PodId, WallClock, first_host, parse_kubectl_pods, parse_sacct,
    parse_time_zone, parse_utc_offset, write_incumbent_outcomes,
};
pub use itp::parse_itp;
pub use lucid::{
    LucidJob, LucidPair, LucidProfiles, LucidSingle, load_lucid_profiles, parse_lucid_colocation,
    parse_lucid_single,
};
pub use measurement_noise::{NoiseEstimate, RepeatNoise, neighbour_noise, repeat_noise};
pub use occupancy::{OccupancyPoint, OccupancySeries, OccupancyUnit, parse_occupancy};
pub use openb::{RecordedRun, parse_openb_nodes, parse_openb_pods, parse_openb_recorded};
pub use outcomes::parse_incumbent_outcomes;
pub use pai::{
    BatchTimeSample, PaiMachine, pai_machine_spec, parse_pai_batch_times, parse_pai_machine_spec,
    parse_pai_machine_spec_archive,
};
pub use philly::{parse_philly, philly_cluster, philly_window};
pub use placement_profiles::{
    PlacementProfiles, SIA_GPU_TYPES, SIA_MODELS, StepTimeProfile, load_sia_placement_profiles,
    load_sia_scalability_profiles, parse_step_profiles, pollux_placement_profiles,
    pollux_scalability_profiles,
};
pub use pollux::{parse_pollux, parse_sia};
pub use pollux_apps::{POLLUX_GPUS_PER_NODE, PolluxApps, tight_placement};
pub use presets::{CLUSTER_PRESETS, cluster_preset};
pub use report::{MAX_SKIPPED_DETAILS, ParseReport, SkippedRow};
pub use resolve::{
    MAX_TEXT_FILE_BYTES, OCCUPANCY_NAMES, PAI_BATCH_TIME_NAMES, TRACE_NAMES, UNBUNDLED_TRACE_NAMES,
    load_cluster, load_occupancy, load_pai_batch_times, load_recorded_trace, load_trace,
    read_text_file, trace_gpu_model,
};
pub use summary::{
    ClusterSummary, SUMMARY_COLUMNS, acme_cluster_summary, helios_cluster_summary,
    parse_cluster_summary,
};
pub use synthetic::{Arrivals, SyntheticSpec, synthesize};
pub use table::MAX_TRACE_SECONDS;
pub use workloads::{EnrichReport, POLLUX_KIND_PREFIX, WorkloadLibrary};
pub use write::{TraceFormat, trace_format_for, write_trace};
