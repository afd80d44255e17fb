//! Bans in the kernel's ban tries (`BANS_V4`, `BANS_V6`): written, removed
//! and read back by prefix. The kernel ends a ban on its own (it compares
//! the ban's end with the frame's clock); `sweep` only removes ended ones.

use aya::maps::lpm_trie::Key;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use limiter_common::{lists::Ban, names};

use super::{push::set_config, Maps, MapsError};

/// Why a ban could not be written.
#[derive(Debug, thiserror::Error)]
pub enum BanError {
    #[error(
        "the ban table is full ({} bans of this family): unban some, or wait for bans to end",
        limiter_common::lists::MAX_BANS
    )]
    Full,
    #[error("{0}")]
    Maps(#[from] MapsError),
}

/// A ban as the kernel holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BanEntry {
    pub net: IpNet,
    pub ban: Ban,
}

/// Bans `net` with `ban` (replacing a ban of the same prefix), and tells
/// the kernel to look bans up.
pub fn ban(maps: &mut Maps, net: IpNet, ban: &Ban) -> Result<(), BanError> {
    let inserted = match net.trunc() {
        IpNet::V4(n) => maps
            .bans_v4
            .insert(
                &Key::new(u32::from(n.prefix_len()), n.addr().octets()),
                ban,
                0,
            )
            .map_err(MapsError::on(names::BANS_V4)),
        IpNet::V6(n) => maps
            .bans_v6
            .insert(
                &Key::new(u32::from(n.prefix_len()), n.addr().octets()),
                ban,
                0,
            )
            .map_err(MapsError::on(names::BANS_V6)),
    };
    match inserted {
        Err(MapsError::Map {
            source: aya::maps::MapError::SyscallError(e),
            ..
        }) if e.io_error.raw_os_error() == Some(libc::ENOSPC) => return Err(BanError::Full),
        other => other?,
    }
    set_flag(maps, true)?;
    Ok(())
}

/// Lifts the ban of exactly `net`: whether there was one.
pub fn unban(maps: &mut Maps, net: IpNet) -> Result<bool, MapsError> {
    let removed = match net.trunc() {
        IpNet::V4(n) => maps
            .bans_v4
            .remove(&Key::new(u32::from(n.prefix_len()), n.addr().octets())),
        IpNet::V6(n) => maps
            .bans_v6
            .remove(&Key::new(u32::from(n.prefix_len()), n.addr().octets())),
    };
    match removed {
        Ok(()) => Ok(true),
        Err(aya::maps::MapError::KeyNotFound) => Ok(false),
        Err(aya::maps::MapError::SyscallError(e))
            if e.io_error.raw_os_error() == Some(libc::ENOENT) =>
        {
            Ok(false)
        }
        Err(e) => Err(MapsError::on(if net.addr().is_ipv4() {
            names::BANS_V4
        } else {
            names::BANS_V6
        })(e)),
    }
}

/// Every ban the kernel holds, ended ones included.
pub fn list(maps: &Maps) -> Result<Vec<BanEntry>, MapsError> {
    let mut bans = Vec::new();
    for entry in maps.bans_v4.iter() {
        let (key, ban) = entry.map_err(MapsError::on(names::BANS_V4))?;
        let net = Ipv4Net::new(key.data().into(), key.prefix_len() as u8)
            .expect("the kernel holds valid prefix lengths");
        bans.push(BanEntry {
            net: net.into(),
            ban,
        });
    }
    for entry in maps.bans_v6.iter() {
        let (key, ban) = entry.map_err(MapsError::on(names::BANS_V6))?;
        let net = Ipv6Net::new(key.data().into(), key.prefix_len() as u8)
            .expect("the kernel holds valid prefix lengths");
        bans.push(BanEntry {
            net: net.into(),
            ban,
        });
    }
    Ok(bans)
}

/// Removes the bans ended at `now` (the kernel's clock); returns them.
/// With no ban left, the kernel stops looking bans up.
pub fn sweep(maps: &mut Maps, now: u64) -> Result<Vec<BanEntry>, MapsError> {
    let all = list(maps)?;
    let mut ended = Vec::new();
    for entry in &all {
        if !entry.ban.active(now) && unban(maps, entry.net)? {
            ended.push(*entry);
        }
    }
    if ended.len() == all.len() && maps.live_config()?.bans() {
        set_flag(maps, false)?;
    }
    Ok(ended)
}

/// Sets whether the kernel looks bans up (`Config::bans`).
fn set_flag(maps: &mut Maps, on: bool) -> Result<(), MapsError> {
    let mut config = maps.live_config()?;
    if config.bans() != on {
        config.set_bans(on);
        set_config(maps, config)?;
    }
    Ok(())
}
