//! Tampering with the repository from outside is detected and reported as
//! damage, never returned as content and never a crash.

use std::path::PathBuf;

use serde_json::{Value, json};

use crate::util::*;

const SECRET_TEXT: &str = "the quarterly numbers are 42\n";

fn vault_with_two_files() -> TestVault {
    let v = TestVault::new();
    let out = v.serve(&[
        json!({"command": "create", "path": "/memories/a.txt", "file_text": SECRET_TEXT})
            .to_string(),
        json!({"command": "create", "path": "/memories/b.txt", "file_text": "other file\n"})
            .to_string(),
    ]);
    assert!(out.iter().all(|o| !is_error(o)));
    // Loose objects to tamper with (a checkpoint writes a pack).
    unpack_all(&v);
    v
}

/// (mode, type, oid, git path) of the files at main (under their bucket
/// trees: `ls-tree -r`).
fn root_entries(v: &TestVault) -> Vec<(String, String, String, String)> {
    let out = git(&v.vault, &["ls-tree", "-r", "refs/heads/main"]).stdout;
    String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| {
            let (meta, name) = l.split_once('\t').unwrap();
            let parts: Vec<&str> = meta.split(' ').collect();
            (
                parts[0].into(),
                parts[1].into(),
                parts[2].into(),
                name.into(),
            )
        })
        .collect()
}

fn object_file(v: &TestVault, oid: &str) -> PathBuf {
    v.vault.join("objects").join(&oid[..2]).join(&oid[2..])
}

/// Write `raw` as a commit object (as an attacker with write access could)
/// and point main at it.
fn replace_tip_commit(v: &TestVault, raw: &str) {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("c");
    std::fs::write(&f, raw).unwrap();
    let args = [
        "hash-object",
        "-t",
        "commit",
        "-w",
        "--literally",
        f.to_str().unwrap(),
    ];
    let oid = String::from_utf8(git(&v.vault, &args).stdout).unwrap();
    git(&v.vault, &["update-ref", "refs/heads/main", oid.trim()]);
}

fn assert_damaged(out: &Value) {
    assert!(is_error(out), "expected an error: {out}");
    let t = text(out);
    assert!(
        t.contains("damaged"),
        "should say the vault is damaged: {t}"
    );
    assert!(!t.contains("quarterly"), "content leaked: {t}");
}

fn view_both(v: &TestVault) -> Vec<Value> {
    v.serve(&[
        json!({"command": "view", "path": "/memories/a.txt"}).to_string(),
        json!({"command": "view", "path": "/memories/b.txt"}).to_string(),
        json!({"command": "view", "path": "/memories"}).to_string(),
    ])
}

#[test]
fn flipped_byte_in_a_stored_blob_is_damage() {
    let v = vault_with_two_files();
    let before = view_both(&v);
    assert!(!is_error(&before[0]));
    let (_, _, oid, _) = root_entries(&v).into_iter().next().unwrap();
    let path = object_file(&v, &oid);
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    let out = view_both(&v);
    // Whichever file the blob was, one of the two views fails as damage and
    // the listing (which reads sizes from that blob) does too.
    let failed: Vec<&Value> = out.iter().filter(|o| is_error(o)).collect();
    assert!(!failed.is_empty(), "{out:?}");
    for f in failed {
        assert_damaged(f);
    }
}

#[test]
fn truncated_blob_is_damage() {
    let v = vault_with_two_files();
    for (_, _, oid, _) in root_entries(&v) {
        let path = object_file(&v, &oid);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 7]).unwrap();
    }
    let out = view_both(&v);
    // Both file views fail as damage (the listing reads only object
    // headers, which survive a cut at the end, and shows no content).
    assert_damaged(&out[0]);
    assert_damaged(&out[1]);
}

#[test]
fn blob_moved_to_another_path_is_damage() {
    let v = vault_with_two_files();
    let entries = root_entries(&v);
    assert_eq!(entries.len(), 2);
    // Swap the two blobs between the two names, as an attacker with write
    // access to the repository could.
    let tree = tree_with(
        &v,
        &[
            (&entries[0].3, &entries[1].2),
            (&entries[1].3, &entries[0].2),
        ],
    );
    let commit = git(
        &v.vault,
        &["commit-tree", &tree, "-p", "refs/heads/main", "-m", "swap"],
    )
    .stdout;
    let commit = String::from_utf8(commit).unwrap().trim().to_string();
    git(&v.vault, &["update-ref", "refs/heads/main", &commit]);
    for o in &view_both(&v) {
        assert_damaged(o);
    }
    // Nothing can be written on top of a damaged tip either.
    let w = v.one(json!({"command": "create", "path": "/memories/c.txt", "file_text": "x"}));
    assert_damaged(&w);
}

#[test]
fn altered_commit_is_damage() {
    let v = vault_with_two_files();
    let raw = git(&v.vault, &["cat-file", "commit", "refs/heads/main"]).stdout;
    let mut raw = String::from_utf8(raw).unwrap();
    // Change one character of the encrypted message.
    let pos = raw.rfind("\n\n").unwrap() + 5;
    let c = raw.as_bytes()[pos];
    let replacement = if c == b'A' { "B" } else { "A" };
    raw.replace_range(pos..pos + 1, replacement);
    replace_tip_commit(&v, &raw);
    for o in &view_both(&v) {
        assert_damaged(o);
    }
}

#[test]
fn commit_without_the_vault_mac_is_damage() {
    let v = vault_with_two_files();
    let raw = git(&v.vault, &["cat-file", "commit", "refs/heads/main"]).stdout;
    let raw = String::from_utf8(raw).unwrap();
    let stripped: String = raw
        .split_inclusive('\n')
        .filter(|l| !l.starts_with("mvmac "))
        .collect();
    assert_ne!(stripped, raw);
    replace_tip_commit(&v, &stripped);
    for o in &view_both(&v) {
        assert_damaged(o);
    }
}

