//! The agent's side of the node protocol, for `marshal agent --scheduler URL`: a channel
//! (plain, TLS or mutual TLS) with a bearer token, the node-service calls, and the
//! reconnect backoff. Wire types are the generated ones; an agent maps its discovered
//! topology to [`pb::NodeInfo`] and its job processes to assignments.

use std::time::Duration;

use tonic::codegen::InterceptedService;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Status, Streaming};

use crate::service::pb;
use crate::service::pb::node_service_client::NodeServiceClient;

/// `Debug` leaves out the token and the private key (see [`redacted`]).
#[derive(Clone)]
pub struct ClientConfig {
    /// `http://host:port` or `https://host:port`.
    pub url: String,
    pub token: Option<String>,
    /// CA (PEM) the server's certificate must chain to; TLS when set.
    pub ca_pem: Option<Vec<u8>>,
    /// Client certificate and key (PEM) for mutual TLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// Name to verify the server's certificate against (defaults to the URL's host).
    pub domain: Option<String>,
    /// HTTP/2 PING (and TCP keepalive) interval; a PING unanswered for as long again
    /// closes the connection. Without it, a scheduler that vanished without closing
    /// (its host died, a firewall lost the connection's state) would hold the watch
    /// stream open until the kernel gave up retransmitting, about 15 minutes, while the
    /// scheduler requeued this node's jobs after its timeout. Default 20 s.
    pub keepalive: Duration,
    /// Deadline of each unary call (register, heartbeat, report, a telemetry batch).
    /// Default 30 s.
    pub call_timeout: Duration,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("url", &self.url)
            .field("token", &self.token.as_ref().map(|_| REDACTED))
            .field("ca_pem", &self.ca_pem.as_ref().map(|p| p.len()))
            .field("identity", &self.identity.as_ref().map(|_| REDACTED))
            .field("domain", &self.domain)
            .field("keepalive", &self.keepalive)
            .field("call_timeout", &self.call_timeout)
            .finish()
    }
}

/// What `Debug` shows for a secret: a configuration or a client printed into a log or a
/// panic message must not carry a token or a key with it.
pub const REDACTED: &str = "<redacted>";

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            url: String::new(),
            token: None,
            ca_pem: None,
            identity: None,
            domain: None,
            keepalive: Duration::from_secs(20),
            call_timeout: Duration::from_secs(30),
        }
    }
}

impl ClientConfig {
    /// Checks what no retry can fix: the URL must be `http://` or `https://` with a host
    /// (and no path), and the token printable ASCII. A connection that is refused is not
    /// checked here; the agent retries that.
    pub fn validate(&self) -> Result<(), ClientError> {
        let url_err = |m: &str| ClientError::Url {
            url: self.url.clone(),
            message: m.to_string(),
        };
        let uri: tonic::codegen::http::Uri = self
            .url
            .parse()
            .map_err(|e: tonic::codegen::http::uri::InvalidUri| url_err(&e.to_string()))?;
        match (uri.scheme_str(), self.ca_pem.is_some()) {
            (Some("http"), false) | (Some("https"), true) => {}
            // tonic speaks TLS only to https:// URLs: with http:// the CA, the client
            // certificate and the token's secrecy would all be dropped silently.
            (Some("http"), true) => {
                return Err(url_err(
                    "a CA is given (TLS) but the URL is http://: write https://",
                ));
            }
            (Some("https"), false) => {
                return Err(url_err(
                    "https:// needs the CA the scheduler's certificate chains to (--ca)",
                ));
            }
            (Some(other), _) => {
                return Err(url_err(&format!("scheme {other:?} is not http or https")));
            }
            (None, _) => return Err(url_err("no scheme; write http://host:port")),
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err(url_err("no host"));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(url_err(
                "the scheduler is addressed by scheme, host and port only (no path)",
            ));
        }
        self.token.as_deref().map(bearer).transpose()?;
        if self.keepalive.is_zero() || self.call_timeout.is_zero() {
            return Err(url_err("keepalive and call_timeout must be positive"));
        }
        Ok(())
    }
}

