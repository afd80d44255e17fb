//! What the daemon's two listeners (metrics over TCP, control over a Unix
//! socket) share so that clients cannot starve it: a cap on connections
//! served at once, where a new connection evicts the oldest (idle
//! connections held open by someone are the oldest), and a back-off after
//! accept errors (EMFILE and the like) instead of a busy loop that logs on
//! every turn.

use std::{collections::VecDeque, future::Future, time::Duration};

use tokio::task::{AbortHandle, Id, JoinSet};
use tracing::{debug, info, warn};

/// The connections one listener serves, at most `max` at once.
pub struct Connections {
    what: &'static str,
    max: usize,
    tasks: JoinSet<()>,
    /// Live connections, oldest first.
    order: VecDeque<(Id, AbortHandle)>,
}

impl Connections {
    pub fn new(what: &'static str, max: usize) -> Self {
        Self {
            what,
            max: max.max(1),
            tasks: JoinSet::new(),
            order: VecDeque::new(),
        }
    }

    /// Serves one more connection, evicting the oldest when at the cap.
    pub fn spawn(&mut self, connection: impl Future<Output = ()> + Send + 'static) {
        self.reap();
        while self.order.len() >= self.max {
            if let Some((_, oldest)) = self.order.pop_front() {
                oldest.abort();
                debug!(
                    listener = self.what,
                    "at the connection cap: closed the oldest"
                );
            }
        }
        let handle = self.tasks.spawn(connection);
        self.order.push_back((handle.id(), handle));
    }

    /// Forgets the connections that ended.
    fn reap(&mut self) {
        while let Some(ended) = self.tasks.try_join_next_with_id() {
            let id = match ended {
                Ok((id, ())) => id,
                Err(e) => e.id(),
            };
            self.order.retain(|(live, _)| *live != id);
        }
    }

    /// Live connections.
    #[cfg(test)]
    pub fn len(&mut self) -> usize {
        self.reap();
        self.order.len()
    }

    /// Waits for the next connection to end (pending forever when none is
    /// live), so a `select!` loop can reap them as they go.
    pub async fn next_ended(&mut self) {
        match self.tasks.join_next_with_id().await {
            Some(Ok((id, ()))) => self.order.retain(|(live, _)| *live != id),
            Some(Err(e)) => {
                let id = e.id();
                self.order.retain(|(live, _)| *live != id);
            }
            None => std::future::pending().await,
        }
    }

    /// Waits for every live connection to end.
    pub async fn drain(mut self) {
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Back-off after failed accepts: waits 10 ms, doubling up to 1 s, until an
/// accept succeeds; says so once per streak of failures.
pub struct Backoff {
    what: &'static str,
    delay: Duration,
    failures: u64,
}

const FIRST_DELAY: Duration = Duration::from_millis(10);
const MAX_DELAY: Duration = Duration::from_secs(1);

impl Backoff {
    pub fn new(what: &'static str) -> Self {
        Self {
            what,
            delay: FIRST_DELAY,
            failures: 0,
        }
    }

    /// After a failed accept: logs the first of a streak, then waits.
    pub async fn failed(&mut self, error: &std::io::Error) {
        if self.failures == 0 {
            warn!(listener = self.what, %error, "accept failed; backing off until it works again");
        }
        self.failures += 1;
        tokio::time::sleep(self.delay).await;
        self.delay = (self.delay * 2).min(MAX_DELAY);
    }

    /// After an accept that worked.
    pub fn succeeded(&mut self) {
        if self.failures != 0 {
            info!(
                listener = self.what,
                failed = self.failures,
                "accepting connections again"
            );
        }
        self.failures = 0;
        self.delay = FIRST_DELAY;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_new_connection_evicts_the_oldest_at_the_cap() {
        let mut conns = Connections::new("test", 3);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for i in 0..5 {
            let tx = tx.clone();
            conns.spawn(async move {
                // Says when it is dropped: evicted (aborted) or ended.
                struct Bye(usize, tokio::sync::mpsc::UnboundedSender<usize>);
                impl Drop for Bye {
                    fn drop(&mut self) {
                        let _ = self.1.send(self.0);
                    }
                }
                let _bye = Bye(i, tx);
                std::future::pending::<()>().await
            });
            tokio::task::yield_now().await;
        }
        let mut gone = vec![rx.recv().await.unwrap(), rx.recv().await.unwrap()];
        gone.sort_unstable();
        assert_eq!(gone, vec![0, 1], "the two oldest were closed");
        assert_eq!(conns.len(), 3);
    }
}
