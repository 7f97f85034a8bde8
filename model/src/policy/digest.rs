//! A cryptographic content digest of a policy artifact: what a signed promotion record
//! pins. [`super::artifact_fingerprint`] (FNV-1a 64) stays the artifact's version and the
//! poll's change detector — cheap, but anyone can make two artifacts with the same
//! FNV hash, so a signature over it alone would prove nothing.
//!
//! The digest is SHA-256 over, in order:
//!
//! ```text
//! "marshal-artifact-sha256 v1\n"
//! for each regular, non-hidden file of the directory, sorted by name (bytes):
//!     u64 LE length of the name, the name's bytes,
//!     u64 LE length of the content, the content
//! ```
//!
//! Length prefixes make the framing unambiguous (no two artifacts feed the same bytes).
//! The file set is the fingerprint's and the loader's: an artifact is flat, and hidden
//! files are temporaries (`replace_file`) that nothing loads. Any other non-hidden
//! entry — a symlink, a subdirectory, a device — is refused rather than skipped: the
//! loader follows a symlink named `weights.bpk`, so content behind one could change
//! without the digest changing.

use std::fs;
use std::path::Path;

use sha2::{Digest as _, Sha256};

use crate::error::{ModelError, Result};

const DOMAIN: &[u8] = b"marshal-artifact-sha256 v1\n";

/// The artifact's SHA-256 digest (64 lowercase hex digits, see the module docs).
pub fn artifact_sha256(dir: &Path) -> Result<String> {
    let refuse = |path: &Path, reason: String| ModelError::Digest {
        path: path.to_path_buf(),
        reason,
    };
    let entries = fs::read_dir(dir).map_err(|e| refuse(dir, e.to_string()))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| refuse(dir, e.to_string()))?;
        let name = entry.file_name();
        if name.as_encoded_bytes().starts_with(b".") {
            continue;
        }
        let path = entry.path();
        // `DirEntry::file_type` does not follow symlinks.
        let kind = entry
            .file_type()
            .map_err(|e| refuse(&path, e.to_string()))?;
        if !kind.is_file() {
            let what = if kind.is_symlink() {
                "a symlink"
            } else if kind.is_dir() {
                "a directory"
            } else {
                "not a regular file"
            };
            return Err(refuse(
                &path,
                format!("{what}: an artifact must hold regular files only"),
            ));
        }
        files.push((name, path));
    }
    files.sort_by(|a, b| a.0.as_encoded_bytes().cmp(b.0.as_encoded_bytes()));
    let mut h = Sha256::new();
    h.update(DOMAIN);
    for (name, path) in files {
        // Read whole (artifacts are small) so the length and the bytes hashed agree even
        // if the file changes meanwhile.
        let bytes = fs::read(&path).map_err(|e| refuse(&path, e.to_string()))?;
        let name = name.as_encoded_bytes();
        h.update((name.len() as u64).to_le_bytes());
        h.update(name);
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Ok(hex(&h.finalize()))
}

/// Lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Exactly `N` bytes from `2N` hex digits (either case); `None` otherwise.
pub(crate) fn unhex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let t = text.as_bytes();
    if t.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16);
    let mut out = [0u8; N];
    for (i, pair) in t.chunks_exact(2).enumerate() {
        out[i] = u8::try_from(digit(pair[0])? * 16 + digit(pair[1])?).ok()?;
    }
    Some(out)
}

/// `text` is `n` lowercase hex digits.
pub(crate) fn is_lower_hex(text: &str, n: usize) -> bool {
    text.len() == n && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn artifact(files: &[(&str, &[u8])]) -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        for (name, bytes) in files {
            fs::write(tmp.path().join(name), bytes).unwrap();
        }
        tmp
    }

    #[test]
    fn the_digest_is_pinned_and_covers_names_lengths_and_content() {
        let a = artifact(&[("meta.json", b"{}"), ("weights.bpk", b"\x00\x01")]);
        let d = artifact_sha256(a.path()).unwrap();
        // Pinned (an independent Python hashlib computation of the documented framing
        // gives the same): a change of the framing would invalidate every signed record.
        assert_eq!(
            d,
            "3bf3727c11b4ca0cda941815998d749d27dd3f773aff8721374eaa481f83bb5b"
        );
        assert!(is_lower_hex(&d, 64));
        // Hidden files are not part of the artifact.
        fs::write(a.path().join(".meta.json.tmp-1"), b"x").unwrap();
        assert_eq!(artifact_sha256(a.path()).unwrap(), d);
        // Moving a byte from one file to the other changes it (length framing).
        let b = artifact(&[("meta.json", b"{}\x00"), ("weights.bpk", b"\x01")]);
        assert_ne!(artifact_sha256(b.path()).unwrap(), d);
        let c = artifact(&[("meta.json", b"{}"), ("weights.bpk", b"\x00\x02")]);
        assert_ne!(artifact_sha256(c.path()).unwrap(), d);
        let renamed = artifact(&[("meta.json", b"{}"), ("weights.bin", b"\x00\x01")]);
        assert_ne!(artifact_sha256(renamed.path()).unwrap(), d);
    }

    #[test]
    fn non_regular_entries_and_unreadable_directories_are_refused() {
        let a = artifact(&[("meta.json", b"{}")]);
        fs::create_dir(a.path().join("sub")).unwrap();
        let err = artifact_sha256(a.path()).unwrap_err().to_string();
        assert!(err.contains("sub") && err.contains("a directory"), "{err}");
        fs::remove_dir(a.path().join("sub")).unwrap();
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(a.path().join("meta.json"), a.path().join("w.bpk")).unwrap();
            let err = artifact_sha256(a.path()).unwrap_err().to_string();
            assert!(err.contains("w.bpk") && err.contains("a symlink"), "{err}");
        }
        let err = artifact_sha256(&a.path().join("missing"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("missing") && err.contains("no content digest"),
            "{err}"
        );
    }

    #[test]
    fn hex_round_trips_and_rejects_bad_input() {
        assert_eq!(hex(&[0x00, 0xab, 0xff]), "00abff");
        assert_eq!(unhex::<3>("00abff"), Some([0x00, 0xab, 0xff]));
        assert_eq!(unhex::<3>("00ABFF"), Some([0x00, 0xab, 0xff]));
        assert_eq!(unhex::<3>("00abf"), None);
        assert_eq!(unhex::<2>("0g00"), None);
        assert_eq!(unhex::<2>("+f00"), None);
        assert!(!is_lower_hex("00AB", 4));
    }
}
