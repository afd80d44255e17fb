//! What can go wrong with the cluster store ([`StoreError`]), and the kind
//! of failure each is as operators tell them apart ([`ErrorKind`]).

use std::time::Duration;

use redis::RedisError;

use super::MAX_KEY;

/// Errors of the cluster store, each saying what was being done.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("invalid Redis URL `{url}`: {source}")]
    Url {
        url: String,
        #[source]
        source: RedisError,
    },
    #[error("invalid key prefix `{0}`: must be non-empty, without `{{` or `}}`")]
    Prefix(String),
    #[error("no Redis URL given")]
    NoUrl,
    #[error("mode `sentinel` needs the name the Sentinels monitor the primary under")]
    NoSentinelMaster,
    #[error("mode `single` takes exactly one Redis URL, got {0}")]
    SingleWithSeveralUrls(usize),
    #[error("cannot connect to Redis at {target}: {source}")]
    Connect {
        target: String,
        #[source]
        source: RedisError,
    },
    #[error("Redis {op} timed out after {after:?}")]
    Timeout { op: &'static str, after: Duration },
    #[error("Redis {op} failed: {source}")]
    Redis {
        op: &'static str,
        #[source]
        source: RedisError,
    },
    #[error("Redis {op} returned an unexpected reply: {detail}")]
    Reply { op: &'static str, detail: String },
    #[error("invalid window: {0}")]
    Window(String),
    #[error("invalid node name {0}")]
    Node(String),
    #[error("invalid report key `{0}`: must be 1 to {MAX_KEY} bytes")]
    Key(String),
    #[error("invalid instance token `{0}`: must be at most {MAX_KEY} bytes")]
    Token(String),
    #[error("report `{key}`: limit {limit} is above 2^53 (Lua numbers are doubles)")]
    Limit { key: String, limit: u64 },
    #[error("report `{key}`: admitted delta {admitted} exceeds offered delta {offered}")]
    Deltas {
        key: String,
        admitted: u64,
        offered: u64,
    },
    /// Another daemon heartbeats under this node's name
    /// ([`Store::heartbeat_as`]): nothing was written.
    #[error(
        "node name `{node}` is already in use: another xdp-limiter daemon (instance {holder}) \
         heartbeats into Redis under it (its claim on the name expires in {expires_in:?} \
         unless renewed); two daemons with one name would each claim the whole limit of a \
         source. Give each node a distinct `node` under [cluster] (the default is the hostname)"
    )]
    DuplicateNode {
        node: String,
        /// The other daemon's instance token.
        holder: String,
        /// When its claim on the name lapses if it stops renewing it.
        expires_in: Duration,
        /// Nodes alive as Redis counts them (the other one included,
        /// this one not).
        nodes: u32,
    },
}

/// What kind of failure a [`StoreError`] is, as operators tell them apart
/// (the `kind` label of `xdp_limiter_cluster_redis_errors_total`): a
/// timeout is a slow or hung Redis (or a stalled machine), a connection
/// failure an unreachable one, a server error a Redis that answered with
/// an error (CROSSSLOT, WRONGTYPE, CLUSTERDOWN, READONLY, ...: a
/// deployment or version problem), `other` a reply the store did not
/// expect or an input it refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    Timeout,
    Connection,
    Server,
    Other,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 4] = [
        ErrorKind::Timeout,
        ErrorKind::Connection,
        ErrorKind::Server,
        ErrorKind::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Timeout => "timeout",
            ErrorKind::Connection => "connection",
            ErrorKind::Server => "server",
            ErrorKind::Other => "other",
        }
    }
}

impl StoreError {
    /// Which kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            StoreError::Timeout { .. } => ErrorKind::Timeout,
            StoreError::Connect { source, .. } if source.is_timeout() => ErrorKind::Timeout,
            StoreError::Connect { .. } => ErrorKind::Connection,
            StoreError::Redis { source, .. } => redis_error_kind(source),
            StoreError::Url { .. }
            | StoreError::Prefix(_)
            | StoreError::NoUrl
            | StoreError::NoSentinelMaster
            | StoreError::SingleWithSeveralUrls(_)
            | StoreError::Reply { .. }
            | StoreError::Window(_)
            | StoreError::Node(_)
            | StoreError::Key(_)
            | StoreError::Token(_)
            | StoreError::Limit { .. }
            | StoreError::Deltas { .. }
            | StoreError::DuplicateNode { .. } => ErrorKind::Other,
        }
    }
}

/// The kind of a redis crate error: its I/O errors (refused, reset,
/// dropped) and lost cluster connections are connection failures, an
/// error reply from the server (which always has a code) is a server
/// error.
fn redis_error_kind(e: &RedisError) -> ErrorKind {
    use redis::ErrorKind as K;
    if e.is_timeout() {
        ErrorKind::Timeout
    } else if e.is_io_error()
        || e.is_connection_dropped()
        || e.kind() == K::ClusterConnectionNotFound
    {
        ErrorKind::Connection
    } else if e.code().is_some() {
        ErrorKind::Server
    } else {
        ErrorKind::Other
    }
}
