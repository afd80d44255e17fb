//! Fault injection for the lifecycle tests: with `XDP_LIMITER_STOP_AT`
//! naming a start-up step, the daemon stops itself (SIGSTOP) when it gets
//! there, so a test can kill it at exactly that point, or let another
//! daemon race it, and then check what it left behind. Unset (always, in
//! production) it costs one environment lookup per step.

use tracing::warn;

/// The variable naming the step to stop at.
pub const STOP_AT: &str = "XDP_LIMITER_STOP_AT";

/// Start-up steps, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Holding the bpffs lock, about to mount bpffs.
    Bpffs,
    /// The programs and maps are loaded (pinned maps adopted), nothing
    /// pushed or attached yet.
    Loaded,
    /// About to push the rules.
    Push,
    /// Rules pushed, about to attach (or swap onto the pinned link).
    Attach,
}

impl Step {
    /// The name `XDP_LIMITER_STOP_AT` takes.
    pub const fn name(self) -> &'static str {
        match self {
            Step::Bpffs => "bpffs",
            Step::Loaded => "loaded",
            Step::Push => "push",
            Step::Attach => "attach",
        }
    }
}

/// Stops the process here if `XDP_LIMITER_STOP_AT` names `step`; returns
/// once it is continued (SIGCONT).
pub fn stop_at(step: Step) {
    if std::env::var(STOP_AT).is_ok_and(|v| v == step.name()) {
        warn!(step = step.name(), "{STOP_AT}: stopping");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
    }
}
