//! "Source limited" events from the kernel's ring buffer, logged as they
//! arrive. The kernel sends one per episode of refusals (a source refused
//! again within a second is the same episode) and at most a few dozen per
//! CPU per second, so a spoofed flood cannot flood the log; what it holds
//! back is counted as `event_dropped`.

use std::sync::{Arc, RwLock};

use aya::maps::{MapData, RingBuf};
use limiter_common::LimitEvent;
use tokio::io::unix::AsyncFd;
use tracing::{info, warn};

/// Rule index -> name, refreshed on every reload.
pub type RuleNames = Arc<RwLock<Vec<(u32, String)>>>;

/// Logs the events of one interface until the task is dropped.
pub fn watch(
    iface: String,
    ring: RingBuf<MapData>,
    names: RuleNames,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // SAFETY: the ring buffer owns its map fd for its whole life and
        // always returns that same fd; the AsyncFd owns the ring buffer.
        let registered =
            unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) };
        let mut ring = match registered {
            Ok(ring) => ring,
            Err(e) => {
                warn!(%iface, error = %e, "cannot poll the event ring buffer; no limit events");
                return;
            }
        };
        loop {
            let mut guard = match ring.readable_mut().await {
                Ok(guard) => guard,
                Err(e) => {
                    warn!(%iface, error = %e, "event ring buffer failed");
                    return;
                }
            };
            let ring = guard.get_inner_mut();
            while let Some(item) = ring.next() {
                if let Some(event) = parse(&item) {
                    log(&iface, &event, &names);
                }
            }
            guard.clear_ready();
        }
    })
}

/// A `LimitEvent` from ring-buffer bytes (`None` if the size is wrong).
pub fn parse(bytes: &[u8]) -> Option<LimitEvent> {
    if bytes.len() != size_of::<LimitEvent>() {
        return None;
    }
    // SAFETY: the length matches and LimitEvent is plain old data
    // (#[repr(C)], integers and byte arrays only); read_unaligned copes
    // with any alignment.
    Some(unsafe { bytes.as_ptr().cast::<LimitEvent>().read_unaligned() })
}

fn log(iface: &str, event: &LimitEvent, names: &RuleNames) {
    let rule = names
        .read()
        .ok()
        .and_then(|names| {
            names
                .iter()
                .find(|(i, _)| *i == event.rule)
                .map(|(_, n)| n.clone())
        })
        .unwrap_or_else(|| format!("#{}", event.rule));
    info!(
        iface,
        source = %event.key,
        rule,
        dry_run = event.dry_run(),
        "source limited"
    );
}
