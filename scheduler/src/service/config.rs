//! `marshal serve` configuration (TOML). Every field has a default, so an empty file is
//! a valid development configuration; [`ServiceConfig::validate`] checks the values.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::service::error::StartError;

/// Shortest bearer token accepted: 128 bits of hex, so a token cannot be guessed.
pub const MIN_TOKEN_LEN: usize = 32;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServiceConfig {
    /// gRPC listen address; port 0 picks a free port (printed at start).
    pub listen: String,
    /// The redb database file (created when missing).
    pub db: PathBuf,
    /// Cluster inventory: a preset name or a TOML spec / node CSV path. Resolved by the
    /// binary (`marshal_datasets::load_cluster`); the library takes the built spec.
    pub cluster: String,
    /// Policy name (see `marshal list`).
    pub policy: String,
    /// Longest wait between cycles when nothing happens (time-driven decisions such as
    /// a preemption protection running out). Events trigger cycles immediately.
    pub cycle_interval_ms: u64,
    /// Nodes take work only after their agent registered. `false` treats the whole
    /// inventory as up (dry runs, load tests without agents).
    pub require_registration: bool,
    /// Placements a job gets before an agent-reported failure becomes final.
    pub max_attempts: u32,
    /// Job failures on one node before it is quarantined (taken out of scheduling).
    pub quarantine_after: u32,
    /// Prometheus `/metrics` HTTP address; absent: no metrics endpoint.
    pub metrics_listen: Option<String>,
    /// Seed of the policy's random stream (tie-breaking, `random` policy).
    pub seed: u64,
    /// fsync every commit. `false` is for measuring the scheduler without the disk: a
    /// crash then loses recent changes, which breaks the recovery guarantees.
    pub durable_commits: bool,
    /// A registered node whose agent sent nothing (telemetry, a watch opened, a report,
    /// a registration) for this long is unreachable: it takes no new work until its
    /// agent is heard from again.
    pub node_timeout_ms: u64,
    /// How long jobs on an unreachable node keep their placement before they are
    /// requeued (counted from the moment the node was marked unreachable).
    pub node_grace_ms: u64,
    /// Every this many milliseconds the server pings each connection (HTTP/2 PING, and
    /// TCP keepalive probes); a peer that does not answer within `keepalive_timeout_ms`
    /// is disconnected, so that a client or agent that vanished without closing (power
    /// lost, network cut) does not keep its watch streams open for ever. 0: off.
    pub keepalive_ms: u64,
    /// See `keepalive_ms`.
    pub keepalive_timeout_ms: u64,
    /// Connections served at once (gRPC, not metrics); more wait in the kernel's accept
    /// queue until one closes. Each holds a file descriptor: keep `ulimit -n` above it.
    pub max_connections: usize,
    /// A new connection must send its first bytes (HTTP/2 preface or TLS ClientHello)
    /// and finish its TLS handshake within this, or it is closed.
    pub handshake_timeout_ms: u64,
    /// `Advise` calls computed at once (each on a blocking thread, with its cluster
    /// snapshot in memory); more wait their turn. 0: the number of CPUs.
    pub max_concurrent_advise: usize,
    /// Jobs in a final state (completed, failed, cancelled, rejected) are deleted, from
    /// memory and from the database, this many seconds after they ended. Absent: kept
    /// forever (memory and the database then grow with every job). Their decision
    /// records stay for `Explain`, and the Parquet decision log keeps its rows.
    pub finished_job_retention_s: Option<u64>,
    /// Decision records older than this many seconds are deleted (`Explain` then answers
    /// NOT_FOUND for them); the Parquet decision log keeps its rows. Absent: kept
    /// forever. Set it longer than jobs run, or the decision behind a running job's
    /// placement goes first.
    pub decision_retention_s: Option<u64>,
    /// The learned policy's model artifact directory (`policy = "learned"` only).
    /// Absent: `models/policy-default` (`marshal serve` also looks next to its source
    /// tree). A missing or bad model is reported by `ModelInfo` and the fallback decides.
    pub model: Option<PathBuf>,
    /// The heuristic the learned policy falls back to; absent: the artifact's choice
    /// for JCT (`replay`), else `topo-pack`.
    pub fallback: Option<String>,
    /// How often the model directory is checked for a changed artifact (content hash of
    /// its files) and reloaded; 0 turns automatic reloading off.
    pub model_poll_ms: u64,
    /// Directories under which Admin `ReloadModel` may name an artifact (after symbolic
    /// links are resolved); a path elsewhere is `PERMISSION_DENIED`. Empty: the
    /// directory holding `model` (where `marshal model promote` installs versions).
    /// Reloading the configured artifact (an empty path) is always allowed.
    pub model_reload_roots: Vec<PathBuf>,
    /// Load (at start, on a poll, on `ReloadModel`) only an artifact that `marshal model
    /// promote` installed: its `<model>.promotion.json` must record a promotion of an
    /// artifact with the same content hash. Anything else is refused and the current
    /// model (or, at start, the fallback) keeps deciding.
    pub require_promotion: bool,
    /// Public key files (`marshal model keygen` writes `KEY.pub`) trusted to sign
    /// promotion records; needs `require_promotion`. When set, a record must also carry
    /// a valid signature by one of these keys, and the artifact's SHA-256 digest must be
    /// the signed one. Read (and checked) at start; relative paths are relative to the
    /// working directory, as every path here.
    pub promotion_public_keys: Vec<PathBuf>,
    /// Directory of the Parquet decision log; absent: no decision log.
    pub decision_log_dir: Option<PathBuf>,
    /// Rows per decision-log file at most.
    pub decision_log_file_rows: usize,
    /// Buffered decision-log rows are written at least this often.
    pub decision_log_flush_ms: u64,
    /// Decision-log files written longer ago than this many seconds are deleted (at
    /// start, then hourly). Absent: kept for ever (a file per flush, for good).
    pub decision_log_retention_s: Option<u64>,
    /// Nodes held for a whole-GPU gang that has waited `after_wait_s` and still cannot
    /// start (`[reservation]`: `after_wait_s`, `min_gpus`); absent: nothing is held.
    pub reservation: Option<crate::framework::ReservationConfig>,
    /// Running jobs migrated so that a whole-GPU gang that has waited `after_wait_s`
    /// and is blocked only by fragmentation fits (`[rebalance]`: `after_wait_s`,
    /// `max_moves`, `min_runtime_s`, `max_lost_s`); absent: nothing is moved.
    pub rebalance: Option<crate::framework::RebalanceConfig>,
    /// Running gangs moved onto a tighter placement when the predicted gain exceeds
    /// the move's cost (`[consolidate]`: `interval_s`, `safety_factor`, `max_moves`,
    /// `protect_s`, `remaining`); absent: nothing is moved.
    pub consolidate: Option<crate::framework::ConsolidateConfig>,
    /// Per-tenant limits on the GPUs and CPU cores running jobs hold (`[quota]`:
    /// `default` and `tenants.NAME`, each with `gpus` and `cpu_cores`); absent: none.
    pub quota: Option<crate::framework::QuotaConfig>,
    /// CPU-only jobs go to CPU-only nodes while one can take them, and to GPU nodes only
    /// otherwise (a `PreferNoSchedule` taint on GPU nodes, for every policy; also used
    /// by `Advise`).
    pub cpu_nodes_first: bool,
    /// A restart onto an inventory that no longer has a node an unfinished job is placed
    /// on (the job would be requeued while its workers may still run there), or any of
    /// the GPU models a waiting job allows (it would be rejected), goes ahead only with
    /// this set; without it the start is refused, naming the jobs, and nothing changes.
    pub accept_inventory_change: bool,
    pub security: SecurityConfig,
}

