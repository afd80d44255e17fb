//! The HTTP endpoint (`GET /metrics`): bounded connections, header and
//! lifetime timeouts, so idle scrapers cannot starve the daemon.

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use http_body_util::Full;
use hyper::{body::Bytes, service::service_fn, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::net::TcpListener;
use tracing::debug;

use crate::daemon::conns::{Backoff, Connections};

/// The text exposition of `registry`.
pub fn render(registry: &Registry) -> String {
    let mut buffer = Vec::new();
    TextEncoder::new()
        .encode(&registry.gather(), &mut buffer)
        .expect("text encoding cannot fail");
    String::from_utf8(buffer).expect("the text format is UTF-8")
}

/// Binds `addr` (failing early, with the address named, if it cannot).
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen for metrics on {addr}: {e}"))
}

/// Metrics connections served at once; a new one closes the oldest.
pub const MAX_CONNECTIONS: usize = 256;
/// A client must send its request headers within this long.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// No connection lives longer than this (a scraper reconnects).
const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

/// Serves `GET /metrics` from `registry` on `listener` until the task is
/// dropped. Connections are capped ([`MAX_CONNECTIONS`], the oldest closed
/// first), must send their headers within 5 s and live at most 60 s, and
/// accept errors back off, so idle connections cannot starve the daemon.
pub fn serve(listener: TcpListener, registry: Registry) -> tokio::task::JoinHandle<()> {
    let registry = Arc::new(registry);
    tokio::spawn(async move {
        let mut connections = Connections::new("metrics", MAX_CONNECTIONS);
        let mut backoff = Backoff::new("metrics");
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(conn) => conn,
                Err(e) => {
                    backoff.failed(&e).await;
                    continue;
                }
            };
            backoff.succeeded();
            let registry = Arc::clone(&registry);
            connections.spawn(async move {
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let registry = Arc::clone(&registry);
                    async move { Ok::<_, Infallible>(respond(&request, &registry)) }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service);
                match tokio::time::timeout(CONNECTION_LIFETIME, connection).await {
                    Ok(Err(e)) => debug!(%peer, error = %e, "metrics connection ended"),
                    Err(_) => debug!(%peer, "metrics connection closed after its lifetime"),
                    Ok(Ok(())) => {}
                }
            });
        }
    })
}

fn respond(request: &Request<hyper::body::Incoming>, registry: &Registry) -> Response<Full<Bytes>> {
    let (status, content_type, body) = if request.uri().path() == "/metrics" {
        (
            StatusCode::OK,
            "text/plain; version=0.0.4",
            render(registry),
        )
    } else {
        (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /metrics\n".to_string(),
        )
    };
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("valid response")
}
