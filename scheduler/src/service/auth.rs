//! Bearer-token authentication, one interceptor per audience (clients or agents).

use std::sync::Arc;

use tonic::service::Interceptor;
use tonic::{Request, Status};

/// Accepts calls carrying `authorization: Bearer <token>` with one of `tokens`; with no
/// tokens configured every call passes (development on loopback).
#[derive(Clone, Debug)]
pub struct BearerAuth {
    tokens: Arc<[Vec<u8>]>,
    audience: &'static str,
}

impl BearerAuth {
    pub fn new(tokens: &[String], audience: &'static str) -> Self {
        BearerAuth {
            tokens: tokens.iter().map(|t| t.as_bytes().to_vec()).collect(),
            audience,
        }
    }

    pub fn enabled(&self) -> bool {
        !self.tokens.is_empty()
    }

    pub fn check(&self, header: Option<&[u8]>) -> Result<(), Status> {
        if !self.enabled() {
            return Ok(());
        }
        let Some(value) = header else {
            return Err(Status::unauthenticated(format!(
                "missing authorization metadata: send `authorization: Bearer <{} token>`",
                self.audience
            )));
        };
        let Some(token) = value.strip_prefix(b"Bearer ") else {
            return Err(Status::unauthenticated(
                "authorization metadata must be `Bearer <token>`",
            ));
        };
        // Compare against every token in full, so the time taken says nothing about
        // how much of a guess was right.
        let mut ok = false;
        for t in self.tokens.iter() {
            ok |= constant_time_eq(t, token);
        }
        if ok {
            Ok(())
        } else {
            Err(Status::unauthenticated(format!(
                "invalid {} token",
                self.audience
            )))
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Interceptor for BearerAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        self.check(
            request
                .metadata()
                .get("authorization")
                .map(|v| v.as_bytes()),
        )?;
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked_only_when_configured() {
        let open = BearerAuth::new(&[], "client");
        assert!(open.check(None).is_ok());
        let token = "a".repeat(32);
        let auth = BearerAuth::new(std::slice::from_ref(&token), "client");
        assert!(
            auth.check(Some(format!("Bearer {token}").as_bytes()))
                .is_ok()
        );
        for bad in [
            None,
            Some(b"Bearer nope".as_slice()),
            Some(token.as_bytes()),
        ] {
            let err = auth.check(bad).unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unauthenticated);
        }
    }
}
