//! Human units on the command line: `10k` packets, `5Mbit` per second,
//! `64k` bytes. Decimal prefixes (k = 1000), as networks count.

/// `1500`, `10k`, `2.5M`, `1G` -> a whole number.
pub fn count(text: &str) -> Result<u64, String> {
    scaled(text, text).map_err(|e| format!("{text:?}: {e} (like 500, 10k, 2.5M)"))
}

/// A bit rate (`100kbit`, `5Mbit`, `1Gbps`, `800`) -> bytes per second.
pub fn bits_per_second_as_bytes(text: &str) -> Result<u64, String> {
    let number = text
        .strip_suffix("bit")
        .or_else(|| text.strip_suffix("bps"))
        .unwrap_or(text);
    let bits =
        scaled(number, text).map_err(|e| format!("{text:?}: {e} (like 800kbit, 5Mbit, 1Gbit)"))?;
    match bits / 8 {
        0 => Err(format!("{text:?}: under one byte per second")),
        bytes => Ok(bytes),
    }
}

fn scaled(number: &str, _original: &str) -> Result<u64, String> {
    let number = number.trim();
    let (digits, factor) = match number.chars().last() {
        Some('k' | 'K') => (&number[..number.len() - 1], 1e3),
        Some('M') => (&number[..number.len() - 1], 1e6),
        Some('G') => (&number[..number.len() - 1], 1e9),
        Some('T') => (&number[..number.len() - 1], 1e12),
        _ => (number, 1.0),
    };
    let value: f64 = digits.parse().map_err(|_| "not a number".to_string())?;
    if !value.is_finite() || value < 0.0 {
        return Err("must be zero or more".into());
    }
    let scaled = value * factor;
    if scaled > u64::MAX as f64 / 2.0 {
        return Err("too large".into());
    }
    if scaled.fract() != 0.0 {
        return Err("must be a whole number".into());
    }
    Ok(scaled as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts() {
        assert_eq!(count("1500"), Ok(1500));
        assert_eq!(count("10k"), Ok(10_000));
        assert_eq!(count("2.5M"), Ok(2_500_000));
        assert_eq!(count("1G"), Ok(1_000_000_000));
        assert!(count("-5").unwrap_err().contains("zero or more"));
        assert!(count("fast").unwrap_err().contains("not a number"));
        assert!(count("1.5").unwrap_err().contains("whole"));
        assert!(count("").is_err());
    }

    #[test]
    fn bit_rates_become_bytes() {
        assert_eq!(bits_per_second_as_bytes("5Mbit"), Ok(625_000));
        assert_eq!(bits_per_second_as_bytes("1Gbps"), Ok(125_000_000));
        assert_eq!(bits_per_second_as_bytes("800"), Ok(100));
        assert!(bits_per_second_as_bytes("4bit")
            .unwrap_err()
            .contains("under one byte"));
        assert!(bits_per_second_as_bytes("-1Mbit").is_err());
    }
}
