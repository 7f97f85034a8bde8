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

impl From<ServiceError> for Status {
    fn from(e: ServiceError) -> Status {
        match e {
            ServiceError::InvalidArgument(m) => Status::invalid_argument(m),
            ServiceError::NotFound(m) => Status::not_found(m),
            ServiceError::FailedPrecondition(m) => Status::failed_precondition(m),
            ServiceError::AlreadyExists(m) => Status::already_exists(m),
            ServiceError::Unavailable(m) => Status::unavailable(m),
            ServiceError::Internal(m) => Status::internal(m),
        }
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
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
}
