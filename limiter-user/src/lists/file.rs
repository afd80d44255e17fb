//! A list's text: one prefix a line, comments, ipset-save lines.

use std::net::IpAddr;

use ipnet::IpNet;

/// The prefixes of `text`, or the first bad line (1-based) and what is
/// wrong with it.
pub fn parse(text: &str) -> Result<Vec<IpNet>, (usize, String)> {
    let mut prefixes = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if let Some(net) = parse_line(line).map_err(|message| (i + 1, message))? {
            prefixes.push(net);
        }
    }
    Ok(prefixes)
}

/// One line's prefix, `None` for a blank, comment or `create` line.
fn parse_line(line: &str) -> Result<Option<IpNet>, String> {
    let line = line.split(['#', ';']).next().unwrap_or("").trim();
    let mut words = line.split_whitespace();
    let word = match words.next() {
        None => return Ok(None),
        // ipset-save: `create SET hash:net ...` then `add SET PREFIX`.
        Some("create") => return Ok(None),
        Some("add") => {
            let (Some(_set), Some(prefix)) = (words.next(), words.next()) else {
                return Err(format!(
                    "`{line}`: an ipset `add` line names a set and a prefix"
                ));
            };
            prefix
        }
        Some(word) => word,
    };
    let net = match word.parse::<IpNet>() {
        Ok(net) => net,
        Err(_) => match word.parse::<IpAddr>() {
            Ok(addr) => IpNet::from(addr),
            Err(_) => return Err(format!("`{word}` is not an address or a CIDR prefix")),
        },
    };
    Ok(Some(net.trunc()))
}
