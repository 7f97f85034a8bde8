//! Signatures over promotion records: what lets `marshal serve` tell a promotion made by
//! a key holder from a record written by anyone who can write the model directory.
//!
//! # What is signed
//!
//! Not the record's JSON (serde's output is not canonical), but this text, UTF-8, each
//! line ending in `\n`, fields in this order ([`signed_bytes`]):
//!
//! ```text
//! marshal promotion signature v1
//! decision: promoted
//! installed_sha256: <64 lowercase hex: artifact_sha256 of the installed artifact>
//! installed_fnv1a64: <16 lowercase hex: its artifact_fingerprint>
//! decided_at_unix_s: <16 lowercase hex: the IEEE-754 bits of the decision's time>
//! key_id: <16 lowercase hex: the signing key's id>
//! ```
//!
//! The signature is an attestation of one installation: "the holder of key `key_id`
//! promoted the artifact with this content at this time". Only a promotion is signed
//! (the decision line is a constant); a later decision that promotes nothing carries
//! the installed artifact's proof over unchanged — digest, fingerprint and this
//! signature with its own `decided_at` — so a losing candidate neither takes the proof
//! away nor re-signs something its signer never promoted. The other record fields
//! (reason, traces, paths) are informational and not covered.

use ed25519_dalek::{Signature, Signer as _};
use serde::{Deserialize, Serialize};

use super::digest::{hex, is_lower_hex, unhex};
use super::keys::{PromotionKeys, PromotionSigner};

/// The signed text's version ([`signed_bytes`]).
pub const SIGNATURE_FORMAT: u32 = 1;

/// The signature block of a promotion record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PromotionSignature {
    /// Version of the signed text (this build writes and reads [`SIGNATURE_FORMAT`]).
    pub format: u32,
    /// The signing key's id (first 16 hex digits of SHA-256 of its public key).
    pub key_id: String,
    /// When the signed promotion was decided (the record's own `decided_at_unix_s`,
    /// or the promotion's when carried over by a later decision).
    pub decided_at_unix_s: f64,
    /// Ed25519 over [`signed_bytes`]: 128 hex digits.
    pub signature: String,
}

/// The exact bytes signed (module docs). `None` when a field is not in its canonical
/// form (a digest not lowercase hex of the right length), which no signer produces.
pub fn signed_bytes(
    format: u32,
    installed_sha256: &str,
    installed_fnv: &str,
    decided_at_unix_s: f64,
    key_id: &str,
) -> Option<Vec<u8>> {
    let canonical = format == SIGNATURE_FORMAT
        && is_lower_hex(installed_sha256, 64)
        && is_lower_hex(installed_fnv, 16)
        && is_lower_hex(key_id, 16);
    canonical.then(|| {
        format!(
            "marshal promotion signature v{format}\n\
             decision: promoted\n\
             installed_sha256: {installed_sha256}\n\
             installed_fnv1a64: {installed_fnv}\n\
             decided_at_unix_s: {:016x}\n\
             key_id: {key_id}\n",
            decided_at_unix_s.to_bits()
        )
        .into_bytes()
    })
}

/// Signs the promotion of the artifact with digest `installed_sha256` and fingerprint
/// `installed_fnv` decided at `decided_at_unix_s`. `None`: a digest is malformed.
pub fn sign_promotion(
    signer: &PromotionSigner,
    installed_sha256: &str,
    installed_fnv: &str,
    decided_at_unix_s: f64,
) -> Option<PromotionSignature> {
    let key_id = signer.key_id().to_string();
    let bytes = signed_bytes(
        SIGNATURE_FORMAT,
        installed_sha256,
        installed_fnv,
        decided_at_unix_s,
        &key_id,
    )?;
    Some(PromotionSignature {
        format: SIGNATURE_FORMAT,
        signature: hex(&signer.signing_key().sign(&bytes).to_bytes()),
        key_id,
        decided_at_unix_s,
    })
}

