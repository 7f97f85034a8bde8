//! Turning what a user types (a bundled name, a preset, a path) into jobs or a cluster.

use std::path::{Path, PathBuf};

use marshal_scheduler::domain::{ClusterSpec, GpuCatalog, Job};

use crate::bundled::{
    Bundled, ITP_PROCESSED, OPENB_PODS_DEFAULT, OPENB_PODS_MULTIGPU20, PHILLY_JOBS,
    POLLUX_WORKLOADS,
};
use crate::gzip::gunzip;
use crate::table::{Table, malformed, not_utf8};
use crate::{
    BatchTimeSample, CLUSTER_PRESETS, DatasetError, OccupancySeries, ParseReport, RecordedRun,
    cluster_preset, parse_chronus, parse_dlrm, parse_dlrm_recorded, parse_itp, parse_occupancy,
    parse_openb_nodes, parse_openb_pods, parse_openb_recorded, parse_pai_batch_times, parse_philly,
    parse_pollux, parse_sia, philly_window,
};

/// Bundled traces [`load_trace`] knows by name:
/// - `philly-week<k>` is the k-th 7-day window of the Philly trace, counted from its
///   first submission;
/// - `pollux-<k>` is Pollux's `workloads/workload-<k>.csv` (k = 1..=8, 160 jobs at the
///   paper's 1.0× job load); `pollux-<load>x-<k>` the 0.5×, 1.5× and 2.0× load variants
///   and `pollux-realistic-<k>` the one with user-chosen (smaller) GPU counts;
/// - `itp-195job` is ElasticFlow's 128-GPU testbed trace and `itp-cluster<NN>` its
///   processed copy of ITP cluster NN (those under 0.5 MB are bundled).
pub const TRACE_NAMES: &[&str] = &[
    "openb-default",
    "openb",
    "openb-multigpu20",
    "philly",
    "philly-week0",
    "philly-week1",
    "philly-week2",
    "philly-week3",
    "philly-week4",
    "philly-week5",
    "philly-week6",
    "philly-week7",
    "philly-week8",
    "philly-week9",
    "philly-week10",
    "philly-week11",
    "philly-week12",
    "philly-week13",
    "philly-week14",
    "philly-week15",
    "pollux-1",
    "pollux-2",
    "pollux-3",
    "pollux-4",
    "pollux-5",
    "pollux-6",
    "pollux-7",
    "pollux-8",
    "pollux-0.5x-1",
    "pollux-0.5x-2",
    "pollux-0.5x-3",
    "pollux-0.5x-4",
    "pollux-0.5x-5",
    "pollux-0.5x-6",
    "pollux-0.5x-7",
    "pollux-0.5x-8",
    "pollux-1.5x-1",
    "pollux-1.5x-2",
    "pollux-1.5x-3",
    "pollux-1.5x-4",
    "pollux-1.5x-5",
    "pollux-1.5x-6",
    "pollux-1.5x-7",
    "pollux-1.5x-8",
    "pollux-2.0x-1",
    "pollux-2.0x-2",
    "pollux-2.0x-3",
    "pollux-2.0x-4",
    "pollux-2.0x-5",
    "pollux-2.0x-6",
    "pollux-2.0x-7",
    "pollux-2.0x-8",
    "pollux-realistic-1",
    "pollux-realistic-2",
    "pollux-realistic-3",
    "pollux-realistic-4",
    "pollux-realistic-5",
    "pollux-realistic-6",
    "pollux-realistic-7",
    "pollux-realistic-8",
    "itp-195job",
    "itp-cluster01",
    "itp-cluster02",
    "itp-cluster03",
    "itp-cluster05",
    "itp-cluster06",
    "itp-cluster10",
];

