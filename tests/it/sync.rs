//! Sync through a git remote (a bare repository on a path here; SSH and
//! smart HTTP in `sync_net`): clone, push, pull, merge rules, and a remote
//! that lies.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

use crate::util::*;

pub const MARK: &str = "SYNCMARK";

/// One machine's copy of a vault (all share one key file).
pub struct Machine {
    pub dir: PathBuf,
    pub key: PathBuf,
    /// Environment for git (e.g. `GIT_SSH_COMMAND`).
    pub env: Vec<(String, String)>,
}

impl Machine {
    pub fn new(dir: PathBuf, key: PathBuf) -> Machine {
        Machine {
            dir,
            key,
            env: Vec::new(),
        }
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new(bin());
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c.arg("--vault")
            .arg(&self.dir)
            .arg("--key-file")
            .arg(&self.key);
        for v in [
            "MEMVAULT_DIR",
            "MEMVAULT_KEY_FILE",
            "MEMVAULT_PASSPHRASE",
            "MEMVAULT_SESSION",
            "MEMVAULT_ACTOR",
        ] {
            c.env_remove(v);
        }
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().unwrap()
    }

    /// Run a command that must succeed; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "memvault {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Run a command that must fail with `code`; its stderr.
    pub fn fails(&self, args: &[&str], code: i32) -> String {
        let out = self.run(args);
        assert_eq!(
            out.status.code(),
            Some(code),
            "memvault {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stderr).unwrap()
    }

    pub fn exec(&self, cmd: Value) -> Value {
        let out = self
            .cmd()
            .arg("exec")
            .arg(cmd.to_string())
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v
    }

    pub fn write(&self, path: &str, text: &str) {
        let r = self.exec(json!({"command": "create", "path": path, "file_text": text}));
        assert!(!is_error(&r), "{r}");
    }

    pub fn edit(&self, path: &str, old: &str, new: &str) {
        let r = self
            .exec(json!({"command": "str_replace", "path": path, "old_str": old, "new_str": new}));
        assert!(!is_error(&r), "{r}");
    }

    /// The file's content (None: it does not exist).
    pub fn read(&self, path: &str) -> Option<String> {
        let rel = path.strip_prefix("/memories/").unwrap();
        self.files()
            .into_iter()
            .find(|(p, _)| p == rel || p.strip_prefix("memories/") == Some(rel))
            .map(|(_, text)| text)
    }

    /// Every file's path and content, through `export`.
    pub fn files(&self) -> Vec<(String, String)> {
        let to = self.dir.with_extension(format!("export-{}", rand_suffix()));
        self.ok(&["export", to.to_str().unwrap()]);
        let mut out = Vec::new();
        let mut stack = vec![to.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let e = e.unwrap();
                if e.file_type().unwrap().is_dir() {
                    stack.push(e.path());
                } else {
                    let rel = e
                        .path()
                        .strip_prefix(&to)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned();
                    out.push((rel, std::fs::read_to_string(e.path()).unwrap()));
                }
            }
        }
        std::fs::remove_dir_all(&to).unwrap();
        out.sort();
        out
    }
}

fn rand_suffix() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A vault (machine "a") with a bare repository as its `origin`, pushed;
/// and `n` more machines cloned from it.
pub struct World {
    pub _v: TestVault,
    pub hub: PathBuf,
    pub machines: Vec<Machine>,
}

pub fn world_with(url_of: impl Fn(&Path) -> String, env: &[(String, String)], n: usize) -> World {
    let v = TestVault::new();
    let hub = v.tmp.path().join("hub.git");
    let out = Command::new("git")
        .args(["init", "-q", "--bare"])
        .arg(&hub)
        .output()
        .unwrap();
    assert!(out.status.success());
    let mut a = Machine::new(v.vault.clone(), v.key.clone());
    a.env = env.to_vec();
    let url = url_of(&hub);
    a.ok(&["remote", "add", "origin", &url]);
    a.write(
        "/memories/notes.md",
        &format!("{MARK} one\ntwo\nthree\nfour\nfive\n"),
    );
    a.ok(&["push"]);
    let mut machines = vec![a];
    for i in 1..=n {
        let mut m = Machine::new(v.tmp.path().join(format!("machine{i}")), v.key.clone());
        m.env = env.to_vec();
        m.ok(&["clone", &url]);
        machines.push(m);
    }
    World {
        _v: v,
        hub,
        machines,
    }
}

pub fn world(n: usize) -> World {
    world_with(|p| p.to_str().unwrap().to_string(), &[], n)
}

#[test]
fn a_clone_reads_what_was_pushed_and_pulls_bring_later_changes_with_nothing_readable_on_the_remote()
{
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    assert_eq!(a.files(), b.files());
    assert_eq!(
        b.ok(&["remote", "list"]).trim(),
        format!("origin\t{}", w.hub.display())
    );
    b.write("/memories/from-b.md", &format!("{MARK} written on b\n"));
    b.edit("/memories/notes.md", "two", "TWO");
    let pushed = b.ok(&["push"]);
    assert!(pushed.contains("pushed 2 commits to origin"), "{pushed}");
    let pulled = a.ok(&["pull"]);
    assert!(
        pulled.starts_with("fast-forward: 2 new commits"),
        "{pulled}"
    );
    // The two files the fast-forward changed here, counted.
    assert!(pulled.contains("2 files changed here"), "{pulled}");
    assert_eq!(a.files(), b.files());
    assert_eq!(
        a.read("/memories/from-b.md").unwrap(),
        format!("{MARK} written on b\n")
    );
    // Nothing pushed is readable on the remote.
    assert_eq!(plaintext_anywhere(&w.hub, MARK), Vec::<String>::new());
    assert_eq!(
        plaintext_anywhere(&w.hub, "written on b"),
        Vec::<String>::new()
    );
    // Pull again: nothing to do; push: nothing to send.
    assert!(a.ok(&["pull"]).contains("up to date"));
    assert!(a.ok(&["push"]).contains("nothing pushed"));
    a.ok(&["verify"]);
    b.ok(&["verify"]);
}

#[test]
fn disjoint_changes_on_two_machines_are_both_kept() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    a.write("/memories/a/only-a.md", "from a\n");
    b.write("/memories/b/only-b.md", "from b\n");
    b.ok(&["sync"]);
    let out = a.ok(&["sync"]);
    assert!(out.contains("merged: 1 new commit from origin"), "{out}");
    b.ok(&["sync"]);
    assert_eq!(a.files(), b.files());
    assert_eq!(a.read("/memories/b/only-b.md").unwrap(), "from b\n");
    assert_eq!(b.read("/memories/a/only-a.md").unwrap(), "from a\n");
    // The merge is one commit with two parents that history shows, then
    // what it brought in, each change naming the machine it was made on.
    b.ok(&["machine", "--name", "laptop"]);
    b.write("/memories/b/named.md", "from the laptop\n");
    a.write("/memories/a/again.md", "again\n");
    b.ok(&["sync"]);
    a.ok(&["sync"]);
    let history = a.ok(&["history"]);
    let lines: Vec<&str> = history.lines().collect();
    assert!(lines[0].contains("  merge  "), "{history}");
    assert!(
        lines[1].contains("create  /memories/b/named.md") && lines[1].contains("  on laptop ("),
        "{history}"
    );
    let me = a.ok(&["machine"]);
    let (id, name) = me.trim().split_once('\t').unwrap();
    assert!(
        lines[0].ends_with(&format!("  on {name} ({id})")),
        "{history}"
    );
    assert!(
        history.contains("create  /memories/b/only-b.md"),
        "{history}"
    );
    let sessions = a.ok(&["sessions"]);
    assert!(sessions.lines().count() >= 3, "{sessions}");
    a.ok(&["verify"]);
}

#[test]
fn the_same_file_changed_on_both_sides_merges_its_text_or_keeps_both_versions_visible() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    // Clean: different lines.
    a.edit("/memories/notes.md", "two", "TWO from a");
    b.edit("/memories/notes.md", "five", "FIVE from b");
    b.ok(&["sync"]);
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    let merged = format!("{MARK} one\nTWO from a\nthree\nfour\nFIVE from b\n");
    assert_eq!(a.read("/memories/notes.md").unwrap(), merged);
    assert_eq!(b.read("/memories/notes.md").unwrap(), merged);
    // A clash: the same line. Neither side is lost; the model sees both.
    a.edit("/memories/notes.md", "three", "three as a says");
    b.edit("/memories/notes.md", "three", "three as b says");
    b.ok(&["sync"]);
    let out = a.ok(&["sync"]);
    assert!(
        out.contains("conflict: /memories/notes.md keeps this machine's version; the other side's is at /memories/notes.conflict-1.md"),
        "{out}"
    );
    assert!(
        a.read("/memories/notes.md")
            .unwrap()
            .contains("three as a says")
    );
    let copy = a.read("/memories/notes.conflict-1.md").unwrap();
    assert!(copy.contains("three as b says"), "{copy}");
    let listing = a.exec(json!({"command": "view", "path": "/memories"}));
    assert!(text(&listing).contains("notes.conflict-1.md"));
    let brief = a.ok(&["resume"]);
    assert!(
        brief.contains("Unresolved sync conflicts")
            && brief.contains(
                "- /memories/notes.md: the other version is /memories/notes.conflict-1.md"
            ),
        "{brief}"
    );
    // Resolved by the model: merged by hand, the copy deleted.
    a.edit("/memories/notes.md", "three as a says", "three as both say");
    let r = a.exec(json!({"command": "delete", "path": "/memories/notes.conflict-1.md"}));
    assert!(!is_error(&r));
    assert!(!a.ok(&["resume"]).contains("Unresolved sync conflicts"));
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    assert_eq!(a.files(), b.files());
}

/// A merge reads only the files that differ between the base and either
/// side; the files it does not read must still hold their places: a
/// conflict copy does not take the name of an untouched file, and a path
/// that is a file on one side and a directory on the other (the tree
/// built whole) keeps every untouched file.
#[test]
fn a_merge_that_reads_only_what_changed_keeps_every_untouched_file_in_place() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    a.write("/memories/plan.md", "base plan\n");
    // Untouched from here on: the conflict copy's first name, and files
    // in the directories the merge rebuilds.
    a.write("/memories/plan.conflict-1.md", "an older copy\n");
    a.write("/memories/gone/f1.md", "one\n");
    a.write("/memories/gone/f2.md", "two\n");
    for i in 0..20 {
        a.write(&format!("/memories/keep/n{i}.md"), &format!("kept {i}\n"));
        a.write(&format!("/memories/n{i}.md"), &format!("top {i}\n"));
    }
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    a.edit("/memories/plan.md", "base plan", "a's plan");
    b.edit("/memories/plan.md", "base plan", "b's plan");
    // A file here, a directory there.
    a.write("/memories/keep/x", "a file on a\n");
    b.write("/memories/keep/x/y.md", "a file below on b\n");
    // A directory there replaced by a file.
    for f in ["/memories/gone/f1.md", "/memories/gone/f2.md"] {
        assert!(!is_error(&b.exec(json!({"command": "delete", "path": f}))));
    }
    b.write("/memories/gone", "now a file\n");
    b.ok(&["sync"]);
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    for m in [a, b] {
        assert_eq!(m.read("/memories/gone").unwrap(), "now a file\n");
        assert_eq!(
            m.read("/memories/plan.conflict-1.md").unwrap(),
            "an older copy\n"
        );
        let mut plans = [
            m.read("/memories/plan.md").unwrap(),
            m.read("/memories/plan.conflict-2.md").unwrap(),
        ];
        plans.sort();
        assert_eq!(plans, ["a's plan\n".to_string(), "b's plan\n".to_string()]);
        for i in 0..20 {
            assert_eq!(
                m.read(&format!("/memories/keep/n{i}.md")).unwrap(),
                format!("kept {i}\n")
            );
            assert_eq!(
                m.read(&format!("/memories/n{i}.md")).unwrap(),
                format!("top {i}\n")
            );
        }
        let files = m.files();
        let x: Vec<_> = files
            .iter()
            .filter(|(p, _)| p.starts_with("memories/keep/x"))
            .map(|(_, t)| t.as_str())
            .collect();
        let mut x = x.clone();
        x.sort();
        assert_eq!(x, ["a file below on b\n", "a file on a\n"], "{files:?}");
    }
    assert_eq!(a.files(), b.files());
    a.ok(&["verify"]);
    b.ok(&["verify"]);
}

#[test]
fn an_edit_survives_a_delete_follows_a_rename_and_two_creates_of_one_path_both_survive() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    a.write("/memories/gone.md", "base\n");
    a.write("/memories/moved.md", "base text\n");
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    // Edit against delete.
    a.edit("/memories/gone.md", "base", "edited on a");
    assert!(!is_error(&b.exec(
        json!({"command": "delete", "path": "/memories/gone.md"})
    )));
    // Rename against edit.
    assert!(!is_error(&a.exec(json!({"command": "rename", "old_path": "/memories/moved.md", "new_path": "/memories/dir/renamed.md"}))));
    b.edit("/memories/moved.md", "base text", "edited on b");
    // Both create one path.
    a.write("/memories/same.md", "a's same\n");
    b.write("/memories/same.md", "b's same\n");
    b.ok(&["sync"]);
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    for m in [a, b] {
        assert_eq!(m.read("/memories/gone.md").unwrap(), "edited on a\n");
        assert_eq!(m.read("/memories/dir/renamed.md").unwrap(), "edited on b\n");
        assert_eq!(m.read("/memories/moved.md"), None);
        let same = m.read("/memories/same.md").unwrap();
        let copy = m.read("/memories/same.conflict-1.md").unwrap();
        let mut both = [same, copy];
        both.sort();
        assert_eq!(both, ["a's same\n".to_string(), "b's same\n".to_string()]);
    }
    assert_eq!(a.files(), b.files());
    a.ok(&["verify"]);
    b.ok(&["verify"]);
}

