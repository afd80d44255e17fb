//! `xdp-limiter top`: the heaviest sources of the daemon's last pass, or
//! with `--level` the fullest aggregates of the levels it selects.
//! `--once` prints one frame (for scripts); otherwise the view refreshes
//! every second: `q` quits, `p`, `b` and `d` sort the sources by packets,
//! bits or drops.

use std::{
    io::{IsTerminal, Read, Write},
    os::fd::AsFd,
    path::Path,
};

use clap::ValueEnum;
use nix::{
    poll::{poll, PollFd, PollFlags, PollTimeout},
    sys::termios::{self, LocalFlags, SetArg, Termios},
};

use super::{client, Output};
use crate::proto::{Reply, Request, TopAggregate, TopSource};

/// What `top` sorts by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum SortBy {
    #[default]
    Pps,
    Bps,
    Dropped,
}

pub fn run(
    socket: &Path,
    output: Output,
    limit: usize,
    once: bool,
    mut sort: SortBy,
) -> anyhow::Result<()> {
    let (interactive, _raw) = keys(output, once);
    loop {
        let request = Request::Top { limit, level: None };
        let Reply::Top { mut sources } = client::request(socket, request)? else {
            anyhow::bail!("the daemon answered `top` with something else");
        };
        sort_sources(&mut sources, sort);
        let header = format!("sorted by {sort:?} (q quits; p, b, d sort)");
        show(output, once, &header, &sources, || render(&sources))?;
        if once {
            return Ok(());
        }
        match wait_key(interactive) {
            Some(b'q') => return Ok(()),
            Some(b'p') => sort = SortBy::Pps,
            Some(b'b') => sort = SortBy::Bps,
            Some(b'd') => sort = SortBy::Dropped,
            _ => {}
        }
    }
}

/// `top --level SELECTOR`: the aggregates, fullest first (the daemon
/// sorts them); `q` quits the refreshing view.
pub fn run_levels(
    socket: &Path,
    output: Output,
    limit: usize,
    once: bool,
    level: &str,
) -> anyhow::Result<()> {
    let (interactive, _raw) = keys(output, once);
    loop {
        let request = Request::Top {
            limit,
            level: Some(level.to_string()),
        };
        let Reply::Aggregates { aggregates } = client::request(socket, request)? else {
            anyhow::bail!("the daemon answered `top --level` with something else");
        };
        let header = format!("levels {level}, fullest first (q quits)");
        show(output, once, &header, &aggregates, || {
            render_aggregates(&aggregates)
        })?;
        if once || wait_key(interactive) == Some(b'q') {
            return Ok(());
        }
    }
}

/// Whether the view reads keys (a refreshing text view on a terminal),
/// and the raw terminal mode that lets it, restored when dropped.
fn keys(output: Output, once: bool) -> (bool, Option<RawInput>) {
    let interactive = !once && output == Output::Text && std::io::stdin().is_terminal();
    let raw = if interactive {
        RawInput::enable()
    } else {
        None
    };
    (interactive, raw)
}

/// Prints one frame of a view: `value` as JSON, or `text()` under a
/// header when the view refreshes (the screen cleared and the cursor
/// homed between frames).
fn show<T: serde::Serialize>(
    output: Output,
    once: bool,
    header: &str,
    value: &T,
    text: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(value)?),
        Output::Text => {
            if !once {
                print!("\x1b[2J\x1b[H");
                println!("xdp-limiter top: {header}\n");
            }
            print!("{}", text());
            std::io::stdout().flush()?;
        }
    }
    Ok(())
}

/// Waits up to a second for a key (or just a second when not interactive).
fn wait_key(interactive: bool) -> Option<u8> {
    if !interactive {
        std::thread::sleep(std::time::Duration::from_secs(1));
        return None;
    }
    let stdin = std::io::stdin();
    let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
    if poll(&mut fds, PollTimeout::from(1000u16)).ok()? == 0 {
        return None;
    }
    let mut key = [0u8; 1];
    stdin.lock().read_exact(&mut key).ok()?;
    Some(key[0])
}

fn sort_sources(sources: &mut [TopSource], sort: SortBy) {
    sources.sort_by_key(|s| {
        std::cmp::Reverse(match sort {
            SortBy::Pps => s.pps,
            SortBy::Bps => s.bps,
            SortBy::Dropped => s.dropped,
        })
    });
}

/// The terminal in key-at-a-time mode while `top` runs; restored on drop.
struct RawInput {
    saved: Termios,
}

impl RawInput {
    fn enable() -> Option<Self> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(stdin.as_fd()).ok()?;
        let mut raw = saved.clone();
        raw.local_flags
            .remove(LocalFlags::ICANON | LocalFlags::ECHO);
        termios::tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &raw).ok()?;
        Some(Self { saved })
    }
}

impl Drop for RawInput {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSANOW, &self.saved);
    }
}

/// The human form: one line per source.
pub fn render(sources: &[TopSource]) -> String {
    let mut text = format!(
        "{:<30} {:<10} {:>10} {:>14} {:>12} {:>9} {:<10} state\n",
        "source", "interface", "pps", "bps", "dropped", "limit", "rule"
    );
    for s in sources {
        let limit = s.limit_pps.map_or("-".to_string(), |l| l.to_string());
        text.push_str(&format!(
            "{:<30} {:<10} {:>10} {:>14} {:>12} {:>9} {:<10} {}\n",
            s.source, s.interface, s.pps, s.bps, s.dropped, limit, s.rule, s.state
        ));
    }
    text
}

/// The human form of `top --level`: one line per aggregate.
pub fn render_aggregates(aggregates: &[TopAggregate]) -> String {
    let mut text = format!(
        "{:<10} {:<22} {:<32} {:>10} {:>10} {:>7}  interface\n",
        "rule", "level", "aggregate", "packets", "allowance", "used"
    );
    for a in aggregates {
        text.push_str(&format!(
            "{:<10} {:<22} {:<32} {:>10} {:>10} {:>6.1}%  {}\n",
            a.rule,
            a.level,
            a.key,
            a.packets,
            a.allowance,
            a.used * 100.0,
            a.interface
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_aggregate_is_one_line_of_its_fields() {
        let row = |key: &str, packets: u64| TopAggregate {
            interface: "veth-rx".into(),
            rule: "rules[1]".into(),
            level: "prefix/24/48@1m".into(),
            key: key.into(),
            packets,
            allowance: 600,
            used: packets as f64 / 600.0,
        };
        let text = render_aggregates(&[row("192.0.2.0/24", 25), row("192.0.3.0/24", 7)]);
        let lines: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines,
            [
                vec![
                    "rule",
                    "level",
                    "aggregate",
                    "packets",
                    "allowance",
                    "used",
                    "interface"
                ],
                vec![
                    "rules[1]",
                    "prefix/24/48@1m",
                    "192.0.2.0/24",
                    "25",
                    "600",
                    "4.2%",
                    "veth-rx"
                ],
                vec![
                    "rules[1]",
                    "prefix/24/48@1m",
                    "192.0.3.0/24",
                    "7",
                    "600",
                    "1.2%",
                    "veth-rx"
                ],
            ]
        );
    }
}
