use marshal_telemetry::TelemetryError;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Telemetry(#[from] TelemetryError),
}
