//! The one error type of the crate: every bad input or failure becomes a variant, never a panic.

use std::fmt;

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
    /// A JSON schema, regex or grammar that cannot be compiled, or that the output cannot follow.
    #[error("invalid grammar: {0}")]
    InvalidGrammar(String),
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

/// What kind of failure an error is, for programs: the JS API's `error.code`. Its string form is
/// serde's (`"invalid_argument"`), the one the package's TypeScript union is generated from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The model could not be read: unreachable, malformed or unsupported.
    BadModel,
    /// The draft's vocabulary is not the target's.
    VocabMismatch,
    /// WebGPU was asked for where there is none (a browser without an adapter, Node).
    #[serde(rename = "no_webgpu")]
    NoWebGpu,
    DeviceLost,
    OutOfMemory,
    /// An option or argument out of its range, or a call the engine's state does not allow.
    InvalidArgument,
    /// A JSON schema, regex or grammar the engine cannot compile or follow.
    InvalidGrammar,
    /// The generation was stopped by its caller.
    Aborted,
    GpuError,
    /// A server target failed: unreachable, too slow, or its answer an error.
    ServerError,
    /// A failure inside the engine (a worker that stopped, a panic).
    Internal,
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::String(s)) => f.write_str(&s),
            _ => Err(fmt::Error),
        }
    }
}

impl Error {
    /// A stable name for the kind of error, for programs (the JS API's `error.code`).
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Io { .. } | Error::InvalidModel(_) | Error::Unsupported(_) | Error::Tokenizer(_) => ErrorCode::BadModel,
            Error::IncompatibleDraft(_) => ErrorCode::VocabMismatch,
            Error::InvalidArgument(_)
            | Error::InvalidOption { .. }
            | Error::ContextOverflow { .. }
            | Error::PromptTooLong { .. } => ErrorCode::InvalidArgument,
            Error::InvalidGrammar(_) => ErrorCode::InvalidGrammar,
            Error::Cancelled => ErrorCode::Aborted,
            Error::Gpu(_) => ErrorCode::GpuError,
            Error::DeviceLost(_) => ErrorCode::DeviceLost,
            Error::OutOfMemory(_) => ErrorCode::OutOfMemory,
            Error::Worker(_) => ErrorCode::Internal,
            Error::Server { .. } => ErrorCode::ServerError,
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
