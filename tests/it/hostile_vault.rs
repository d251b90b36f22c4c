//! Regressions of issue 16's holes that a person who can write the vault
//! directory (but holds no key) could reach: settings, the key state and
//! the write-ahead log. Each test names what it pins; each failed before
//! the fix it pins.

use std::process::Command;

use serde_json::json;

use crate::util::*;

const GH_TOKEN: &str = "AKIAZ7QX3RBN2WLT4YHK";

fn git_out(v: &TestVault, args: &[&str]) -> String {
    String::from_utf8(git(&v.vault, args).stdout)
        .unwrap()
        .trim()
        .to_string()
}

/// Hole 5: anyone who could write `memvault/config.json` could turn
/// redaction off or let `create` overwrite. The settings now live in the
/// key state, sealed with the vault key; a planted settings file is
/// refused, with a sentence that says what to do, and changes nothing.
#[test]
fn planted_settings_file_is_refused_and_changes_nothing() {
    let v = TestVault::new();
    let r = v.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "first\n"}));
    assert!(!is_error(&r), "{r}");
    let commits = v.commits();
    let planted = v.vault.join("memvault/config.json");
    std::fs::write(
        &planted,
        r#"{"overwrite_on_create": true, "redaction": {"mode": "off"}, "max_files": 1}"#,
    )
    .unwrap();
    let input = format!(
        "{}\n",
        json!({"command": "create", "path": "/memories/b.md",
            "file_text": format!("token {GH_TOKEN}\n")})
    );
    let out = run_with_stdin(v.cmd().args(["serve", "--session", "x"]), input.as_bytes());
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("config.json") && err.contains("config set"),
        "{err}"
    );
    assert!(plaintext_anywhere(&v.vault, GH_TOKEN).is_empty());
    // Removed, the vault works again, with its own settings.
    std::fs::remove_file(&planted).unwrap();
    assert_eq!(v.commits(), commits);
    let r = v.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "second\n"}));
    assert!(is_error(&r), "create overwrote: {r}");
    ok(&v.cmd().arg("verify").output().unwrap());
    // Planted while the log holds records (a writer killed): refused
    // before the open moves them into git, so nothing at all changes.
    serve_then_kill(&v, &[create("/memories/c.md", "c\n")]);
    std::fs::write(&planted, "{}").unwrap();
    let before = vault_bytes(&v);
    let all = view_all(&v);
    assert!(all.contains("config.json"), "{all}");
    assert_eq!(
        vault_bytes(&v),
        before,
        "the refused open changed the vault"
    );
    std::fs::remove_file(&planted).unwrap();
    assert!(view_all(&v).contains("c.md"));
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
    // From what, to what: an auditor tells a filter turned off from one
    // turned on.
    assert!(first.contains(r#""redact" -> "reject""#), "{h}");
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
    // Values past what memvault is built for are refused too.
    for (key, value) in [
        ("max_file_bytes", "18446744073709551615"),
        ("max_line_bytes", "1073741825"),
        ("max_view_chars", "999999999999999"),
        ("expire_after_days", "4294967295"),
    ] {
        let out = v
            .cmd()
            .args(["config", "set", key, value])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{key} {value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("at most") && err.contains("nothing was changed"),
            "{err}"
        );
    }
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
    // Nor does `gc` run on it (it would delete the newer key state).
    let out = v.cmd().arg("gc").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("rolled back"));
    assert_eq!(
        git_out(&v, &["rev-parse", "refs/memvault/keys"]),
        with_both,
        "gc changed nothing"
    );
}

/// Format 8: a create logs its file key's shard alone; the key state that
/// takes it in is written by the checkpoint, which then starts the log
/// over. A key state rolled back to before that (its objects are still in
/// the repository until `gc`) is refused at open, as any rollback: with
/// format 7 the tip named the older state's counter, so the vault opened,
/// the new file's key was missing, and `gc` would have dropped the newer
/// key state for good.
#[test]
fn key_state_rolled_back_past_the_checkpoint_that_took_in_a_create_is_refused() {
    let v = TestVault::new();
    let r = v.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "first\n"}));
    assert!(!is_error(&r), "{r}");
    let before = git_out(&v, &["rev-parse", "refs/memvault/keys"]);
    let r = v.one(json!({"command": "create", "path": "/memories/b.md", "file_text": "second\n"}));
    assert!(!is_error(&r), "{r}");
    let after = git_out(&v, &["rev-parse", "refs/memvault/keys"]);
    assert_ne!(
        before, after,
        "the one-shot command checkpointed its create"
    );
    // The attacker points the key state back, and empties the log, whose
    // head names the newer one.
    git(&v.vault, &["update-ref", "refs/memvault/keys", &before]);
    std::fs::write(v.vault.join("memvault/wal"), b"").unwrap();
    for args in [
        vec!["exec", r#"{"command":"view","path":"/memories"}"#],
        vec!["gc"],
        vec!["verify"],
    ] {
        let out = v.cmd().args(&args).output().unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(1), "{args:?}: {all}");
        assert!(all.contains("rolled back"), "{args:?}: {all}");
        assert!(!all.contains("\"is_error\":false"), "{args:?}: {all}");
    }
    // Nothing changed: the newer key state is still there, and put back
    // it reads both files.
    assert_eq!(git_out(&v, &["rev-parse", "refs/memvault/keys"]), before);
    git(&v.vault, &["cat-file", "-e", &after]);
    git(&v.vault, &["update-ref", "refs/memvault/keys", &after]);
    for (path, want) in [("/memories/a.md", "first"), ("/memories/b.md", "second")] {
        let r = v.one(json!({"command": "view", "path": path}));
        assert!(!is_error(&r) && r.to_string().contains(want), "{r}");
    }
    ok(&v.cmd().arg("verify").output().unwrap());
}