/// `Debug` shows how many tokens there are and which nodes have one, never a token.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecurityConfig {
    /// Bearer tokens for clients (jobs, advisor, admin). With any token configured,
    /// calls without a valid `authorization: Bearer <token>` are refused.
    pub client_tokens: Vec<String>,
    /// Bearer tokens for node agents (node service), valid for any node: for operators
    /// (`Drain`, `Cordon` of any node) and for sites that do not bind tokens to nodes.
    pub agent_tokens: Vec<String>,
    /// Each node's own token (node name → token): a call with it may act as that node
    /// only (`PERMISSION_DENIED` otherwise), so one compromised node cannot register,
    /// report, drain or send telemetry as another.
    pub node_tokens: std::collections::BTreeMap<String, String>,
    /// Server certificate and key (PEM): TLS on.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// CA (PEM) that client certificates must chain to: mutual TLS on.
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: a client certificate naming an inventory node (a DNS subject
    /// alternative name or the common name) binds the node service's calls to that
    /// node, as `node_tokens` do; a token bound to another node is refused.
    pub bind_node_certificates: bool,
    /// With `bind_node_certificates`: a node-service call whose client certificate
    /// names no inventory node is refused, instead of acting as its token allows (the
    /// binding fails closed).
    pub require_node_certificates: bool,
}

