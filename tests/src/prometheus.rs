//! A real Prometheus server (Debian's `prometheus` package, installed by
//! `cargo xtask setup`) inside a lab's namespace, scraping the daemons
//! there and evaluating queries and alert rules through its HTTP API; and
//! `promtool` on rule files. Prometheus keeps its TSDB in a scratch
//! directory of its own; the server is always stopped and the directory
//! removed (also when the test panics).

use std::{
    fs,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::{netns::NetNs, wait_until};

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// Where Prometheus listens in its namespace (the namespace is the test's
/// own, so the port is free).
pub const LISTEN: &str = "127.0.0.1:9090";

/// The repository's `dist/prometheus` (alert rules and their unit tests).
pub fn rules_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/prometheus")
}

/// `promtool args` (in the current directory `dir`, so relative rule file
/// paths resolve as they do for an operator in `dist/prometheus`).
pub fn promtool(dir: &Path, args: &[&str]) -> Output {
    Command::new("promtool")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool (is it installed? `cargo xtask setup`): {e}")
        })
}

/// One series of an instant vector: its labels and its value.
pub type Sample = (serde_json::Map<String, Value>, f64);

/// A running Prometheus.
pub struct Prometheus {
    child: Option<Child>,
    dir: PathBuf,
    netns: String,
}

impl Prometheus {
    /// Starts Prometheus in `ns`, scraping `targets` (addresses in `ns`)
    /// every second as job `job`, evaluating `rule_files` every second;
    /// returns once it reports ready (panics with its log if it never
    /// does).
    pub fn start(ns: &NetNs, job: &str, targets: &[&str], rule_files: &[&Path]) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "xlt-prom-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(dir.join("data")).expect("create Prometheus scratch dir");
        let rules: Vec<String> = rule_files
            .iter()
            .map(|f| {
                let f = f
                    .canonicalize()
                    .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
                format!("  - '{}'\n", f.display())
            })
            .collect();
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n{}\
             scrape_configs:\n  - job_name: '{job}'\n    static_configs:\n      - targets: [{}]\n",
            if rules.is_empty() {
                "  []\n".to_string()
            } else {
                rules.concat()
            },
            targets.join(", ")
        );
        let config_path = dir.join("prometheus.yml");
        fs::write(&config_path, config).expect("write prometheus.yml");
        let log = fs::File::create(dir.join("prometheus.log")).expect("create Prometheus log");
        let mut cmd = ns.command("prometheus");
        cmd.arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={LISTEN}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log);
        // SAFETY: the hook runs between fork and exec and only calls
        // prctl(2), which is async-signal-safe.
        unsafe {
            // Prometheus never outlives the test process (even killed).
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!("cannot start prometheus (is it installed? `cargo xtask setup`): {e}")
        });
        let mut prometheus = Self {
            child: Some(child),
            dir,
            netns: ns.name().to_string(),
        };
        let ready = wait_until(Duration::from_secs(20), Duration::from_millis(100), || {
            if let Some(status) = prometheus
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("prometheus exited ({status}):\n{}", prometheus.log());
            }
            prometheus.get("/-/ready").ok()
        });
        assert!(
            ready.is_some(),
            "prometheus never got ready:\n{}",
            prometheus.log()
        );
        prometheus
    }

    /// Its log.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// A GET of `path` (with query `params`) from inside its namespace:
    /// the body, or what went wrong (the API's error body included).
    fn request(&self, path: &str, params: &[(&str, &str)]) -> Result<String, String> {
        let ns = format!("/run/netns/{}", self.netns);
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let file = fs::File::open(&ns).map_err(|e| format!("{ns}: {e}"))?;
                    nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(|e| format!("setns {ns}: {e}"))?;
                    let mut request = ureq::get(&format!("http://{LISTEN}{path}"))
                        .timeout(Duration::from_secs(10));
                    for (key, value) in params {
                        request = request.query(key, value);
                    }
                    match request.call() {
                        Ok(response) => response.into_string().map_err(|e| e.to_string()),
                        Err(ureq::Error::Status(code, response)) => Err(format!(
                            "HTTP {code}: {}",
                            response.into_string().unwrap_or_default()
                        )),
                        Err(e) => Err(e.to_string()),
                    }
                })
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    fn get(&self, path: &str) -> Result<String, String> {
        self.request(path, &[])
    }

    /// `GET /api/v1/<endpoint>` with `params`: the `data` of a `success`
    /// answer, or the API's error (its `errorType` and `error`).
    pub fn api(&self, endpoint: &str, params: &[(&str, &str)]) -> Result<Value, String> {
        let body = self.request(&format!("/api/v1/{endpoint}"), params)?;
        let answer: Value =
            serde_json::from_str(&body).map_err(|e| format!("not JSON ({e}): {body}"))?;
        if answer["status"] == "success" {
            Ok(answer["data"].clone())
        } else {
            Err(format!("{}: {}", answer["errorType"], answer["error"]))
        }
    }

    /// The instant vector `expr` evaluates to now: each series' labels and
    /// value; an error if the query fails or is not a vector.
    pub fn vector(&self, expr: &str) -> Result<Vec<Sample>, String> {
        let data = self.api("query", &[("query", expr)])?;
        if data["resultType"] != "vector" {
            return Err(format!(
                "{expr}: a {} rather than a vector",
                data["resultType"]
            ));
        }
        Ok(data["result"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|series| {
                let labels = series["metric"].as_object().cloned().unwrap_or_default();
                let value = series["value"][1]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(f64::NAN);
                (labels, value)
            })
            .collect())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
            // Bounded: Prometheus shuts down in well under a second; a
            // stuck one is killed.
            let stopped = wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
                child.try_wait().ok().flatten()
            });
            if stopped.is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}
