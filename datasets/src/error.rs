//! The one error type of the crate. Every variant names the file (or the name asked for),
//! so that a CLI can print it as is.

use std::path::PathBuf;

use crate::report::SkippedRow;

#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    /// A problem that makes the whole file unusable: a missing or unknown header, an empty
    /// file. `line` is 1-based; `field` is the column (or `header`) at fault.
    #[error("{file}, line {line}, field `{field}`: {reason}")]
    Malformed {
        file: String,
        line: usize,
        field: String,
        reason: String,
    },
    /// Every data row was skipped (or there were none).
    #[error("{file}: no valid rows ({rows_skipped} skipped{})", first_reason(.first.as_ref()))]
    NoValidRows {
        file: String,
        rows_skipped: usize,
        first: Option<SkippedRow>,
    },
    /// A cluster file that parsed but does not describe a valid cluster (or a TOML error).
    #[error("{file}: invalid cluster: {reason}")]
    InvalidCluster { file: String, reason: String },
    #[error("cannot read {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "unknown trace {name:?}; known traces: {}; also openb-<variant> for any \
         openb_pod_list_<variant>.csv in the traces directory, or a path to a trace .csv",
        .known.join(", ")
    )]
    UnknownTrace { name: String, known: Vec<String> },
    /// Workload enrichment could not assign a kind or work.
    #[error("workload enrichment: {what}: {reason}")]
    Enrichment { what: String, reason: String },
    #[error("synthetic workload: {reason}")]
    InvalidSynthetic { reason: String },
    #[error("job {job}: cannot be written as a trace: {reason}")]
    Unrepresentable { job: String, reason: String },
    /// An unknown name for a non-job dataset (`kind`: an occupancy series, PAI batch
    /// times, …).
    #[error("unknown {kind} {name:?}; known: {}; or a path to a file", .known.join(", "))]
    UnknownName {
        kind: &'static str,
        name: String,
        known: Vec<String>,
    },
    #[error(
        "unknown cluster {name:?}; known presets: {}; or a path to a .toml cluster spec or \
         an openb-style node-list .csv",
        .known.join(", ")
    )]
    UnknownCluster { name: String, known: Vec<String> },
    /// A trace that is not bundled and was not found in the traces directory. `file` is
    /// its path relative to that directory.
    #[error(
        "trace {name:?} is not bundled and {file} was not found in {}; set \
         MARSHAL_TRACES_DIR to the directory holding the trace folders \
         (alibaba-openb-v2023/, sia-workloads/, …)",
        display_paths(.searched)
    )]
    TraceNotFound {
        name: String,
        file: String,
        searched: Vec<PathBuf>,
    },
}

fn first_reason(first: Option<&SkippedRow>) -> String {
    match first {
        Some(row) => format!("; first: {row}"),
        None => String::new(),
    }
}

fn display_paths(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
