//! Real `redis-server`s for the cluster tests, each set in a network
//! namespace of its own so tests run in parallel on the same ports and
//! never meet a Redis of the machine.
//!
//! - [`RedisServer::start`]: one instance, no persistence;
//! - [`RedisServer::start_cluster`]: a 3-primary Redis Cluster on loopback
//!   ports (`redis-cli --cluster create`), no replicas;
//!   [`RedisServer::start_cluster_announcing`]: the same on an address other
//!   namespaces can be routed to;
//! - [`RedisServer::restart`]: kill and start again on the same ports;
//! - [`RedisServer::block_on`]: runs async client code on a current-thread
//!   tokio runtime on a thread inside the namespace;
//! - [`RedisServer::cli`]: `redis-cli` inside the namespace, for what the
//!   tests inspect or do behind the client's back (TTL, SCRIPT FLUSH);
//! - [`RedisServer::start_secured`], [`RedisServer::start_cluster_secured`]
//!   and [`RedisServer::start_sentinel_secured`]: the same behind TLS (a
//!   throwaway CA and certificates made at test time, [`Pki`]), an ACL
//!   user with a password, or both ([`Security`]).
//!
//! Servers are killed and the namespace removed on drop, also when the test
//! panics. Startup waits until every server answers PING (bounded), never a
//! fixed sleep.

use std::{
    fs::File,
    future::Future,
    net::Ipv4Addr,
    path::PathBuf,
    process::{Child, Stdio},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Mutex, MutexGuard,
    },
    time::Duration,
};

use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};

use crate::{netns::NetNs, wait_until};

/// The port of a single instance (alone in its namespace, so fixed).
pub const PORT: u16 = 6379;
/// The first port of a Redis Cluster's primaries (then +1, +2).
pub const CLUSTER_PORT: u16 = 7000;
/// How long a server may take to answer PING, or a cluster to be `ok`.
const START_LIMIT: Duration = Duration::from_secs(15);

static NEXT_DIR: AtomicUsize = AtomicUsize::new(0);

/// One `redis-server` process and how it was started (to restart it).
struct Server {
    port: u16,
    bind: String,
    extra: Vec<String>,
    child: Child,
    /// What `redis-cli` needs to reach it (TLS files, a login).
    cli: Vec<String>,
}

/// The ACL user [`Security::acl_password`] creates, for the clients tested.
pub const ACL_USER: &str = "xl-node";
/// The ACL user with every right the fixture's redis-cli logs in as (same
/// password), whatever [`Security::acl_rules`] leaves [`ACL_USER`].
pub const ADMIN_USER: &str = "xl-admin";

/// How [`RedisServer::start_secured`] protects its Redis.
#[derive(Clone, Debug, Default)]
pub struct Security {
    /// TLS only (no plain port), with a certificate for 127.0.0.1 (and
    /// `Pki::new`'s other addresses) signed by the fixture's CA.
    pub tls: bool,
    /// With `tls`: clients must show a certificate of that CA
    /// (`tls-auth-clients yes`).
    pub client_certs: bool,
    /// The password of the ACL user [`ACL_USER`]; the `default` user is
    /// off, so nothing else logs in.
    pub acl_password: Option<String>,
    /// The rules of [`ACL_USER`] (`~xl:* +evalsha ...`); empty: every
    /// key and command.
    pub acl_rules: Vec<String>,
}

