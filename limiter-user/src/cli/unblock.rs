//! `xdp-limiter unblock CIDR`: lift the penalties (`block`) of every
//! source inside a prefix, now. The sources keep their windows: one still
//! over its limit is limited, not blocked, until its window has room.

use std::path::Path;

use ipnet::IpNet;

use super::client;
use crate::proto::{Reply, Request};

pub fn run(socket: &Path, cidr: IpNet) -> anyhow::Result<()> {
    match client::request(socket, Request::Unblock { cidr })? {
        Reply::Done { message } => {
            println!("{message}");
            Ok(())
        }
        _ => anyhow::bail!("the daemon answered `unblock` with something unexpected"),
    }
}
