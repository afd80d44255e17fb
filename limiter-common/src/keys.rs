//! `SourceKey`: the key under which per-source state is kept, and the
//! prefix masking that makes every address inside one prefix share a key.
//! Its family byte is private: [`SourceKey::family`] and
//! [`SourceKey::address_family`] read it.

/// Address family tag stored in a [`SourceKey`].
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressFamily {
    V4 = 4,
    V6 = 6,
}

/// A source address prefix and traffic class, as the kernel keys its state.
///
/// IPv4 addresses occupy the first 4 bytes of `addr`; the rest stays zero.
/// Bits past `prefix_len` are always zero, so every address inside one
/// prefix maps to the same key. `class` separates traffic that rules match
/// by protocol and port (0: no class), so each gets its own budget.
///
/// Aligned to 4 (its size stays 20): the kernel then copies a key as five
/// words, not twenty bytes, and the compiler emits no `memmove` call for
/// it (a call frame the 6.1 verifier adds to the caller's stack).
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceKey {
    pub addr: [u8; 16],
    /// An [`AddressFamily`] value.
    family: u8,
    /// Number of leading address bits that are significant.
    pub prefix_len: u8,
    /// Traffic class index (see `rules::TrafficClass`); 0 when none matched.
    pub class: u8,
    /// Explicit padding; always zero.
    _pad: u8,
}

impl SourceKey {
    /// Key for a whole IPv4 address (/32), class 0.
    #[inline(always)]
    pub const fn v4(octets: [u8; 4]) -> Self {
        // One number, stored whole: the zero tail is word stores. A
        // `[0u8; 16]` filled byte by byte became a call of the BPF
        // `memset` (a byte loop) on every IPv4 frame.
        let addr = (u32::from_le_bytes(octets) as u128).to_le_bytes();
        Self {
            addr,
            family: AddressFamily::V4 as u8,
            prefix_len: 32,
            class: 0,
            _pad: 0,
        }
    }

    /// Key for a whole IPv6 address (/128), class 0.
    #[inline(always)]
    pub const fn v6(octets: [u8; 16]) -> Self {
        Self {
            addr: octets,
            family: AddressFamily::V6 as u8,
            prefix_len: 128,
            class: 0,
            _pad: 0,
        }
    }

    /// The address family as the program judges it: IPv4, or IPv6 for
    /// anything else (a corrupt key included; see [`Self::address_family`]).
    #[inline(always)]
    pub const fn family(&self) -> AddressFamily {
        if self.family == AddressFamily::V4 as u8 {
            AddressFamily::V4
        } else {
            AddressFamily::V6
        }
    }

    /// The address family, or `None` for a corrupt key.
    #[inline(always)]
    pub const fn address_family(&self) -> Option<AddressFamily> {
        match self.family {
            4 => Some(AddressFamily::V4),
            6 => Some(AddressFamily::V6),
            _ => None,
        }
    }

    /// This key cut down to its first `prefix_len` bits (with `mask`, the
    /// byte mask of that prefix length, see [`prefix_mask`]).
    #[inline(always)]
    pub fn masked(mut self, prefix_len: u8, mask: &[u8; 16]) -> Self {
        let mut i = 0;
        while i < 16 {
            self.addr[i] &= mask[i];
            i += 1;
        }
        self.prefix_len = prefix_len;
        self
    }

    /// The key's address (its prefix's first address): IPv4 for an IPv4
    /// key, IPv6 otherwise.
    pub fn ip(&self) -> core::net::IpAddr {
        match self.family() {
            AddressFamily::V4 => {
                core::net::Ipv4Addr::new(self.addr[0], self.addr[1], self.addr[2], self.addr[3])
                    .into()
            }
            AddressFamily::V6 => core::net::Ipv6Addr::from(self.addr).into(),
        }
    }

    /// The same key in traffic class `class`.
    #[inline(always)]
    pub const fn with_class(mut self, class: u8) -> Self {
        self.class = class;
        self
    }
}

#[cfg(feature = "user")]
mod user {
    //! What only userspace needs of a key: map access, conversion from an
    //! address, and the human form used in logs and output.

    use core::{fmt, net::IpAddr};

    use super::SourceKey;

    // SAFETY: #[repr(C)], byte fields only (explicit padding): every bit
    // pattern is valid and there are no uninitialised bytes.
    unsafe impl aya::Pod for SourceKey {}

    /// The key of a whole address (/32 or /128), class 0.
    impl From<IpAddr> for SourceKey {
        fn from(addr: IpAddr) -> Self {
            match addr {
                IpAddr::V4(v4) => SourceKey::v4(v4.octets()),
                IpAddr::V6(v6) => SourceKey::v6(v6.octets()),
            }
        }
    }

