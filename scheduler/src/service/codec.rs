//! How a record is laid out in the database: one format byte, then the record.
//!
//! Records used to be JSON. A placement decision with its 16 candidates took about
//! 2 KB that way and a job record about 750 B, and the durable commit's write-back grows
//! with every byte of them: at a few thousand jobs per second the store wrote ~10 KB to
//! the disk per job. [postcard] (varint integers, no field names) takes them to a
//! fraction of that and serialises several times faster.
//!
//! postcard is positional, so a stored type's layout is part of the database format:
//! adding, removing or reordering a field of [`JobRecord`], [`DecisionRecord`],
//! [`NodeRecord`], [`StoredStopWait`] or anything they contain changes it. The golden tests below pin the
//! encoding of one record of each; when they fail, give the new layout a new format
//! byte and keep decoding the old one (as JSON records, format `{`, are still read).
//! Fields that postcard cannot skip (`skip_serializing_if`) are not allowed in them.
//!
//! [`JobRecord`]: crate::service::jobs::JobRecord
//! [`DecisionRecord`]: crate::service::records::DecisionRecord
//! [`NodeRecord`]: crate::service::records::NodeRecord
//! [`StoredStopWait`]: crate::service::records::StoredStopWait

use serde::Serialize;
use serde::de::DeserializeOwned;

/// postcard, layout 1 (2026-11-22).
const POSTCARD_V1: u8 = 1;
/// Format bytes kept for later layouts; anything else unknown is damage.
const NEWEST_FORMAT_BYTE: u8 = 0x1f;
/// Records written before the format byte existed are JSON objects.
const JSON_OBJECT: u8 = b'{';

/// `value` as stored: the format byte, then postcard.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, String> {
    postcard::to_extend(value, vec![POSTCARD_V1]).map_err(|e| e.to_string())
}

/// A stored record back, in whichever format it was written.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    match bytes.first() {
        Some(&POSTCARD_V1) => {
            let (value, rest) =
                postcard::take_from_bytes(&bytes[1..]).map_err(|e| format!("postcard: {e}"))?;
            if rest.is_empty() {
                Ok(value)
            } else {
                Err(format!(
                    "postcard: {} bytes left over after the record",
                    rest.len()
                ))
            }
        }
        Some(&JSON_OBJECT) => serde_json::from_slice(bytes).map_err(|e| format!("JSON: {e}")),
        // Later layouts take the next bytes: after a rollback, say so rather than call
        // the record corrupt, which invites deleting it.
        Some(&newer) if (POSTCARD_V1 + 1..=NEWEST_FORMAT_BYTE).contains(&newer) => Err(format!(
            "record format {newer} was written by a newer Marshal (this build reads format {POSTCARD_V1} and JSON): run that version, or a database this build wrote"
        )),
        Some(other) => Err(format!("unknown record format byte {other:#04x}")),
        None => Err("empty record".into()),
    }
}

#[cfg(test)]
pub(crate) mod tests;