/// The `authorization` value for `token`, marked sensitive: HTTP/2's header compression
/// never indexes it, and its `Debug` does not show it.
fn bearer(token: &str) -> Result<MetadataValue<tonic::metadata::Ascii>, ClientError> {
    let mut value: MetadataValue<tonic::metadata::Ascii> = format!("Bearer {token}")
        .parse()
        .map_err(|_| ClientError::Token("not printable ASCII".into()))?;
    value.set_sensitive(true);
    Ok(value)
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("scheduler URL {url:?}: {message}")]
    Url { url: String, message: String },
    #[error("token: {0}")]
    Token(String),
    #[error("connecting: {0}")]
    Connect(#[from] tonic::transport::Error),
    #[error("{0}")]
    Call(#[from] Status),
}

/// The metadata key of a refused registration that says how long until the node's jobs
/// are requeued (milliseconds; see `Register` in `nodes.proto`).
pub const REQUEUE_IN_METADATA: &str = "marshal-requeue-in-ms";

impl ClientError {
    /// For a registration the scheduler refused: how long until it requeues the node's
    /// jobs, when it says (a node registered before, now unreachable).
    pub fn requeue_in(&self) -> Option<Duration> {
        let ClientError::Call(status) = self else {
            return None;
        };
        if status.code() != tonic::Code::FailedPrecondition {
            return None;
        }
        let ms: u64 = status
            .metadata()
            .get(REQUEUE_IN_METADATA)?
            .to_str()
            .ok()?
            .parse()
            .ok()?;
        Some(Duration::from_millis(ms))
    }
}

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Clone)]
pub struct Token(Option<MetadataValue<tonic::metadata::Ascii>>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Token")
            .field(&self.0.as_ref().map(|_| REDACTED))
            .finish()
    }
}

impl Interceptor for Token {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

pub async fn connect(config: &ClientConfig) -> Result<Channel, ClientError> {
    let url_err = |m: String| ClientError::Url {
        url: config.url.clone(),
        message: m,
    };
    let mut endpoint = Endpoint::from_shared(config.url.clone())
        .map_err(|e| url_err(e.to_string()))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .tcp_keepalive(Some(config.keepalive))
        .http2_keep_alive_interval(config.keepalive)
        .keep_alive_timeout(config.keepalive)
        .keep_alive_while_idle(true);
    if let Some(ca) = &config.ca_pem {
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
        if let Some(d) = &config.domain {
            tls = tls.domain_name(d.clone());
        }
        if let Some((cert, key)) = &config.identity {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        endpoint = endpoint.tls_config(tls)?;
    }
    Ok(endpoint.connect().await?)
}

/// A node agent's connection to the scheduler.
#[derive(Debug, Clone)]
pub struct AgentClient {
    client: NodeServiceClient<InterceptedService<Channel, Token>>,
    node: String,
    call_timeout: Duration,
}

/// `call`, failed with `DEADLINE_EXCEEDED` if it takes longer than `timeout`.
async fn within<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, ClientError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(reply) => Ok(reply?.into_inner()),
        Err(_) => Err(ClientError::Call(Status::deadline_exceeded(format!(
            "the scheduler did not answer within {timeout:?}"
        )))),
    }
}

impl AgentClient {
    pub async fn connect(config: &ClientConfig, node: &str) -> Result<Self, ClientError> {
        let token = config.token.as_deref().map(bearer).transpose()?;
        let channel = connect(config).await?;
        Ok(AgentClient {
            client: NodeServiceClient::with_interceptor(channel, Token(token)),
            node: node.to_string(),
            call_timeout: config.call_timeout,
        })
    }

    /// Registers with the hardware found and the jobs running now; returns what to stop
    /// and what the node should run. `stopping`: incarnations told to stop that have not
    /// ended yet. `confirms_stops`: the agent's stop grace, when it reports that stopped
    /// workers ended ([`AgentClient::report_stopped`]).
    pub async fn register(
        &mut self,
        info: pb::NodeInfo,
        running: Vec<pb::RunningJob>,
        stopping: Vec<pb::RunningJob>,
        confirms_stops: Option<Duration>,
    ) -> Result<pb::RegisterNodeResponse, ClientError> {
        let call = self.client.register(pb::RegisterNodeRequest {
            node: Some(info),
            running,
            confirms_stops: confirms_stops.is_some(),
            stop_grace_ms: confirms_stops.map_or(0, |g| g.as_millis() as u64),
            stopping,
        });
        within(self.call_timeout, call).await
    }