/// Traces [`load_trace`] knows by name that are not bundled (their licence forbids it, or
/// they are large): read from the traces directory when asked for.
/// - `itp-cluster<NN>` (the large processed clusters) and `itp-raw-cluster<NN>`
///   (`microsoft-itp-elasticflow/{elasticflow,raw}-traces/cluster<NN>.csv`; cluster07 is
///   withheld);
/// - `sia-<set>-<k>` (`sia-workloads/<set>/workload-<k>.csv`, set = `saturn`, `philly`,
///   `newtrace`) and `sia-rate<r>-<k>` (`sia-workloads/scale/rate_<r>/workload-<k>.csv`);
/// - `chronus-mix1`, `chronus-mix2`, `chronus-slo`
///   (`chronus-philly/trace_job_Philly_{MIX1,MIX2,SLO}.csv`);
/// - `dlrm` (`alibaba-dlrm-v2025/disaggregated_DLRM_trace.csv`).
pub const UNBUNDLED_TRACE_NAMES: &[&str] = &[
    "itp-cluster04",
    "itp-cluster08",
    "itp-cluster09",
    "itp-raw-cluster01",
    "itp-raw-cluster02",
    "itp-raw-cluster03",
    "itp-raw-cluster04",
    "itp-raw-cluster05",
    "itp-raw-cluster06",
    "itp-raw-cluster08",
    "itp-raw-cluster09",
    "itp-raw-cluster10",
    "sia-saturn-1",
    "sia-saturn-2",
    "sia-saturn-3",
    "sia-saturn-4",
    "sia-saturn-5",
    "sia-saturn-6",
    "sia-saturn-7",
    "sia-saturn-8",
    "sia-saturn-9",
    "sia-saturn-10",
    "sia-philly-1",
    "sia-philly-2",
    "sia-philly-3",
    "sia-philly-4",
    "sia-philly-5",
    "sia-philly-6",
    "sia-philly-7",
    "sia-philly-8",
    "sia-newtrace-1",
    "sia-newtrace-2",
    "sia-newtrace-3",
    "sia-newtrace-4",
    "sia-newtrace-5",
    "sia-newtrace-6",
    "sia-newtrace-7",
    "sia-newtrace-8",
    "sia-newtrace-9",
    "sia-newtrace-10",
    "sia-rate10-1",
    "sia-rate10-2",
    "sia-rate10-3",
    "sia-rate10-4",
    "sia-rate10-5",
    "sia-rate10-6",
    "sia-rate10-7",
    "sia-rate10-8",
    "sia-rate10-9",
    "sia-rate10-10",
    "sia-rate20-1",
    "sia-rate20-2",
    "sia-rate20-3",
    "sia-rate20-4",
    "sia-rate20-5",
    "sia-rate20-6",
    "sia-rate20-7",
    "sia-rate20-8",
    "sia-rate20-9",
    "sia-rate20-10",
    "sia-rate30-1",
    "sia-rate30-2",
    "sia-rate30-3",
    "sia-rate30-4",
    "sia-rate30-5",
    "sia-rate30-6",
    "sia-rate30-7",
    "sia-rate30-8",
    "sia-rate30-9",
    "sia-rate30-10",
    "sia-rate40-1",
    "sia-rate40-2",
    "sia-rate40-3",
    "sia-rate40-4",
    "sia-rate40-5",
    "sia-rate40-6",
    "sia-rate40-7",
    "sia-rate40-8",
    "sia-rate40-9",
    "sia-rate40-10",
    "sia-rate50-1",
    "sia-rate50-2",
    "sia-rate50-3",
    "sia-rate50-4",
    "sia-rate50-5",
    "sia-rate50-6",
    "sia-rate50-7",
    "sia-rate50-8",
    "sia-rate50-9",
    "sia-rate50-10",
    "chronus-mix1",
    "chronus-mix2",
    "chronus-slo",
    "dlrm",
];

/// Occupancy series [`load_occupancy`] knows by name, all read from the traces
/// directory: `philly-nodes` (`philly-cluster-topology/philly_node_sequence.csv`) and
/// `helios-<vc>` (`helios-sensetime/Earth_vcs/<vc>/cluster_sequence_vc.csv.gz`, the 16
/// virtual clusters of Helios' Earth cluster, May 2020).
pub const OCCUPANCY_NAMES: &[&str] = &[
    "philly-nodes",
    "helios-vc3sl",
    "helios-vc6YE",
    "helios-vc8Sj",
    "helios-vcJLV",
    "helios-vcJkd",
    "helios-vcLJZ",
    "helios-vcMod",
    "helios-vcSoL",
    "helios-vcTJs",
    "helios-vccaA",
    "helios-vcdI0",
    "helios-vcgkz",
    "helios-vchbv",
    "helios-vcira",
    "helios-vcpDC",
    "helios-vcvlY",
];

