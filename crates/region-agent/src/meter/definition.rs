//! What a meter is, as a policy bundle declares it (`[[meter]]`): its name,
//! its period and its time zone.

use super::period::{Calendar, PeriodError, PeriodKind};

/// What a meter's name may be.
pub const METER_NAME_PATTERN: &str = "[a-z0-9_-]{1,64}";

/// Whether `name` is a meter name ([`METER_NAME_PATTERN`]).
pub fn valid_meter_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// A meter: admitted requests and their cost counted per (tenant, period)
/// for usage reads and calendar quotas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meter {
    /// [`METER_NAME_PATTERN`], unique in the bundle.
    pub name: String,
    pub period: PeriodKind,
    /// An IANA time zone name the bundled database knows (default "UTC").
    pub time_zone: String,
}

impl Meter {
    /// The meter's calendar. Its zone was checked when the bundle was
    /// parsed, so this fails only for a Meter built by hand with an unknown
    /// zone.
    pub fn calendar(&self) -> Result<Calendar, PeriodError> {
        Calendar::new(self.period, &self.time_zone)
    }
}

/// A bundle's meters by name.
pub type Meters = std::collections::BTreeMap<String, Meter>;
