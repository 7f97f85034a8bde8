//! Wiring: the four services behind their interceptors, health and reflection, TLS,
//! the metrics endpoint, the cycle driver, and an orderly shutdown that commits last.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use crate::domain::ClusterSpec;
use crate::service::FILE_DESCRIPTOR_SET;
use crate::service::api::Api;
use crate::service::auth::BearerAuth;
use crate::service::config::ServiceConfig;
use crate::service::core::Core;
use crate::service::error::StartError;
use crate::service::health::Health;
use crate::service::incoming::Bounded;
use crate::service::metrics::{Metrics, serve_metrics};
use crate::service::model::ModelSlot;
use crate::service::pb::admin_service_server::AdminServiceServer;
use crate::service::pb::advisor_service_server::AdvisorServiceServer;
use crate::service::pb::job_service_server::JobServiceServer;
use crate::service::pb::node_service_server::NodeServiceServer;
use crate::service::pem::{PemKind, check_pem};
use crate::service::rpc_metrics::{KnownMethods, RpcMetricsLayer};
use crate::service::store::Store;

const SERVICES: [&str; 4] = [
    "marshal.v1.JobService",
    "marshal.v1.NodeService",
    "marshal.v1.AdvisorService",
    "marshal.v1.AdminService",
];

/// What the advisor-only server serves (besides health and reflection).
const ADVISOR_ONLY: [&str; 1] = [SERVICES[2]];

/// How long a graceful shutdown waits for open calls before dropping them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// A running server. Drop it or call [`ServerHandle::shutdown`].
#[derive(Debug)]
pub struct ServerHandle {
    pub addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    pub core: Arc<Core>,
    health: Health,
    stop: watch::Sender<bool>,
    stop_driver: watch::Sender<bool>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    driver: JoinHandle<()>,
    metrics_task: Option<JoinHandle<()>>,
    poll_task: Option<JoinHandle<()>>,
}

impl ServerHandle {
    /// Says NOT_SERVING to health checkers, stops accepting calls, ends the streams,
    /// waits for open calls (up to a grace period), then commits whatever is pending and
    /// returns. An error if changes were not persisted (a failed commit, now or
    /// earlier), so that the exit status says so; lost decision-log rows are logged.
    pub async fn shutdown(self) -> Result<(), StartError> {
        self.health.not_serving().await;
        let _ = self.stop.send(true);
        let mut server = self.server;
        let served = match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
            Ok(r) => r,
            Err(_) => {
                server.abort();
                tracing::warn!("open calls did not finish within the grace period; dropped");
                Ok(Ok(()))
            }
        };
        let _ = self.stop_driver.send(true);
        let _ = self.driver.await;
        if let Some(p) = self.poll_task {
            p.abort();
        }
        // After the driver's last commit: every committed decision and outcome is in.
        let core = self.core.clone();
        if let Ok(Some(counts)) =
            tokio::task::spawn_blocking(move || core.finish_decision_log()).await
            && counts.rows_lost > 0
        {
            tracing::error!(
                rows_lost = counts.rows_lost,
                rows_written = counts.rows_written,
                write_errors = counts.write_errors,
                "the decision log lost rows over this run"
            );
        }
        if let Some(m) = self.metrics_task {
            m.abort();
        }
        let not_persisted = self.core.committed().borrow().error.clone();
        if let Some(error) = not_persisted {
            return Err(StartError::NotPersisted(error));
        }
        match served {
            Ok(r) => r.map_err(StartError::from),
            Err(e) => Err(StartError::Io(std::io::Error::other(e.to_string()))),
        }
    }
}

/// A listener on `addr`; the error names the address and the setting it came from.
async fn bind(addr: SocketAddr, what: &'static str) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { what, addr, source })
}

/// The PEM file at `path`, which must hold a block of `kind`.
fn read(path: &std::path::Path, kind: PemKind) -> Result<Vec<u8>, StartError> {
    let pem =
        std::fs::read(path).map_err(|e| StartError::Tls(format!("{}: {e}", path.display())))?;
    check_pem(&pem, kind).map_err(|e| StartError::Tls(format!("{} {e}", path.display())))?;
    Ok(pem)
}

