//! Human forms of kernel types for logs and output.

use limiter_common::SourceKey;

/// `192.0.2.1`, `2001:db8::/64`, with ` class N` for a frame class.
pub fn source(key: &SourceKey) -> String {
    let addr = key.ip();
    let full = if addr.is_ipv4() { 32 } else { 128 };
    let mut text = if key.prefix_len == full {
        addr.to_string()
    } else {
        format!("{addr}/{}", key.prefix_len)
    };
    if key.class != 0 {
        text.push_str(&format!(" class {}", key.class));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_print_as_addresses_or_prefixes() {
        assert_eq!(source(&SourceKey::v4([192, 0, 2, 1])), "192.0.2.1");
        let v6 = SourceKey::v6([0x20, 1, 0xd, 0xb8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
        let mask = limiter_common::prefix_mask(64);
        assert_eq!(source(&v6.masked(64, &mask)), "2001:db8:0:1::/64");
        assert_eq!(
            source(&SourceKey::v4([10, 0, 0, 0]).with_class(2)),
            "10.0.0.0 class 2"
        );
    }
}
