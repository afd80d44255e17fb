//! Results of the end-to-end benchmark: runs grouped into cells (scenario x
//! traffic mode x load) with median and range, one JSON line per cell, and
//! the generated part of docs/benchmarks.md with its PNG plots.

use std::{fmt::Write as _, fs, path::Path};

use serde_json::{json, Value};

use super::{
    measure::Run,
    plot::{self, Chart, Series},
    scenario::{Expectation, Scenario},
};

/// Traffic modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Light sources under the limit plus heavy sources far over it.
    Mixed,
    /// Nearly every frame from a new address, plus the light sources.
    Random,
    /// As `Random`, the random addresses all IPv4 and in one /16
    /// (10.128.0.0/16); the light sources are outside it. Not part of the
    /// default matrix: its figures are not in the generated section.
    Random16,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Mixed => "mixed",
            Mode::Random => "random",
            Mode::Random16 => "random16",
        }
    }
}

/// Offered loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Load {
    /// Unpaced: as fast as the generator goes.
    Unpaced,
    /// A fixed rate below the stack's saturation.
    Below(u64),
    /// Paced at the scenario's own unpaced throughput (its saturation).
    Saturation(u64),
}

impl Load {
    pub fn name(self) -> &'static str {
        match self {
            Load::Unpaced => "unpaced",
            Load::Below(_) => "below",
            Load::Saturation(_) => "saturation",
        }
    }

    pub fn target_pps(self) -> Option<u64> {
        match self {
            Load::Unpaced => None,
            Load::Below(pps) | Load::Saturation(pps) => Some(pps),
        }
    }
}

/// Median, minimum and maximum of one figure over a cell's runs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stat {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Stat {
    pub fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let mut v: Vec<f64> = values.into_iter().collect();
        if v.is_empty() {
            return Self::default();
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Self {
            median,
            min: v[0],
            max: v[n - 1],
        }
    }
}

/// One cell of the matrix.
#[derive(Clone, Debug)]
pub struct Cell {
    pub scenario: Scenario,
    pub mode: Mode,
    pub load: Load,
    pub runs: Vec<Run>,
}

/// Reads one figure of a run.
type Figure = fn(&Run) -> f64;

/// The figures a cell reports, by name.
const FIGURES: &[(&str, Figure)] = &[
    ("offered_pps", |r| r.offered_pps),
    ("received_pps", |r| r.received_pps),
    ("ring_loss", |r| r.ring_loss),
    ("receiver_busy", |r| r.receiver_busy),
    ("cpu_ns_per_packet", |r| r.cpu_ns_per_packet),
    ("passed_pps", |r| r.passed_pps),
    ("dropped_pps", |r| r.dropped_pps),
    ("expected_passed_pps", |r| r.expected_passed_pps),
    ("light_kept", |r| r.light_kept),
    ("heavy_admitted_pps", |r| r.heavy_admitted_pps),
    ("heavy_max_error", |r| r.heavy_max_error),
    ("random_passed_pps", |r| r.random_passed_pps),
    ("idle_wait_s", |r| r.idle_wait_s),
    ("generator_stalled", |r| r.generator_stalled),
];

impl Cell {
    pub fn stat(&self, figure: Figure) -> Stat {
        Stat::of(self.runs.iter().map(figure))
    }

    /// The JSON line of the cell.
    pub fn json(&self) -> Value {
        let mut line = json!({
            "bench": "e2e",
            "scenario": self.scenario.name(),
            "mode": self.mode.name(),
            "load": self.load.name(),
            "target_pps": self.load.target_pps(),
            "runs": self.runs.len(),
            "idle_timeouts": self.runs.iter().filter(|r| r.idle_timeout).count(),
            "unknown_datagrams": self.runs.iter().map(|r| r.unknown).sum::<u64>(),
        });
        for (name, figure) in FIGURES {
            let s = self.stat(*figure);
            line[*name] = json!({ "median": s.median, "min": s.min, "max": s.max });
        }
        line
    }