/// The prune after an erasure runs git in the remote's own directory: a
/// path remote that stalls it (here a FIFO where `git gc` reads its pid
/// file) is given up on within `--remote-timeout`, with a warning, the
/// push kept; before, the sync waited for ever, holding the remote's lock.
#[test]
fn a_path_remote_that_stalls_the_prune_is_given_up_on_within_the_remote_timeout() {
    let w = world(0);
    let a = &w.machines[0];
    a.write("/memories/secret.md", &format!("{MARK} to be erased\n"));
    a.ok(&["sync"]);
    let fifo = w.hub.join("gc.pid");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .output()
        .unwrap();
    assert!(made.status.success());
    a.ok(&["purge", "/memories/secret.md"]);
    let started = std::time::Instant::now();
    let mut cmd = a.cmd();
    let mut child = cmd
        .args(["--remote-timeout", "2", "sync"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: a sync that never ends is killed and fails the test.
    let out = loop {
        if child.try_wait().unwrap().is_some() {
            break child.wait_with_output().unwrap();
        }
        if started.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the sync still waits on the stalled prune after 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stderr.contains("pruning origin failed") && stderr.contains("--remote-timeout"),
        "{stderr}"
    );
    // The push landed, and the remote's lock was let go: the next sync
    // (the FIFO gone) runs. (It does not prune again: the warning says to
    // run `git gc --prune=now` there.)
    std::fs::remove_file(&fifo).unwrap();
    a.write("/memories/after.md", "after\n");
    a.ok(&["sync"]);
    let late = Machine::new(w.hub.with_file_name("late"), a.key.clone());
    late.ok(&["clone", w.hub.to_str().unwrap()]);
    assert_eq!(late.read("/memories/secret.md"), None);
    assert_eq!(late.read("/memories/after.md").as_deref(), Some("after\n"));
    a.ok(&["verify"]);
}

#[test]
fn an_erasure_on_either_side_wins_and_destroys_the_key_here_too() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    a.write("/memories/secret.md", &format!("{MARK} to be erased\n"));
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    // The key states the hub holds now: they hold the key a purge destroys.
    let states = |repo: &std::path::Path| -> Vec<String> {
        let out = git(repo, &["rev-list", "refs/memvault/keys"]);
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    };
    let before = states(&w.hub);
    assert!(!before.is_empty());
    // b edits it while a purges it.
    b.edit("/memories/secret.md", "to be erased", "edited meanwhile");
    a.ok(&["purge", "/memories/secret.md"]);
    let out = a.ok(&["sync"]);
    // The hub is a path: pruned, the replaced states gone from it too.
    assert!(out.contains("pruned origin"), "{out}");
    for old in &before {
        let found = std::process::Command::new("git")
            .arg("--git-dir")
            .arg(&w.hub)
            .args(["cat-file", "-e", old])
            .output()
            .unwrap();
        assert!(!found.status.success(), "{old} is still in the hub");
        assert!(!states(&w.hub).contains(old));
    }
    let fsck = git(&w.hub, &["fsck", "--no-dangling"]);
    assert!(
        fsck.status.success(),
        "{}",
        String::from_utf8_lossy(&fsck.stderr)
    );
    let out = b.ok(&["sync"]);
    assert!(out.contains("erased here too: 1 file key"), "{out}");
    for m in [a, b] {
        assert_eq!(m.read("/memories/secret.md"), None);
        m.ok(&["verify"]);
    }
    a.ok(&["sync"]);
    assert_eq!(a.files(), b.files());
    // Every version of it reads as erased on b too.
    let verified = b.ok(&["verify"]);
    assert!(!verified.contains(", 0 erased on purpose"), "{verified}");
}

#[test]
fn a_push_never_forces_and_sync_merges_then_gets_in() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    a.write("/memories/x.md", "a\n");
    b.write("/memories/y.md", "b\n");
    b.ok(&["push"]);
    let err = a.fails(&["push"], 1);
    assert!(
        err.contains("remote origin moved since this vault last pulled"),
        "{err}"
    );
    // b's work is still the remote's.
    let c = Machine::new(w.hub.with_file_name("check"), a.key.clone());
    c.ok(&["clone", w.hub.to_str().unwrap()]);
    assert_eq!(c.read("/memories/y.md").unwrap(), "b\n");
    let out = a.ok(&["sync", "--json"]);
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["push"]["pushed"], true);
    assert_eq!(report["pulls"][0]["outcome"], "merged");
    c.ok(&["pull"]);
    assert_eq!(c.read("/memories/x.md").unwrap(), "a\n");
    assert_eq!(c.read("/memories/y.md").unwrap(), "b\n");
}