impl Security {
    /// The redis-server arguments for it.
    fn server_args(&self, pki: Option<&Pki>, port: u16) -> Vec<String> {
        let mut args: Vec<String> = Vec::new();
        if let (true, Some(pki)) = (self.tls, pki) {
            let path = |p: &PathBuf| p.to_string_lossy().into_owned();
            args.extend([
                "--port".into(),
                "0".into(),
                "--tls-port".into(),
                port.to_string(),
                "--tls-cert-file".into(),
                path(&pki.server_cert),
                "--tls-key-file".into(),
                path(&pki.server_key),
                "--tls-ca-cert-file".into(),
                path(&pki.ca),
                "--tls-auth-clients".into(),
                (if self.client_certs { "yes" } else { "no" }).into(),
                "--tls-replication".into(),
                "yes".into(),
            ]);
        }
        if let Some(password) = &self.acl_password {
            // The default user cannot log in; the fixture's own user can
            // do anything.
            args.extend(["--user", "default", "off"].iter().map(|a| a.to_string()));
            args.extend(
                [
                    "--user",
                    ADMIN_USER,
                    "on",
                    &format!(">{password}"),
                    "~*",
                    "&*",
                    "+@all",
                ]
                .iter()
                .map(|a| a.to_string()),
            );
            args.extend(
                ["--user", ACL_USER, "on", &format!(">{password}")]
                    .iter()
                    .map(|a| a.to_string()),
            );
            if self.acl_rules.is_empty() {
                args.extend(["~*", "&*", "+@all"].iter().map(|a| a.to_string()));
            } else {
                args.extend(self.acl_rules.iter().cloned());
            }
        }
        args
    }

    /// The redis-cli arguments that reach a server secured so.
    fn cli_args(&self, pki: Option<&Pki>) -> Vec<String> {
        let mut args = Vec::new();
        if let (true, Some(pki)) = (self.tls, pki) {
            args.extend(["--tls".to_string(), "--cacert".into()]);
            args.push(pki.ca.to_string_lossy().into_owned());
            args.extend(["--cert".to_string()]);
            args.push(pki.client_cert.to_string_lossy().into_owned());
            args.extend(["--key".to_string()]);
            args.push(pki.client_key.to_string_lossy().into_owned());
        }
        if let Some(password) = &self.acl_password {
            args.extend(
                [
                    "--no-auth-warning",
                    "--user",
                    ADMIN_USER,
                    "--pass",
                    password,
                ]
                .iter()
                .map(|a| a.to_string()),
            );
        }
        args
    }
}

/// A throwaway certificate authority made at test time (rcgen), with a
/// server certificate and a client certificate it signed, and a second CA
/// that signed nothing (what a client configured with the wrong CA
/// trusts). PEM files in the server's directory.
#[derive(Clone, Debug)]
pub struct Pki {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A CA that signed neither certificate.
    pub other_ca: PathBuf,
}

impl Pki {
    /// Writes the files into `dir`; the server certificate names
    /// 127.0.0.1, `localhost` and `addresses` (and nothing else: another
    /// address of the same server is the wrong name).
    pub fn new(dir: &std::path::Path, addresses: &[Ipv4Addr]) -> Self {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
            KeyUsagePurpose,
        };
        let ca_of = |name: &str| {
            let key = KeyPair::generate().expect("CA key");
            let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.distinguished_name.push(DnType::CommonName, name);
            params.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            let cert = params.self_signed(&key).expect("self-signed CA");
            (cert, key)
        };
        let (ca, ca_key) = ca_of("xdp-limiter test CA");
        let (other_ca, _) = ca_of("xdp-limiter other CA");
        let leaf = |names: Vec<String>, usages: Vec<ExtendedKeyUsagePurpose>| {
            let key = KeyPair::generate().expect("leaf key");
            let mut params = CertificateParams::new(names).expect("leaf params");
            params
                .distinguished_name
                .push(DnType::CommonName, "xdp-limiter test");
            params.extended_key_usages = usages;
            params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            let cert = params.signed_by(&key, &ca, &ca_key).expect("sign leaf");
            (cert, key)
        };
        let mut names = vec!["127.0.0.1".to_string(), "localhost".to_string()];
        names.extend(addresses.iter().map(Ipv4Addr::to_string));
        // The servers' certificate is also what a replica or a Sentinel
        // shows when it connects to the primary (`tls-auth-clients`).
        let (server, server_key) = leaf(
            names,
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        );
        let (client, client_key) = leaf(
            vec!["xl-node.test".to_string()],
            vec![ExtendedKeyUsagePurpose::ClientAuth],
        );
        let write = |name: &str, pem: String| {
            let path = dir.join(name);
            std::fs::write(&path, pem).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            path
        };
        Self {
            ca: write("ca.pem", ca.pem()),
            server_cert: write("server.pem", server.pem()),
            server_key: write("server-key.pem", server_key.serialize_pem()),
            client_cert: write("client.pem", client.pem()),
            client_key: write("client-key.pem", client_key.serialize_pem()),
            other_ca: write("other-ca.pem", other_ca.pem()),
        }
    }
}

