//! The figures docs/benchmarks.md leads with ("Current figures"), kept as
//! data: each bench, after a complete run, saves its JSON lines (and its
//! targets, met or not) to `docs/data/<name>.jsonl` with [`save`], then
//! renders the section again from every saved file with [`rewrite`];
//! `cargo xtask bench table` renders it alone. A file's first line says
//! when and on what it was measured, so every table carries its own date.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use serde_json::{json, Value};

/// The markers of the generated section in docs/benchmarks.md.
pub const BEGIN: &str =
    "<!-- current:begin (generated from docs/data by the benches and `cargo xtask bench table`; edits here are overwritten) -->";
pub const END: &str = "<!-- current:end -->";

/// One bench's saved run.
#[derive(Clone, Debug, Default)]
pub struct Saved {
    pub measured: String,
    pub machine: String,
    pub lines: Vec<Value>,
}

impl Saved {
    /// The lines that are targets: `{"target": what, "measured", "met"}`
    /// (a figure's line may carry a numeric `target`, as the verifier's).
    fn targets(&self) -> impl Iterator<Item = &Value> {
        self.lines.iter().filter(|l| is_target(l))
    }

    fn figures(&self) -> impl Iterator<Item = &Value> {
        self.lines.iter().filter(|l| !is_target(l))
    }
}

fn is_target(line: &Value) -> bool {
    line.get("target").is_some_and(Value::is_string)
}

/// A target line, as the benches print them.
pub fn target(what: &str, measured: &str, met: Option<bool>) -> Value {
    json!({ "target": what, "measured": measured, "met": met })
}

/// The repository's root (this crate is one level below it).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn data_dir(root: &Path) -> PathBuf {
    root.join("docs/data")
}

/// Saves `lines` as the latest complete run of `name` (`xdp`, `e2e-random`,
/// `cluster`, ...), measured today on `machine`.
pub fn save(root: &Path, name: &str, machine: &str, lines: &[Value]) -> anyhow::Result<()> {
    let dir = data_dir(root);
    fs::create_dir_all(&dir)?;
    let mut text = json!({ "measured": today(), "machine": machine }).to_string();
    text.push('\n');
    for line in lines {
        text.push_str(&line.to_string());
        text.push('\n');
    }
    let path = dir.join(format!("{name}.jsonl"));
    fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

/// Every saved run, by name.
pub fn load(root: &Path) -> anyhow::Result<BTreeMap<String, Saved>> {
    let mut out = BTreeMap::new();
    let Ok(entries) = fs::read_dir(data_dir(root)) else {
        return Ok(out);
    };
    for entry in entries {
        let path = entry?.path();
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".jsonl"))
        else {
            continue;
        };
        let text = fs::read_to_string(&path)?;
        let mut lines = text.lines().filter(|l| !l.trim().is_empty());
        let head: Value = serde_json::from_str(lines.next().unwrap_or("{}"))
            .with_context(|| format!("{}: first line", path.display()))?;
        let lines = lines
            .map(serde_json::from_str)
            .collect::<Result<Vec<Value>, _>>()
            .with_context(|| format!("{}", path.display()))?;
        out.insert(
            name.to_string(),
            Saved {
                measured: head["measured"].as_str().unwrap_or("?").to_string(),
                machine: head["machine"].as_str().unwrap_or("?").to_string(),
                lines,
            },
        );
    }
    Ok(out)
}

/// Renders the section from the saved runs and writes it between the
/// markers of docs/benchmarks.md.
pub fn rewrite(root: &Path) -> anyhow::Result<()> {
    let doc = root.join("docs/benchmarks.md");
    let text = fs::read_to_string(&doc)?;
    let (Some(b), Some(e)) = (text.find(BEGIN), text.find(END)) else {
        anyhow::bail!("{} has no current:begin/end markers", doc.display());
    };
    let mut out = text[..b].to_string();
    out.push_str(&render(&load(root)?));
    out.push_str(&text[e..]);
    fs::write(&doc, out)?;
    Ok(())
}

/// The section's markdown, from `BEGIN` to just before `END`.
pub fn render(saved: &BTreeMap<String, Saved>) -> String {
    let mut md = format!("{BEGIN}\n\n");
    floods(&mut md, saved);
    service(&mut md, saved);
    xdp(&mut md, saved.get("xdp"));
    verifier(&mut md, saved.get("verifier"));
    cluster(&mut md, saved.get("cluster"));
    md
}

fn measured(md: &mut String, saved: &Saved, command: &str) {
    let _ = writeln!(
        md,
        "Measured {} on {} (`{command}`).\n",
        saved.measured, saved.machine
    );
}

