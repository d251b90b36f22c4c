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

fn pack_count(v: &TestVault) -> usize {
    std::fs::read_dir(v.vault.join("objects/pack"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().ends_with(".pack"))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn checkpoints_merge_small_packs_without_losing_anything() {
    // Each `serve` checkpoints its log on close, as one pack when it holds
    // more than a few objects. Past 8 packs, the smaller ones are merged.
    let v = TestVault::new();
    let mut most = 0;
    for s in 0..12 {
        let lines: Vec<String> = (0..20)
            .map(|i| json!({"command": "create", "path": format!("/memories/s{s}/n{i}.md"), "file_text": format!("session {s} note {i}\n")}).to_string())
            .collect();
        for o in v.serve(&lines) {
            assert!(!is_error(&o), "{o}");
        }
        most = most.max(pack_count(&v));
    }
    assert!(
        most >= 8,
        "the test must reach the merge threshold ({most})"
    );
    assert!(pack_count(&v) <= 8, "{} packs left", pack_count(&v));
    for s in 0..12 {
        for i in 0..20 {
            let o = v.one(json!({"command": "view", "path": format!("/memories/s{s}/n{i}.md")}));
            assert!(text(&o).contains(&format!("session {s} note {i}")), "{o}");
        }
    }
    let out = v.cmd().arg("verify").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    git(&v.vault, &["fsck", "--connectivity-only", "--no-dangling"]);
}

/// `serve` runs a due checkpoint after the reply, not inside the request:
/// the log shrinks while `serve` keeps running, and nothing is lost.
#[test]
fn serve_checkpoints_after_the_reply_while_it_keeps_running() {
    use std::io::{BufRead, BufReader, Write};
    let v = TestVault::new();
    let mut child = v
        .cmd()
        .args(["serve", "--session", "ckpt"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut ask = |cmd: serde_json::Value| {
        writeln!(stdin, "{cmd}").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        serde_json::from_str::<serde_json::Value>(&line).unwrap()
    };
    let body = |n: usize| -> String {
        (0..2500)
            .map(|l| format!("note {n} line {l} about the weather\n"))
            .collect()
    };
    let wal = v.vault.join("memvault/wal");
    let mut largest = 0;
    for n in 0..60 {
        let o = ask(
            json!({"command": "create", "path": format!("/memories/big/n{n}.md"), "file_text": body(n)}),
        );
        assert!(!is_error(&o), "{o}");
        // The reply of the next request comes after the previous
        // request's deferred checkpoint.
        let o =
            ask(json!({"command": "view", "path": "/memories/big/n0.md", "view_range": [1, 1]}));
        assert!(!is_error(&o), "{o}");
        largest = largest.max(std::fs::metadata(&wal).unwrap().len());
    }
    assert!(
        pack_count(&v) >= 1,
        "no checkpoint ran while serve was open"
    );
    let now = std::fs::metadata(&wal).unwrap().len();
    assert!(
        largest < (4 << 20) + (1 << 20),
        "the log grew to {largest} bytes"
    );
    assert!(now < largest, "the log never shrank ({now} bytes)");
    drop(stdin);
    assert!(child.wait().unwrap().success());
    for n in 0..60 {
        let o = v.one(json!({"command": "view", "path": format!("/memories/big/n{n}.md")}));
        assert!(
            text(&o).contains(&format!("note {n} line 2499 about")),
            "note {n}"
        );
    }
    let out = v.cmd().arg("verify").output().unwrap();
    assert!(out.status.success());
}
