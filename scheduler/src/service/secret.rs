//! Files holding secrets (bearer tokens, TLS private keys) must not be open to every user
//! of the machine: a token anyone can read is no authentication at all. The rule is
//! PostgreSQL's for its server key, minus the owner test: no access at all for others,
//! and no writing by the group (a group-readable `0640` file owned by a service group
//! is a common, deliberate setup). Promotion signing keys are stricter (`0600`, see
//! `marshal_model::policy::read_signing_key`).

use std::path::Path;

/// Permission bits a secret file must not have: any access by others, group write.
const FORBIDDEN_BITS: u32 = 0o027;

/// `Ok` iff `path`'s permissions keep its secret from other users; the error names the
/// file, its mode and the fix. Not Unix: always `Ok` (no such bits).
pub fn check_private(path: &Path, what: &str) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .permissions()
            .mode();
        if mode & FORBIDDEN_BITS != 0 {
            return Err(format!(
                "{} holds {what} and is open to other users (mode {:04o}); `chmod 600` it (or 640 for a service group)",
                path.display(),
                mode & 0o7777
            ));
        }
    }
    #[cfg(not(unix))]
    let _ = (path, what, FORBIDDEN_BITS);
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn only_files_closed_to_other_users_pass() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("token");
        std::fs::write(&path, "t").unwrap();
        let with_mode = |m: u32| {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(m)).unwrap();
            check_private(&path, "a token")
        };
        for ok in [0o600, 0o400, 0o640, 0o440, 0o700, 0o750] {
            assert_eq!(with_mode(ok), Ok(()), "{ok:o}");
        }
        for bad in [0o644, 0o604, 0o660, 0o602, 0o601, 0o666] {
            let e = with_mode(bad).unwrap_err();
            assert!(
                e.contains(&format!("mode {bad:04o}")) && e.contains("a token"),
                "{e}"
            );
            assert!(e.contains(&path.display().to_string()), "{e}");
        }
        let e = check_private(&tmp.path().join("missing"), "a key").unwrap_err();
        assert!(e.contains("missing"), "{e}");
    }
}
