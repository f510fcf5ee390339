//! Human units for the CLI's views (pure; time is always an argument):
//! millitokens as tokens with thousands separators (`3,333.334`: exact, the
//! fraction shown only when there is one), durations (`5 s`, `1 min`,
//! `4.2 s ago`), basis points as percents and epoch milliseconds as UTC
//! times (`2026-12-02 17:40:15 UTC`).

/// Millitokens in a token.
pub const MILLI: u64 = 1_000;

/// `1234567` → `1,234,567`.
pub fn thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// Millitokens as tokens, exact: `3333334` → `3,333.334`, `10000000` →
/// `10,000`, `1500` → `1.5`.
pub fn tokens(millitokens: u64) -> String {
    let whole = thousands(millitokens / MILLI);
    let fraction = millitokens % MILLI;
    if fraction == 0 {
        return whole;
    }
    let digits = format!("{fraction:03}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// A rate in millitokens per second as `3,333.334 tokens/s`.
pub fn rate(millitokens_per_s: u64) -> String {
    format!("{} tokens/s", tokens(millitokens_per_s))
}

/// Basis points as a percent: `500` → `5%`, `1` → `0.01%`, `1250` → `12.5%`.
pub fn percent(basis_points: u64) -> String {
    let whole = basis_points / 100;
    let fraction = basis_points % 100;
    if fraction == 0 {
        return format!("{}%", thousands(whole));
    }
    let digits = format!("{fraction:02}");
    format!("{}.{}%", thousands(whole), digits.trim_end_matches('0'))
}

/// A configured length of time, exact, in the largest unit that divides
/// it: `60000` → `1 min`, `5000` → `5 s`, `1500` → `1,500 ms`, `0` → `0 ms`.
pub fn duration(ms: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "min"),
        (1_000, "s"),
    ];
    if ms > 0 {
        for (size, unit) in UNITS {
            if ms.is_multiple_of(size) {
                return format!("{} {unit}", thousands(ms / size));
            }
        }
    }
    format!("{} ms", thousands(ms))
}

/// An elapsed time, rounded for reading: `4.2 s`, `12 min 5 s`, `3 h 12 min`,
/// `2 d 3 h`.
pub fn elapsed(ms: u64) -> String {
    if ms < 60_000 {
        // Tenths of a second, rounded down (never claims more than elapsed).
        return format!("{}.{} s", ms / 1_000, (ms % 1_000) / 100);
    }
    let seconds = ms / 1_000;
    let (minutes, hours, days) = (seconds / 60, seconds / 3_600, seconds / 86_400);
    if hours == 0 {
        format!("{minutes} min {} s", seconds % 60)
    } else if days == 0 {
        format!("{hours} h {} min", minutes % 60)
    } else {
        format!("{} d {} h", thousands(days), hours % 24)
    }
}

/// An instant relative to `now_ms` (both epoch milliseconds): `4.2 s ago`,
/// `in 3.0 s`, `now`; `never` for 0 (a timestamp never set).
pub fn ago(then_ms: u64, now_ms: u64) -> String {
    if then_ms == 0 {
        return "never".into();
    }
    match then_ms.cmp(&now_ms) {
        std::cmp::Ordering::Equal => "now".into(),
        std::cmp::Ordering::Less => format!("{} ago", elapsed(now_ms - then_ms)),
        std::cmp::Ordering::Greater => format!("in {}", elapsed(then_ms - now_ms)),
    }
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    // day in 1..=31 and month in 1..=12 by construction.
    (year, month as u32, day as u32)
}

/// Epoch milliseconds as a UTC time: `2026-12-02 17:40:15 UTC`, with
/// `.123` when the milliseconds are not 0.
pub fn utc(epoch_ms: u64) -> String {
    // u64 ms / 86,400,000 fits i64 comfortably.
    let days = (epoch_ms / 86_400_000) as i64;
    let in_day = epoch_ms % 86_400_000;
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second, milli) = (
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1_000 % 60,
        in_day % 1_000,
    );
    let fraction = if milli == 0 {
        String::new()
    } else {
        format!(".{milli:03}")
    };
    format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02}:{second:02}{fraction} UTC")
}

/// An epoch-ms instant as RFC 3339 in UTC, to the millisecond:
/// `2026-05-01T10:00:00.125Z` (what `--json` readers and log tools parse).
pub fn rfc3339(epoch_ms: u64) -> String {
    let days = (epoch_ms / 86_400_000) as i64;
    let in_day = epoch_ms % 86_400_000;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1_000 % 60,
        in_day % 1_000
    )
}

