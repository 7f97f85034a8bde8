//! Bearer-token authentication, one interceptor per audience (clients or agents).

use std::sync::Arc;

use tonic::service::Interceptor;
use tonic::{Request, Status};

/// Accepts calls carrying `authorization: Bearer <token>` with one of `tokens`; with no
/// tokens configured every call passes (development on loopback). A token may be bound
/// to a node ([`BearerAuth::with_node_tokens`]): the call then carries [`BoundNode`] in
/// its extensions, and the node service lets it act as that node only.
#[derive(Clone, Debug)]
pub struct BearerAuth {
    tokens: Arc<[(Vec<u8>, Option<String>)]>,
    audience: &'static str,
}

/// The node a call's token belongs to (node tokens only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundNode(pub String);

impl BoundNode {
    /// `Ok` unless the call's token belongs to another node than `node`.
    pub fn check<T>(request: &tonic::Request<T>, node: &str) -> Result<(), Status> {
        match request.extensions().get::<BoundNode>() {
            Some(BoundNode(own)) if own != node => Err(Status::permission_denied(format!(
                "this token belongs to node {own}, not {node}"
            ))),
            _ => Ok(()),
        }
    }
}

impl BearerAuth {
    pub fn new(tokens: &[String], audience: &'static str) -> Self {
        BearerAuth {
            tokens: tokens
                .iter()
                .map(|t| (t.as_bytes().to_vec(), None))
                .collect(),
            audience,
        }
    }

    /// Also accepts each node's own token, bound to that node.
    pub fn with_node_tokens<'a>(
        self,
        node_tokens: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Self {
        let mut tokens: Vec<_> = self.tokens.to_vec();
        tokens.extend(
            node_tokens
                .into_iter()
                .map(|(node, t)| (t.as_bytes().to_vec(), Some(node.clone()))),
        );
        BearerAuth {
            tokens: tokens.into(),
            ..self
        }
    }

    pub fn enabled(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// `Ok(Some(node))` for a node's own token, `Ok(None)` for an unbound one (or with
    /// no tokens configured).
    pub fn check(&self, header: Option<&[u8]>) -> Result<Option<String>, Status> {
        if !self.enabled() {
            return Ok(None);
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
        let mut matched = None;
        for (i, (t, _)) in self.tokens.iter().enumerate() {
            if constant_time_eq(t, token) {
                matched = Some(i);
            }
        }
        if let Some(i) = matched {
            Ok(self.tokens[i].1.clone())
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
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let bound = self.check(
            request
                .metadata()
                .get("authorization")
                .map(|v| v.as_bytes()),
        )?;
        if let Some(node) = bound {
            request.extensions_mut().insert(BoundNode(node));
        }
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

    #[test]
    fn a_node_token_names_its_node_and_an_agent_token_none() {
        let (shared, own) = ("s".repeat(32), "n".repeat(32));
        let node = "dgx-3".to_string();
        let auth = BearerAuth::new(std::slice::from_ref(&shared), "agent")
            .with_node_tokens([(&node, &own)]);
        let bearer = |t: &str| format!("Bearer {t}");
        assert_eq!(auth.check(Some(bearer(&shared).as_bytes())).unwrap(), None);
        assert_eq!(
            auth.check(Some(bearer(&own).as_bytes())).unwrap(),
            Some(node.clone())
        );
        let mut request = tonic::Request::new(());
        request.extensions_mut().insert(BoundNode(node));
        assert!(BoundNode::check(&request, "dgx-3").is_ok());
        let err = BoundNode::check(&request, "dgx-4").unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        assert!(err.message().contains("belongs to node dgx-3"), "{err:?}");
        assert!(BoundNode::check(&tonic::Request::new(()), "dgx-4").is_ok());
    }
}