/// A server builder with TLS (and mutual TLS) as `config.security` says, and its
/// keepalive pings.
fn server_builder(config: &ServiceConfig) -> Result<Server, StartError> {
    let sec = &config.security;
    let mut builder = Server::builder()
        .http2_keepalive_interval(keepalive(config))
        .http2_keepalive_timeout(Some(Duration::from_millis(config.keepalive_timeout_ms)));
    if let (Some(cert), Some(key)) = (&sec.tls_cert, &sec.tls_key) {
        let mut files = format!("cert {}, key {}", cert.display(), key.display());
        let key_pem = read(key, PemKind::PrivateKey)?;
        crate::service::secret::check_private(key, "a TLS private key").map_err(StartError::Tls)?;
        let identity = Identity::from_pem(read(cert, PemKind::Certificate)?, key_pem);
        let mut tls = ServerTlsConfig::new()
            .identity(identity)
            .timeout(Duration::from_millis(config.handshake_timeout_ms));
        if let Some(ca) = &sec.client_ca {
            tls = tls.client_ca_root(Certificate::from_pem(read(ca, PemKind::Certificate)?));
            files.push_str(&format!(", client CA {}", ca.display()));
        }
        builder = builder
            .tls_config(tls)
            .map_err(|e| StartError::Tls(format!("{files}: {e}")))?;
    }
    Ok(builder)
}

/// Automatic model reload for the learned policy: checks the artifact directory every
/// `model_poll_ms` (0: never).
fn spawn_model_poll(config: &ServiceConfig, model: &Arc<dyn ModelSlot>) -> Option<JoinHandle<()>> {
    if config.policy != crate::policies::learned::LEARNED || config.model_poll_ms == 0 {
        return None;
    }
    let model = model.clone();
    let every = Duration::from_millis(config.model_poll_ms);
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let model = model.clone();
            if let Err(e) = tokio::task::spawn_blocking(move || model.poll()).await {
                tracing::error!(error = %e, "model poll task failed");
            }
        }
    }))
}

/// A running advisor-only server ([`start_advisor`]).
#[derive(Debug)]
pub struct AdvisorHandle {
    pub addr: SocketAddr,
    advisor: Arc<crate::service::shadow::ShadowAdvisor>,
    health: Health,
    stop: watch::Sender<bool>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    poll_task: Option<JoinHandle<()>>,
}

impl AdvisorHandle {
    /// Says NOT_SERVING to health checkers, stops accepting calls and waits for open
    /// ones (up to a grace period).
    pub async fn shutdown(self) -> Result<(), StartError> {
        self.health.not_serving().await;
        let _ = self.stop.send(true);
        if let Some(t) = &self.poll_task {
            t.abort();
        }
        let mut server = self.server;
        let served = match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
            Ok(Ok(r)) => r.map_err(StartError::from),
            Ok(Err(e)) => Err(StartError::Io(std::io::Error::other(e.to_string()))),
            Err(_) => {
                server.abort();
                Ok(())
            }
        };
        // Every answered call's records were written (flushed) before it answered; on
        // disk for good only once synced, which a clean stop should leave them.
        let advisor = self.advisor;
        match tokio::task::spawn_blocking(move || advisor.sync_log()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "shadow log: not synced at shutdown"),
            Err(e) => tracing::warn!(error = %e, "shadow log: sync task failed"),
        }
        served
    }
}

/// Shadow mode: serves only the Advisor service (with health and reflection, TLS and
/// client tokens as `config.security` says) on `config.listen`, appending every
/// recommendation to `shadow_log`. No database, no cluster, no cycle: it never acts.
/// `model` serves the learned policy (see [`crate::service::model_slot`]) and is
/// polled for changes like the primary server's.
pub async fn start_advisor(
    config: &ServiceConfig,
    shadow_log: &crate::service::shadow::ShadowLog,
    model: Arc<dyn ModelSlot>,
) -> Result<AdvisorHandle, StartError> {
    config.validate()?;
    if let Some(m) = &config.metrics_listen {
        // The advisor keeps no metrics; say so rather than leave a scrape target dark.
        tracing::warn!(metrics_listen = %m, "shadow mode serves no /metrics; metrics_listen is ignored");
    }
    let poll_task = spawn_model_poll(config, &model);
    let advisor = Arc::new(
        crate::service::shadow::ShadowAdvisor::open(&config.policy, shadow_log, model)
            .map_err(|e| {
                StartError::Io(std::io::Error::other(format!(
                    "shadow log {}: {e}",
                    shadow_log.path.display()
                )))
            })?
            .with_cpu_nodes_first(config.cpu_nodes_first)
            .with_quota(config.quota.clone())
            .with_max_concurrent_advise(config.max_concurrent_advise),
    );
    let listener = bind(config.listen_addr()?, "listen").await?;
    let addr = listener.local_addr()?;
    let (stop, stop_rx) = watch::channel(false);
    let (health, health_service) = Health::serving(&ADVISOR_ONLY, stop_rx.clone()).await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| StartError::Config(format!("reflection: {e}")))?;
    let clients = BearerAuth::new(&config.security.client_tokens, "client");
    let router = server_builder(config)?
        .add_service(health_service)
        .add_service(reflection)
        .add_service(AdvisorServiceServer::with_interceptor(
            advisor.clone(),
            clients,
        ));
    let server = tokio::spawn(router.serve_with_incoming_shutdown(
        accepted_without_delay(listener, config),
        crate::service::core::stopped(stop_rx),
    ));
    tracing::info!(%addr, policy = %config.policy, log = %shadow_log.path.display(), "shadow advisor");
    Ok(AdvisorHandle {
        addr,
        advisor,
        health,
        stop,
        server,
        poll_task,
    })
}

