//! The one error type of the crate: every bad input or failure becomes a variant, never a panic.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("I/O error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The model file is malformed: wrong magic, truncated, a size that exceeds the file, ...
    #[error("invalid model file: {0}")]
    InvalidModel(String),
    #[error("unsupported model: {0}")]
    Unsupported(String),
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    #[error("draft and target models are incompatible: {0}")]
    IncompatibleDraft(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("prompt of {prompt} tokens plus {requested} new tokens exceeds the context of {context} tokens")]
    ContextOverflow {
        prompt: usize,
        requested: usize,
        context: usize,
    },
    #[error("generation cancelled")]
    Cancelled,
    #[error("GPU error: {0}")]
    Gpu(String),
    #[error("GPU device lost: {0}")]
    DeviceLost(String),
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    #[error("worker failed: {0}")]
    Worker(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A stable name for the kind of error, for programs (the JS API's `error.code`).
    pub fn code(&self) -> &'static str {
        match self {
            Error::Io { .. } | Error::InvalidModel(_) | Error::Unsupported(_) | Error::Tokenizer(_) => "bad_model",
            Error::IncompatibleDraft(_) => "vocab_mismatch",
            Error::InvalidArgument(_) | Error::ContextOverflow { .. } => "invalid_argument",
            Error::Cancelled => "aborted",
            Error::Gpu(_) => "gpu_error",
            Error::DeviceLost(_) => "device_lost",
            Error::OutOfMemory(_) => "out_of_memory",
            Error::Worker(_) => "internal",
        }
    }

    pub(crate) fn invalid_model(msg: impl Into<String>) -> Self {
        Error::InvalidModel(msg.into())
    }
}
