//! Hostile paths through the real binary: refused with the rule named,
//! and nothing is read, created or changed.

use serde_json::json;

use crate::util::*;

const HOSTILE: &[&str] = &[
    "/memories/../etc/passwd",
    "/memories/a/../../x",
    "/memories/./a",
    "/memories//a",
    "/memories\\a",
    "/memories/a\\..\\b",
    "/memories/%2e%2e/x",
    "/memories/%2E%2e/x",
    "/memories/%252e%252e/x",
    "/memories/a%2fb",
    "/memories/a%5cb",
    "/memoriesX/a",
    "/memories-evil/a",
    "memories/a",
    "/etc/passwd",
    "",
    "/memories/a\u{0}b",
    "/memories/a\nb",
    "/memories/\u{202e}txt.exe",
    "/memories/zero\u{200b}width",
    "/memories/line\u{2028}sep",
    "/memories/e\u{301}",
    "/memories/\u{3164}",
    "/memories/notes\u{fe0f}.md",
    "/memories/\u{2800}",
    "/memories/a\u{2215}..\u{2215}b",
    "/memories/\u{2025}/x",
    "/memories/ ",
    "/memories/keep.txt ",
    "/memories/\u{301}x",
];

#[test]
fn hostile_paths_are_refused_and_change_nothing() {
    let v = TestVault::new();
    v.one(json!({"command": "create", "path": "/memories/keep.txt", "file_text": "keep\n"}));
    let before_listing = v.one(json!({"command": "view", "path": "/memories"}));
    let commits = v.commits();
    let mut lines = Vec::new();
    for p in HOSTILE {
        lines.push(json!({"command": "view", "path": p}).to_string());
        lines.push(json!({"command": "create", "path": p, "file_text": "x"}).to_string());
        lines.push(
            json!({"command": "str_replace", "path": p, "old_str": "keep", "new_str": "y"})
                .to_string(),
        );
        lines.push(
            json!({"command": "insert", "path": p, "insert_line": 0, "insert_text": "x"})
                .to_string(),
        );
        lines.push(json!({"command": "delete", "path": p}).to_string());
        lines.push(
            json!({"command": "rename", "old_path": "/memories/keep.txt", "new_path": p})
                .to_string(),
        );
        lines.push(
            json!({"command": "rename", "old_path": p, "new_path": "/memories/stolen.txt"})
                .to_string(),
        );
    }
    let out = v.serve(&lines);
    assert_eq!(out.len(), lines.len());
    for (o, l) in out.iter().zip(&lines) {
        assert!(is_error(o), "{l} -> {o}");
        let t = text(o);
        assert!(!t.contains("keep\n"), "content leaked for {l}");
        assert!(
            t.contains("not allowed") || t.contains("must") || t.contains("path"),
            "the message should name the path rule: {t}"
        );
    }
    assert_eq!(v.commits(), commits, "no hostile path made a commit");
    let after_listing = v.one(json!({"command": "view", "path": "/memories"}));
    assert_eq!(before_listing, after_listing);
}
