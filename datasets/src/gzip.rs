//! Reading the traces that are published compressed (Helios' per-VC series are
//! `.csv.gz`, PAI's machine spec is a `.tar.gz`), through `flate2` and `tar`.
//!
//! Malformed input is an `Err` with a reason, and decompressed output is capped at
//! [`MAX_OUTPUT`] so that a hostile archive cannot exhaust memory.

use std::io::Read;

/// Decompressed output larger than this is refused (the largest trace file is ~3.4 MB).
pub(crate) const MAX_OUTPUT: u64 = 1 << 30;

/// The bytes of a gzip file (all members, concatenated), checked against each member's
/// CRC-32 and length by the decoder.
pub(crate) fn gunzip(data: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(data)
        .take(MAX_OUTPUT + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("not a valid gzip stream: {e}"))?;
    if out.len() as u64 > MAX_OUTPUT {
        return Err(format!("decompresses to more than {MAX_OUTPUT} bytes"));
    }
    Ok(out)
}

/// The contents of the regular file `name` in a tar archive; a member matches when its
/// path is `name` or ends in `/name`.
pub(crate) fn tar_member(archive: &[u8], name: &str) -> Result<Vec<u8>, String> {
    let mut tar = tar::Archive::new(archive);
    let entries = tar
        .entries()
        .map_err(|e| format!("not a tar archive: {e}"))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("unreadable tar entry: {e}"))?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry
            .path()
            .map_err(|e| format!("unreadable tar path: {e}"))?;
        let path = path.to_string_lossy();
        if path == name || path.ends_with(&format!("/{name}")) {
            let mut out = Vec::new();
            entry
                .by_ref()
                .take(MAX_OUTPUT + 1)
                .read_to_end(&mut out)
                .map_err(|e| format!("tar member {name} is truncated: {e}"))?;
            return Ok(out);
        }
    }
    Err(format!("the archive has no member {name}"))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(bytes).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn round_trips_and_rejects_corrupt_streams() {
        let packed = gzip(b"time,active,total\n1,2,3\n");
        assert_eq!(gunzip(&packed).unwrap(), b"time,active,total\n1,2,3\n");
        let mut truncated = packed.clone();
        truncated.truncate(packed.len() - 6);
        assert!(gunzip(&truncated).is_err());
        assert!(gunzip(b"plain text").is_err());
    }

    #[test]
    fn finds_a_member_of_a_tar_archive() {
        let mut builder = tar::Builder::new(Vec::new());
        let data = b"m1,a,b\n";
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder
            .append_data(&mut header, "dir/spec.csv", &data[..])
            .unwrap();
        let archive = builder.into_inner().unwrap();
        assert_eq!(tar_member(&archive, "spec.csv").unwrap(), data);
        assert!(
            tar_member(&archive, "other.csv")
                .unwrap_err()
                .contains("no member")
        );
        assert!(tar_member(&archive[..100], "spec.csv").is_err());
    }
}
