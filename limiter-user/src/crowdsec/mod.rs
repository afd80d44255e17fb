//! The CrowdSec bouncer (`[crowdsec]`): a task that follows the local
//! API's decision stream (`GET /v1/decisions/stream`, the `startup` poll
//! first, then every `poll_interval`) and hands each answer to the
//! daemon's loop as a [`Batch`] of bans to set and lift (`daemon::bans`
//! applies them, origin `crowdsec`). A poll that fails is logged and
//! counted; the bans in force stay (they end by the kernel's clock), and
//! the next poll after a failure asks for the whole set again.

mod stream;

use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::{body::Bytes, Request, Uri};
use hyper_util::rt::TokioIo;
use tokio::sync::mpsc;
use tracing::{info, warn};

pub use self::stream::{Batch, Stream};
use crate::config::CrowdsecConfig;

/// Why a poll failed.
#[derive(Debug, thiserror::Error)]
pub enum PollError {
    #[error("connecting to {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("talking to the local API: {0}")]
    Http(#[from] hyper::Error),
    #[error("the local API refused the bouncer key (HTTP 403): check api_key_file")]
    Forbidden,
    #[error("the local API answered HTTP {0}")]
    Status(u16),
    #[error("the local API's answer is not a decision stream: {0}")]
    Body(#[from] serde_json::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// Polls once: the decisions since the last poll, or with `startup` all
/// of them.
async fn poll(config: &CrowdsecConfig, startup: bool) -> Result<Stream, PollError> {
    let timeout = config.poll_interval.max(Duration::from_secs(5));
    tokio::time::timeout(timeout, poll_once(config, startup))
        .await
        .map_err(|_| PollError::Timeout(timeout))?
}

async fn poll_once(config: &CrowdsecConfig, startup: bool) -> Result<Stream, PollError> {
    let base: &Uri = &config.api_url;
    let authority = base.authority().map(|a| a.as_str()).unwrap_or("127.0.0.1");
    let address = if base.port().is_some() {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    let stream = tokio::net::TcpStream::connect(&address)
        .await
        .map_err(|e| PollError::Connect(address.clone(), e))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let driver = tokio::spawn(connection);
    let path = format!(
        "{}/v1/decisions/stream{}",
        base.path().trim_end_matches('/'),
        if startup { "?startup=true" } else { "" }
    );
    let request = Request::get(path)
        .header("Host", authority)
        .header("X-Api-Key", config.api_key.as_str())
        .header(
            "User-Agent",
            concat!("xdp-limiter/", env!("CARGO_PKG_VERSION")),
        )
        .body(Empty::<Bytes>::new())
        .expect("a valid request");
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await?.to_bytes();
    driver.abort();
    match status {
        200 => Ok(serde_json::from_slice(&body)?),
        403 => Err(PollError::Forbidden),
        other => Err(PollError::Status(other)),
    }
}

/// The bouncer task: polls for ever, sending each answer's batch to the
/// daemon; `polls` counts the polls by result.
pub fn start(
    config: CrowdsecConfig,
    batches: mpsc::Sender<Batch>,
    polls: prometheus::IntCounterVec,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut startup = true;
        let mut failing = false;
        let mut interval = tokio::time::interval(config.poll_interval);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            match poll(&config, startup).await {
                Ok(stream) => {
                    polls.with_label_values(&["ok"]).inc();
                    if failing {
                        info!("crowdsec: the local API answers again");
                        failing = false;
                    }
                    if batches.send(stream.batch(startup)).await.is_err() {
                        return;
                    }
                    startup = false;
                }
                Err(e) => {
                    polls.with_label_values(&["error"]).inc();
                    if !failing {
                        warn!(error = %e, "crowdsec: polling the local API failed; the bans in force stay");
                        failing = true;
                    }
                    // What changed meanwhile is read whole next time.
                    startup = true;
                }
            }
        }
    })
}