    /// Says that this node's workers of `job_id`'s incarnation `attempt`, told to stop,
    /// have all ended. Returns whether the scheduler was waiting for it.
    pub async fn report_stopped(&mut self, job_id: u64, attempt: u32) -> Result<bool, ClientError> {
        let call = self.client.report_stopped(pb::ReportStoppedRequest {
            node: self.node.clone(),
            job_id,
            attempt,
        });
        Ok(within(self.call_timeout, call).await?.awaited)
    }

    /// The node's assignment stream: long-lived, so it has no deadline; a dead
    /// connection ends it through the keepalive ([`ClientConfig::keepalive`]).
    pub async fn assignments(&mut self) -> Result<Streaming<pb::Assignment>, ClientError> {
        Ok(self
            .client
            .watch_assignments(pb::WatchAssignmentsRequest {
                node: self.node.clone(),
            })
            .await?
            .into_inner())
    }

    /// Says the agent is alive when it has no telemetry to send.
    pub async fn heartbeat(&mut self) -> Result<pb::NodeStatus, ClientError> {
        let call = self.client.heartbeat(pb::HeartbeatRequest {
            node: self.node.clone(),
        });
        within(self.call_timeout, call).await
    }

    /// Reports what the job's placement `attempt` did (0 skips the attempt check).
    pub async fn report(
        &mut self,
        job_id: u64,
        attempt: u32,
        state: pb::JobState,
        message: &str,
    ) -> Result<pb::Job, ClientError> {
        self.report_checkpoint(job_id, attempt, state, message, 0.0)
            .await
    }

    /// [`AgentClient::report`] with the job's last checkpoint (Unix seconds; 0: unknown,
    /// and only with RUNNING).
    pub async fn report_checkpoint(
        &mut self,
        job_id: u64,
        attempt: u32,
        state: pb::JobState,
        message: &str,
        last_checkpoint_unix_s: f64,
    ) -> Result<pb::Job, ClientError> {
        let call = self.client.report_job(pb::ReportJobRequest {
            node: self.node.clone(),
            job_id,
            state: state as i32,
            message: message.to_string(),
            attempt,
            last_checkpoint_unix_s,
        });
        within(self.call_timeout, call)
            .await?
            .job
            .ok_or_else(|| ClientError::Call(Status::internal("reply without a job")))
    }

    /// Sends a batch of samples as one telemetry stream.
    pub async fn telemetry(
        &mut self,
        samples: Vec<pb::TelemetrySample>,
    ) -> Result<pb::TelemetryAck, ClientError> {
        let call = self.client.stream_telemetry(tokio_stream::iter(samples));
        within(self.call_timeout, call).await
    }
}

