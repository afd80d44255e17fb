//! The control socket of a running daemon, fuzzed: thousands of seeded
//! random and mutated request lines, each on its own connection and
//! several pipelined on one, plus oversized lines, invalid UTF-8, an empty
//! line, connections closed mid-line and requests split across many
//! writes. Every answer must be one well-formed JSON response line (an
//! error with a message), the very answer the library predicts for the
//! line; the daemon must stay up and its state (rules, mode, rule
//! generation, the attached program, the file) must be exactly what it
//! was.
//!
//! Lines that would change the state if accepted (`mode`, `reload`,
//! `unblock`, `detach`, `ban`, `unban`, list edits, and rule edits the library accepts) are not sent,
//! except behind another request on one connection, where they must not be
//! executed. The seed is fixed: a failure names the line and reproduces.

use std::{
    fs,
    io::{ErrorKind, Read, Write},
    net::{Ipv4Addr, Ipv6Addr},
    os::unix::net::UnixStream,
    path::Path,
    sync::LazyLock,
    time::{Duration, Instant},
};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use limiter_common::Action;
use limiter_tests::{
    daemon::{Daemon, Files},
    lab::{limit_config, Lab, RX_IF},
};
use limiter_user::{
    config::{Config, FileConfig, PortsSpec, ProtocolSpec, RuleSection},
    daemon::{apply_rule_edit, NO_LEVELS},
    proto::{
        parse_request, Reply, Request, RequestLine, Response, ResponseLine, RuleEdit,
        MAX_REQUEST_BYTES, PROTOCOL_VERSION, REQUEST_KEYS,
    },
};
use serde_json::Value;

/// The seed of every random line.
const SEED: u64 = 0xc04e_f022;
/// Lines sent one per connection.
const LINES: usize = 3000;
/// Connections carrying several lines each.
const PIPELINED: usize = 200;

/// A valid request that would change the mode: sent only behind another
/// request on one connection, where it must never run.
const HIDDEN_MODE_CHANGE: &str = r#"{"version":1,"command":"mode","dry_run":true,"save":true}"#;

/// The lab's configuration with rules of every kind to aim edits at.
fn config_text() -> String {
    format!(
        "{}\n[[rules]]\ncidr = \"198.51.100.0/24\"\nprotocol = \"udp\"\nports = \"53\"\npps = 50\n\
         block = \"30s\"\n\n[[rules]]\ncidr = \"2001:db8::/32\"\naction = \"deny\"\n",
        limit_config(2)
    )
}

// ---------------------------------------------------------------------
// Talking to the socket.

/// Sends `chunks` (one write each) on a fresh connection, optionally
/// closes the sending side, and returns everything the daemon wrote before
/// it closed the connection.
fn exchange(socket: &Path, chunks: &[&[u8]], half_close: bool) -> Vec<u8> {
    let mut stream = UnixStream::connect(socket).expect("connect to the control socket");
    // Bounds on a hung daemon, not synchronisation: answers come at once.
    let bound = Some(Duration::from_secs(10));
    stream.set_read_timeout(bound).expect("read timeout");
    stream.set_write_timeout(bound).expect("write timeout");
    for chunk in chunks {
        if let Err(e) = stream.write_all(chunk) {
            // The daemon answers and closes once it has its line (or its
            // limit): the rest of a pipelined or oversized request meets a
            // closed socket.
            assert!(
                matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset),
                "writing the request: {e}"
            );
            break;
        }
    }
    if half_close {
        let _ = stream.shutdown(std::net::Shutdown::Write);
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            // Closing with unread request bytes resets the connection
            // after the answer.
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("reading the answer: {e}"),
        }
    }
    answer
}

/// `line` and its newline on a fresh connection.
fn send(socket: &Path, line: &str) -> Vec<u8> {
    exchange(socket, &[format!("{line}\n").as_bytes()], false)
}

