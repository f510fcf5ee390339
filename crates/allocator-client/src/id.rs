//! Identifiers of pools, Regions and chunk-grant leases, and their caps.
//!
//! Commands carry ids as plain strings (they arrive from the wire and the
//! log); `apply` parses them here before touching state, so an invalid id is
//! a typed error that names the command field, and state only ever holds
//! valid ids. Deserialising a snapshot re-validates every id.
//!
//! | id | charset | length |
//! |---|---|---|
//! | [`PoolId`], [`RegionId`] | `[a-z0-9-]` | 1 to [`MAX_ID_BYTES`] bytes |
//! | [`LeaseId`] | `[A-Za-z0-9._:-]` | 1 to [`MAX_ID_BYTES`] bytes |

use std::borrow::Borrow;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Cap on the length of every id, in bytes. A longer id is refused with
/// [`IdError::TooLong`]; nothing is truncated.
pub const MAX_ID_BYTES: usize = 64;

/// Why a string is not a valid id.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum IdError {
    #[error("empty")]
    Empty,
    /// Says the length the way `leasehold_logging::quote` does (`(N
    /// bytes)`) and never echoes the id itself: an oversized id is refused
    /// without quoting any of it.
    #[error("too long ({length_bytes} bytes), the cap is {cap_bytes} bytes")]
    TooLong {
        length_bytes: usize,
        cap_bytes: usize,
    },
    #[error("byte {byte:#04x} at index {index} is outside {charset}")]
    InvalidByte {
        index: usize,
        byte: u8,
        charset: String,
    },
}

fn check(text: &str, charset: &str, allowed: fn(u8) -> bool) -> Result<(), IdError> {
    if text.is_empty() {
        return Err(IdError::Empty);
    }
    if text.len() > MAX_ID_BYTES {
        return Err(IdError::TooLong {
            length_bytes: text.len(),
            cap_bytes: MAX_ID_BYTES,
        });
    }
    match text.bytes().enumerate().find(|&(_, byte)| !allowed(byte)) {
        Some((index, byte)) => Err(IdError::InvalidByte {
            index,
            byte,
            charset: charset.to_string(),
        }),
        None => Ok(()),
    }
}

fn is_name_byte(byte: u8) -> bool {
    byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-'
}

fn is_lease_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b':' | b'-')
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $charset:literal, $allowed:path) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// The allowed bytes, as a regex class.
            pub const CHARSET: &'static str = $charset;

            /// Parses `text`, refusing empty, oversized or out-of-charset ids.
            pub fn parse(text: &str) -> Result<Self, IdError> {
                check(text, $charset, $allowed)?;
                Ok(Self(text.to_string()))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(text: String) -> Result<Self, IdError> {
                check(&text, $charset, $allowed)?;
                Ok(Self(text))
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str(&self.0)
            }
        }
    };
}

id_type!(
    /// A global pool's id: `[a-z0-9-]{1,64}`.
    PoolId,
    "[a-z0-9-]",
    is_name_byte
);
id_type!(
    /// A Region's id: `[a-z0-9-]{1,64}`.
    RegionId,
    "[a-z0-9-]",
    is_name_byte
);
id_type!(
    /// A chunk grant's idempotency key: `[A-Za-z0-9._:-]{1,64}`.
    LeaseId,
    "[A-Za-z0-9._:-]",
    is_lease_byte
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ids_up_to_the_cap() {
        let longest = "a".repeat(MAX_ID_BYTES);
        assert!(PoolId::parse(&longest).is_ok());
        assert!(RegionId::parse("eu-west-1").is_ok());
        assert!(LeaseId::parse("Agent.7:window_3-x").is_ok());
    }

    #[test]
    fn refuses_empty_oversized_and_out_of_charset_ids() {
        assert_eq!(PoolId::parse(""), Err(IdError::Empty));
        assert_eq!(
            RegionId::parse(&"a".repeat(MAX_ID_BYTES + 1)),
            Err(IdError::TooLong {
                length_bytes: MAX_ID_BYTES + 1,
                cap_bytes: MAX_ID_BYTES
            })
        );
        assert!(matches!(
            PoolId::parse("Upper"),
            Err(IdError::InvalidByte { index: 0, .. })
        ));
        assert!(RegionId::parse("a_b").is_err());
        assert!(LeaseId::parse("a b").is_err());
        assert!(LeaseId::parse("é").is_err());
    }

    #[test]
    fn an_oversized_id_is_refused_by_its_length_only() {
        let huge = "a".repeat(65_536);
        let message = LeaseId::parse(&huge).unwrap_err().to_string();
        assert_eq!(message, "too long (65536 bytes), the cap is 64 bytes");
    }

    #[test]
    fn deserialising_revalidates_the_id() {
        assert!(serde_json::from_str::<PoolId>("\"ok-1\"").is_ok());
        assert!(serde_json::from_str::<PoolId>("\"NOT OK\"").is_err());
    }
}
