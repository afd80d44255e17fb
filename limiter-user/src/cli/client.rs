//! One request, one reply over the control socket; and the one way a
//! change's answer is printed.

use std::{
    io::{BufRead, BufReader, ErrorKind, Write},
    os::unix::net::UnixStream,
    path::Path,
    time::Duration,
};

use crate::proto::{Reply, Request, RequestLine, Response, ResponseLine, PROTOCOL_VERSION};

/// Why a request got no reply.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("xdp-limiter is not running (no daemon on {0})")]
    NotRunning(String),
    #[error("permission denied on {0}: the control socket is for root only")]
    PermissionDenied(String),
    #[error("talking to the daemon on {socket}: {source}")]
    Io {
        socket: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the daemon closed the connection without answering (did it stop?)")]
    NoAnswer,
    #[error("the daemon answered something unreadable: {0}")]
    BadReply(String),
    #[error("the daemon speaks protocol {0}, this CLI {PROTOCOL_VERSION}: use matching versions")]
    Version(u32),
    #[error("{0}")]
    Refused(String),
}

/// Sends `request` to the daemon on `socket` and returns its reply.
pub fn request(socket: &Path, request: Request) -> Result<Reply, ClientError> {
    let name = socket.display().to_string();
    let io = |source| ClientError::Io {
        socket: name.clone(),
        source,
    };
    let mut stream = UnixStream::connect(socket).map_err(|e| match e.kind() {
        ErrorKind::NotFound | ErrorKind::ConnectionRefused => ClientError::NotRunning(name.clone()),
        ErrorKind::PermissionDenied => ClientError::PermissionDenied(name.clone()),
        _ => io(e),
    })?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(io)?;
    let mut line = serde_json::to_string(&RequestLine {
        version: PROTOCOL_VERSION,
        request,
    })
    .expect("requests serialise");
    line.push('\n');
    stream.write_all(line.as_bytes()).map_err(io)?;
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer).map_err(io)?;
    if answer.is_empty() {
        return Err(ClientError::NoAnswer);
    }
    let response: ResponseLine = serde_json::from_str(answer.trim_end())
        .map_err(|e| ClientError::BadReply(e.to_string()))?;
    if response.version != PROTOCOL_VERSION {
        return Err(ClientError::Version(response.version));
    }
    match response.response {
        Response::Ok(reply) => Ok(reply),
        Response::Error(message) => Err(ClientError::Refused(message)),
    }
}

/// Sends a request that changes something and prints the daemon's
/// account of the change (`Reply::Done`).
pub fn done(socket: &Path, request: Request) -> anyhow::Result<()> {
    match self::request(socket, request)? {
        Reply::Done { message } => {
            println!("{message}");
            Ok(())
        }
        _ => anyhow::bail!("the daemon answered with something unexpected"),
    }
}