/// The one well-formed response line of `answer` (what was sent: `what`).
#[track_caller]
fn one_answer(answer: &[u8], what: &str) -> ResponseLine {
    let text = std::str::from_utf8(answer)
        .unwrap_or_else(|e| panic!("{what:?}: the answer is not UTF-8 ({e}): {answer:?}"));
    let (line, rest) = text
        .split_once('\n')
        .unwrap_or_else(|| panic!("{what:?}: no whole answer line: {text:?}"));
    assert!(rest.is_empty(), "{what:?}: more than one answer: {text:?}");
    let response: ResponseLine = serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("{what:?}: a malformed answer ({e}): {line:?}"));
    assert_eq!(response.version, PROTOCOL_VERSION, "{what:?}: {line}");
    if let Response::Error(message) = &response.response {
        assert!(!message.trim().is_empty(), "{what:?}: an empty error");
    }
    response
}

/// The reply to a well-formed `request`.
fn ask(socket: &Path, request: Request) -> Reply {
    let line = serde_json::to_string(&RequestLine {
        version: PROTOCOL_VERSION,
        request,
    })
    .expect("requests serialise");
    match one_answer(&send(socket, &line), &line).response {
        Response::Ok(reply) => reply,
        Response::Error(message) => panic!("{line}: refused: {message}"),
    }
}

/// What the daemon runs: every field a control request could change.
#[derive(Clone, Debug, PartialEq)]
struct State {
    generation: u32,
    dry_run: bool,
    rules: usize,
    bans: usize,
    /// Name, attach mode and program id of each interface.
    interfaces: Vec<(String, limiter_user::kernel::Attachment, u32)>,
    /// The `rule-list` reply.
    rule_list: Reply,
}

impl State {
    fn read(socket: &Path) -> Self {
        let Reply::Status(status) = ask(socket, Request::Status) else {
            panic!("status answered with another reply");
        };
        let rule_list = ask(socket, Request::RuleList);
        assert!(matches!(rule_list, Reply::Rules { .. }), "{rule_list:?}");
        Self::from_status(&status, rule_list)
    }

    fn from_status(status: &limiter_user::proto::Status, rule_list: Reply) -> Self {
        Self {
            generation: status.generation,
            dry_run: status.dry_run,
            rules: status.rules,
            bans: status.bans,
            interfaces: status
                .interfaces
                .iter()
                .map(|i| (i.name.clone(), i.mode, i.program_id))
                .collect(),
            rule_list,
        }
    }
}

// ---------------------------------------------------------------------
// What the daemon must answer.

#[derive(Debug)]
enum Expect {
    /// This error, word for word.
    Refused(String),
    Status,
    Top,
    RuleList,
    Bans,
}

/// The answer `line` must get from a daemon running `file`, as the
/// library's own parser and rule editing decide it; `None` for a line
/// that would change the state (or stop the daemon), which is not sent.
fn predict(line: &str, file: &FileConfig) -> Option<Expect> {
    // The daemon parses the line without its trailing whitespace.
    match parse_request(line.trim_end()) {
        Err(message) => Some(Expect::Refused(message)),
        Ok(Request::Status) => Some(Expect::Status),
        Ok(Request::Top { level: None, .. }) => Some(Expect::Top),
        // The lab's rules have no levels.
        Ok(Request::Top { level: Some(_), .. }) => Some(Expect::Refused(NO_LEVELS.to_string())),
        Ok(Request::RuleList) => Some(Expect::RuleList),
        Ok(Request::Rules { edit, .. }) => match apply_rule_edit(file, edit) {
            Err(message) => Some(Expect::Refused(message)),
            Ok(_) => None,
        },
        Ok(Request::Bans) => Some(Expect::Bans),
        Ok(
            Request::Mode { .. }
            | Request::Reload
            | Request::Unblock { .. }
            | Request::Detach
            | Request::Ban { .. }
            | Request::Unban { .. }
            | Request::ListEdit { .. },
        ) => None,
        // Its answer depends on the traffic seen (and with `apply` it
        // changes the rules): tests/tests/suggest.rs checks it.
        Ok(Request::Suggest { .. }) => None,
    }
}

