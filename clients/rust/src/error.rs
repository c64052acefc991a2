//! The one failure rule (docs/clients.md#the-failure-rule) and the
//! library's error type: one variant per class of the rule, plus the
//! wrong-shape reply. The rule stands here, at the bottom, so that every
//! other module can turn a `redis` error into an [`Error`] without a loop.

use redis::RedisError;
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
        limiter_error(&e)
    }
}

/// `Result` with the library's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// The class of an error under the one failure rule (docs/clients.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureClass {
    /// An outage: fail open or closed as configured.
    Unavailable,
    /// The module, script or function went away: detect the backend again
    /// and retry once.
    ServerChanged,
    /// A configuration or data bug: never fail open.
    Bug,
}

/// Error-reply codes that mean the server cannot serve the call now.
const UNAVAILABLE_CODES: [&str; 9] = [
    "LOADING",
    "BUSY",
    "MASTERDOWN",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "READONLY",
    "UNBLOCKED",
    "NOREPLICAS",
    "OOM",
];

/// The class of a server error reply, given as its text (`WRONGTYPE Operation ...`).
pub fn classify_reply(reply: &str) -> FailureClass {
    let code = reply.split(' ').next().unwrap_or("");
    if UNAVAILABLE_CODES.contains(&code) {
        return FailureClass::Unavailable;
    }
    let server_changed = code == "NOSCRIPT"
        || reply.starts_with("ERR unknown command")
        || reply.starts_with("ERR Function not found")
        || reply.starts_with("ERR No matching library");
    if server_changed {
        FailureClass::ServerChanged
    } else {
        FailureClass::Bug
    }
}

/// The server's error reply as it was sent, `CODE detail`, if `e` is one.
pub(crate) fn reply_text(e: &RedisError) -> Option<String> {
    let code = e.code()?;
    Some(match e.detail() {
        Some(detail) if !detail.is_empty() => format!("{code} {detail}"),
        _ => code.to_string(),
    })
}

/// The error says the connection is gone or cannot be trusted (a late reply
/// could be read as the answer to the next command).
pub(crate) fn is_connection_problem(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.kind() == redis::ErrorKind::Parse
        || e.kind() == redis::ErrorKind::ClusterConnectionNotFound
}

/// The server closed the connection under the call (a reset, a broken
/// pipe, an end of file: a restart, a failover, `CLIENT KILL`), often while
/// it is already back: worth sending the call once more on a new
/// connection. A refused connection (the server is down) and a timeout (it
/// may be slow and still run the first copy) are not.
pub(crate) fn is_dropped(e: &RedisError) -> bool {
    e.is_connection_dropped() && !e.is_connection_refusal() && !e.is_timeout()
}

/// The class of any error the `redis` crate returns.
pub(crate) fn classify(e: &RedisError) -> FailureClass {
    match reply_text(e) {
        Some(reply) => classify_reply(&reply),
        None if is_connection_problem(e) => FailureClass::Unavailable,
        None => FailureClass::Bug,
    }
}

/// The library's error for `e`.
pub(crate) fn limiter_error(e: &RedisError) -> Error {
    match (classify(e), reply_text(e)) {
        (FailureClass::Unavailable, _) => Error::Unavailable(e.to_string()),
        (_, Some(reply)) => Error::Reply(reply),
        (_, None) => Error::Other(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_replies_fall_in_one_class_each() {
        assert_eq!(
            classify_reply("OOM command not allowed"),
            FailureClass::Unavailable
        );
        assert_eq!(classify_reply("BUSYKEY x"), FailureClass::Bug);
        assert_eq!(
            classify_reply("ERR unknown command 'TB.TAKE'"),
            FailureClass::ServerChanged
        );
        assert_eq!(classify_reply("ERR unknown subcommand"), FailureClass::Bug);
        assert_eq!(classify_reply("MOVED 1 127.0.0.1:1"), FailureClass::Bug);
    }
}
