//! The crate's error type.
//!
//! Every variant names what was being done (a file path, a column, an NVML call) so a
//! message read in a log is enough to find the problem without a backtrace.

use std::path::PathBuf;

/// Everything that can go wrong in `marshal-telemetry`.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// A file-system operation failed.
    #[error("I/O error while {action} {path}: {source}")]
    Io {
        /// What was being done ("creating", "renaming", …).
        action: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// The Parquet library rejected a file (unreadable footer, corrupt page, …).
    #[error("Parquet error in {path}: {source}")]
    Parquet {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: parquet::errors::ParquetError,
    },

    /// An Arrow operation failed (building or decoding a record batch).
    #[error("Arrow error while {context}: {source}")]
    Arrow {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: arrow_schema::ArrowError,
    },

    /// A record batch or file does not have the columns or types this crate expects.
    #[error("schema mismatch in {context}: {reason}")]
    Schema {
        /// Where the mismatch was found (a file path or "record batch").
        context: String,
        /// What is wrong.
        reason: String,
    },

    /// A file was written by a schema version this build does not read: a newer or
    /// unknown one, or (for `gpu` files) version 1, whose units version 2 changed.
    #[error(
        "unsupported telemetry schema version {found:?} in {path} (this build reads {kind} files of versions {oldest}..={supported}{note})"
    )]
    SchemaVersion {
        /// The file involved.
        path: PathBuf,
        /// The version stored in the file, if any was found.
        found: Option<String>,
        /// The kind of rows the file holds, if its metadata says (`?` otherwise).
        kind: String,
        /// The oldest version this build reads for that kind.
        oldest: u32,
        /// The newest version this build reads.
        supported: u32,
        /// Why an old version is refused, if that is the case.
        note: &'static str,
    },

    /// NVML (the NVIDIA driver library) cannot be used on this machine.
    #[error("NVML is unavailable: {0}")]
    NvmlUnavailable(String),

    /// An NVML call that has to succeed failed.
    #[error("NVML call {call} failed: {source}")]
    Nvml {
        /// The wrapper function that failed.
        call: &'static str,
        /// The underlying error.
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },

    /// A query asked for something that cannot be answered.
    #[error("invalid query: {0}")]
    InvalidQuery(String),

    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// The sink's writer thread has stopped; nothing more can be sent.
    #[error("telemetry sink for {root} is closed: {reason}")]
    SinkClosed {
        /// The sink's root directory.
        root: PathBuf,
        /// Why it is closed.
        reason: String,
    },

    /// The file system refuses the sink's writes (a full disk, an unwritable
    /// directory): rows it accepted wait in memory and are written once it takes them.
    #[error("telemetry sink for {root}: {rows} rows are not in published files yet: {reason}")]
    SinkStalled {
        /// The sink's root directory.
        root: PathBuf,
        /// Rows accepted and not yet published.
        rows: u64,
        /// The file system's last refusal.
        reason: String,
    },
}

impl TelemetryError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn parquet(path: impl Into<PathBuf>, source: parquet::errors::ParquetError) -> Self {
        Self::Parquet {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn arrow(context: impl Into<String>, source: arrow_schema::ArrowError) -> Self {
        Self::Arrow {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn schema(context: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Schema {
            context: context.into(),
            reason: reason.into(),
        }
    }
}

/// Shorthand for results in this crate.
pub type Result<T, E = TelemetryError> = std::result::Result<T, E>;
