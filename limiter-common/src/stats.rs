//! Counters and the `Outcome` index of the global per-CPU stats array.

/// A packet and byte counter pair. Bytes are whole frame lengths as XDP
/// sees them (Ethernet header included).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counter {
    pub packets: u64,
    pub bytes: u64,
}

impl Counter {
    /// Counts one frame of `len` bytes.
    #[inline(always)]
    pub fn add(&mut self, len: u64) {
        self.packets += 1;
        self.bytes += len;
    }

    /// Sum of two counters (used to fold per-CPU values).
    pub const fn merged(self, other: Counter) -> Counter {
        Counter {
            packets: self.packets + other.packets,
            bytes: self.bytes + other.bytes,
        }
    }
}

/// What happened to a frame; the index into the `STATS` per-CPU array.
///
/// `NewSource` and `InsertFailure` count events on the state map in addition
/// to the frame's verdict outcome.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// An IP frame that was counted against its source and passed.
    Passed = 0,
    /// A frame that is not IPv4/IPv6 (ARP, LLDP, ...): passed untouched.
    NonIp = 1,
    /// An IP frame too short for its headers or with invalid header fields:
    /// passed untouched for the stack to reject.
    Malformed = 2,
    /// The frame created new state for its source.
    NewSource = 3,
    /// The state map refused a new source (the frame still got its verdict).
    InsertFailure = 4,
}

impl Outcome {
    /// Number of outcomes: the `STATS` array length.
    pub const COUNT: u32 = 5;

    /// Every outcome, in index order.
    pub const ALL: [Outcome; Self::COUNT as usize] = [
        Outcome::Passed,
        Outcome::NonIp,
        Outcome::Malformed,
        Outcome::NewSource,
        Outcome::InsertFailure,
    ];

    /// Stable snake_case name, used in logs and metrics labels.
    pub const fn name(self) -> &'static str {
        match self {
            Outcome::Passed => "passed",
            Outcome::NonIp => "non_ip",
            Outcome::Malformed => "malformed",
            Outcome::NewSource => "new_source",
            Outcome::InsertFailure => "insert_failure",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_dense_indices() {
        for (i, outcome) in Outcome::ALL.iter().enumerate() {
            assert_eq!(*outcome as usize, i, "{}", outcome.name());
        }
    }

    #[test]
    fn counter_adds_and_merges() {
        let mut a = Counter::default();
        a.add(60);
        a.add(1500);
        let b = Counter {
            packets: 3,
            bytes: 10,
        };
        assert_eq!(
            a.merged(b),
            Counter {
                packets: 5,
                bytes: 1570
            }
        );
    }
}
