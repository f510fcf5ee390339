//! A YAML document as a tree whose every node knows its line, so a config
//! error names `file:line` (yaml-rust2's event parser; serde's YAML crates
//! lose positions once a value is read).
//!
//! Bounds: at most [`MAX_NODES`] nodes (aliases count every node they
//! expand to, so an alias bomb is refused), at most [`MAX_DEPTH`] levels.
//! Only the first document of a stream is read (as upstream's yaml.v2).

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// Cap on nodes in one document (aliases expanded).
pub const MAX_NODES: usize = 200_000;
/// Cap on nesting (maps and sequences).
pub const MAX_DEPTH: usize = 64;

/// One YAML node and the line (1-based) it starts on.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub line: usize,
    pub kind: Kind,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// A scalar's text; `quoted` when written in quotes (never a null or a
    /// number then).
    Scalar {
        text: String,
        quoted: bool,
    },
    Seq(Vec<Node>),
    /// Entries in document order (duplicates kept: the reader decides).
    Map(Vec<(Node, Node)>),
}

impl Node {
    /// A plain scalar that YAML reads as null (`~`, `null`, empty).
    pub fn is_null(&self) -> bool {
        matches!(&self.kind, Kind::Scalar { text, quoted: false }
            if text.is_empty() || text == "~" || text.eq_ignore_ascii_case("null"))
    }

    pub fn scalar(&self) -> Option<&str> {
        match &self.kind {
            Kind::Scalar { text, .. } => Some(text),
            _ => None,
        }
    }
}

/// Why a document could not be read: the line and the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct YamlError {
    pub line: usize,
    pub message: String,
}

/// Parses the first document of `text`; `Ok(None)` for an empty stream.
pub fn parse(text: &str) -> Result<Option<Node>, YamlError> {
    let mut builder = Builder::default();
    let mut parser = Parser::new_from_str(text);
    parser.load(&mut builder, false).map_err(|e| YamlError {
        line: e.marker().line(),
        message: e.info().to_string(),
    })?;
    if let Some(error) = builder.error {
        return Err(error);
    }
    Ok(builder.document)
}

/// A node being built: its line, and the children read so far.
enum Open {
    Seq(usize, Vec<Node>, usize),
    /// Entries, and a key read whose value is still to come.
    Map(usize, Vec<(Node, Node)>, Option<Node>, usize),
}

#[derive(Default)]
struct Builder {
    stack: Vec<Open>,
    anchors: HashMap<usize, Node>,
    document: Option<Node>,
    done: bool,
    nodes: usize,
    error: Option<YamlError>,
}

impl Builder {
    fn fail(&mut self, line: usize, message: impl Into<String>) {
        if self.error.is_none() {
            self.error = Some(YamlError {
                line,
                message: message.into(),
            });
        }
    }

    fn count(&mut self, node: &Node, line: usize) -> bool {
        self.nodes = self.nodes.saturating_add(node_count(node));
        if self.nodes > MAX_NODES {
            self.fail(line, format!("more than {MAX_NODES} YAML nodes"));
            return false;
        }
        true
    }

    /// Hands a finished node to its parent (or makes it the document).
    fn finish(&mut self, node: Node, anchor: usize) {
        if anchor > 0 {
            self.anchors.insert(anchor, node.clone());
        }
        match self.stack.last_mut() {
            None => {
                self.document = Some(node);
                self.done = true;
            }
            Some(Open::Seq(_, items, _)) => items.push(node),
            Some(Open::Map(_, entries, key, _)) => match key.take() {
                None => *key = Some(node),
                Some(k) => entries.push((k, node)),
            },
        }
    }
}

