//! Bearer-token authentication, one interceptor per audience (clients or agents).

use std::sync::Arc;

use tonic::service::Interceptor;
use tonic::{Request, Status};

/// Accepts calls carrying `authorization: Bearer <token>` with one of `tokens`; with no
/// tokens configured every call passes (development on loopback). A token may be bound
/// to a node ([`BearerAuth::with_node_tokens`]): the call then carries [`BoundNode`] in
/// its extensions, and the node service lets it act as that node only.
#[derive(Clone)]
pub struct BearerAuth {
    tokens: Arc<[(Vec<u8>, Option<String>)]>,
    audience: &'static str,
    /// `bind_node_certificates`: the inventory's node names, which a client
    /// certificate's names are matched against ([`node_of_certificate`]).
    certificate_nodes: Option<Arc<std::collections::HashSet<String>>>,
    /// `require_node_certificates`: a call whose client certificate names no node is
    /// refused (the binding fails closed).
    require_certificate_node: bool,
}

impl std::fmt::Debug for BearerAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BearerAuth")
            .field("audience", &self.audience)
            .field("tokens", &self.tokens.len())
            .field(
                "certificate_nodes",
                &self.certificate_nodes.as_ref().map(|n| n.len()),
            )
            .field("require_certificate_node", &self.require_certificate_node)
            .finish()
    }
}

/// The inventory node a client certificate names (by a DNS subject alternative name,
/// or its subject's common name), if any, compared as DNS names are: without case and
/// without a trailing dot. A certificate naming two nodes is refused (it was issued
/// wrongly, and could act as either), and so is one whose names cannot be read.
pub fn node_of_certificate(
    der: &[u8],
    nodes: &std::collections::HashSet<String>,
) -> Result<Option<String>, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| format!("unreadable client certificate: {e}"))?;
    let mut names: Vec<String> = cert
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok().map(String::from))
        .collect();
    let san = cert
        .subject_alternative_name()
        .map_err(|e| format!("the client certificate's alternative names: {e}"))?;
    if let Some(san) = san {
        names.extend(san.value.general_names.iter().filter_map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
            _ => None,
        }));
    }
    let canonical = |n: &str| n.trim_end_matches('.').to_ascii_lowercase();
    let names: Vec<String> = names
        .iter()
        .filter_map(|n| {
            let n = canonical(n);
            nodes.iter().find(|node| canonical(node) == n).cloned()
        })
        .collect();
    let mut names = names;
    names.sort();
    names.dedup();
    match names.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one.clone())),
        many => Err(format!(
            "the client certificate names several nodes ({}); one node per certificate",
            many.join(", ")
        )),
    }
}

/// The node a call's token belongs to (node tokens only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundNode(pub String);

impl BoundNode {
    /// `Ok` unless the call's token belongs to another node than `node`.
    pub fn check<T>(request: &tonic::Request<T>, node: &str) -> Result<(), Status> {
        match request.extensions().get::<BoundNode>() {
            Some(BoundNode(own)) if own != node => Err(Status::permission_denied(format!(
                "this caller is bound to node {own} (by its token or client certificate), not {node}"
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
            certificate_nodes: None,
            require_certificate_node: false,
        }
    }

    /// With mutual TLS: a client certificate that names an inventory node (of `nodes`)
    /// binds the call to that node, as a node token does; a token bound to another
    /// node is then refused. With `required`, so is a call whose certificate names no
    /// node.
    pub fn with_certificate_nodes(
        self,
        nodes: impl IntoIterator<Item = String>,
        required: bool,
    ) -> Self {
        BearerAuth {
            certificate_nodes: Some(Arc::new(nodes.into_iter().collect())),
            require_certificate_node: required,
            ..self
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
        let certified = match (&self.certificate_nodes, request.peer_certs()) {
            (Some(nodes), Some(chain)) => match chain.first() {
                Some(leaf) => {
                    node_of_certificate(leaf, nodes).map_err(Status::permission_denied)?
                }
                None => None,
            },
            _ => None,
        };
        let required = self.certificate_nodes.is_some() && self.require_certificate_node;
        if let Some(node) = bind(bound, certified, required)? {
            request.extensions_mut().insert(BoundNode(node));
        }
        Ok(request)
    }
}

/// The node a call acts as, from its token's node and its certificate's: they must
/// agree when both name one, and with `certificate_required` the certificate must name
/// one.
fn bind(
    token: Option<String>,
    certificate: Option<String>,
    certificate_required: bool,
) -> Result<Option<String>, Status> {
    match (token, certificate) {
        (Some(token), Some(cert)) if token != cert => Err(Status::permission_denied(format!(
            "the token belongs to node {token} but the client certificate to node {cert}"
        ))),
        (_, None) if certificate_required => Err(Status::permission_denied(
            "the client certificate names no inventory node, and security.require_node_certificates refuses node calls without one",
        )),
        (token, cert) => Ok(cert.or(token)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate(names: &[&str]) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let cert = rcgen::CertificateParams::new(names)
            .unwrap()
            .self_signed(&key)
            .unwrap();
        cert.der().to_vec()
    }

    #[test]
    fn a_client_certificate_binds_to_the_one_node_it_names() {
        let nodes: std::collections::HashSet<String> =
            ["n-0", "n-1"].iter().map(|n| n.to_string()).collect();
        let node = |names: &[&str]| node_of_certificate(&certificate(names), &nodes);
        assert_eq!(node(&["n-1"]), Ok(Some("n-1".into())));
        assert_eq!(node(&["ops.example", "n-0"]), Ok(Some("n-0".into())));
        assert_eq!(node(&["ops.example"]), Ok(None));
        // DNS names compare without case or a trailing dot.
        assert_eq!(node(&["N-1."]), Ok(Some("n-1".into())));
        // The subject's common name counts too.
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "n-0");
        let by_cn = params.self_signed(&key).unwrap().der().to_vec();
        assert_eq!(node_of_certificate(&by_cn, &nodes), Ok(Some("n-0".into())));
        let e = node(&["n-0", "n-1"]).unwrap_err();
        assert!(e.contains("several nodes") && e.contains("n-0, n-1"), "{e}");
        let e = node_of_certificate(b"not DER", &nodes).unwrap_err();
        assert!(e.contains("unreadable client certificate"), "{e}");
    }

    #[test]
    fn a_token_and_a_certificate_bind_together_and_strictly_when_required() {
        let some = |n: &str| Some(n.to_string());
        for required in [false, true] {
            assert_eq!(
                bind(some("n-0"), some("n-0"), required).unwrap(),
                some("n-0")
            );
            assert_eq!(bind(None, some("n-1"), required).unwrap(), some("n-1"));
            let e = bind(some("n-0"), some("n-1"), required).unwrap_err();
            assert_eq!(e.code(), tonic::Code::PermissionDenied);
            assert!(e.message().contains("belongs to node n-0"), "{e:?}");
        }
        // Without a node in the certificate: the token decides, unless strict.
        assert_eq!(bind(some("n-0"), None, false).unwrap(), some("n-0"));
        assert_eq!(bind(None, None, false).unwrap(), None);
        for token in [some("n-0"), None] {
            let e = bind(token, None, true).unwrap_err();
            assert_eq!(e.code(), tonic::Code::PermissionDenied);
            assert!(e.message().contains("require_node_certificates"), "{e:?}");
        }
    }

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
        assert!(err.message().contains("bound to node dgx-3"), "{err:?}");
        assert!(BoundNode::check(&tonic::Request::new(()), "dgx-4").is_ok());
    }
}
