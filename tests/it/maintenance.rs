//! `memvault gc`: one pack of what the two refs reach, nothing else kept,
//! nothing reachable lost.

use serde_json::json;

use crate::util::*;

fn count_lines(out: std::process::Output) -> usize {
    String::from_utf8(out.stdout).unwrap().lines().count()
}

#[test]
fn gc_keeps_everything_reachable_in_one_pack_and_drops_the_rest() {
    let v = TestVault::new();
    let mut lines = Vec::new();
    for i in 0..20 {
        lines.push(json!({"command": "create", "path": format!("/memories/d/n{i}.md"), "file_text": format!("note {i}\n")}).to_string());
    }
    for i in 0..10 {
        lines
            .push(json!({"command": "delete", "path": format!("/memories/d/n{i}.md")}).to_string());
    }
    for o in v.serve(&lines) {
        assert!(!is_error(&o), "{o}");
    }
    let commits = v.commits();
    let all_before = count_lines(git(
        &v.vault,
        &["cat-file", "--batch-all-objects", "--batch-check"],
    ));
    let reachable = count_lines(git(&v.vault, &["rev-list", "--objects", "--all"]));
    // Every create replaced the key table: old versions are unreachable.
    assert!(all_before > reachable, "{all_before} <= {reachable}");

    let out = v.cmd().arg("gc").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let packs: Vec<_> = std::fs::read_dir(v.vault.join("objects/pack"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".pack"))
        .collect();
    assert_eq!(packs.len(), 1);
    let loose = std::fs::read_dir(v.vault.join("objects"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().len() == 2)
        .count();
    assert_eq!(loose, 0, "loose object directories remain");
    let all_after = count_lines(git(
        &v.vault,
        &["cat-file", "--batch-all-objects", "--batch-check"],
    ));
    assert_eq!(all_after, reachable);
    assert_eq!(v.commits(), commits);
    git(&v.vault, &["fsck", "--connectivity-only", "--no-dangling"]);
    let view = v.one(json!({"command": "view", "path": "/memories/d/n15.md"}));
    assert!(text(&view).contains("note 15"), "{view}");
}