fn node_count(node: &Node) -> usize {
    match &node.kind {
        Kind::Scalar { .. } => 1,
        Kind::Seq(items) => 1 + items.iter().map(node_count).sum::<usize>(),
        Kind::Map(entries) => {
            1 + entries
                .iter()
                .map(|(k, v)| node_count(k) + node_count(v))
                .sum::<usize>()
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, event: Event, mark: Marker) {
        if self.done || self.error.is_some() {
            return;
        }
        let line = mark.line();
        match event {
            Event::Scalar(text, style, anchor, _tag) => {
                let node = Node {
                    line,
                    kind: Kind::Scalar {
                        text,
                        quoted: !matches!(style, TScalarStyle::Plain),
                    },
                };
                if self.count(&node, line) {
                    self.finish(node, anchor);
                }
            }
            Event::Alias(id) => match self.anchors.get(&id).cloned() {
                Some(node) => {
                    if self.count(&node, line) {
                        self.finish(node, 0);
                    }
                }
                None => self.fail(line, "alias to an unknown anchor"),
            },
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                if self.stack.len() >= MAX_DEPTH {
                    self.fail(line, format!("nested deeper than {MAX_DEPTH} levels"));
                    return;
                }
                self.nodes = self.nodes.saturating_add(1);
                let open = match event {
                    Event::SequenceStart(..) => Open::Seq(line, Vec::new(), anchor),
                    _ => Open::Map(line, Vec::new(), None, anchor),
                };
                self.stack.push(open);
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let (node, anchor) = match self.stack.pop() {
                    Some(Open::Seq(line, items, anchor)) => (
                        Node {
                            line,
                            kind: Kind::Seq(items),
                        },
                        anchor,
                    ),
                    Some(Open::Map(line, entries, _, anchor)) => (
                        Node {
                            line,
                            kind: Kind::Map(entries),
                        },
                        anchor,
                    ),
                    None => return,
                };
                self.finish(node, anchor);
            }
            Event::Nothing
            | Event::StreamStart
            | Event::StreamEnd
            | Event::DocumentStart
            | Event::DocumentEnd => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(node: &Node) -> &[(Node, Node)] {
        match &node.kind {
            Kind::Map(entries) => entries,
            other => panic!("not a map: {other:?}"),
        }
    }

    #[test]
    fn nodes_know_their_lines() {
        let doc = parse("domain: d\ndescriptors:\n  - key: a\n    value: \"1\"\n")
            .unwrap()
            .unwrap();
        let entries = map(&doc);
        assert_eq!(entries[0].0.scalar(), Some("domain"));
        assert_eq!(entries[0].0.line, 1);
        let Kind::Seq(items) = &entries[1].1.kind else {
            panic!()
        };
        let first = map(&items[0]);
        assert_eq!(first[0].1.scalar(), Some("a"));
        assert_eq!(first[0].1.line, 3);
        assert_eq!(first[1].1.line, 4);
        assert_eq!(
            first[1].1.kind,
            Kind::Scalar {
                text: "1".into(),
                quoted: true
            }
        );
    }

    #[test]
    fn a_syntax_error_names_its_line() {
        let error = parse("domain: d\ndescriptors:\n  - key: [a\n").unwrap_err();
        assert!(error.line >= 3, "{error:?}");
    }

    #[test]
    fn an_empty_stream_is_no_document_and_null_is_recognised() {
        assert_eq!(parse("").unwrap(), None);
        let doc = parse("a: ~\nb:\nc: 'null'\n").unwrap().unwrap();
        let entries = map(&doc);
        assert!(entries[0].1.is_null() && entries[1].1.is_null());
        assert!(!entries[2].1.is_null());
    }

    #[test]
    fn aliases_expand_and_an_alias_bomb_is_refused() {
        let doc = parse("a: &x {k: v}\nb: *x\n").unwrap().unwrap();
        // The alias is the anchored node itself (its lines included).
        assert_eq!(map(&doc)[0].1, map(&doc)[1].1);
        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..8 {
            let prev = i - 1;
            bomb.push_str(&format!(
                "a{i}: &a{i} [*a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}]\n"
            ));
        }
        let error = parse(&bomb).unwrap_err();
        assert!(error.message.contains("YAML nodes"), "{error:?}");
    }

    #[test]
    fn deep_nesting_is_refused() {
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        let error = parse(&deep).unwrap_err();
        assert!(error.message.contains("nested deeper"), "{error:?}");
    }
}
