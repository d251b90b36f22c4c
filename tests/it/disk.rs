//! What reaches the disk: nothing readable, one commit per mutation, each
//! with encrypted metadata and a MAC.

use serde_json::json;

use crate::util::*;

#[test]
fn no_plaintext_on_disk_content_file_name_or_directory_name() {
    let v = TestVault::new();
    let content_marker = "zq-content-marker-7f3a9c";
    let file_marker = "zqfilemarker81bd";
    let dir_marker = "zqdirmarker42ce";
    let out = v.serve(&[
        json!({"command": "create", "path": format!("/memories/{dir_marker}/{file_marker}.md"),
               "file_text": format!("remember {content_marker} please\n")})
        .to_string(),
        json!({"command": "str_replace", "path": format!("/memories/{dir_marker}/{file_marker}.md"),
               "old_str": "please", "new_str": format!("{content_marker} again")})
        .to_string(),
        json!({"command": "insert", "path": format!("/memories/{dir_marker}/{file_marker}.md"),
               "insert_line": 0, "insert_text": content_marker})
        .to_string(),
        json!({"command": "rename", "old_path": format!("/memories/{dir_marker}/{file_marker}.md"),
               "new_path": format!("/memories/{dir_marker}2/{file_marker}2.md")})
        .to_string(),
        json!({"command": "create", "path": format!("/memories/{dir_marker}/kept.md"), "file_text": content_marker}).to_string(),
        json!({"command": "view", "path": format!("/memories/{dir_marker}2/{file_marker}2.md")}).to_string(),
    ]);
    for o in &out {
        assert!(!is_error(o), "{o}");
    }
    assert!(text(&out[5]).contains(content_marker));
    for marker in [
        content_marker,
        file_marker,
        dir_marker,
        "/memories",
        "str_replace",
        "session",
    ] {
        let found = plaintext_anywhere(&v.vault, marker);
        assert!(found.is_empty(), "{marker:?} found in {found:?}");
    }
    // The search itself works: a marker that is in the repository is found.
    assert!(!plaintext_anywhere(&v.vault, "refs/heads/main").is_empty());
}

#[test]
fn each_mutation_is_one_commit_and_failures_make_none() {
    let v = TestVault::new();
    assert_eq!(v.commits(), 1, "a new vault holds only its creation commit");
    let cases = [
        (
            json!({"command": "create", "path": "/memories/a.txt", "file_text": "1\n2\n"}),
            true,
        ),
        (
            json!({"command": "create", "path": "/memories/a.txt", "file_text": "again"}),
            false,
        ),
        (json!({"command": "view", "path": "/memories/a.txt"}), false),
        (json!({"command": "view", "path": "/memories"}), false),
        (
            json!({"command": "str_replace", "path": "/memories/a.txt", "old_str": "1", "new_str": "one"}),
            true,
        ),
        (
            json!({"command": "str_replace", "path": "/memories/a.txt", "old_str": "nope", "new_str": "x"}),
            false,
        ),
        (
            json!({"command": "insert", "path": "/memories/a.txt", "insert_line": 2, "insert_text": "3"}),
            true,
        ),
        (
            json!({"command": "insert", "path": "/memories/a.txt", "insert_line": 99, "insert_text": "3"}),
            false,
        ),
        (
            json!({"command": "rename", "old_path": "/memories/a.txt", "new_path": "/memories/d/b.txt"}),
            true,
        ),
        (
            json!({"command": "rename", "old_path": "/memories/a.txt", "new_path": "/memories/c.txt"}),
            false,
        ),
        (json!({"command": "delete", "path": "/memories/d"}), true),
        (json!({"command": "delete", "path": "/memories/d"}), false),
        (json!({"command": "delete", "path": "/memories"}), false),
        (
            json!({"command": "create", "path": "/memories/../x", "file_text": "x"}),
            false,
        ),
        (json!({"command": "bogus"}), false),
    ];
    let mut expected = 1;
    for (cmd, commits) in cases {
        let out = v.one(cmd.clone());
        assert_eq!(
            !is_error(&out) && cmd["command"] != "view",
            commits,
            "{cmd} -> {out}"
        );
        if commits {
            expected += 1;
        }
        assert_eq!(v.commits(), expected, "after {cmd}");
    }
}

#[test]
fn commits_carry_encrypted_metadata_and_a_mac() {
    let v = TestVault::new();
    v.one(json!({"command": "create", "path": "/memories/meta-check.txt", "file_text": "hello\n"}));
    let raw = git(&v.vault, &["cat-file", "commit", "refs/heads/main"]).stdout;
    let raw = String::from_utf8(raw).unwrap();
    assert!(raw.contains("\nmvmac "), "no MAC header: {raw}");
    // No time: the date is a generation number (init 1, this commit 2).
    assert!(
        raw.contains("\nauthor m <m> 2 +0000\ncommitter m <m> 2 +0000\n"),
        "{raw}"
    );
    let message = raw.split("\n\n").nth(1).unwrap();
    assert!(
        !message.contains("create") && !message.contains("meta-check"),
        "{message}"
    );
    assert!(
        data_encoding::BASE64
            .decode(message.trim().as_bytes())
            .is_ok()
    );

    // The library decrypts it: operation, path, session, size, hash.
    let mut vault = v.open_library("x");
    let history = vault.history().unwrap();
    assert_eq!(history.len(), 2);
    let meta = &history[0].1;
    assert_eq!(meta.op, "create");
    assert_eq!(meta.path.as_deref(), Some("/memories/meta-check.txt"));
    assert_eq!(meta.session, "test");
    assert_eq!(meta.size, Some(6));
    assert_eq!(meta.content_hash.as_ref().map(|h| h.len()), Some(64));
    assert!(meta.time_ms > 1_600_000_000_000);
    assert_eq!(history[1].1.op, "init");
}

#[test]
fn the_repository_is_a_plain_bare_git_repository_on_main() {
    let v = TestVault::new();
    v.one(json!({"command": "create", "path": "/memories/a.txt", "file_text": "x"}));
    let head = git(&v.vault, &["symbolic-ref", "HEAD"]).stdout;
    assert_eq!(String::from_utf8(head).unwrap().trim(), "refs/heads/main");
    let bare = git(&v.vault, &["rev-parse", "--is-bare-repository"]).stdout;
    assert_eq!(String::from_utf8(bare).unwrap().trim(), "true");
    git(&v.vault, &["fsck", "--strict"]);
    assert!(!v.vault.join("index").exists());
}