fn not_measured(md: &mut String, command: &str) {
    let _ = writeln!(md, "Not measured yet: run `{command}`.\n");
}

fn targets(md: &mut String, saved: &Saved) {
    let mut any = false;
    for t in saved.targets() {
        let met = match t["met"].as_bool() {
            Some(true) => "met",
            Some(false) => "**missed**",
            None => "not measured",
        };
        let _ = writeln!(
            md,
            "- {}: {} ({met})",
            t["target"].as_str().unwrap_or("?"),
            t["measured"].as_str().unwrap_or("?")
        );
        any = true;
    }
    if any {
        md.push('\n');
    }
}

/// `median (min-max)` of an e2e figure object.
fn spread(v: &Value) -> Option<(f64, String)> {
    let median = v["median"].as_f64()?;
    let (min, max) = (v["min"].as_f64()?, v["max"].as_f64()?);
    let text = if (max - min).abs() < 0.5 {
        format!("{median:.0}")
    } else {
        format!("{median:.0} ({min:.0}-{max:.0})")
    };
    Some((median, text))
}

/// The end-to-end floods: one row per flood kind, unpaced, ns of receiver
/// CPU per frame.
fn floods(md: &mut String, saved: &BTreeMap<String, Saved>) {
    md.push_str(
        "**End to end** (`cargo xtask bench e2e`): receiver CPU per frame over veth, ns, \
         unpaced (as fast as the generator sends); medians of the runs with their range.\n\n",
    );
    let runs: Vec<(&String, &Saved)> = saved
        .iter()
        .filter(|(name, _)| name.starts_with("e2e-"))
        .collect();
    if runs.is_empty() {
        not_measured(md, "cargo xtask bench e2e");
        return;
    }
    md.push_str(
        "| flood | no filter | XDP drop floor | nftables (input) | iptables hashlimit | xdp-limiter | against no filter | against the floor | against nftables | measured |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
    );
    for (name, run) in &runs {
        let cost = |scenario: &str| {
            run.figures()
                .find(|l| l["scenario"] == scenario && l["load"] == "unpaced")
                .and_then(|l| spread(&l["cpu_ns_per_packet"]))
        };
        let flood = name.trim_start_matches("e2e-");
        let mut limiters = vec![("xdp-limiter", flood.to_string())];
        if cost("xdp-limiter-agg16").is_some() {
            limiters.push(("xdp-limiter-agg16", format!("{flood}, /16 aggregate")));
        }
        let cell = |c: &Option<(f64, String)>| c.as_ref().map_or("-".into(), |c| c.1.clone());
        for (limiter, label) in limiters {
            let lim = cost(limiter);
            let ratio = |base: &Option<(f64, String)>| match (&lim, base) {
                (Some(a), Some(b)) if b.0 > 0.0 => format!("{:.2}x", a.0 / b.0),
                _ => "-".into(),
            };
            let (none, floor, nft, hashlimit) = (
                cost("no-filter"),
                cost("xdp-drop-all"),
                cost("nft-input"),
                cost("iptables-hashlimit"),
            );
            let _ = writeln!(
                md,
                "| {label} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                cell(&none),
                cell(&floor),
                cell(&nft),
                cell(&hashlimit),
                cell(&lim),
                ratio(&none),
                ratio(&floor),
                ratio(&nft),
                run.measured
            );
        }
    }
    md.push('\n');
    for (name, run) in runs {
        let _ = writeln!(
            md,
            "{}: measured on {}.\n",
            name.trim_start_matches("e2e-"),
            run.machine
        );
        targets(md, run);
    }
}

/// The real service under a spoofed SYN flood.
fn service(md: &mut String, saved: &BTreeMap<String, Saved>) {
    md.push_str(
        "**A real service** (`cargo xtask bench e2e -- --modes service`): nginx behind each \
         filter, its clients' success and latency under a spoofed SYN flood.\n\n",
    );
    let runs: Vec<(&String, &Saved)> = saved
        .iter()
        .filter(|(name, _)| name.starts_with("service-"))
        .collect();
    if runs.is_empty() {
        not_measured(md, "cargo xtask bench e2e -- --modes service");
        return;
    }
    md.push_str(
        "| flood (tool or aimed) | filter | limit | success | p50 | p99 | flood frames/s | machine CPU |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for (name, run) in &runs {
        for l in run.figures() {
            let filter = match l["variant"].as_str() {
                Some(v) if !v.is_empty() => {
                    format!("{} ({v})", l["filter"].as_str().unwrap_or("?"))
                }
                _ => l["filter"].as_str().unwrap_or("?").to_string(),
            };
            let _ = writeln!(
                md,
                "| {} | {filter} | {} | {:.1}% | {:.1} ms | {:.1} ms | {:.0} | {:.0}% |",
                name.trim_start_matches("service-"),
                l["pps"].as_u64().map_or("-".into(), |p| format!("{p} pps")),
                answered(l) * 100.0,
                l["p50_ms"].as_f64().unwrap_or(0.0),
                l["p99_ms"].as_f64().unwrap_or(0.0),
                l["flood_pps"].as_f64().unwrap_or(0.0),
                l["machine_cpu"].as_f64().unwrap_or(0.0) * 100.0,
            );
        }
    }
    md.push('\n');
    for (_, run) in runs {
        measured(md, run, "cargo xtask bench e2e -- --modes service");
    }
}

