use marshal_telemetry::TelemetryError;

#[derive(Debug, thiserror::Error)]
pub enum TrainerError {
    #[error(transparent)]
    Telemetry(#[from] TelemetryError),
    #[error("no usable step profiles in {dir}: {why}")]
    NoExamples { dir: String, why: String },
    #[error("{0}")]
    Invalid(String),
}