/// PAI mini-batch-time samples [`load_pai_batch_times`] knows by name, read from the
/// traces directory: `pai-job<k>` is `alibaba-pai-v2020/job_<k>_norm.csv`.
pub const PAI_BATCH_TIME_NAMES: &[&str] = &["pai-job1", "pai-job2", "pai-job3", "pai-job4"];

type JobParser = fn(&str, &str) -> Result<(Vec<Job>, ParseReport), DatasetError>;

/// Where a named job trace comes from.
enum JobSource {
    Bundled(Bundled, JobParser),
    /// A path relative to the traces directory.
    TracesDir(String, JobParser),
}

/// Philly spans 108.9 days: weeks 0..=15.
const PHILLY_WEEKS: u32 = 16;
/// The openb folder under the traces directory.
const OPENB_DIR: &str = "alibaba-openb-v2023";

/// Loads a trace by name or path:
/// - a name in [`TRACE_NAMES`] (`openb` is `openb-default`), parsed from bundled data;
///   for `philly-week<k>` the report is that of the whole file, which the window then
///   filters;
/// - `openb-<variant>` (e.g. `openb-gpushare40`): `openb_pod_list_<variant>.csv` read from
///   the traces directory: `$MARSHAL_TRACES_DIR` if set, else `../shared/traces` from the
///   current directory or from the workspace root;
/// - a name in [`UNBUNDLED_TRACE_NAMES`] (or of the same pattern), read from the traces
///   directory;
/// - a path to a CSV whose header says what it is: an openb pod list (11 or 5 columns),
///   the Philly job list, an ITP trace (raw or processed), a Pollux/Sia workload, a
///   Chronus trace or the DLRM trace.
pub fn load_trace(
    arg: &str,
    catalog: &GpuCatalog,
) -> Result<(Vec<Job>, ParseReport), DatasetError> {
    match arg {
        "openb" | "openb-default" => return openb_pods(OPENB_PODS_DEFAULT, catalog),
        "openb-multigpu20" => return openb_pods(OPENB_PODS_MULTIGPU20, catalog),
        "philly" => return parse_philly(PHILLY_JOBS.name, PHILLY_JOBS.text),
        _ => {}
    }
    if let Some(week) = arg.strip_prefix("philly-week") {
        return match week.parse::<u32>() {
            Ok(k) if k < PHILLY_WEEKS => {
                let (jobs, mut report) = parse_philly(PHILLY_JOBS.name, PHILLY_JOBS.text)?;
                report.source = format!("{} (week {k})", PHILLY_JOBS.name);
                Ok((philly_window(&jobs, 7.0 * k as f64, 7.0), report))
            }
            _ => Err(unknown_trace(arg)),
        };
    }
    if let Some(variant) = arg.strip_prefix("openb-")
        && is_variant_name(variant)
    {
        return load_openb_variant(arg, variant, &trace_dirs(), catalog);
    }
    match job_source(arg) {
        Some(JobSource::Bundled(file, parse)) => return parse(file.name, file.text),
        Some(JobSource::TracesDir(rel, parse)) => {
            let path = find_in_trace_dirs(arg, &rel, &trace_dirs())?;
            let text = read_text_file(&path)?;
            return parse(&path.display().to_string(), &text);
        }
        None => {}
    }
    if looks_like_path(arg) {
        return load_trace_file(Path::new(arg), catalog);
    }
    Err(unknown_trace(arg))
}