/// A service cell's share of its clients' requests answered over all its
/// runs (rounded down to a tenth of a percent, so a cell that lost one
/// never reads 100.0%), from its runs when saved, else its `success`.
fn answered(line: &Value) -> f64 {
    let runs = line["runs"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let (ok, all) = runs.iter().fold((0, 0), |(ok, all), r| {
        (
            ok + r["ok"].as_u64().unwrap_or(0),
            all + r["scheduled"].as_u64().unwrap_or(0),
        )
    });
    if all == 0 {
        return line["success"].as_f64().unwrap_or(0.0);
    }
    (ok as f64 * 1000.0 / all as f64).floor() / 1000.0
}

/// The kernel's cost per frame, BPF_PROG_TEST_RUN.
fn xdp(md: &mut String, saved: Option<&Saved>) {
    md.push_str(
        "**In the kernel** (`cargo xtask bench xdp`): ns per frame under BPF_PROG_TEST_RUN, the \
         limiter against a baseline that parses the same way and counts each source in one \
         per-CPU LRU map, in the same run.\n\n",
    );
    let Some(run) = saved else {
        not_measured(md, "cargo xtask bench xdp");
        return;
    };
    md.push_str("| case | limiter | baseline | ratio |\n| --- | ---: | ---: | ---: |\n");
    // Per-case lines only: a figure of another shape (the list's load)
    // is in the targets.
    for l in run.figures().filter(|l| l.get("ns_per_pkt").is_some()) {
        let _ = writeln!(
            md,
            "| `{}` | {:.0} | {:.0} | {:.2}x |",
            l["case"].as_str().unwrap_or("?"),
            l["ns_per_pkt"].as_f64().unwrap_or(0.0),
            l["baseline_ns_per_pkt"].as_f64().unwrap_or(0.0),
            l["ratio"].as_f64().unwrap_or(0.0)
        );
    }
    md.push('\n');
    measured(md, run, "cargo xtask bench xdp");
    targets(md, run);
}

/// The verifier's processed instructions per kernel lane.
fn verifier(md: &mut String, saved: Option<&Saved>) {
    md.push_str(
        "**The verifier** (`cargo xtask bench verifier`): instructions processed at load.\n\n",
    );
    let Some(run) = saved else {
        not_measured(md, "cargo xtask bench verifier");
        return;
    };
    md.push_str(
        "| lane | kernel | instructions | target | met |\n| --- | --- | ---: | ---: | --- |\n",
    );
    for l in run.figures() {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            l["lane"].as_str().unwrap_or("?"),
            l["kernel"].as_str().unwrap_or("?"),
            l["verified_instructions"].as_u64().unwrap_or(0),
            l["target"].as_u64().unwrap_or(0),
            if l["within_target"].as_bool() == Some(true) {
                "yes"
            } else {
                "**no**"
            }
        );
    }
    md.push('\n');
    measured(md, run, "cargo xtask bench verifier");
}

/// The cluster's load against hot sources.
fn cluster(md: &mut String, saved: Option<&Saved>) {
    md.push_str(
        "**The cluster** (`cargo xtask bench cluster`): one node, T = 100 ms, sources announced \
         hot in Redis and synced every tick, against one `redis-server` and a Redis Cluster of \
         3 primaries.\n\n",
    );
    let Some(run) = saved else {
        not_measured(md, "cargo xtask bench cluster");
        return;
    };
    md.push_str(
        "| Redis | hot sources | Redis commands/s | Redis CPU (busiest server) | daemon CPU per tick | tick (mean) | ticks over T | synced at the end |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for l in run.figures().filter(|l| l["part"] == "load") {
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {:.0}% ({:.0}%) | {:.1} ms | {:.1} ms | {:.0}% | {:.0} |",
            l["redis"].as_str().unwrap_or("single"),
            l["hot_sources"].as_u64().unwrap_or(0),
            l["redis_commands_per_s"].as_f64().unwrap_or(0.0),
            l["redis_cpu_pct"].as_f64().unwrap_or(0.0),
            l["redis_busiest_server_cpu_pct"]
                .as_f64()
                .or(l["redis_cpu_pct"].as_f64())
                .unwrap_or(0.0),
            l["daemon_cpu_ms_per_tick"].as_f64().unwrap_or(0.0),
            l["tick_ms"].as_f64().unwrap_or(0.0),
            l["ticks_over_100ms_pct"].as_f64().unwrap_or(0.0),
            l["synced_sources_last"].as_f64().unwrap_or(0.0)
        );
    }
    md.push('\n');
    measured(md, run, "cargo xtask bench cluster");
    targets(md, run);
}

