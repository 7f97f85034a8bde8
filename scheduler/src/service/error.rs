//! The service's error type and its mapping to gRPC status codes.

use tonic::Status;

/// What went wrong with a request, by the gRPC code it maps to. Messages name the
/// offending field or object, so a client can fix the request without reading the logs.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum ServiceError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
}

impl ServiceError {
    pub fn invalid(field: &str, why: impl std::fmt::Display) -> Self {
        ServiceError::InvalidArgument(format!("{field}: {why}"))
    }
}

/// Longest status message sent, in bytes. Messages quote the request's values, and a
/// grpc-core client refuses a status whose metadata passes 16 KiB (reporting its own
/// `RESOURCE_EXHAUSTED` instead of the server's code), so a long quoted value is cut.
pub const MAX_STATUS_MESSAGE: usize = 1024;

/// `message`, cut to [`MAX_STATUS_MESSAGE`] bytes on a character boundary, saying how
/// much was left out.
fn bounded(mut message: String) -> String {
    let total = message.len();
    if total > MAX_STATUS_MESSAGE {
        message.truncate(message.floor_char_boundary(MAX_STATUS_MESSAGE));
        let left_out = total - message.len();
        message.push_str(&format!("… ({left_out} more bytes not shown)"));
    }
    message
}

impl From<ServiceError> for Status {
    fn from(e: ServiceError) -> Status {
        let (code, message) = match e {
            ServiceError::InvalidArgument(m) => (tonic::Code::InvalidArgument, m),
            ServiceError::NotFound(m) => (tonic::Code::NotFound, m),
            ServiceError::FailedPrecondition(m) => (tonic::Code::FailedPrecondition, m),
            ServiceError::AlreadyExists(m) => (tonic::Code::AlreadyExists, m),
            ServiceError::Unavailable(m) => (tonic::Code::Unavailable, m),
            ServiceError::Internal(m) => (tonic::Code::Internal, m),
        };
        Status::new(code, bounded(message))
    }
}

/// Errors starting or running the server (configuration, database, sockets, TLS).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("configuration: {0}")]
    Config(String),
    #[error("database {path}: {message}")]
    Database { path: String, message: String },
    #[error("cluster: {0}")]
    Cluster(String),
    #[error("policy: {0}")]
    Policy(String),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("cannot listen on {what} {addr}: {source}")]
    Bind {
        /// Which address of the configuration (`listen`, `metrics_listen`).
        what: &'static str,
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// At shutdown: the server had stopped persisting changes (a failed commit, or the
    /// scheduling loop's end), so the last ones are not in the database.
    #[error("changes were not persisted: {0}")]
    NotPersisted(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_quoting_a_huge_value_is_cut_to_a_bounded_message() {
        let long = format!("node {:?} is not in the inventory", "é".repeat(50_000));
        let status = Status::from(ServiceError::NotFound(long.clone()));
        assert_eq!(status.code(), tonic::Code::NotFound);
        assert!(status.message().len() <= MAX_STATUS_MESSAGE + 40);
        assert!(long.starts_with(status.message().split('…').next().unwrap()));
        assert!(
            status.message().ends_with("more bytes not shown)"),
            "{}",
            status.message()
        );
        let short = Status::from(ServiceError::invalid("spec.workers", "0 workers"));
        assert_eq!(short.message(), "spec.workers: 0 workers");
    }
}
