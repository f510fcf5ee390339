//! Calendar periods of a meter (issue 30): a day, an ISO week (Monday
//! first) or a month, in the meter's IANA time zone (`jiff`, its database
//! bundled so every machine agrees). Pure: the instant is an argument.
//!
//! A period runs from local midnight of its first day to local midnight
//! after its last, so a day across a daylight-saving change lasts 23 or
//! 25 hours, and a midnight a zone skips begins at the first instant that
//! exists (jiff's `to_zoned_datetime`, compatible disambiguation).

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

/// How long a meter's period is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PeriodKind {
    Day,
    Week,
    Month,
}

impl PeriodKind {
    pub const ALL: [PeriodKind; 3] = [PeriodKind::Day, PeriodKind::Week, PeriodKind::Month];

    /// The name in bundles and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            PeriodKind::Day => "day",
            PeriodKind::Week => "week",
            PeriodKind::Month => "month",
        }
    }

    pub fn from_name(name: &str) -> Option<PeriodKind> {
        PeriodKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeriodError {
    #[error("time_zone: {0:?} is not an IANA time zone name")]
    UnknownZone(String),
    #[error("the instant {0} ms is outside the calendar")]
    OutOfRange(i64),
    #[error("period: {0:?} is not a {1} (expected {2})")]
    BadLabel(String, &'static str, &'static str),
}

/// A meter's calendar: its period kind in its zone.
#[derive(Debug, Clone)]
pub struct Calendar {
    kind: PeriodKind,
    zone_name: String,
    zone: TimeZone,
}

/// One period: its label (`2026-12-06`, `2026-W49`, `2026-12`) and its
/// bounds as Unix ms, start inclusive, end exclusive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Period {
    pub label: String,
    pub start_ms: i64,
    pub end_ms: i64,
}

impl Calendar {
    /// `zone_name`: an IANA name ("UTC", "Europe/Berlin", "America/New_York").
    pub fn new(kind: PeriodKind, zone_name: &str) -> Result<Calendar, PeriodError> {
        let zone =
            TimeZone::get(zone_name).map_err(|_| PeriodError::UnknownZone(zone_name.into()))?;
        Ok(Calendar {
            kind,
            zone_name: zone_name.to_string(),
            zone,
        })
    }

    pub fn kind(&self) -> PeriodKind {
        self.kind
    }

    pub fn zone_name(&self) -> &str {
        &self.zone_name
    }

    /// The period holding the instant `at_ms`.
    pub fn period_at(&self, at_ms: i64) -> Result<Period, PeriodError> {
        let out = || PeriodError::OutOfRange(at_ms);
        let at = Timestamp::from_millisecond(at_ms).map_err(|_| out())?;
        let date = at.to_zoned_datetime(self.zone.clone()).date();
        let first = match self.kind {
            PeriodKind::Day => date,
            PeriodKind::Week => {
                let back = i64::from(date.weekday().to_monday_zero_offset());
                date.checked_sub(back.days()).map_err(|_| out())?
            }
            PeriodKind::Month => date.first_of_month(),
        };
        self.period_from(first).ok_or_else(out)
    }

    /// The period a label names (what `usage show --period` takes).
    pub fn period_named(&self, label: &str) -> Result<Period, PeriodError> {
        let bad = |expected| PeriodError::BadLabel(label.into(), self.kind.as_str(), expected);
        let first = match self.kind {
            PeriodKind::Day => label.parse::<Date>().ok().filter(|_| label.len() == 10),
            PeriodKind::Week => parse_week(label),
            PeriodKind::Month => format!("{label}-01")
                .parse::<Date>()
                .ok()
                .filter(|_| label.len() == 7),
        }
        .ok_or_else(|| {
            bad(match self.kind {
                PeriodKind::Day => "YYYY-MM-DD",
                PeriodKind::Week => "YYYY-Www",
                PeriodKind::Month => "YYYY-MM",
            })
        })?;
        let period = self.period_from(first).ok_or_else(|| {
            bad(match self.kind {
                PeriodKind::Day => "a date in range",
                PeriodKind::Week => "a week in range",
                PeriodKind::Month => "a month in range",
            })
        })?;
        if period.label != label {
            return Err(bad("a canonical label"));
        }
        Ok(period)
    }

    /// The period whose first local day is `first`.
    fn period_from(&self, first: Date) -> Option<Period> {
        let next = match self.kind {
            PeriodKind::Day => first.checked_add(1.day()).ok()?,
            PeriodKind::Week => first.checked_add(7.days()).ok()?,
            PeriodKind::Month => first.checked_add(1.month()).ok()?,
        };
        let start = first.to_zoned_datetime(self.zone.clone()).ok()?;
        let end = next.to_zoned_datetime(self.zone.clone()).ok()?;
        let label = match self.kind {
            PeriodKind::Day => first.strftime("%Y-%m-%d").to_string(),
            PeriodKind::Week => {
                let week = first.iso_week_date();
                format!("{:04}-W{:02}", week.year(), week.week())
            }
            PeriodKind::Month => first.strftime("%Y-%m").to_string(),
        };
        Some(Period {
            label,
            start_ms: start.timestamp().as_millisecond(),
            end_ms: end.timestamp().as_millisecond(),
        })
    }
}

