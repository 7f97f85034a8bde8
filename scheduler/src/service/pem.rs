//! A first look at PEM files before they reach rustls, whose errors name neither the
//! file nor what it lacked (an empty certificate file is "transport error").

/// What a PEM file given to the service must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PemKind {
    /// One or more `CERTIFICATE` blocks (a certificate chain or a CA bundle).
    Certificate,
    /// A private key (`PRIVATE KEY`, `RSA PRIVATE KEY`, `EC PRIVATE KEY`).
    PrivateKey,
}

/// Checks that `pem` holds a block of `kind`; the error says what is missing, for the
/// caller to put after the file's name.
pub fn check_pem(pem: &[u8], kind: PemKind) -> Result<(), String> {
    if pem.iter().all(u8::is_ascii_whitespace) {
        return Err("is empty".into());
    }
    let has_block = pem
        .split(|&b| b == b'\n')
        .map(|line| String::from_utf8_lossy(line).trim().to_string())
        .any(|line| match kind {
            PemKind::Certificate => line == "-----BEGIN CERTIFICATE-----",
            PemKind::PrivateKey => {
                line.starts_with("-----BEGIN ") && line.ends_with("PRIVATE KEY-----")
            }
        });
    if has_block {
        return Ok(());
    }
    Err(match kind {
        PemKind::Certificate => {
            "holds no PEM certificate (no \"-----BEGIN CERTIFICATE-----\" line)".into()
        }
        PemKind::PrivateKey => {
            "holds no PEM private key (no \"-----BEGIN … PRIVATE KEY-----\" line)".into()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_of_the_expected_kind_pass_and_anything_else_says_what_is_missing() {
        let cert = b"junk\n-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let key = b"-----BEGIN EC PRIVATE KEY-----\r\nMHcC\r\n-----END EC PRIVATE KEY-----\r\n";
        assert_eq!(check_pem(cert, PemKind::Certificate), Ok(()));
        assert_eq!(check_pem(key, PemKind::PrivateKey), Ok(()));
        assert_eq!(
            check_pem(b" \n", PemKind::Certificate),
            Err("is empty".into())
        );
        assert!(
            check_pem(key, PemKind::Certificate)
                .unwrap_err()
                .contains("no PEM certificate")
        );
        assert!(
            check_pem(cert, PemKind::PrivateKey)
                .unwrap_err()
                .contains("no PEM private key")
        );
        assert!(check_pem(b"\xff\xfe binary", PemKind::PrivateKey).is_err());
    }
}
