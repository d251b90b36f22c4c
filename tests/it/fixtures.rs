//! The committed fixture vaults (`tests/fixtures/`, made as
//! `tests/fixtures/make-v1.sh`, `make-v2.sh`, ... `make-v8.sh` say): a vault written by an earlier format
//! must keep opening and working, and each named broken copy (`fail_*`)
//! must be refused as damaged, never read as content.

use std::path::Path;
use std::process::Command;

use crate::util::{TestVault, Writer, bin, copy_dir, is_error, text};

/// A working copy of the fixture `name` (the committed one is never
/// opened: opening may migrate or checkpoint it). Git keeps no empty
/// directory, so the ones a bare repository has are made here.
pub fn fixture(name: &str) -> TestVault {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(&src, tmp.path());
    let vault = tmp.path().join("vault");
    for d in ["objects/info", "objects/pack", "refs/tags", "refs/heads"] {
        std::fs::create_dir_all(vault.join(d)).unwrap();
    }
    let key = tmp.path().join("vault.key");
    TestVault { tmp, vault, key }
}

fn run(t: &TestVault, args: &[&str]) -> std::process::Output {
    t.cmd().args(args).output().unwrap()
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `verify` on `t`, which must pass; its output.
fn verifies(t: &TestVault) -> std::process::Output {
    let v = run(t, &["verify"]);
    assert!(v.status.success(), "verify: {}{}", stdout(&v), stderr(&v));
    v
}

#[test]
fn format_1_vault_opens_reads_and_verifies() {
    let t = fixture("v1");
    verifies(&t);
    let h = run(&t, &["history"]);
    assert!(h.status.success(), "{}", stderr(&h));
    let h = stdout(&h);
    for op in ["purge", "delete", "rename", "insert", "str_replace", "init"] {
        assert!(h.contains(op), "history lacks {op}: {h}");
    }
    let r = t.one(serde_json::json!({"command": "view", "path": "/memories/notes/project.md"}));
    assert!(!is_error(&r), "{r}");
    assert!(text(&r).contains("The deploy runs on Wednesdays."), "{r}");
    let r = t.one(serde_json::json!({"command": "view", "path": "/memories/notes/prefs.md"}));
    assert!(text(&r).contains("Answer in French."), "{r}");
    // The purged file's past is erased, not readable.
    let s = run(&t, &["show", "HEAD~1", "/memories/secret-plan.md"]);
    assert!(!stdout(&s).contains("will be purged"), "{}", stdout(&s));
}

#[test]
fn format_1_vault_unlocks_with_its_passphrase_slot() {
    let t = fixture("v1");
    let out = Command::new(bin())
        .arg("--vault")
        .arg(&t.vault)
        .arg("--passphrase-file")
        .arg(t.tmp.path().join("passphrase"))
        .args(["show", "HEAD", "/memories/notes/project.md"])
        .env_remove("MEMVAULT_KEY_FILE")
        .env_remove("MEMVAULT_PASSPHRASE")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("Owner: Ana."));
}

#[test]
fn format_1_vault_keeps_working_after_writes() {
    let t = fixture("v1");
    let r = t.serve(&[
        serde_json::json!({"command": "create", "path": "/memories/new.md", "file_text": "hello\n"})
            .to_string(),
        serde_json::json!({"command": "str_replace", "path": "/memories/notes/project.md",
            "old_str": "Ana", "new_str": "Bea"})
        .to_string(),
        serde_json::json!({"command": "view", "path": "/memories"}).to_string(),
    ]);
    assert!(r.iter().all(|v| !is_error(v)), "{r:?}");
    verifies(&t);
    // And it still opens again, old history and new.
    let h = stdout(&run(&t, &["history"]));
    assert!(h.contains("/memories/new.md") && h.contains("purge"), "{h}");
    let r = t.one(serde_json::json!({"command": "view", "path": "/memories/notes/project.md"}));
    assert!(text(&r).contains("Owner: Bea."), "{r}");
}

