//! The crate's one error type.

/// What can go wrong reading metrics text (the rules themselves cannot fail).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DoctorError {
    #[error("metrics line {line}: {reason}: {text:?}")]
    Exposition {
        line: usize,
        reason: &'static str,
        text: String,
    },
    #[error("Prometheus answer: {0}")]
    Prometheus(String),
}
