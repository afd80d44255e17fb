//! Test harness for xdp-limiter, reused by every integration test:
//!
//! - [`packets`]: frame builders (IPv4/IPv6, VLAN/QinQ, UDP/TCP/ICMP, ARP).
//! - [`flood`]: spoofed sources by index, sprayed through the program.
//! - [`testrun`]: the real program through BPF_PROG_TEST_RUN on a chosen CPU,
//!   and its counters read back.
//! - [`netns`]: network namespaces and veth pairs that always clean up.
//! - [`lab`]: a sender and a receiver namespace joined by a veth pair.
//! - [`cluster_lab`]: several node namespaces with their own daemons, one
//!   traffic namespace and a real Redis on a separate network.
//! - [`daemon`]: the real `xdp-limiter` binary run, scraped and signalled.
//! - [`prometheus`]: a real Prometheus scraping a lab's daemons, queried
//!   through its HTTP API; `promtool` on rule files.
//! - [`retry`]: measurements a stalled machine voids, taken again and
//!   recorded, never silently.
//! - [`model`]: a reference model of the documented parse and rule
//!   semantics; [`fuzz`]: random and mutated frames checked against it
//!   through the kernel.
//!
//! The benchmarks, the demo and the soak (`limiter-bench`) build on this
//! harness too.
//!
//! Everything here needs root and a BPF-capable kernel, and panics with
//! context when it lacks them: tests never skip.

pub mod cluster_lab;
pub mod cookie;
pub mod daemon;
pub mod flood;
pub mod fuzz;
pub mod lab;
pub mod model;
pub mod netns;
pub mod packets;
pub mod prometheus;
pub mod promises;
pub mod redis;
pub mod retry;
pub mod testrun;

/// Calls `poll` every `every` until it returns something, for at most
/// `limit`: what it returned, or `None` if it never did in time.
pub fn wait_until<T>(
    limit: std::time::Duration,
    every: std::time::Duration,
    mut poll: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(value) = poll() {
            return Some(value);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(every);
    }
}

/// A prefix from its text, for the rules tests build (a typo panics).
pub fn net(text: &str) -> ipnet::IpNet {
    text.parse().expect("valid CIDR")
}

/// Sets its flag when dropped: a sender thread's stop flag, set on the
/// way out of a `thread::scope` body, a failed assertion included (the
/// scope would otherwise wait for the sender forever).
pub struct SetOnDrop<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}
