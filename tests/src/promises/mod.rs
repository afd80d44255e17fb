//! The two promises, judged by the documented sliding window itself
//! (`limiter_common::window::reference`, the direct path the window's
//! property tests compare the kernel's cached path with): whether a
//! source's frames, at the times the kernel saw them, stay within its
//! limit in every window (then it must never be dropped), and how many
//! frames any window of a source's admitted frames holds (then it may
//! hold no more than the allowance plus the documented bound).

pub mod check;
pub mod run;
pub mod script;
pub mod zoo;

use std::time::Duration;

use limiter_common::window::{self, AtomicRing, WindowParams};

/// Whether frames sent at `times` (the kernel's clock, in order) stay
/// within `params` in every window as the documented sliding window
/// counts them: the reference path, fed every one of them, admits them
/// all.
pub fn within_limit(params: &WindowParams, times: impl IntoIterator<Item = Duration>) -> bool {
    let ring = AtomicRing::default();
    times
        .into_iter()
        .all(|at| window::try_admit(&ring, params, at.as_nanos() as u64, 1))
}