/// Opens the database, restores the state and starts serving on `config.listen`.
/// The decision log's writer never fails the scheduler (it counts lost rows), so a
/// directory it can never write is refused at start, where the operator is looking.
fn check_log_dir(dir: &std::path::Path) -> Result<(), StartError> {
    use crate::decision_log::{DECISIONS_DIR, OUTCOMES_DIR};
    let refuse =
        |e: std::io::Error| StartError::Config(format!("decision_log_dir {}: {e}", dir.display()));
    for sub in [DECISIONS_DIR, OUTCOMES_DIR] {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).map_err(refuse)?;
        let probe = d.join(".write-check");
        std::fs::write(&probe, b"").map_err(refuse)?;
        std::fs::remove_file(&probe).map_err(refuse)?;
    }
    Ok(())
}

/// Tokens for one audience and none for the other would leave the other's services open
/// to anyone who reaches the port (an empty list means "no authentication", for
/// development on loopback): with tokens, both lists are required. The shadow advisor
/// serves clients only and is not asked for agent tokens.
fn check_token_audiences(s: &crate::service::config::SecurityConfig) -> Result<(), StartError> {
    match (
        s.client_tokens.is_empty(),
        s.agent_tokens.is_empty() && s.node_tokens.is_empty(),
    ) {
        (false, true) => Err(StartError::Config(
            "security.client_tokens is set but agent_tokens and node_tokens are empty: the node service \
             (Register, ReportJob, Drain, Cordon) would accept any caller; set both, or \
             neither for development on loopback"
                .into(),
        )),
        (true, false) => Err(StartError::Config(
            "security.agent_tokens is set but client_tokens is empty: the job, advisor and \
             admin services would accept any caller; set both, or neither for development \
             on loopback"
                .into(),
        )),
        _ => Ok(()),
    }
}