    /// `192.0.2.1` for a whole address, `2001:db8::/64` for a prefix, with
    /// ` class N` for a frame class other than 0.
    impl fmt::Display for SourceKey {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let addr = self.ip();
            let full = if addr.is_ipv4() { 32 } else { 128 };
            if self.prefix_len == full {
                write!(f, "{addr}")?;
            } else {
                write!(f, "{addr}/{}", self.prefix_len)?;
            }
            if self.class != 0 {
                write!(f, " class {}", self.class)?;
            }
            Ok(())
        }
    }
}

/// The byte mask of a `prefix_len`-bit prefix (bits past 128 are ignored).
pub const fn prefix_mask(prefix_len: u8) -> [u8; 16] {
    let mut mask = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        let bits_before = (i * 8) as u32;
        let len = prefix_len as u32;
        mask[i] = if len >= bits_before + 8 {
            0xff
        } else if len <= bits_before {
            0
        } else {
            0xffu8 << (8 - (len - bits_before))
        };
        i += 1;
    }
    mask
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_has_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<SourceKey>(), 16 + 4);
        // Word-aligned for the kernel's copies; the size (the map key the
        // kernel hashes) is unchanged.
        assert_eq!(core::mem::align_of::<SourceKey>(), 4);
    }

    #[test]
    fn v4_key_zeroes_the_tail() {
        let key = SourceKey::v4([10, 0, 0, 1]);
        assert_eq!(&key.addr[..4], &[10, 0, 0, 1]);
        assert!(key.addr[4..].iter().all(|b| *b == 0));
        assert_eq!(key.address_family(), Some(AddressFamily::V4));
        assert_eq!(key.prefix_len, 32);
        assert_eq!(key.ip(), core::net::Ipv4Addr::new(10, 0, 0, 1));
    }

    #[test]
    fn v6_key_keeps_all_bytes() {
        let octets = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7];
        let key = SourceKey::v6(octets);
        assert_eq!(key.addr, octets);
        assert_eq!(key.address_family(), Some(AddressFamily::V6));
        assert_eq!(key.family(), AddressFamily::V6);
        assert_eq!(key.prefix_len, 128);
    }

    #[test]
    fn a_corrupt_family_is_judged_as_ipv6() {
        let mut key = SourceKey::v4([10, 0, 0, 1]);
        assert_eq!(key.family(), AddressFamily::V4);
        key.family = 0;
        assert_eq!(key.address_family(), None);
        assert_eq!(key.family(), AddressFamily::V6);
    }

    #[cfg(feature = "user")]
    #[test]
    fn sources_print_as_addresses_or_prefixes() {
        use std::string::ToString;
        assert_eq!(SourceKey::v4([192, 0, 2, 1]).to_string(), "192.0.2.1");
        let v6 = SourceKey::v6([0x20, 1, 0xd, 0xb8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
        let mask = prefix_mask(64);
        assert_eq!(v6.masked(64, &mask).to_string(), "2001:db8:0:1::/64");
        assert_eq!(
            SourceKey::v4([10, 0, 0, 0]).with_class(2).to_string(),
            "10.0.0.0 class 2"
        );
    }

    #[cfg(feature = "user")]
    #[test]
    fn an_address_is_a_whole_key() {
        use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};
        let v4: SourceKey = IpAddr::from(Ipv4Addr::new(192, 0, 2, 1)).into();
        assert_eq!(v4, SourceKey::v4([192, 0, 2, 1]));
        let octets = [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9];
        let v6: SourceKey = IpAddr::from(Ipv6Addr::from(octets)).into();
        assert_eq!(v6, SourceKey::v6(octets));
    }

    #[test]
    fn prefix_masks() {
        assert_eq!(prefix_mask(0), [0; 16]);
        assert_eq!(prefix_mask(128), [0xff; 16]);
        let m = prefix_mask(64);
        assert_eq!(&m[..8], &[0xff; 8]);
        assert_eq!(&m[8..], &[0; 8]);
        let m = prefix_mask(20);
        assert_eq!(&m[..4], &[0xff, 0xff, 0xf0, 0]);
        let m = prefix_mask(31);
        assert_eq!(&m[..4], &[0xff, 0xff, 0xff, 0xfe]);
    }

    #[test]
    fn addresses_in_one_v6_64_share_a_key() {
        let a = SourceKey::v6([0x20, 1, 0xd, 0xb8, 0, 0, 0, 1, 0xaa, 0, 0, 0, 0, 0, 0, 1]);
        let b = SourceKey::v6([0x20, 1, 0xd, 0xb8, 0, 0, 0, 1, 0xbb, 0, 0, 0, 0, 0, 9, 2]);
        let c = SourceKey::v6([0x20, 1, 0xd, 0xb8, 0, 0, 0, 2, 0xaa, 0, 0, 0, 0, 0, 0, 1]);
        let mask = prefix_mask(64);
        assert_eq!(a.masked(64, &mask), b.masked(64, &mask));
        assert_ne!(a.masked(64, &mask), c.masked(64, &mask));
        assert_eq!(a.masked(64, &mask).prefix_len, 64);
    }
}