/// Loads a recorded log of another scheduler's decisions: an 11-column openb pod list
/// with its `scheduled_time` (and an optional `node` column) by name (`openb`,
/// `openb-default`, `openb-<variant>` from the traces directory) or by path, or Alibaba's
/// DLRM serving trace (`dlrm` from the traces directory, or a path whose header starts
/// with `instance_sn,`; [`parse_dlrm_recorded`]). Other traces record no scheduling
/// times and are an error saying so.
pub fn load_recorded_trace(
    arg: &str,
    catalog: &GpuCatalog,
) -> Result<(Vec<(Job, RecordedRun)>, ParseReport), DatasetError> {
    let (name, text) = match arg {
        "openb" | "openb-default" => (
            OPENB_PODS_DEFAULT.name.to_string(),
            OPENB_PODS_DEFAULT.text.to_string(),
        ),
        _ => {
            let path = match arg.strip_prefix("openb-") {
                Some(variant) if is_variant_name(variant) => {
                    find_openb_variant(arg, variant, &trace_dirs())?
                }
                _ if arg == "dlrm" => find_in_trace_dirs(arg, DLRM_TRACE, &trace_dirs())?,
                _ if looks_like_path(arg) => PathBuf::from(arg),
                _ => {
                    return Err(DatasetError::Malformed {
                        file: arg.to_string(),
                        line: 1,
                        field: "trace".into(),
                        reason: "not a recorded log: give an openb pod list with \
                                 scheduled_time (openb-default, openb-<variant> or a path) \
                                 or the DLRM trace (dlrm or a path)"
                            .into(),
                    });
                }
            };
            (path.display().to_string(), read_text_file(&path)?)
        }
    };
    let header = text.trim_start_matches('\u{feff}').trim_start();
    if header.starts_with("instance_sn,") {
        return parse_dlrm_recorded(&name, &text);
    }
    parse_openb_recorded(&name, &text, catalog)
}

/// The DLRM trace's path inside the traces directory.
const DLRM_TRACE: &str = "alibaba-dlrm-v2025/disaggregated_DLRM_trace.csv";

/// Loads a cluster: a name in [`CLUSTER_PRESETS`], or a path to a `.toml` cluster spec or
/// an openb-style node-list `.csv` (a malformed row is an error naming its line, unlike
/// in a trace). A file with another extension is read as a node
/// list if its header starts with `sn,`, else as TOML.
pub fn load_cluster(arg: &str) -> Result<ClusterSpec, DatasetError> {
    if CLUSTER_PRESETS.contains(&arg) {
        return cluster_preset(arg);
    }
    let path = Path::new(arg);
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    if !(ext.is_some() || looks_like_path(arg)) {
        return Err(DatasetError::UnknownCluster {
            name: arg.to_string(),
            known: CLUSTER_PRESETS.iter().map(ToString::to_string).collect(),
        });
    }
    let text = read_text_file(path)?;
    let file = path.display().to_string();
    let is_csv = match ext.as_deref() {
        Some("csv") => true,
        Some("toml") => false,
        _ => text
            .trim_start_matches('\u{feff}')
            .trim_start()
            .starts_with("sn,"),
    };
    if is_csv {
        // A trace may lose a bad row; a cluster may not lose a node: the scheduler
        // would place onto a smaller cluster than the one that exists.
        let (spec, report) = parse_openb_nodes(&file, &text)?;
        if let Some(first) = report.skipped.first() {
            return Err(DatasetError::InvalidCluster {
                reason: format!(
                    "{} of {} node rows are malformed, the first at {first}",
                    report.rows_skipped, report.rows_read
                ),
                file,
            });
        }
        return Ok(spec);
    }
    ClusterSpec::from_toml(&text).map_err(|e| DatasetError::InvalidCluster {
        file,
        reason: e.to_string(),
    })
}

fn openb_pods(
    file: Bundled,
    catalog: &GpuCatalog,
) -> Result<(Vec<Job>, ParseReport), DatasetError> {
    parse_openb_pods(file.name, file.text, catalog)
}

fn unknown_trace(name: &str) -> DatasetError {
    DatasetError::UnknownTrace {
        name: name.to_string(),
        known: TRACE_NAMES
            .iter()
            .chain(UNBUNDLED_TRACE_NAMES)
            .map(ToString::to_string)
            .collect(),
    }
}

/// `k` as a 0-based index if it is a decimal in `1..=n`.
fn one_based(k: &str, n: usize) -> Option<usize> {
    if !(1..=2).contains(&k.len()) || !k.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let k: usize = k.parse().ok()?;
    (1..=n).contains(&k).then(|| k - 1)
}

