//! Policy errors: each names the file, the line, the rule (or domain) and
//! the field it is about, so an operator can fix a bundle from the message
//! alone: `dev.toml:14: rule p-read: field capacity: must be an integer in
//! [1, 1099511627]`.
//!
//! One parse reports up to [`MAX_ERRORS`] errors; further ones are counted,
//! not kept, so a hostile bundle cannot make the report unbounded.

use std::fmt;

/// Most errors one parse keeps.
pub const MAX_ERRORS: usize = 20;

/// What is wrong, independent of where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// Not TOML, or not the bundle's shape; the parser's own message.
    #[error("invalid TOML: {0}")]
    Syntax(String),
    #[error("bundle is {bytes} bytes, more than the {max_bytes}-byte cap")]
    TooLarge { bytes: u64, max_bytes: usize },
    #[error("bundle is not UTF-8 text")]
    NotUtf8,
    #[error("cannot read: {0}")]
    Io(String),
    #[error("expected checksum must be 64 hexadecimal characters")]
    BadExpectedChecksum,
    #[error("sha256 {actual} does not match the expected {expected}")]
    ChecksumMismatch { expected: String, actual: String },
    #[error("missing (required)")]
    Missing,
    #[error("unknown field")]
    UnknownField,
    #[error("must be {expected}")]
    WrongType { expected: &'static str },
    #[error("must be an integer in [{min}, {max}]")]
    NotInRange { min: u64, max: u64 },
    #[error("must match {pattern}")]
    Charset { pattern: &'static str },
    #[error("must be one of {allowed}")]
    OneOf { allowed: &'static str },
    #[error("capacity {capacity_tokens} × 1000 millitokens × period_ms {period_ms} exceeds 2^52")]
    ProductTooLarge {
        capacity_tokens: u64,
        period_ms: u64,
    },
    #[error("cost {cost_tokens} exceeds capacity {capacity_tokens}: no request could ever pass")]
    CostAboveCapacity {
        cost_tokens: u64,
        capacity_tokens: u64,
    },
    #[error("must equal capacity ({capacity_tokens}) for a window algorithm, or be omitted")]
    WindowRefill { capacity_tokens: u64 },
    #[error("block of {block_tokens} tokens exceeds capacity {capacity_tokens}: no gateway could ever lease one")]
    BlockAboveCapacity {
        block_tokens: u64,
        capacity_tokens: u64,
    },
    /// The field is present where it must not be, or has a value that is
    /// valid alone but not here; the text says why.
    #[error("{0}")]
    NotAllowed(&'static str),
    #[error("duplicate{}", line_suffix(*first_line, "first at line"))]
    Duplicate { first_line: Option<usize> },
    #[error("{count} entries, at most {max}")]
    TooMany { count: usize, max: usize },
    #[error("{0:?} is not an IANA time zone name")]
    UnknownTimeZone(String),
    #[error("meter {0} is not declared: add a [[meter]] with this name")]
    UndeclaredMeter(String),
    #[error("a quota takes its period and time zone from `meter`, or names them with `period` and `time_zone`: not both")]
    QuotaPeriodTwice,
    #[error("a quota with its own `period` gets a meter named after its id, and {0} is a declared meter: name it with `meter = \"{0}\"` instead")]
    QuotaMeterTaken(String),
    #[error("split over {regions} Regions leaves {per_region} of {written} tokens per Region: no request could pass")]
    SplitTooSmall {
        written: u64,
        regions: usize,
        per_region: u64,
    },
    /// `[domain.envoy]` names one entry key for two fields.
    #[error("entry key {key} is also {first}: one entry fills one field")]
    EntryKeyTwice { key: String, first: &'static str },
    #[error(
        "can share a request with rule {other}{} whose hash tag is {other_tag}, while this rule's is {tag}: one request's checked rules must share one hash tag",
        line_suffix(*other_line, "at line")
    )]
    MixedHashTags {
        tag: String,
        other: String,
        other_tag: String,
        other_line: Option<usize>,
    },
    #[error("can share a request with {count} checked rules (itself included), at most {max}")]
    TooManyCoMatching { count: usize, max: usize },
    #[error(
        "a {algorithm} rule can share a request with checked rule {other}{}: only token buckets combine in one multi_rule call",
        line_suffix(*other_line, "at line")
    )]
    CannotCombine {
        algorithm: &'static str,
        other: String,
        other_line: Option<usize>,
    },
}

fn line_suffix(line: Option<usize>, words: &str) -> String {
    line.map(|line| format!(" ({words} {line})"))
        .unwrap_or_default()
}

/// One error, with its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    /// The bundle's file name (or "admin-rpc").
    pub file: String,
    /// 1-based; None when the error is about the whole text (size, checksum).
    pub line: Option<usize>,
    /// The domain, for errors about a domain rather than a rule.
    pub domain: Option<String>,
    /// The rule id, or `#n` (1-based position in its domain) when the id
    /// itself is missing or invalid.
    pub rule: Option<String>,
    /// Dotted path of the field, e.g. `fail_mode.local.capacity`.
    pub field: Option<String>,
    pub problem: Problem,
}

impl PolicyError {
    /// An error about the whole text.
    pub fn whole(file: &str, problem: Problem) -> PolicyError {
        PolicyError {
            file: file.to_string(),
            line: None,
            domain: None,
            rule: None,
            field: None,
            problem,
        }
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(rule) = &self.rule {
            write!(f, ": rule {rule}")?;
        } else if let Some(domain) = &self.domain {
            write!(f, ": domain {domain}")?;
        }
        if let Some(field) = &self.field {
            write!(f, ": field {field}")?;
        }
        write!(f, ": {}", self.problem)
    }
}

impl std::error::Error for PolicyError {}

/// Every error one parse found (at least one), up to [`MAX_ERRORS`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyErrors {
    errors: Vec<PolicyError>,
    omitted: usize,
}

impl PolicyErrors {
    /// The errors kept, in the order found (file order within each pass).
    pub fn errors(&self) -> &[PolicyError] {
        &self.errors
    }

    /// The first error found.
    pub fn first(&self) -> &PolicyError {
        // Invariant: never empty (built only from a non-empty collector or one error).
        &self.errors[0]
    }

    /// Errors found beyond [`MAX_ERRORS`] and not kept.
    pub fn omitted(&self) -> usize {
        self.omitted
    }
}

impl From<PolicyError> for PolicyErrors {
    fn from(error: PolicyError) -> Self {
        PolicyErrors {
            errors: vec![error],
            omitted: 0,
        }
    }
}

impl fmt::Display for PolicyErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        if self.omitted > 0 {
            write!(f, "\n(and {} more errors)", self.omitted)?;
        }
        Ok(())
    }
}

impl std::error::Error for PolicyErrors {}

/// Gathers errors up to the cap.
#[derive(Debug, Default)]
pub(crate) struct Collector {
    errors: Vec<PolicyError>,
    omitted: usize,
}

impl Collector {
    pub(crate) fn push(&mut self, error: PolicyError) {
        if self.errors.len() < MAX_ERRORS {
            self.errors.push(error);
        } else {
            self.omitted += 1;
        }
    }

    /// How many were pushed (kept or omitted).
    pub(crate) fn len(&self) -> usize {
        self.errors.len() + self.omitted
    }

    /// Ok when nothing was pushed.
    pub(crate) fn finish(self) -> Result<(), PolicyErrors> {
        debug_assert!(self.omitted == 0 || self.errors.len() == MAX_ERRORS);
        if self.errors.is_empty() {
            return Ok(());
        }
        Err(PolicyErrors {
            errors: self.errors,
            omitted: self.omitted,
        })
    }
}