impl Expect {
    #[track_caller]
    fn check(&self, answer: &ResponseLine, before: &State, line: &str) {
        match (self, &answer.response) {
            (Expect::Refused(expected), Response::Error(message)) => {
                assert_eq!(message, expected, "{line:?}")
            }
            (Expect::Status, Response::Ok(Reply::Status(status))) => {
                let now = State::from_status(status, before.rule_list.clone());
                assert_eq!(&now, before, "{line:?}: the state changed");
            }
            (Expect::Top, Response::Ok(Reply::Top { .. })) => {}
            (Expect::Bans, Response::Ok(Reply::Bans { bans })) => {
                assert!(bans.is_empty(), "{line:?}: a ban appeared: {bans:?}")
            }
            (Expect::RuleList, Response::Ok(reply)) => {
                assert_eq!(reply, &before.rule_list, "{line:?}: the rules changed")
            }
            (expect, response) => panic!("{line:?}: expected {expect:?}, got {response:?}"),
        }
    }
}

/// How many lines got which answer.
#[derive(Debug, Default)]
struct Tally {
    refused_parse: usize,
    refused_edit: usize,
    status: usize,
    top: usize,
    rule_list: usize,
    bans: usize,
    /// Would change the state: not sent.
    skipped: usize,
}

impl Tally {
    fn sent(&self) -> usize {
        self.refused_parse + self.refused_edit + self.status + self.top + self.rule_list + self.bans
    }

    fn count(&mut self, expect: &Expect, line: &str) {
        match expect {
            Expect::Refused(_) if parse_request(line.trim_end()).is_ok() => self.refused_edit += 1,
            Expect::Refused(_) => self.refused_parse += 1,
            Expect::Status => self.status += 1,
            Expect::Top => self.top += 1,
            Expect::RuleList => self.rule_list += 1,
            Expect::Bans => self.bans += 1,
        }
    }
}

// ---------------------------------------------------------------------
// Random and mutated lines.

const PREFIXES: &[&str] = &[
    "0.0.0.0/0",
    "10.0.0.0/8",
    "192.0.2.2/32",
    "198.51.100.0/24",
    "198.51.100.7/24",
    "2001:db8::/32",
    "2001:db8::/64",
    "2001:db8::/96",
    "::/0",
];

/// Keys of the protocol (`cidr` and `dry_run` twice: a request's and a
/// rule's) and two near misses.
static KEYS: LazyLock<Vec<&str>> =
    LazyLock::new(|| [REQUEST_KEYS, RuleSection::KEYS, &["Version", ""]].concat());

/// JSON values of every type and at the edges of every range.
const VALUES: &[&str] = &[
    "null",
    "true",
    "false",
    "0",
    "1",
    "2",
    "-1",
    "1.0",
    "1.5",
    "1e308",
    "4294967296",
    "9223372036854775808",
    "18446744073709551615",
    "-9223372036854775809",
    "\"\"",
    "\"1\"",
    "\"NaN\"",
    "\"status\"",
    "\"rules\"",
    "\"add\"",
    "\"set\"",
    "\"remove\"",
    "\"default\"",
    "\"detach\"",
    "\"allow\"",
    "\"udp\"",
    "\"10.0.0.0/33\"",
    "\"198.51.100.0/24\"",
    "\"5-1\"",
    "\"0-65535\"",
    "\"0s\"",
    "\"100y\"",
    "\"61s\"",
    "[]",
    "{}",
    "[1,2]",
];

/// Text that is not JSON, glued into lines.
const JUNK: &[&str] = &[
    "NaN",
    "Infinity",
    "1e400",
    "01",
    "-",
    "}",
    "{",
    "]",
    "\"",
    "\\",
    ",",
    "\u{0}",
    "\u{feff}",
    "\"version\":2,",
    "\"version\":1,",
    "\"command\":\"status\",",
    "\"command\":\"detach\",",
];

