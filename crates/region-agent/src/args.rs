//! Argument validation shared by every script's Rust twin; mirrors
//! `lh_int` in `lua/prelude.lua` character for character.

use crate::store::script::ScriptError;

/// 2^40: the largest count, rate, period, cost or TTL an argument may carry.
pub const MAX_ARG: u64 = 1 << 40;
/// 2^52: the largest capacity × period_ms, so every intermediate product the
/// scripts form stays exact in Lua's doubles.
pub const MAX_PRODUCT: u64 = 1 << 52;

/// Parses a strict decimal integer in `[min, max]`: ASCII digits only, at
/// most 16 of them. Anything else is `InvalidArgument(name)`.
pub fn int(name: &str, text: Option<&String>, min: u64, max: u64) -> Result<u64, ScriptError> {
    let invalid = || ScriptError::InvalidArgument(name.to_string());
    let text = text.ok_or_else(invalid)?;
    if text.is_empty() || text.len() > 16 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    let value: u64 = text.parse().map_err(|_| invalid())?;
    if value < min || value > max {
        return Err(invalid());
    }
    Ok(value)
}

/// A value in [1, 2^40].
pub fn positive(name: &str, text: Option<&String>) -> Result<u64, ScriptError> {
    int(name, text, 1, MAX_ARG)
}

/// A value in [0, 2^40] (slack, TTLs).
pub fn non_negative(name: &str, text: Option<&String>) -> Result<u64, ScriptError> {
    int(name, text, 0, MAX_ARG)
}

/// Integer ceiling of a / b for b > 0.
pub fn div_ceil(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

/// Longest usage sender name (`identity#incarnation`, issue 30).
pub const MAX_SENDER_BYTES: usize = 200;

/// A usage sender's name as `usage_record.lua` and `usage_sender.lua`
/// accept it: 1–200 bytes of `[a-z0-9._/#:-]`.
pub fn valid_sender(sender: &str) -> bool {
    (1..=MAX_SENDER_BYTES).contains(&sender.len())
        && sender
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._/#:-".contains(&b))
}

/// A usage owed marker's `q,c` (`lua/usage_record.lua` writes it, issue
/// 30); None when malformed.
pub fn parse_owed(text: &str) -> Option<(u64, u64)> {
    let (q, c) = text.split_once(',')?;
    let num = |t: &str| non_negative("n", Some(&t.to_string())).ok();
    Some((num(q)?, num(c)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> Option<String> {
        Some(v.to_string())
    }

    #[test]
    fn rejects_every_non_decimal_spelling() {
        for bad in [
            "", "nan", "inf", "-1", "1e3", "0x10", " 5", "5 ", "1.5", "+3",
        ] {
            assert!(positive("cost", s(bad).as_ref()).is_err(), "{bad:?}");
        }
        assert!(positive("cost", None).is_err());
    }

    #[test]
    fn enforces_the_range() {
        assert!(positive("cost", s("0").as_ref()).is_err());
        assert_eq!(non_negative("slack_ms", s("0").as_ref()), Ok(0));
        assert_eq!(positive("cost", s("1099511627776").as_ref()), Ok(MAX_ARG));
        assert!(positive("cost", s("1099511627777").as_ref()).is_err());
        assert!(positive("cost", s("12345678901234567").as_ref()).is_err());
    }
}
