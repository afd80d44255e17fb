//! Redis URLs of `[cluster] redis`, checked by hand so that a typo is
//! refused when the file is read rather than when the first sync fails,
//! and so that passwords never reach a log or `status`
//! ([`RedisUrl::redacted`], [`redact_url`], [`redact_secrets`]).

use std::fmt;

use super::DEFAULT_REDIS_PORT;

/// Where a Redis URL points (no password in it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisEndpoint {
    /// `redis://host:port` (or `rediss://`, see [`RedisUrl::tls`]).
    Tcp { host: String, port: u16 },
    /// `redis+unix:///path` or `unix:///path`.
    Unix { path: String },
}

/// A checked Redis URL. `url` is exactly what the file says (what the
/// Redis client is given); everything shown to people is
/// [`redacted`](Self::redacted).
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl {
    pub url: String,
    pub endpoint: RedisEndpoint,
    /// The database number (0 unless the URL names one).
    pub db: u32,
    /// `rediss://`: the connection is TLS.
    pub tls: bool,
    /// What the URL logs in with (`user:password` before the `@`, or the
    /// socket's `user`/`pass` parameters), to compare URLs by.
    pub(super) login: Option<String>,
    redacted: String,
}

impl RedisUrl {
    /// The URL with its password replaced by `***`: for logs and `status`.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }
}

/// Debug shows the redacted URL: a `Config` printed in a log or a test
/// failure must not leak a password.
impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisUrl({:?})", self.redacted)
    }
}

/// Checks one Redis URL: `redis://[user[:password]@]host[:port][/db]`
/// (`rediss://` the same over TLS),
/// `redis+unix:///path[?db=N&user=U&pass=P]` or `unix:///path[...]`. The
/// error is the message after the field name (without the password).
pub fn parse_redis_url(text: &str) -> Result<RedisUrl, String> {
    let Some((scheme, rest)) = text.split_once("://") else {
        return Err(format!(
            "{:?} is not a URL (redis://host:6379 or unix:///path/to/redis.sock)",
            redact_guess(text)
        ));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "redis" => parse_tcp(text, rest, false),
        "rediss" => parse_tcp(text, rest, true),
        "redis+unix" | "unix" => parse_unix(text, rest),
        _ => Err(format!(
            "unsupported scheme {scheme:?} (redis://, rediss:// for TLS, redis+unix:// or \
             unix://)"
        )),
    }
}

/// `text` (a Redis URL as written, valid or not) without its password: what
/// errors and logs about a URL show.
pub fn redact_url(text: &str) -> String {
    parse_redis_url(text).map_or_else(|_| redact_guess(text), |u| u.redacted)
}

/// `message` (about the TOML `text`, which TOML's errors quote) with every
/// password `text` holds replaced by `***`: those of URLs (between `:` and
/// `@`, and `pass=` parameters) and the values of keys that name a
/// password (`primary_password`, also misspelled: anything with `pas` or
/// `pw` in the key).
pub fn redact_secrets(message: &str, text: &str) -> String {
    let mut secrets: Vec<&str> = Vec::new();
    for (at, _) in text.match_indices("://") {
        let rest = &text[at + 3..];
        let end = rest
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ',' | ']'))
            .unwrap_or(rest.len());
        let url = &rest[..end];
        let (authority, query) = url.split_once('?').unwrap_or((url, ""));
        if let Some((userinfo, _)) = authority.rsplit_once('@') {
            if let Some((_, password)) = userinfo.split_once(':') {
                secrets.push(password);
            }
        }
        secrets.extend(
            query
                .split('&')
                .filter_map(|pair| pair.strip_prefix("pass=")),
        );
    }
    for line in text.lines() {
        if let Some((key, value)) = line.split_once('=') {
            let key = key.trim().to_ascii_lowercase();
            if key.contains("pas") || key.contains("pw") {
                secrets.push(value.trim().trim_matches(['"', '\'']));
            }
        }
    }
    // Longest first, so a password that contains another is hidden whole.
    secrets.retain(|s| !s.is_empty());
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets
        .iter()
        .fold(message.to_string(), |m, secret| m.replace(secret, "***"))
}

