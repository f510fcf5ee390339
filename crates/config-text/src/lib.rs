//! TOML text with the position of every value: the loaders' errors name file and line.
//!
//! [`Node::parse`] reads TOML text into a tree of [`Node`]s, each a
//! [`Value`] and the bytes it was written at; [`Lines`] turns a byte offset
//! into a 1-based line. Paths (`a.b[2].c`) find a node ([`Node::find`]), the
//! line it or its deepest written parent is on ([`Node::line`]), or every
//! node a path names through arrays of tables ([`Node::each`]). Typed
//! parsing stays serde's job; the tree exists to check values against the
//! text and to point at lines.
//!
//! `toml::Spanned` fails on tables that have no span of their own (the
//! implicit `a` of an `[a.b]` header, dotted keys), so [`Node`] speaks the
//! same private protocol but accepts a value without a span; such a node is
//! placed at its first spanned descendant.

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

/// One TOML value and the bytes it was written at (`None`: a table the text
/// only implies, such as `a` of `[a.b]` or of a dotted key `a.b = 1`).
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub span: Option<Range<usize>>,
    pub value: Value,
}

/// A TOML value; a date or time keeps only that it is one.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    String(String),
    Integer(i64),
    Float(f64),
    Boolean(bool),
    Datetime,
    Array(Vec<Node>),
    Table(BTreeMap<String, Node>),
}

impl Node {
    /// Parses TOML text into a tree (syntax only: no meaning yet).
    pub fn parse(text: &str) -> Result<Node, toml::de::Error> {
        toml::from_str(text)
    }

    /// Byte offset where the node starts: its own span, else its earliest
    /// spanned descendant (the tree's depth is bounded by the TOML parser's
    /// recursion limit).
    pub fn start(&self) -> Option<usize> {
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

    /// The value under a key (tables only).
    pub fn get(&self, key: &str) -> Option<&Node> {
        match &self.value {
            Value::Table(entries) => entries.get(key),
            _ => None,
        }
    }

    /// The element at an index (arrays only).
    pub fn index(&self, index: usize) -> Option<&Node> {
        match &self.value {
            Value::Array(items) => items.get(index),
            _ => None,
        }
    }

    /// The deepest node along `path` (`a.b[2].c`: keys separated by dots,
    /// `[i]` indexes an array) and whether it is the whole path.
    pub fn deepest(&self, path: &str) -> (&Node, bool) {
        let mut node = self;
        for segment in path.split('.').filter(|s| !s.is_empty()) {
            let mut parts = segment.split('[');
            let key = parts.next().unwrap_or_default();
            if !key.is_empty() {
                match node.get(key) {
                    Some(next) => node = next,
                    None => return (node, false),
                }
            }
            for index in parts {
                let index = index.trim_end_matches(']').parse::<usize>().ok();
                match index.and_then(|i| node.index(i)) {
                    Some(next) => node = next,
                    None => return (node, false),
                }
            }
        }
        (node, true)
    }

    /// The node at `path`, if it is there.
    pub fn find(&self, path: &str) -> Option<&Node> {
        match self.deepest(path) {
            (node, true) => Some(node),
            _ => None,
        }
    }

    /// The line `path` was written on, else the line of its deepest written
    /// parent, else 1 (`lines` is of the text this tree was parsed from).
    pub fn line(&self, lines: &Lines, path: &str) -> usize {
        lines.of(self.deepest(path).0).unwrap_or(1)
    }

    /// Every node at `path` (dotted keys), a segment naming an array
    /// standing for each of its elements (`pool.window_ms` visits
    /// `pool[0].window_ms`, `pool[1].window_ms`, …), with the concrete path
    /// of each, in document order.
    pub fn each(&self, path: &str) -> Vec<(String, &Node)> {
        let mut found = Vec::new();
        self.visit(path, String::new(), &mut found);
        found
    }

    fn visit<'a>(&'a self, path: &str, shown: String, found: &mut Vec<(String, &'a Node)>) {
        if let Value::Array(items) = &self.value {
            if !path.is_empty() {
                for (i, item) in items.iter().enumerate() {
                    item.visit(path, format!("{shown}[{i}]"), found);
                }
                return;
            }
        }
        let Some((key, rest)) = split_first(path) else {
            found.push((shown, self));
            return;
        };
        if let Some(next) = self.get(key) {
            let shown = if shown.is_empty() {
                key.to_string()
            } else {
                format!("{shown}.{key}")
            };
            next.visit(rest, shown, found);
        }
    }
}

fn split_first(path: &str) -> Option<(&str, &str)> {
    if path.is_empty() {
        return None;
    }
    Some(path.split_once('.').unwrap_or((path, "")))
}

/// Maps byte offsets of one text to 1-based line numbers.
#[derive(Debug, Clone)]
pub struct Lines {
    newlines: Vec<usize>,
}

impl Lines {
    pub fn new(text: &str) -> Lines {
        let newlines = text
            .bytes()
            .enumerate()
            .filter(|&(_, b)| b == b'\n')
            .map(|(i, _)| i)
            .collect();
        Lines { newlines }
    }

