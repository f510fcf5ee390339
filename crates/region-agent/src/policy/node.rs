//! The TOML text as a tree of values that remember where they were written,
//! so every policy error can name its line.
//!
//! `toml::Spanned` fails on tables that have no span of their own (the
//! implicit `fail_mode` of a `[domain.rule.fail_mode.local]` header, dotted
//! keys), so [`Node`] speaks the same private protocol but accepts a value
//! without a span; such a node is placed at its first spanned descendant.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

// The names `toml` uses to hand a value's byte range to `serde_spanned`.
const SPANNED_NAME: &str = "$__serde_spanned_private_Spanned";
const SPANNED_START: &str = "$__serde_spanned_private_start";
const SPANNED_END: &str = "$__serde_spanned_private_end";
const SPANNED_VALUE: &str = "$__serde_spanned_private_value";
const SPANNED_FIELDS: &[&str] = &[SPANNED_START, SPANNED_END, SPANNED_VALUE];
// The key under which `toml` hands over a date or time.
const DATETIME_KEY: &str = "$__toml_private_datetime";

/// One value and the bytes it was written at (None: an implicit table).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub span: Option<Range<usize>>,
    pub value: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    String(String),
    Integer(i64),
    Float(f64),
    Boolean(bool),
    Datetime,
    Array(Vec<Node>),
    Table(BTreeMap<String, Node>),
}

impl Node {
    /// Byte offset where the node starts: its own span, else its earliest
    /// spanned descendant (the tree's depth is bounded by the TOML parser's
    /// recursion limit).
    pub(crate) fn start(&self) -> Option<usize> {
        if let Some(span) = &self.span {
            return Some(span.start);
        }
        let children: Box<dyn Iterator<Item = &Node>> = match &self.value {
            Value::Array(items) => Box::new(items.iter()),
            Value::Table(entries) => Box::new(entries.values()),
            _ => return None,
        };
        children.filter_map(Node::start).min()
    }
}

/// Parses TOML text into a tree (no policy meaning yet).
pub(crate) fn parse_tree(text: &str) -> Result<Node, toml::de::Error> {
    toml::from_str(text)
}

/// Maps byte offsets to 1-based line numbers.
pub(crate) struct Lines {
    newlines: Vec<usize>,
}

impl Lines {
    pub(crate) fn new(text: &str) -> Lines {
        let newlines = text
            .bytes()
            .enumerate()
            .filter(|&(_, b)| b == b'\n')
            .map(|(i, _)| i)
            .collect();
        Lines { newlines }
    }

    /// The line holding byte `offset`.
    pub(crate) fn line(&self, offset: usize) -> usize {
        self.newlines.partition_point(|&newline| newline < offset) + 1
    }

    /// The line a node starts on, if it has any spanned part.
    pub(crate) fn of(&self, node: &Node) -> Option<usize> {
        node.start().map(|offset| self.line(offset))
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Node, D::Error> {
        deserializer.deserialize_struct(SPANNED_NAME, SPANNED_FIELDS, NodeVisitor)
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a TOML value")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Integer(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        i64::try_from(v)
            .map(Value::Integer)
            .map_err(|_| E::custom("integer out of range"))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Boolean(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Node>()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Value, A::Error> {
        table_entries(map, None)
    }
}

/// Reads a table's entries; `first` is a key already taken from `map`.
fn table_entries<'de, A: MapAccess<'de>>(
    mut map: A,
    first: Option<String>,
) -> Result<Value, A::Error> {
    let mut entries = BTreeMap::new();
    if let Some(key) = first {
        if key == DATETIME_KEY {
            map.next_value::<de::IgnoredAny>()?;
            return Ok(Value::Datetime);
        }
        entries.insert(key, map.next_value::<Node>()?);
    }
    while let Some(key) = map.next_key::<String>()? {
        if key == DATETIME_KEY {
            map.next_value::<de::IgnoredAny>()?;
            return Ok(Value::Datetime);
        }
        entries.insert(key, map.next_value::<Node>()?);
    }
    Ok(Value::Table(entries))
}

struct NodeVisitor;

impl NodeVisitor {
    fn bare<E>(value: Result<Value, E>) -> Result<Node, E> {
        value.map(|value| Node { span: None, value })
    }
}

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a TOML value")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Node, E> {
        Self::bare(ValueVisitor.visit_str(v))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Node, E> {
        Self::bare(ValueVisitor.visit_string(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Node, E> {
        Self::bare(ValueVisitor.visit_i64(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Node, E> {
        Self::bare(ValueVisitor.visit_u64(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Node, E> {
        Self::bare(ValueVisitor.visit_f64(v))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Node, E> {
        Self::bare(ValueVisitor.visit_bool(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Node, A::Error> {
        Self::bare(ValueVisitor.visit_seq(seq))
    }

    /// Either the spanned protocol (start, end, value) or, for a value the
    /// parser has no span for, the table itself.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let Some(first) = map.next_key::<String>()? else {
            return Self::bare(Ok(Value::Table(BTreeMap::new())));
        };
        if first != SPANNED_START {
            return Self::bare(table_entries(map, Some(first)));
        }
        let start: usize = map.next_value()?;
        expect_key(&mut map, SPANNED_END)?;
        let end: usize = map.next_value()?;
        expect_key(&mut map, SPANNED_VALUE)?;
        let value: Value = map.next_value()?;
        Ok(Node {
            span: Some(start..end),
            value,
        })
    }
}

fn expect_key<'de, A: MapAccess<'de>>(map: &mut A, name: &'static str) -> Result<(), A::Error> {
    match map.next_key::<String>()? {
        Some(key) if key == name => Ok(()),
        _ => Err(de::Error::custom(format!("spanned value without {name}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(node: &Node) -> &BTreeMap<String, Node> {
        match &node.value {
            Value::Table(entries) => entries,
            other => panic!("not a table: {other:?}"),
        }
    }

    #[test]
    fn every_value_knows_its_line_even_under_implicit_tables() {
        let text = "version = 1\n[a.b.c]\nx = 2\n[d]\ny = { z = [1, 2.5] }\n";
        let root = parse_tree(text).unwrap();
        let lines = Lines::new(text);
        let a = &table(&root)["a"];
        assert_eq!(a.span, None, "implicit table has no span of its own");
        assert_eq!(lines.of(a), Some(2));
        assert_eq!(lines.of(&table(&table(a)["b"])["c"]), Some(2));
        let d = table(&root)["d"].clone();
        assert_eq!(lines.of(&table(&d)["y"]), Some(5));
        assert_eq!(lines.of(&table(&root)["version"]), Some(1));
    }

    #[test]
    fn dates_become_a_datetime_value_not_a_string() {
        let root = parse_tree("when = 1979-05-27T07:32:00Z\n").unwrap();
        assert_eq!(table(&root)["when"].value, Value::Datetime);
    }

    #[test]
    fn line_of_an_offset_counts_preceding_newlines() {
        let lines = Lines::new("a\nbc\n\nd");
        assert_eq!(lines.line(0), 1);
        assert_eq!(lines.line(1), 1);
        assert_eq!(lines.line(2), 2);
        assert_eq!(lines.line(5), 3);
        assert_eq!(lines.line(6), 4);
    }
}
