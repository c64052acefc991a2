//! The library's own error type.

use std::fmt;
use std::time::Duration;

/// What went wrong in a limiter call.
///
/// The plain API (`take`, `peek`, ...) returns these; the middleware decides
/// what to do with them (fail open or closed).
#[derive(Debug)]
pub enum Error {
    /// An argument the library refuses before sending anything: NaN or an
    /// infinite number, an empty `take_all`.
    InvalidArgument(String),
    /// The call did not finish within the limiter's command timeout.
    Timeout(Duration),
    /// The `redis` client failed: connection refused or dropped, I/O error,
    /// or an error reply from the server (`ERR capacity must be a positive
    /// finite number`, `WRONGTYPE ...`, `CROSSSLOT ...`).
    Redis(redis::RedisError),
    /// The server answered something that is not a redis-tb reply.
    UnexpectedReply(String),
}

impl Error {
    /// True when the server was reached and answered with an error reply
    /// (bad arguments, wrong key type, cross-slot keys): retrying will not help.
    pub fn is_server_error(&self) -> bool {
        match self {
            Error::Redis(e) => !is_connection_problem(e),
            _ => false,
        }
    }

    /// True when Redis could not be reached or did not answer in time.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Error::Timeout(_) => true,
            Error::Redis(e) => is_connection_problem(e),
            _ => false,
        }
    }

    /// The server's error text without its code, e.g. `capacity must be a
    /// positive finite number`, when the server sent one.
    pub fn server_detail(&self) -> Option<&str> {
        match self {
            Error::Redis(e) => e.detail(),
            _ => None,
        }
    }
}

/// An error after which a connection cannot be trusted any more (a late
/// reply could be read as the answer to the next command), or that says the
/// server could not be reached.
pub(crate) fn is_connection_problem(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.kind() == redis::ErrorKind::ParseError
        || e.kind() == redis::ErrorKind::ClusterConnectionNotFound
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            Error::Timeout(d) => write!(f, "redis-tb call timed out after {} ms", d.as_millis()),
            Error::Redis(e) => write!(f, "{e}"),
            Error::UnexpectedReply(m) => write!(f, "unexpected reply: {m}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Redis(e) => Some(e),
            _ => None,
        }
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        Error::Redis(e)
    }
}

/// `Result` with the library's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