/// The largest index at or before `at` that is a char boundary of `text`.
fn boundary(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// JSON pointers of every object in `value`.
fn objects(value: &Value, at: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, item) in map {
                let key = key.replace('~', "~0").replace('/', "~1");
                objects(item, format!("{at}/{key}"), out);
            }
            out.push(at);
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                objects(item, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

struct Lines {
    rng: fastrand::Rng,
    /// The daemon's rules, to aim edits at.
    file: FileConfig,
}

impl Lines {
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.rng.usize(..items.len())]
    }

    fn text(&mut self, max: usize) -> String {
        let len = self.rng.usize(0..max);
        (0..len).map(|_| self.rng.char(..)).collect()
    }

    fn cidr(&mut self) -> IpNet {
        match self.rng.u8(0..4) {
            0 => IpNet::V4(
                Ipv4Net::new(Ipv4Addr::from(self.rng.u32(..)), self.rng.u8(0..=32))
                    .expect("len <= 32"),
            ),
            1 => IpNet::V6(
                Ipv6Net::new(Ipv6Addr::from(self.rng.u128(..)), self.rng.u8(0..=128))
                    .expect("len <= 128"),
            ),
            _ => self.pick(PREFIXES).parse().expect("a valid prefix"),
        }
    }

    fn count(&mut self) -> u64 {
        match self.rng.u8(0..4) {
            0 => 0,
            1 => self.rng.u64(1..100_000),
            2 => self.pick(&[1 << 32, i64::MAX as u64, i64::MAX as u64 + 1, u64::MAX]),
            _ => self.rng.u64(..),
        }
    }

    fn duration(&mut self) -> Duration {
        match self.rng.u8(0..3) {
            0 => Duration::from_secs(self.rng.u64(0..=120)),
            1 => Duration::new(self.rng.u64(..), self.rng.u32(0..1_000_000_000)),
            _ => Duration::from_secs(self.pick(&[1, 10, 60, 61, 86_400, 86_401])),
        }
    }

    /// An existing rule or a new one, with a few fields changed.
    fn rule(&mut self) -> RuleSection {
        let mut rule = match self.rng.usize(..=self.file.rules.len()) {
            0 => RuleSection {
                cidr: Some(self.cidr()),
                pps: Some(self.rng.u64(1..1000)),
                ..RuleSection::default()
            },
            n => self.file.rules[n - 1].clone(),
        };
        for _ in 0..self.rng.usize(0..4) {
            match self.rng.u8(0..11) {
                0 => rule.cidr = (self.rng.u8(0..5) > 0).then(|| self.cidr()),
                1 => rule.action = self.pick(&[Action::Limit, Action::Allow, Action::Deny]),
                2 => {
                    rule.protocol = match self.rng.u8(0..3) {
                        0 => None,
                        1 => Some(ProtocolSpec::Number(self.rng.u8(..))),
                        _ => Some(ProtocolSpec::Name(
                            self.pick(&["tcp", "UDP", "icmp", "sctp", ""]).into(),
                        )),
                    }
                }
                3 => {
                    rule.ports = match self.rng.u8(0..3) {
                        0 => None,
                        1 => Some(PortsSpec::Port(self.rng.u16(..))),
                        _ => Some(PortsSpec::Text(
                            self.pick(&["53", "1000-2000", "5-1", "0-65535", "", "http"])
                                .into(),
                        )),
                    }
                }
                4 => rule.tcp_syn = self.rng.bool(),
                5 => rule.pps = self.rng.bool().then(|| self.count()),
                6 => rule.bytes_per_second = self.rng.bool().then(|| self.count()),
                7 => rule.burst_packets = self.count(),
                8 => rule.burst_bytes = self.count(),
                9 => rule.window = self.duration(),
                _ => rule.block = self.rng.bool().then(|| self.duration()),
            }
        }
        rule
    }

    /// Any request (state-changing ones included: mutation may break
    /// them, and [`predict`] keeps the valid ones from being sent).
    fn request(&mut self) -> Request {
        match self.rng.u8(0..12) {
            0 => Request::Status,
            1 => Request::Top {
                limit: self.rng.usize(..),
                level: self.rng.bool().then(|| "/24".to_string()),
            },
            2 => Request::RuleList,
            3 => Request::Mode {
                dry_run: self.rng.bool(),
                save: self.rng.bool(),
                guards: Vec::new(),
                guard_for: None,
            },
            4 => Request::Reload,
            5 => Request::Detach,
            6 => Request::Unblock { cidr: self.cidr() },
            _ => {
                let rule = self.rule();
                let edit = match self.rng.u8(0..4) {
                    0 => RuleEdit::Add { rule },
                    1 => RuleEdit::Set { rule },
                    2 => RuleEdit::Remove { rule },
                    _ => RuleEdit::Default {
                        rule: RuleSection { cidr: None, ..rule },
                    },
                };
                Request::Rules {
                    edit,
                    save: self.rng.bool(),
                }
            }
        }
    }

    fn value(&mut self) -> Value {
        match self.rng.u8(0..8) {
            0 => Value::from(self.rng.i64(..)),
            1 => Value::from(self.rng.u64(..)),
            2 => Value::from(self.rng.f64() * 1e300),
            3 => (0..self.rng.usize(1..300))
                .fold(Value::from(1), |inner, _| Value::Array(vec![inner])),
            4 => Value::String(self.text(12)),
            _ => serde_json::from_str(self.pick(VALUES)).expect("valid JSON"),
        }
    }

    /// Drops, renames, retypes or adds a key of some object in `value`.
    fn mutate_value(&mut self, value: &mut Value) {
        if self.rng.u8(0..30) == 0 {
            *value = Value::Array(vec![value.take()]);
            return;
        }
        let mut pointers = Vec::new();
        objects(value, String::new(), &mut pointers);
        if pointers.is_empty() {
            return;
        }
        let pointer = pointers[self.rng.usize(..pointers.len())].clone();
        let replacement = self.value();
        let key = self.pick(&KEYS).to_string();
        let op = self.rng.u8(0..5);
        let which = self.rng.usize(..);
        let Some(map) = value.pointer_mut(&pointer).and_then(Value::as_object_mut) else {
            return;
        };
        let existing = map.keys().nth(which % map.len().max(1)).cloned();
        match (op, existing) {
            (0, Some(k)) => {
                map.remove(&k);
            }
            (1, Some(k)) => {
                let v = map.remove(&k).expect("present");
                map.insert(key, v);
            }
            (2 | 3, Some(k)) => {
                map.insert(k, replacement);
            }
            _ => {
                map.insert(key, replacement);
            }
        }
    }

    /// Cuts, splices or garbles the text of a line.
    fn mutate_text(&mut self, text: &mut String) {
        let at = boundary(text, self.rng.usize(0..=text.len()));
        match self.rng.u8(0..5) {
            0 => text.truncate(at),
            1 => {
                let junk = self.pick(JUNK);
                text.insert_str(at, junk);
            }
            2 => {
                // A key twice: after the first brace.
                let junk = self.pick(JUNK);
                if let Some(brace) = text.find('{') {
                    text.insert_str(brace + 1, junk);
                }
            }
            3 => {
                let end = boundary(text, at + self.rng.usize(0..16));
                text.replace_range(at..end, "");
            }
            _ => {
                let c = self.rng.char(..);
                text.insert(at, c);
            }
        }
    }

    /// One request line (without its newline).
    fn line(&mut self) -> String {
        let text = match self.rng.u8(0..12) {
            0 => self.text(120),
            1 => {
                let len = self.rng.usize(0..80);
                (0..len)
                    .map(|_| self.pick(b"{}[]\":,0123456789.-e truefalsnversioncmd") as char)
                    .collect()
            }
            _ => {
                let request = self.request();
                let mut value = serde_json::to_value(RequestLine {
                    version: PROTOCOL_VERSION,
                    request,
                })
                .expect("requests serialise");
                for _ in 0..self.rng.usize(0..4) {
                    self.mutate_value(&mut value);
                }
                let mut text = value.to_string();
                if self.rng.u8(0..3) == 0 {
                    for _ in 0..self.rng.usize(1..4) {
                        self.mutate_text(&mut text);
                    }
                }
                text
            }
        };
        // One request per line.
        text.replace('\n', " ")
    }

    /// A line the daemon may be sent, with the answer it must get.
    fn sendable(&mut self, tally: &mut Tally) -> (String, Expect) {
        loop {
            let line = self.line();
            match predict(&line, &self.file) {
                Some(expect) => return (line, expect),
                None => tally.skipped += 1,
            }
        }
    }
}