fn is_number(s: &str) -> bool {
    !s.is_empty() && s.len() <= 3 && s.bytes().all(|b| b.is_ascii_digit())
}

/// Resolves the names of [`TRACE_NAMES`] (other than openb and Philly) and of
/// [`UNBUNDLED_TRACE_NAMES`], and names of the same patterns (e.g. `sia-rate60-1`, which
/// then may not be found). Only digits and known words reach a path.
fn job_source(name: &str) -> Option<JobSource> {
    if let Some(rest) = name.strip_prefix("pollux-") {
        let (set, k) = rest.rsplit_once('-').unwrap_or(("", rest));
        let folder = match set {
            "" => "workloads",
            "0.5x" => "workloads-0.5",
            "1.5x" => "workloads-1.5",
            "2.0x" => "workloads-2.0",
            "realistic" => "workloads-realistic",
            _ => return None,
        };
        let k = one_based(k, 8)?;
        let (_, files) = POLLUX_WORKLOADS.iter().find(|(f, _)| *f == folder)?;
        return Some(JobSource::Bundled(files[k], parse_pollux));
    }
    if let Some(rest) = name.strip_prefix("itp-") {
        if rest == "195job" {
            return Some(JobSource::Bundled(ITP_PROCESSED[0], parse_itp));
        }
        let (raw, cluster) = match rest.strip_prefix("raw-") {
            Some(cluster) => (true, cluster),
            None => (false, rest),
        };
        let nn = cluster.strip_prefix("cluster")?;
        if nn.len() != 2 || !is_number(nn) {
            return None;
        }
        let file = format!("cluster{nn}.csv");
        let folder = if raw {
            "raw-traces"
        } else {
            "elasticflow-traces"
        };
        if !raw
            && let Some(bundled) = ITP_PROCESSED
                .iter()
                .find(|b| b.name.ends_with(&format!("/{file}")))
        {
            return Some(JobSource::Bundled(*bundled, parse_itp));
        }
        return Some(JobSource::TracesDir(
            format!("microsoft-itp-elasticflow/{folder}/{file}"),
            parse_itp,
        ));
    }
    if let Some(rest) = name.strip_prefix("sia-") {
        let (set, k) = rest.rsplit_once('-')?;
        if !is_number(k) || k.starts_with('0') {
            return None;
        }
        let folder = match set {
            "saturn" | "philly" | "newtrace" => set.to_string(),
            _ => {
                let rate = set.strip_prefix("rate").filter(|r| is_number(r))?;
                format!("scale/rate_{rate}")
            }
        };
        return Some(JobSource::TracesDir(
            format!("sia-workloads/{folder}/workload-{k}.csv"),
            parse_sia,
        ));
    }
    let (rel, parse): (&str, JobParser) = match name {
        "chronus-mix1" => ("chronus-philly/trace_job_Philly_MIX1.csv", parse_chronus),
        "chronus-mix2" => ("chronus-philly/trace_job_Philly_MIX2.csv", parse_chronus),
        "chronus-slo" => ("chronus-philly/trace_job_Philly_SLO.csv", parse_chronus),
        "dlrm" => (DLRM_TRACE, parse_dlrm),
        _ => return None,
    };
    Some(JobSource::TracesDir(rel.to_string(), parse))
}

/// Loads an occupancy series: a name in [`OCCUPANCY_NAMES`] (or `helios-<vc>` for another
/// VC folder), read from the traces directory, or a path to a `.csv` or `.csv.gz`.
pub fn load_occupancy(arg: &str) -> Result<(OccupancySeries, ParseReport), DatasetError> {
    let rel = if arg == "philly-nodes" {
        Some("philly-cluster-topology/philly_node_sequence.csv".to_string())
    } else {
        arg.strip_prefix("helios-")
            .filter(|vc| is_variant_name(vc))
            .map(|vc| format!("helios-sensetime/Earth_vcs/{vc}/cluster_sequence_vc.csv.gz"))
    };
    let path = match rel {
        Some(rel) => find_in_trace_dirs(arg, &rel, &trace_dirs())?,
        None if looks_like_path(arg) || arg.ends_with(".gz") => PathBuf::from(arg),
        None => return Err(unknown_name("occupancy series", arg, OCCUPANCY_NAMES)),
    };
    let text = read_maybe_gzip(&path)?;
    parse_occupancy(&path.display().to_string(), &text)
}

