//! The time units of envoyproxy/ratelimit limits: fixed windows counted
//! from the unix epoch (a week starts on a Thursday, a month is 30 days, a
//! year 365), as upstream's `UnitToDivider`.

/// A limit's unit; the numbers are the RLS proto's `RateLimit.Unit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The window length in seconds.
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
        }
    }

    pub fn millis(self) -> u64 {
        self.seconds() * 1_000
    }

    /// The name in configs (`second`, …); read case-insensitively.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// `second`, `MINUTE`, … (upstream upper-cases before its lookup).
    pub fn parse(text: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|unit| unit.name().eq_ignore_ascii_case(text))
    }

    /// The RLS proto's number (`RateLimitResponse.RateLimit.Unit`).
    pub fn proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// From the RLS proto's number; None for UNKNOWN (0) and others.
    pub fn from_proto(number: i32) -> Option<Unit> {
        Unit::ALL.into_iter().find(|unit| unit.proto() == number)
    }

    /// Start (ms) of the epoch-aligned window holding `now_ms` (≥ 0).
    pub fn window_start_ms(self, now_ms: u64) -> u64 {
        now_ms - now_ms % self.millis()
    }

    /// Whole seconds from `now_ms` to the window's end, in [1, unit]: what
    /// upstream answers as `duration_until_reset` (`divider - now % divider`).
    pub fn seconds_to_reset(self, now_ms: u64) -> u64 {
        let now_s = now_ms / 1_000;
        self.seconds() - now_s % self.seconds()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_parse_in_any_case_and_unknown_is_refused() {
        for unit in Unit::ALL {
            assert_eq!(Unit::parse(unit.name()), Some(unit));
            assert_eq!(Unit::parse(&unit.name().to_uppercase()), Some(unit));
            assert_eq!(Unit::from_proto(unit.proto()), Some(unit));
        }
        assert_eq!(Unit::parse("unknown"), None);
        assert_eq!(Unit::parse(""), None);
        assert_eq!(Unit::from_proto(0), None);
    }

    #[test]
    fn upstream_examples_of_reset() {
        // 10/MINUTE at now = 2222 s: reset in 58 s (upstream's header test).
        assert_eq!(Unit::Minute.seconds_to_reset(2_222_000), 58);
        // SECOND at 1234 s: 1 s.
        assert_eq!(Unit::Second.seconds_to_reset(1_234_000), 1);
        // HOUR at 1,000,000 s: the window began at 997,200 s.
        assert_eq!(Unit::Hour.window_start_ms(1_000_000_000), 997_200_000);
        assert_eq!(Unit::Day.window_start_ms(1_000_000_000), 950_400_000);
    }

    proptest! {
        #[test]
        fn now_lies_in_its_window_and_reset_is_within_one_unit(
            now_ms in 0u64..4_000_000_000_000,
            unit in proptest::sample::select(Unit::ALL.to_vec()),
        ) {
            let start = unit.window_start_ms(now_ms);
            prop_assert!(start <= now_ms && now_ms < start + unit.millis());
            prop_assert_eq!(start % unit.millis(), 0);
            let reset = unit.seconds_to_reset(now_ms);
            prop_assert!((1..=unit.seconds()).contains(&reset));
        }
    }
}