/// One or several `redis-server` processes in their own namespace.
pub struct RedisServer {
    // Behind a lock so a test can restart the servers while other threads
    // (a flood, the daemons' observers) hold the lab by reference.
    children: Mutex<Vec<Server>>,
    /// The address URLs name (127.0.0.1, or the announced address).
    host: Ipv4Addr,
    dir: PathBuf,
    security: Security,
    pki: Option<Pki>,
    // Dropped after the servers are killed (fields drop after `drop`).
    ns: NetNs,
}

impl RedisServer {
    /// One instance on 127.0.0.1:[`PORT`], answering PING.
    pub fn start() -> Self {
        let mut server = Self::empty("redis");
        server.spawn(PORT, &[]);
        server.wait_ping(PORT);
        server
    }

    /// One instance on [`PORT`] listening on every address of its
    /// namespace (`--bind * -::*`, protected mode off: the namespace is
    /// the test's own), for labs that reach it over veth pairs added
    /// after it started.
    pub fn start_on_all_addresses() -> Self {
        let mut server = Self::empty("redis");
        server.spawn_bound(PORT, "* -::*", &["--protected-mode", "no"]);
        server.wait_ping(PORT);
        server
    }

    /// One instance on 127.0.0.1:[`PORT`] secured as `security` says,
    /// answering PING (through redis-cli secured the same way). It also
    /// listens on 127.0.0.2, which its certificate does not name: the
    /// wrong server name.
    pub fn start_secured(security: Security) -> Self {
        let mut server = Self::empty("redis");
        server.secure(security, &[]);
        server.spawn_bound(PORT, "127.0.0.1 127.0.0.2", &[]);
        server.wait_ping(PORT);
        server
    }

    /// [`RedisServer::start_on_all_addresses`] secured as `security` says,
    /// its certificate naming `addresses` too (where a lab's nodes reach
    /// it).
    pub fn start_on_all_addresses_secured(security: Security, addresses: &[Ipv4Addr]) -> Self {
        let mut server = Self::empty("redis");
        server.secure(security, addresses);
        server.spawn_bound(PORT, "* -::*", &["--protected-mode", "no"]);
        server.wait_ping(PORT);
        server
    }

    fn secure(&mut self, security: Security, addresses: &[Ipv4Addr]) {
        if security.tls {
            self.pki = Some(Pki::new(&self.dir, addresses));
        }
        self.security = security;
    }

    /// The certificates of a TLS server.
    pub fn pki(&self) -> &Pki {
        self.pki
            .as_ref()
            .expect("a server started with Security::tls")
    }

    /// Three primaries on 127.0.0.1:[`CLUSTER_PORT`]..+2 joined into a
    /// Redis Cluster whose 16384 slots are all served (`cluster_state:ok`
    /// on every node).
    pub fn start_cluster() -> Self {
        let mut server = Self::empty("rcluster");
        server.cluster_on("127.0.0.1", &[]);
        server
    }

    /// As [`RedisServer::start_cluster`], secured as `security` says (the
    /// cluster bus over TLS too).
    pub fn start_cluster_secured(security: Security) -> Self {
        let mut server = Self::empty("rcluster");
        server.secure(security, &[]);
        server.cluster_on("127.0.0.1", &[]);
        server
    }

