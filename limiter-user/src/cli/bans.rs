//! `xdp-limiter ban CIDR --for D`, `unban CIDR`, `bans`: the daemon's
//! bans (`daemon::bans`), which fail2ban's action and the CrowdSec
//! bouncer set too; and `list add|rm NAME CIDR...`, a list's own
//! prefixes edited live.

use std::path::Path;

use super::{
    args::{BanArgs, BanFor, ListCommand, UnbanArgs},
    client, Output,
};
use crate::proto::{BanStatus, ListOp, Reply, Request};

pub fn ban(args: &BanArgs) -> anyhow::Result<()> {
    let duration = match args.duration {
        BanFor::Until(duration) => Some(duration),
        BanFor::Forever => None,
    };
    client::done(
        &args.socket.path,
        Request::Ban {
            cidr: args.cidr,
            duration,
            reason: args.reason.clone(),
        },
    )
}

pub fn unban(args: &UnbanArgs) -> anyhow::Result<()> {
    client::done(
        &args.socket.path,
        Request::Unban {
            cidr: args.cidr,
            missing_ok: args.missing_ok,
        },
    )
}

pub fn edit_list(command: ListCommand) -> anyhow::Result<()> {
    let (op, args) = match command {
        ListCommand::Add(args) => (ListOp::Add, args),
        ListCommand::Rm(args) => (ListOp::Remove, args),
    };
    client::done(
        &args.socket.path,
        Request::ListEdit {
            list: args.list,
            op,
            prefixes: args.prefixes,
            save: args.save,
        },
    )
}

pub fn list(socket: &Path, output: Output) -> anyhow::Result<()> {
    let Reply::Bans { bans } = client::request(socket, Request::Bans)? else {
        anyhow::bail!("the daemon answered `bans` with something else");
    };
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&bans)?),
        Output::Text => print!("{}", render(&bans)),
    }
    Ok(())
}

/// The human form: one ban a line.
pub fn render(bans: &[BanStatus]) -> String {
    if bans.is_empty() {
        return "no bans\n".to_string();
    }
    let mut text = format!(
        "{:<43} {:>12} {:>10} {:<8} {}\n",
        "prefix", "remaining", "age", "origin", "reason"
    );
    for ban in bans {
        let remaining = ban.remaining_s.map_or("forever".to_string(), seconds);
        text.push_str(&format!(
            "{:<43} {:>12} {:>10} {:<8} {}\n",
            ban.cidr.to_string(),
            remaining,
            seconds(ban.age_s),
            ban.origin,
            ban.reason
        ));
    }
    text
}

/// `3725` -> `1h2m5s`.
fn seconds(s: u64) -> String {
    humantime::format_duration(std::time::Duration::from_secs(s))
        .to_string()
        .replace(' ', "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bans_render_one_a_line() {
        let bans = [BanStatus {
            cidr: "192.0.2.0/24".parse().unwrap(),
            remaining_s: Some(3725),
            age_s: 5,
            origin: "cli".into(),
            reason: "sshd".into(),
        }];
        let text = render(&bans);
        assert!(text.contains("192.0.2.0/24"), "{text}");
        assert!(text.contains("1h2m5s"), "{text}");
        assert_eq!(render(&[]), "no bans\n");
    }
}