    /// The line holding byte `offset` (past the end: the last line).
    pub fn line(&self, offset: usize) -> usize {
        self.newlines.partition_point(|&newline| newline < offset) + 1
    }

    /// The line a node starts on, if it has any spanned part.
    pub fn of(&self, node: &Node) -> Option<usize> {
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

    /// TOML integers are i64: a larger one cannot come from the parser.
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
    let mut key = first;
    if key.is_none() {
        key = map.next_key::<String>()?;
    }
    while let Some(name) = key {
        if name == DATETIME_KEY {
            map.next_value::<de::IgnoredAny>()?;
            return Ok(Value::Datetime);
        }
        let value = map.next_value::<Node>()?;
        entries.insert(name, value);
        key = map.next_key::<String>()?;
    }
    Ok(Value::Table(entries))
}

struct NodeVisitor;

/// A node the parser gave no span for.
fn bare<E>(value: Result<Value, E>) -> Result<Node, E> {
    value.map(|value| Node { span: None, value })
}

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a TOML value")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Node, E> {
        bare(ValueVisitor.visit_str(v))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Node, E> {
        bare(ValueVisitor.visit_string(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Node, E> {
        bare(ValueVisitor.visit_i64(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Node, E> {
        bare(ValueVisitor.visit_u64(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Node, E> {
        bare(ValueVisitor.visit_f64(v))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Node, E> {
        bare(ValueVisitor.visit_bool(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Node, A::Error> {
        bare(ValueVisitor.visit_seq(seq))
    }

    /// Either the spanned protocol (start, end, value) or, for a value the
    /// parser has no span for, the table itself.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let Some(first) = map.next_key::<String>()? else {
            return bare(Ok(Value::Table(BTreeMap::new())));
        };
        if first != SPANNED_START {
            return bare(table_entries(map, Some(first)));
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
    use proptest::prelude::*;

    fn table(node: &Node) -> &BTreeMap<String, Node> {
        match &node.value {
            Value::Table(entries) => entries,
            other => panic!("not a table: {other:?}"),
        }
    }

    #[test]
    fn every_value_knows_its_line_even_under_implicit_tables() {
        let text = "version = 1\n[a.b.c]\nx = 2\n[d]\ny = { z = [1, 2.5] }\n";
        let root = Node::parse(text).unwrap();
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
    fn tree_places_implicit_tables_at_their_first_value() {
        let text = "version = 1\n[a.b.c]\nx = 2\n[d]\ny = { z = [1, 2.5] }\nwhen = 1979-05-27\n";
        let tree = Node::parse(text).unwrap();
        let lines = Lines::new(text);
        assert_eq!(tree.find("a").unwrap().span, None);
        assert_eq!(tree.line(&lines, "a"), 2);
        assert_eq!(tree.line(&lines, "a.b.c.x"), 3);
        assert_eq!(tree.line(&lines, "d.y.z[1]"), 5);
        assert_eq!(tree.line(&lines, "d.nothing"), 4);
        assert_eq!(tree.line(&lines, "nothing"), 1);
        assert_eq!(tree.find("d.when").unwrap().value, Value::Datetime);
        assert_eq!(tree.find("a.b.c.x").unwrap().value, Value::Integer(2));
        assert_eq!(tree.find("d.y.z[1]").unwrap().value, Value::Float(2.5));
        assert_eq!(tree.find("d.y.z[2]"), None);
    }

    #[test]
    fn every_kind_of_value_is_kept() {
        let text = "s = \"x\"\ni = -3\nf = 0.5\nb = true\nt = 07:32:00\na = []\n[e]\n";
        let tree = Node::parse(text).unwrap();
        assert_eq!(tree.find("s").unwrap().value, Value::String("x".into()));
        assert_eq!(tree.find("i").unwrap().value, Value::Integer(-3));
        assert_eq!(tree.find("f").unwrap().value, Value::Float(0.5));
        assert_eq!(tree.find("b").unwrap().value, Value::Boolean(true));
        assert_eq!(tree.find("t").unwrap().value, Value::Datetime);
        assert_eq!(tree.find("a").unwrap().value, Value::Array(Vec::new()));
        assert_eq!(tree.find("e").unwrap().value, Value::Table(BTreeMap::new()));
        assert_eq!(tree.find("s").unwrap().span, Some(4..7));
    }

    #[test]
    fn dates_become_a_datetime_value_not_a_string() {
        let root = Node::parse("when = 1979-05-27T07:32:00Z\n").unwrap();
        assert_eq!(table(&root)["when"].value, Value::Datetime);
    }

    #[test]
    fn each_visits_every_element_of_an_array_of_tables() {
        let text = "[[pool]]\nw = 1\n[[pool]]\nx = 2\n[[pool]]\nw = 3\n[g]\nw = 4\n";
        let tree = Node::parse(text).unwrap();
        let lines = Lines::new(text);
        let found: Vec<(String, Option<usize>)> = tree
            .each("pool.w")
            .into_iter()
            .map(|(path, node)| (path, lines.of(node)))
            .collect();
        assert_eq!(
            found,
            vec![
                ("pool[0].w".to_string(), Some(2)),
                ("pool[2].w".to_string(), Some(6)),
            ]
        );
        let root: Vec<String> = tree.each("").into_iter().map(|(p, _)| p).collect();
        assert_eq!(root, vec![String::new()]);
        assert!(tree.each("g.w.deeper").is_empty());
        assert_eq!(tree.each("g.w")[0].0, "g.w");
    }

    #[test]
    fn syntax_errors_stay_toml_errors() {
        let error = Node::parse("a = 1\nb = = 2\n").unwrap_err();
        let lines = Lines::new("a = 1\nb = = 2\n");
        assert_eq!(error.span().map(|span| lines.line(span.start)), Some(2));
    }

    #[test]
    fn line_of_an_offset_counts_preceding_newlines() {
        let lines = Lines::new("a\nbc\n\nd");
        assert_eq!(lines.line(0), 1);
        assert_eq!(lines.line(1), 1);
        assert_eq!(lines.line(2), 2);
        assert_eq!(lines.line(5), 3);
        assert_eq!(lines.line(6), 4);
        assert_eq!(lines.line(100), 4);
    }

    proptest! {
        #[test]
        fn line_agrees_with_counting_newlines(
            text in "(\n|\r\n|[^\n]){0,200}",
            offset in 0usize..400,
        ) {
            let counted = text.as_bytes()[..offset.min(text.len())]
                .iter()
                .filter(|&&b| b == b'\n')
                .count()
                + 1;
            prop_assert_eq!(Lines::new(&text).line(offset), counted);
        }
    }
}
