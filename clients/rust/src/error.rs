//! The library's error type: one variant per class of the failure rule
//! (docs/clients.md#the-failure-rule), plus the wrong-shape reply.

use std::fmt;

/// What went wrong in a limiter call.
///
/// The variant is the call's class under the one failure rule (see
/// [`classify_reply`](crate::classify_reply)): [`Error::Unavailable`] is an
/// outage (the middleware fails open or closed); everything else is a
/// configuration or data bug that no retry fixes (the middleware answers 500).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// An argument or policy refused before anything was sent: a capacity
    /// or rate that is not a positive finite number (capacity at most 2^53),
    /// a cost that is not a non-negative finite number at most 2^53, an
    /// empty key, a policy name that is not printable ASCII, an empty `take_all`.
    InvalidArgument(String),
    /// The server could not be reached or could not serve the call now:
    /// connection refused, reset or closed, a timeout, or one of the error
    /// replies `LOADING`, `BUSY`, `MASTERDOWN`, `TRYAGAIN`, `CLUSTERDOWN`,
    /// `READONLY`, `UNBLOCKED`, `NOREPLICAS`, `OOM`.
    Unavailable(String),
    /// The server refused the call with an error reply that is a bug, not
    /// an outage (`ERR capacity must be ...`, `WRONGTYPE ...`, `CROSSSLOT
    /// ...`, `ERR corrupt bucket ...`, `NOPERM ...`): the reply's text,
    /// starting with its code.
    Reply(String),
    /// Anything else that is not an outage: a reply of the wrong shape, a
    /// client-side configuration error (a bad URL, failed authentication).
    Other(String),
}

impl Error {
    /// True for [`Error::Unavailable`]: the only class the middleware may fail open on.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Unavailable(_))
    }

    /// The server's error reply (`WRONGTYPE Operation against ...`), for [`Error::Reply`].
    pub fn reply(&self) -> Option<&str> {
        match self {
            Error::Reply(text) => Some(text),
            _ => None,
        }
    }

    /// The server's error text without its code (`capacity must be a
    /// positive finite number`), for [`Error::Reply`].
    pub fn server_detail(&self) -> Option<&str> {
        self.reply()
            .map(|text| text.split_once(' ').map(|(_, rest)| rest).unwrap_or(""))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            Error::Unavailable(m) => write!(f, "rate limiter unavailable: {m}"),
            Error::Reply(m) => write!(f, "the server refused the call: {m}"),
            Error::Other(m) => write!(f, "rate limiter error: {m}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<redis::RedisError> for Error {
    /// Classified by the one failure rule; a "server changed" reply that
    /// reaches the caller (the retry did not help) is a [`Error::Reply`].
    fn from(e: redis::RedisError) -> Self {
        crate::core::error_of(&e)
    }
}

/// `Result` with the library's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