/// Opening a format-1 vault migrates it once: its plain settings file
/// becomes the authenticated settings of the key state (a `migrate`
/// commit), the format file says 2, and writing "1" back into it later
/// brings no plain settings file back into force.
#[test]
fn format_1_vault_is_migrated_once_and_cannot_be_downgraded() {
    let t = fixture("v1");
    let cfg = t.vault.join("memvault/config.json");
    assert!(cfg.exists());
    let h = stdout(&run(&t, &["history"]));
    assert!(h.lines().next().unwrap().contains("migrate"), "{h}");
    assert!(!cfg.exists(), "the plain settings file is gone");
    let format = std::fs::read_to_string(t.vault.join("memvault/format")).unwrap();
    assert_eq!(format, "memvault vault format 9\n");
    let mode = stdout(&run(&t, &["config", "get", "redaction.mode"]));
    assert_eq!(mode.trim(), "\"redact\"");
    // A downgrade attempt: format 1 again, and a plain file turning
    // redaction off.
    std::fs::write(t.vault.join("memvault/format"), "memvault vault format 1\n").unwrap();
    std::fs::write(&cfg, r#"{"redaction": {"mode": "off"}}"#).unwrap();
    // (The key state decides: no second migration; the plain file is
    // removed as a leftover, and the format file says 2 again.)
    let r = t.one(
        serde_json::json!({"command": "create", "path": "/memories/t.md",
        "file_text": "aws key AKIAZ7QX3RBN2WLT4YHK\n"}),
    );
    assert!(!is_error(&r), "{r}");
    let r = t.one(serde_json::json!({"command": "view", "path": "/memories/t.md"}));
    assert!(!text(&r).contains("AKIAZ7QX3RBN2WLT4YHK"), "{r}");
    let h = stdout(&run(&t, &["history"]));
    // Once: settings into the key state (format 2), a key state of 4096
    // shards. Its flat trees stay as they are: format 9 holds a
    // directory of up to 16 entries in one tree, and splits a bigger one
    // at its first write.
    assert_eq!(
        h.lines().filter(|l| l.contains("migrate")).count(),
        1,
        "{h}"
    );
    assert!(!cfg.exists());
}

/// A crash at either step after the format-1 migration's commit (before
/// the plain settings file is removed, or after it and before the format
/// file says 2) leaves a vault the next open finishes migrating: the plain
/// file gone, the format current, the settings carried over, and a
/// repository `git fsck` passes (format 1's first commit named the empty
/// tree without storing it). The plain file used to go last, and a crash
/// before it left a vault every command refused.
#[cfg(feature = "test-hooks")]
#[test]
fn a_crash_inside_the_format_1_migration_is_finished_by_the_next_open() {
    for point in ["settings-migrated", "plain-settings-removed"] {
        let t = fixture("v1");
        let cfg = t.vault.join("memvault/config.json");
        std::fs::write(&cfg, r#"{"max_files": 123}"#).unwrap();
        let o = t
            .cmd()
            .arg("history")
            .env("MEMVAULT_TEST_CRASH", point)
            .output()
            .unwrap();
        assert!(!o.status.success(), "{point}: the crash hook did not fire");
        let format = std::fs::read_to_string(t.vault.join("memvault/format")).unwrap();
        assert_eq!(format, "memvault vault format 1\n", "{point}");
        assert_eq!(cfg.exists(), point == "settings-migrated", "{point}");
        let h = run(&t, &["history"]);
        assert!(h.status.success(), "{point}: {}", stderr(&h));
        assert!(!cfg.exists(), "{point}");
        let format = std::fs::read_to_string(t.vault.join("memvault/format")).unwrap();
        assert_eq!(format, "memvault vault format 9\n", "{point}");
        let m = stdout(&run(&t, &["config", "get", "max_files"]));
        assert_eq!(m.trim(), "123", "{point}");
        verifies(&t);
        let fsck = Command::new("git")
            .args(["--git-dir"])
            .arg(&t.vault)
            .args(["fsck", "--connectivity-only", "--no-dangling"])
            .output()
            .unwrap();
        assert!(
            fsck.status.success(),
            "{point}: {}{}",
            stdout(&fsck),
            stderr(&fsck)
        );
        let r = t.one(
            serde_json::json!({"command": "create", "path": "/memories/n.md",
            "file_text": "after\n"}),
        );
        assert!(!is_error(&r), "{point}: {r}");
    }
}

/// A newer format than this memvault knows is refused, not guessed at.
#[test]
fn a_newer_format_is_refused() {
    let t = fixture("v1");
    std::fs::write(
        t.vault.join("memvault/format"),
        "memvault vault format 99\n",
    )
    .unwrap();
    let out = run(&t, &["history"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("newer"), "{}", stderr(&out));
    // A number memvault never writes (a sign, a leading zero) names no
    // format: the file is damaged, not read as 9.
    for bad in ["+9", "09", " 9", "9 "] {
        std::fs::write(
            t.vault.join("memvault/format"),
            format!("memvault vault format {bad}\n"),
        )
        .unwrap();
        let out = run(&t, &["history"]);
        assert_eq!(out.status.code(), Some(1), "{bad}");
        assert!(
            stderr(&out).contains("does not name a format"),
            "{bad}: {}",
            stderr(&out)
        );
    }
}

/// A key state rolled back to before a purge must not bring the purged
/// file back, and `verify` must not say ok.
#[test]
fn fail_keys_rollback_is_refused() {
    let t = fixture("fail_keys_rollback");
    let s = run(&t, &["show", "HEAD~1", "/memories/secret-plan.md"]);
    assert!(
        !stdout(&s).contains("will be purged"),
        "the purged file came back: {}",
        stdout(&s)
    );
    assert!(!s.status.success());
    let v = run(&t, &["verify"]);
    assert!(!v.status.success(), "verify said ok: {}", stdout(&v));
    let all = format!("{}{}", stdout(&v), stderr(&v));
    assert!(all.contains("rolled back"), "{all}");
}

/// Run `cmd`; the test fails if it has not finished within `secs`
/// seconds: damage must never turn into a hang.
fn run_bounded(cmd: &mut Command, secs: u64) -> std::process::Output {
    crate::util::run_bounded(cmd, "", std::time::Duration::from_secs(secs))
        .unwrap_or_else(|| panic!("{cmd:?} did not finish within {secs} s"))
}

/// A cut-short loose tree gives the damaged error, promptly, for a view
/// as for `verify`.
#[test]
fn fail_truncated_tree_is_refused() {
    let t = fixture("fail_truncated_tree");
    let view = run_bounded(
        t.cmd()
            .args(["exec", r#"{"command":"view","path":"/memories"}"#]),
        20,
    );
    let line = stdout(&view);
    assert!(line.contains("damaged"), "{line}{}", stderr(&view));
    assert!(line.contains(r#""is_error":true"#), "{line}");
    let v = run_bounded(t.cmd().arg("verify"), 20);
    assert!(!v.status.success(), "verify said ok: {}", stdout(&v));
}

/// The git paths of the files at main (`ls-tree -r`).
fn git_files(t: &TestVault) -> Vec<String> {
    let out = crate::util::git(
        &t.vault,
        &["ls-tree", "-r", "--name-only", "refs/heads/main"],
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// A vault of format 2 (flat directory trees, made by the last release
/// writing them) opens, and its first open rewrites its key table and
/// places every file as format 9 does in one `migrate` commit that
/// changes no file: every file reads as before, history before the
/// migration reads as it did (per file too), `verify` passes, and the
/// format file says the current format.
#[test]
fn format_2_vault_is_migrated_to_bucket_trees_and_reads_as_before() {
    let t = fixture("v2");
    let before = git_files(&t);
    assert!(
        before.iter().all(|g| !g.split('/').any(|s| s.len() == 1)),
        "the fixture has flat trees: {before:?}"
    );
    verifies(&t);
    let format = std::fs::read_to_string(t.vault.join("memvault/format")).unwrap();
    assert_eq!(format, "memvault vault format 9\n");
    let after = git_files(&t);
    assert_eq!(after.len(), before.len());
    for g in &after {
        // Each name in its directory's tree or under buckets (`verify`
        // checks they are its own).
        assert!(g.split('/').all(|s| s.len() == 1 || s.len() >= 52), "{g}");
    }
    let h = stdout(&run(&t, &["history", "--json"]));
    let top: serde_json::Value = serde_json::from_str(h.lines().next().unwrap()).unwrap();
    assert_eq!(top["op"], "migrate", "{h}");
    // Booked to memvault, not to whichever session's open ran it.
    assert_eq!(top["session"], "migrate", "{h}");
    assert_eq!(top["actor"], "memvault", "{h}");
    // The key state too: format 3, its table in shards four levels down.
    let keys = crate::util::git(&t.vault, &["cat-file", "commit", "refs/memvault/keys"]);
    assert!(String::from_utf8_lossy(&keys.stdout).contains("memvault key state v5\n"));
    let table = crate::util::git(
        &t.vault,
        &["ls-tree", "-r", "--name-only", "refs/memvault/keys:table"],
    );
    let shards = String::from_utf8(table.stdout).unwrap();
    assert!(!shards.is_empty());
    for s in shards.lines() {
        assert_eq!(s.len(), 7, "{s}");
        assert!(
            s.split('/').all(|d| matches!(d.as_bytes(), [b'0'..=b'7'])),
            "{s}"
        );
    }
    // The migration changed no file.
    let d = run(&t, &["diff", "HEAD~1", "HEAD"]);
    assert!(d.status.success(), "{}", stderr(&d));
    assert!(stdout(&d).trim().is_empty(), "{}", stdout(&d));
    for (path, want) in [
        (
            "/memories/notes/project.md",
            "The deploy runs on Wednesdays.",
        ),
        ("/memories/notes/todo.md", "- write the fixture"),
        ("/memories/notes/prefs.md", "Answer in French."),
        ("/memories/archive/a/b.md", "nested"),
        ("/memories/log/day12.md", "Day 12"),
    ] {
        let r = t.one(serde_json::json!({"command": "view", "path": path}));
        assert!(text(&r).contains(want), "{path}: {r}");
    }
    let r = t.one(serde_json::json!({"command": "view", "path": "/memories/log/day3.md"}));
    assert!(is_error(&r), "deleted before the migration: {r}");
    let listing = t.one(serde_json::json!({"command": "view", "path": "/memories/log"}));
    let listing = text(&listing);
    assert_eq!(listing.matches(".md").count(), 11, "{listing}");
    // A file's history reaches back before the migration.
    let h = stdout(&run(&t, &["history", "/memories/notes/project.md"]));
    assert!(h.contains("str_replace") && h.contains("create"), "{h}");
    assert!(!h.contains("migrate"), "{h}");
    // Its settings survived.
    let m = stdout(&run(&t, &["config", "get", "max_files"]));
    assert_eq!(m.trim(), "5000");
    // An old version reads as it was.
    let s = run(&t, &["show", "HEAD~12", "/memories/notes/project.md"]);
    assert!(
        stdout(&s).contains("Tuesdays"),
        "{}{}",
        stdout(&s),
        stderr(&s)
    );
    // The purged file stays erased.
    let all = stdout(&run(&t, &["history", "/memories/secret-plan.md"]));
    assert!(all.contains("purge") || all.contains("create"), "{all}");
}

/// After the migration the vault keeps working: writes into old and new
/// directories, a revert and a restore of changes made before it, a purge
/// of a file with history before it, and reopening; and a format file set
/// back to 2 brings no second migration.
#[test]
fn format_2_vault_keeps_working_after_migration() {
    let t = fixture("v2");
    let r = t.serve(&[
        serde_json::json!({"command": "create", "path": "/memories/log/day13.md", "file_text": "Day 13\n"}).to_string(),
        serde_json::json!({"command": "str_replace", "path": "/memories/notes/todo.md",
            "old_str": "call Bo", "new_str": "call Cy"}).to_string(),
        serde_json::json!({"command": "rename", "old_path": "/memories/log", "new_path": "/memories/journal"}).to_string(),
        serde_json::json!({"command": "delete", "path": "/memories/journal/day1.md"}).to_string(),
    ]);
    assert!(r.iter().all(|v| !is_error(v)), "{r:?}");
    let listing = t.one(serde_json::json!({"command": "view", "path": "/memories/journal"}));
    let listing = text(&listing);
    assert_eq!(listing.matches(".md").count(), 11, "{listing}");
    // Undo the session s2's edit of project.md (before the migration):
    // restore project.md as it was at its creation.
    let h = stdout(&run(
        &t,
        &["history", "--json", "/memories/notes/project.md"],
    ));
    let created = h
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["op"] == "create")
        .unwrap();
    let rev = created["commit"]
        .as_str()
        .or(created["rev"].as_str())
        .unwrap()
        .to_string();
    let o = run(
        &t,
        &[
            "restore",
            "/memories/notes/project.md",
            "--at",
            &rev,
            "--force",
        ],
    );
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let r = t.one(serde_json::json!({"command": "view", "path": "/memories/notes/project.md"}));
    assert!(text(&r).contains("Tuesdays"), "{r}");
    // A purge reaches the versions from before the migration.
    let h = stdout(&run(&t, &["history", "--json", "/memories/notes/prefs.md"]));
    let renamed = h
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["op"] == "rename")
        .unwrap();
    let old = renamed["commit"]
        .as_str()
        .or(renamed["rev"].as_str())
        .unwrap()
        .to_string();
    let s = run(&t, &["show", &old, "/memories/notes/prefs.md"]);
    assert!(
        stdout(&s).contains("French"),
        "{}{}",
        stdout(&s),
        stderr(&s)
    );
    let o = run(&t, &["purge", "/memories/notes/prefs.md"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = run(&t, &["show", &old, "/memories/notes/prefs.md"]);
    assert!(
        !stdout(&s).contains("French"),
        "purged history still reads: {}",
        stdout(&s)
    );
    verifies(&t);
    std::fs::write(t.vault.join("memvault/format"), "memvault vault format 2\n").unwrap();
    let h = stdout(&run(&t, &["history"]));
    assert_eq!(
        h.lines().filter(|l| l.contains("migrate")).count(),
        1,
        "{h}"
    );
    let format = std::fs::read_to_string(t.vault.join("memvault/format")).unwrap();
    assert_eq!(format, "memvault vault format 9\n");
}

/// Format 3 -> 4 changes no data: a vault whose format file says 3 (as
/// every vault of the previous release, and the migrated fixtures, did)
/// opens, keeps its history and files, writes, and says 4 from then on,
/// with no migrate commit; a format it does not know is still refused.
#[test]
fn a_format_3_vault_becomes_format_4_by_its_format_file_alone() {
    let t = fixture("v2");
    // Through the 2 -> 3 migration first, then back to the file of 3.
    assert!(run(&t, &["verify"]).status.success());
    std::fs::write(t.vault.join("memvault/format"), "memvault vault format 3\n").unwrap();
    let before = stdout(&run(&t, &["history", "--json"]));
    let files = stdout(&run(
        &t,
        &["exec", r#"{"command":"view","path":"/memories"}"#],
    ));
    let after_open = stdout(&run(&t, &["history", "--json"]));
    assert_eq!(before, after_open, "opening a format-3 vault made a commit");
    // The one migrate commit is 2 -> 3's.
    assert_eq!(before.matches(r#""op":"migrate""#).count(), 1, "{before}");
    let format = std::fs::read_to_string(t.vault.join("memvault/format")).unwrap();
    assert_eq!(format, "memvault vault format 9\n");
    assert!(!is_error(&serde_json::from_str(&files).unwrap()), "{files}");
    let o = run(
        &t,
        &[
            "exec",
            r#"{"command":"create","path":"/memories/after-4.md","file_text":"four"}"#,
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    verifies(&t);
    std::fs::write(
        t.vault.join("memvault/format"),
        "memvault vault format 10\n",
    )
    .unwrap();
    let o = run(&t, &["history"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("format 10, newer than this memvault understands (up to 9)"),
        "{}",
        stderr(&o)
    );
}

/// The key-state commit `refs/memvault/keys` points to, as text.
fn key_state_commit(t: &TestVault) -> String {
    let k = crate::util::git(&t.vault, &["cat-file", "commit", "refs/memvault/keys"]);
    String::from_utf8_lossy(&k.stdout).into_owned()
}

/// A vault of format 5 (made by the last release writing it, as
/// `make-v5.sh` says: two machines, a merge with conflict copies, a purge
/// after it) opens as it is: it reads as before, `verify` passes, history
/// names each change's machine and the merge, and the format file says 6.
/// Its next write starts a key-state chain (the old state stays as it
/// was, with no parent), and it pushes to a new remote, from which a clone
/// reads the same files and verifies.
#[test]
fn format_5_vault_opens_keeps_working_and_syncs() {
    let t = fixture("v5");
    let old_state = key_state_commit(&t);
    assert!(old_state.contains("memvault key state v3\n"), "{old_state}");
    assert!(!old_state.contains("\nparent "), "{old_state}");
    verifies(&t);
    let format = std::fs::read_to_string(t.vault.join("memvault/format")).unwrap();
    assert_eq!(format, "memvault vault format 9\n");
    // The first open gave it a key state of format 5 (older memvaults
    // refuse it), naming the old one as its parent (a chain starts), in a
    // `migrate` commit.
    let h = stdout(&run(&t, &["history", "--limit", "1"]));
    assert!(
        h.contains("migrate") && h.contains("vault format 9: key state format 3 -> 5"),
        "{h}"
    );
    let new_state = key_state_commit(&t);
    assert!(new_state.contains("memvault key state v5\n"), "{new_state}");
    let old_id = crate::util::git(&t.vault, &["rev-parse", "refs/memvault/keys~1"]);
    assert!(old_id.status.success(), "the new state has a parent");
    let expect = [
        ("/memories/notes/project.md", "Wednesdays"),
        ("/memories/notes/project.conflict-1.md", "Owner: Bo."),
        ("/memories/notes/plan.md", "July"),
        ("/memories/notes/plan.conflict-1.md", "June"),
        ("/memories/server.md", "Written on the server."),
        ("/memories/archive/day2.md", "Day 2"),
    ];
    for (path, want) in expect {
        let r = t.one(serde_json::json!({"command": "view", "path": path}));
        assert!(text(&r).contains(want), "{path}: {r}");
    }
    for gone in ["/memories/secret-plan.md", "/memories/log/day3.md"] {
        let r = t.one(serde_json::json!({"command": "view", "path": gone}));
        assert!(is_error(&r), "{gone}: {r}");
    }
    let h = stdout(&run(&t, &["history", "--json"]));
    let lines: Vec<serde_json::Value> = h
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let merge = lines.iter().find(|v| v["op"] == "merge").expect("a merge");
    assert!(
        merge["machine"].as_str().unwrap().starts_with("laptop ("),
        "{merge}"
    );
    assert!(!merge["merged"].as_array().unwrap().is_empty(), "{merge}");
    assert!(
        lines.iter().any(|v| v["machine"]
            .as_str()
            .is_some_and(|m| m.starts_with("server ("))),
        "{h}"
    );
    let m = stdout(&run(&t, &["config", "get", "max_files"]));
    assert_eq!(m.trim(), "5000");
    let r = t.one(serde_json::json!({"command": "create",
        "path": "/memories/after.md", "file_text": "Written by format 6.\n"}));
    assert!(!is_error(&r), "{r}");
    // Dates git sees: one clock for main and the key state, one past
    // every parent's (the format-5 parent and key state say 0, the
    // migration's commit 1); never a time.
    let dates = |rev: &str| {
        let o = crate::util::git(&t.vault, &["log", "-2", "--format=%ct %at", rev]);
        String::from_utf8(o.stdout).unwrap()
    };
    assert_eq!(dates("refs/heads/main"), "2 2\n1 1\n");
    let r = t.one(serde_json::json!({"command": "create",
        "path": "/memories/after-2.md", "file_text": "Again.\n"}));
    assert!(!is_error(&r), "{r}");
    // (The first create's key was taken into a key state, dated 3, when
    // its command closed.)
    assert_eq!(dates("refs/heads/main"), "4 4\n2 2\n");
    // The key state that took in the new keys (when the command closed,
    // format 7) is dated past main's tip and the state it replaced.
    assert_eq!(dates("refs/memvault/keys"), "5 5\n3 3\n");
    verifies(&t);
    // Through a new remote to a clone.
    let remote = t.tmp.path().join("remote.git");
    let g = Command::new("git")
        .args(["init", "-q", "--bare"])
        .arg(&remote)
        .output()
        .unwrap();
    assert!(g.status.success());
    let a = run(&t, &["remote", "add", "origin", remote.to_str().unwrap()]);
    assert!(a.status.success(), "{}", stderr(&a));
    let p = run(&t, &["push"]);
    assert!(p.status.success(), "{}", stderr(&p));
    let other = t.tmp.path().join("clone");
    let c = Command::new(bin())
        .args(["clone", remote.to_str().unwrap(), "--vault"])
        .arg(&other)
        .arg("--key-file")
        .arg(&t.key)
        .output()
        .unwrap();
    assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stderr));
    let clone = TestVault {
        tmp: tempfile::tempdir().unwrap(),
        vault: other,
        key: t.key.clone(),
    };
    for (path, want) in expect.into_iter().chain([
        ("/memories/after.md", "Written by format 6."),
        ("/memories/after-2.md", "Again."),
    ]) {
        let r = clone.one(serde_json::json!({"command": "view", "path": path}));
        assert!(text(&r).contains(want), "{path}: {r}");
    }
    verifies(&clone);
}

/// What both fixtures of a killed `serve` (formats 6 and 7) hold once
/// this memvault opened them: the log held the records, `verify` replays
/// them (`commits` in all), the vault is of format 9, and the files read
/// as the killed session left them (`day1`: /memories/log/day1.md's text).
fn check_killed_session_replayed(t: &TestVault, commits: usize, day1: &str) {
    let wal = std::fs::metadata(t.vault.join("memvault/wal"))
        .unwrap()
        .len();
    assert!(
        wal > 5_000,
        "the fixture's log holds its records ({wal} bytes)"
    );
    let v = verifies(t);
    let ok = format!("ok: {commits} commits");
    assert!(stdout(&v).starts_with(&ok), "{}", stdout(&v));
    let format = std::fs::read_to_string(t.vault.join("memvault/format")).unwrap();
    assert_eq!(format, "memvault vault format 9\n");
    let expect = [
        ("/memories/notes/late.md", "Written in the killed session."),
        ("/memories/people/bo.md", "Bo joined in June."),
        ("/memories/log/day1.md", day1),
        ("/memories/people/ana-lead.md", "Ana owns the deploy."),
        ("/memories/notes/plan.md", "June"),
    ];
    for (path, want) in expect {
        let r = t.one(serde_json::json!({"command": "view", "path": path}));
        assert!(text(&r).contains(want), "{path}: {r}");
    }
    for gone in ["/memories/old.md", "/memories/people/ana.md"] {
        let r = t.one(serde_json::json!({"command": "view", "path": gone}));
        assert!(is_error(&r), "{gone}: {r}");
    }
}

/// A vault of format 6 whose log still holds acknowledged records of a
/// `serve` that was killed (each create's record with a whole key state,
/// as format 6 wrote it; `tests/fixtures/make-v6.sh`): this memvault
/// replays them, becomes format 9, and its own creates (their shards
/// logged alone) read back in another process and verify.
#[test]
fn format_6_vault_with_a_killed_writers_log_opens_replays_and_keeps_working() {
    let t = fixture("v6");
    check_killed_session_replayed(&t, 12, "Day 1.");
    let sessions = stdout(&run(&t, &["sessions"]));
    assert!(sessions.contains("s2"), "{sessions}");
    // Creates by this memvault in one process, read in another while the
    // first still runs (their keys only in the log), then verified.
    let mut writer = Writer::start(&t, "s3");
    for i in 0..5 {
        writer.send(&serde_json::json!({"command": "create",
            "path": format!("/memories/after/{i}.md"), "file_text": format!("after {i}\n")}));
    }
    let r = t.one(serde_json::json!({"command": "view", "path": "/memories/after/3.md"}));
    assert!(text(&r).contains("after 3"), "{r}");
    assert!(writer.finish());
    verifies(&t);
    crate::util::git(&t.vault, &["fsck", "--connectivity-only", "--no-dangling"]);
}

/// A vault of format 7 whose log holds a killed `serve`'s records, the
/// last four naming the counter of a key state that lacks the new files'
/// keys (they are in the log's shards; `tests/fixtures/make-v7.sh`): this
/// memvault replays them and becomes format 9. Its own writer killed with
/// shards pending (its commits name the next key state's counter) is
/// replayed too, and everything verifies.
#[test]
fn format_7_vault_with_shards_pending_in_its_log_opens_replays_and_keeps_working() {
    let t = fixture("v7");
    check_killed_session_replayed(&t, 12, "Day 1: the log kept it.");
    // A writer of this memvault killed with its creates' shards in the
    // log (no checkpoint), read by other processes as it left them.
    let mut writer = Writer::start(&t, "s3");
    writer.send(&serde_json::json!({"command": "create", "path": "/memories/k/0.md", "file_text": "killed 0\n"}));
    writer.send(&serde_json::json!({"command": "create", "path": "/memories/k/1.md", "file_text": "killed 1\n"}));
    writer.send(&serde_json::json!({"command": "str_replace", "path": "/memories/k/0.md", "old_str": "killed 0", "new_str": "killed zero"}));
    let r = t.one(serde_json::json!({"command": "view", "path": "/memories/k/1.md"}));
    assert!(text(&r).contains("killed 1"), "{r}");
    writer.child.kill().unwrap();
    writer.child.wait().unwrap();
    for (path, want) in [
        ("/memories/k/0.md", "killed zero"),
        ("/memories/k/1.md", "killed 1"),
    ] {
        let r = t.one(serde_json::json!({"command": "view", "path": path}));
        assert!(text(&r).contains(want), "{path}: {r}");
    }
    verifies(&t);
    let sessions = stdout(&run(&t, &["sessions"]));
    assert!(
        sessions.contains("s2") && sessions.contains("s3"),
        "{sessions}"
    );
    crate::util::git(&t.vault, &["fsck", "--connectivity-only", "--no-dangling"]);
}

/// The fixture of format 8 (`tests/fixtures/make-v8.sh`): every entry at
/// the full depth of its three bucket levels, key states `v4`, and a
/// killed session's three records in its log. This memvault replays them
/// and becomes format 9; it reads every file where format 8 put it, and
/// writes into the same directories: new entries where format 9 places
/// them (a directory past 16 entries split a level down), a directory of
/// both layouts renamed whole. `verify`, `history` across the change of
/// layout, a revert of the session made here and a purge all hold.
#[test]
fn format_8_vault_opens_and_keeps_working_with_entries_at_any_depth() {
    let t = fixture("v8");
    let view = |path: &str| t.one(serde_json::json!({"command": "view", "path": path}));
    let reads = |path: &str, want: &str| {
        let r = view(path);
        assert!(!is_error(&r) && text(&r).contains(want), "{path}: {r}");
    };
    reads("/memories/big/n00.md", "Note 00 of the big directory.");
    reads("/memories/big/n05.md", "Note five of the big directory.");
    reads("/memories/big/late.md", "Written in the killed session.");
    reads("/memories/big/last.md", "Note 39 of the big directory.");
    reads("/memories/notes/plan.md", "Plan: ship in June.");
    reads(
        "/memories/notes/project-x.md",
        "The deploy runs on Tuesdays.",
    );
    for gone in [
        "/memories/notes/old.md",
        "/memories/big/n39.md",
        "/memories/notes/project.md",
    ] {
        assert!(is_error(&view(gone)), "{gone}");
    }
    let format = std::fs::read_to_string(t.vault.join("memvault/format")).unwrap();
    assert_eq!(format, "memvault vault format 9\n");
    verifies(&t);
    // Before any write of this memvault: a key state of format 5, which a
    // memvault of format 8 refuses (it would miss entries placed above
    // the full depth). Here the replay of the log's records wrote it (a
    // vault with nothing in its log gets it in a `migrate` commit, see the
    // format-5 fixture).
    let keys = key_state_commit(&t);
    assert!(keys.contains("memvault key state v5\n"), "{keys}");

    let mut w = Writer::start(&t, "s3");
    for i in 40..70 {
        w.send(&serde_json::json!({"command": "create", "path": format!("/memories/big/m{i}.md"), "file_text": format!("New {i}.\n")}));
    }
    w.send(&serde_json::json!({"command": "str_replace", "path": "/memories/big/n07.md", "old_str": "Note 07", "new_str": "Note seven"}));
    w.send(&serde_json::json!({"command": "delete", "path": "/memories/big/n08.md"}));
    w.send(&serde_json::json!({"command": "rename", "old_path": "/memories/big", "new_path": "/memories/large"}));
    w.send(&serde_json::json!({"command": "create", "path": "/memories/notes/new.md", "file_text": "new\n"}));
    assert!(w.finish());
    reads("/memories/large/n07.md", "Note seven of the big directory.");
    reads("/memories/large/m69.md", "New 69.");
    reads("/memories/large/late.md", "Written in the killed session.");
    reads("/memories/notes/new.md", "new");
    let listing = text(&view("/memories/large")).to_string();
    assert_eq!(
        listing.matches(".md\n").count() + listing.ends_with(".md") as usize,
        70,
        "{listing}"
    );
    assert!(is_error(&view("/memories/big")));
    assert!(is_error(&view("/memories/large/n08.md")));
    // The renamed directory of 70 files holds them one bucket level down
    // (at most 16 directly; 16 buckets of about 4).
    let tree = crate::util::git(&t.vault, &["ls-tree", "-r", "main"]);
    let tree = String::from_utf8_lossy(&tree.stdout);
    let mut by_dir: std::collections::HashMap<&str, Vec<usize>> = Default::default();
    for path in tree.lines().filter_map(|l| l.split('\t').nth(1)) {
        let segs: Vec<&str> = path.split('/').collect();
        let file = segs.len() - 1;
        let Some(dir) = segs[..file].iter().rposition(|s| s.len() > 1) else {
            continue;
        };
        by_dir.entry(segs[dir]).or_default().push(file - dir - 1);
    }
    let depths = by_dir.values().max_by_key(|d| d.len()).unwrap();
    assert_eq!(depths.len(), 70, "{tree}");
    assert!(depths.iter().all(|&d| d == 1), "{depths:?}");
    verifies(&t);
    let keys = key_state_commit(&t);
    assert!(keys.contains("memvault key state v5\n"), "{keys}");
    let h = stdout(&run(&t, &["history", "/memories/large/n03.md"]));
    assert!(h.contains(" s1 ") && h.contains("create"), "{h}");
    assert!(h.contains(" s3 ") && h.contains("rename"), "{h}");

    // Undo what this memvault wrote: the directory is back where it was,
    // as it was.
    let o = run(&t, &["revert", "--session", "s3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    reads("/memories/big/n07.md", "Note 07 of the big directory.");
    reads("/memories/big/n08.md", "Note 08 of the big directory.");
    for gone in [
        "/memories/large",
        "/memories/big/m40.md",
        "/memories/notes/new.md",
    ] {
        assert!(is_error(&view(gone)), "{gone}");
    }
    let o = run(&t, &["purge", "/memories/big/n05.md"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(is_error(&view("/memories/big/n05.md")));
    verifies(&t);
    crate::util::git(&t.vault, &["fsck", "--connectivity-only", "--no-dangling"]);
}

/// A vault of format 8 while a `serve` leads on it (`memvault/serve.lock`
/// held, as an older memvault's `serve` holds it) is refused, unchanged:
/// the older `serve` could not read the key state this memvault's first
/// open writes. Once it is gone the vault opens and moves to format 9.
/// Several processes opening it at once all succeed (the format file is
/// written under the writer lock: they used to trample each other's).
#[test]
fn a_format_8_vault_is_not_moved_under_a_running_older_serve_nor_by_racing_opens() {
    let t = fixture("v8");
    let lead = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(t.vault.join("memvault/serve.lock"))
        .unwrap();
    lead.try_lock().unwrap();
    let o = run(
        &t,
        &[
            "exec",
            r#"{"command":"view","path":"/memories/big/n00.md"}"#,
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("older version is running")
            && stderr(&o).contains("nothing was changed"),
        "{}",
        stderr(&o)
    );
    let format = std::fs::read_to_string(t.vault.join("memvault/format")).unwrap();
    assert_eq!(format, "memvault vault format 8\n");
    assert!(key_state_commit(&t).contains("memvault key state v4\n"));
    lead.unlock().unwrap();
    let opens: Vec<_> = (0..6)
        .map(|i| {
            t.cmd()
                .args(if i % 2 == 0 {
                    vec!["sessions"]
                } else {
                    vec!["history"]
                })
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in opens {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let format = std::fs::read_to_string(t.vault.join("memvault/format")).unwrap();
    assert_eq!(format, "memvault vault format 9\n");
    assert!(key_state_commit(&t).contains("memvault key state v5\n"));
    verifies(&t);
}
