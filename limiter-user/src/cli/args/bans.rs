//! The arguments of `ban`, `unban` and `list add|rm`, and the parsers
//! of a prefix and a ban's duration.

use std::time::Duration;

use clap::{Args, Subcommand};
use ipnet::IpNet;

use super::SocketArg;

/// `ban`.
#[derive(Args)]
pub struct BanArgs {
    /// The prefix (an address is a /32 or /128).
    #[arg(value_parser = prefix)]
    pub cidr: IpNet,
    /// How long: a duration (`90s`, `1h`, `2d`), whole seconds (`3600`,
    /// as fail2ban's `<bantime>`), or `forever` (also `-1`): until
    /// unbanned.
    #[arg(long = "for", value_name = "DURATION", value_parser = ban_duration)]
    pub duration: BanFor,
    /// Why, shown by `bans` (at most 47 bytes kept).
    #[arg(long, default_value = "")]
    pub reason: String,
    #[command(flatten)]
    pub socket: SocketArg,
}

#[derive(Subcommand)]
pub enum ListCommand {
    /// Add prefixes to a `[[lists]]` list's `prefixes`, live.
    Add(ListEditArgs),
    /// Remove prefixes from a list's `prefixes` (not from its file), live.
    Rm(ListEditArgs),
}

/// `list add|rm`.
#[derive(Args)]
pub struct ListEditArgs {
    /// The list's name (`status` shows them).
    pub list: String,
    /// Prefixes (an address is a /32 or /128).
    #[arg(required = true, value_parser = prefix)]
    pub prefixes: Vec<IpNet>,
    /// Also write the list's prefixes to the configuration file (edited in
    /// place); without it a reload goes back to the file.
    #[arg(long)]
    pub save: bool,
    #[command(flatten)]
    pub socket: SocketArg,
}

/// `unban`.
#[derive(Args)]
pub struct UnbanArgs {
    /// The banned prefix, exactly as banned (an address is a /32 or
    /// /128).
    #[arg(value_parser = prefix)]
    pub cidr: IpNet,
    /// Succeed when there is no such ban (it may have ended on its own:
    /// fail2ban's action uses this).
    #[arg(long)]
    pub missing_ok: bool,
    #[command(flatten)]
    pub socket: SocketArg,
}

/// A prefix, or an address as its /32 or /128 (as fail2ban passes it).
pub(super) fn prefix(text: &str) -> Result<IpNet, String> {
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from))
        .map_err(|_| format!("{text:?} is not an address or a CIDR prefix"))
}

/// How long a ban lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BanFor {
    Until(Duration),
    Forever,
}

fn ban_duration(text: &str) -> Result<BanFor, String> {
    match text {
        "forever" | "-1" => return Ok(BanFor::Forever),
        _ => {}
    }
    let duration = match text.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => humantime::parse_duration(text).map_err(|e| format!("{text:?}: {e}"))?,
    };
    if duration.is_zero() {
        return Err("a ban lasts more than zero (or `forever`)".into());
    }
    Ok(BanFor::Until(duration))
}