/// `Ok` iff `sig` is a valid signature by one of `keys` over the promotion of
/// (`installed_sha256`, `installed_fnv`); the error says what is wrong, after
/// `promotion record <record>`.
pub fn verify_signature(
    sig: &PromotionSignature,
    installed_sha256: &str,
    installed_fnv: &str,
    keys: &PromotionKeys,
    record: &str,
) -> Result<(), String> {
    if sig.format != SIGNATURE_FORMAT {
        return Err(format!(
            "promotion record {record} has signature format {} (this build verifies {SIGNATURE_FORMAT})",
            sig.format
        ));
    }
    let Some(key) = keys.by_id(&sig.key_id) else {
        return Err(format!(
            "promotion record {record} is signed by unknown key {} (promotion_public_keys trusts {})",
            sig.key_id,
            keys.ids().join(", ")
        ));
    };
    let bytes = signed_bytes(
        sig.format,
        installed_sha256,
        installed_fnv,
        sig.decided_at_unix_s,
        &sig.key_id,
    );
    let signature = unhex::<64>(&sig.signature).map(|b| Signature::from_bytes(&b));
    let valid = match (bytes, signature) {
        // `verify_strict` also refuses weak keys and non-canonical signatures.
        (Some(bytes), Some(s)) => key.key.verify_strict(&bytes, &s).is_ok(),
        _ => false,
    };
    if valid {
        Ok(())
    } else {
        Err(format!(
            "promotion record {record}: signature does not verify with key {} ({}): the record was changed after signing",
            sig.key_id,
            key.path().display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::keys::{PromotionKeys, generate_key_pair};

    const SHA: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    const FNV: &str = "0123456789abcdef";

    #[test]
    fn the_signed_bytes_are_stable() {
        let bytes = signed_bytes(1, SHA, FNV, 1.5, "fedcba9876543210").unwrap();
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            format!(
                "marshal promotion signature v1\ndecision: promoted\ninstalled_sha256: {SHA}\n\
                 installed_fnv1a64: {FNV}\ndecided_at_unix_s: 3ff8000000000000\nkey_id: fedcba9876543210\n"
            )
        );
        // Not canonical: no bytes (and so no valid signature).
        assert!(signed_bytes(2, SHA, FNV, 1.5, "fedcba9876543210").is_none());
        assert!(signed_bytes(1, &SHA.to_uppercase(), FNV, 1.5, "fedcba9876543210").is_none());
        assert!(signed_bytes(1, SHA, "0123", 1.5, "fedcba9876543210").is_none());
        assert!(signed_bytes(1, SHA, FNV, 1.5, "x\ndecision").is_none());
    }

    #[test]
    fn a_fixed_key_gives_the_signature_another_ed25519_implementation_gives() {
        // Pinned with Python's `cryptography` (Ed25519PrivateKey.from_private_bytes of the
        // same seed signing the same text): the format is implementable elsewhere.
        let signer = PromotionSigner::from_seed([7; 32]);
        assert_eq!(signer.key_id(), "fe812c12f3ab4ce6");
        let sig = sign_promotion(&signer, SHA, FNV, 1.5).unwrap();
        assert_eq!(
            sig.signature,
            "2b46b7f4cb1c0cd83e1269954a9500bf7bf6999002bd09e1629f9fe4a12a1dc5\
             085538620261c15fdd8757f4e5cef490792d165e04d0c98896e50b3f99e48f02"
        );
        assert_eq!(
            hex(signer.public().key.as_bytes()),
            "ea4a6c63e29c520abef5507b132ec5f9954776aebebe7b92421eea691446d22c"
        );
    }

    #[test]
    fn a_signature_verifies_only_over_what_was_signed_and_with_a_trusted_key() {
        let tmp = tempfile::tempdir().unwrap();
        let signer = generate_key_pair(&tmp.path().join("a")).unwrap();
        let stranger = generate_key_pair(&tmp.path().join("b")).unwrap();
        let keys = PromotionKeys::new(vec![signer.public()]);
        let sig = sign_promotion(&signer, SHA, FNV, 1.5).unwrap();
        verify_signature(&sig, SHA, FNV, &keys, "r").unwrap();
        let other_sha = SHA.replace("00", "01");
        let e = verify_signature(&sig, &other_sha, FNV, &keys, "r").unwrap_err();
        assert!(e.contains("signature does not verify"), "{e}");
        let e = verify_signature(&sig, SHA, "0123456789abcdee", &keys, "r").unwrap_err();
        assert!(e.contains("signature does not verify"), "{e}");
        let later = PromotionSignature {
            decided_at_unix_s: 2.0,
            ..sig.clone()
        };
        assert!(verify_signature(&later, SHA, FNV, &keys, "r").is_err());
        let mut flipped = sig.clone();
        let other = if sig.signature.starts_with("00") {
            "01"
        } else {
            "00"
        };
        flipped.signature.replace_range(0..2, other);
        assert!(verify_signature(&flipped, SHA, FNV, &keys, "r").is_err());
        let truncated = PromotionSignature {
            signature: "abcd".into(),
            ..sig.clone()
        };
        assert!(verify_signature(&truncated, SHA, FNV, &keys, "r").is_err());
        // Another key's signature: its id is unknown here.
        let foreign = sign_promotion(&stranger, SHA, FNV, 1.5).unwrap();
        let e = verify_signature(&foreign, SHA, FNV, &keys, "r").unwrap_err();
        assert!(
            e.contains("unknown key")
                && e.contains(stranger.key_id())
                && e.contains(signer.key_id()),
            "{e}"
        );
        // A stranger's signature relabelled with the trusted id does not verify.
        let relabelled = PromotionSignature {
            key_id: signer.key_id().into(),
            ..foreign
        };
        assert!(
            verify_signature(&relabelled, SHA, FNV, &keys, "r")
                .unwrap_err()
                .contains("does not verify")
        );
        let future = PromotionSignature { format: 2, ..sig };
        assert!(
            verify_signature(&future, SHA, FNV, &keys, "r")
                .unwrap_err()
                .contains("format 2")
        );
    }
}