/// A decimal amount of tokens (`10000`, `2.5`, `1,000.125`) as millitokens;
/// at most 3 decimals. `Err` says why, for the caller to prefix the flag.
pub fn parse_tokens(text: &str) -> Result<u64, String> {
    let cleaned: String = text
        .trim()
        .chars()
        .filter(|c| *c != '_' && *c != ',')
        .collect();
    let bad = || {
        format!(
            "\"{}\" is not an amount of tokens (e.g. 10000 or 2.5; at most 3 decimals)",
            leasehold_logging::quote(text)
        )
    };
    let (whole, fraction) = match cleaned.split_once('.') {
        Some((whole, fraction)) => (whole, fraction),
        None => (cleaned.as_str(), ""),
    };
    if whole.is_empty() && fraction.is_empty()
        || !whole.chars().all(|c| c.is_ascii_digit())
        || !fraction.chars().all(|c| c.is_ascii_digit())
        || fraction.len() > 3
    {
        return Err(bad());
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| bad())?
    };
    let fraction: u64 = if fraction.is_empty() {
        0
    } else {
        format!("{fraction:0<3}").parse().map_err(|_| bad())?
    };
    whole
        .checked_mul(MILLI)
        .and_then(|w| w.checked_add(fraction))
        .ok_or_else(|| format!("\"{}\" is too large", leasehold_logging::quote(text)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_exact_with_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(tokens(10_000_000), "10,000");
        assert_eq!(tokens(3_333_334), "3,333.334");
        assert_eq!(tokens(1_500), "1.5");
        assert_eq!(tokens(7), "0.007");
        assert_eq!(rate(500_000), "500 tokens/s");
        assert_eq!(tokens(u64::MAX), "18,446,744,073,709,551.615");
    }

    #[test]
    fn percents_durations_and_elapsed() {
        assert_eq!(percent(500), "5%");
        assert_eq!(percent(1), "0.01%");
        assert_eq!(percent(1_250), "12.5%");
        assert_eq!(percent(10_000), "100%");
        assert_eq!(duration(60_000), "1 min");
        assert_eq!(duration(5_000), "5 s");
        assert_eq!(duration(1_500), "1,500 ms");
        assert_eq!(duration(0), "0 ms");
        assert_eq!(duration(86_400_000 * 2), "2 d");
        assert_eq!(elapsed(4_250), "4.2 s");
        assert_eq!(elapsed(725_000), "12 min 5 s");
        assert_eq!(elapsed(3 * 3_600_000 + 12 * 60_000), "3 h 12 min");
        assert_eq!(elapsed(2 * 86_400_000 + 3 * 3_600_000), "2 d 3 h");
        assert_eq!(ago(1_000, 5_200), "4.2 s ago");
        assert_eq!(ago(8_000, 5_000), "in 3.0 s");
        assert_eq!(ago(5_000, 5_000), "now");
        assert_eq!(ago(0, 5_000), "never");
        // No panic at the extremes.
        assert!(ago(1, u64::MAX).ends_with(" ago"));
        assert!(ago(u64::MAX, 1).starts_with("in "));
    }

    #[test]
    fn utc_times() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_796_121_679_238), "2026-12-01 10:41:19.238 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert!(utc(u64::MAX).ends_with(" UTC"));
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_796_121_679_238), "2026-12-01T10:41:19.238Z");
        assert_eq!(rfc3339(951_782_400_005), "2000-02-29T00:00:00.005Z");
    }

    #[test]
    fn token_amounts_parse_or_say_why() {
        assert_eq!(parse_tokens("10000"), Ok(10_000_000));
        assert_eq!(parse_tokens("2.5"), Ok(2_500));
        assert_eq!(parse_tokens("1,000.125"), Ok(1_000_125));
        assert_eq!(parse_tokens(".5"), Ok(500));
        for bad in ["", "abc", "1.2345", "-1", "1e3", ".", "1.2.3"] {
            assert!(parse_tokens(bad).is_err(), "{bad:?}");
        }
        assert!(parse_tokens("99999999999999999999").is_err());
        assert!(parse_tokens("18446744073709552")
            .unwrap_err()
            .contains("too large"));
    }
}