impl std::fmt::Debug for SecurityConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = |tokens: &[String]| format!("{} {}", tokens.len(), super::client::REDACTED);
        let nodes: Vec<&String> = self.node_tokens.keys().collect();
        f.debug_struct("SecurityConfig")
            .field("client_tokens", &count(&self.client_tokens))
            .field("agent_tokens", &count(&self.agent_tokens))
            .field("node_tokens (nodes)", &nodes)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .field("client_ca", &self.client_ca)
            .field("bind_node_certificates", &self.bind_node_certificates)
            .field("require_node_certificates", &self.require_node_certificates)
            .finish()
    }
}

/// `Ok` iff `value` lies in `range`; else the error `name = value: must be a..=b`.
fn within<T: PartialOrd + std::fmt::Display>(
    name: &str,
    value: T,
    range: std::ops::RangeInclusive<T>,
) -> Result<(), StartError> {
    if range.contains(&value) {
        return Ok(());
    }
    Err(StartError::Config(format!(
        "{name} = {value}: must be {}..={}",
        range.start(),
        range.end()
    )))
}

/// A TOML error by line and column, without the offending line that toml's own message
/// quotes: in a configuration holding tokens that line may be one.
fn toml_error(text: &str, e: &toml::de::Error) -> String {
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let line_start = before.rfind('\n').map_or(0, |i| i + 1);
            let column = before.len() - line_start + 1;
            // The key, which names what is wrong; never the value after it.
            let key = text[line_start..]
                .lines()
                .next()
                .and_then(|l| l.split_once('='))
                .map(|(k, _)| k.trim())
                // A bare key only: a line of a multi-line token list has no key, and
                // what precedes a token's own `=` is part of the token.
                .filter(|k| {
                    !k.is_empty()
                        && k.chars()
                            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
                })
                .map(|k| format!(" (key `{k}`)"))
                .unwrap_or_default();
            format!(
                "TOML error at line {line}, column {column}{key}: {}",
                e.message()
            )
        }
        None => format!("TOML error: {}", e.message()),
    }
}

impl SecurityConfig {
    /// Any bearer token configured.
    pub fn holds_tokens(&self) -> bool {
        !(self.client_tokens.is_empty()
            && self.agent_tokens.is_empty()
            && self.node_tokens.is_empty())
    }
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            listen: "127.0.0.1:50051".into(),
            db: PathBuf::from("marshal.redb"),
            cluster: "dgx-h100-64".into(),
            policy: "topo-pack".into(),
            cycle_interval_ms: 1000,
            require_registration: true,
            max_attempts: 3,
            quarantine_after: 3,
            metrics_listen: None,
            seed: 42,
            durable_commits: true,
            node_timeout_ms: 30_000,
            node_grace_ms: 60_000,
            keepalive_ms: 60_000,
            keepalive_timeout_ms: 20_000,
            max_connections: 4096,
            handshake_timeout_ms: 10_000,
            max_concurrent_advise: 0,
            finished_job_retention_s: None,
            decision_retention_s: None,
            model: None,
            fallback: None,
            model_poll_ms: 2000,
            model_reload_roots: Vec::new(),
            require_promotion: false,
            promotion_public_keys: Vec::new(),
            decision_log_dir: None,
            decision_log_file_rows: 8192,
            decision_log_flush_ms: 10_000,
            decision_log_retention_s: None,
            reservation: None,
            rebalance: None,
            consolidate: None,
            quota: None,
            cpu_nodes_first: false,
            accept_inventory_change: false,
            security: SecurityConfig::default(),
        }
    }
}