/// Today's date (UTC), as the benches stamp their figures.
pub fn today() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(lines: Vec<Value>) -> Saved {
        Saved {
            measured: "2026-11-28".into(),
            machine: "2 CPUs".into(),
            lines,
        }
    }

    fn cost(scenario: &str, median: f64) -> Value {
        json!({
            "bench": "e2e", "scenario": scenario, "mode": "random", "load": "unpaced",
            "cpu_ns_per_packet": { "median": median, "min": median - 10.0, "max": median + 10.0 },
        })
    }

    #[test]
    fn a_flood_row_puts_each_filter_beside_the_limiter_and_its_ratios() {
        let mut saved = BTreeMap::new();
        saved.insert(
            "e2e-random".to_string(),
            run(vec![
                cost("no-filter", 1000.0),
                cost("xdp-drop-all", 100.0),
                cost("nft-input", 1600.0),
                cost("xdp-limiter", 1200.0),
                target("random flood <= 1.2x no filter", "1.20x", Some(true)),
            ]),
        );
        let md = render(&saved);
        assert!(
            md.contains(
                "| random | 1000 (990-1010) | 100 (90-110) | 1600 (1590-1610) | - | 1200 (1190-1210) | 1.20x | 12.00x | 0.75x | 2026-11-28 |"
            ),
            "{md}"
        );
        assert!(
            md.contains("- random flood <= 1.2x no filter: 1.20x (met)"),
            "{md}"
        );
        // What was not saved says how to measure it.
        assert!(md.contains("run `cargo xtask bench xdp`"), "{md}");
        // A figure with a numeric target is a figure, not a target.
        saved.insert(
            "verifier".to_string(),
            run(vec![json!({
                "bench": "verifier", "lane": "6.1", "kernel": "6.1.0", "verified_instructions": 159469,
                "target": 450000, "within_target": true,
            })]),
        );
        let md = render(&saved);
        assert!(
            md.contains("| 6.1 | 6.1.0 | 159469 | 450000 | yes |"),
            "{md}"
        );
        assert!(md.contains("run `cargo xtask bench cluster`"), "{md}");
    }

    /// docs/benchmarks.md holds what docs/data renders: the section is
    /// never edited by hand, nor left behind a saved run.
    #[test]
    fn the_committed_section_is_what_the_saved_runs_render() {
        let root = root();
        let doc = fs::read_to_string(root.join("docs/benchmarks.md")).unwrap();
        let (b, e) = (doc.find(BEGIN).unwrap(), doc.find(END).unwrap());
        // Not assert_eq: the section is long, and the fix is one command.
        assert!(
            doc[b..e] == render(&load(&root).unwrap()),
            "docs/benchmarks.md's current figures are not what docs/data renders: run \
             `cargo xtask bench table`"
        );
    }

    #[test]
    fn saved_runs_load_back_and_render_between_the_markers() {
        let root = std::env::temp_dir().join(format!("current-{}", std::process::id()));
        fs::create_dir_all(root.join("docs")).unwrap();
        fs::write(
            root.join("docs/benchmarks.md"),
            format!("# Benchmarks\n\n{BEGIN}\nold\n{END}\n\nbelow\n"),
        )
        .unwrap();
        let line = json!({"case": "under_limit", "ns_per_pkt": 113.0, "baseline_ns_per_pkt": 71.0, "ratio": 1.59});
        save(
            &root,
            "xdp",
            "2 CPUs",
            &[line, target("x", "1.59x", Some(false))],
        )
        .unwrap();
        rewrite(&root).unwrap();
        let doc = fs::read_to_string(root.join("docs/benchmarks.md")).unwrap();
        fs::remove_dir_all(&root).unwrap();
        assert!(
            doc.contains("| `under_limit` | 113 | 71 | 1.59x |"),
            "{doc}"
        );
        assert!(doc.contains("- x: 1.59x (**missed**)"), "{doc}");
        assert!(!doc.contains("old"), "{doc}");
        assert!(doc.ends_with(&format!("{END}\n\nbelow\n")), "{doc}");
    }
}