#[test]
fn the_control_socket_answers_every_line_clearly_and_changes_nothing() {
    let started = Instant::now();
    let lab = Lab::three_senders();
    let files = Files::new();
    files.write_config(&config_text());
    let config = files.config();
    let daemon = Daemon::start(
        &lab.rx,
        &files,
        &["-i", RX_IF, "-c", config.to_str().expect("utf-8 path")],
    );
    let socket = files.socket();
    let text_before = fs::read_to_string(&config).expect("the file");
    let file = Config::load(&config).expect("a valid file").file;
    let before = State::read(&socket);
    assert_eq!(before.generation, 1, "{before:?}");
    assert_eq!(before.rules, 4, "{before:?}");
    assert_eq!(
        lab.attached_program(),
        before.interfaces.first().map(|i| i.2),
        "the program attached is the daemon's"
    );
    let setup = started.elapsed();

    let mut lines = Lines {
        rng: fastrand::Rng::with_seed(SEED),
        file,
    };
    let mut tally = Tally::default();

    // One line per connection.
    while tally.sent() < LINES {
        let (line, expect) = lines.sendable(&mut tally);
        let answer = one_answer(&send(&socket, &line), &line);
        expect.check(&answer, &before, &line);
        tally.count(&expect, &line);
    }

    // Several lines on one connection: only the first is read and
    // answered; the rest (a mode change among them) is never run.
    for _ in 0..PIPELINED {
        let (first, expect) = lines.sendable(&mut tally);
        let mut batch = format!("{first}\n");
        for _ in 0..lines.rng.usize(1..6) {
            batch.push_str(&lines.line());
            batch.push('\n');
        }
        batch.push_str(HIDDEN_MODE_CHANGE);
        batch.push('\n');
        let answer = one_answer(&exchange(&socket, &[batch.as_bytes()], false), &first);
        expect.check(&answer, &before, &first);
    }

    // An allow rule keeps whatever rates it is given, but one beyond TOML's
    // integers must be refused: the daemon could not save it.
    let huge = r#"{"version":1,"command":"rules","save":true,"edit":{"op":"add","rule":{"cidr":"203.0.113.0/24","action":"allow","pps":9223372036854775808}}}"#;
    let answer = one_answer(&send(&socket, huge), huge);
    predict(huge, &lines.file)
        .expect("refused")
        .check(&answer, &before, huge);
    let Response::Error(message) = &answer.response else {
        unreachable!("checked above");
    };
    assert!(message.contains("rules[3].pps"), "{message}");

    // Sizes: a request of exactly the limit is read, one byte more is not,
    // and neither is a megabyte.
    let status = r#"{"version":1,"command":"status"}"#;
    let padded = |len: usize| format!("{}{status}", " ".repeat(len - status.len()));
    let at_limit = padded(MAX_REQUEST_BYTES);
    Expect::Status.check(
        &one_answer(&send(&socket, &at_limit), "a request of the limit"),
        &before,
        "a request of the limit",
    );
    let too_long = Expect::Refused(format!("request longer than {MAX_REQUEST_BYTES} bytes"));
    for (what, line) in [
        ("one byte over", padded(MAX_REQUEST_BYTES + 1)),
        ("a megabyte", "x".repeat(1 << 20)),
    ] {
        too_long.check(&one_answer(&send(&socket, &line), what), &before, what);
    }

    // Bytes that are not UTF-8, whole lines and unterminated.
    for (what, bytes, half_close) in [
        (
            "invalid UTF-8 in a request",
            &b"{\"version\":1,\"command\":\"st\xffatus\"}\n"[..],
            false,
        ),
        ("a lone continuation byte", &b"\x80\n"[..], false),
        ("a truncated sequence at the end", &b"\xe2\x82"[..], true),
    ] {
        let answer = one_answer(&exchange(&socket, &[bytes], half_close), what);
        match &answer.response {
            Response::Error(message) => assert!(
                message.to_ascii_lowercase().contains("utf-8"),
                "{what}: {message}"
            ),
            other => panic!("{what}: {other:?}"),
        }
    }

    // Empty and blank lines.
    for line in ["", " ", "\r", "\t \r"] {
        let expect = predict(line, &lines.file).expect("refused");
        assert!(matches!(expect, Expect::Refused(_)), "{line:?}");
        expect.check(&one_answer(&send(&socket, line), line), &before, line);
    }

    // Connections closed mid-line: the daemon answers what it got (a
    // whole request without its newline is a request), or finds nobody to
    // answer.
    for partial in [
        r#"{"version":1,"comm"#,
        r#"{"version":1,"command":"rules","save":false,"edit":{"op":"add","#,
        status,
    ] {
        let answer = one_answer(&exchange(&socket, &[partial.as_bytes()], true), partial);
        predict(partial, &lines.file)
            .expect("answerable")
            .check(&answer, &before, partial);
    }
    for bytes in [
        "",
        r#"{"version":1,"#,
        r#"{"version":1,"command":"mode","dry_run":tr"#,
    ] {
        let mut stream = UnixStream::connect(&socket).expect("connect");
        stream.write_all(bytes.as_bytes()).expect("write");
        drop(stream);
    }

    // A request split across many writes.
    let edit = r#"{"version":1,"command":"rules","save":false,"edit":{"op":"remove","rule":{"cidr":"10.9.9.0/24"}}}"#;
    for (line, size) in [(status, 1), (edit, 3), (edit, 1)] {
        let text = format!("{line}\n");
        let chunks: Vec<&[u8]> = text.as_bytes().chunks(size).collect();
        let answer = one_answer(&exchange(&socket, &chunks, false), line);
        predict(line, &lines.file)
            .expect("answerable")
            .check(&answer, &before, line);
    }

    // Afterwards: the same state, the same program attached, the file
    // untouched, and the CLI works.
    let after = State::read(&socket);
    assert_eq!(after, before, "the state changed");
    assert_eq!(
        lab.attached_program(),
        after.interfaces.first().map(|i| i.2),
        "the program is still attached"
    );
    assert_eq!(
        fs::read_to_string(&config).expect("the file"),
        text_before,
        "the file changed"
    );
    let status: Value =
        serde_json::from_str(&files.cli_ok(&["status", "--output", "json"])).expect("JSON status");
    assert_eq!(status["generation"], before.generation);
    assert_eq!(status["dry_run"], false);

    eprintln!(
        "{tally:?}; {} pipelined connections; {:?} (set-up {setup:?})",
        PIPELINED,
        started.elapsed()
    );
    assert!(
        tally.refused_parse > LINES / 2
            && tally.refused_edit > 50
            && tally.status + tally.top + tally.rule_list > 50,
        "the lines cover too little: {tally:?}"
    );
    let log = daemon.log();
    assert!(!log.contains("panicked"), "{log}");
    assert!(daemon.stop().success(), "{}", files.dir.display());
}