    /// One human line for the console.
    pub fn summary(&self) -> String {
        let cost = self.stat(|r| r.cpu_ns_per_packet);
        format!(
            "{:<19} {:<6} {:<10} offered {:>6} received {:>6} busy {:>4.0}% cpu/pkt {:>5.0} ns [{:.0}-{:.0}] passed {:>6} of {:>6} expected, heavy err {:.2}%, light kept {:.2}%",
            self.scenario.name(),
            self.mode.name(),
            self.load.name(),
            rate(self.stat(|r| r.offered_pps).median),
            rate(self.stat(|r| r.received_pps).median),
            self.stat(|r| r.receiver_busy).median * 100.0,
            cost.median,
            cost.min,
            cost.max,
            rate(self.stat(|r| r.passed_pps).median),
            rate(self.stat(|r| r.expected_passed_pps).median),
            self.stat(|r| r.heavy_max_error).median * 100.0,
            self.stat(|r| r.light_kept).median * 100.0,
        )
    }
}

/// 1234567 -> "1.23M".
pub fn rate(pps: f64) -> String {
    if pps >= 1e6 {
        format!("{:.2}M", pps / 1e6)
    } else if pps >= 1e3 {
        format!("{:.0}k", pps / 1e3)
    } else {
        format!("{pps:.0}")
    }
}

fn find<'a>(cells: &'a [Cell], scenario: Scenario, mode: Mode, load: &str) -> Option<&'a Cell> {
    cells
        .iter()
        .find(|c| c.scenario == scenario && c.mode == mode && c.load.name() == load)
}

/// A "median (min-max)" table entry.
fn entry(stat: Stat, digits: usize) -> String {
    format!(
        "{:.d$} ({:.d$}-{:.d$})",
        stat.median,
        stat.min,
        stat.max,
        d = digits
    )
}

/// A checked target: what, the measured value, and whether it holds.
pub struct Target {
    /// The traffic it is measured on.
    pub mode: Mode,
    pub what: &'static str,
    pub measured: String,
    pub met: Option<bool>,
}