/// Exponential backoff with a cap, for reconnecting: 100 ms, 200 ms, … up to `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub fn new(max: Duration) -> Self {
        Backoff {
            next: Duration::from_millis(100),
            max,
        }
    }

    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    /// After a successful session.
    pub fn reset(&mut self) {
        self.next = Duration::from_millis(100);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_refusal_with_a_well_formed_requeue_time_gives_one() {
        let with = |code: tonic::Code, value: &str| {
            let mut status = Status::new(code, "node n-0 reports 4 × H100");
            status
                .metadata_mut()
                .insert(REQUEUE_IN_METADATA, value.parse().unwrap());
            ClientError::Call(status)
        };
        assert_eq!(
            with(tonic::Code::FailedPrecondition, "1500").requeue_in(),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(with(tonic::Code::Unavailable, "1500").requeue_in(), None);
        assert_eq!(
            with(tonic::Code::FailedPrecondition, "-3").requeue_in(),
            None
        );
        let plain = ClientError::Call(Status::failed_precondition("no metadata"));
        assert_eq!(plain.requeue_in(), None);
        assert_eq!(ClientError::Token("bad".into()).requeue_in(), None);
    }

    #[test]
    fn a_printed_client_holds_neither_its_token_nor_its_key() {
        let config = ClientConfig {
            url: "https://scheduler:50051".into(),
            token: Some("node-secret-0123456789abcdef0123".into()),
            identity: Some((
                b"CERT".to_vec(),
                b"-----BEGIN PRIVATE KEY----- secret".to_vec(),
            )),
            ..ClientConfig::default()
        };
        let printed = format!("{config:?}");
        assert!(!printed.contains("secret"), "{printed}");
        assert!(printed.contains("scheduler:50051"), "{printed}");
        let header = bearer("node-secret-0123456789abcdef0123").unwrap();
        assert!(header.is_sensitive());
        let printed = format!("{:?}", Token(Some(header)));
        assert!(!printed.contains("secret"), "{printed}");
    }

    #[test]
    fn backoff_doubles_up_to_its_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(500));
        let delays: Vec<u128> = (0..5).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(delays, vec![100, 200, 400, 500, 500]);
        b.reset();
        assert_eq!(b.next_delay().as_millis(), 100);
    }

    #[test]
    fn urls_and_tokens_no_retry_can_fix_are_refused_up_front() {
        let config = |url: &str| ClientConfig {
            url: url.into(),
            ..ClientConfig::default()
        };
        for good in ["http://127.0.0.1:50051", "http://[::1]:1"] {
            config(good).validate().unwrap();
        }
        let tls = |url: &str| ClientConfig {
            ca_pem: Some(b"CA".to_vec()),
            ..config(url)
        };
        tls("https://sched.example:443/").validate().unwrap();
        // TLS asked for over plain HTTP, or HTTPS without a CA: refused, not downgraded
        // or retried for ever.
        let err = tls("http://sched:50051")
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("write https://"), "{err}");
        let err = config("https://sched:443")
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs the CA"), "{err}");
        for (bad, why) in [
            ("not a url", "invalid"),
            ("127.0.0.1:50051", "no scheme"),
            ("localhost:50051", "no scheme"),
            ("grpc://h:1", "is not http or https"),
            ("ftp://h:1", "is not http or https"),
            ("http://h:1/api", "no path"),
            ("http://h:1?x=1", "no path"),
            ("", "empty"),
        ] {
            let err = config(bad).validate().unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("scheduler URL {bad:?}")) && err.contains(why),
                "{bad}: {err}"
            );
        }
        let with_token = ClientConfig {
            token: Some("tok\nen".into()),
            ..config("http://h:1")
        };
        assert!(matches!(with_token.validate(), Err(ClientError::Token(_))));
    }

    #[test]
    fn a_scheduler_that_stops_answering_is_given_up_on() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            // Takes connections and says nothing: the kernel acknowledges every byte,
            // no HTTP/2 frame ever comes back (a host gone, a firewall that lost state).
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(async move {
                let mut held = Vec::new();
                while let Ok((socket, _)) = listener.accept().await {
                    held.push(socket);
                }
            });
            let config = ClientConfig {
                url: format!("http://{addr}"),
                keepalive: Duration::from_millis(200),
                call_timeout: Duration::from_millis(500),
                ..ClientConfig::default()
            };
            let mut client = AgentClient::connect(&config, "n-0").await.unwrap();
            let limit = Duration::from_secs(20);
            // The watch stream has no deadline: the unanswered PING ends it.
            let watch = tokio::time::timeout(limit, client.assignments()).await;
            assert!(
                matches!(watch, Ok(Err(_))),
                "the watch was not given up on within {limit:?}"
            );
            // A unary call ends at its deadline.
            let heartbeat = tokio::time::timeout(limit, client.heartbeat()).await;
            match heartbeat {
                Ok(Err(ClientError::Call(status))) => {
                    assert!(
                        matches!(
                            status.code(),
                            tonic::Code::DeadlineExceeded | tonic::Code::Unavailable
                        ),
                        "{status:?}"
                    )
                }
                other => panic!("heartbeat not given up on: {other:?}"),
            }
        });
    }
}
