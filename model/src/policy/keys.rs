//! Ed25519 keys for promotion records: `marshal model keygen` writes a pair, `marshal
//! model promote --signing-key` signs with the private half, and `marshal serve` trusts
//! the public halves listed in `promotion_public_keys`.
//!
//! Both files are one line of text, so they can be read, diffed and pasted:
//!
//! ```text
//! KEY      marshal-ed25519-secret <64 hex digits: the 32-byte Ed25519 seed>
//! KEY.pub  marshal-ed25519-public <64 hex digits: the 32-byte public key>
//! ```
//!
//! A key is named by its id: the first 16 hex digits of SHA-256 of the public key's 32
//! bytes. The private key file is created with mode 0600 (Unix) and refused when other
//! users can read it (as ssh does), so a copied key with loose permissions is noticed.

use std::ffi::OsString;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use ed25519_dalek::{SigningKey, VerifyingKey};
use sha2::{Digest as _, Sha256};

use super::digest::{hex, unhex};
use crate::error::{ModelError, Result};

const SECRET_PREFIX: &str = "marshal-ed25519-secret";
const PUBLIC_PREFIX: &str = "marshal-ed25519-public";

fn key_err(path: &Path, reason: impl Into<String>) -> ModelError {
    ModelError::KeyFile {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// First 16 hex digits of SHA-256 of the public key.
pub fn key_id(key: &VerifyingKey) -> String {
    hex(&Sha256::digest(key.as_bytes())[..8])
}

/// A private key to sign promotion records with.
pub struct PromotionSigner {
    key: SigningKey,
    id: String,
}

// Never prints the secret.
impl std::fmt::Debug for PromotionSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromotionSigner")
            .field("key_id", &self.id)
            .finish_non_exhaustive()
    }
}

impl PromotionSigner {
    /// From a 32-byte seed (tests pin signatures with a fixed one).
    #[cfg(test)]
    pub(crate) fn from_seed(seed: [u8; 32]) -> Self {
        Self::new(SigningKey::from_bytes(&seed))
    }

    fn new(key: SigningKey) -> Self {
        let id = key_id(&key.verifying_key());
        PromotionSigner { key, id }
    }

    pub fn key_id(&self) -> &str {
        &self.id
    }

    /// The public half (what a server is given).
    pub fn public(&self) -> PromotionKey {
        PromotionKey {
            key: self.key.verifying_key(),
            id: self.id.clone(),
            path: PathBuf::new(),
        }
    }

    pub(crate) fn signing_key(&self) -> &SigningKey {
        &self.key
    }
}

/// A trusted public key and the file it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct PromotionKey {
    pub(crate) key: VerifyingKey,
    id: String,
    path: PathBuf,
}

impl PromotionKey {
    pub fn key_id(&self) -> &str {
        &self.id
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The public keys a server accepts promotion signatures from; empty: signatures are
/// not required.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PromotionKeys(Vec<PromotionKey>);

impl PromotionKeys {
    pub fn new(keys: Vec<PromotionKey>) -> Self {
        PromotionKeys(keys)
    }

    /// Reads every file ([`read_public_key`]); the first bad one is the error.
    pub fn read(paths: &[PathBuf]) -> Result<Self> {
        paths
            .iter()
            .map(|p| read_public_key(p))
            .collect::<Result<_>>()
            .map(PromotionKeys)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn by_id(&self, id: &str) -> Option<&PromotionKey> {
        self.0.iter().find(|k| k.id == id)
    }

    pub fn ids(&self) -> Vec<&str> {
        self.0.iter().map(|k| k.id.as_str()).collect()
    }
}

/// `KEY.pub` for the private key file `KEY`.
pub fn public_key_path(private: &Path) -> PathBuf {
    let mut s = OsString::from(private.as_os_str());
    s.push(".pub");
    PathBuf::from(s)
}

/// Generates a key pair from the OS's random source and writes `out` (private, mode 0600,
/// never overwriting an existing file) and [`public_key_path`]`(out)`. Returns the signer.
pub fn generate_key_pair(out: &Path) -> Result<PromotionSigner> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed)
        .map_err(|e| key_err(out, format!("no randomness from the OS: {e}")))?;
    let signer = PromotionSigner::new(SigningKey::from_bytes(&seed));
    seed.fill(0);
    let public = public_key_path(out);
    for p in [out, public.as_path()] {
        if p.exists() {
            return Err(key_err(p, "already exists; not overwritten"));
        }
    }
    let secret_line = format!("{SECRET_PREFIX} {}\n", hex(signer.key.as_bytes()));
    write_new(out, secret_line.as_bytes(), true)?;
    let public_line = format!(
        "{PUBLIC_PREFIX} {}\n",
        hex(signer.key.verifying_key().as_bytes())
    );
    if let Err(e) = write_new(&public, public_line.as_bytes(), false) {
        // No half pair: a private key without its public one is of no use.
        let _ = fs::remove_file(out);
        return Err(e);
    }
    Ok(signer)
}

/// Creates `path` (which must not exist) with `bytes`; `private`: mode 0600 on Unix.
fn write_new(path: &Path, bytes: &[u8], private: bool) -> Result<()> {
    create_new_with(path, private, |f| {
        f.write_all(bytes).and_then(|()| f.sync_all())
    })
}

/// Creates `path` (which must not exist) and lets `fill` write it. A failed `fill` (a
/// full disk) removes the file: a partial key would otherwise be refused as "already
/// exists" by every rerun, and read back as a corrupt key.
fn create_new_with(
    path: &Path,
    private: bool,
    fill: impl FnOnce(&mut fs::File) -> std::io::Result<()>,
) -> Result<()> {
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        opts.mode(if private { 0o600 } else { 0o644 });
    }
    #[cfg(not(unix))]
    let _ = private;
    let mut f = opts.open(path).map_err(|e| key_err(path, e.to_string()))?;
    fill(&mut f).map_err(|e| {
        drop(f);
        let _ = fs::remove_file(path);
        key_err(path, e.to_string())
    })
}

