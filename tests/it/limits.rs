//! Every limit through the real binary, each set with `memvault config
//! set` (or fixed, for paths): refused before any work, with a sentence
//! that names the limit, and no commit made.

use serde_json::{Value, json};

use crate::util::*;

pub fn with_config(v: &TestVault, key: &str, value: Value) {
    let out = v
        .cmd()
        .args(["config", "set", key, &value.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "config set {key}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn create(path: &str, text: &str) -> Value {
    json!({"command": "create", "path": path, "file_text": text})
}

#[test]
fn max_file_bytes_refuses_a_larger_file() {
    let v = TestVault::new();
    with_config(&v, "max_file_bytes", json!(100));
    let ok = v.one(create("/memories/ok.md", &format!("{}Z", "a".repeat(99))));
    assert!(!is_error(&ok), "{ok}");
    let commits = v.commits();
    let out = v.serve(&[
        create("/memories/big.md", &"a".repeat(101)).to_string(),
        json!({"command": "str_replace", "path": "/memories/ok.md", "old_str": "Z", "new_str": "ZZ"})
            .to_string(),
    ]);
    for o in &out {
        assert!(is_error(o), "{o}");
        assert!(text(o).contains("100"), "{o}");
    }
    assert_eq!(v.commits(), commits, "nothing was committed");
}

#[test]
fn max_line_bytes_refuses_a_longer_request_line() {
    let v = TestVault::new();
    with_config(&v, "max_line_bytes", json!(1024));
    let out = v.serve(&[
        create("/memories/long.md", &"x".repeat(2000)).to_string(),
        json!({"command": "view", "path": "/memories"}).to_string(),
    ]);
    assert_eq!(out.len(), 2, "the server answers the next line too");
    assert!(is_error(&out[0]));
    assert!(text(&out[0]).contains("limit of 1024 bytes"), "{}", out[0]);
    assert!(!is_error(&out[1]));
    assert_eq!(v.commits(), 2, "init and the config change only");
}

#[test]
fn max_view_chars_bounds_view_output() {
    let v = TestVault::new();
    let body: String = (0..400).map(|i| format!("line number {i:04}\n")).collect();
    assert!(!is_error(&v.one(create("/memories/long.md", &body))));
    with_config(&v, "max_view_chars", json!(1000));
    let r = v.one(json!({"command": "view", "path": "/memories/long.md"}));
    assert!(!is_error(&r), "{r}");
    let shown = text(&r);
    assert!(
        shown.chars().count() < 1300,
        "{} chars",
        shown.chars().count()
    );
    assert!(shown.contains("line number 0000"), "the head is kept");
    assert!(shown.contains("line number 0399"), "the tail is kept");
    assert!(
        !shown.contains("line number 0200"),
        "the middle is left out"
    );
}

#[test]
fn path_length_and_depth_are_bounded() {
    let v = TestVault::new();
    let long = format!("/memories/{}", vec!["a".repeat(100); 11].join("/"));
    assert!(long.len() > 1024);
    let deep = format!("/memories/{}/f.md", vec!["d"; 20].join("/"));
    let ok_deep = format!("/memories/{}/f.md", vec!["d"; 19].join("/"));
    let out = v.serve(&[
        create(&long, "x").to_string(),
        create(&deep, "x").to_string(),
        create(&ok_deep, "x").to_string(),
    ]);
    assert!(is_error(&out[0]));
    assert!(text(&out[0]).contains("at most 1024 bytes"), "{}", out[0]);
    assert!(is_error(&out[1]));
    assert!(text(&out[1]).contains("at most 20"), "{}", out[1]);
    assert!(!is_error(&out[2]), "{}", out[2]);
    assert_eq!(v.commits(), 2, "only the allowed path made a commit");
}

#[test]
fn max_files_refuses_one_more_file() {
    let v = TestVault::new();
    with_config(&v, "max_files", json!(3));
    let lines: Vec<String> = (0..4)
        .map(|i| create(&format!("/memories/f{i}.md"), "x").to_string())
        .collect();
    let out = v.serve(&lines);
    for o in &out[..3] {
        assert!(!is_error(o), "{o}");
    }
    assert!(is_error(&out[3]));
    assert!(text(&out[3]).contains("limit of 3 files"), "{}", out[3]);
    assert_eq!(v.commits(), 5, "init, the config change, three creates");
    // Overwriting an existing file is not a new file.
    let r = v.one(json!({"command": "str_replace", "path": "/memories/f0.md", "old_str": "x", "new_str": "y"}));
    assert!(!is_error(&r), "{r}");
}

/// One-shot commands, each a new process: the count of files the last
/// one left (`memvault/file-count`, tagged under the vault key) is what
/// the next create's limit check starts from, and only while it names the
/// tip's tree: an edit, a delete or a file made elsewhere keeps the check
/// right, and a count altered on disk is not believed (the tree is walked).
#[test]
fn max_files_holds_across_one_shot_commands_whatever_the_count_file_says() {
    let v = TestVault::new();
    with_config(&v, "max_files", json!(3));
    for i in 0..3 {
        let r = v.one(create(&format!("/memories/f{i}.md"), "x"));
        assert!(!is_error(&r), "{r}");
    }
    let file = v.vault.join("memvault/file-count");
    let saved = std::fs::read_to_string(&file).unwrap();
    let tree = String::from_utf8(git(&v.vault, &["rev-parse", "main^{tree}"]).stdout).unwrap();
    assert!(
        saved.starts_with(&format!("v1 {} 3 ", tree.trim())),
        "{saved}"
    );
    let r = v.one(create("/memories/f3.md", "x"));
    assert!(text(&r).contains("limit of 3 files"), "{r}");
    // An edit keeps the count; a delete makes room for exactly one.
    let r = v.one(json!({"command": "str_replace", "path": "/memories/f0.md", "old_str": "x", "new_str": "y"}));
    assert!(!is_error(&r), "{r}");
    let r = v.one(json!({"command": "delete", "path": "/memories/f1.md"}));
    assert!(!is_error(&r), "{r}");
    let r = v.one(create("/memories/f4.md", "x"));
    assert!(!is_error(&r), "{r}");
    let r = v.one(create("/memories/f5.md", "x"));
    assert!(text(&r).contains("limit of 3 files"), "{r}");
    // A count lowered on disk (its tag then fails) lets no file more in.
    let saved = std::fs::read_to_string(&file).unwrap();
    let parts: Vec<&str> = saved.split_whitespace().collect();
    assert_eq!(parts[2], "3", "{saved}");
    std::fs::write(&file, format!("v1 {} 0 {}\n", parts[1], parts[3])).unwrap();
    let r = v.one(create("/memories/f6.md", "x"));
    assert!(text(&r).contains("limit of 3 files"), "{r}");
    // Nor does an older file whose tag checks out, for an older tree.
    let r = v.one(json!({"command": "delete", "path": "/memories/f4.md"}));
    assert!(!is_error(&r), "{r}");
    std::fs::write(&file, &saved).unwrap();
    let r = v.one(create("/memories/f7.md", "x"));
    assert!(!is_error(&r), "{r}");
    let r = v.one(create("/memories/f8.md", "x"));
    assert!(text(&r).contains("limit of 3 files"), "{r}");
}

#[test]
fn limits_below_their_minimum_are_refused_when_set() {
    let v = TestVault::new();
    for (key, value) in [
        ("max_file_bytes", json!(0)),
        ("max_line_bytes", json!(10)),
        ("max_view_chars", json!(10)),
        ("max_files", json!(0)),
    ] {
        let commits = v.commits();
        let out = v
            .cmd()
            .args(["config", "set", key, &value.to_string()])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{key}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(key),
            "{key}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(v.commits(), commits, "{key}: nothing is committed");
    }
}