#[test]
fn missing_key_state_refuses_to_open() {
    let v = vault_with_two_files();
    git(&v.vault, &["update-ref", "-d", "refs/memvault/keys"]);
    let out = v
        .cmd()
        .args(["exec", r#"{"command":"view","path":"/memories"}"#])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("damaged"), "{err}");
}

/// `memvault verify` on the vault: (exit code, stdout).
fn verify(v: &TestVault) -> (Option<i32>, String) {
    let out = v.cmd().arg("verify").output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn flip_middle_byte(v: &TestVault, oid: &str) {
    let path = object_file(v, oid);
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
}

/// The tree of main with the blobs at some git paths replaced, written by
/// git itself (through a scratch index).
fn tree_with(v: &TestVault, set: &[(&str, &str)]) -> String {
    let index = v.vault.join("scratch-index");
    let git_ix = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .arg("--git-dir")
            .arg(&v.vault)
            .args(args)
            .env("GIT_INDEX_FILE", &index)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    git_ix(&["read-tree", "refs/heads/main"]);
    for (path, oid) in set {
        git_ix(&[
            "update-index",
            "--cacheinfo",
            &format!("100644,{oid},{path}"),
        ]);
    }
    let tree = git_ix(&["write-tree"]);
    std::fs::remove_file(&index).unwrap();
    tree
}

fn swap_blobs(v: &TestVault) {
    let e = root_entries(v);
    let tree = tree_with(v, &[(&e[0].3, &e[1].2), (&e[1].3, &e[0].2)]);
    let commit = git(
        &v.vault,
        &["commit-tree", &tree, "-p", "refs/heads/main", "-m", "swap"],
    )
    .stdout;
    let commit = String::from_utf8(commit).unwrap().trim().to_string();
    git(&v.vault, &["update-ref", "refs/heads/main", &commit]);
}

#[test]
fn verify_passes_a_healthy_vault_and_reports_each_kind_of_damage() {
    type Damage = fn(&TestVault);
    let cases: Vec<(&str, Damage, &str)> = vec![
        (
            "flipped blob",
            |v| flip_middle_byte(v, &root_entries(v)[0].2),
            "/memories/",
        ),
        (
            "truncated blob",
            |v| {
                let path = object_file(v, &root_entries(v)[0].2);
                let bytes = std::fs::read(&path).unwrap();
                std::fs::write(&path, &bytes[..bytes.len() - 7]).unwrap();
            },
            "truncated",
        ),
        ("blobs swapped between paths", swap_blobs, "does not open"),
        (
            "altered commit",
            |v| {
                let raw = git(&v.vault, &["cat-file", "commit", "refs/heads/main"]).stdout;
                let mut raw = String::from_utf8(raw).unwrap();
                let pos = raw.rfind("\n\n").unwrap() + 5;
                let c = raw.as_bytes()[pos];
                raw.replace_range(pos..pos + 1, if c == b'A' { "B" } else { "A" });
                replace_tip_commit(v, &raw);
            },
            "MAC",
        ),
        (
            "MAC removed",
            |v| {
                let raw = git(&v.vault, &["cat-file", "commit", "refs/heads/main"]).stdout;
                let raw: String = String::from_utf8(raw)
                    .unwrap()
                    .split_inclusive('\n')
                    .filter(|l| !l.starts_with("mvmac "))
                    .collect();
                replace_tip_commit(v, &raw);
            },
            "MAC",
        ),
        (
            "key ref deleted",
            |v| {
                git(&v.vault, &["update-ref", "-d", "refs/memvault/keys"]);
            },
            "key state",
        ),
        (
            "an old version damaged, the tip intact",
            |v| {
                // The blob of a.txt as first written is no longer at the tip.
                let first = root_entries(v);
                v.one(json!({"command": "str_replace", "path": "/memories/a.txt",
                    "old_str": "42", "new_str": "43"}));
                let now = root_entries(v);
                let old = first.iter().find(|e| !now.contains(e)).unwrap();
                flip_middle_byte(v, &old.2);
                // The agent still reads the current files.
                assert!(!is_error(
                    &v.one(json!({"command": "view", "path": "/memories/a.txt"}))
                ));
            },
            "/memories/a.txt",
        ),
        (
            "main moved back to an older commit (rollback)",
            |v| {
                v.one(json!({"command": "delete", "path": "/memories/b.txt"}));
                let (code, _) = verify(v);
                assert_eq!(code, Some(0));
                git(
                    &v.vault,
                    &["update-ref", "refs/heads/main", "refs/heads/main~1"],
                );
            },
            "rollback",
        ),
    ];
    for (name, damage, expect) in cases {
        let v = vault_with_two_files();
        let (code, out) = verify(&v);
        assert_eq!(code, Some(0), "{name}: healthy vault fails verify:\n{out}");
        assert!(out.starts_with("ok: "), "{out}");
        damage(&v);
        let (code, out) = verify(&v);
        assert_eq!(
            code,
            Some(1),
            "{name}: verify passed a damaged vault:\n{out}"
        );
        assert!(out.contains("PROBLEM"), "{name}: {out}");
        assert!(
            out.contains(expect),
            "{name}: expected {expect:?} in:\n{out}"
        );
        assert!(!out.contains("quarterly"), "{name}: content leaked: {out}");
        let json = v.cmd().args(["verify", "--json"]).output().unwrap();
        assert_eq!(json.status.code(), Some(1));
        let report: Value = serde_json::from_slice(&json.stdout).unwrap();
        assert_eq!(report["ok"], false, "{name}");
    }
}