#[test]
fn a_ref_lock_left_in_the_remote_is_reported_as_such_and_the_next_sync_after_its_removal_lands() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    a.write("/memories/x.md", "a\n");
    let hub_main = || {
        let out = Command::new("git")
            .arg("--git-dir")
            .arg(&w.hub)
            .args(["rev-parse", "refs/heads/main"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let before = hub_main();
    // A push killed in the remote's `receive-pack` leaves its ref lock.
    let lock = w.hub.join("refs/heads/main.lock");
    std::fs::write(&lock, "").unwrap();
    for cmd in ["sync", "push"] {
        let err = a.fails(&[cmd], 1);
        assert!(
            err.contains("refs/heads/main is locked")
                && err.contains("refs/heads/main.lock")
                && err.contains("remove that lock file"),
            "{cmd}: {err}"
        );
        assert!(!err.contains("moved since"), "{cmd}: {err}");
        assert_eq!(hub_main(), before, "{cmd} moved the remote");
    }
    assert_eq!(a.read("/memories/x.md").unwrap(), "a\n");
    std::fs::remove_file(&lock).unwrap();
    a.ok(&["sync"]);
    assert_ne!(hub_main(), before);
    b.ok(&["pull"]);
    assert_eq!(b.read("/memories/x.md").unwrap(), "a\n");
}

#[test]
fn verify_walks_the_commits_a_merge_brought_in_and_finds_damage_there() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    a.write("/memories/a.md", "from a\n");
    b.write("/memories/b.md", "from b\n");
    b.ok(&["push"]);
    a.ok(&["sync"]);
    let rev = |r: &str| {
        let out = Command::new("git")
            .arg("--git-dir")
            .arg(&a.dir)
            .args(["rev-parse", r])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let theirs = rev("refs/heads/main^2");
    assert_eq!(theirs.len(), 40, "the sync made a merge");
    let all: usize = {
        let out = Command::new("git")
            .arg("--git-dir")
            .arg(&a.dir)
            .args(["rev-list", "--count", "refs/heads/main"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    let report: Value = serde_json::from_str(&a.ok(&["verify", "--json"])).unwrap();
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(
        report["commits"], all,
        "every commit, merged lines too: {report}"
    );
    // Damage in the commit the merge brought in (its object file cut).
    unpack_all(&w._v);
    let file = a.dir.join("objects").join(&theirs[..2]).join(&theirs[2..]);
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    let out = a.run(&["verify", "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert_eq!(report["ok"], false, "{report}");
    assert!(
        report.to_string().contains(&theirs),
        "the damaged commit is named: {report}"
    );
}

#[test]
fn a_vault_directory_is_never_pushed_to_and_read_as_a_remote_only_when_its_log_is_empty() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    let b_url = b.dir.to_str().unwrap();
    // Named as a remote: refused at once.
    let err = a.fails(&["remote", "add", "other", b_url], 1);
    assert!(err.contains("vault's own directory"), "{err}");
    // A remote that became a vault directory after it was added.
    let later = w.hub.with_file_name("later");
    a.ok(&["remote", "add", "later", later.to_str().unwrap()]);
    let c = Machine::new(later.clone(), a.key.clone());
    c.ok(&["clone", w.hub.to_str().unwrap()]);
    c.write("/memories/c.md", "only c\n");
    let refs =
        |m: &Machine| std::fs::read_to_string(m.dir.join("refs/heads/main")).unwrap_or_default();
    let c_main = refs(&c);
    a.write("/memories/a.md", "from a\n");
    for cmd in [vec!["push", "later"], vec!["sync", "later"]] {
        let err = a.fails(&cmd, 1);
        assert!(err.contains("vault's own directory"), "{cmd:?}: {err}");
        assert!(err.contains("nothing was pushed"), "{cmd:?}: {err}");
        assert_eq!(refs(&c), c_main, "{cmd:?} moved the vault's ref");
    }
    assert_eq!(c.read("/memories/c.md").unwrap(), "only c\n");
    assert_eq!(c.read("/memories/a.md"), None);
    c.ok(&["verify"]);
    // Read as a remote while a process holds changes in its log: refused;
    // once that process has closed (its log checkpointed), it reads whole.
    let mut serve = Writer::spawn(b.cmd().arg("serve"));
    serve.send(
        &json!({"command": "create", "path": "/memories/live.md", "file_text": "acknowledged\n"}),
    );
    let d = Machine::new(w.hub.with_file_name("copy"), a.key.clone());
    let err = d.fails(&["clone", b_url], 1);
    assert!(err.contains("nothing was fetched"), "{err}");
    assert!(!d.dir.exists(), "a refused clone leaves nothing");
    assert!(serve.finish());
    d.ok(&["clone", b_url]);
    assert_eq!(d.read("/memories/live.md").unwrap(), "acknowledged\n");
}

/// A remote whose main ref file holds no id (git reads it as the zero id
/// and asks for that) is said to be damaged there, not with git's own
/// "not our ref 0000..." (round 33b); nothing changes here.
#[test]
fn a_remote_ref_file_holding_no_id_is_named_as_damaged_there() {
    let w = world(1);
    let (a, _) = (&w.machines[0], &w.machines[1]);
    a.write("/memories/x.md", "x\n");
    a.ok(&["sync"]);
    let before = a.files();
    std::fs::write(w.hub.join("refs/heads/main"), "not-a-sha\n").unwrap();
    let err = a.fails(&["sync"], 1);
    assert!(err.contains("holds no object id"), "{err}");
    assert!(!err.contains("not our ref"), "{err}");
    assert_eq!(a.files(), before);
    let c = Machine::new(w.hub.with_file_name("c"), a.key.clone());
    let err = c.fails(&["clone", w.hub.to_str().unwrap()], 1);
    assert!(err.contains("holds no object id"), "{err}");
    assert!(!c.dir.exists(), "a refused clone leaves nothing");
}

/// Round 39b: the hub's main put back alone, to what b last saw, after
/// a's purge: its key state (the purge's, which destroyed the key) stays.
/// b's pull found "up to date", and its push then replaced that key state
/// with b's older one, which still held the key: a new clone of the hub
/// read the purged file. Now b's sync is refused, the hub keeps its key
/// state, and no clone of it reads the file.
#[test]
fn a_key_state_that_moved_without_its_main_is_never_pushed_over() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    a.write("/memories/secret.md", &format!("{MARK} to be erased\n"));
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    let seen = String::from_utf8(git(&w.hub, &["rev-parse", "refs/heads/main"]).stdout).unwrap();
    a.ok(&["purge", "/memories/secret.md"]);
    a.ok(&["sync"]);
    let hub_keys =
        || String::from_utf8(git(&w.hub, &["rev-parse", "refs/memvault/keys"]).stdout).unwrap();
    let keys = hub_keys();
    let out = git(&w.hub, &["update-ref", "refs/heads/main", seen.trim()]);
    assert!(out.status.success());
    let before = b.files();
    for args in [&["sync"][..], &["pull"][..]] {
        let err = b.fails(args, 1);
        assert!(err.contains("key state moved without its main"), "{err}");
        assert_eq!(
            hub_keys(),
            keys,
            "{args:?}: the hub's key state was replaced"
        );
        assert_eq!(b.files(), before, "{args:?}");
    }
    b.ok(&["verify"]);
    // A clone of the hub cannot read the purged file.
    let dir = w.hub.parent().unwrap().join("late-clone");
    let c = Machine::new(dir.clone(), a.key.clone());
    c.ok(&["clone", w.hub.to_str().unwrap()]);
    assert_eq!(c.read("/memories/secret.md"), None);
    assert!(plaintext_anywhere(&w.hub, MARK).is_empty());
}

/// Round 41b: a pull that met another machine's push between its two ref
/// updates (over smart HTTP, 2 pulls in 612 beside a pushing machine) was
/// told the remote "rolled back" and to restore it or start a new one.
/// Here the hub shows the push's main beside the key state before it, and
/// the push completes 1.5 s after `pull` and `sync` start: both wait for
/// it and succeed. A remote that stays so is still refused (see the test
/// below and `a_key_state_that_moved_without_its_main_is_never_pushed_over`).
#[test]
fn a_pull_that_meets_another_machines_push_half_done_waits_for_it() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    let rev = |r: &str| {
        let out = git(&w.hub, &["rev-parse", r]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    for (i, args) in [&["pull"][..], &["sync"][..]].into_iter().enumerate() {
        let old_keys = rev("refs/memvault/keys");
        // A new file: a new file key, so a new key state with the commit.
        let path = format!("/memories/half{i}.md");
        a.write(&path, "pushed\n");
        a.ok(&["push"]);
        let new_keys = rev("refs/memvault/keys");
        assert_ne!(old_keys, new_keys);
        assert!(
            git(&w.hub, &["update-ref", "refs/memvault/keys", &old_keys])
                .status
                .success()
        );
        let child = b
            .cmd()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        assert!(
            git(&w.hub, &["update-ref", "refs/memvault/keys", &new_keys])
                .status
                .success()
        );
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(b.read(&path).as_deref(), Some("pushed\n"), "{args:?}");
    }
    b.ok(&["verify"]);
}

/// Round 41b: a remote whose main was replaced by a commit of its own
/// over a 600 MB blob made `pull` hold about twice that before refusing
/// the commit. Now commits are read and checked first: the blob (150 MB
/// here) is never read, and the pull is refused holding a few MiB.
#[test]
fn a_huge_object_under_a_foreign_commit_is_refused_before_it_is_read() {
    let w = world(1);
    let b = &w.machines[1];
    let scratch = w.hub.parent().unwrap().join("planter");
    assert!(
        Command::new("git")
            .args(["init", "-q"])
            .arg(&scratch)
            .status()
            .unwrap()
            .success()
    );
    // 150 MB of zeros: small in the pack, 150 MB for whoever reads it.
    let f = std::fs::File::create(scratch.join("big")).unwrap();
    f.set_len(150 << 20).unwrap();
    drop(f);
    let run = |args: &[&str]| {
        let out = Command::new("git")
            .arg("-C")
            .arg(&scratch)
            .args(["-c", "user.name=x", "-c", "user.email=x@x"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    run(&["fetch", "-q", w.hub.to_str().unwrap(), "main"]);
    run(&["add", "big"]);
    let tree = run(&["write-tree"]);
    let commit = run(&["commit-tree", &tree, "-p", "FETCH_HEAD", "-m", "planted"]);
    let blob = run(&["rev-parse", &format!("{tree}:big")]);
    let genuine_main = run(&["rev-parse", "FETCH_HEAD"]);
    let hub = w.hub.to_str().unwrap();
    let before = b.files();
    // The blob under a commit of the remote's own; then (review 41e) the
    // blob as the key state's ref itself, beside the genuine main.
    for (planted, says) in [
        (
            vec![format!("+{commit}:refs/heads/main")],
            "cannot be trusted: a commit was not written with this vault's key",
        ),
        (
            vec![
                format!("+{genuine_main}:refs/heads/main"),
                format!("+{blob}:refs/memvault/keys"),
            ],
            "cannot be trusted: a ref names something that is not a commit",
        ),
    ] {
        let mut args = vec!["push", "-q", hub];
        args.extend(planted.iter().map(String::as_str));
        run(&args);
        let mut child = b
            .cmd()
            .arg("pull")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let status = format!("/proc/{}/status", child.id());
        let mut peak_kib = 0u64;
        while child.try_wait().unwrap().is_none() {
            if let Ok(text) = std::fs::read_to_string(&status)
                && let Some(kib) = text
                    .lines()
                    .find_map(|l| l.strip_prefix("VmHWM:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            {
                peak_kib = peak_kib.max(kib);
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(says), "{says}: {err}");
        assert!(
            peak_kib < 64 << 10,
            "{says}: pull held {peak_kib} KiB for a refused 150 MB blob"
        );
        assert_eq!(b.files(), before);
    }
    std::fs::remove_dir_all(&scratch).unwrap();
    b.ok(&["verify"]);
}

/// Round 41b: three machines change one line; the first pushes, the two
/// others pull it (each keeps its own line and puts the first's in
/// `notes.conflict-1.md`), the second pushes, the third syncs. Both had
/// made the same conflict copy, under two file keys: the third made a
/// copy of the copy (`notes.conflict-1.conflict-1.md`, byte for byte the
/// same) and reported a conflict between identical texts. Now two files
/// at one path with one text are one; the real conflict (the second's
/// line against the third's) is still a copy.
#[test]
fn the_same_conflict_copy_made_on_two_machines_is_one_file() {
    let w = world(2);
    let (a, b, c) = (&w.machines[0], &w.machines[1], &w.machines[2]);
    a.edit("/memories/notes.md", "two", "two by a");
    b.edit("/memories/notes.md", "two", "two by b");
    c.edit("/memories/notes.md", "two", "two by c");
    a.ok(&["sync"]);
    let pulled_b = b.ok(&["pull"]);
    let pulled_c = c.ok(&["pull"]);
    for p in [&pulled_b, &pulled_c] {
        assert!(p.contains("notes.conflict-1.md"), "{p}");
    }
    b.ok(&["push"]);
    let synced = c.ok(&["sync"]);
    assert!(!synced.contains("conflict-1.conflict"), "{synced}");
    assert!(
        !synced.contains("conflict: /memories/notes.conflict-1.md"),
        "{synced}"
    );
    let names: Vec<String> = c.files().into_iter().map(|(p, _)| p).collect();
    assert!(
        !names.iter().any(|n| n.contains("conflict-1.conflict")),
        "{names:?}"
    );
    let text = |p: &str| c.read(p).unwrap_or_default();
    assert!(text("/memories/notes.conflict-1.md").contains("two by a"));
    // b's line against c's: a real conflict, kept as a copy.
    assert!(text("/memories/notes.md").contains("two by c"));
    let copies: Vec<String> = names
        .iter()
        .filter(|n| n.contains("conflict-"))
        .map(|n| text(&format!("/memories/{}", n.trim_start_matches("memories/"))))
        .collect();
    assert_eq!(copies.len(), 2, "{names:?}");
    assert!(copies.iter().any(|t| t.contains("two by b")), "{copies:?}");
    c.ok(&["verify"]);
}

#[test]
fn a_remote_that_rolled_back_or_forked_is_refused_and_nothing_changes_here() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    let old = String::from_utf8(git(&w.hub, &["rev-parse", "refs/heads/main"]).stdout).unwrap();
    b.write("/memories/later.md", "later\n");
    b.ok(&["push"]);
    a.ok(&["pull"]);
    let before = a.files();
    let ok = a.ok(&["verify", "--remote", "origin"]);
    assert!(ok.starts_with("ok: remote origin checks out"), "{ok}");
    b.write("/memories/unpulled.md", "x\n");
    b.ok(&["push"]);
    let ok = a.ok(&["verify", "--remote", "origin", "--json"]);
    let state: Value = serde_json::from_str(&ok).unwrap();
    assert_eq!(state["new_commits"], 1, "{state}");
    // verify changed nothing here.
    assert_eq!(a.files(), before);
    // Rolled back: main set back to an older commit.
    let out = git(&w.hub, &["update-ref", "refs/heads/main", old.trim()]);
    assert!(out.status.success());
    let err = a.fails(&["pull"], 1);
    assert!(err.contains("remote origin rolled back"), "{err}");
    assert_eq!(a.files(), before);
    let err = a.fails(&["sync"], 1);
    assert!(err.contains("rolled back"), "{err}");
    let out = a.run(&["verify", "--remote", "origin"]);
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("PROBLEM  remote origin rolled back"),
        "{said}"
    );
    // It does not send the reader to the command they just ran.
    assert!(!said.contains("memvault verify --remote"), "{said}");
    assert!(said.contains("memvault remote remove origin"), "{said}");
    // Forked: main replaced by another vault's history under the same key
    // file (a vault made apart, never merged).
    let other = TestVault::new();
    let o = Machine::new(other.vault.clone(), a.key.clone());
    // The other vault has its own data key: its commits fail our MAC.
    let _ = o;
    let other_remote = other.tmp.path().join("other.git");
    git(
        other.tmp.path(),
        &["init", "-q", "--bare", other_remote.to_str().unwrap()],
    );
    let oc = Machine::new(other.vault.clone(), other.key.clone());
    oc.write("/memories/notes.md", "another vault\n");
    oc.ok(&["remote", "add", "origin", other_remote.to_str().unwrap()]);
    oc.ok(&["push"]);
    a.ok(&["remote", "add", "stranger", other_remote.to_str().unwrap()]);
    let err = a.fails(&["pull", "stranger"], 1);
    assert!(
        err.contains("remote stranger cannot be trusted") || err.contains("remote stranger forked"),
        "{err}"
    );
    assert_eq!(a.files(), before);
    a.ok(&["verify"]);
}

#[test]
fn remote_names_and_urls_are_checked_and_the_stored_list_is_authenticated() {
    let w = world(0);
    let a = &w.machines[0];
    for bad in [
        "ext::sh -c touch% /tmp/pwned",
        "-uhelp",
        "http://example.com/v.git",
        "https://u:pw@example.com/v.git",
    ] {
        let err = a.fails(&["remote", "add", "x", bad], 2);
        assert!(!err.is_empty());
    }
    // A token given as the user name, or in the query: refused like a
    // password, and never stored or printed.
    let token = format!("ghp_{}", "aB3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gI3kM5");
    for bad in [
        format!("https://{token}@github.com/acme/memory.git"),
        format!("https://github.com/acme/memory.git?access_token={token}"),
        format!("https://x{}@example.com/memory.git", "q7Zr2Lw9".repeat(5)),
        "https://example.com/memory.git?private_token=abc".to_string(),
        // Percent-encoded as git and servers decode them.
        format!("https://%67{}@github.com/acme/memory.git", &token[1..]),
        "https://example.com/memory.git?access_%74oken=9f8e7d6c5b4a39281706f5e4d3c2b1a0"
            .to_string(),
    ] {
        let err = a.fails(&["remote", "add", "leak", &bad], 2);
        assert!(err.contains("a remote URL may not hold"), "{err}");
        assert!(!err.contains(&token), "{err}");
    }
    assert!(!a.ok(&["remote", "list"]).contains("leak"));
    a.ok(&[
        "remote",
        "add",
        "person",
        "https://alice@example.com/memory.git",
    ]);
    a.ok(&["remote", "add", "scp", "git@example.com:acme/memory.git"]);
    a.ok(&["remote", "remove", "person"]);
    a.ok(&["remote", "remove", "scp"]);
    a.fails(&["remote", "add", "../x", "/tmp/x.git"], 2);
    let err = a.fails(&["remote", "add", "origin", "/tmp/x.git"], 1);
    assert!(err.contains("exists already"), "{err}");
    a.ok(&["remote", "add", "backup", "relative/backup.git"]);
    let list = a.ok(&["remote", "list"]);
    assert!(
        list.lines()
            .any(|l| l.starts_with("backup\t/") && l.ends_with("relative/backup.git")),
        "{list}"
    );
    // Someone without the key points a remote elsewhere: refused.
    let file = a.dir.join("memvault/remotes");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        text.replace("relative/backup.git", "relative/evil.git"),
    )
    .unwrap();
    let err = a.fails(&["remote", "list"], 1);
    assert!(err.contains("memvault/remotes was altered"), "{err}");
    std::fs::write(&file, text).unwrap();
    a.ok(&["remote", "remove", "backup"]);
    assert!(!a.ok(&["remote", "list"]).contains("backup"));
    a.fails(&["remote", "remove", "backup"], 1);
    a.fails(&["push", "nowhere"], 1);
}

#[test]
fn a_clone_with_the_wrong_key_or_from_no_vault_leaves_nothing_behind() {
    let w = world(0);
    let a = &w.machines[0];
    let tmp = w.hub.parent().unwrap();
    let wrong = tmp.join("wrong.key");
    assert!(
        Command::new(bin())
            .arg("keygen")
            .arg(&wrong)
            .output()
            .unwrap()
            .status
            .success()
    );
    let m = Machine::new(tmp.join("clone-wrong"), wrong);
    m.fails(&["clone", w.hub.to_str().unwrap()], 1);
    assert!(!m.dir.exists());
    let empty = tmp.join("empty.git");
    git(tmp, &["init", "-q", "--bare", empty.to_str().unwrap()]);
    let n = Machine::new(tmp.join("clone-empty"), a.key.clone());
    let err = n.fails(&["clone", empty.to_str().unwrap()], 1);
    assert!(err.contains("holds no memvault vault"), "{err}");
    assert!(!n.dir.exists());
    // Nothing stray left beside it either.
    let stray: Vec<_> = std::fs::read_dir(tmp)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".clone-"))
        .collect();
    assert!(stray.is_empty());
}

/// A small seeded generator (xorshift), so a failing run can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Three clones make seeded random creates, edits and renames (at a few
/// paths, so they collide) and sync in random order; after a final round
/// of syncs all three hold the same files, and every line any of them
/// wrote is in some file (merged, or in a conflict copy). 50 seeded runs
/// (`MEMVAULT_SYNC_RUNS`), the odd seeds here and the even ones in the
/// next test, so that the two halves run side by side.
#[test]
fn three_clones_syncing_in_random_order_converge_and_lose_no_written_line() {
    converge(1);
}

/// The even seeds of the test above.
#[test]
fn three_clones_syncing_in_random_order_converge_even_seeds() {
    converge(2);
}

fn converge(first: u64) {
    use memvault::crypto::{KeyFileKey, Unlock};
    use memvault::vault::{Attribution, Vault, clone_vault};
    let runs: u64 = std::env::var("MEMVAULT_SYNC_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50);
    for seed in (first..=runs).step_by(2) {
        let w = world(0);
        let key = KeyFileKey::from_bytes(&std::fs::read(&w.machines[0].key).unwrap()).unwrap();
        let unlock = Unlock::KeyFile(&key);
        let who = |i: usize| Attribution {
            session: format!("m{i}"),
            actor: format!("m{i}"),
        };
        let mut vaults: Vec<Vault> =
            vec![Vault::open(&w.machines[0].dir, &unlock, who(0)).unwrap()];
        for i in 1..3 {
            let dir = w.hub.with_file_name(format!("m{i}"));
            vaults.push(
                clone_vault(w.hub.to_str().unwrap(), &dir, &unlock, who(i))
                    .unwrap()
                    .0,
            );
        }
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut written: Vec<String> = Vec::new();
        let names = ["a.md", "b.md", "d/c.md", "d/e.md"];
        for round in 0..4 {
            for (i, v) in vaults.iter_mut().enumerate() {
                let memory = memvault::memory_for_vault(v).unwrap();
                for k in 0..1 + rng.below(3) {
                    let token = format!("line-{seed}-{round}-{i}-{k}");
                    let path = format!("/memories/{}", names[rng.below(names.len())]);
                    let cmd = match rng.below(4) {
                        0 => {
                            json!({"command": "create", "path": path, "file_text": format!("{token}\n")})
                        }
                        1 | 2 => {
                            json!({"command": "insert", "path": path, "insert_line": 0, "insert_text": format!("{token}\n")})
                        }
                        _ => {
                            let to = format!("/memories/{}", names[rng.below(names.len())]);
                            json!({"command": "rename", "old_path": path, "new_path": to})
                        }
                    };
                    let r = memory.execute_json(v, &cmd);
                    let creates = cmd["command"] == "create" || cmd["command"] == "insert";
                    if creates && !r.is_error {
                        written.push(token);
                    }
                }
            }
            // Syncs in a random order (each machine at least once).
            let mut order: Vec<usize> = (0..3).collect();
            for _ in 0..rng.below(3) {
                order.push(rng.below(3));
            }
            for j in (1..order.len()).rev() {
                order.swap(j, rng.below(j + 1));
            }
            for i in order {
                vaults[i]
                    .sync("origin")
                    .unwrap_or_else(|e| panic!("seed {seed}: sync: {e}"));
            }
        }
        // A final round: everyone pulls everything.
        for i in [0, 1, 2, 0, 1] {
            vaults[i]
                .sync("origin")
                .unwrap_or_else(|e| panic!("seed {seed}: sync: {e}"));
        }
        let files: Vec<_> = vaults
            .iter()
            .map(|v| v.files_at(None).map(|_| ()).ok())
            .collect();
        assert!(files.iter().all(Option::is_some));
        let contents: Vec<Vec<(String, Vec<u8>)>> = vaults
            .iter_mut()
            .map(|v| {
                let tip = v.tip().unwrap();
                v.files_at(tip)
                    .unwrap()
                    .into_iter()
                    .map(|(p, c)| (p.as_str().to_string(), c.to_vec()))
                    .collect()
            })
            .collect();
        assert_eq!(
            contents[0], contents[1],
            "seed {seed}: machines 0 and 1 differ"
        );
        assert_eq!(
            contents[0], contents[2],
            "seed {seed}: machines 0 and 2 differ"
        );
        let all: String = contents[0]
            .iter()
            .map(|(_, c)| String::from_utf8_lossy(c).into_owned())
            .collect();
        for t in &written {
            assert!(all.contains(t.as_str()), "seed {seed}: {t} was lost");
        }
        for v in vaults.iter_mut() {
            assert!(v.verify().unwrap().ok(), "seed {seed}: verify");
        }
    }
}

/// `serve --sync origin --sync-every 1s`: another machine's change shows
/// up in a running server's answers, and a write made through the server
/// reaches the remote, while requests keep being answered.
#[test]
fn a_running_serve_syncs_in_the_background_and_keeps_answering() {
    use std::io::{BufRead, BufReader, Write};
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    let mut child = a
        .cmd()
        .args(["serve", "--sync", "origin", "--sync-every", "1s"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut ask = |cmd: Value| -> Value {
        writeln!(stdin, "{cmd}").unwrap();
        stdin.flush().unwrap();
        serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap()
    };
    b.write("/memories/from-b.md", "written on b\n");
    b.ok(&["push"]);
    let r = ask(
        json!({"command": "create", "path": "/memories/from-serve.md", "file_text": "written through serve\n"}),
    );
    assert!(!is_error(&r), "{r}");
    let start = std::time::Instant::now();
    loop {
        let r = ask(json!({"command": "view", "path": "/memories/from-b.md"}));
        if !is_error(&r) {
            assert!(text(&r).contains("written on b"));
            break;
        }
        assert!(
            start.elapsed().as_secs() < 30,
            "b's change never arrived: {r}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // The write made through the server reaches the remote.
    let start = std::time::Instant::now();
    loop {
        b.ok(&["pull"]);
        if b.read("/memories/from-serve.md").is_some() {
            break;
        }
        assert!(
            start.elapsed().as_secs() < 30,
            "the server's write never reached the remote"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("synced with origin"), "{err}");
    assert!(!err.contains("written"), "no content in logs: {err}");
    a.ok(&["verify"]);
    // A remote that does not exist is a usage error at start.
    a.fails(&["serve", "--sync", "nowhere"], 2);
}

/// `serve --sync`: its first request sees what another machine pushed
/// before it started (the first sync runs before any request is read), and
/// what it wrote reaches the remote when its client is done (a last sync),
/// however short the session. Both were left to a background thread: a
/// request answered at once saw the vault as it was, and a session shorter
/// than the period never pushed (round 40d).
#[test]
fn serve_sync_syncs_before_its_first_request_and_after_its_last() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    b.write("/memories/from-b.md", "written on b\n");
    b.ok(&["push"]);
    let input = format!(
        "{}\n{}\n",
        json!({"command": "view", "path": "/memories/from-b.md"}),
        json!({"command": "create", "path": "/memories/from-serve.md", "file_text": "written through serve\n"})
    );
    let out = crate::util::run_with_stdin(
        a.cmd()
            .args(["serve", "--sync", "origin", "--sync-every", "1h"]),
        input.as_bytes(),
    );
    assert!(out.status.success());
    let replies = crate::util::parse_lines(&out.stdout);
    assert!(text(&replies[0]).contains("written on b"), "{}", replies[0]);
    assert!(!is_error(&replies[1]), "{}", replies[1]);
    b.ok(&["pull"]);
    assert_eq!(
        b.read("/memories/from-serve.md").as_deref(),
        Some("written through serve\n")
    );
    a.ok(&["verify"]);
}

/// Keyslots travel with the vault: a machine's own key file, added on
/// one machine, opens a clone made elsewhere; removed on one machine while
/// the other wrote (a real merge, not a fast-forward), it stays removed
/// everywhere, and that key opens no copy synced after.
#[test]
fn a_keyslot_added_travels_and_one_removed_stays_removed_through_a_merge() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    let tmp = w.hub.parent().unwrap();
    let laptop_key = tmp.join("laptop.key");
    assert!(
        Command::new(bin())
            .arg("keygen")
            .arg(&laptop_key)
            .output()
            .unwrap()
            .status
            .success()
    );
    let added = a.ok(&["key", "add", "--new-key-file", laptop_key.to_str().unwrap()]);
    let _ = added;
    let slots = a.ok(&["key", "list"]);
    let laptop_id = slots
        .lines()
        .filter(|l| l.contains("key-file") && !l.contains("unlocked with"))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .next()
        .unwrap();
    a.ok(&["sync"]);
    // The laptop clones with its own key file.
    let laptop = Machine::new(tmp.join("laptop"), laptop_key.clone());
    laptop.ok(&["clone", w.hub.to_str().unwrap()]);
    assert_eq!(laptop.files(), a.files());
    b.ok(&["sync"]);
    // b removes the laptop's slot while a writes: the sync is a merge.
    b.ok(&["key", "remove", &laptop_id]);
    a.write("/memories/while-removing.md", "x\n");
    b.ok(&["sync"]);
    let out = a.ok(&["sync"]);
    assert!(out.contains("merged"), "{out}");
    b.ok(&["sync"]);
    for m in [a, b] {
        assert!(
            !m.ok(&["key", "list"]).contains(&laptop_id),
            "the removed slot came back"
        );
    }
    // The laptop's key opens no copy made from the remote now.
    let again = Machine::new(tmp.join("laptop-again"), laptop_key);
    let err = again.fails(&["clone", w.hub.to_str().unwrap()], 1);
    assert!(err.contains("does not unlock"), "{err}");
    assert!(!again.dir.exists());
}

/// A rekey on one machine: another copy with the same key file cannot take
/// in the new epoch yet. Its sync says so (not that the remote is hostile)
/// and changes nothing; a clone made anew reads everything, new and old.
#[test]
fn a_copy_told_of_a_rekey_elsewhere_changes_nothing_and_a_new_clone_reads_it() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    b.write("/memories/b-only.md", "from b before the rekey\n");
    a.ok(&["rekey"]);
    a.write("/memories/after-rekey.md", "written under the new epoch\n");
    a.ok(&["sync"]);
    let before = (b.ok(&["history"]), b.files());
    for args in [&["sync"][..], &["pull"]] {
        let err = b.fails(args, 1);
        assert!(
            err.contains("newer key epoch") && err.contains("nothing was changed"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("cannot be trusted"), "{err}");
    }
    // A push sends nothing over what it has not pulled (and sync says why).
    let err = b.fails(&["push"], 1);
    assert!(err.contains("nothing was pushed"), "{err}");
    assert_eq!((b.ok(&["history"]), b.files()), before);
    // The hint works: a new clone with the same key file reads both the
    // new epoch's file and the history written before it.
    let fresh = Machine::new(w.hub.parent().unwrap().join("fresh"), b.key.clone());
    fresh.ok(&["clone", w.hub.to_str().unwrap()]);
    assert_eq!(
        fresh.read("/memories/after-rekey.md").as_deref(),
        Some("written under the new epoch\n")
    );
    assert!(fresh.read("/memories/notes.md").unwrap().contains(MARK));
    assert_eq!(fresh.files(), a.files());
}

/// Expiry across machines: a file viewed on one machine within the period
/// is not expired on another, as of their last syncs (access times travel
/// sealed, in the remote's `refs/memvault/access`; a view still makes no
/// commit); a file nobody viewed is.
#[cfg(feature = "test-hooks")]
#[test]
fn a_file_viewed_on_one_machine_is_not_expired_on_another_after_a_sync() {
    const DAY: u64 = 86_400_000;
    const T0: u64 = 1_767_225_600_000;
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    let at = |m: &Machine, t: u64, args: &[&str]| -> Output {
        m.cmd()
            .env("MEMVAULT_TEST_NOW_MS", t.to_string())
            .args(args)
            .output()
            .unwrap()
    };
    for path in ["/memories/read-on-a.md", "/memories/read-nowhere.md"] {
        let o = at(
            a,
            T0,
            &[
                "exec",
                &json!({"command": "create", "path": path, "file_text": "x\n"}).to_string(),
            ],
        );
        assert!(o.status.success());
    }
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    let commits_before = a.ok(&["history"]).lines().count();
    // Day 50: a reads one of them. No commit; the sync carries the view.
    let o = at(
        a,
        T0 + 50 * DAY,
        &[
            "exec",
            &json!({"command": "view", "path": "/memories/read-on-a.md"}).to_string(),
        ],
    );
    assert!(o.status.success());
    assert_eq!(a.ok(&["history"]).lines().count(), commits_before);
    let pushed = a.ok(&["sync", "--json"]);
    let report: Value = serde_json::from_str(&pushed).unwrap();
    assert_eq!(report["push"]["commits"], 0, "{report}");
    assert!(
        git(&w.hub, &["rev-parse", "--verify", "refs/memvault/access"])
            .status
            .success(),
        "the access ref"
    );
    assert_eq!(
        plaintext_anywhere(&w.hub, "read-on-a"),
        Vec::<String>::new()
    );
    b.ok(&["sync"]);
    // Day 70 on b, expiring after 30 days: only the unread file goes.
    let o = at(b, T0 + 70 * DAY, &["expire", "--older-than", "30d"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(b.read("/memories/read-on-a.md").is_some());
    assert!(b.read("/memories/read-nowhere.md").is_none());
    // And a second sync with nothing new pushes nothing.
    let again = a.ok(&["sync"]);
    assert!(again.contains("nothing pushed"), "{again}");
}

/// `exec` on machine `m` as `session`.
fn exec_as(m: &Machine, session: &str, cmd: Value) {
    let out = m
        .cmd()
        .args(["exec", "--session", session])
        .arg(cmd.to_string())
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(!is_error(&v), "{v}");
}

/// The id of the newest commit `history` lists for `session` on `m`.
fn newest_of_session(m: &Machine, session: &str) -> String {
    let line = m.ok(&["history", "--session", session, "--json"]);
    let rev: Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    rev["rev"]
        .as_str()
        .or(rev["id"].as_str())
        .unwrap()
        .to_string()
}

/// A session that ran on another machine and came in through a merge is
/// undone here by `revert --session`, commit by commit, as `history` lists
/// it; one of its commits alone by `revert REV`; a file this side changed
/// too since makes a conflict; and the merge itself (the sync, run here)
/// is never counted as a session's own change.
#[test]
fn a_session_merged_in_from_another_machine_is_reverted_here() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    exec_as(
        b,
        "agent-b",
        json!({"command": "create", "path": "/memories/from-b.md", "file_text": "b wrote this\n"}),
    );
    exec_as(
        b,
        "agent-b",
        json!({"command": "str_replace", "path": "/memories/notes.md", "old_str": "two", "new_str": "TWO by b"}),
    );
    b.ok(&["sync"]);
    // a writes meanwhile, so its sync is a true merge, not a fast-forward
    // (labelled with the session `sync`).
    exec_as(
        a,
        "agent-a",
        json!({"command": "create", "path": "/memories/from-a.md", "file_text": "a wrote this\n"}),
    );
    a.ok(&["sync"]);
    assert_eq!(
        a.read("/memories/from-b.md").as_deref(),
        Some("b wrote this\n")
    );
    let listed = a.ok(&["history", "--session", "agent-b", "--json"]);
    assert_eq!(listed.lines().count(), 2, "{listed}");
    // a's own session: its create only; and `sync`'s: no merge.
    let err = a.fails(&["revert", "--session", "sync"], 1);
    assert!(err.contains("no changes to undo"), "{err}");
    let mine = a.ok(&["revert", "--session", "agent-a"]);
    assert!(a.read("/memories/from-a.md").is_none(), "{mine}");
    assert_eq!(
        a.read("/memories/from-b.md").as_deref(),
        Some("b wrote this\n")
    );
    assert!(a.read("/memories/notes.md").unwrap().contains("TWO by b"));
    // b's session, undone on a.
    let out = a.ok(&["revert", "--session", "agent-b"]);
    assert!(a.read("/memories/from-b.md").is_none(), "{out}");
    let notes = a.read("/memories/notes.md").unwrap();
    assert!(
        notes.contains("\ntwo\n") && !notes.contains("TWO"),
        "{notes}"
    );
    a.ok(&["verify"]);

    // One merged-in commit by its id, as history gives it.
    exec_as(
        b,
        "agent-b2",
        json!({"command": "create", "path": "/memories/b2.md", "file_text": "second\n"}),
    );
    b.ok(&["sync"]);
    exec_as(
        a,
        "agent-a2",
        json!({"command": "create", "path": "/memories/a2.md", "file_text": "a again\n"}),
    );
    a.ok(&["sync"]);
    let id = newest_of_session(a, "agent-b2");
    a.ok(&["revert", &id]);
    assert!(a.read("/memories/b2.md").is_none());
    assert_eq!(a.read("/memories/a2.md").as_deref(), Some("a again\n"));

    // b's session edits a line of a file a edits too (another line): the
    // merge combines both, so undoing b's session would drop a's edit:
    // refused, nothing changed; --force undoes it anyway.
    b.ok(&["sync"]);
    exec_as(
        b,
        "agent-b3",
        json!({"command": "str_replace", "path": "/memories/notes.md", "old_str": "three", "new_str": "THREE by b"}),
    );
    b.ok(&["sync"]);
    a.edit("/memories/notes.md", "five", "FIVE by a");
    a.ok(&["sync"]);
    let merged = a.read("/memories/notes.md").unwrap();
    assert!(
        merged.contains("THREE by b") && merged.contains("FIVE by a"),
        "{merged}"
    );
    let before = a.files();
    let err = a.fails(&["revert", "--session", "agent-b3"], 1);
    assert!(err.contains("notes.md"), "{err}");
    assert_eq!(a.files(), before);
    a.ok(&["revert", "--session", "agent-b3", "--force"]);
    assert!(!a.read("/memories/notes.md").unwrap().contains("THREE"));
    a.ok(&["verify"]);

    // Both sides change the same line: the merge keeps this side's and
    // sets b's aside. Undoing b's change (its session, or its commit)
    // would overwrite a's line with the old one: refused, nothing changed.
    a.write("/memories/g.md", "the line\n");
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    exec_as(
        b,
        "agent-b4",
        json!({"command": "str_replace", "path": "/memories/g.md", "old_str": "the line", "new_str": "b's line"}),
    );
    b.ok(&["sync"]);
    a.edit("/memories/g.md", "the line", "a's line");
    a.ok(&["sync"]);
    assert_eq!(a.read("/memories/g.md").as_deref(), Some("a's line\n"));
    let before = a.files();
    let err = a.fails(&["revert", "--session", "agent-b4"], 1);
    assert!(err.contains("g.md"), "{err}");
    let id = newest_of_session(a, "agent-b4");
    let err = a.fails(&["revert", &id], 1);
    assert!(err.contains("g.md"), "{err}");
    assert_eq!(a.files(), before);
    a.ok(&["verify"]);
}

/// A change that reached this machine through a merge made on another:
/// c changes a line, b changes the same line and merges c's (keeping its
/// own, setting c's aside), a merges b's. Undoing c's session on a would
/// put back the old line over b's: refused, nothing changed.
#[test]
fn a_change_set_aside_by_a_merge_on_another_machine_is_not_reverted_over_it() {
    let w = world(2);
    let (a, b, c) = (&w.machines[0], &w.machines[1], &w.machines[2]);
    a.write("/memories/f.md", "the line\n");
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    c.ok(&["sync"]);
    exec_as(
        c,
        "agent-c",
        json!({"command": "str_replace", "path": "/memories/f.md", "old_str": "the line", "new_str": "c's line"}),
    );
    c.ok(&["sync"]);
    exec_as(
        b,
        "agent-b",
        json!({"command": "str_replace", "path": "/memories/f.md", "old_str": "the line", "new_str": "b's line"}),
    );
    b.ok(&["sync"]);
    assert_eq!(b.read("/memories/f.md").as_deref(), Some("b's line\n"));
    a.write("/memories/own.md", "a's own\n");
    a.ok(&["sync"]);
    assert_eq!(a.read("/memories/f.md").as_deref(), Some("b's line\n"));
    let before = a.files();
    let err = a.fails(&["revert", "--session", "agent-c"], 1);
    assert!(err.contains("f.md"), "{err}");
    assert_eq!(a.files(), before);
    // b's own session is undone cleanly: the line goes back to what b
    // changed it from.
    a.ok(&["revert", "--session", "agent-b"]);
    assert_eq!(a.read("/memories/f.md").as_deref(), Some("the line\n"));
    a.ok(&["verify"]);
}

/// A purge here, then a sync that merges key states another machine
/// pushed before it heard of the purge: those states held the destroyed
/// key, and came into this repository with the fetch. They are pruned
/// too: no object here holds the key afterwards.
#[test]
fn a_purge_before_a_merging_sync_leaves_no_fetched_state_holding_its_key() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    a.write("/memories/secret.md", &format!("{MARK} to be erased\n"));
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    let held = keys_in_any_object(&a.dir, &a.key);
    a.ok(&["purge", "/memories/secret.md"]);
    let after_purge = keys_in_any_object(&a.dir, &a.key);
    let destroyed: Vec<&String> = held.difference(&after_purge).collect();
    assert_eq!(destroyed.len(), 1, "the purge destroyed one key here");
    // b, not yet told, writes and syncs first: the hub's key states hold
    // the key; a's sync fetches them and merges.
    b.write("/memories/other.md", "b's note\n");
    b.ok(&["sync"]);
    a.ok(&["sync"]);
    let now = keys_in_any_object(&a.dir, &a.key);
    assert!(
        !now.contains(destroyed[0]),
        "a fetched key state still holds the destroyed key"
    );
    assert_eq!(a.read("/memories/secret.md"), None);
    assert!(a.read("/memories/other.md").is_some());
    a.ok(&["verify"]);
    b.ok(&["sync"]);
    assert!(!keys_in_any_object(&b.dir, &b.key).contains(destroyed[0]));
}

/// `push` with nothing new still asks the remote: one that moved back, or
/// is gone, is an error naming it, never "already has everything".
#[test]
fn a_push_with_nothing_new_still_checks_the_remote() {
    let w = world(0);
    let a = &w.machines[0];
    let first = String::from_utf8(git(&w.hub, &["rev-parse", "refs/heads/main"]).stdout)
        .unwrap()
        .trim()
        .to_string();
    a.write("/memories/more.md", "more\n");
    a.ok(&["push"]);
    let out = a.ok(&["push"]);
    assert!(out.contains("already has everything"), "{out}");
    // Moved back by plain git.
    git(&w.hub, &["update-ref", "refs/heads/main", &first]);
    let err = a.fails(&["push"], 1);
    assert!(err.contains("origin"), "{err}");
    assert!(!err.contains("already has everything"), "{err}");
    // Gone.
    let away = w.hub.with_extension("away");
    std::fs::rename(&w.hub, &away).unwrap();
    let err = a.fails(&["push"], 1);
    assert!(err.contains("origin"), "{err}");
}

/// A folder purged here while another machine, not yet told, wrote a new
/// file in it: the merge keeps the new file (erasure wins for what it
/// destroyed, not for what was written without knowing of it) and says
/// so, on the machine that purged, naming the file.
#[test]
fn new_content_from_another_machine_under_a_path_purged_here_is_kept_and_said() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    a.write("/memories/customer-42/a.md", "old\n");
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    a.ok(&["purge", "/memories/customer-42"]);
    b.write("/memories/customer-42/b.md", "written before b heard\n");
    b.ok(&["sync"]);
    let out = a.ok(&["sync"]);
    assert!(
        out.contains("warning: /memories/customer-42/b.md is new from origin"),
        "{out}"
    );
    assert_eq!(a.read("/memories/customer-42/a.md"), None);
    assert!(a.read("/memories/customer-42/b.md").is_some());
    let h = a.ok(&["history", "--op", "merge", "--json"]);
    assert!(
        h.contains("new from the other side where this side erased"),
        "{h}"
    );
}

/// One machine expires a file that another, not yet told, edited: the
/// edit shows the file was in use, so the merge keeps it (under a new
/// key; the expired key is destroyed everywhere) and says so, whichever
/// machine merges. A purge still wins over such an edit.
#[test]
fn an_edit_made_elsewhere_before_an_expiry_was_heard_of_is_kept_under_a_new_key() {
    const DAY: u64 = 86_400_000;
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    for f in ["merged-on-a", "merged-on-b", "unedited", "purged"] {
        a.write(&format!("/memories/{f}.md"), &format!("{f}: first\n"));
    }
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    let held = keys_in_any_object(&a.dir, &a.key);
    // b edits one file and tells the hub; then edits two more, and keeps
    // them (it syncs only after a has expired and synced).
    b.edit("/memories/merged-on-a.md", "first", "edited on b");
    b.ok(&["sync"]);
    b.edit("/memories/merged-on-b.md", "first", "edited on b");
    b.edit("/memories/purged.md", "first", "edited on b");
    // a purges one file; 70 days on, it expires everything it has not
    // seen used.
    a.ok(&["purge", "/memories/purged.md"]);
    let later = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 70 * DAY)
        .to_string();
    let o = a
        .cmd()
        .env("MEMVAULT_TEST_NOW_MS", &later)
        .args(["expire", "--older-than", "30d"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // a merges b's first edit: kept, and said.
    let out = a.ok(&["sync"]);
    assert!(
        out.contains(
            "kept: /memories/merged-on-a.md was edited on one machine after the other expired it"
        ),
        "{out}"
    );
    assert!(!out.contains("warning: /memories/merged-on-a.md"), "{out}");
    assert_eq!(
        a.read("/memories/merged-on-a.md").as_deref(),
        Some("merged-on-a: edited on b\n")
    );
    // b merges a's expiry: its own edit stays, the unedited file goes, the
    // purge wins over b's edit.
    let out = b.ok(&["sync"]);
    assert!(
        out.contains("kept: /memories/merged-on-b.md was edited"),
        "{out}"
    );
    assert!(!out.contains("purged.md was edited"), "{out}");
    for m in [a, b] {
        m.ok(&["sync"]);
        assert_eq!(
            m.read("/memories/merged-on-a.md").as_deref(),
            Some("merged-on-a: edited on b\n")
        );
        assert_eq!(
            m.read("/memories/merged-on-b.md").as_deref(),
            Some("merged-on-b: edited on b\n")
        );
        assert_eq!(m.read("/memories/unedited.md"), None);
        assert_eq!(m.read("/memories/purged.md"), None);
        m.ok(&["verify"]);
    }
    // Every key the expiry and the purge destroyed is gone from both
    // machines' repositories: the kept edits are under new keys.
    let now_a = keys_in_any_object(&a.dir, &a.key);
    let now_b = keys_in_any_object(&b.dir, &b.key);
    let destroyed: Vec<&String> = held.difference(&now_a).collect();
    // The four files' keys, and the key of the note the world starts with.
    assert_eq!(destroyed.len(), 5, "every first key is destroyed on a");
    for k in destroyed {
        assert!(!now_b.contains(k), "b still holds a destroyed key");
    }
    let h = a.ok(&["history", "--op", "merge", "--json"]);
    assert!(
        h.contains("edited on one side after the other expired it"),
        "{h}"
    );
}

/// A machine with a keyslot of its own, removed on another machine: its
/// next sync brings the removal, and from then on it is told that the
/// keyslot it unlocked with is gone, not only that its key is wrong.
#[test]
fn a_machine_whose_keyslot_was_removed_elsewhere_is_told_so() {
    let w = world(0);
    let a = &w.machines[0];
    let kb = a.dir.parent().unwrap().join("b.key");
    keygen(&kb);
    a.ok(&["key", "add", "--new-key-file", kb.to_str().unwrap()]);
    let list = a.ok(&["key", "list"]);
    a.ok(&["sync"]);
    let b = Machine::new(a.dir.parent().unwrap().join("b"), kb.clone());
    b.ok(&["clone", w.hub.to_str().unwrap()]);
    b.write("/memories/from-b.md", "b's\n");
    b.ok(&["sync"]);
    let slot = b
        .ok(&["key", "list"])
        .lines()
        .find(|l| l.contains("unlocked with"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_string();
    assert!(list.contains(&slot), "{list}");
    a.ok(&["sync"]);
    a.ok(&["key", "remove", &slot]);
    a.ok(&["sync"]);
    // b's next sync brings the removal (what b wrote before is on the hub)
    // and says so.
    let out = b.ok(&["sync"]);
    assert!(
        out.contains(&format!("warning: keyslot {slot}, which this machine unlocked the vault with, was removed on another machine")),
        "{out}"
    );
    let err = b.fails(&["history"], 1);
    assert!(
        err.contains(&format!(
            "keyslot {slot}, which this machine last unlocked it with, is gone from the vault"
        )),
        "{err}"
    );
    assert!(a.read("/memories/from-b.md").is_some());
}

/// A remote whose main was replaced by a commit holding a tree nested
/// deeper than git reads: refused as a remote that cannot be trusted,
/// whether read as a path or fetched, with nothing changed here (not
/// git's raw message).
#[test]
fn a_remote_holding_a_tree_deeper_than_git_reads_is_refused_as_untrusted() {
    let w = world(0);
    let a = &w.machines[0];
    let parent = String::from_utf8(git(&w.hub, &["rev-parse", "refs/heads/main"]).stdout)
        .unwrap()
        .trim()
        .to_string();
    let path = format!("{}/f", vec!["d"; 3000].join("/"));
    let stream = format!(
        "commit refs/heads/main\ncommitter a <a> 1 +0000\ndata 2\nm\nfrom {parent}\nM 100644 inline {path}\ndata 2\nx\n"
    );
    let out = run_with_stdin(
        Command::new("git").arg("--git-dir").arg(&w.hub).args([
            "fast-import",
            "--quiet",
            "--force",
        ]),
        stream.as_bytes(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let url = format!("file://{}", w.hub.display());
    a.ok(&["remote", "add", "fetched", &url]);
    let before = a.ok(&["history"]);
    for remote in ["origin", "fetched"] {
        let err = a.fails(&["sync", remote], 1);
        assert!(
            err.contains(&format!(
                "remote {remote} cannot be trusted: it holds a tree nested deeper than git reads"
            )),
            "{err}"
        );
        assert!(!err.contains("exceeded maximum"), "{err}");
    }
    assert_eq!(a.ok(&["history"]), before);
}

/// A remote restored from an older backup is refused as rolled back, and
/// the refusal says the way on when that was on purpose: forget what this
/// vault saw there (remove and add the remote again), then sync, which
/// sends the remote what it lost.
#[test]
fn a_remote_restored_from_a_backup_can_be_taken_on_again_as_the_refusal_says() {
    let w = world(0);
    let a = &w.machines[0];
    let backup = w.hub.with_extension("backup");
    copy_dir(&w.hub, &backup);
    a.write("/memories/later.md", "after the backup\n");
    a.ok(&["push"]);
    std::fs::remove_dir_all(&w.hub).unwrap();
    copy_dir(&backup, &w.hub);
    let err = a.fails(&["sync"], 1);
    assert!(err.contains("remote origin rolled back"), "{err}");
    assert!(
        err.contains("`memvault remote remove origin` and `memvault remote add origin URL`"),
        "{err}"
    );
    let url = w.hub.to_str().unwrap();
    a.ok(&["remote", "remove", "origin"]);
    a.ok(&["remote", "add", "origin", url]);
    let out = a.ok(&["sync"]);
    assert!(out.contains("pushed"), "{out}");
    let b = Machine::new(w.hub.parent().unwrap().join("fresh"), a.key.clone());
    b.ok(&["clone", url]);
    assert_eq!(
        b.read("/memories/later.md").as_deref(),
        Some("after the backup\n")
    );
}

/// A remote whose key state alone was put back to one from before a purge
/// (its main kept) is refused however this vault's record of it is reset,
/// and the refusal's way out works without bringing the purged key back:
/// a new remote started from the machine that synced last, which a
/// machine that is behind (and made a key-state change of its own) then
/// syncs with; the purged file stays unreadable everywhere.
#[test]
fn a_remote_whose_key_state_alone_was_put_back_is_refused_with_a_way_out_that_works() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    a.write("/memories/s.md", &format!("{MARK} secret\n"));
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    let backup = w.hub.with_extension("backup");
    copy_dir(&w.hub, &backup);
    a.ok(&["purge", "/memories/s.md"]);
    a.ok(&["sync"]);
    // B, behind, changes its key state on its own.
    let extra = w.hub.with_file_name("extra.key");
    b.ok(&["keygen", extra.to_str().unwrap()]);
    b.ok(&["key", "add", "--new-key-file", extra.to_str().unwrap()]);
    git(
        &w.hub,
        &[
            "fetch",
            "-q",
            backup.to_str().unwrap(),
            "+refs/memvault/keys:refs/memvault/keys",
        ],
    );
    a.fails(&["sync"], 1);
    let url = w.hub.to_str().unwrap();
    a.ok(&["remote", "remove", "origin"]);
    a.ok(&["remote", "add", "origin", url]);
    let err = a.fails(&["sync"], 1);
    assert!(
        err.contains("its key state is older than its main requires"),
        "{err}"
    );
    assert!(err.contains("memvault push NEW"), "{err}");
    assert!(!err.contains("--force"), "{err}");
    // A clone of that remote is refused for the same reason, said as
    // such (its main is this vault's), and makes nothing.
    let c = Machine::new(w.hub.with_file_name("c"), a.key.clone());
    let err = c.fails(&["clone", url], 1);
    assert!(
        err.contains("its key state is older than its main requires"),
        "{err}"
    );
    assert!(!c.dir.exists(), "a refused clone leaves nothing");
    // The way out.
    let fresh = w.hub.with_file_name("fresh.git");
    let out = std::process::Command::new("git")
        .args(["init", "-q", "--bare"])
        .arg(&fresh)
        .output()
        .unwrap();
    assert!(out.status.success());
    let fresh = fresh.to_str().unwrap();
    a.ok(&["remote", "add", "fresh", fresh]);
    a.ok(&["push", "fresh"]);
    b.ok(&["remote", "add", "fresh", fresh]);
    b.ok(&["sync", "fresh"]);
    a.ok(&["sync", "fresh"]);
    for m in [a, b] {
        assert!(m.read("/memories/s.md").is_none());
        let h = m.ok(&["history", "--json"]);
        let first = h
            .lines()
            .find(|l| l.contains("\"create\"") && l.contains("/memories/s.md"))
            .and_then(|l| serde_json::from_str::<Value>(l).ok())
            .unwrap();
        let o = m.run(&[
            "show",
            first["rev"].as_str().unwrap(),
            "/memories/s.md",
            "--raw",
        ]);
        let said = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "the purged version opens again");
        assert!(
            said.contains("erased") || said.contains("destroyed"),
            "{said}"
        );
        assert!(!String::from_utf8_lossy(&o.stdout).contains(MARK));
        assert!(m.ok(&["verify"]).starts_with("ok:"));
    }
}

/// Three machines: A expires a file, B (not told) edits it, C (not told)
/// purges it. B's merge keeps its edit under a new key; C's purge still
/// wins over it, in either order of the syncs (the merge's history names
/// the new key, and the purge takes it). And a rename made before the
/// expiry was heard of is use, as an edit is: the renamed file is kept.
#[test]
fn a_purge_elsewhere_takes_an_edit_kept_over_an_expiry_and_a_rename_counts_as_use() {
    const DAY: u64 = 86_400_000;
    let later = || {
        (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
            + 70 * DAY)
            .to_string()
    };
    for b_first in [true, false] {
        let w = world(2);
        let (a, b, c) = (&w.machines[0], &w.machines[1], &w.machines[2]);
        a.write("/memories/f.md", "f: first\n");
        a.write("/memories/r.md", "r: first\n");
        for m in [a, b, c] {
            m.ok(&["sync"]);
        }
        let o = a
            .cmd()
            .env("MEMVAULT_TEST_NOW_MS", later())
            .args(["expire", "--older-than", "30d"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        a.ok(&["sync"]);
        b.edit("/memories/f.md", "first", "edited on b");
        let r = b.exec(json!({"command": "rename", "old_path": "/memories/r.md", "new_path": "/memories/moved.md"}));
        assert!(!is_error(&r), "{r}");
        c.ok(&["purge", "/memories/f.md"]);
        let mut new_keys = std::collections::BTreeSet::new();
        if b_first {
            let before = keys_in_any_object(&b.dir, &b.key);
            let out = b.ok(&["sync"]);
            assert!(out.contains("kept: /memories/f.md"), "{out}");
            assert!(out.contains("kept: /memories/moved.md"), "{out}");
            // The two new keys: the edit's and the moved file's.
            new_keys = keys_in_any_object(&b.dir, &b.key)
                .difference(&before)
                .cloned()
                .collect();
            assert_eq!(new_keys.len(), 2);
            c.ok(&["sync"]);
        } else {
            c.ok(&["sync"]);
            b.ok(&["sync"]);
        }
        for _ in 0..2 {
            for m in [a, b, c] {
                m.ok(&["sync"]);
            }
        }
        for m in [a, b, c] {
            assert_eq!(m.read("/memories/f.md"), None, "b first: {b_first}");
            assert_eq!(
                m.read("/memories/moved.md").as_deref(),
                Some("r: first\n"),
                "b first: {b_first}"
            );
            m.ok(&["verify"]);
            // The edit's new key is destroyed everywhere; the moved file's
            // is held.
            if b_first {
                let held = keys_in_any_object(&m.dir, &m.key);
                assert_eq!(new_keys.intersection(&held).count(), 1);
            }
        }
    }
}

/// A remote whose main names a blob, or the commit of its views' ref
/// (MAC'd, but no commit of main): `clone` refuses it as a remote that
/// cannot be trusted and leaves no directory behind (it reported success,
/// and every command then said the vault was damaged).
#[test]
fn clone_refuses_a_remote_whose_main_is_not_a_commit_of_the_vault() {
    let w = world(0);
    let a = &w.machines[0];
    a.exec(json!({"command": "view", "path": "/memories/notes.md"}));
    a.ok(&["sync"]);
    let blob = run_with_stdin(
        Command::new("git")
            .arg("--git-dir")
            .arg(&w.hub)
            .args(["hash-object", "-w", "--stdin"]),
        b"hi\n",
    );
    let blob = String::from_utf8(blob.stdout).unwrap().trim().to_string();
    let access = String::from_utf8(git(&w.hub, &["rev-parse", "refs/memvault/access"]).stdout)
        .unwrap()
        .trim()
        .to_string();
    assert!(!access.is_empty());
    for (i, target) in [blob, access].iter().enumerate() {
        // Written as a file: git refuses a branch naming a blob.
        std::fs::write(w.hub.join("refs/heads/main"), format!("{target}\n")).unwrap();
        let dir = w.hub.parent().unwrap().join(format!("copy{i}"));
        let c = Machine::new(dir.clone(), a.key.clone());
        let err = c.fails(&["clone", w.hub.to_str().unwrap()], 1);
        assert!(err.contains("cannot be trusted"), "{err}");
        assert!(!dir.exists(), "a directory was left behind");
        // A machine that syncs with it: the remote is said to be at fault,
        // not this vault damaged.
        for cmd in [&["sync"][..], &["verify", "--remote", "origin"]] {
            let err = a.fails(cmd, 1);
            let said = format!("{err}{}", String::from_utf8_lossy(&a.run(cmd).stdout));
            assert!(said.contains("cannot be trusted"), "{cmd:?}: {said}");
            assert!(!said.contains("this vault is damaged"), "{said}");
        }
    }
}

/// The prune a push owes a path remote after replacing its key states (a
/// purge) is made by a later sync when it failed or was cut short, even
/// with nothing new to push: until then the destroyed key's state stayed
/// there, unreachable but readable.
#[test]
fn a_prune_owed_to_a_path_remote_is_made_by_the_next_sync() {
    let w = world(0);
    let a = &w.machines[0];
    a.write("/memories/secret.md", &format!("{MARK} to be erased\n"));
    a.ok(&["sync"]);
    a.ok(&["purge", "/memories/secret.md"]);
    let unreachable = || {
        let out = git(&w.hub, &["fsck", "--unreachable", "--no-reflogs"]);
        String::from_utf8_lossy(&out.stdout).lines().count()
    };
    // A gc lock left in the hub (a git gc killed there) makes the prune
    // fail; the push lands.
    std::fs::write(w.hub.join("gc.pid.lock"), "").unwrap();
    let out = a.run(&["sync"]);
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("gc.pid.lock"), "the cause is named: {said}");
    assert!(said.contains("the next push or sync tries again"), "{said}");
    assert!(unreachable() > 0, "the replaced key states are still there");
    std::fs::remove_file(w.hub.join("gc.pid.lock")).unwrap();
    let out = a.ok(&["sync"]);
    assert!(out.contains("pruned origin"), "{out}");
    assert_eq!(unreachable(), 0);
    // Owed no more.
    let out = a.ok(&["sync"]);
    assert!(!out.contains("pruned"), "{out}");
}

/// A file renamed on both machines to different names keeps both names:
/// this side's version at its name, the other's as a copy at the name it
/// gave (with its own edit), and the sync says so. Nothing is dropped
/// without a word. A folder of one side where the other has a file is
/// reported as where it went, naming the file that holds its place.
#[test]
fn a_file_renamed_apart_on_two_machines_keeps_both_names_and_is_reported() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    a.exec(json!({"command": "rename", "old_path": "/memories/notes.md", "new_path": "/memories/alpha.md"}));
    a.edit("/memories/alpha.md", "two", "two from A");
    b.exec(json!({"command": "rename", "old_path": "/memories/notes.md", "new_path": "/memories/archive/old.md"}));
    a.ok(&["sync"]);
    let out = b.ok(&["sync"]);
    assert!(
        out.contains("conflict: /memories/archive/old.md keeps this machine's version; the other side's is at /memories/alpha.md"),
        "{out}"
    );
    a.ok(&["sync"]);
    for m in [a, b] {
        let alpha = m.read("/memories/alpha.md").expect("A's name");
        assert!(alpha.contains("two from A"), "{alpha}");
        let old = m.read("/memories/archive/old.md").expect("B's name");
        assert!(!old.contains("from A"), "{old}");
        assert!(m.read("/memories/notes.md").is_none());
        assert!(m.ok(&["verify"]).starts_with("ok:"));
    }
    assert_eq!(a.files(), b.files());

    // Renamed apart where the other side's name is taken here by another
    // file: the copy goes beside this side's file, named after it, and the
    // other file is left out of the report.
    a.write("/memories/p.md", "p\n");
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    a.exec(
        json!({"command": "rename", "old_path": "/memories/p.md", "new_path": "/memories/q.md"}),
    );
    a.write("/memories/r.md", "unrelated\n");
    b.exec(
        json!({"command": "rename", "old_path": "/memories/p.md", "new_path": "/memories/r.md"}),
    );
    b.ok(&["sync"]);
    let out = a.ok(&["sync"]);
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("conflict:")).collect();
    assert_eq!(
        lines,
        [
            "conflict: /memories/q.md keeps this machine's version; the other side's is at /memories/q.conflict-1.md"
        ],
        "{out}"
    );
    assert_eq!(a.read("/memories/r.md").as_deref(), Some("unrelated\n"));
    assert_eq!(a.read("/memories/q.conflict-1.md").as_deref(), Some("p\n"));
    let briefing = a.ok(&["resume"]);
    assert!(
        briefing.contains("/memories/q.md: the other version is /memories/q.conflict-1.md"),
        "{briefing}"
    );

    // A file on one side where the other made a folder.
    a.write("/memories/X/y.md", "in a folder\n");
    b.write("/memories/X", "a file\n");
    a.ok(&["sync"]);
    let out = b.ok(&["sync"]);
    assert!(
        out.contains("conflict: /memories/X keeps this machine's version; the other side's is at /memories/X.conflict-1/y.md"),
        "{out}"
    );
    assert_eq!(
        b.read("/memories/X.conflict-1/y.md").as_deref(),
        Some("in a folder\n")
    );
}

/// A ref in a path remote that memvault does not write (a backup's) and
/// that still reaches a replaced key state keeps it there through the
/// prune: the sync says so, names the ref and keeps the prune owed, never
/// "pruned"; once the ref is gone the next sync prunes. A foreign ref
/// reaching nothing else (a copy of main) does not stop the prune. The
/// same for a worktree of the remote whose HEAD and index hold a key
/// state (what git's prune keeps besides refs).
#[test]
fn a_prune_that_another_ref_of_the_remote_defeats_is_not_reported_done() {
    let w = world(0);
    let a = &w.machines[0];
    a.write("/memories/secret.md", &format!("{MARK} to be erased\n"));
    a.ok(&["sync"]);
    let rev = |r: &str| {
        let out = git(&w.hub, &["rev-parse", r]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let old_keys = rev("refs/memvault/keys");
    let main = rev("refs/heads/main");
    git(&w.hub, &["update-ref", "refs/backup/keys", &old_keys]);
    git(&w.hub, &["update-ref", "refs/backup/main", &main]);
    a.ok(&["purge", "/memories/secret.md"]);
    let out = a.run(&["sync"]);
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(!printed.contains("pruned"), "{printed}");
    assert!(said.contains("refs/backup/keys"), "{said}");
    assert!(!said.contains("refs/backup/main"), "{said}");
    assert!(said.contains("the next push or sync tries again"), "{said}");
    git(&w.hub, &["cat-file", "-e", &old_keys]);
    // Still owed: the next sync says it again.
    let out = a.run(&["sync"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("refs/backup/keys"));
    git(&w.hub, &["update-ref", "-d", "refs/backup/keys"]);
    let out = a.ok(&["sync"]);
    assert!(out.contains("pruned origin"), "{out}");
    let gone = |id: &str| {
        !std::process::Command::new("git")
            .arg("--git-dir")
            .arg(&w.hub)
            .args(["cat-file", "-e", id])
            .output()
            .unwrap()
            .status
            .success()
    };
    assert!(gone(&old_keys), "the replaced key state is still there");
    // A worktree of the hub at a key state (its HEAD and index keep what
    // they hold through git's prune): named as such, the prune owed.
    a.write("/memories/two.md", &format!("{MARK} two\n"));
    a.ok(&["sync"]);
    let held = rev("refs/memvault/keys");
    let tree = w.hub.with_file_name("wt");
    git(
        &w.hub,
        &[
            "worktree",
            "add",
            "-q",
            "--detach",
            tree.to_str().unwrap(),
            &held,
        ],
    );
    a.ok(&["purge", "/memories/two.md"]);
    let out = a.run(&["sync"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("pruned"),
        "{said}"
    );
    assert!(said.contains("held by an index, a worktree"), "{said}");
    assert!(!gone(&held));
    git(
        &w.hub,
        &["worktree", "remove", "--force", tree.to_str().unwrap()],
    );
    let out = a.ok(&["sync"]);
    assert!(out.contains("pruned origin"), "{out}");
    assert!(gone(&held));
    // Another project's branch in the same hub holds no key state: no
    // alarm (it would repeat at every sync).
    let other = w.hub.with_file_name("other");
    let run_git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(&other)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    std::fs::create_dir(&other).unwrap();
    run_git(&["init", "-q"]);
    std::fs::write(other.join("readme"), "another project\n").unwrap();
    run_git(&["add", "readme"]);
    run_git(&[
        "-c",
        "user.name=x",
        "-c",
        "user.email=x@x",
        "commit",
        "-qm",
        "other",
    ]);
    run_git(&[
        "push",
        "-q",
        w.hub.to_str().unwrap(),
        "HEAD:refs/heads/unrelated",
    ]);
    a.write("/memories/three.md", "three\n");
    a.ok(&["sync"]);
    a.ok(&["purge", "/memories/three.md"]);
    let out = a.run(&["sync"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("pruned origin"),
        "{said}"
    );
    assert!(!said.contains("warning"), "{said}");
}

#[test]
fn a_path_remote_runs_none_of_its_hooks_and_one_whose_config_names_a_command_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let w = world(0);
    let a = &w.machines[0];
    let evidence = w.hub.with_file_name("ran");
    // Hooks in the remote's own hooks directory, and in a directory its
    // config names: git's receive-pack runs them on this machine unless
    // told otherwise.
    let hooks = w.hub.with_file_name("their-hooks");
    std::fs::create_dir(&hooks).unwrap();
    for dir in [w.hub.join("hooks"), hooks.clone()] {
        for name in [
            "pre-receive",
            "update",
            "post-receive",
            "post-update",
            "reference-transaction",
            "pre-auto-gc",
        ] {
            let hook = dir.join(name);
            std::fs::write(
                &hook,
                format!(
                    "#!/bin/sh\necho {name} >> '{}'\ncat >/dev/null\nexit 0\n",
                    evidence.display()
                ),
            )
            .unwrap();
            std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    let config = |args: &[&str]| {
        let out = git(&w.hub, &[&["config"], args].concat());
        assert!(out.status.success(), "{out:?}");
    };
    config(&["core.hooksPath", hooks.to_str().unwrap()]);
    config(&["receive.autogc", "true"]);
    a.write("/memories/one.md", "one\n");
    a.ok(&["push"]);
    a.write("/memories/two.md", &format!("{MARK} two\n"));
    a.ok(&["sync"]);
    // A purge's sync prunes the remote with `git gc` there.
    a.ok(&["purge", "/memories/two.md"]);
    let out = a.ok(&["sync"]);
    assert!(out.contains("pruned origin"), "{out}");
    assert!(
        !evidence.exists(),
        "{:?}",
        std::fs::read_to_string(&evidence)
    );

    // Settings that name a command git would run here, which a later `-c`
    // cannot all take back: refused before anything is sent or fetched.
    let main = |repo: &Path| git(repo, &["rev-parse", "refs/heads/main"]).stdout;
    for (key, value) in [
        ("core.alternateRefsCommand", "echo alt >> ran"),
        ("gc.recentObjectsHook", "echo recent >> ran"),
        ("diff.Mine.textconv", "cat"),
        ("include.path", "/dev/null"),
    ] {
        config(&[key, value]);
        a.write(&format!("/memories/{key}.md"), &format!("{key}\n"));
        let before = main(&w.hub);
        for args in [&["push"][..], &["sync"], &["pull"]] {
            let err = a.fails(args, 1);
            assert!(
                err.contains("git config names a command git would run here")
                    && err
                        .to_lowercase()
                        .contains(&format!("({})", key.to_lowercase()))
                    && !err.contains(value),
                "{err}"
            );
        }
        assert_eq!(main(&w.hub), before, "{key}: the remote moved");
        config(&["--unset", key]);
        a.ok(&["sync"]);
        assert_ne!(main(&w.hub), before);
    }
    // A config git cannot read (an include of a file that is not git
    // config): refused as unreadable, not as a command named "its config".
    let bad = w.hub.with_file_name("not-a-config");
    config(&["include.path", bad.to_str().unwrap()]);
    a.write("/memories/unreadable.md", "x\n");
    let before = main(&w.hub);
    std::fs::write(&bad, "not a git config file\n").unwrap();
    let err = a.fails(&["sync"], 1);
    assert!(
        err.contains("whose git config git cannot read") && !err.contains("--unset"),
        "{err}"
    );
    std::fs::remove_file(&bad).unwrap();
    assert_eq!(main(&w.hub), before);
    config(&["--unset", "include.path"]);
    a.ok(&["sync"]);
    assert!(
        !evidence.exists(),
        "{:?}",
        std::fs::read_to_string(&evidence)
    );
    let late = Machine::new(w.hub.with_file_name("late"), a.key.clone());
    late.ok(&["clone", w.hub.to_str().unwrap()]);
    assert_eq!(
        late.read("/memories/include.path.md").as_deref(),
        Some("include.path\n")
    );
    assert!(!evidence.exists());
}

#[test]
fn an_edit_or_delete_made_elsewhere_follows_a_file_a_purge_kept_under_a_new_key() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    let rename = |m: &Machine, from: &str, to: &str| {
        let r = m.exec(json!({"command": "rename", "old_path": from, "new_path": to}));
        assert_eq!(r["is_error"], false, "{r}");
    };
    // kept.md was old.md: a purge of old.md keeps it under a new key.
    a.write("/memories/old.md", "1\n2\n3\n");
    rename(a, "/memories/old.md", "/memories/kept.md");
    a.write("/memories/old.md", "new old\n");
    a.write("/memories/prefs.md", "p1\np2\n");
    a.write("/memories/x.md", "x\n");
    rename(a, "/memories/x.md", "/memories/y.md");
    a.write("/memories/x.md", "new x\n");
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    // b edits and deletes files a's purges keep, before it hears of them.
    b.edit("/memories/kept.md", "2", "edited on b");
    b.edit("/memories/prefs.md", "p2", "p2 and b's line");
    let r = b.exec(json!({"command": "delete", "path": "/memories/y.md"}));
    assert_eq!(r["is_error"], false, "{r}");
    let purged = a.ok(&["purge", "/memories/old.md"]);
    assert!(
        purged.contains("kept, re-encrypted under a new key  /memories/kept.md"),
        "{purged}"
    );
    a.ok(&["purge", "/memories/prefs.md", "--keep-current"]);
    a.ok(&["purge", "/memories/x.md"]);
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    a.ok(&["sync"]);
    for m in [a, b] {
        assert_eq!(
            m.read("/memories/kept.md").as_deref(),
            Some("1\nedited on b\n3\n")
        );
        assert_eq!(
            m.read("/memories/prefs.md").as_deref(),
            Some("p1\np2 and b's line\n")
        );
        assert_eq!(m.read("/memories/old.md"), None);
        assert_eq!(m.read("/memories/x.md"), None);
        // Deleted on b: not brought back by the purge's new key.
        assert_eq!(m.read("/memories/y.md"), None);
        m.ok(&["verify"]);
    }
    assert_eq!(a.files(), b.files());
}

#[test]
fn a_secret_completed_by_merging_two_machines_edits_is_filtered_as_a_write_would_be() {
    const BODY: &str =
        "VLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKf";
    for mode in ["redact", "reject"] {
        let w = world(1);
        let (a, b) = (&w.machines[0], &w.machines[1]);
        a.ok(&["config", "set", "redaction.mode", mode]);
        a.write(
            "/memories/k.md",
            "-----BEGIN RSA PRIVATE KEY-----\nTODO\nMIIEowIBAAKCAQEAu1SU1Lf\nkeep\n",
        );
        a.ok(&["sync"]);
        b.ok(&["sync"]);
        // Each edit alone leaves no whole key; the two together do. (With
        // an `END` line after it, the body alone is a key: the filter
        // takes the base64 lines before such a line.)
        a.edit("/memories/k.md", "TODO\n", "");
        b.edit("/memories/k.md", "keep", BODY);
        a.ok(&["sync"]);
        let out = b.ok(&["sync"]);
        a.ok(&["sync"]);
        let whole_key = |text: &str| text.contains(BODY) && !text.contains("TODO");
        for m in [a, b] {
            for (path, text) in m.files() {
                assert!(!whole_key(&text), "{mode}: {path} holds the whole key");
            }
            m.ok(&["verify"]);
        }
        if mode == "redact" {
            assert!(
                out.contains("redacted: the merged text of /memories/k.md (the two machines' edits together) held 1 secret (private-key)"),
                "{out}"
            );
            let text = b.read("/memories/k.md").unwrap();
            assert!(text.contains("[REDACTED:private-key]"), "{text}");
        } else {
            // Refused as a whole: the two versions stay apart, each as
            // its machine wrote it.
            assert!(out.contains("conflict: /memories/k.md"), "{out}");
            assert!(b.read("/memories/k.md").unwrap().contains(BODY));
            assert!(
                !b.read("/memories/k.conflict-1.md")
                    .unwrap()
                    .contains("TODO")
            );
        }
        assert_eq!(a.files(), b.files());
    }
}

#[test]
fn a_conflict_copy_of_a_file_whose_name_is_at_the_limit_gets_a_shorter_name() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    let path = format!("/memories/{}.md", "n".repeat(124));
    a.write(&path, "same line\n");
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    a.edit(&path, "same line", "a's line");
    b.edit(&path, "same line", "b's line");
    a.ok(&["sync"]);
    let out = b.ok(&["sync"]);
    a.ok(&["sync"]);
    let copy = format!("/memories/{}.conflict-1.md", "n".repeat(113));
    assert!(
        out.contains(&format!(
            "conflict: {path} keeps this machine's version; the other side's is at {copy}"
        )),
        "{out}"
    );
    for m in [a, b] {
        assert_eq!(m.read(&path).as_deref(), Some("b's line\n"));
        assert_eq!(m.read(&copy).as_deref(), Some("a's line\n"));
        m.ok(&["verify"]);
    }
}

#[test]
fn a_path_remote_named_without_its_git_suffix_is_checked_locked_and_pruned_as_git_opens_it() {
    let w = world(0);
    let a = &w.machines[0];
    // `.../hub` names `.../hub.git` for git (it tries DIR.git too).
    let short = w
        .hub
        .to_str()
        .unwrap()
        .strip_suffix(".git")
        .unwrap()
        .to_string();
    a.ok(&["remote", "add", "short", &short]);
    a.write("/memories/secret.md", &format!("{MARK} to be erased\n"));
    a.ok(&["sync", "short"]);
    let before: Vec<String> =
        String::from_utf8(git(&w.hub, &["rev-list", "refs/memvault/keys"]).stdout)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
    a.ok(&["purge", "/memories/secret.md"]);
    let out = a.ok(&["sync", "short"]);
    assert!(out.contains("pruned short"), "{out}");
    for old in &before {
        let found = Command::new("git")
            .arg("--git-dir")
            .arg(&w.hub)
            .args(["cat-file", "-e", old])
            .output()
            .unwrap();
        assert!(!found.status.success(), "{old} is still in the hub");
    }
    // Its config is the one checked.
    let out = git(&w.hub, &["config", "filter.evil.smudge", "cat"]);
    assert!(out.status.success());
    a.write("/memories/more.md", "more\n");
    let err = a.fails(&["sync", "short"], 1);
    assert!(err.contains("(filter.evil.smudge)"), "{err}");
}

#[test]
fn an_edit_made_elsewhere_follows_a_file_through_two_purges_that_kept_it() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    a.write("/memories/f.md", "line1\nline2\nline3\n");
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    b.edit("/memories/f.md", "line2", "line2 edited on b");
    // Two purges, with and without a sync between them.
    a.ok(&["purge", "/memories/f.md", "--keep-current"]);
    a.ok(&["sync"]);
    a.ok(&["purge", "/memories/f.md", "--keep-current"]);
    a.ok(&["purge", "/memories/f.md", "--keep-current"]);
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    a.ok(&["sync"]);
    for m in [a, b] {
        assert_eq!(
            m.read("/memories/f.md").as_deref(),
            Some("line1\nline2 edited on b\nline3\n")
        );
        m.ok(&["verify"]);
    }
}

/// Two machines that each add a keyslot for one key file before they sync
/// end up with two slots for one secret (the merge keeps both): `key
/// list` on a machine holding that secret marks the second, and `key
/// remove --force` of the one it unlocked with says the secret still
/// opens the vault (exit 1), not that it was revoked.
#[test]
fn two_slots_for_one_secret_merged_by_a_sync_are_shown_and_not_taken_for_a_revocation() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    let tmp = w.hub.parent().unwrap();
    let laptop_key = tmp.join("laptop.key");
    keygen(&laptop_key);
    let key = laptop_key.to_str().unwrap();
    a.ok(&["key", "add", "--new-key-file", key]);
    b.ok(&["key", "add", "--new-key-file", key]);
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    a.ok(&["sync"]);
    let laptop = Machine::new(tmp.join("laptop"), laptop_key.clone());
    laptop.ok(&["clone", w.hub.to_str().unwrap()]);
    let list = laptop.ok(&["key", "list"]);
    let mine: Vec<&str> = list
        .lines()
        .filter(|l| l.contains("(unlocked with)"))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    let also: Vec<&str> = list
        .lines()
        .filter(|l| l.contains("also opened by the secret you unlocked with"))
        .collect();
    assert_eq!((mine.len(), also.len()), (1, 1), "{list}");
    let err = laptop.fails(&["key", "remove", mine[0], "--force"], 1);
    assert!(
        err.contains("still opens this vault through keyslot"),
        "{err}"
    );
    // It does: the laptop's key still opens its copy.
    laptop.ok(&["key", "list"]);
}

/// A sync that brings an erasure and is killed before its prune leaves
/// the erasure marker: the next command here prunes, so the key state
/// that held the destroyed key is gone from this copy too.
#[test]
fn a_sync_killed_between_an_incoming_erasure_and_its_prune_is_pruned_by_the_next_command() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    a.write("/memories/secret.md", &format!("{MARK} to be erased\n"));
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    let old = String::from_utf8(git(&b.dir, &["rev-parse", "refs/memvault/keys"]).stdout)
        .unwrap()
        .trim()
        .to_string();
    a.ok(&["purge", "/memories/secret.md"]);
    a.ok(&["sync"]);
    let out = b
        .cmd()
        .arg("sync")
        .env("MEMVAULT_TEST_CRASH", "after-merge-erasure")
        .output()
        .unwrap();
    assert!(!out.status.success(), "the crash hook did not fire");
    assert!(b.dir.join("memvault/erase-pending").exists());
    // Any writer finishes it.
    b.write("/memories/after.md", "x\n");
    assert!(!b.dir.join("memvault/erase-pending").exists());
    let found = Command::new("git")
        .arg("--git-dir")
        .arg(&b.dir)
        .args(["cat-file", "-e", &old])
        .output()
        .unwrap();
    assert!(!found.status.success(), "the key state {old} is still here");
    assert_eq!(b.read("/memories/secret.md"), None);
    b.ok(&["verify"]);
}

/// A machine name holding a secret is refused, naming the kind found and
/// nothing about labels it was not given; the name stays as it was.
#[test]
fn a_machine_name_holding_a_secret_is_refused_and_changes_nothing() {
    let w = world(0);
    let a = &w.machines[0];
    let before = a.ok(&["machine"]);
    let out = a.run(&["machine", "--name", "laptop AKIAPTGZ6JFEBZSDOXRL"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("aws-access-key-id"), "{said}");
    assert!(
        !said.contains("--session") && !said.contains("AKIA"),
        "{said}"
    );
    assert_eq!(a.ok(&["machine"]), before);
}

/// A machine that had not heard of a purge pushes its own key state over
/// the remote's with plain git (`push --force`, or a backup put back):
/// its merge of the purge commit still destroys the purged key (the
/// purge's record wins, not only the key state it came with), the purging
/// machine never takes the key back, a clone made before either synced is
/// refused, and one made after cannot read the purged text.
#[test]
fn a_key_state_forced_over_a_purge_does_not_bring_the_purged_key_back() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    a.write("/memories/f.md", &format!("{MARK} erase me\n"));
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    a.ok(&["purge", "/memories/f.md"]);
    a.ok(&["sync"]);
    let extra = w.hub.with_file_name("extra.key");
    b.ok(&["key", "add", "--new-key-file", extra.to_str().unwrap()]);
    let url = w.hub.to_str().unwrap();
    let out = std::process::Command::new("git")
        .arg("--git-dir")
        .arg(&b.dir)
        .args([
            "push",
            "-q",
            "--force",
            url,
            "refs/memvault/keys:refs/memvault/keys",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // A clone of the remote as it is now (its key state is not the one
    // its main was made with) is refused, nothing made.
    let early = Machine::new(w.hub.parent().unwrap().join("early"), a.key.clone());
    early.fails(&["clone", url], 1);
    assert!(!early.dir.exists() || std::fs::read_dir(&early.dir).unwrap().next().is_none());
    b.ok(&["sync"]);
    a.ok(&["sync"]);
    let c = Machine::new(w.hub.parent().unwrap().join("fresh"), a.key.clone());
    c.ok(&["clone", url]);
    for m in [a, b, &c] {
        m.ok(&["sync"]);
        let h = m.ok(&["history", "--json"]);
        let created = h
            .lines()
            .find(|l| l.contains("\"create\"") && l.contains("/memories/f.md"))
            .and_then(|l| serde_json::from_str::<Value>(l).ok())
            .unwrap();
        let o = m.run(&[
            "show",
            created["rev"].as_str().unwrap(),
            "/memories/f.md",
            "--raw",
        ]);
        assert!(!o.status.success(), "the purged text opens again");
        assert!(!String::from_utf8_lossy(&o.stdout).contains(MARK));
        let report = m.ok(&["verify"]);
        assert!(
            report.starts_with("ok:") && !report.contains(" 0 erased"),
            "{report}"
        );
    }
}

/// Round 36b: a remote reached as a path whose lock file another process
/// holds (a memvault stuck while pushing there from a machine sharing the
/// disk, or the remote's owner) is given up on within `--remote-timeout`,
/// for a sync, a push, a pull and a clone alike, with a message that names
/// the remote's lock, and nothing changes here; once the lock is let go,
/// the next sync lands.
#[test]
fn a_remote_lock_held_elsewhere_is_given_up_on_within_the_remote_timeout() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    a.write("/memories/after.md", "after\n");
    let head = git(&a.dir, &["rev-parse", "refs/heads/main"]).stdout;
    let lock_file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(w.hub.join("memvault.lock"))
        .unwrap();
    lock_file.lock().unwrap();
    let bounded = |m: &Machine, args: &[&str]| -> Output {
        let started = std::time::Instant::now();
        let mut child = m
            .cmd()
            .args(["--remote-timeout", "2"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        loop {
            if child.try_wait().unwrap().is_some() {
                break child.wait_with_output().unwrap();
            }
            if started.elapsed() > std::time::Duration::from_secs(30) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("memvault {args:?} still waits on the remote's lock after 30 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    let clone_dir = w.hub.with_file_name("late");
    let late = Machine::new(clone_dir.clone(), a.key.clone());
    for (m, args) in [
        (a, vec!["sync"]),
        (a, vec!["push"]),
        (b, vec!["pull"]),
        (&late, vec!["clone", w.hub.to_str().unwrap()]),
    ] {
        let out = bounded(m, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("lock file") && err.contains("--remote-timeout"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("the vault's lock"), "{args:?}: {err}");
    }
    assert!(!clone_dir.exists());
    assert_eq!(git(&a.dir, &["rev-parse", "refs/heads/main"]).stdout, head);
    assert_eq!(b.read("/memories/after.md"), None);
    drop(lock_file);
    a.ok(&["sync"]);
    b.ok(&["pull"]);
    assert_eq!(b.read("/memories/after.md").as_deref(), Some("after\n"));
}

/// Round 36b: two clones into one place at once: the one that loses says
/// the place is taken and leaves no copy of the vault beside it (a
/// leftover copy is out of reach of every later erasure); and a staging
/// folder a killed clone left (no process holds it) is erased by the next
/// clone beside it, while one that a running clone holds is not.
#[test]
fn a_clone_that_loses_the_race_for_its_place_or_was_killed_leaves_no_copy_behind() {
    let w = world(0);
    let a = &w.machines[0];
    let tmp = w.hub.parent().unwrap().to_path_buf();
    let url = w.hub.to_str().unwrap().to_string();
    let staged = |tmp: &Path| -> Vec<String> {
        std::fs::read_dir(tmp)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".clone-") || n.contains(".init-"))
            .collect()
    };
    for round in 0..3 {
        let dir = tmp.join(format!("p{round}"));
        let m = Machine::new(dir.clone(), a.key.clone());
        let children: Vec<_> = (0..2)
            .map(|_| {
                m.cmd()
                    .args(["clone", &url])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let outs: Vec<Output> = children
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect();
        let won = outs.iter().filter(|o| o.status.success()).count();
        assert!(won >= 1, "round {round}: no clone landed");
        for o in outs.iter().filter(|o| !o.status.success()) {
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                err.contains("not an empty directory"),
                "round {round}: {err}"
            );
        }
        assert_eq!(staged(&tmp), Vec::<String>::new(), "round {round}");
        m.ok(&["verify"]);
    }
    // What a clone killed part way leaves: a staging folder no process
    // holds (here a whole copy of the vault, moved aside by hand).
    let killed = tmp.join(".q.clone-0123456789ab");
    std::fs::rename(tmp.join("p0"), &killed).unwrap();
    // One a running clone holds (locked) is left alone.
    let running = tmp.join(".q.clone-abcdefabcdef");
    std::fs::create_dir(&running).unwrap();
    let held = std::fs::File::open(&running).unwrap();
    held.lock().unwrap();
    let q = Machine::new(tmp.join("q"), a.key.clone());
    q.ok(&["clone", &url]);
    assert!(!killed.exists(), "the killed clone's copy is still there");
    assert!(running.exists());
    drop(held);
}

/// Round 36b: a remote whose loose `refs/heads/main` is a link (git
/// follows it; memvault reads no ref through a link) is not read from the
/// older line `packed-refs` holds for it: a clone gets the newest main,
/// and a sync neither reports a rollback nor gets stuck.
#[test]
fn a_remote_ref_that_is_a_link_is_not_passed_over_for_an_older_packed_one() {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    git(&w.hub, &["pack-refs", "--all"]);
    a.write("/memories/two.md", "two\n");
    a.ok(&["push"]);
    let main = w.hub.join("refs/heads/main");
    let target = w.hub.join("main-target");
    std::fs::rename(&main, &target).unwrap();
    std::os::unix::fs::symlink(&target, &main).unwrap();
    let late = Machine::new(w.hub.with_file_name("late"), a.key.clone());
    late.ok(&["clone", w.hub.to_str().unwrap()]);
    assert_eq!(late.read("/memories/two.md").as_deref(), Some("two\n"));
    a.ok(&["sync"]);
    a.ok(&["verify", "--remote", "origin"]);
    b.ok(&["sync"]);
    assert_eq!(b.read("/memories/two.md").as_deref(), Some("two\n"));
    late.write("/memories/three.md", "three\n");
    late.ok(&["sync"]);
    a.ok(&["sync"]);
    assert_eq!(a.read("/memories/three.md").as_deref(), Some("three\n"));
}

/// Round 36b: a clone of a remote whose refs were swapped (main names the
/// key state, the key state ref names main) says the remote cannot be
/// trusted, as a pull does, not that a (local) vault is damaged.
#[test]
fn a_clone_of_a_remote_with_swapped_refs_says_the_remote_cannot_be_trusted() {
    let w = world(0);
    let a = &w.machines[0];
    let id = |r: &str| String::from_utf8(git(&w.hub, &["rev-parse", r]).stdout).unwrap();
    let (main, keys) = (id("refs/heads/main"), id("refs/memvault/keys"));
    git(&w.hub, &["update-ref", "refs/heads/main", keys.trim()]);
    git(&w.hub, &["update-ref", "refs/memvault/keys", main.trim()]);
    let late = Machine::new(w.hub.with_file_name("late"), a.key.clone());
    let err = late.fails(&["clone", w.hub.to_str().unwrap()], 1);
    assert!(err.contains("cannot be trusted"), "{err}");
    assert!(!err.contains("vault is damaged"), "{err}");
    assert!(!late.dir.exists());
}
