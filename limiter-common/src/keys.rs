//! `SourceKey`: the key under which per-source state is kept, and the
//! prefix masking that makes every address inside one prefix share a key.

/// Address family tag stored in [`SourceKey::family`].
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
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceKey {
    pub addr: [u8; 16],
    /// An [`AddressFamily`] value.
    pub family: u8,
    /// Number of leading address bits that are significant.
    pub prefix_len: u8,
    /// Traffic class index (see `rules::TrafficClass`); 0 when none matched.
    pub class: u8,
    /// Explicit padding; always zero.
    pub _pad: u8,
}

impl SourceKey {
    /// Key for a whole IPv4 address (/32), class 0.
    #[inline(always)]
    pub const fn v4(octets: [u8; 4]) -> Self {
        let mut addr = [0u8; 16];
        addr[0] = octets[0];
        addr[1] = octets[1];
        addr[2] = octets[2];
        addr[3] = octets[3];
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

    /// The address family, or `None` for a corrupt key.
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
        match self.address_family() {
            Some(AddressFamily::V4) => {
                core::net::Ipv4Addr::new(self.addr[0], self.addr[1], self.addr[2], self.addr[3])
                    .into()
            }
            _ => core::net::Ipv6Addr::from(self.addr).into(),
        }
    }

    /// The same key in traffic class `class`.
    #[inline(always)]
    pub const fn with_class(mut self, class: u8) -> Self {
        self.class = class;
        self
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
        assert_eq!(core::mem::align_of::<SourceKey>(), 1);
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
        assert_eq!(key.prefix_len, 128);
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
