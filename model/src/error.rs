//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in this crate. No public function panics on bad input: a NaN
/// feature, a corrupt artifact or an empty training set each come back as one of these.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// An input (feature, target, configuration) is out of its domain. `field` names it
    /// precisely, e.g. `graph[3].gpus[2].values[1] (mem_free_gib)`.
    #[error("invalid input: {field}: {reason}")]
    InvalidInput {
        /// Path of the offending field.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A file an artifact needs is not there.
    #[error("artifact file missing: {}", path.display())]
    MissingFile {
        /// The file that was looked for.
        path: PathBuf,
    },
    /// An artifact file exists but cannot be used (truncated, corrupt, unparsable).
    #[error("artifact file corrupt: {}: {reason}", path.display())]
    CorruptFile {
        /// The unusable file.
        path: PathBuf,
        /// Why it was rejected.
        reason: String,
    },
    /// The artifact was written by an incompatible version of this crate.
    #[error("artifact schema version {found} is not supported (this build reads {expected})")]
    SchemaVersion {
        /// Version found in `meta.json`.
        found: u32,
        /// Version this build reads and writes.
        expected: u32,
    },
    /// The artifact's feature layout differs from this build's.
    #[error("artifact has {found} {kind} features, this build uses {expected}")]
    FeatureCount {
        /// `gpu`, `link` or `job`.
        kind: &'static str,
        /// Count recorded in the artifact.
        found: usize,
        /// Count compiled into this build.
        expected: usize,
    },
    /// The artifact's feature slots mean something else than this build's.
    #[error("artifact {kind} feature layout differs: {detail}")]
    FeatureLayout {
        /// `gpu`, `link`, `job` or `memory-phase`.
        kind: &'static str,
        /// First differing slot.
        detail: String,
    },
    /// Training diverged or produced no usable model.
    #[error("training failed: {0}")]
    Training(String),
    /// A tensor backend operation failed.
    #[error("backend error: {0}")]
    Backend(String),
    /// An artifact has no content digest: a file cannot be read, or an entry is not a
    /// regular file (a symlink or a subdirectory, whose content the digest cannot pin).
    #[error("artifact {}: no content digest: {reason}", path.display())]
    Digest {
        /// The artifact directory or the offending entry.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A promotion signing or public key file cannot be used (missing, unreadable,
    /// malformed, or a private key readable by other users).
    #[error("key file {}: {reason}", path.display())]
    KeyFile {
        /// The key file.
        path: PathBuf,
        /// Why it was refused.
        reason: String,
    },
    /// An I/O error outside the cases above (e.g. the artifact directory is not writable).
    #[error("i/o error at {}: {source}", path.display())]
    Io {
        /// Path being read or written.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// `Result` with [`ModelError`].
pub type Result<T, E = ModelError> = std::result::Result<T, E>;

impl ModelError {
    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidInput {
            field: field.into(),
            reason: reason.into(),
        }
    }
}
