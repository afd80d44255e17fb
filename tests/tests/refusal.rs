//! A kernel that refuses the program gets one clear message: the kernel's
//! release, the program refused, the verifier's reason and the oldest
//! kernel known to work, without a screen of verifier log, and without
//! the minutes of retries aya makes at its default log level. The refusing
//! program is a test object every verifier finds too large
//! (`limiter-bench-objects`' oversized program), loaded through the
//! product's own load path (`kernel::load_xdp`).

use std::time::Instant;

use aya::EbpfLoader;
use limiter_bench_objects::OVERSIZED_OBJECT;
use limiter_user::kernel::{kernel_release, load_xdp, LoadError, OLDEST_TESTED_KERNEL};

#[test]
fn a_refused_program_gets_one_message_naming_kernel_program_reason_and_oldest_kernel() {
    let started = Instant::now();
    let err = match load_xdp(&mut EbpfLoader::new(), OVERSIZED_OBJECT, "oversized") {
        Ok(_) => panic!("the oversized program was accepted"),
        Err(err) => err,
    };
    let took = started.elapsed();
    let LoadError::Refused(refusal) = &err else {
        panic!("not a refusal: {err}");
    };
    let message = err.to_string();
    assert_eq!(message.lines().count(), 1, "one line: {message}");
    assert!(message.len() < 400, "short: {message}");
    for part in [
        format!("this kernel ({})", kernel_release()),
        "`oversized`".to_string(),
        "BPF program is too large".to_string(),
        OLDEST_TESTED_KERNEL.to_string(),
        "--verbose".to_string(),
    ] {
        assert!(message.contains(&part), "`{part}` missing from: {message}");
    }
    assert!(
        refusal.log.contains("processed"),
        "the verifier's log is kept for --verbose: {}",
        refusal.log
    );
    // Statistics only: no per-instruction lines ("12: (bf) r6 = r1"), whose
    // ever larger logs made aya retry a refused load up to ten times.
    assert!(
        !refusal.log.lines().any(|l| l.contains(": (")),
        "the verifier logged instructions: {}",
        refusal.log
    );
    eprintln!("refused in {took:?}: {message}");
}
