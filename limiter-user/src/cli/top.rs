//! `xdp-limiter top`: the heaviest sources of the daemon's last pass.
//! `--once` prints one frame; without it the view refreshes every second
//! until interrupted.

use std::{path::Path, time::Duration};

use super::{client, Output};
use crate::proto::{Reply, Request, TopSource};

pub fn run(socket: &Path, output: Output, limit: usize, once: bool) -> anyhow::Result<()> {
    loop {
        let Reply::Top { sources } = client::request(socket, Request::Top { limit })? else {
            anyhow::bail!("the daemon answered `top` with something else");
        };
        match output {
            Output::Json => println!("{}", serde_json::to_string_pretty(&sources)?),
            Output::Text => {
                if !once {
                    // Clear the screen and home the cursor between frames.
                    print!("\x1b[2J\x1b[H");
                }
                print!("{}", render(&sources));
            }
        }
        if once {
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The human form: one line per source, heaviest first.
pub fn render(sources: &[TopSource]) -> String {
    let mut text = format!(
        "{:<30} {:<10} {:>10} {:>14} {:>12}  state\n",
        "source", "interface", "pps", "bps", "dropped"
    );
    for s in sources {
        text.push_str(&format!(
            "{:<30} {:<10} {:>10} {:>14} {:>12}  {}\n",
            s.source, s.interface, s.pps, s.bps, s.dropped, s.state
        ));
    }
    text
}