pub async fn start(
    config: ServiceConfig,
    cluster: ClusterSpec,
    model: Arc<dyn ModelSlot>,
) -> Result<ServerHandle, StartError> {
    config.validate()?;
    check_token_audiences(&config.security)?;

    if let Some(dir) = &config.decision_log_dir {
        check_log_dir(dir)?;
    }
    let (db, durable) = (config.db.clone(), config.durable_commits);
    if !durable {
        tracing::warn!("durable_commits = false: a crash loses recent changes (benchmarking only)");
    }
    let store = tokio::task::spawn_blocking(move || Store::open(&db, durable))
        .await
        .map_err(|e| StartError::Io(std::io::Error::other(e.to_string())))?
        .map_err(|e| StartError::Database {
            path: config.db.display().to_string(),
            message: e.to_string(),
        })?;
    let metrics = Arc::new(Metrics::new());
    model.attach_metrics(metrics.clone());
    let core = Arc::new(Core::restore(
        &config,
        &cluster,
        Arc::new(store),
        metrics.clone(),
        model,
    )?);
    if let Some(unknown) = {
        let inner = core.lock();
        config
            .security
            .node_tokens
            .keys()
            .find(|n| inner.node_id("node", n).is_err())
            .cloned()
    } {
        return Err(StartError::Config(format!(
            "security.node_tokens names node {unknown:?}, which the inventory does not have"
        )));
    }

    let listener = bind(config.listen_addr()?, "listen").await?;
    let addr = listener.local_addr()?;
    let accept_errors = metrics.accept_errors.clone();
    let rpc_metrics = RpcMetricsLayer::new(
        metrics.clone(),
        KnownMethods::from_descriptor_sets(&[
            FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
        ])
        .map_err(|e| StartError::Config(format!("the services' descriptors: {e}")))?,
    );
    let (metrics_addr, metrics_task) = match config.metrics_addr()? {
        Some(a) => {
            let l = bind(a, "metrics_listen").await?;
            let bound = l.local_addr()?;
            (Some(bound), Some(tokio::spawn(serve_metrics(l, metrics))))
        }
        None => (None, None),
    };

    let (stop, stop_rx) = watch::channel(false);
    let (stop_driver, driver_rx) = watch::channel(false);
    let driver = {
        let loop_task = tokio::spawn(core.clone().drive(driver_rx));
        let core = core.clone();
        tokio::spawn(async move { core.driver_ended(loop_task.await) })
    };
    let poll_task = spawn_model_poll(&config, &core.model);

    let (health, health_service) = Health::serving(&SERVICES, stop_rx.clone()).await;
    // A failed commit stops all changes (see `Core::drive`); say so to health checkers.
    {
        let mut committed = core.committed();
        let health = health.clone();
        tokio::spawn(async move {
            if committed.wait_for(|c| c.error.is_some()).await.is_ok() {
                health.not_serving().await;
            }
        });
    }
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| StartError::Config(format!("reflection: {e}")))?;

    let sec = &config.security;
    let mut builder = server_builder(&config)?.layer(rpc_metrics);
    let clients = BearerAuth::new(&sec.client_tokens, "client");
    let mut agents = BearerAuth::new(&sec.agent_tokens, "agent").with_node_tokens(&sec.node_tokens);
    if sec.bind_node_certificates {
        let topo = core.lock().topo.clone();
        agents = agents.with_certificate_nodes(
            topo.node_ids().map(|n| topo.node(n).name.clone()),
            sec.require_node_certificates,
        );
    }
    let api = Api {
        core: core.clone(),
        shutdown: stop_rx.clone(),
    };
    let router = builder
        .add_service(health_service)
        .add_service(reflection)
        .add_service(JobServiceServer::with_interceptor(
            api.clone(),
            clients.clone(),
        ))
        .add_service(NodeServiceServer::with_interceptor(api.clone(), agents))
        .add_service(AdvisorServiceServer::with_interceptor(
            api.clone(),
            clients.clone(),
        ))
        .add_service(AdminServiceServer::with_interceptor(api, clients));
    let server = tokio::spawn(router.serve_with_incoming_shutdown(
        accepted_without_delay(listener, &config).counting_errors(accept_errors),
        crate::service::core::stopped(stop_rx),
    ));
    tracing::info!(%addr, policy = %config.policy, cluster = %cluster.name, "serving");
    if !addr.ip().is_loopback() && config.security.client_tokens.is_empty() {
        tracing::warn!(
            %addr,
            "no tokens: every service accepts any caller that reaches this address \
             (set security.client_tokens and agent_tokens)"
        );
    }
    if config.finished_job_retention_s.is_none() || config.decision_retention_s.is_none() {
        // Each job and decision then stays in memory and in the database for good.
        tracing::warn!(
            finished_job_retention_s = ?config.finished_job_retention_s,
            decision_retention_s = ?config.decision_retention_s,
            "no retention set: finished jobs and decision records are kept for ever"
        );
    }
    Ok(ServerHandle {
        addr,
        metrics_addr,
        core,
        health,
        stop,
        stop_driver,
        server,
        driver,
        metrics_task,
        poll_task,
    })
}

/// The server's accepted connections with `TCP_NODELAY` set, `max_connections` at a
/// time, each with `handshake_timeout_ms` to start speaking ([`Bounded`]).
/// `serve_with_incoming` ignores the builder's `tcp_nodelay`, and with Nagle's
/// algorithm on, a small reply written after a small one waits for the peer's delayed
/// ACK (about 40 ms on Linux): that was the load generator's p99, at every concurrency.
fn accepted_without_delay(listener: TcpListener, config: &ServiceConfig) -> Bounded {
    let incoming = tonic::transport::server::TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(keepalive(config));
    Bounded::new(
        incoming,
        config.max_connections,
        Duration::from_millis(config.handshake_timeout_ms),
    )
}

/// `keepalive_ms` as an interval; `None` when off.
fn keepalive(config: &ServiceConfig) -> Option<Duration> {
    (config.keepalive_ms > 0).then(|| Duration::from_millis(config.keepalive_ms))
}