/// `YYYY-Www` → the Monday of that ISO week.
fn parse_week(label: &str) -> Option<Date> {
    let (year, week) = label.split_once("-W")?;
    if year.len() != 4 || week.len() != 2 {
        return None;
    }
    let year: i16 = year.parse().ok()?;
    let week: i8 = week.parse().ok()?;
    let iso = jiff::civil::ISOWeekDate::new(year, week, jiff::civil::Weekday::Monday).ok()?;
    Some(iso.date())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(text: &str) -> i64 {
        text.parse::<Timestamp>().unwrap().as_millisecond()
    }

    #[test]
    fn a_utc_month_runs_from_its_first_midnight_to_the_next() {
        let calendar = Calendar::new(PeriodKind::Month, "UTC").unwrap();
        let period = calendar.period_at(ms("2026-12-06T18:00:00Z")).unwrap();
        assert_eq!(period.label, "2026-12");
        assert_eq!(period.start_ms, ms("2026-12-01T00:00:00Z"));
        assert_eq!(period.end_ms, ms("2027-01-01T00:00:00Z"));
    }

    #[test]
    fn a_new_york_day_resets_at_local_midnight_across_daylight_saving() {
        let calendar = Calendar::new(PeriodKind::Day, "America/New_York").unwrap();
        // 2026-03-08: clocks go from 02:00 to 03:00 local; the day has 23 h.
        let spring = calendar.period_at(ms("2026-03-08T12:00:00Z")).unwrap();
        assert_eq!(spring.label, "2026-03-08");
        assert_eq!(spring.start_ms, ms("2026-03-08T05:00:00Z"));
        assert_eq!(spring.end_ms, ms("2026-03-09T04:00:00Z"));
        assert_eq!(spring.end_ms - spring.start_ms, 23 * 3_600_000);
        // 2026-11-01: 02:00 back to 01:00; the day has 25 h.
        let autumn = calendar.period_at(ms("2026-11-01T12:00:00Z")).unwrap();
        assert_eq!(autumn.start_ms, ms("2026-11-01T04:00:00Z"));
        assert_eq!(autumn.end_ms - autumn.start_ms, 25 * 3_600_000);
        // One ms before local midnight is the old day, midnight the new.
        let before = calendar.period_at(ms("2026-03-09T03:59:59.999Z")).unwrap();
        assert_eq!(before.label, "2026-03-08");
        let after = calendar.period_at(ms("2026-03-09T04:00:00Z")).unwrap();
        assert_eq!(after.label, "2026-03-09");
    }

    #[test]
    fn an_iso_week_starts_on_monday_and_may_belong_to_the_next_year() {
        let calendar = Calendar::new(PeriodKind::Week, "UTC").unwrap();
        // Thursday 2026-12-31 is in ISO week 2026-W53.
        let period = calendar.period_at(ms("2026-12-31T10:00:00Z")).unwrap();
        assert_eq!(period.label, "2026-W53");
        assert_eq!(period.start_ms, ms("2026-12-28T00:00:00Z"));
        // Monday 2024-12-30 begins 2025-W01.
        let period = calendar.period_at(ms("2024-12-31T10:00:00Z")).unwrap();
        assert_eq!(period.label, "2025-W01");
        assert_eq!(period.start_ms, ms("2024-12-30T00:00:00Z"));
    }

    #[test]
    fn labels_name_their_period_and_nothing_else() {
        let month = Calendar::new(PeriodKind::Month, "Europe/Berlin").unwrap();
        let period = month.period_named("2026-11").unwrap();
        assert_eq!(period.start_ms, ms("2026-10-31T23:00:00Z"));
        assert_eq!(month.period_at(period.start_ms).unwrap(), period);
        for bad in ["2026-13", "2026-1", "26-11", "2026-11-01", "", "2026-W01"] {
            assert!(month.period_named(bad).is_err(), "{bad}");
        }
        let week = Calendar::new(PeriodKind::Week, "UTC").unwrap();
        assert_eq!(week.period_named("2026-W49").unwrap().label, "2026-W49");
        assert!(week.period_named("2026-W54").is_err());
        let day = Calendar::new(PeriodKind::Day, "UTC").unwrap();
        assert!(day.period_named("2026-02-30").is_err());
    }

    #[test]
    fn an_unknown_zone_is_refused_by_name() {
        let error = Calendar::new(PeriodKind::Day, "Mars/Olympus").unwrap_err();
        assert!(error.to_string().contains("Mars/Olympus"), "{error}");
    }

    proptest! {
        /// Every instant lies in its period, periods tile the time line,
        /// and a label names back the same period.
        #[test]
        fn periods_hold_their_instant_and_tile(
            at_ms in 0i64..4_102_444_800_000,
            kind in prop::sample::select(PeriodKind::ALL.to_vec()),
            zone in prop::sample::select(vec!["UTC", "America/New_York", "Europe/Berlin", "Asia/Kathmandu", "Australia/Lord_Howe"]),
        ) {
            let calendar = Calendar::new(kind, zone).unwrap();
            let period = calendar.period_at(at_ms).unwrap();
            prop_assert!(period.start_ms <= at_ms && at_ms < period.end_ms);
            let next = calendar.period_at(period.end_ms).unwrap();
            prop_assert_eq!(next.start_ms, period.end_ms);
            prop_assert_ne!(&next.label, &period.label);
            prop_assert_eq!(calendar.period_named(&period.label).unwrap(), period);
        }
    }
}