/// Loads the mini-batch times of a PAI job: a name in [`PAI_BATCH_TIME_NAMES`], read from
/// the traces directory, or a path.
pub fn load_pai_batch_times(
    arg: &str,
) -> Result<(Vec<BatchTimeSample>, ParseReport), DatasetError> {
    let path = match arg.strip_prefix("pai-job").and_then(|k| one_based(k, 99)) {
        Some(k) => find_in_trace_dirs(
            arg,
            &format!("alibaba-pai-v2020/job_{}_norm.csv", k + 1),
            &trace_dirs(),
        )?,
        None if looks_like_path(arg) => PathBuf::from(arg),
        None => return Err(unknown_name("PAI job", arg, PAI_BATCH_TIME_NAMES)),
    };
    let text = read_text_file(&path)?;
    parse_pai_batch_times(&path.display().to_string(), &text)
}

pub(crate) fn unknown_name(kind: &'static str, name: &str, known: &[&str]) -> DatasetError {
    DatasetError::UnknownName {
        kind,
        name: name.to_string(),
        known: known.iter().map(ToString::to_string).collect(),
    }
}

/// Variant names become file names: letters, digits, `_` and `-` only.
fn is_variant_name(variant: &str) -> bool {
    !variant.is_empty()
        && variant
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

pub(crate) fn looks_like_path(arg: &str) -> bool {
    arg.contains(['/', '\\'])
        || arg.to_ascii_lowercase().ends_with(".csv")
        || Path::new(arg).exists()
}

/// Largest text input read whole, in bytes: far above any trace or export seen, and a
/// bound on what a stream that never ends (a FIFO fed forever) can take.
pub const MAX_TEXT_FILE_BYTES: u64 = 8 << 30;

/// Reads a text input (a trace, an outcomes export, a shadow log) as UTF-8.
///
/// - A device (`/dev/zero`, a disk) is refused before it is read; FIFOs and process
///   substitution (`<(zcat trace.csv.gz)`) are read, up to [`MAX_TEXT_FILE_BYTES`].
/// - A UTF-8 byte-order mark is dropped; a UTF-16 one (PowerShell's `>` writes UTF-16)
///   is refused as such, and any other byte that is not UTF-8 is named by its line and
///   byte.
pub fn read_text_file(path: &Path) -> Result<String, DatasetError> {
    let bytes = read_bounded(path)?;
    text_from_bytes(&path.display().to_string(), bytes)
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, DatasetError> {
    use std::io::Read as _;
    let io = |source| DatasetError::Io {
        path: path.to_path_buf(),
        source,
    };
    let refuse = |why: String| io(std::io::Error::new(std::io::ErrorKind::InvalidData, why));
    if is_device(&std::fs::metadata(path).map_err(io)?) {
        return Err(refuse("a device, not a file".into()));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .map_err(io)?
        .take(MAX_TEXT_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_TEXT_FILE_BYTES {
        return Err(refuse(format!(
            "more than {MAX_TEXT_FILE_BYTES} bytes, the most a text input may hold"
        )));
    }
    Ok(bytes)
}

#[cfg(unix)]
fn is_device(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::FileTypeExt as _;
    meta.file_type().is_char_device() || meta.file_type().is_block_device()
}

#[cfg(not(unix))]
fn is_device(_: &std::fs::Metadata) -> bool {
    false
}

fn text_from_bytes(file: &str, mut bytes: Vec<u8>) -> Result<String, DatasetError> {
    if bytes.starts_with(&[0xff, 0xfe]) || bytes.starts_with(&[0xfe, 0xff]) {
        return Err(malformed(
            file,
            1,
            "encoding",
            "the file is UTF-16 (it starts with a UTF-16 byte-order mark); it must be UTF-8 \
             text (convert it, e.g. with `iconv -f UTF-16 -t UTF-8`)"
                .to_string(),
        ));
    }
    if bytes.starts_with(b"\xEF\xBB\xBF") {
        bytes.drain(..3);
    }
    String::from_utf8(bytes).map_err(|e| not_utf8(file, e.as_bytes(), e.utf8_error()))
}

/// A text file, decompressed first if its name ends in `.gz`.
fn read_maybe_gzip(path: &Path) -> Result<String, DatasetError> {
    if path.extension().is_none_or(|e| e != "gz") {
        return read_text_file(path);
    }
    let file = path.display().to_string();
    let bytes = read_bounded(path)?;
    let text = gunzip(&bytes).map_err(|reason| malformed(&file, 1, "gzip", reason))?;
    text_from_bytes(&file, text)
}

/// Where unbundled traces are looked for, in order.
pub(crate) fn trace_dirs() -> Vec<PathBuf> {
    if let Some(dir) = std::env::var_os("MARSHAL_TRACES_DIR").filter(|d| !d.is_empty()) {
        return vec![PathBuf::from(dir)];
    }
    vec![
        PathBuf::from("../shared/traces"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces"),
    ]
}

/// The first of `<dir>/<rel>` that is a file, or [`DatasetError::TraceNotFound`].
pub(crate) fn find_in_trace_dirs(
    name: &str,
    rel: &str,
    dirs: &[PathBuf],
) -> Result<PathBuf, DatasetError> {
    dirs.iter()
        .map(|dir| dir.join(rel))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| DatasetError::TraceNotFound {
            name: name.to_string(),
            file: rel.to_string(),
            searched: dirs.to_vec(),
        })
}

/// Finds `openb_pod_list_<variant>.csv` in `<dir>/alibaba-openb-v2023/` or `<dir>/`.
fn load_openb_variant(
    name: &str,
    variant: &str,
    dirs: &[PathBuf],
    catalog: &GpuCatalog,
) -> Result<(Vec<Job>, ParseReport), DatasetError> {
    let path = find_openb_variant(name, variant, dirs)?;
    let text = read_text_file(&path)?;
    parse_openb_pods(&path.display().to_string(), &text, catalog)
}

fn find_openb_variant(
    name: &str,
    variant: &str,
    dirs: &[PathBuf],
) -> Result<PathBuf, DatasetError> {
    let file = format!("openb_pod_list_{variant}.csv");
    for dir in dirs {
        for candidate in [dir.join(OPENB_DIR).join(&file), dir.join(&file)] {
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    Err(DatasetError::TraceNotFound {
        name: name.to_string(),
        file,
        searched: dirs.to_vec(),
    })
}

const ANY_TRACE_HEADER: &str = "an openb pod list (name,cpu_milli,memory_mib,num_gpu,\
                                gpu_milli[,...]), Philly (timestamp,duration,num_gpus,\
                                gpu_time,cluster), ITP (job_id,submission_time,...), \
                                Pollux/Sia (name,time,application,num_replicas,\
                                batch_size), Chronus (job_id,user,num_gpu,submit_time,...) \
                                or DLRM (instance_sn,role,app_name,...) header";

/// Parses a trace file, telling the format from its header.
fn load_trace_file(
    path: &Path,
    catalog: &GpuCatalog,
) -> Result<(Vec<Job>, ParseReport), DatasetError> {
    let text = read_text_file(path)?;
    let file = path.display().to_string();
    let probe = Table::open(&file, &text, ANY_TRACE_HEADER)?;
    if probe.has("timestamp") && probe.has("num_gpus") {
        parse_philly(&file, &text)
    } else if probe.has("job_id") && probe.has("submission_time") {
        parse_itp(&file, &text)
    } else if probe.has("job_id") && probe.has("submit_time") {
        parse_chronus(&file, &text)
    } else if probe.has("application") && probe.has("num_replicas") {
        parse_pollux(&file, &text)
    } else if probe.has("instance_sn") {
        parse_dlrm(&file, &text)
    } else if probe.has("num_gpu") || probe.has("gpu_milli") {
        parse_openb_pods(&file, &text, catalog)
    } else if probe.has("sn") {
        Err(malformed(
            &file,
            1,
            "header",
            "this is a node list (a cluster), not a trace".into(),
        ))
    } else {
        Err(malformed(
            &file,
            1,
            "header",
            format!(
                "unrecognised header `{}`; expected {ANY_TRACE_HEADER}",
                probe.header_line()
            ),
        ))
    }
}

/// The GPU model a bundled trace's durations were measured on, where its source says:
/// ElasticFlow's testbed trace ran on A100s. Philly's GPUs are the reference class of
/// their own catalog entries, and the other traces do not say.
pub fn trace_gpu_model(trace: &str) -> Option<&'static str> {
    match trace {
        "itp-195job" => Some("A100-40"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variant_names_cannot_escape_the_traces_directory() {
        assert!(is_variant_name("gpushare40"));
        assert!(!is_variant_name("../../etc/passwd"));
        assert!(!is_variant_name(""));
    }

    #[test]
    fn every_listed_name_resolves_to_its_source() {
        for name in TRACE_NAMES
            .iter()
            .filter(|n| !n.starts_with("philly") && !n.starts_with("openb"))
        {
            assert!(
                matches!(job_source(name), Some(JobSource::Bundled(..))),
                "{name} should be bundled"
            );
        }
        for name in UNBUNDLED_TRACE_NAMES {
            assert!(
                matches!(job_source(name), Some(JobSource::TracesDir(..))),
                "{name} should be read from the traces directory"
            );
        }
        let rel = |name| match job_source(name) {
            Some(JobSource::TracesDir(rel, _)) => rel,
            Some(JobSource::Bundled(file, _)) => format!("bundled {}", file.name),
            None => "none".into(),
        };
        assert_eq!(rel("pollux-3"), "bundled pollux/workloads/workload-3.csv");
        assert_eq!(
            rel("pollux-2.0x-8"),
            "bundled pollux/workloads-2.0/workload-8.csv"
        );
        assert_eq!(rel("itp-195job"), "bundled elasticflow-traces/195job.csv");
        assert_eq!(
            rel("itp-cluster10"),
            "bundled elasticflow-traces/cluster10.csv"
        );
        assert_eq!(
            rel("itp-raw-cluster10"),
            "microsoft-itp-elasticflow/raw-traces/cluster10.csv"
        );
        assert_eq!(
            rel("sia-rate30-7"),
            "sia-workloads/scale/rate_30/workload-7.csv"
        );
        assert_eq!(
            rel("sia-newtrace-10"),
            "sia-workloads/newtrace/workload-10.csv"
        );
        assert_eq!(
            rel("chronus-slo"),
            "chronus-philly/trace_job_Philly_SLO.csv"
        );
        for bad in [
            "pollux-9",
            "pollux-0",
            "pollux-3x-1",
            "pollux-",
            "itp-cluster1",
            "itp-cluster../",
            "itp-raw-195job",
            "sia-saturn-01",
            "sia-../-1",
            "sia-rate-1",
            "sia-saturn",
            "chronus-mix3",
        ] {
            assert!(job_source(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn names_not_in_the_traces_directory_say_where_they_were_looked_for() {
        let dirs = vec![PathBuf::from("/nonexistent/traces")];
        let err = find_in_trace_dirs("dlrm", "alibaba-dlrm-v2025/x.csv", &dirs).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("\"dlrm\" is not bundled"), "{text}");
        assert!(text.contains("alibaba-dlrm-v2025/x.csv"), "{text}");
        assert!(text.contains("/nonexistent/traces"), "{text}");
        assert!(text.contains("MARSHAL_TRACES_DIR"), "{text}");
    }

    #[test]
    fn missing_variant_names_the_file_and_the_directories_searched() {
        let dirs = vec![PathBuf::from("/nonexistent/traces")];
        let err = load_openb_variant(
            "openb-gpushare40",
            "gpushare40",
            &dirs,
            &GpuCatalog::default(),
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, DatasetError::TraceNotFound { .. }));
        assert!(text.contains("not bundled"), "{text}");
        assert!(text.contains("openb_pod_list_gpushare40.csv"), "{text}");
        assert!(text.contains("/nonexistent/traces"), "{text}");
        assert!(text.contains("MARSHAL_TRACES_DIR"), "{text}");
    }
}
