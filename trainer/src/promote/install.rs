//! Installing a promoted artifact without ever showing a reader (`marshal serve`'s poll,
//! which fingerprints the directory's files and reloads when they change) a half-written
//! one.
//!
//! 1. The candidate's files are copied into a hidden sibling of the current directory
//!    (`.<name>.incoming-<pid>`, same file system), synced, and the copy is loaded and
//!    its fingerprint compared with the candidate's: a copy that differs is removed and
//!    nothing changes.
//! 2. The copy and the current directory are swapped in one `renameat2(RENAME_EXCHANGE)`
//!    (Linux), so the current path always names a complete artifact; the old one, now
//!    under the hidden name, is renamed to `<name>.prev` (replacing an older `.prev`) for
//!    rollback. Where the exchange is not available (another OS, a file system without
//!    it) the old directory is renamed to `<name>.prev` and the copy into place: for that
//!    instant the path is missing, which a poll reports as a rejected reload and the next
//!    poll repairs. Without a current directory the copy is simply renamed into place.
//! 3. `promotion.json` ([`write_record`]) goes beside the artifact, as `<name>.promotion.json`
//!    ([`marshal_model::policy::promotion_record_path`]), so that the artifact's own files
//!    (and its fingerprint) are the candidate's exactly. [`super::promote`] writes it
//!    under a pending name before the swap and renames it into place after
//!    ([`marshal_model::policy::pending_record_path`]), and keeps the replaced artifact's
//!    record with it (`<name>.prev.promotion.json`), so a rollback moves both. The
//!    directory is synced after the renames.

use std::fs;
use std::path::{Path, PathBuf};

use marshal_model::policy::{
    artifact_fingerprint, load_policy, promotion_record_path, replace_file, sync_dir,
};

use super::{PromoteError, PromotionRecord};

/// `<current>.prev`: the replaced artifact, kept for rollback.
pub const PREV_SUFFIX: &str = ".prev";

fn sibling(current: &Path, prefix: &str, suffix: &str) -> Result<PathBuf, PromoteError> {
    let name = current
        .file_name()
        .ok_or_else(|| PromoteError::Install {
            path: current.to_path_buf(),
            reason: "the current artifact's path has no directory name".into(),
        })?
        .to_string_lossy()
        .into_owned();
    Ok(current.with_file_name(format!("{prefix}{name}{suffix}")))
}

/// Where the decision record goes: `<current>.promotion.json`.
pub fn record_path(current: &Path) -> Result<PathBuf, PromoteError> {
    promotion_record_path(current).ok_or_else(|| PromoteError::Install {
        path: current.to_path_buf(),
        reason: "the current artifact's path has no directory name".into(),
    })
}

/// `<current>.prev`: where [`install`] keeps the replaced artifact.
pub fn prev_path(current: &Path) -> Result<PathBuf, PromoteError> {
    sibling(current, "", PREV_SUFFIX)
}

/// Writes `record` to [`record_path`] (atomically).
pub fn write_record(current: &Path, record: &PromotionRecord) -> Result<PathBuf, PromoteError> {
    write_record_at(record_path(current)?, record)
}

/// Writes `record` to `path` (atomically).
pub(super) fn write_record_at(
    path: PathBuf,
    record: &PromotionRecord,
) -> Result<PathBuf, PromoteError> {
    let err = |reason: String| PromoteError::Install {
        path: path.clone(),
        reason,
    };
    let text = serde_json::to_string_pretty(record).map_err(|e| err(e.to_string()))?;
    replace_file(&path, text.as_bytes()).map_err(|e| err(e.to_string()))?;
    Ok(path)
}

/// Copies the artifact's regular files (an artifact is flat) and syncs them.
fn copy_artifact(from: &Path, to: &Path) -> std::io::Result<()> {
    fs::create_dir(to)?;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            let dest = to.join(entry.file_name());
            fs::copy(entry.path(), &dest)?;
            fs::File::open(&dest)?.sync_all()?;
        }
    }
    fs::File::open(to)?.sync_all()
}

#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use rustix::fs::{CWD, RenameFlags, renameat_with};
    renameat_with(CWD, a, CWD, b, RenameFlags::EXCHANGE).map_err(std::io::Error::from)
}

#[cfg(not(target_os = "linux"))]
fn exchange(_: &Path, _: &Path) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// Installs the artifact in `candidate` at `current` (module docs). Returns where the
/// replaced artifact was kept, if there was one. An error while staging leaves `current`
/// unchanged; one after the swap (keeping the old artifact as `.prev`) leaves the new
/// artifact installed and says where the old one is.
pub fn install(candidate: &Path, current: &Path) -> Result<Option<PathBuf>, PromoteError> {
    let fail = |reason: String| PromoteError::Install {
        path: current.to_path_buf(),
        reason,
    };
    let incoming = sibling(current, ".", &format!(".incoming-{}", std::process::id()))?;
    let prev = prev_path(current)?;
    if incoming.exists() {
        fs::remove_dir_all(&incoming).map_err(|e| fail(format!("{}: {e}", incoming.display())))?;
    }
    let staged = copy_artifact(candidate, &incoming)
        .map_err(|e| format!("copying {}: {e}", candidate.display()))
        .and_then(|()| {
            load_policy(&incoming).map_err(|e| format!("the copy does not load: {e}"))?;
            if artifact_fingerprint(&incoming) != artifact_fingerprint(candidate) {
                return Err("the copy differs from the candidate (changed while copying?)".into());
            }
            Ok(())
        });
    if let Err(reason) = staged {
        let _ = fs::remove_dir_all(&incoming);
        return Err(fail(reason));
    }
    if !current.exists() {
        return fs::rename(&incoming, current).map(|()| None).map_err(|e| {
            let _ = fs::remove_dir_all(&incoming);
            fail(format!("renaming {} into place: {e}", incoming.display()))
        });
    }
    match exchange(&incoming, current) {
        Ok(()) => {
            // `incoming` now holds the replaced artifact.
            if prev.exists() {
                fs::remove_dir_all(&prev).map_err(|e| {
                    fail(format!(
                        "the new artifact is installed, but the old one stays in {} ({}: {e})",
                        incoming.display(),
                        prev.display()
                    ))
                })?;
            }
            fs::rename(&incoming, &prev).map_err(|e| {
                fail(format!(
                    "the new artifact is installed, but the old one stays in {} ({}: {e})",
                    incoming.display(),
                    prev.display()
                ))
            })?;
        }
        Err(_) => {
            if prev.exists() {
                fs::remove_dir_all(&prev).map_err(|e| fail(format!("{}: {e}", prev.display())))?;
            }
            fs::rename(current, &prev).map_err(|e| {
                let _ = fs::remove_dir_all(&incoming);
                fail(format!(
                    "moving the old artifact to {}: {e}",
                    prev.display()
                ))
            })?;
            if let Err(e) = fs::rename(&incoming, current) {
                // Put the old one back rather than leave nothing in place.
                let _ = fs::rename(&prev, current);
                let _ = fs::remove_dir_all(&incoming);
                return Err(fail(format!("renaming the new artifact into place: {e}")));
            }
        }
    }
    // The renames survive a power loss only once their directory is synced.
    sync_dir(current.parent().unwrap_or(Path::new("."))).map_err(|e| {
        fail(format!(
            "the new artifact is installed, but syncing its directory failed: {e}"
        ))
    })?;
    Ok(Some(prev))
}