    /// As [`RedisServer::start_cluster`], but every primary listens on
    /// every address of its namespace and the cluster is built on, and
    /// announces (`cluster-announce-ip`, so MOVED redirections and `CLUSTER
    /// SLOTS` name it), `address`, added to the namespace's loopback:
    /// clients in other namespaces with a route to `address` reach every
    /// primary (a lab routes it over its veths).
    pub fn start_cluster_announcing(address: Ipv4Addr) -> Self {
        let mut server = Self::empty("rcluster");
        server
            .ns
            .ip(&["addr", "add", &format!("{address}/32"), "dev", "lo"]);
        server.host = address;
        let announce = address.to_string();
        server.cluster_on(
            "* -::*",
            &["--protected-mode", "no", "--cluster-announce-ip", &announce],
        );
        server
    }

    fn cluster_on(&mut self, bind: &str, extra: &[&str]) {
        let ports: Vec<u16> = (0..3).map(|i| CLUSTER_PORT + i).collect();
        for &port in &ports {
            let conf = format!("nodes-{port}.conf");
            let mut args = vec![
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &conf,
                "--cluster-node-timeout",
                "5000",
            ];
            args.extend_from_slice(extra);
            if self.security.tls {
                // The cluster bus over TLS too (port 0: nothing else).
                args.extend(["--tls-cluster", "yes"]);
            }
            self.spawn_bound(port, bind, &args);
        }
        for &port in &ports {
            self.wait_ping(port);
        }
        let addresses: Vec<String> = ports.iter().map(|p| format!("{}:{p}", self.host)).collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addresses.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = self
            .ns
            .command("redis-cli")
            .args(self.security.cli_args(self.pki.as_ref()))
            .args(&args)
            .output()
            .expect("start redis-cli");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        for &port in &ports {
            let ok = wait_until(START_LIMIT, Duration::from_millis(20), || {
                self.try_cli(port, &["cluster", "info"])
                    .filter(|info| info.contains("cluster_state:ok"))
            });
            assert!(
                ok.is_some(),
                "Redis Cluster node {port} never reached cluster_state:ok"
            );
        }
    }

    fn empty(tag: &str) -> Self {
        let id = NEXT_DIR.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("xlt-{tag}-{}-{id}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        Self {
            children: Mutex::new(Vec::new()),
            host: Ipv4Addr::LOCALHOST,
            dir,
            security: Security::default(),
            pki: None,
            ns: NetNs::new(tag),
        }
    }

    /// Starts `redis-server` on `port` with no persistence (the store keeps
    /// nothing on disk), its output in `<dir>/<port>.log`.
    fn spawn(&mut self, port: u16, extra: &[&str]) {
        self.spawn_bound(port, "127.0.0.1", extra);
    }

    fn spawn_bound(&mut self, port: u16, bind: &str, extra: &[&str]) {
        let mut extra: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
        extra.extend(self.security.server_args(self.pki.as_ref(), port));
        let child = self.spawn_child(port, bind, &extra);
        let cli = self.security.cli_args(self.pki.as_ref());
        self.servers().push(Server {
            port,
            bind: bind.to_string(),
            extra,
            child,
            cli,
        });
    }

    fn spawn_child(&self, port: u16, bind: &str, extra: &[String]) -> Child {
        let log_path = self.dir.join(format!("{port}.log"));
        let log = File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .unwrap_or_else(|e| panic!("{}: {e}", log_path.display()));
        let port_text = port.to_string();
        let dir = self.dir.to_string_lossy().into_owned();
        self.ns
            .command("redis-server")
            .args(["--port", &port_text, "--bind", bind])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--dir", &dir, "--logfile", ""])
            // `DEBUG SLEEP` (a hung server) from redis-cli in the namespace.
            .args(["--enable-debug-command", "local"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start redis-server (is it installed? `cargo xtask setup`): {e}")
            })
    }

