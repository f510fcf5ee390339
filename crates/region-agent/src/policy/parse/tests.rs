//! Tests of `parse.rs`, kept beside it so the code reads on its own.

use super::*;

#[test]
fn a_long_unknown_key_is_quoted_in_every_error() {
    let key = "k".repeat(65_536);
    let text = format!(
        "version = 1\n{key} = 1\n[[domain]]\nname = \"api\"\n{key} = 2\n\
             [[domain.rule]]\nid = \"r\"\n{key} = 3\n"
    );
    let errors = parse("t.toml", &text, None).unwrap_err();
    let unknown: Vec<String> = errors
        .errors()
        .iter()
        .filter(|e| e.problem == Problem::UnknownField)
        .map(PolicyError::to_string)
        .collect();
    assert_eq!(unknown.len(), 3, "{errors}");
    for message in unknown {
        assert!(message.contains("… (65536 bytes)"), "{message}");
    }
    assert!(errors.to_string().len() < 1_000, "{errors}");
}