/// A target on a ratio of unpaced costs: what it says, the scenario
/// measured, the one it is measured against, the traffic, and whether a
/// ratio meets it.
type RatioTarget = (&'static str, Scenario, Scenario, Mode, fn(f64) -> bool);

/// The issues' targets (the datapath's, the scalable source state's and
/// Performance II's, whose random-flood targets depend on the limit,
/// `pps`), from the unpaced cells, and accuracy from every load.
pub fn targets(cells: &[Cell], pps: u64) -> Vec<Target> {
    let cost = |s, m| find(cells, s, m, "unpaced").map(|c| c.stat(|r| r.cpu_ns_per_packet).median);
    // Issue 38: 1.2x no filter at 1,000 pps per source; 1.15x at 100
    // (and under), where more of the flood is judged past the cheap tier.
    let against_no_filter: RatioTarget = if pps <= 100 {
        (
            "random-source flood, 100 pps per source: xdp-limiter cost per packet <= 1.15x no filter",
            Scenario::XdpLimiter,
            Scenario::NoFilter,
            Mode::Random,
            |r| r <= 1.15,
        )
    } else {
        (
            "random-source flood: xdp-limiter cost per packet <= 1.2x no filter",
            Scenario::XdpLimiter,
            Scenario::NoFilter,
            Mode::Random,
            |r| r <= 1.2,
        )
    };
    let ratios: [RatioTarget; 5] = [
        (
            "mixed flood: xdp-limiter cost per packet <= 1.3x the XDP drop floor",
            Scenario::XdpLimiter,
            Scenario::XdpDropAll,
            Mode::Mixed,
            |r| r <= 1.3,
        ),
        (
            "mixed flood: nftables meter (input hook) >= 8x xdp-limiter's cost per packet",
            Scenario::NftInput,
            Scenario::XdpLimiter,
            Mode::Mixed,
            |r| r >= 8.0,
        ),
        (
            "random-source flood: xdp-limiter cost per packet <= 2x the XDP drop floor",
            Scenario::XdpLimiter,
            Scenario::XdpDropAll,
            Mode::Random,
            |r| r <= 2.0,
        ),
        against_no_filter,
        (
            "random-source flood: xdp-limiter cost per packet <= 0.65x nftables meter (input hook)",
            Scenario::XdpLimiter,
            Scenario::NftInput,
            Mode::Random,
            |r| r <= 0.65,
        ),
    ];
    let mut out: Vec<Target> = ratios
        .into_iter()
        .map(|(what, scenario, base, mode, ok)| {
            let ratio = cost(scenario, mode)
                .zip(cost(base, mode))
                .map(|(a, b)| a / b);
            Target {
                mode,
                what,
                measured: ratio.map_or("n/a".into(), |r| format!("{r:.2}x")),
                met: ratio.map(ok),
            }
        })
        .collect();
    // Only without ring loss is the light sources' arrival count exact
    // (it is otherwise estimated from the overall loss): the below load.
    let kept = find(cells, Scenario::XdpLimiter, Mode::Random, "below")
        .map(|c| (c.stat(|r| r.light_kept).min, c.stat(|r| r.ring_loss).max));
    out.push(Target {
        mode: Mode::Random,
        what: "random-source flood below saturation: light sources keep >= 99.9% of their packets (worst run)",
        measured: kept.map_or("n/a".into(), |(k, loss)| {
            format!("{:.3}% (ring loss {:.2}%)", k * 100.0, loss * 100.0)
        }),
        met: kept.map(|(k, _)| k >= 0.999),
    });
    for (what, mode) in [
        (
            "mixed flood: heavy sources admitted within +-1% of the limit (worst source, worst run, any load)",
            Mode::Mixed,
        ),
        (
            "random-source flood: heavy sources admitted within +-1% of the limit (worst source, worst run, any load)",
            Mode::Random,
        ),
    ] {
        let error = cells
            .iter()
            .filter(|c| c.scenario == Scenario::XdpLimiter && c.mode == mode)
            .map(|c| c.stat(|r| r.heavy_max_error).max)
            .reduce(f64::max);
        out.push(Target {
            mode,
            what,
            measured: error.map_or("n/a".into(), |e| format!("{:.2}%", e * 100.0)),
            met: error.map(|e| e <= 0.01),
        });
    }
    out
}

/// The targets of the limits at several levels, from the `random16`
/// cells: the flood from one /16 dropped at XDP (unpaced, per frame, at
/// most 2x the drop-everything floor) while the light sources, outside
/// that /16, keep their frames (below saturation, where their count is
/// exact and their own /16 under its aggregate).
pub fn targets_random16(cells: &[Cell]) -> Vec<Target> {
    let cost = |s| {
        find(cells, s, Mode::Random16, "unpaced").map(|c| c.stat(|r| r.cpu_ns_per_packet).median)
    };
    let mut out = Vec::new();
    for (what, scenario) in [
        (
            "/16 flood: xdp-limiter with a /16 aggregate, cost per packet <= 2x the XDP drop floor",
            Scenario::XdpLimiterAgg16,
        ),
        (
            "/16 flood: xdp-limiter per source only, cost per packet <= 2x the XDP drop floor (for comparison)",
            Scenario::XdpLimiter,
        ),
    ] {
        let ratio = cost(scenario)
            .zip(cost(Scenario::XdpDropAll))
            .map(|(a, b)| a / b);
        out.push(Target {
            mode: Mode::Random16,
            what,
            measured: ratio.map_or("n/a".into(), |r| format!("{r:.2}x")),
            met: ratio.map(|r| r <= 2.0),
        });
    }
    let kept = find(cells, Scenario::XdpLimiterAgg16, Mode::Random16, "below")
        .map(|c| (c.stat(|r| r.light_kept).min, c.stat(|r| r.ring_loss).max));
    out.push(Target {
        mode: Mode::Random16,
        what: "/16 flood below saturation, /16 aggregate: light sources keep >= 99.9% of their packets (worst run)",
        measured: kept.map_or("n/a".into(), |(k, loss)| {
            format!("{:.3}% (ring loss {:.2}%)", k * 100.0, loss * 100.0)
        }),
        met: kept.map(|(k, _)| k >= 0.999),
    });
    out
}

/// What the generated section says about the set-up.
pub struct Setup {
    pub when: String,
    pub machine: String,
    pub mix: String,
    pub random_mix: String,
    pub limit: String,
    /// The per-source limit, packets per second (the targets depend on it).
    pub pps: u64,
    pub timing: String,
}

const BEGIN: &str =
    "<!-- e2e:begin (generated by `cargo xtask bench e2e`; edits here are overwritten) -->";
const END: &str = "<!-- e2e:end -->";

/// A chart line for each of `scenarios` in `mode`: a point per cell at the
/// median of figure `x`, with the median, min and max of figure `y`, each
/// divided by its scale, in the order of x; scenarios without cells are
/// left out.
fn chart_series(
    cells: &[Cell],
    scenarios: impl IntoIterator<Item = Scenario>,
    mode: Mode,
    (x, x_scale): (Figure, f64),
    (y, y_scale): (Figure, f64),
) -> Vec<Series> {
    scenarios
        .into_iter()
        .map(|scenario| {
            let mut points: Vec<_> = cells
                .iter()
                .filter(|c| c.scenario == scenario && c.mode == mode)
                .map(|c| {
                    let s = c.stat(y);
                    (
                        c.stat(x).median / x_scale,
                        s.median / y_scale,
                        s.min / y_scale,
                        s.max / y_scale,
                    )
                })
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series {
                label: scenario.name().into(),
                points,
            }
        })
        .filter(|s| !s.points.is_empty())
        .collect()
}

/// Writes the plots into `img_dir` and replaces the generated section of
/// `doc` (appending it the first time).
pub fn write_docs(doc: &Path, img_dir: &Path, setup: &Setup, cells: &[Cell]) -> anyhow::Result<()> {
    fs::create_dir_all(img_dir)?;
    let mut md = String::new();
    writeln!(md, "{BEGIN}\n")?;
    writeln!(
        md,
        "Measured {} on {}.\n\n- Mixed flood: {}.\n- Random-source flood: {}.\n- Limit: {}.\n- {}.\n",
        setup.when, setup.machine, setup.mix, setup.random_mix, setup.limit, setup.timing
    )?;

    writeln!(
        md,
        "#### Targets\n\n| target | measured | met |\n|---|---|---|"
    )?;
    for t in targets(cells, setup.pps) {
        let met = match t.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "n/a",
        };
        writeln!(md, "| {} | {} | {met} |", t.what, t.measured)?;
    }

    for mode in [Mode::Mixed, Mode::Random] {
        writeln!(
            md,
            "\n#### Receiver CPU per packet, {} traffic (ns, median (min-max))\n",
            mode.name()
        )?;
        writeln!(
            md,
            "| scenario | below ({}) | saturation | unpaced | unpaced vs floor | unpaced vs per-source floor | unpaced throughput | receiver busy (unpaced) |\n|---|---|---|---|---|---|---|---|",
            cells
                .iter()
                .find(|c| c.mode == mode && c.load.name() == "below")
                .and_then(|c| c.load.target_pps())
                .map_or("-".into(), |p| rate(p as f64))
        )?;
        let unpaced_cost = |scenario| {
            find(cells, scenario, mode, "unpaced").map(|c| c.stat(|r| r.cpu_ns_per_packet).median)
        };
        let floor = unpaced_cost(Scenario::XdpDropAll);
        let state_floor = unpaced_cost(Scenario::XdpCountDrop);
        for scenario in Scenario::ALL {
            let cell = |load| find(cells, scenario, mode, load);
            let cost =
                |load| cell(load).map_or("-".into(), |c| entry(c.stat(|r| r.cpu_ns_per_packet), 0));
            let saturation = cell("saturation").map_or("-".into(), |c| {
                format!(
                    "{} at {}",
                    entry(c.stat(|r| r.cpu_ns_per_packet), 0),
                    rate(c.load.target_pps().unwrap_or(0) as f64)
                )
            });
            let unpaced = cell("unpaced");
            let versus = |base: Option<f64>| match (unpaced, base) {
                (Some(c), Some(f)) if f > 0.0 => {
                    format!("{:.2}x", c.stat(|r| r.cpu_ns_per_packet).median / f)
                }
                _ => "-".to_string(),
            };
            let (vs_floor, vs_state_floor) = (versus(floor), versus(state_floor));
            let throughput = unpaced.map_or("-".into(), |c| {
                let s = c.stat(|r| r.received_pps);
                format!("{} ({}-{})", rate(s.median), rate(s.min), rate(s.max))
            });
            let busy = unpaced.map_or("-".into(), |c| {
                format!("{:.0}%", c.stat(|r| r.receiver_busy).median * 100.0)
            });
            writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                scenario.name(),
                cost("below"),
                saturation,
                cost("unpaced"),
                vs_floor,
                vs_state_floor,
                throughput,
                busy
            )?;
        }
    }

    writeln!(
        md,
        "\n#### Admitted versus expected (medians; unpaced unless marked)\n\n\
         | scenario | mode | load | passed | expected | heavy source admitted (pps) | worst heavy error | light kept | random passed | ring loss |\n\
         |---|---|---|---|---|---|---|---|---|---|"
    )?;
    for mode in [Mode::Mixed, Mode::Random] {
        for scenario in Scenario::ALL {
            for load in ["below", "unpaced"] {
                let Some(c) = find(cells, scenario, mode, load) else {
                    continue;
                };
                writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {:.2}% | {:.3}% | {} | {:.2}% |",
                    scenario.name(),
                    mode.name(),
                    load,
                    rate(c.stat(|r| r.passed_pps).median),
                    rate(c.stat(|r| r.expected_passed_pps).median),
                    entry(c.stat(|r| r.heavy_admitted_pps), 0),
                    c.stat(|r| r.heavy_max_error).max * 100.0,
                    c.stat(|r| r.light_kept).median * 100.0,
                    rate(c.stat(|r| r.random_passed_pps).median),
                    c.stat(|r| r.ring_loss).median * 100.0,
                )?;
            }
        }
    }

    // Plots.
    let mut images = Vec::new();
    for mode in [Mode::Mixed, Mode::Random] {
        let series = chart_series(
            cells,
            Scenario::ALL,
            mode,
            (|r| r.offered_pps, 1e6),
            (|r| r.cpu_ns_per_packet, 1.0),
        );
        let name = format!("e2e-cost-{}.png", mode.name());
        let chart = Chart {
            path: &img_dir.join(&name),
            title: &format!("Receiver CPU per packet, {} traffic", mode.name()),
            x_desc: "offered load (Mpps)",
            y_desc: "receiver ns per packet (log)",
        };
        plot::line_chart(&chart, true, &series)?;
        images.push((
            name,
            format!("Offered load vs receiver CPU per packet ({})", mode.name()),
        ));
    }
    // Admitted against expected for the per-source limiters only (no
    // filter passes everything and the floor nothing: nothing to compare).
    for mode in [Mode::Mixed, Mode::Random] {
        let limiters = Scenario::ALL
            .into_iter()
            .filter(|s| s.expectation() == Expectation::PerSourceLimit);
        let admitted = chart_series(
            cells,
            limiters,
            mode,
            (|r| r.expected_passed_pps, 1e3),
            (|r| r.passed_pps, 1e3),
        );
        let name = format!("e2e-admitted-{}.png", mode.name());
        let chart = Chart {
            path: &img_dir.join(&name),
            title: &format!("Passed vs expected, {} traffic (every load)", mode.name()),
            x_desc: "expected to pass (kpps)",
            y_desc: "passed (kpps)",
        };
        plot::admitted_chart(&chart, &admitted)?;
        images.push((name, format!("Passed vs expected ({})", mode.name())));
    }
    writeln!(md)?;
    let rel = img_dir
        .strip_prefix(doc.parent().unwrap_or(Path::new(".")))
        .unwrap_or(img_dir);
    for (file, alt) in images {
        writeln!(md, "![{alt}]({}/{file})\n", rel.display())?;
    }
    writeln!(md, "{END}")?;

    let old = fs::read_to_string(doc).unwrap_or_default();
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(b), Some(e)) if e > b => format!(
            "{}{}{}",
            &old[..b],
            md,
            old[e + END.len()..].trim_start_matches('\n')
        ),
        _ => format!("{old}\n{md}"),
    };
    fs::write(doc, new)?;
    Ok(())
}