/// A key-state ref set outside memvault to what the given key opens no
/// keyslot of, or removed, while the log's key state opens with it: said
/// as such, with the id to put back; a key that opens neither learns
/// nothing.
#[test]
fn a_key_ref_set_aside_to_what_the_key_does_not_open_says_so_and_how_to_put_it_back() {
    let v = TestVault::new();
    let r = v.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "first\n"}));
    assert!(!is_error(&r), "{r}");
    let keys = git_out(&v, &["rev-parse", "refs/memvault/keys"]);
    let main = git_out(&v, &["rev-parse", "refs/heads/main"]);
    let keys_file = v.vault.join("refs/memvault/keys");
    let run = |key: &std::path::Path| {
        let out = Command::new(bin())
            .arg("--vault")
            .arg(&v.vault)
            .arg("--key-file")
            .arg(key)
            .args(["exec", r#"{"command":"view","path":"/memories/a.md"}"#])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let other = v.tmp.path().join("other.key");
    keygen(&other);
    // The keys ref pointed at a commit that is not a key state, or removed.
    for value in [Some(format!("{main}\n")), None] {
        match &value {
            Some(v) => std::fs::write(&keys_file, v).unwrap(),
            None => std::fs::remove_file(&keys_file).unwrap(),
        }
        let (code, err) = run(&v.key);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("outside memvault"), "{err}");
        assert!(err.contains(&keys), "the log's key state is named: {err}");
        assert!(
            !err.contains("does not unlock"),
            "not a wrong secret: {err}"
        );
        // A wrong key learns nothing of the log's key state.
        let (code, err) = run(&other);
        assert_eq!(code, Some(1), "{err}");
        assert!(!err.contains(&keys), "{err}");
        assert!(!err.contains("outside memvault"), "{err}");
        // Put back as the message says.
        std::fs::write(&keys_file, format!("{keys}\n")).unwrap();
        let r = v.one(json!({"command": "view", "path": "/memories/a.md"}));
        assert!(!is_error(&r) && r.to_string().contains("first"), "{r}");
    }
    // A genuine older key state without the slot of the key given (one
    // added since): that key opens the log's state, not the ref's.
    let first = git_out(&v, &["rev-parse", "refs/memvault/keys"]);
    let out = v
        .cmd()
        .args(["key", "add", "--new-key-file"])
        .arg(&other)
        .output()
        .unwrap();
    ok(&out);
    let now = git_out(&v, &["rev-parse", "refs/memvault/keys"]);
    assert_ne!(first, now);
    std::fs::write(&keys_file, format!("{first}\n")).unwrap();
    let (code, err) = run(&other);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("outside memvault") && err.contains(&now),
        "{err}"
    );
    assert!(!err.contains("does not unlock"), "{err}");
    std::fs::write(&keys_file, format!("{now}\n")).unwrap();
    let (code, err) = run(&other);
    assert_eq!(code, Some(0), "{err}");
    ok(&v.cmd().arg("verify").output().unwrap());

    // The other way round: the log put back from a copy taken while the
    // other key's slot was there, after that slot was removed. The ref is
    // the newer state: the removed key is refused as any wrong secret,
    // with no advice to roll the ref back to the log's state.
    let snapshot = std::fs::read(v.vault.join("memvault/wal")).unwrap();
    let slot = String::from_utf8(v.cmd().args(["key", "list"]).output().unwrap().stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.contains("unlocked with"))
        .find_map(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap();
    ok(&v.cmd().args(["key", "remove", &slot]).output().unwrap());
    std::fs::write(v.vault.join("memvault/wal"), &snapshot).unwrap();
    let (code, err) = run(&other);
    assert_eq!(code, Some(1), "{err}");
    assert!(!err.contains("outside memvault"), "{err}");
    assert!(!err.contains("put the ref back"), "{err}");
    let (code, err) = run(&v.key);
    assert_eq!(code, Some(0), "{err}");
}

/// `gc` deletes what main does not reach: with main moved back to an
/// ancestor (the log emptied, so nothing says it was newer), the vault
/// still opens on the older state, but `gc` refuses to run against the
/// last verified head, deleting nothing; an altered mark is refused too.
#[test]
fn gc_refuses_a_main_moved_back_behind_the_last_verified_head() {
    let v = TestVault::new();
    for (name, text) in [("a", "first\n"), ("b", "second\n")] {
        let r = v.one(
            json!({"command": "create", "path": format!("/memories/{name}.md"), "file_text": text}),
        );
        assert!(!is_error(&r), "{r}");
    }
    ok(&v.cmd().arg("verify").output().unwrap());
    let newest = git_out(&v, &["rev-parse", "refs/heads/main"]);
    let older = git_out(&v, &["rev-parse", "refs/heads/main~1"]);
    git(&v.vault, &["update-ref", "refs/heads/main", &older]);
    std::fs::write(v.vault.join("memvault/wal"), b"").unwrap();
    let out = v.cmd().arg("gc").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("last verified head"), "{err}");
    git(&v.vault, &["cat-file", "-e", &newest]);
    // An altered mark: refused as well.
    let mark = v.vault.join("memvault/verified-head");
    let text = std::fs::read_to_string(&mark).unwrap();
    std::fs::write(&mark, text.replace(&newest, &older)).unwrap();
    let out = v.cmd().arg("gc").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("verified-head was altered"), "{err}");
    git(&v.vault, &["cat-file", "-e", &newest]);
    // Put back, gc runs and both files are there.
    std::fs::write(&mark, text).unwrap();
    git(&v.vault, &["update-ref", "refs/heads/main", &newest]);
    ok(&v.cmd().arg("gc").output().unwrap());
    for (path, want) in [("/memories/a.md", "first"), ("/memories/b.md", "second")] {
        let r = v.one(json!({"command": "view", "path": path}));
        assert!(!is_error(&r) && r.to_string().contains(want), "{r}");
    }
}

