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

/// Names an older memvault stored before the look-alike rules (a space at
/// a name's edge, a Hangul filler, an emoji's variation selector) stay
/// readable: listed, `verify` passes, their folder can be deleted, and an
/// operator can name them to `history`, `show` and `purge`. Only an agent
/// cannot make or name them.
#[test]
fn names_stored_before_the_look_alike_rules_stay_usable() {
    use memvault::memory::store::{Change, ChangeFacts, Mutation, Op, Outcome, Store};
    use memvault::memory::{MemoryPath, ToolResult};
    let v = TestVault::new();
    let old = [
        "/memories/d/trailing.md ",
        "/memories/d/\u{3164}",
        "/memories/d/a\u{fe0f}.md",
        "/memories/e /x.md",
    ];
    {
        // As an older memvault wrote them: straight through the store.
        let mut vault = v.open_library("old");
        for p in old {
            let path = MemoryPath::parse_stored(p).unwrap();
            assert!(MemoryPath::parse(p).is_err(), "{p:?} is not refused");
            vault
                .write(&mut |_| {
                    Ok(Outcome {
                        result: ToolResult::ok("ok".to_string()),
                        mutation: Some(Mutation {
                            op: Op::Create,
                            change: Change::Write {
                                path: path.clone(),
                                content: zeroize::Zeroizing::new(b"old\n".to_vec()),
                            },
                            facts: ChangeFacts::default(),
                        }),
                    })
                })
                .unwrap();
        }
    }
    let listed = v.one(json!({"command": "view", "path": "/memories"}));
    let listing = text(&listed);
    for p in old {
        let name = p.rsplit('/').next().unwrap();
        assert!(listing.contains(name), "{p:?} not listed: {listing}");
    }
    let ok = |args: &[&str]| {
        let o = v.cmd().args(args).output().unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert!(ok(&["verify"]).starts_with("ok:"));
    ok(&["history", "/memories/d/trailing.md "]);
    assert!(ok(&["show", "HEAD", "/memories/e /x.md"]).contains("old"));
    ok(&["purge", "/memories/d/\u{3164}"]);
    // The agent cannot name them, but can delete and rename their folders.
    let r = v.one(json!({"command": "view", "path": "/memories/d/trailing.md "}));
    assert!(is_error(&r));
    let r =
        v.one(json!({"command": "rename", "old_path": "/memories/d", "new_path": "/memories/f"}));
    assert!(!is_error(&r), "{r}");
    let r = v.one(json!({"command": "delete", "path": "/memories/f"}));
    assert!(!is_error(&r), "{r}");
    assert!(ok(&["verify"]).starts_with("ok:"));
    let out = v.tmp.path().join("export");
    ok(&["export", out.to_str().unwrap()]);
    assert!(out.join("memories/e /x.md").exists());
}
