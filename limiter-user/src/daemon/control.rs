//! The control socket: a Unix socket owned by root with mode 0600 (and the
//! peer's uid checked as well), one JSON request line per connection,
//! answered by the daemon's main loop, which owns the maps. A bad request
//! gets an error line and changes nothing. At most 64 connections are
//! served at once (a new one closes the oldest) and accept errors back off
//! (`conns.rs`), so clients holding connections cannot lock the CLI out.
//! On shutdown the server stops
//! accepting and lets connections in flight write their answers (the
//! `detach` reply is written after the daemon has detached).

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    time::Duration,
};

use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{UnixListener, UnixStream},
    sync::{mpsc, oneshot},
    task::JoinHandle,
};
use tracing::{debug, warn};

use super::conns::{Backoff, Connections};
use crate::proto::{parse_request, Request, ResponseLine, MAX_REQUEST_BYTES};

/// A validated request waiting for the main loop's answer.
pub struct Command {
    pub request: Request,
    pub reply: oneshot::Sender<ResponseLine>,
}

/// Control connections served at once; a new one closes the oldest (each
/// has 5 s to send its request line anyway).
const MAX_CONNECTIONS: usize = 64;

/// How long shutdown waits for connections in flight to write their answers.
const DRAIN: Duration = Duration::from_secs(2);

/// The running control server.
pub struct Server {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Server {
    /// Stops accepting and waits (at most [`DRAIN`]) for the connections in
    /// flight to write their answers. Drop the command receiver first, so
    /// requests nobody will answer fail at once instead of waiting.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        if tokio::time::timeout(DRAIN, self.task).await.is_err() {
            warn!("control: connections still open after shutdown's grace period");
        }
    }
}

/// Binds `path` (replacing a stale socket, refusing if a daemon answers
/// there) with mode 0600 and serves it until [`Server::stop`].
pub async fn serve(path: &Path, commands: mpsc::Sender<Command>) -> anyhow::Result<Server> {
    if path.exists() {
        if UnixStream::connect(path).await.is_ok() {
            anyhow::bail!(
                "another xdp-limiter daemon answers on {}; stop it or set daemon.control_socket",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .map_err(|e| anyhow::anyhow!("removing the stale socket {}: {e}", path.display()))?;
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let listener = UnixListener::bind(path)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    let path = path.to_path_buf();
    let (stop, mut stopped) = oneshot::channel();
    let task = tokio::spawn(async move {
        let mut connections = Connections::new("control", MAX_CONNECTIONS);
        let mut backoff = Backoff::new("control");
        loop {
            tokio::select! {
                _ = &mut stopped => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        backoff.succeeded();
                        let commands = commands.clone();
                        connections.spawn(async move {
                            if let Err(e) = handle(stream, commands).await {
                                debug!(error = %e, "control connection ended");
                            }
                        });
                    }
                    Err(e) => {
                        debug!(socket = %path.display(), "control accept failed");
                        backoff.failed(&e).await;
                    }
                },
                _ = connections.next_ended() => {}
            }
        }
        // Our sender would keep the main loop's channel open.
        drop(commands);
        connections.drain().await;
    });
    Ok(Server { stop, task })
}

/// Removes the socket file (on shutdown).
pub fn remove(path: &PathBuf) {
    let _ = std::fs::remove_file(path);
}

async fn handle(stream: UnixStream, commands: mpsc::Sender<Command>) -> std::io::Result<()> {
    let uid = stream.peer_cred()?.uid();
    let (read, mut write) = stream.into_split();
    let response = if uid != 0 {
        ResponseLine::error("permission denied: only root may control xdp-limiter")
    } else {
        let mut line = String::new();
        let mut reader = BufReader::new(read.take(MAX_REQUEST_BYTES as u64 + 1));
        let read = tokio::time::timeout(Duration::from_secs(5), reader.read_line(&mut line)).await;
        match read {
            Err(_) => ResponseLine::error("timed out waiting for a request line"),
            Ok(Err(e)) => ResponseLine::error(format!("reading the request: {e}")),
            // The newline ends the request; it is not part of it.
            Ok(Ok(_)) if line.strip_suffix('\n').unwrap_or(&line).len() > MAX_REQUEST_BYTES => {
                ResponseLine::error(format!("request longer than {MAX_REQUEST_BYTES} bytes"))
            }
            Ok(Ok(_)) => match parse_request(line.trim_end()) {
                Err(message) => ResponseLine::error(message),
                Ok(request) => {
                    let (reply, answer) = oneshot::channel();
                    if commands.send(Command { request, reply }).await.is_err() {
                        ResponseLine::error("the daemon is shutting down")
                    } else {
                        answer
                            .await
                            .unwrap_or_else(|_| ResponseLine::error("the daemon is shutting down"))
                    }
                }
            },
        }
    };
    let mut text = serde_json::to_string(&response).expect("responses serialise");
    text.push('\n');
    write.write_all(text.as_bytes()).await?;
    write.shutdown().await
}