    fn servers(&self) -> MutexGuard<'_, Vec<Server>> {
        self.children.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ports(&self) -> Vec<u16> {
        self.servers().iter().map(|s| s.port).collect()
    }

    /// Kills every server (SIGKILL) and starts it again on the same port
    /// with the same options, empty (no persistence); returns once each
    /// answers PING. A Redis Cluster's servers would restart with their
    /// node files: only single instances are restarted by the tests.
    pub fn restart(&self) {
        let mut servers = self.servers();
        for server in servers.iter_mut() {
            let _ = server.child.kill();
            let _ = server.child.wait();
            server.child = self.spawn_child(server.port, &server.bind, &server.extra);
        }
        let ports: Vec<u16> = servers.iter().map(|s| s.port).collect();
        drop(servers);
        for port in ports {
            self.wait_ping(port);
        }
    }

    fn wait_ping(&self, port: u16) {
        let answered = wait_until(START_LIMIT, Duration::from_millis(10), || {
            self.try_cli(port, &["ping"]).filter(|r| r.trim() == "PONG")
        });
        if answered.is_none() {
            let log =
                std::fs::read_to_string(self.dir.join(format!("{port}.log"))).unwrap_or_default();
            panic!("redis-server on port {port} never answered PING within {START_LIMIT:?}; log:\n{log}");
        }
    }

    /// The URL of the single instance (or of the first cluster node):
    /// `rediss://` with TLS, with the ACL user's login when there is one.
    pub fn url(&self) -> String {
        self.url_at(&self.host.to_string(), self.ports()[0])
    }

    /// Every server's URL (a Redis Cluster's seeds).
    pub fn urls(&self) -> Vec<String> {
        self.ports()
            .iter()
            .map(|&port| self.url_at(&self.host.to_string(), port))
            .collect()
    }

    /// The URL of `host:port` as [`RedisServer::url`] writes it.
    pub fn url_at(&self, host: &str, port: u16) -> String {
        let scheme = if self.security.tls { "rediss" } else { "redis" };
        let login = match &self.security.acl_password {
            Some(password) => format!("{ACL_USER}:{password}@"),
            None => String::new(),
        };
        format!("{scheme}://{login}{host}:{port}")
    }

    pub fn ns(&self) -> &NetNs {
        &self.ns
    }