/// The 32 key bytes of a one-line key file with `prefix`.
fn read_key_line(path: &Path, prefix: &str) -> Result<[u8; 32]> {
    let bytes = fs::read(path).map_err(|e| key_err(path, e.to_string()))?;
    let text = std::str::from_utf8(&bytes).map_err(|_| key_err(path, "not UTF-8 text"))?;
    let (p, digits) = text.trim().split_once(' ').ok_or_else(|| {
        key_err(
            path,
            format!("expected one line `{prefix} <64 hex digits>`"),
        )
    })?;
    if p != prefix {
        let hint = if p == SECRET_PREFIX || p == PUBLIC_PREFIX {
            format!(" (this is a {p} key)")
        } else {
            String::new()
        };
        return Err(key_err(
            path,
            format!("expected a `{prefix}` key, found `{p}`{hint}"),
        ));
    }
    unhex::<32>(digits.trim())
        .ok_or_else(|| key_err(path, "the key is not 64 hex digits (32 bytes)"))
}

/// Reads a private key written by [`generate_key_pair`].
pub fn read_signing_key(path: &Path) -> Result<PromotionSigner> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = fs::metadata(path)
            .map_err(|e| key_err(path, e.to_string()))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(key_err(
                path,
                format!(
                    "a private key readable by other users (mode {:04o}); `chmod 600` it",
                    mode & 0o7777
                ),
            ));
        }
    }
    let seed = read_key_line(path, SECRET_PREFIX)?;
    Ok(PromotionSigner::new(SigningKey::from_bytes(&seed)))
}

/// Reads a public key written by [`generate_key_pair`] (`KEY.pub`).
pub fn read_public_key(path: &Path) -> Result<PromotionKey> {
    let bytes = read_key_line(path, PUBLIC_PREFIX)?;
    let key = VerifyingKey::from_bytes(&bytes)
        .map_err(|e| key_err(path, format!("not an Ed25519 public key: {e}")))?;
    Ok(PromotionKey {
        id: key_id(&key),
        key,
        path: path.to_path_buf(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keygen_writes_a_pair_that_reads_back() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("promo.key");
        let signer = generate_key_pair(&out).unwrap();
        assert_eq!(public_key_path(&out), tmp.path().join("promo.key.pub"));
        let again = read_signing_key(&out).unwrap();
        assert_eq!(again.key_id(), signer.key_id());
        let public = read_public_key(&public_key_path(&out)).unwrap();
        assert_eq!(public.key_id(), signer.key_id());
        assert_eq!(public.key, signer.public().key);
        assert_eq!(signer.key_id().len(), 16);
        assert!(!format!("{signer:?}").contains(&hex(signer.key.as_bytes())));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = fs::metadata(&out).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // Never overwritten; a second pair differs (OS randomness).
        let err = generate_key_pair(&out).unwrap_err().to_string();
        assert!(err.contains("already exists"), "{err}");
        let other = generate_key_pair(&tmp.path().join("other.key")).unwrap();
        assert_ne!(other.key_id(), signer.key_id());
    }

    #[test]
    fn a_key_file_that_cannot_be_written_whole_is_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("k");
        let e = create_new_with(&out, true, |f| {
            f.write_all(b"marshal-ed25519-secret 01")?;
            Err(std::io::Error::other("No space left on device"))
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("No space left"), "{e}");
        assert!(!out.exists(), "a partial key was left behind");
        // So a rerun creates the pair.
        generate_key_pair(&out).unwrap();
        read_signing_key(&out).unwrap();
    }

    #[test]
    fn bad_key_files_are_errors_naming_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("k");
        generate_key_pair(&out).unwrap();
        let public = public_key_path(&out);
        let err = |r: Result<PromotionKey>| r.unwrap_err().to_string();
        // The halves are not interchangeable.
        let e = err(read_public_key(&out));
        assert!(
            e.contains("marshal-ed25519-secret") && e.contains("key file"),
            "{e}"
        );
        #[cfg(unix)]
        {
            // Readable by everyone, as written: refused for that before its contents.
            let e = read_signing_key(&public).unwrap_err().to_string();
            assert!(e.contains("readable by other users"), "{e}");
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let e = read_signing_key(&public).unwrap_err().to_string();
        assert!(
            e.contains("found `marshal-ed25519-public` (this is a marshal-ed25519-public key)"),
            "{e}"
        );
        let bad = tmp.path().join("bad.pub");
        for (text, why) in [
            ("", "expected one line"),
            ("marshal-ed25519-public abcd", "64 hex digits"),
            (
                "ssh-ed25519 AAAA",
                "expected a `marshal-ed25519-public` key",
            ),
        ] {
            fs::write(&bad, text).unwrap();
            let e = err(read_public_key(&bad));
            assert!(e.contains(why) && e.contains("bad.pub"), "{text:?}: {e}");
        }
        fs::write(&bad, [0xff, 0xfe]).unwrap();
        assert!(err(read_public_key(&bad)).contains("UTF-8"));
        let e = err(read_public_key(&tmp.path().join("missing.pub")));
        assert!(e.contains("missing.pub"), "{e}");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            fs::set_permissions(&out, fs::Permissions::from_mode(0o644)).unwrap();
            let e = read_signing_key(&out).unwrap_err().to_string();
            assert!(e.contains("chmod 600") && e.contains("0644"), "{e}");
        }
    }
}
