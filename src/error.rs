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
    /// A request or engine setting outside its valid range. `option` is its name in snake_case;
    /// each front-end spells it its own way (the CLI's `--top-p`, the JS API's `topP`).
    #[error("invalid {option}: {reason}")]
    InvalidOption { option: &'static str, reason: String },
    #[error("prompt of {prompt} tokens plus {requested} new tokens exceeds the context of {context} tokens")]
    ContextOverflow {
        prompt: usize,
        requested: usize,
        context: usize,
    },
    #[error("the prompt of {prompt} tokens leaves no room to generate in the context of {context} tokens")]
    PromptTooLong { prompt: usize, context: usize },
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
    /// A remote target failed: unreachable, too slow, or its answer was an error or unreadable.
    /// `partial` holds the tokens the generation committed before it failed (already streamed).
    #[error("server error: {message}")]
    Server { message: String, partial: Vec<u32> },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A stable name for the kind of error, for programs (the JS API's `error.code`).
    pub fn code(&self) -> &'static str {
        match self {
            Error::Io { .. } | Error::InvalidModel(_) | Error::Unsupported(_) | Error::Tokenizer(_) => "bad_model",
            Error::IncompatibleDraft(_) => "vocab_mismatch",
            Error::InvalidArgument(_)
            | Error::InvalidOption { .. }
            | Error::ContextOverflow { .. }
            | Error::PromptTooLong { .. } => "invalid_argument",
            Error::Cancelled => "aborted",
            Error::Gpu(_) => "gpu_error",
            Error::DeviceLost(_) => "device_lost",
            Error::OutOfMemory(_) => "out_of_memory",
            Error::Worker(_) => "internal",
            Error::Server { .. } => "server_error",
        }
    }

    pub(crate) fn option(option: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidOption { option, reason: reason.into() }
    }

    pub(crate) fn server(message: impl Into<String>) -> Self {
        Error::Server { message: message.into(), partial: Vec::new() }
    }

    pub(crate) fn invalid_model(msg: impl Into<String>) -> Self {
        Error::InvalidModel(msg.into())
    }
}