impl ServiceConfig {
    pub fn from_toml(text: &str) -> Result<Self, StartError> {
        let config: ServiceConfig =
            toml::from_str(text).map_err(|e| StartError::Config(toml_error(text, &e)))?;
        config.validate()?;
        Ok(config)
    }

    /// Reads and checks the TOML file at `path`. A file holding tokens must be closed to
    /// other users ([`crate::service::secret::check_private`]).
    pub fn from_file(path: &std::path::Path) -> Result<Self, StartError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| StartError::Config(format!("reading {}: {e}", path.display())))?;
        let config = Self::from_toml(&text).map_err(|e| match e {
            StartError::Config(m) => StartError::Config(format!("in {}: {m}", path.display())),
            other => other,
        })?;
        if config.security.holds_tokens() {
            crate::service::secret::check_private(path, "bearer tokens")
                .map_err(StartError::Config)?;
        }
        Ok(config)
    }

    pub fn listen_addr(&self) -> Result<SocketAddr, StartError> {
        self.listen
            .parse()
            .map_err(|e| StartError::Config(format!("listen = {:?}: {e}", self.listen)))
    }

    pub fn metrics_addr(&self) -> Result<Option<SocketAddr>, StartError> {
        self.metrics_listen
            .as_deref()
            .map(|a| {
                a.parse()
                    .map_err(|e| StartError::Config(format!("metrics_listen = {a:?}: {e}")))
            })
            .transpose()
    }

    pub fn validate(&self) -> Result<(), StartError> {
        let bad = |m: String| Err(StartError::Config(m));
        self.listen_addr()?;
        self.metrics_addr()?;
        if self.db.as_os_str().is_empty() {
            return bad("db: empty path".into());
        }
        if let Err(e) = crate::policies::learned::check_name(&self.policy) {
            return bad(format!("policy: {e}"));
        }
        let learned = self.policy == crate::policies::learned::LEARNED;
        if !learned && (self.model.is_some() || self.fallback.is_some()) {
            return bad(format!(
                "model and fallback apply to policy = \"learned\" only (policy is {:?})",
                self.policy
            ));
        }
        if !learned && !self.model_reload_roots.is_empty() {
            return bad(format!(
                "model_reload_roots applies to policy = \"learned\" only (policy is {:?})",
                self.policy
            ));
        }
        if self
            .model_reload_roots
            .iter()
            .any(|r| r.as_os_str().is_empty())
        {
            return bad("model_reload_roots: empty path".into());
        }
        if !learned && self.require_promotion {
            return bad(format!(
                "require_promotion applies to policy = \"learned\" only (policy is {:?})",
                self.policy
            ));
        }
        if !self.promotion_public_keys.is_empty() {
            if !self.require_promotion {
                return bad(
                    "promotion_public_keys needs require_promotion = true (the keys sign promotion records)"
                        .into(),
                );
            }
            if let Err(e) = marshal_model::policy::PromotionKeys::read(&self.promotion_public_keys)
            {
                return bad(format!("promotion_public_keys: {e}"));
            }
        }
        if let Some(f) = &self.fallback
            && let Err(e) = crate::policies::build(f, &[])
        {
            return bad(format!("fallback: {e} (a heuristic)"));
        }
        if self
            .model
            .as_ref()
            .is_some_and(|m| m.as_os_str().is_empty())
        {
            return bad("model: empty path".into());
        }
        if let Some(r) = &self.reservation
            && let Err(e) = r.validate()
        {
            return bad(e);
        }
        if let Some(r) = &self.rebalance
            && let Err(e) = r.validate()
        {
            return bad(e);
        }
        if let Some(c) = &self.consolidate
            && let Err(e) = c.validate()
        {
            return bad(e);
        }
        if let Some(q) = &self.quota
            && let Err(e) = q.validate()
        {
            return bad(format!("quota.{e}"));
        }
        if self
            .consolidate
            .is_some_and(|c| c.remaining == crate::framework::RemainingEstimate::Oracle)
        {
            return bad("consolidate remaining = \"oracle\" needs the true remaining work, which only the simulator has".into());
        }
        if self.model_poll_ms > 3_600_000 {
            return bad(format!(
                "model_poll_ms = {}: must be 0 (off) or at most 3600000",
                self.model_poll_ms
            ));
        }
        if self
            .decision_log_dir
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            return bad("decision_log_dir: empty path".into());
        }
        within(
            "decision_log_file_rows",
            self.decision_log_file_rows,
            1..=1_000_000,
        )?;
        within(
            "decision_log_flush_ms",
            self.decision_log_flush_ms,
            1..=3_600_000,
        )?;
        within("cycle_interval_ms", self.cycle_interval_ms, 1..=60_000)?;
        within("node_timeout_ms", self.node_timeout_ms, 10..=86_400_000)?;
        if self.node_grace_ms > 86_400_000 {
            return bad(format!(
                "node_grace_ms = {}: must be at most 86400000",
                self.node_grace_ms
            ));
        }
        if self.keepalive_ms > 86_400_000 {
            return bad(format!(
                "keepalive_ms = {}: must be 0 (off) or at most 86400000",
                self.keepalive_ms
            ));
        }
        if self.keepalive_ms > 0 {
            within(
                "keepalive_timeout_ms",
                self.keepalive_timeout_ms,
                1..=3_600_000,
            )?;
        }
        within("max_connections", self.max_connections, 1..=1_000_000)?;
        within(
            "handshake_timeout_ms",
            self.handshake_timeout_ms,
            100..=600_000,
        )?;
        if self.max_concurrent_advise > 4096 {
            return bad(format!(
                "max_concurrent_advise = {}: must be 0 (the number of CPUs) to 4096",
                self.max_concurrent_advise
            ));
        }
        if self.finished_job_retention_s == Some(0) {
            return bad(
                "finished_job_retention_s = 0: must be at least 1 (absent: keep every job)".into(),
            );
        }
        if self.decision_log_retention_s == Some(0) {
            return bad(
                "decision_log_retention_s = 0: must be at least 1 (absent: keep every file)".into(),
            );
        }
        if self.decision_log_retention_s.is_some() && self.decision_log_dir.is_none() {
            return bad("decision_log_retention_s needs decision_log_dir".into());
        }
        if self.decision_retention_s == Some(0) {
            return bad(
                "decision_retention_s = 0: must be at least 1 (absent: keep every decision)".into(),
            );
        }
        if self.max_attempts == 0 {
            return bad("max_attempts must be at least 1".into());
        }
        if self.quarantine_after == 0 {
            return bad("quarantine_after must be at least 1".into());
        }
        let s = &self.security;
        let every_token = s
            .client_tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (format!("client_tokens[{i}]"), t))
            .chain(
                s.agent_tokens
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (format!("agent_tokens[{i}]"), t)),
            )
            .chain(
                s.node_tokens
                    .iter()
                    .map(|(node, t)| (format!("node_tokens.{node:?}"), t)),
            );
        let mut seen = std::collections::HashMap::new();
        for (field, t) in every_token {
            if t.len() < MIN_TOKEN_LEN || !t.chars().all(|c| c.is_ascii_graphic()) {
                return bad(format!(
                    "security.{field}: at least {MIN_TOKEN_LEN} printable ASCII characters without spaces"
                ));
            }
            // One token in two places would make what a call may do depend on which
            // list is looked at first.
            if let Some(first) = seen.insert(t.as_str(), field.clone()) {
                return bad(format!(
                    "security.{field} repeats security.{first}: every token must be distinct"
                ));
            }
        }
        if s.tls_cert.is_some() != s.tls_key.is_some() {
            return bad("security: tls_cert and tls_key go together".into());
        }
        if s.client_ca.is_some() && s.tls_cert.is_none() {
            return bad("security.client_ca (mutual TLS) needs tls_cert and tls_key".into());
        }
        if s.require_node_certificates && !s.bind_node_certificates {
            return bad(
                "security.require_node_certificates needs bind_node_certificates = true".into(),
            );
        }
        if s.bind_node_certificates && s.client_ca.is_none() {
            return bad(
                "security.bind_node_certificates needs client_ca (client certificates come with mutual TLS)"
                    .into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_printed_configuration_holds_no_token() {
        let mut config = ServiceConfig::default();
        config.security.client_tokens = vec!["client-secret-0123456789abcdef0123".into()];
        config.security.agent_tokens = vec!["agent-secret-0123456789abcdef01234".into()];
        config.security.node_tokens = [("dgx-3".into(), "node-secret-0123456789abcdef0123".into())]
            .into_iter()
            .collect();
        let printed = format!("{config:?} {config:#?}");
        assert!(!printed.contains("secret"), "{printed}");
        assert!(
            printed.contains("dgx-3") && printed.contains("1 <redacted>"),
            "{printed}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_config_file_with_tokens_must_be_closed_to_other_users() {
        use std::os::unix::fs::PermissionsExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("serve.toml");
        let chmod = |m| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(m));
        // No tokens: nothing secret, any mode.
        std::fs::write(&path, "policy = \"fifo\"\n").unwrap();
        chmod(0o644).unwrap();
        assert_eq!(ServiceConfig::from_file(&path).unwrap().policy, "fifo");
        let token = "a".repeat(MIN_TOKEN_LEN);
        std::fs::write(
            &path,
            format!(
                "[security]\nclient_tokens = [\"{token}\"]\nagent_tokens = [\"{}\"]\n",
                "b".repeat(MIN_TOKEN_LEN)
            ),
        )
        .unwrap();
        let e = ServiceConfig::from_file(&path).unwrap_err().to_string();
        assert!(
            e.contains("bearer tokens") && e.contains("mode 0644"),
            "{e}"
        );
        chmod(0o640).unwrap();
        let config = ServiceConfig::from_file(&path).unwrap();
        assert_eq!(config.security.client_tokens, vec![token]);
        // Errors name the file.
        std::fs::write(&path, "polcy = 1\n").unwrap();
        let e = ServiceConfig::from_file(&path).unwrap_err().to_string();
        assert!(
            e.contains("serve.toml") && e.contains("unknown field"),
            "{e}"
        );
        assert_eq!(e.matches("configuration:").count(), 1, "{e}");
        let e = ServiceConfig::from_file(&tmp.path().join("nope.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("reading") && e.contains("nope.toml"), "{e}");
    }

    #[test]
    fn an_empty_file_is_the_default_and_valid() {
        let c = ServiceConfig::from_toml("").unwrap();
        assert_eq!(c, ServiceConfig::default());
    }

    #[test]
    fn bad_values_are_named() {
        let err = |t: &str| ServiceConfig::from_toml(t).unwrap_err().to_string();
        assert!(err("policy = \"bestfit\"").contains("unknown policy"));
        assert!(err("listen = \"nowhere\"").contains("listen"));
        assert!(err("cycle_interval_ms = 0").contains("cycle_interval_ms"));
        assert!(err("node_timeout_ms = 0").contains("node_timeout_ms"));
        assert!(err("node_grace_ms = 100000000").contains("node_grace_ms"));
        assert!(err("keepalive_ms = 100000000").contains("keepalive_ms"));
        assert!(err("keepalive_timeout_ms = 0").contains("keepalive_timeout_ms"));
        assert!(
            ServiceConfig::from_toml(
                "keepalive_ms = 0
keepalive_timeout_ms = 0"
            )
            .is_ok()
        );
        assert!(err("finished_job_retention_s = 0").contains("finished_job_retention_s"));
        assert!(err("decision_retention_s = 0").contains("decision_retention_s"));
        assert!(err("[security]\nclient_tokens = [\"short\"]").contains("client_tokens[0]"));
        assert!(err("[security]\ntls_cert = \"a.pem\"").contains("tls_key"));
        assert!(err("[security]\nclient_ca = \"ca.pem\"").contains("mutual TLS"));
        assert!(err("[security]\nbind_node_certificates = true").contains("needs client_ca"));
        assert!(
            err("[security]\nrequire_node_certificates = true")
                .contains("needs bind_node_certificates")
        );
        assert!(err("polcy = \"fifo\"").contains("unknown field"));
        // A syntax error names the place, not the line (it may hold a token).
        let secret = "s3cr3t-token-0123456789abcdef0123456789";
        let e = err(&format!("[security]\nclient_tokens = [\"{secret}\",,]"));
        assert!(e.contains("line 2") && !e.contains(secret), "{e}");
        let e = err(&format!(
            "[security]\nclient_tokens = [\n  \"{secret}=\",,\n]"
        ));
        assert!(e.contains("line 3") && !e.contains("s3cr3t"), "{e}");
        assert!(err("model = \"m\"").contains("learned"));
        assert!(err("policy = \"learned\"\nfallback = \"learned\"").contains("fallback"));
        assert!(err("policy = \"learned\"\nfallback = \"nope\"").contains("fallback"));
        assert!(err("policy = \"learned\"\nmodel_poll_ms = 99999999").contains("model_poll_ms"));
        assert!(err("model_reload_roots = [\"models\"]").contains("learned"));
        assert!(
            err("policy = \"learned\"\nmodel_reload_roots = [\"\"]").contains("model_reload_roots")
        );
        assert!(err("decision_log_file_rows = 0").contains("decision_log_file_rows"));
        assert!(err("max_connections = 0").contains("max_connections"));
        assert!(err("handshake_timeout_ms = 5").contains("handshake_timeout_ms"));
        assert!(err("max_concurrent_advise = 5000").contains("max_concurrent_advise"));
        assert!(err("decision_log_retention_s = 5").contains("needs decision_log_dir"));
        assert!(
            err("decision_log_dir = \"d\"\ndecision_log_retention_s = 0")
                .contains("decision_log_retention_s")
        );
        let reservation = |body: &str| format!("[reservation]\nmin_gpus = 8\n{body}");
        assert!(err(&reservation("after_wait_s = -1.0")).contains("after_wait_s"));
        assert!(err(&reservation("after_wait_s = 60.0\nmax_share = 2.0")).contains("max_share"));
        assert!(err("[reservation]\nafter_wait_s = 60.0\nmin_gpus = 0").contains("min_gpus"));
        let held = ServiceConfig::from_toml(&reservation("after_wait_s = 60.0")).unwrap();
        assert_eq!(held.reservation.map(|r| r.max_share), Some(0.25));
        let rebalance = |body: &str| format!("[rebalance]\n{body}");
        assert!(err(&rebalance("after_wait_s = -5.0")).contains("rebalance after_wait_s"));
        assert!(err(&rebalance("after_wait_s = 60.0\nmax_moves = 0")).contains("max_moves"));
        assert!(
            err(&rebalance("after_wait_s = 60.0\nmin_runtime_s = inf")).contains("min_runtime_s")
        );
        assert!(err(&rebalance("after_wait_s = 60.0\nmax_lost_s = -1.0")).contains("max_lost_s"));
        assert!(err(&rebalance("after_wait_s = 60.0\nmax_move = 2")).contains("unknown field"));
        assert!(err("[rebalance]\nmax_moves = 2").contains("after_wait_s"));
        let moving = ServiceConfig::from_toml(&rebalance("after_wait_s = 60.0")).unwrap();
        assert_eq!(
            moving.rebalance,
            Some(crate::framework::RebalanceConfig {
                after_wait_s: 60.0,
                ..Default::default()
            })
        );
        assert_eq!(ServiceConfig::default().rebalance, None, "off by default");
        assert!(err("[consolidate]\nsafety_factor = 0.5").contains("safety_factor"));
        assert!(err("[consolidate]\nprotect_s = -1.0").contains("protect_s"));
        assert!(err("[consolidate]\nremaining = \"oracle\"").contains("simulator"));
        assert!(err("[consolidate]\nsafety = 2.0").contains("unknown field"));
        let tightening = ServiceConfig::from_toml("[consolidate]\nmax_moves = 1").unwrap();
        assert_eq!(
            tightening.consolidate,
            Some(crate::framework::ConsolidateConfig {
                max_moves: 1,
                ..Default::default()
            })
        );
        assert_eq!(ServiceConfig::default().consolidate, None, "off by default");
        assert!(err("[quota.tenants.vision]\ngpus = -2").contains("quota.tenants.vision.gpus"));
        assert!(err("[quota.default]\ngpu = 2").contains("unknown field"));
        let limited = ServiceConfig::from_toml(
            "[quota.default]\ngpus = 8\n[quota.tenants.nlp]\ncpu_cores = 64",
        )
        .unwrap();
        let quota = limited.quota.unwrap();
        assert_eq!(quota.default.unwrap().gpus, Some(8.0));
        assert_eq!(quota.tenants["nlp"].cpu_cores, Some(64.0));
        assert!(!ServiceConfig::default().cpu_nodes_first, "off by default");
        assert!(!ServiceConfig::default().accept_inventory_change);
        assert!(
            ServiceConfig::from_toml("accept_inventory_change = true")
                .unwrap()
                .accept_inventory_change
        );
        assert!(
            ServiceConfig::from_toml("cpu_nodes_first = true")
                .unwrap()
                .cpu_nodes_first
        );
        assert!(err("cpu_nodes_first = \"yes\"").contains("cpu_nodes_first"));
        assert!(
            !ServiceConfig::default().require_promotion,
            "off by default"
        );
        assert!(
            ServiceConfig::from_toml("policy = \"learned\"\nrequire_promotion = true")
                .unwrap()
                .require_promotion
        );
        assert!(
            err("policy = \"learned\"\nrequire_promotion = \"yes\"").contains("require_promotion")
        );
        assert!(err("require_promotion = true").contains("require_promotion applies"));
        assert!(err("policy = \"learned\"\nrequire_promotions = true").contains("unknown field"));
        assert!(err("promotion_public_keys = [\"k.pub\"]").contains("needs require_promotion"));
        assert!(
            err("policy = \"learned\"\nrequire_promotion = true\npromotion_public_keys = [\"/nonexistent/k.pub\"]")
                .contains("promotion_public_keys: key file /nonexistent/k.pub")
        );
        let ok = ServiceConfig::from_toml(
            "policy = \"learned\"\nmodel = \"models/x\"\nfallback = \"fgd\"\ndecision_log_dir = \"log\"",
        )
        .unwrap();
        assert_eq!(ok.fallback.as_deref(), Some("fgd"));
    }

    #[test]
    fn promotion_public_keys_must_be_readable_public_keys() {
        let tmp = tempfile::tempdir().unwrap();
        let key = tmp.path().join("promo.key");
        marshal_model::policy::generate_key_pair(&key).unwrap();
        let public = marshal_model::policy::public_key_path(&key);
        let config = |paths: &[&std::path::Path]| {
            let list: Vec<String> = paths
                .iter()
                .map(|p| format!("{:?}", p.display().to_string()))
                .collect();
            ServiceConfig::from_toml(&format!(
                "policy = \"learned\"\nrequire_promotion = true\npromotion_public_keys = [{}]",
                list.join(", ")
            ))
        };
        assert_eq!(
            config(&[&public]).unwrap().promotion_public_keys,
            std::slice::from_ref(&public)
        );
        // The private half, or garbage, is refused naming the file.
        let e = config(&[&public, &key]).unwrap_err().to_string();
        assert!(
            e.contains("promo.key:") && e.contains("marshal-ed25519-secret"),
            "{e}"
        );
        std::fs::write(&key, "marshal-ed25519-public 00").unwrap();
        let e = config(&[&key]).unwrap_err().to_string();
        assert!(e.contains("64 hex digits"), "{e}");
    }
}