/// Shows `text` with anything between `:` and `@` hidden, for errors about
/// a string that is not even a URL.
fn redact_guess(text: &str) -> String {
    let text = match (text.find(':'), text.rfind('@')) {
        (Some(colon), Some(at)) if colon < at => format!("{}:***{}", &text[..colon], &text[at..]),
        _ => text.to_string(),
    };
    // A Unix socket URL carries its password as a parameter.
    match text.split_once('?') {
        Some((path, query)) => {
            let query: Vec<&str> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some(("pass", _)) => "pass=***",
                    _ => pair,
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => text,
    }
}

fn parse_tcp(text: &str, rest: &str, tls: bool) -> Result<RedisUrl, String> {
    let (userinfo, hostpart) = match rest.rsplit_once('@') {
        Some((userinfo, hostpart)) => (Some(userinfo), hostpart),
        None => (None, rest),
    };
    let redacted_userinfo = userinfo.map(|u| match u.split_once(':') {
        Some((user, _)) => format!("{user}:***@"),
        None => format!("{u}@"),
    });
    let redacted = format!(
        "{}://{}{hostpart}",
        if tls { "rediss" } else { "redis" },
        redacted_userinfo.clone().unwrap_or_default()
    );
    if hostpart.contains(['?', '#']) {
        return Err(format!(
            "{}: query parameters are not supported in redis:// URLs (the database goes in \
             the path: redis://host:6379/2)",
            redacted
        ));
    }
    let (authority, path) = match hostpart.split_once('/') {
        Some((authority, path)) => (authority, path),
        None => (hostpart, ""),
    };
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        // An IPv6 literal: [::1]:6379.
        let (addr, after) = bracketed
            .split_once(']')
            .ok_or_else(|| format!("{}: unclosed '[' in the host", redacted))?;
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("{}: {addr:?} is not an IPv6 address", redacted));
        }
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("{}: expected ':port' after the address", redacted))?,
            ),
        };
        (format!("[{addr}]"), port)
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host.to_string(), Some(port)),
            None => (authority.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err(format!("{}: no host", redacted));
    }
    if host.contains(|c: char| c.is_whitespace() || c.is_control()) {
        return Err(format!("{}: {host:?} is not a host name", redacted));
    }
    let port = match port {
        None => DEFAULT_REDIS_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{}: port {p:?} is not 1..=65535", redacted))?,
    };
    let db = match path {
        "" => 0,
        db => db
            .parse::<u32>()
            .map_err(|_| format!("{}: database {db:?} is not a number", redacted))?,
    };
    Ok(RedisUrl {
        url: text.to_string(),
        endpoint: RedisEndpoint::Tcp { host, port },
        db,
        tls,
        login: userinfo.map(str::to_string),
        redacted,
    })
}

fn parse_unix(text: &str, rest: &str) -> Result<RedisUrl, String> {
    let scheme = &text[..text.len() - rest.len() - 3];
    let (path, query) = match rest.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (rest, None),
    };
    let mut db = 0;
    let mut shown_query = Vec::new();
    let mut login = Vec::new();
    for pair in query.into_iter().flat_map(|q| q.split('&')) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "db" => {
                db = value
                    .parse()
                    .map_err(|_| format!("database {value:?} is not a number"))?;
                shown_query.push(pair.to_string());
            }
            "user" => {
                shown_query.push(pair.to_string());
                login.push(pair);
            }
            "pass" => {
                shown_query.push("pass=***".to_string());
                login.push(pair);
            }
            other => {
                return Err(format!(
                    "unknown parameter {other:?} in a Unix socket URL (db, user, pass)"
                ))
            }
        }
    }
    let redacted = if shown_query.is_empty() {
        format!("{scheme}://{path}")
    } else {
        format!("{scheme}://{path}?{}", shown_query.join("&"))
    };
    if !path.starts_with('/') || path.len() < 2 {
        return Err(format!(
            "{redacted}: the socket's path must be absolute ({scheme}:///run/redis/redis.sock)"
        ));
    }
    Ok(RedisUrl {
        url: text.to_string(),
        endpoint: RedisEndpoint::Unix {
            path: path.to_string(),
        },
        db,
        tls: false,
        login: (!login.is_empty()).then(|| login.join("&")),
        redacted,
    })
}