    /// The process id of the first server (`ip netns exec` execs it, so
    /// this is redis-server itself).
    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.servers()[0].child.id() as i32)
    }

    /// Kills every server (SIGKILL): connections are reset and refused
    /// from then on (the processes are reaped on drop).
    pub fn kill_all(&self) {
        self.signal(Signal::SIGKILL);
    }

    /// Stops every server (SIGSTOP): connections stay open and calls hang.
    pub fn pause(&self) {
        self.signal(Signal::SIGSTOP);
    }

    /// Resumes after [`pause`](Self::pause).
    pub fn resume(&self) {
        self.signal(Signal::SIGCONT);
    }

    fn signal(&self, signal: Signal) {
        for server in self.servers().iter() {
            kill(Pid::from_raw(server.child.id() as i32), signal)
                .unwrap_or_else(|e| panic!("{signal} to redis-server {}: {e}", server.port));
        }
    }

    /// `redis-cli -p <first port> args` inside the namespace: its output;
    /// panics unless it exits 0.
    pub fn cli(&self, args: &[&str]) -> String {
        let port = self.ports()[0];
        self.cli_at(port, args)
    }

    /// `redis-cli -p <port> args` inside the namespace (any server of a
    /// Redis Cluster): its output; panics unless it exits 0.
    pub fn cli_at(&self, port: u16, args: &[&str]) -> String {
        self.try_cli(port, args)
            .unwrap_or_else(|| panic!("redis-cli -p {port} {args:?} failed"))
    }

    /// The ports of every server (a Redis Cluster's primaries).
    pub fn server_ports(&self) -> Vec<u16> {
        self.ports()
    }

    /// `INFO stats`'s `total_commands_processed` summed over every server:
    /// every command Redis ran, those inside scripts included (and the
    /// `INFO` itself).
    pub fn commands_processed(&self) -> u64 {
        self.ports()
            .iter()
            .map(|&port| {
                let info = self.cli_at(port, &["info", "stats"]);
                info.lines()
                    .find_map(|l| l.strip_prefix("total_commands_processed:"))
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .unwrap_or_else(|| panic!("no total_commands_processed in {info}"))
            })
            .sum()
    }

    fn try_cli(&self, port: u16, args: &[&str]) -> Option<String> {
        let login = self
            .servers()
            .iter()
            .find(|s| s.port == port)
            .map(|s| s.cli.clone())
            .unwrap_or_default();
        let out = self
            .ns
            .command("redis-cli")
            .args(["-p", &port.to_string()])
            .args(&login)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs `f`'s future to completion on a current-thread tokio runtime
    /// (with timers and I/O) on a thread inside the namespace, so the
    /// clients it creates reach the servers at 127.0.0.1.
    pub fn block_on<F, Fut, T>(&self, f: F) -> T
    where
        F: FnOnce() -> Fut + Send,
        Fut: Future<Output = T>,
        T: Send,
    {
        self.ns.enter(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime")
                .block_on(f())
        })
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        for server in self.servers().iter_mut() {
            // SIGKILL also ends a stopped process.
            let _ = server.child.kill();
            let _ = server.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The primary's port of [`RedisServer::start_sentinel`] (its replica is
/// the next port).
pub const SENTINEL_PRIMARY_PORT: u16 = 6380;
/// The Sentinel's port.
pub const SENTINEL_PORT: u16 = 26379;
/// The name the Sentinel monitors the primary under.
pub const SENTINEL_MASTER: &str = "xl-primary";

impl RedisServer {
    /// A primary on [`SENTINEL_PRIMARY_PORT`], a replica of it on the next
    /// port, and one Sentinel on [`SENTINEL_PORT`] monitoring the primary
    /// as [`SENTINEL_MASTER`] (quorum 1, down after 300 ms, so a failover
    /// takes a second or two); returns once the Sentinel reports the
    /// primary and its replica. `urls()` is then primary, replica,
    /// Sentinel; [`RedisServer::sentinel_url`] the Sentinel's.
    pub fn start_sentinel() -> Self {
        Self::start_sentinel_secured(Security::default(), None)
    }

    /// As [`RedisServer::start_sentinel`], the primary and replica secured
    /// as `security` says (the replica and the Sentinel log in to the
    /// primary as [`ACL_USER`]), the Sentinel over TLS too when `security`
    /// is, and asking its own clients for `sentinel_password` when given.
    pub fn start_sentinel_secured(security: Security, sentinel_password: Option<&str>) -> Self {
        let mut server = Self::empty("rsentinel");
        server.secure(security.clone(), &[]);
        let (primary, replica) = (SENTINEL_PRIMARY_PORT, SENTINEL_PRIMARY_PORT + 1);
        server.spawn(primary, &[]);
        server.wait_ping(primary);
        let mut replica_args = vec!["--replicaof", "127.0.0.1"];
        let primary_text = primary.to_string();
        replica_args.push(&primary_text);
        if let Some(password) = &security.acl_password {
            replica_args.extend(["--masteruser", ACL_USER, "--masterauth", password]);
        }
        server.spawn(replica, &replica_args);
        server.wait_ping(replica);
        // Sentinel rewrites its configuration file: it needs one of its own.
        let conf = server.dir.join("sentinel.conf");
        let mut text = match &server.pki {
            Some(pki) => format!(
                "port 0\ntls-port {SENTINEL_PORT}\ntls-cert-file {}\ntls-key-file {}\n\
                 tls-ca-cert-file {}\ntls-auth-clients {}\ntls-replication yes\n",
                pki.server_cert.display(),
                pki.server_key.display(),
                pki.ca.display(),
                if security.client_certs { "yes" } else { "no" },
            ),
            None => format!("port {SENTINEL_PORT}\n"),
        };
        text.push_str(&format!(
            "bind 127.0.0.1\ndir {dir}\n\
             sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {primary} 1\n\
             sentinel down-after-milliseconds {SENTINEL_MASTER} 300\n\
             sentinel failover-timeout {SENTINEL_MASTER} 2000\n",
            dir = server.dir.display()
        ));
        if let Some(password) = &security.acl_password {
            text.push_str(&format!(
                "sentinel auth-user {SENTINEL_MASTER} {ACL_USER}\n\
                 sentinel auth-pass {SENTINEL_MASTER} {password}\n"
            ));
        }
        if let Some(password) = sentinel_password {
            text.push_str(&format!("requirepass {password}\n"));
        }
        std::fs::write(&conf, text).unwrap_or_else(|e| panic!("{}: {e}", conf.display()));
        let mut sentinel_cli = Security {
            acl_password: None,
            ..security
        }
        .cli_args(server.pki.as_ref());
        if let Some(password) = sentinel_password {
            sentinel_cli.extend([
                "--no-auth-warning".to_string(),
                "-a".into(),
                password.into(),
            ]);
        }
        let log_path = server.dir.join(format!("{SENTINEL_PORT}.log"));
        let log = File::create(&log_path).unwrap_or_else(|e| panic!("{}: {e}", log_path.display()));
        let child = server
            .ns
            .command("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start redis-server --sentinel: {e}"));
        server.servers().push(Server {
            port: SENTINEL_PORT,
            bind: "127.0.0.1".into(),
            extra: Vec::new(),
            child,
            cli: sentinel_cli,
        });
        server.wait_ping(SENTINEL_PORT);
        let ready = wait_until(START_LIMIT, Duration::from_millis(20), || {
            server
                .try_cli(SENTINEL_PORT, &["sentinel", "replicas", SENTINEL_MASTER])
                .filter(|out| out.contains(&replica.to_string()))
        });
        assert!(
            ready.is_some(),
            "the Sentinel never saw the replica of {SENTINEL_MASTER}"
        );
        server
    }

    /// The Sentinel's URL (what `mode = "sentinel"` is configured with):
    /// `rediss://` with TLS; without a login (see
    /// [`RedisServer::sentinel_url_with_password`]).
    pub fn sentinel_url(&self) -> String {
        let scheme = if self.security.tls { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{SENTINEL_PORT}")
    }

    /// [`RedisServer::sentinel_url`] logging in with `password`.
    pub fn sentinel_url_with_password(&self, password: &str) -> String {
        let scheme = if self.security.tls { "rediss" } else { "redis" };
        format!("{scheme}://:{password}@127.0.0.1:{SENTINEL_PORT}")
    }

    /// The port the Sentinel names as the primary now.
    pub fn sentinel_primary_port(&self) -> Option<u16> {
        let out = self.try_cli(
            SENTINEL_PORT,
            &["sentinel", "get-master-addr-by-name", SENTINEL_MASTER],
        )?;
        out.lines().nth(1)?.trim().parse().ok()
    }

    /// SIGKILLs the server on `port` only (a primary dying).
    pub fn kill_port(&self, port: u16) {
        let servers = self.servers();
        let server = servers
            .iter()
            .find(|s| s.port == port)
            .unwrap_or_else(|| panic!("no redis-server on port {port}"));
        kill(Pid::from_raw(server.child.id() as i32), Signal::SIGKILL)
            .unwrap_or_else(|e| panic!("SIGKILL to redis-server {port}: {e}"));
    }
}