/// Run `serve` on `v`, send `requests`, wait for every reply, then kill it
/// with SIGKILL (so it cannot checkpoint): the log keeps the records.
fn serve_then_kill(v: &TestVault, requests: &[serde_json::Value]) {
    use std::io::{BufRead, Write};
    let (mut child, mut stdin, mut out) = live_serve(v, "log-test");
    for r in requests {
        writeln!(stdin, "{r}").unwrap();
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let reply: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert!(!is_error(&reply), "{reply}");
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A `serve` on `v` in session `session`: the process, its input, and its
/// output to read replies from.
fn live_serve(
    v: &TestVault,
    session: &str,
) -> (
    std::process::Child,
    std::process::ChildStdin,
    std::io::BufReader<std::process::ChildStdout>,
) {
    let mut child = v
        .cmd()
        .args(["serve", "--session", session])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    (child, stdin, out)
}

/// The byte ranges of the log's entries that check out: `(start, end)`,
/// the head first (entry: "MVWL" kind len:u32le body sha1:20).
fn log_entries(wal: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 29 <= wal.len() && &wal[pos..pos + 4] == b"MVWL" {
        let len = u32::from_le_bytes(wal[pos + 5..pos + 9].try_into().unwrap()) as usize;
        let end = pos + 9 + len + 20;
        if end > wal.len() {
            break;
        }
        out.push((pos, end));
        pos = end;
    }
    out
}

fn create(path: &str, text: &str) -> serde_json::Value {
    json!({"command": "create", "path": path, "file_text": text})
}

fn view_all(v: &TestVault) -> String {
    let out = v
        .cmd()
        .args(["exec", r#"{"command":"view","path":"/memories"}"#])
        .output()
        .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Hole 6: a genuine earlier record of the log appended again after the
/// last one moved main back to where that record left it, silently
/// dropping every acknowledged write after it. Records now name the tail
/// they build on: the replay is refused as damage.
#[test]
fn a_replayed_log_record_is_refused() {
    let v = TestVault::new();
    serve_then_kill(
        &v,
        &[
            create("/memories/a.md", "one\n"),
            create("/memories/b.md", "two\n"),
            create("/memories/c.md", "three\n"),
        ],
    );
    let path = v.vault.join("memvault/wal");
    let mut wal = std::fs::read(&path).unwrap();
    let entries = log_entries(&wal);
    assert_eq!(entries.len(), 4, "a head and three records");
    let (s, e) = entries[1];
    let first = wal[s..e].to_vec();
    let end = entries[3].1;
    wal.splice(end..end + first.len(), first);
    std::fs::write(&path, &wal).unwrap();
    let all = view_all(&v);
    assert!(all.contains("replayed"), "{all}");
    assert!(!all.contains("\"is_error\":false"), "{all}");
}

/// Hole 6: a log copied from another vault replaced this vault's own
/// (and with it the writes it had not yet checkpointed). Its entries are
/// not tagged with this vault's key: refused as damage.
#[test]
fn a_log_copied_from_another_vault_is_refused() {
    let v = TestVault::new();
    let other = TestVault::new();
    serve_then_kill(&v, &[create("/memories/mine.md", "mine\n")]);
    serve_then_kill(&other, &[create("/memories/theirs.md", "theirs\n")]);
    std::fs::copy(
        other.vault.join("memvault/wal"),
        v.vault.join("memvault/wal"),
    )
    .unwrap();
    let all = view_all(&v);
    assert!(all.contains("not written with this vault's key"), "{all}");
    assert!(!all.contains("theirs"), "{all}");
}

/// Hole 6: a log of format 1 (untagged) put in place of a format-2
/// vault's log could carry any ref move; it is refused, never replayed.
#[test]
fn an_untagged_log_in_a_format_2_vault_is_refused() {
    let v = TestVault::new();
    serve_then_kill(&v, &[create("/memories/a.md", "one\n")]);
    let path = v.vault.join("memvault/wal");
    let mut wal = std::fs::read(&path).unwrap();
    let (s, e) = log_entries(&wal)[0];
    // Rewrite the head as format 1: kind 1, the tag dropped, checksum anew.
    let body = wal[s + 9..e - 20 - 32].to_vec();
    let mut head = b"MVWL\x01".to_vec();
    head.extend_from_slice(&(body.len() as u32).to_le_bytes());
    head.extend_from_slice(&body);
    // The checksum is the git blob hash of the entry before it.
    let sum = {
        let mut c = Command::new("git");
        c.args(["hash-object", "--stdin"]);
        let out = run_with_stdin(&mut c, &head);
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let sum = (0..20)
        .map(|i| u8::from_str_radix(&sum[2 * i..2 * i + 2], 16).unwrap())
        .collect::<Vec<u8>>();
    head.extend_from_slice(&sum);
    wal.splice(s..e, head);
    std::fs::write(&path, &wal).unwrap();
    let all = view_all(&v);
    assert!(all.contains("untagged head"), "{all}");
}

/// Hole 6: the log's reader refuses an entry over its limit, but the
/// writer never checked it: an import or a directory rename whose record
/// passed it was acknowledged, then lost at the next checkpoint. Now it is
/// refused before anything is written. (`MEMVAULT_TEST_MAX_RECORD`, in
/// test-hooks builds, lowers the 1 GiB limit so a test can reach it.)
#[cfg(feature = "test-hooks")]
#[test]
fn a_change_too_large_for_one_log_record_is_refused_before_it_is_acknowledged() {
    let v = TestVault::new();
    let limit = "65536";
    let src = v.tmp.path().join("import/memories");
    std::fs::create_dir_all(src.join("big")).unwrap();
    for i in 0..10 {
        std::fs::write(src.join(format!("big/f{i}.md")), "x".repeat(10_000)).unwrap();
    }
    let commits = v.commits();
    let out = v
        .cmd()
        .env("MEMVAULT_TEST_MAX_RECORD", limit)
        .args(["import"])
        .arg(v.tmp.path().join("import"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("over the limit"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(v.commits(), commits, "nothing was committed");
    // Files written one by one fit; renaming their directory at once
    // does not, and is refused as a tool error, changing nothing.
    let mut lines = Vec::new();
    for i in 0..10 {
        lines.push(create(&format!("/memories/big/f{i}.md"), &"y".repeat(10_000)).to_string());
    }
    lines.push(
        json!({"command": "rename", "old_path": "/memories/big", "new_path": "/memories/moved"})
            .to_string(),
    );
    let input = lines.join("\n") + "\n";
    let out = run_with_stdin(
        v.cmd()
            .env("MEMVAULT_TEST_MAX_RECORD", limit)
            .args(["serve", "--session", "big"]),
        input.as_bytes(),
    );
    let replies = parse_lines(&out.stdout);
    assert_eq!(replies.len(), 11);
    assert!(replies[..10].iter().all(|r| !is_error(r)), "{replies:?}");
    assert!(is_error(&replies[10]), "{}", replies[10]);
    assert!(
        text(&replies[10]).contains("over the limit"),
        "{}",
        replies[10]
    );
    // Everything acknowledged is there, with the limit still in force.
    let r = v
        .cmd()
        .env("MEMVAULT_TEST_MAX_RECORD", limit)
        .arg("verify")
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stdout));
    let r = v.one(json!({"command": "view", "path": "/memories/big/f9.md"}));
    assert!(text(&r).contains("yyyy"), "{r}");
}

/// Run `args` on the vault, killed after 20 s: (exit code, stderr).
fn bounded(v: &TestVault, args: &[&str]) -> (Option<i32>, String) {
    let mut child = v
        .cmd()
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
            return (status.code(), err);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} hung");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The git config and HEAD, which libgit2 reads at every open, are
/// memvault's: a setting it never writes (a reflog turned on beside a
/// planted `logs` link, an include), a FIFO or link in their place, is
/// refused before libgit2 reads them; nothing outside is written and no
/// command hangs.
#[test]
fn a_git_config_or_head_changed_outside_memvault_is_refused_before_git_reads_it() {
    let v = TestVault::new();
    let r = v.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "first\n"}));
    assert!(!is_error(&r), "{r}");
    let config = v.vault.join("config");
    let genuine = std::fs::read(&config).unwrap();
    let victim = v.tmp.path().join("victim");
    std::fs::write(&victim, "untouched\n").unwrap();
    let view = r#"{"command":"view","path":"/memories/a.md"}"#;
    let create = r#"{"command":"create","path":"/memories/b.md","file_text":"b\n"}"#;
    // A reflog turned on, its file a link to one outside.
    let mut on = genuine.clone();
    on.extend_from_slice(b"[core]\n\tlogAllRefUpdates = true\n");
    std::fs::write(&config, &on).unwrap();
    std::fs::create_dir_all(v.vault.join("logs/refs/heads")).unwrap();
    std::os::unix::fs::symlink(&victim, v.vault.join("logs/refs/heads/main")).unwrap();
    for args in [vec!["exec", create], vec!["verify"], vec!["gc"]] {
        let (code, err) = bounded(&v, &args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(err.contains("core.logallrefupdates"), "{args:?}: {err}");
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched\n");
    std::fs::remove_dir_all(v.vault.join("logs")).unwrap();
    // An include of another file (here a FIFO: reading it would hang).
    let fifo = v.tmp.path().join("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let mut inc = genuine.clone();
    inc.extend_from_slice(format!("[include]\n\tpath = {}\n", fifo.display()).as_bytes());
    std::fs::write(&config, &inc).unwrap();
    let (code, err) = bounded(&v, &["exec", view]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("include.path"), "{err}");
    // A FIFO, or a link, as the config or HEAD itself.
    std::fs::remove_file(&config).unwrap();
    assert!(
        Command::new("mkfifo")
            .arg(&config)
            .status()
            .unwrap()
            .success()
    );
    let (code, err) = bounded(&v, &["exec", view]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("config is not a regular file"), "{err}");
    std::fs::remove_file(&config).unwrap();
    std::fs::write(&config, &genuine).unwrap();
    let head = v.vault.join("HEAD");
    let head_bytes = std::fs::read(&head).unwrap();
    let outside_head = v.tmp.path().join("HEAD");
    std::fs::write(&outside_head, &head_bytes).unwrap();
    std::fs::remove_file(&head).unwrap();
    std::os::unix::fs::symlink(&outside_head, &head).unwrap();
    let (code, err) = bounded(&v, &["exec", view]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("HEAD is a symbolic link"), "{err}");
    std::fs::remove_file(&head).unwrap();
    std::fs::write(&head, &head_bytes).unwrap();
    // Put back: everything reads.
    let r = v.one(json!({"command": "view", "path": "/memories/a.md"}));
    assert!(!is_error(&r) && r.to_string().contains("first"), "{r}");
    ok(&v.cmd().arg("verify").output().unwrap());
}

/// A link put in place of a folder while a `serve` runs: its checkpoint
/// (at close) refuses to write through it, the outside copy is left as it
/// was, and every acknowledged write is there once the folder is back.
#[test]
fn a_link_planted_under_a_running_serve_is_not_written_through() {
    let v = TestVault::new();
    let mut serve = Writer::start(&v, "links");
    let create = |i: usize| json!({"command": "create", "path": format!("/memories/n{i}.md"), "file_text": format!("note {i}\n")});
    for i in 0..3 {
        serve.send(&create(i));
    }
    // refs/heads moved aside, a link to a copy outside in its place.
    let heads = v.vault.join("refs/heads");
    let aside = v.vault.join("refs/heads.aside");
    let outside = v.tmp.path().join("outside-heads");
    std::fs::rename(&heads, &aside).unwrap();
    assert!(
        Command::new("cp")
            .arg("-a")
            .arg(&aside)
            .arg(&outside)
            .status()
            .unwrap()
            .success()
    );
    let before = std::fs::read(outside.join("main")).unwrap();
    std::os::unix::fs::symlink(&outside, &heads).unwrap();
    for i in 3..6 {
        serve.send(&create(i));
    }
    // Its checkpoint at close fails (the link); the log keeps the records.
    let _ = serve.finish();
    assert_eq!(
        std::fs::read(outside.join("main")).unwrap(),
        before,
        "written through the link"
    );
    std::fs::remove_file(&heads).unwrap();
    std::fs::rename(&aside, &heads).unwrap();
    for i in 0..6 {
        let r = v.one(json!({"command": "view", "path": format!("/memories/n{i}.md")}));
        assert!(
            !is_error(&r) && r.to_string().contains(&format!("note {i}")),
            "{r}"
        );
    }
    ok(&v.cmd().arg("verify").output().unwrap());
}

/// A log and a key ref put back from an older copy of the vault, beside a
/// main written since under a new data-key epoch: every command refuses,
/// and the refusal's "nothing was changed" holds (the opening checkpoint
/// used to reset the log before the damage was seen). Put the key ref
/// back and everything reads again.
#[test]
fn a_log_and_key_ref_put_back_from_a_copy_are_refused_and_left_as_they_are() {
    let v = TestVault::new();
    v.one(create("/memories/a.md", "one\n"));
    let old = v.tmp.path().join("old");
    copy_dir(&v.vault, &old);
    v.one(create("/memories/b.md", "two\n"));
    ok(&v.cmd().arg("rekey").output().unwrap());
    v.one(create("/memories/c.md", "three\n"));
    let keys_ref = std::fs::read(v.vault.join("refs/memvault/keys")).unwrap();
    for f in ["memvault/wal", "refs/memvault/keys"] {
        std::fs::copy(old.join(f), v.vault.join(f)).unwrap();
    }
    let wal = std::fs::read(v.vault.join("memvault/wal")).unwrap();
    for args in [
        &["exec", r#"{"command":"view","path":"/memories"}"#][..],
        &[
            "exec",
            r#"{"command":"create","path":"/memories/d.md","file_text":"d"}"#,
        ],
        &["history"],
        &["gc"],
    ] {
        let out = v.cmd().args(args).output().unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(all.contains("damaged"), "{args:?}: {all}");
        assert!(!all.contains("\"is_error\":false"), "{all}");
        assert!(
            std::fs::read(v.vault.join("memvault/wal")).unwrap() == wal,
            "{args:?} changed the log"
        );
    }
    std::fs::write(v.vault.join("refs/memvault/keys"), keys_ref).unwrap();
    let listing = view_all(&v);
    for f in ["a.md", "b.md", "c.md"] {
        assert!(listing.contains(f), "{listing}");
    }
    ok(&v.cmd().arg("verify").output().unwrap());
}

/// That `what` changed no file of the vault (the names that differ).
fn assert_unchanged(
    before: &std::collections::BTreeMap<String, Vec<u8>>,
    after: &std::collections::BTreeMap<String, Vec<u8>>,
    what: &str,
) {
    let changed: Vec<&String> = before
        .keys()
        .chain(after.keys())
        .filter(|k| before.get(*k) != after.get(*k))
        .collect();
    assert!(changed.is_empty(), "{what} changed {changed:?}");
}

/// Every file under the vault with its bytes, to see that nothing changed.
fn vault_bytes(v: &TestVault) -> std::collections::BTreeMap<String, Vec<u8>> {
    fn walk(
        dir: &std::path::Path,
        base: &std::path::Path,
        out: &mut std::collections::BTreeMap<String, Vec<u8>>,
    ) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, base, out);
            } else {
                let rel = p.strip_prefix(base).unwrap().display().to_string();
                out.insert(rel, std::fs::read(&p).unwrap_or_default());
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(&v.vault, &v.vault, &mut out);
    // The writer lock's file may be made by a command; it holds nothing.
    out.remove("memvault/lock");
    out
}

/// One byte of the log changed in a record that intact records follow
/// (a disk's damage, not a crash: a crash tears only the last record) is
/// refused as damage, naming where, with nothing changed, by every
/// command; not read as the log's end, which dropped the acknowledged
/// changes after it for good at the next checkpoint while `verify` said
/// ok. The same for a damaged head. The cut the message offers keeps the
/// changes before the damage.
#[test]
fn a_log_damaged_in_the_middle_is_refused_not_cut_short() {
    let names: Vec<String> = (0..5).map(|i| format!("/memories/p{i}.md")).collect();
    for (target, zeroed) in [(2usize, false), (0, false), (3, true), (0, true)] {
        let v = TestVault::new();
        let requests: Vec<_> = names.iter().map(|n| create(n, "text\n")).collect();
        serve_then_kill(&v, &requests);
        let path = v.vault.join("memvault/wal");
        let mut wal = std::fs::read(&path).unwrap();
        let entries = log_entries(&wal);
        assert_eq!(entries.len(), 6, "a head and five records");
        let (s, e) = entries[target];
        if zeroed {
            // A lost block reads as zeros.
            wal[s..(s + 64).min(e)].fill(0);
        } else {
            wal[(s + e) / 2] ^= 0x20;
        }
        std::fs::write(&path, &wal).unwrap();
        let before = vault_bytes(&v);
        for args in [
            vec!["exec", r#"{"command":"view","path":"/memories"}"#],
            vec!["verify"],
            vec!["history"],
            vec!["gc"],
        ] {
            let out = v.cmd().args(&args).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            let all = format!("{}{err}", String::from_utf8_lossy(&out.stdout));
            assert!(!out.status.success(), "{args:?}: {all}");
            assert!(
                all.contains("damaged") && all.contains(&format!("truncate -s {s} memvault/wal")),
                "{args:?}: {all}"
            );
            assert!(!all.contains("p1.md"), "{args:?}: {all}");
            assert_unchanged(&before, &vault_bytes(&v), &format!("{args:?}"));
        }
        // The cut the message offers: the changes before the damage stay.
        std::fs::write(&path, &wal[..s]).unwrap();
        let all = view_all(&v);
        let kept = target.saturating_sub(1);
        for (i, n) in names.iter().enumerate() {
            let name = n.trim_start_matches("/memories/");
            assert_eq!(all.contains(name), i < kept, "{name}: {all}");
        }
        let out = v.cmd().arg("verify").output().unwrap();
        assert!(out.status.success(), "{out:?}");
    }
}

/// Main set back outside memvault under a running `serve` (with records
/// of its own in the log): its writes were refused as a rollback, while
/// its views answered from the state main was set back to, listing none
/// of the files written since. Views are refused too now, until the ref
/// is put back; then everything acknowledged is there.
#[test]
fn a_running_serve_refuses_views_as_writes_once_main_is_set_back() {
    use std::io::{BufRead, Write};
    let v = TestVault::new();
    for n in ["a", "b", "c"] {
        let r = v.one(create(&format!("/memories/{n}.md"), "old\n"));
        assert!(!is_error(&r), "{r}");
    }
    let (mut child, mut stdin, mut out) = live_serve(&v, "live");
    let mut ask = |r: serde_json::Value| -> serde_json::Value {
        writeln!(stdin, "{r}").unwrap();
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    };
    for i in 0..3 {
        let r = ask(create(&format!("/memories/p{i}.md"), "new\n"));
        assert!(!is_error(&r), "{r}");
    }
    let back = git_out(&v, &["rev-parse", "main~2"]);
    let now = git_out(&v, &["rev-parse", "main"]);
    std::fs::write(v.vault.join("refs/heads/main"), format!("{back}\n")).unwrap();
    let r = ask(create("/memories/q.md", "x\n"));
    assert!(is_error(&r) && r.to_string().contains("rollback"), "{r}");
    for path in ["/memories", "/memories/p1.md", "/memories/a.md"] {
        let r = ask(json!({"command": "view", "path": path}));
        assert!(is_error(&r), "{path}: {r}");
        assert!(r.to_string().contains("damaged"), "{path}: {r}");
    }
    // Put back: everything acknowledged is there.
    std::fs::write(v.vault.join("refs/heads/main"), format!("{now}\n")).unwrap();
    let r = ask(json!({"command": "view", "path": "/memories"}));
    let listing = r.to_string();
    for n in ["a.md", "b.md", "c.md", "p0.md", "p1.md", "p2.md"] {
        assert!(listing.contains(n), "{n}: {listing}");
    }
    drop(stdin);
    child.wait().unwrap();
    let out = v.cmd().arg("verify").output().unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// A write that waits for the writer lock looks at the ref files again
/// once it has the lock: main set back during the wait (the holder
/// leaving the log as it was) is refused as a rollback, not written over
/// (round 33b: the look made before the wait was trusted).
#[test]
fn a_ref_set_back_while_a_write_waits_for_the_lock_is_refused() {
    use std::io::{BufRead, Write};
    let v = TestVault::new();
    for n in ["a", "b", "c"] {
        let r = v.one(create(&format!("/memories/{n}.md"), "old\n"));
        assert!(!is_error(&r), "{r}");
    }
    let (mut child, mut stdin, mut out) = live_serve(&v, "live");
    let mut read = || -> serde_json::Value {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    };
    writeln!(stdin, "{}", create("/memories/p.md", "new\n")).unwrap();
    assert!(!is_error(&read()));
    let now = git_out(&v, &["rev-parse", "main"]);
    let back = git_out(&v, &["rev-parse", "main~2"]);
    // Another process holds the lock; the write comes and waits.
    let lock = std::fs::File::open(v.vault.join("memvault/lock")).unwrap();
    lock.lock().unwrap();
    writeln!(stdin, "{}", create("/memories/q.md", "x\n")).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(400));
    std::fs::write(v.vault.join("refs/heads/main"), format!("{back}\n")).unwrap();
    lock.unlock().unwrap();
    let r = read();
    assert!(is_error(&r) && r.to_string().contains("rollback"), "{r}");
    // Put back: everything acknowledged is there, and q.md was not made.
    std::fs::write(v.vault.join("refs/heads/main"), format!("{now}\n")).unwrap();
    writeln!(stdin, "{}", json!({"command": "view", "path": "/memories"})).unwrap();
    let listing = read().to_string();
    for n in ["a.md", "b.md", "c.md", "p.md"] {
        assert!(listing.contains(n), "{n}: {listing}");
    }
    assert!(!listing.contains("q.md"), "{listing}");
    drop(stdin);
    child.wait().unwrap();
    let out = v.cmd().arg("verify").output().unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// A format file that is there but names no format is damage, said as
/// such: not "no memvault/format file".
#[test]
fn a_garbled_format_file_is_named_as_such() {
    let v = TestVault::new();
    let format = v.vault.join("memvault/format");
    for text in [
        &b""[..],
        b"garbage\n",
        b"memvault vault format x\n",
        b"memvault vault format 9\n\xff",
    ] {
        std::fs::write(&format, text).unwrap();
        let all = view_all(&v);
        assert!(
            all.contains("memvault/format file does not name a format")
                && !all.contains("no memvault/format file"),
            "{text:?}: {all}"
        );
    }
    // A sparse file of 30 GiB: refused from its size, nothing read.
    let f = std::fs::File::create(&format).unwrap();
    f.set_len(30 << 30).unwrap();
    drop(f);
    let all = view_all(&v);
    assert!(
        all.contains("memvault/format file does not name a format"),
        "{all}"
    );
}

/// memvault's own state files are read only up to a size it could have
/// written: a large sparse file planted in their place is refused from
/// its size, not read whole into memory (under a 1 GiB address-space
/// limit, reading it failed for want of memory), and a command that does
/// not need the file still runs.
/// The binary on `v` running `command`, its address space limited to a
/// GiB (a file read whole past that fails).
fn within_a_gib(v: &TestVault, command: &str) -> Command {
    let mut c = Command::new("sh");
    c.arg("-c").arg(format!(
        "ulimit -v 1048576; exec '{}' --vault '{}' --key-file '{}' {command}",
        bin(),
        v.vault.display(),
        v.key.display()
    ));
    c
}

#[test]
fn a_state_file_planted_past_any_size_memvault_writes_is_not_read_whole() {
    let v = TestVault::new();
    let r = v.one(
        serde_json::json!({"command": "create", "path": "/memories/a.md", "file_text": "a\n"}),
    );
    assert_eq!(r["is_error"], false, "{r}");
    for name in [
        "machine",
        "last-slot",
        "access",
        "erase-pending",
        "keys-garbage",
    ] {
        let path = v.vault.join("memvault").join(name);
        let saved = std::fs::read(&path).ok();
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(3 << 30).unwrap();
        drop(f);
        let out = within_a_gib(&v, "serve")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                let mut stdin = child.stdin.take().unwrap();
                writeln!(
                    stdin,
                    r#"{{"command":"create","path":"/memories/{name}.md","file_text":"x\n"}}"#
                )?;
                writeln!(stdin, r#"{{"command":"view","path":"/memories/a.md"}}"#)?;
                drop(stdin);
                child.wait_with_output()
            })
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).lines().count(),
            2,
            "{name}: {text}"
        );
        assert!(!text.contains("out of memory"), "{name}: {text}");
        match saved {
            Some(bytes) => std::fs::write(&path, bytes).unwrap(),
            None => std::fs::remove_file(&path).unwrap(),
        }
    }
    assert!(
        String::from_utf8_lossy(&v.cmd().arg("verify").output().unwrap().stdout).starts_with("ok:")
    );
    // A marker that does not open is damage verify reports (writes are
    // refused meanwhile).
    std::fs::write(v.vault.join("memvault/erase-pending"), b"planted").unwrap();
    let out = v.cmd().arg("verify").output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("memvault/erase-pending does not open"),
        "{said}"
    );
}

/// Main removed outside memvault while the log holds acknowledged
/// changes: taken as gone, the vault read as empty, a write was
/// acknowledged on it, and the changes in the log were lost for good even
/// once the ref was put back. Refused now, nothing changed, until it is
/// put back; then everything acknowledged is there.
#[test]
fn a_main_removed_outside_memvault_is_refused_until_put_back() {
    let v = TestVault::new();
    let before_ref = std::fs::read(v.vault.join("refs/heads/main")).unwrap();
    serve_then_kill(
        &v,
        &[
            create("/memories/a.md", "one\n"),
            create("/memories/b.md", "two\n"),
        ],
    );
    std::fs::remove_file(v.vault.join("refs/heads/main")).unwrap();
    let before = vault_bytes(&v);
    let out = v
        .cmd()
        .args([
            "exec",
            r#"{"command":"create","path":"/memories/z.md","file_text":"z\n"}"#,
        ])
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success() && all.contains("removed outside memvault"),
        "{all}"
    );
    let all = view_all(&v);
    assert!(all.contains("removed outside memvault"), "{all}");
    assert_unchanged(&before, &vault_bytes(&v), "the refusal");
    std::fs::write(v.vault.join("refs/heads/main"), &before_ref).unwrap();
    let all = view_all(&v);
    assert!(all.contains("a.md") && all.contains("b.md"), "{all}");
    let out = v.cmd().arg("verify").output().unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// A ref's loose file (or `packed-refs`) planted as a huge sparse file is
/// refused from its size before libgit2 reads it whole (a GiB of memory
/// and seconds at every open), naming the file; put back, all is there.
#[test]
fn a_ref_file_planted_past_any_size_memvault_writes_is_refused_unread() {
    let v = TestVault::new();
    let r = v.one(
        serde_json::json!({"command": "create", "path": "/memories/a.md", "file_text": "a\n"}),
    );
    assert_eq!(r["is_error"], false, "{r}");
    for name in ["refs/heads/main", "refs/memvault/keys", "packed-refs"] {
        let path = v.vault.join(name);
        let saved = std::fs::read(&path).ok();
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(2 << 30).unwrap();
        drop(f);
        let out = within_a_gib(&v, "verify").output().unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(1), "{name}: {said}");
        assert!(
            said.contains(&format!("{name} is larger than memvault ever writes it")),
            "{name}: {said}"
        );
        match saved {
            Some(bytes) => std::fs::write(&path, bytes).unwrap(),
            None => std::fs::remove_file(&path).unwrap(),
        }
    }
    let r = v.one(serde_json::json!({"command": "view", "path": "/memories/a.md"}));
    assert_eq!(r["is_error"], false, "{r}");
}

/// Round 41d: `memvault/keys-garbage` (the key states an erasure replaced,
/// for its prune) is a plain file. Main's commits listed in it made a
/// purge delete them, loose, for good: every later write was refused as
/// damage. Now only key-state commits of this vault (its MAC, a key-state
/// header) and what they alone reach are pruned.
#[test]
fn a_planted_garbage_list_does_not_make_an_erasure_delete_history() {
    let t = TestVault::new();
    for i in 0..3 {
        let r = t.one(json!({"command": "create", "path": format!("/memories/n{i}.md"), "file_text": format!("note {i}\n")}));
        assert!(!is_error(&r), "{r}");
    }
    let out = git(&t.vault, &["rev-list", "refs/heads/main"]);
    assert!(out.status.success());
    let main_commits = String::from_utf8(out.stdout).unwrap();
    assert!(main_commits.lines().count() >= 4, "{main_commits}");
    std::fs::write(t.vault.join("memvault/keys-garbage"), &main_commits).unwrap();
    let out = t.cmd().args(["purge", "/memories/n2.md"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for id in main_commits.lines() {
        let o = git(&t.vault, &["cat-file", "-e", id]);
        assert!(o.status.success(), "main's commit {id} was deleted");
    }
    let out = t.cmd().arg("verify").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let r =
        t.one(json!({"command": "create", "path": "/memories/after.md", "file_text": "after\n"}));
    assert!(!is_error(&r), "{r}");
    let r = t.one(json!({"command": "view", "path": "/memories/n0.md"}));
    assert!(text(&r).contains("note 0"), "{r}");
}

/// Round 41d: a `commondir` file planted in the vault made libgit2 read
/// and write the refs in the directory it names (another vault's refs
/// were read; a FIFO there hung every command). Refused at open, nothing
/// read or written elsewhere.
#[test]
fn a_planted_commondir_or_gitdir_is_refused() {
    let t = TestVault::new();
    let r = t.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "a\n"}));
    assert!(!is_error(&r), "{r}");
    let elsewhere = t.tmp.path().join("elsewhere");
    copy_dir(&t.vault, &elsewhere);
    for name in ["commondir", "gitdir"] {
        std::fs::write(t.vault.join(name), format!("{}\n", elsewhere.display())).unwrap();
        for args in [
            &["exec", r#"{"command":"view","path":"/memories/a.md"}"#][..],
            &[
                "exec",
                r#"{"command":"create","path":"/memories/b.md","file_text":"b"}"#,
            ][..],
            &["verify"][..],
        ] {
            let out = run_bounded(t.cmd().args(args), "", std::time::Duration::from_secs(60))
                .expect("ended");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{name} {args:?}: {err}");
            assert!(
                err.contains(name) && err.contains("remove it"),
                "{name} {args:?}: {err}"
            );
        }
        std::fs::remove_file(t.vault.join(name)).unwrap();
    }
    let main_there = git(&elsewhere, &["rev-parse", "refs/heads/main"]).stdout;
    let main_here = git(&t.vault, &["rev-parse", "refs/heads/main"]).stdout;
    assert_eq!(main_there, main_here, "nothing was written elsewhere");
    let r = t.one(json!({"command": "view", "path": "/memories"}));
    assert!(!text(&r).contains("b.md"), "{r}");
    assert!(t.cmd().arg("verify").output().unwrap().status.success());
}
