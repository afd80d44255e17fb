//! `SourceKey`: the key under which per-source state is kept.

/// Address family tag stored in [`SourceKey::family`].
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressFamily {
    V4 = 4,
    V6 = 6,
}

/// A source address (or prefix), as the kernel keys its state.
///
/// IPv4 addresses occupy the first 4 bytes of `addr`; the rest stays zero.
/// Bits past `prefix_len` are always zero, so every address inside one
/// prefix maps to the same key.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceKey {
    pub addr: [u8; 16],
    /// An [`AddressFamily`] value.
    pub family: u8,
    /// Number of leading address bits that are significant.
    pub prefix_len: u8,
    /// Explicit padding; always zero.
    pub _pad: [u8; 2],
}

impl SourceKey {
    /// Key for a whole IPv4 address (/32).
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
            _pad: [0; 2],
        }
    }

    /// Key for a whole IPv6 address (/128).
    #[inline(always)]
    pub const fn v6(octets: [u8; 16]) -> Self {
        Self {
            addr: octets,
            family: AddressFamily::V6 as u8,
            prefix_len: 128,
            _pad: [0; 2],
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_has_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<SourceKey>(), 16 + 1 + 1 + 2);
        assert_eq!(core::mem::align_of::<SourceKey>(), 1);
    }

    #[test]
    fn v4_key_zeroes_the_tail() {
        let key = SourceKey::v4([10, 0, 0, 1]);
        assert_eq!(&key.addr[..4], &[10, 0, 0, 1]);
        assert!(key.addr[4..].iter().all(|b| *b == 0));
        assert_eq!(key.address_family(), Some(AddressFamily::V4));
        assert_eq!(key.prefix_len, 32);
    }

    #[test]
    fn v6_key_keeps_all_bytes() {
        let octets = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7];
        let key = SourceKey::v6(octets);
        assert_eq!(key.addr, octets);
        assert_eq!(key.address_family(), Some(AddressFamily::V6));
        assert_eq!(key.prefix_len, 128);
    }
}
