//! xdp-limiter userspace, as a library the `xdp-limiter` binary
//! (src/main.rs) and the integration tests build on.
//!
//! - `config`: the TOML file's form and its validation;
//! - `rules`: operator rules compiled into what the kernel reads;
//! - `crowdsec`: the CrowdSec bouncer (the local API's decision stream);
//! - `lists`: `[[lists]]` read from files and merged into trie entries;
//! - `kernel`: loading, maps, pins, attaching, pushing, reading back;
//! - `daemon`: `xdp-limiter run` (state, loop, aggregation, metrics,
//!   events, control socket);
//! - `proto`: the control protocol between daemon and CLI;
//! - `cli`: the command line (`args`) and one file per command;
//! - `lock`, `fault`: cross-process locks and start-up fault injection;
//! - `logs`: the log's format (text or JSON).

pub mod cli;
pub mod cluster;
pub mod config;
pub mod crowdsec;
pub mod daemon;
pub mod fault;
pub mod guard;
pub mod kernel;
pub mod lists;
pub mod lock;
pub mod logs;
pub mod proto;
pub mod rules;
