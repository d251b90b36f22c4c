//! Hostile request input through the real binary: repeated JSON keys,
//! huge listings, secrets outside file content, and errors that must say
//! what is really wrong (issue 16, holes 9 to 12).

use serde_json::{Value, json};

use crate::util::{TestVault, is_error, run_with_stdin, text};

fn serve_raw(t: &TestVault, lines: &[&str]) -> Vec<Value> {
    t.serve(&lines.iter().map(|l| l.to_string()).collect::<Vec<_>>())
}

#[test]
fn duplicate_command_key_is_refused() {
    let t = TestVault::new();
    t.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "keep me\n"}));
    let out = serve_raw(
        &t,
        &[
            r#"{"command":"view","command":"delete","path":"/memories/a.md"}"#,
            r#"{"command":"view","path":"/memories/a.md"}"#,
        ],
    );
    assert!(is_error(&out[0]), "{}", out[0]);
    assert!(
        text(&out[0]).contains("gives the key `command` twice"),
        "{}",
        out[0]
    );
    assert!(text(&out[1]).contains("keep me"), "{}", out[1]);
}

#[test]
fn duplicate_tool_use_input_is_refused() {
    let t = TestVault::new();
    t.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "keep me\n"}));
    let out = serve_raw(
        &t,
        &[
            r#"{"type":"tool_use","id":"toolu_1","name":"memory","input":{"command":"view","path":"/memories"},"input":{"command":"delete","path":"/memories/a.md"}}"#,
            r#"{"command":"view","path":"/memories/a.md"}"#,
        ],
    );
    assert!(is_error(&out[0]), "{}", out[0]);
    assert!(
        text(&out[0]).contains("the key `input` twice"),
        "{}",
        out[0]
    );
    assert!(text(&out[1]).contains("keep me"), "{}", out[1]);
}

#[test]
fn duplicate_nested_key_is_refused_and_unknown_keys_are_not_echoed() {
    let t = TestVault::new();
    let out = serve_raw(
        &t,
        &[
            r#"{"type":"tool_use","id":"toolu_1","name":"memory","input":{"command":"create","path":"/memories/a","file_text":"x","path":"/memories/b"}}"#,
            r#"{"command":"create","path":"/memories/c","file_text":"x","extra":{"ghp_s3cr3tkey":1,"ghp_s3cr3tkey":2}}"#,
            r#"{"command":"view","path":"/memories"}"#,
        ],
    );
    assert!(text(&out[0]).contains("the key `path` twice"), "{}", out[0]);
    assert!(is_error(&out[1]), "{}", out[1]);
    assert!(text(&out[1]).contains("gives a key twice"), "{}", out[1]);
    assert!(!text(&out[1]).contains("ghp_"), "{}", out[1]);
    let listing = text(&out[2]);
    assert!(!listing.contains("/memories/a") && !listing.contains("/memories/b"));
    assert!(!listing.contains("/memories/c"), "{listing}");
}

#[test]
fn duplicate_key_is_refused_by_exec() {
    let t = TestVault::new();
    t.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "keep me\n"}));
    let out = t
        .cmd()
        .arg("exec")
        .arg(r#"{"command":"view","command":"delete","path":"/memories/a.md"}"#)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("twice"));
    let v = t.one(json!({"command": "view", "path": "/memories/a.md"}));
    assert!(text(&v).contains("keep me"), "{v}");
    let _ = run_with_stdin;
}
