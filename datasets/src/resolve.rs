//! Turning what a user types (a bundled name, a preset, a path) into jobs or a cluster.

use std::path::{Path, PathBuf};

use marshal_scheduler::domain::{ClusterSpec, GpuCatalog, Job};

use crate::bundled::{Bundled, OPENB_PODS_DEFAULT, OPENB_PODS_MULTIGPU20, PHILLY_JOBS};
use crate::table::{Table, malformed};
use crate::{
    CLUSTER_PRESETS, DatasetError, ParseReport, cluster_preset, parse_openb_nodes,
    parse_openb_pods, parse_philly, philly_window,
};

/// Bundled traces [`load_trace`] knows by name. `philly-week<k>` is the k-th 7-day window
/// of the Philly trace, counted from its first submission.
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
];

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
/// - a path to a CSV whose header says what it is: an openb pod list (11 or 5 columns) or
///   the Philly job list.
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
    if looks_like_path(arg) {
        return load_trace_file(Path::new(arg), catalog);
    }
    Err(unknown_trace(arg))
}

/// Loads a cluster: a name in [`CLUSTER_PRESETS`], or a path to a `.toml` cluster spec or
/// an openb-style node-list `.csv` (rows the parser skips are dropped; call
/// [`parse_openb_nodes`] to see them). A file with another extension is read as a node
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
    let text = read(path)?;
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
        return parse_openb_nodes(&file, &text).map(|(spec, _)| spec);
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
        known: TRACE_NAMES.iter().map(ToString::to_string).collect(),
    }
}

/// Variant names become file names: letters, digits, `_` and `-` only.
fn is_variant_name(variant: &str) -> bool {
    !variant.is_empty()
        && variant
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn looks_like_path(arg: &str) -> bool {
    arg.contains(['/', '\\'])
        || arg.to_ascii_lowercase().ends_with(".csv")
        || Path::new(arg).exists()
}

fn read(path: &Path) -> Result<String, DatasetError> {
    std::fs::read_to_string(path).map_err(|source| DatasetError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Where unbundled traces are looked for, in order.
fn trace_dirs() -> Vec<PathBuf> {
    if let Some(dir) = std::env::var_os("MARSHAL_TRACES_DIR").filter(|d| !d.is_empty()) {
        return vec![PathBuf::from(dir)];
    }
    vec![
        PathBuf::from("../shared/traces"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces"),
    ]
}

/// Finds `openb_pod_list_<variant>.csv` in `<dir>/alibaba-openb-v2023/` or `<dir>/`.
fn load_openb_variant(
    name: &str,
    variant: &str,
    dirs: &[PathBuf],
    catalog: &GpuCatalog,
) -> Result<(Vec<Job>, ParseReport), DatasetError> {
    let file = format!("openb_pod_list_{variant}.csv");
    for dir in dirs {
        for candidate in [dir.join(OPENB_DIR).join(&file), dir.join(&file)] {
            if candidate.is_file() {
                let text = read(&candidate)?;
                return parse_openb_pods(&candidate.display().to_string(), &text, catalog);
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
                                gpu_milli[,...]) or Philly (timestamp,duration,num_gpus,\
                                gpu_time,cluster) header";

/// Parses a trace file, telling the format from its header.
fn load_trace_file(
    path: &Path,
    catalog: &GpuCatalog,
) -> Result<(Vec<Job>, ParseReport), DatasetError> {
    let text = read(path)?;
    let file = path.display().to_string();
    let probe = Table::open(&file, &text, ANY_TRACE_HEADER)?;
    if probe.has("timestamp") && probe.has("num_gpus") {
        parse_philly(&file, &text)
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
