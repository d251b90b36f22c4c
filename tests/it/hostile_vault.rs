//! Regressions of issue 16's holes that a person who can write the vault
//! directory (but holds no key) could reach: settings, the key state and
//! the write-ahead log. Each test names what it pins; each failed before
//! the fix it pins.

use std::process::Command;

use serde_json::json;

use crate::util::*;

const GH_TOKEN: &str = "AKIAZ7QX3RBN2WLT4YHK";

fn ok(o: &std::process::Output) -> String {
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn git_out(v: &TestVault, args: &[&str]) -> String {
    String::from_utf8(git(&v.vault, args).stdout)
        .unwrap()
        .trim()
        .to_string()
}

/// Hole 5: anyone who could write `memvault/config.json` could turn
/// redaction off or let `create` overwrite. The settings now live in the
/// key state, sealed with the vault key; a planted file changes nothing,
/// and `verify` names it.
#[test]
fn planted_settings_file_changes_nothing() {
    let v = TestVault::new();
    let r = v.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "first\n"}));
    assert!(!is_error(&r), "{r}");
    std::fs::write(
        v.vault.join("memvault/config.json"),
        r#"{"overwrite_on_create": true, "redaction": {"mode": "off"}, "max_files": 1}"#,
    )
    .unwrap();
    let r = v.one(json!({"command": "create", "path": "/memories/b.md",
        "file_text": format!("token {GH_TOKEN}\n")}));
    assert!(!is_error(&r), "{r}");
    let r = v.one(json!({"command": "view", "path": "/memories/b.md"}));
    assert!(
        !text(&r).contains(GH_TOKEN),
        "redaction was turned off: {r}"
    );
    let r = v.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "second\n"}));
    assert!(is_error(&r), "create overwrote: {r}");
    let out = v.cmd().arg("verify").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("config.json"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Hole 5: the settings change through `memvault config set` only, each
/// change a commit that history shows; `config get` reads them back.
#[test]
fn config_set_is_recorded_in_history_and_takes_effect() {
    let v = TestVault::new();
    let before = v.commits();
    ok(&v
        .cmd()
        .args(["config", "set", "redaction.mode", "reject"])
        .output()
        .unwrap());
    assert_eq!(v.commits(), before + 1);
    let got = ok(&v
        .cmd()
        .args(["config", "get", "redaction.mode"])
        .output()
        .unwrap());
    assert_eq!(got.trim(), "\"reject\"");
    let h = ok(&v.cmd().arg("history").output().unwrap());
    let first = h.lines().next().unwrap();
    assert!(
        first.contains("operator") && first.contains("config") && first.contains("redaction.mode"),
        "{h}"
    );
    let r = v.one(json!({"command": "create", "path": "/memories/b.md",
        "file_text": format!("token {GH_TOKEN}\n")}));
    assert!(is_error(&r), "reject mode is in force: {r}");
    // Unknown settings and bad values are usage errors / refusals that
    // change nothing.
    let out = v
        .cmd()
        .args(["config", "set", "no_such_setting", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = v
        .cmd()
        .args(["config", "set", "max_files", "\"many\""])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(v.commits(), before + 1);
    ok(&v.cmd().arg("verify").output().unwrap());
}

/// Hole 5: settings altered inside the key state (a new, unsigned key
/// state) are refused as damage, never used.
#[test]
fn key_state_with_forged_settings_is_refused() {
    let v = TestVault::new();
    let r = v.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "x\n"}));
    assert!(!is_error(&r), "{r}");
    // Build a key state whose settings blob is junk, keeping the rest.
    let root = git_out(&v, &["rev-parse", "refs/memvault/keys^{tree}"]);
    let listing = git_out(&v, &["ls-tree", &root]);
    let junk = {
        let mut c = Command::new("git");
        c.arg("--git-dir")
            .arg(&v.vault)
            .args(["hash-object", "-w", "--stdin"]);
        let out = run_with_stdin(&mut c, br#"{"redaction":{"mode":"off"}}"#);
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let mut tree_in = String::new();
    for line in listing.lines() {
        if line.ends_with("\tsettings") {
            tree_in.push_str(&format!("100644 blob {junk}\tsettings\n"));
        } else {
            tree_in.push_str(line);
            tree_in.push('\n');
        }
    }
    let mut c = Command::new("git");
    c.arg("--git-dir").arg(&v.vault).arg("mktree");
    let new_root = String::from_utf8(run_with_stdin(&mut c, tree_in.as_bytes()).stdout).unwrap();
    let msg = git_out(&v, &["log", "-1", "--format=%B", "refs/memvault/keys"]);
    let mut c = Command::new("git");
    c.arg("--git-dir")
        .arg(&v.vault)
        .args(["commit-tree", new_root.trim(), "-m", &msg])
        .env("GIT_AUTHOR_NAME", "x")
        .env("GIT_AUTHOR_EMAIL", "x")
        .env("GIT_COMMITTER_NAME", "x")
        .env("GIT_COMMITTER_EMAIL", "x");
    let forged = String::from_utf8(c.output().unwrap().stdout).unwrap();
    git(
        &v.vault,
        &["update-ref", "refs/memvault/keys", forged.trim()],
    );
    let r = v
        .cmd()
        .args(["exec", r#"{"command":"view","path":"/memories/a.md"}"#])
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&r.stderr)
    );
    assert!(
        all.contains("damaged") || all.contains("not written with"),
        "{all}"
    );
    assert!(!all.contains("\"is_error\":false"), "{all}");
}

/// Hole 2: a key state rolled back to before a keyslot was removed (its
/// objects are still in the repository until `gc`) would let the removed
/// key open the vault again. The tip names the counter of its key state:
/// an older one is refused.
#[test]
fn key_state_rollback_after_key_remove_is_refused() {
    let v = TestVault::new();
    let second = v.tmp.path().join("second.key");
    ok(&Command::new(bin())
        .arg("keygen")
        .arg(&second)
        .output()
        .unwrap());
    ok(&v
        .cmd()
        .args(["key", "add", "--new-key-file"])
        .arg(&second)
        .output()
        .unwrap());
    let with_both = git_out(&v, &["rev-parse", "refs/memvault/keys"]);
    let list = ok(&v.cmd().args(["key", "list"]).output().unwrap());
    let id = list
        .lines()
        .find(|l| l.contains("key-file") && !l.contains("unlocked with"))
        .and_then(|l| l.split(' ').next())
        .unwrap()
        .to_string();
    ok(&v.cmd().args(["key", "remove", &id]).output().unwrap());
    let h = ok(&v.cmd().arg("history").output().unwrap());
    assert!(h.contains(&format!("removed keyslot {id}")), "{h}");
    // The attacker points the key state back.
    git(&v.vault, &["update-ref", "refs/memvault/keys", &with_both]);
    let out = Command::new(bin())
        .arg("--vault")
        .arg(&v.vault)
        .arg("--key-file")
        .arg(&second)
        .args(["exec", r#"{"command":"view","path":"/memories"}"#])
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        all.contains("rolled back"),
        "the removed key opened the vault: {all}"
    );
    assert!(!all.contains("\"is_error\":false"), "{all}");
    let out = v.cmd().arg("verify").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
}
