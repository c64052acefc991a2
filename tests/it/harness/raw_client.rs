//! A bare RESP client on its own connection, for blocking commands: a TB.BTAKE or TB.ACQUIRE
//! waiter is a client whose reply has not come yet.

use std::io::Write;
use std::time::{Duration, Instant};

use super::server::Server;

/// One reply read off the wire by `RawClient`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    Ints(Vec<i64>),
    /// An array with bulk strings or nils in it, each element as text
    /// (`None`: nil).
    Items(Vec<Option<String>>),
    Error(String),
    /// Anything else, as its first line.
    Other(String),
}

impl Resp {
    /// The integer array of a reply that must be one (a TB.* grant or denial).
    pub fn ints(self) -> Vec<i64> {
        match self {
            Resp::Ints(ints) => ints,
            other => panic!("expected an integer array, got {other:?}"),
        }
    }
}

/// A bare RESP client on its own TCP connection, for blocking commands: it can send a command
/// and look for the reply later, with a timeout, without giving up the connection (a TB.BTAKE
/// waiter is a client whose reply has not come yet).
pub struct RawClient {
    stream: std::net::TcpStream,
    buffer: Vec<u8>,
}

impl RawClient {
    pub fn connect(server: &Server) -> RawClient {
        let stream = std::net::TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        RawClient {
            stream,
            buffer: Vec::new(),
        }
    }

    /// Sends one command; does not wait for its reply.
    pub fn send(&mut self, args: &[&str]) {
        self.stream.write_all(&encode(args)).expect("send");
    }

    /// The next reply, if one arrives within `within`; panics if the server closes the
    /// connection first.
    pub fn reply_within(&mut self, within: Duration) -> Option<Resp> {
        self.try_reply_within(within)
            .unwrap_or_else(|ConnectionClosed| panic!("the server closed the connection"))
    }

    /// The next reply; panics if none comes within 10 s.
    pub fn reply(&mut self) -> Resp {
        self.reply_within(Duration::from_secs(10))
            .expect("a reply within 10 s")
    }

    /// True when the server has closed the connection (reads return end of file).
    pub fn closed_within(&mut self, within: Duration) -> bool {
        use std::io::Read;
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            self.stream
                .set_read_timeout(Some(Duration::from_millis(20)))
                .expect("read timeout");
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => return true,
                Ok(read) => self.buffer.extend_from_slice(&chunk[..read]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => {}
            }
        }
        false
    }
}

/// One command as RESP: an array of bulk strings.
fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
    }
    out
}

/// One complete reply at the start of `bytes`, and how many bytes it used.
fn parse_resp(bytes: &[u8]) -> Option<(Resp, usize)> {
    let line_end = |from: usize| {
        bytes
            .get(from..)?
            .windows(2)
            .position(|w| w == b"\r\n")
            .map(|p| from + p)
    };
    let first = line_end(0)?;
    let line = String::from_utf8_lossy(&bytes[1..first]).into_owned();
    match bytes.first()? {
        b'-' => Some((Resp::Error(line), first + 2)),
        b'*' => {
            let count: usize = line.parse().ok()?;
            // Integers, bulk strings and nils (TB.ACQUIRE's lease); as text.
            let mut items: Vec<Option<String>> = Vec::with_capacity(count);
            let mut all_ints = true;
            let mut at = first + 2;
            for _ in 0..count {
                let end = line_end(at)?;
                let text = String::from_utf8_lossy(&bytes[at + 1..end]).into_owned();
                match bytes.get(at) {
                    Some(b':') => {
                        items.push(Some(text));
                        at = end + 2;
                    }
                    Some(b'$') if text == "-1" => {
                        all_ints = false;
                        items.push(None);
                        at = end + 2;
                    }
                    Some(b'$') => {
                        all_ints = false;
                        let len: usize = text.parse().ok()?;
                        let body = bytes.get(end + 2..end + 2 + len)?;
                        items.push(Some(String::from_utf8_lossy(body).into_owned()));
                        at = end + 2 + len + 2;
                        if bytes.len() < at {
                            return None;
                        }
                    }
                    _ => return Some((Resp::Other(line), end + 2)),
                }
            }
            if all_ints {
                let ints = items
                    .iter()
                    .map(|item| item.as_deref().and_then(|text| text.parse().ok()))
                    .collect::<Option<Vec<i64>>>()?;
                Some((Resp::Ints(ints), at))
            } else {
                Some((Resp::Items(items), at))
            }
        }
        _ => Some((Resp::Other(line), first + 2)),
    }
}

/// The server closed a `RawClient`'s connection (it was killed, or the server died).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionClosed;

impl RawClient {
    /// Sends several commands in one write, so the server reads (and runs) them together.
    pub fn send_all(&mut self, commands: &[&[&str]]) {
        let out: Vec<u8> = commands.iter().flat_map(|args| encode(args)).collect();
        self.stream.write_all(&out).expect("send");
    }

    /// Like `send`, but a connection the server has closed is an `Err`, not a panic.
    pub fn try_send(&mut self, args: &[&str]) -> Result<(), ConnectionClosed> {
        self.stream
            .write_all(&encode(args))
            .map_err(|_| ConnectionClosed)
    }

    /// Like `reply_within`, but a connection the server has closed (with no complete reply
    /// left to read) is an `Err`, not a panic.
    pub fn try_reply_within(&mut self, within: Duration) -> Result<Option<Resp>, ConnectionClosed> {
        use std::io::Read;
        let deadline = Instant::now() + within;
        loop {
            if let Some((reply, used)) = parse_resp(&self.buffer) {
                self.buffer.drain(..used);
                return Ok(Some(reply));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            // Even with no time left, what has already arrived is read once.
            self.stream
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .expect("read timeout");
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(ConnectionClosed),
                Ok(read) => self.buffer.extend_from_slice(&chunk[..read]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => return Err(ConnectionClosed),
            }
            if Instant::now() >= deadline {
                return Ok(parse_resp(&self.buffer).map(|(reply, used)| {
                    self.buffer.drain(..used);
                    reply
                }));
            }
        }
    }
}
