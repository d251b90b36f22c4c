//! Key management through the real binary: `passwd`, `key add|list|remove`,
//! `rekey`, hostile keyslot parameters on disk, and `passwd` killed at
//! random moments (the old or the new passphrase always opens the vault).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use memvault::crypto::{Passphrase, Unlock};
use memvault::vault::{Attribution, Vault, VaultError};
use serde_json::json;

use crate::util::*;

const TINY: [&str; 4] = ["--argon2-memory", "64", "--argon2-passes", "1"];

/// A vault unlocked by a passphrase (tiny Argon2 parameters).
struct PassVault {
    tmp: tempfile::TempDir,
    vault: PathBuf,
}

impl PassVault {
    fn new(pass: &str) -> PassVault {
        let tmp = tempfile::tempdir().unwrap();
        let vault = tmp.path().join("v");
        let v = PassVault { tmp, vault };
        let out = v.cmd(pass).arg("init").args(TINY).output().unwrap();
        assert!(out.status.success(), "init: {}", stderr(&out));
        v
    }

    /// A command unlocked with `pass` (through MEMVAULT_PASSPHRASE).
    fn cmd(&self, pass: &str) -> Command {
        let mut c = Command::new(bin());
        c.arg("--vault").arg(&self.vault);
        c.env_remove("MEMVAULT_DIR")
            .env_remove("MEMVAULT_KEY_FILE")
            .env_remove("MEMVAULT_NEW_PASSPHRASE")
            .env("MEMVAULT_PASSPHRASE", pass);
        c
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.tmp.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// `passwd` unlocked with `pass`, the new passphrase in `file`.
    fn passwd(&self, pass: &str, file: &Path, options: &[&str]) -> Output {
        self.cmd(pass)
            .arg("passwd")
            .arg("--new-passphrase-file")
            .arg(file)
            .args(options)
            .output()
            .unwrap()
    }

    fn exec(&self, pass: &str, cmd: serde_json::Value) -> Output {
        self.cmd(pass)
            .args(["exec", &cmd.to_string()])
            .output()
            .unwrap()
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn view(path: &str) -> serde_json::Value {
    json!({"command": "view", "path": path})
}

fn open_with_pass(dir: &Path, pass: &str) -> Result<Vault, VaultError> {
    let p = Passphrase::new(pass.to_owned());
    let who = Attribution {
        session: "test".into(),
        actor: "test".into(),
    };
    Vault::open(dir, &Unlock::Passphrase(&p), who)
}

/// The epoch in front of a commit's sealed metadata (the commit message
/// is its base64).
fn meta_epoch(vault: &Path, rev: &str) -> u32 {
    let out = git(vault, &["log", "-1", "--format=%B", rev]);
    let sealed = data_encoding::BASE64
        .decode(String::from_utf8(out.stdout).unwrap().trim().as_bytes())
        .unwrap();
    u32::from_be_bytes(sealed[..4].try_into().unwrap())
}

/// The epochs of the key-table shards (`"MVKT" || version || epoch`).
fn shard_epochs(vault: &Path) -> Vec<u32> {
    let out = git(vault, &["ls-tree", "-r", "refs/memvault/keys:table"]);
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let oid = l.split_whitespace().nth(2).unwrap();
            let blob = git(vault, &["cat-file", "blob", oid]).stdout;
            assert_eq!(&blob[..4], b"MVKT");
            u32::from_be_bytes(blob[5..9].try_into().unwrap())
        })
        .collect()
}

fn slot_ids(list: &str) -> Vec<String> {
    list.lines()
        .filter(|l| !l.starts_with("key epoch"))
        .map(|l| l.split(' ').next().unwrap().to_string())
        .collect()
}

/// `passwd` without Argon2 options keeps the replaced slot's parameters
/// (it took the defaults, so a slot made stronger, or lighter, than them
/// changed strength with its passphrase; round 40d); given ones win.
#[test]
fn passwd_keeps_the_replaced_slots_argon2_parameters_unless_told() {
    let v = PassVault::new("old secret");
    let newfile = v.file("new.txt", "new secret\n");
    let out = v.passwd("old secret", &newfile, &[]);
    assert!(out.status.success(), "passwd: {}", stderr(&out));
    let out = v.cmd("new secret").args(["key", "list"]).output().unwrap();
    assert!(
        stdout(&out).contains("passphrase argon2id m=64KiB t=1 p=1"),
        "{}",
        stdout(&out)
    );
    let newer = v.file("newer.txt", "newer secret\n");
    let out = v.passwd("new secret", &newer, &["--argon2-passes", "2"]);
    assert!(out.status.success(), "passwd: {}", stderr(&out));
    let out = v
        .cmd("newer secret")
        .args(["key", "list"])
        .output()
        .unwrap();
    assert!(
        stdout(&out).contains("passphrase argon2id m=64KiB t=2 p=1"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn passwd_old_stops_new_works_data_intact() {
    let v = PassVault::new("old secret");
    let out = v.exec(
        "old secret",
        json!({"command": "create", "path": "/memories/a.md", "file_text": "kept\n"}),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let commits = git(&v.vault, &["rev-list", "--count", "refs/heads/main"]).stdout;

    let old_slot = git_text(&v.vault, &["ls-tree", "refs/memvault/keys:slots"], None)
        .split_whitespace()
        .nth(2)
        .unwrap()
        .to_string();
    let newfile = v.file("new.txt", "new secret\n");
    let out = v.passwd("old secret", &newfile, &TINY);
    assert!(out.status.success(), "passwd: {}", stderr(&out));
    assert!(stdout(&out).is_empty());
    for secret in ["old secret", "new secret"] {
        assert!(!stderr(&out).contains(secret), "a secret was printed");
    }

    let old = v.exec("old secret", view("/memories/a.md"));
    assert_eq!(old.status.code(), Some(1));
    assert!(stderr(&old).contains("does not unlock"), "{}", stderr(&old));
    let new = v.exec("new secret", view("/memories/a.md"));
    assert!(new.status.success(), "{}", stderr(&new));
    assert!(stdout(&new).contains("kept"), "{}", stdout(&new));
    // One commit on main records the key change (the tree is unchanged).
    let count = |o: Vec<u8>| {
        String::from_utf8(o)
            .unwrap()
            .trim()
            .parse::<usize>()
            .unwrap()
    };
    let after = git(&v.vault, &["rev-list", "--count", "refs/heads/main"]).stdout;
    assert_eq!(count(commits) + 1, count(after));
    let tree = |r: &str| git_text(&v.vault, &["rev-parse", &format!("{r}^{{tree}}")], None);
    assert_eq!(tree("refs/heads/main"), tree("refs/heads/main~1"));
    let history = v.cmd("new secret").arg("history").output().unwrap();
    assert!(stdout(&history).contains("passwd"), "{}", stdout(&history));

    // After gc, the old slot (which the old passphrase opens) is gone.
    let out = v.cmd("new secret").arg("gc").output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let gone = Command::new("git")
        .arg("--git-dir")
        .arg(&v.vault)
        .args(["cat-file", "-e", &old_slot])
        .output()
        .unwrap();
    assert!(!gone.status.success(), "the old keyslot survived gc");

    // Again through MEMVAULT_NEW_PASSPHRASE.
    let out = v
        .cmd("new secret")
        .arg("passwd")
        .args(TINY)
        .env("MEMVAULT_NEW_PASSPHRASE", "third secret")
        .output()
        .unwrap();
    assert!(out.status.success(), "passwd: {}", stderr(&out));
    assert_eq!(
        v.exec("new secret", view("/memories")).status.code(),
        Some(1)
    );
    assert!(v.exec("third secret", view("/memories")).status.success());

    // No new passphrase and no terminal: a clear error, nothing changed.
    let out = v
        .cmd("third secret")
        .arg("passwd")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    if out.status.success() {
        panic!("passwd without a new passphrase succeeded");
    }
    assert!(v.exec("third secret", view("/memories")).status.success());
}

#[test]
fn passwd_refuses_hostile_new_params() {
    let v = PassVault::new("p");
    let out = v
        .cmd("p")
        .args(["passwd", "--argon2-memory", "4294967295"])
        .env("MEMVAULT_NEW_PASSPHRASE", "q")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("Argon2"));
    assert!(v.exec("p", view("/memories")).status.success());
}

#[test]
fn key_add_list_remove() {
    let v = TestVault::new();
    let list = v.cmd().args(["key", "list"]).output().unwrap();
    assert!(list.status.success(), "{}", stderr(&list));
    let text = stdout(&list);
    assert_eq!(slot_ids(&text).len(), 1);
    assert!(text.contains("key-file (unlocked with)"), "{text}");
    let keyfile_slot = slot_ids(&text)[0].clone();

    // A second secret: a passphrase slot.
    let pf = v.tmp.path().join("pass.txt");
    std::fs::write(&pf, "second way in\n").unwrap();
    let out = v
        .cmd()
        .args(["key", "add", "--new-passphrase-file"])
        .arg(&pf)
        .args(TINY)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("second way in"));

    let list = stdout(&v.cmd().args(["key", "list"]).output().unwrap());
    assert_eq!(slot_ids(&list).len(), 2, "{list}");
    assert!(
        list.contains("passphrase argon2id m=64KiB t=1 p=1"),
        "{list}"
    );
    assert!(!list.contains("second way in"));

    let by_pass = |args: &[&str]| {
        Command::new(bin())
            .arg("--vault")
            .arg(&v.vault)
            .arg("--passphrase-file")
            .arg(&pf)
            .env_remove("MEMVAULT_KEY_FILE")
            .env_remove("MEMVAULT_PASSPHRASE")
            .args(args)
            .output()
            .unwrap()
    };
    let out = by_pass(&["exec", r#"{"command":"view","path":"/memories"}"#]);
    assert!(out.status.success(), "{}", stderr(&out));

    // A third: another key file.
    let k2 = v.tmp.path().join("second.key");
    assert!(
        Command::new(bin())
            .arg("keygen")
            .arg(&k2)
            .output()
            .unwrap()
            .status
            .success()
    );
    let out = v
        .cmd()
        .args(["key", "add", "--new-key-file"])
        .arg(&k2)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let list = stdout(&v.cmd().args(["key", "list"]).output().unwrap());
    assert_eq!(slot_ids(&list).len(), 3, "{list}");
    // A secret that already opens a slot gets no second one (removing
    // either would claim a revocation that did not happen): the same key
    // file, the key file unlocked with, the same passphrase.
    let refs_before = git_text(&v.vault, &["for-each-ref"], None);
    for (flag, secret) in [
        ("--new-key-file", &k2),
        ("--new-key-file", &v.key),
        ("--new-passphrase-file", &pf),
    ] {
        let out = v
            .cmd()
            .args(["key", "add", flag])
            .arg(secret)
            .args(if flag == "--new-passphrase-file" {
                &TINY[..]
            } else {
                &[]
            })
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{flag}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("already opens keyslot"),
            "{}",
            stderr(&out)
        );
    }
    assert_eq!(git_text(&v.vault, &["for-each-ref"], None), refs_before);
    let list = stdout(&v.cmd().args(["key", "list"]).output().unwrap());
    assert_eq!(slot_ids(&list).len(), 3, "{list}");
    let k2_slot = slot_ids(&list)
        .into_iter()
        .find(|id| *id != keyfile_slot && list.contains(&format!("{id} key-file")))
        .unwrap();

    // The slot we unlocked with: only with --force.
    let out = v
        .cmd()
        .args(["key", "remove", &keyfile_slot])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("--force"), "{}", stderr(&out));
    // An unknown id.
    let out = v
        .cmd()
        .args(["key", "remove", "0123456789abcdef"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no keyslot"), "{}", stderr(&out));

    // Removed from another secret: the first key file stops working.
    let out = by_pass(&["key", "remove", &keyfile_slot]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = v
        .cmd()
        .args(["exec", r#"{"command":"view","path":"/memories"}"#])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));

    // --force removes the slot unlocked with, while another remains.
    let out = by_pass(&["key", "remove", "--force"]);
    assert_eq!(out.status.code(), Some(2), "the id is required");
    let list = stdout(&by_pass(&["key", "list"]));
    let pass_slot = slot_ids(&list)
        .into_iter()
        .find(|id| *id != k2_slot)
        .unwrap();
    let out = by_pass(&["key", "remove", "--force", &pass_slot]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(by_pass(&["key", "list"]).status.code(), Some(1));

    // The last slot is never removed, not even with --force.
    let with_k2 = |args: &[&str]| {
        Command::new(bin())
            .arg("--vault")
            .arg(&v.vault)
            .arg("--key-file")
            .arg(&k2)
            .env_remove("MEMVAULT_PASSPHRASE")
            .args(args)
            .output()
            .unwrap()
    };
    let out = with_k2(&["key", "remove", "--force", &k2_slot]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("last keyslot"), "{}", stderr(&out));
    assert!(with_k2(&["key", "list"]).status.success());
}

#[test]
fn rekey_new_writes_use_the_new_epoch_old_history_opens() {
    let v = TestVault::new();
    let r =
        v.one(json!({"command": "create", "path": "/memories/old.md", "file_text": "before\n"}));
    assert!(!is_error(&r), "{r}");
    assert_eq!(meta_epoch(&v.vault, "refs/heads/main"), 0);
    assert_eq!(shard_epochs(&v.vault), vec![0]);

    // A second slot blocks a rekey (its secret is not here to rewrap it).
    let k2 = v.tmp.path().join("second.key");
    Command::new(bin()).arg("keygen").arg(&k2).output().unwrap();
    let out = v
        .cmd()
        .args(["key", "add", "--new-key-file"])
        .arg(&k2)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let out = v.cmd().arg("rekey").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("--drop-other-slots"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        slot_ids(&stdout(&v.cmd().args(["key", "list"]).output().unwrap())).len(),
        2
    );

    let before = slot_ids(&stdout(&v.cmd().args(["key", "list"]).output().unwrap()));
    let out = v
        .cmd()
        .args(["rekey", "--drop-other-slots"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("epoch 1"), "{}", stderr(&out));
    let list = stdout(&v.cmd().args(["key", "list"]).output().unwrap());
    assert_eq!(slot_ids(&list).len(), 1, "{list}");
    // History says what happened to every slot: the one rewrapped (its
    // old and new ids) and the one dropped.
    let new_slot = &slot_ids(&list)[0];
    let out = v
        .cmd()
        .args(["history", "--json", "--op", "rekey"])
        .output()
        .unwrap();
    let details = stdout(&out);
    assert!(details.contains(&format!("by {new_slot}")), "{details}");
    for id in &before {
        assert!(details.contains(id.as_str()), "{id} missing: {details}");
    }
    assert!(details.contains("removed keyslot"), "{details}");
    assert!(list.contains("key epoch 1"), "{list}");
    // The dropped key file no longer opens the vault.
    let out = Command::new(bin())
        .arg("--vault")
        .arg(&v.vault)
        .arg("--key-file")
        .arg(&k2)
        .args(["key", "list"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));

    let r = v.one(json!({"command": "create", "path": "/memories/new.md", "file_text": "after\n"}));
    assert!(!is_error(&r), "{r}");
    assert_eq!(meta_epoch(&v.vault, "refs/heads/main"), 1);
    // main~1 is the rekey's own commit, sealed under the new epoch; the
    // key add before it, under the old one.
    assert_eq!(meta_epoch(&v.vault, "refs/heads/main~1"), 1);
    assert_eq!(meta_epoch(&v.vault, "refs/heads/main~2"), 0);
    assert!(shard_epochs(&v.vault).contains(&1));

    // Old and new content, history and verify all work after the rekey.
    let r = v.one(view("/memories/old.md"));
    assert!(text(&r).contains("before"), "{r}");
    let r = v.one(view("/memories/new.md"));
    assert!(text(&r).contains("after"), "{r}");
    let out = v.cmd().arg("history").output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("/memories/old.md"));
    let out = v.cmd().arg("verify").output().unwrap();
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));

    // Through the library: the keyring holds both epochs.
    let lib = v.open_library("check");
    assert_eq!(lib.keys().current_epoch(), 1);
    assert!(lib.keyring().data_key(0).is_some());
    drop(lib);

    // A second rekey: epoch 2, and everything still opens.
    let out = v.cmd().arg("rekey").output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let r = v.one(json!({"command": "str_replace", "path": "/memories/old.md", "old_str": "before", "new_str": "edited"}));
    assert!(!is_error(&r), "{r}");
    assert_eq!(meta_epoch(&v.vault, "refs/heads/main"), 2);
    let out = v
        .cmd()
        .args(["show", "HEAD~2", "/memories/old.md"])
        .output();
    let out = out.unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("before"), "{}", stdout(&out));
    // The mark the last `verify` left (epoch 1) still checks out under
    // epoch 2: `verify` passes and `gc` runs.
    for cmd in ["verify", "gc", "verify"] {
        let out = v.cmd().arg(cmd).output().unwrap();
        assert!(
            out.status.success(),
            "{cmd}: {}{}",
            stdout(&out),
            stderr(&out)
        );
    }
}

#[test]
fn passphrase_rekey_keeps_the_passphrase() {
    let v = PassVault::new("pw");
    let out = v.cmd("pw").arg("rekey").output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let list = stdout(&v.cmd("pw").args(["key", "list"]).output().unwrap());
    assert!(list.contains("m=64KiB t=1 p=1"), "{list}");
    assert!(list.contains("key epoch 1"), "{list}");
    assert_eq!(v.exec("wrong", view("/memories")).status.code(), Some(1));
}

/// Replace the one passphrase slot's Argon2 parameters on disk (git
/// plumbing; the slot's tag no longer matches, which is never reached).
fn make_slot_hostile(vault: &Path, m_kib: u32, t: u32) {
    let line =
        String::from_utf8(git(vault, &["ls-tree", "refs/memvault/keys:slots"]).stdout).unwrap();
    let mut fields = line.split_whitespace();
    let (_, _, oid, name) = (
        fields.next(),
        fields.next(),
        fields.next().unwrap(),
        fields.next().unwrap(),
    );
    let mut blob = git(vault, &["cat-file", "blob", oid]).stdout;
    assert_eq!(blob[5], 1, "a passphrase slot");
    blob[30..34].copy_from_slice(&m_kib.to_be_bytes());
    blob[34..38].copy_from_slice(&t.to_be_bytes());
    let path = vault.join("hostile-slot");
    std::fs::write(&path, &blob).unwrap();
    let new = git_text(vault, &["hash-object", "-w", path.to_str().unwrap()], None);
    let slots = git_text(
        vault,
        &["mktree"],
        Some(format!("100644 blob {new}\t{name}\n")),
    );
    let root = String::from_utf8(git(vault, &["ls-tree", "refs/memvault/keys"]).stdout)
        .unwrap()
        .lines()
        .map(|l| {
            if l.ends_with("\tslots") {
                format!("040000 tree {slots}\tslots\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect::<String>();
    let root = git_text(vault, &["mktree"], Some(root));
    let commit = git_text(vault, &["commit-tree", &root, "-m", "hostile"], None);
    git(vault, &["update-ref", "refs/memvault/keys", &commit]);
}

fn git_text(repo: &Path, args: &[&str], input: Option<String>) -> String {
    let mut cmd = Command::new("git");
    cmd.arg("--git-dir").arg(repo).args(args);
    let out = run_with_stdin(&mut cmd, input.unwrap_or_default().as_bytes());
    assert!(out.status.success(), "git {args:?}: {}", stderr(&out));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn hostile_slot_params_on_disk_are_refused_before_any_work() {
    for (m_kib, t) in [(u32::MAX, 1), (64, 1_000_000), (4_194_305, 100)] {
        let v = PassVault::new("pw");
        make_slot_hostile(&v.vault, m_kib, t);
        let start = Instant::now();
        for args in [
            &["exec", r#"{"command":"view","path":"/memories"}"#][..],
            &["key", "list"],
            &["passwd"],
            &["rekey"],
        ] {
            let out = v
                .cmd("pw")
                .args(args)
                .env("MEMVAULT_NEW_PASSPHRASE", "x")
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(1), "{args:?}");
            assert!(
                stderr(&out).contains("exceed the allowed maximum"),
                "{args:?}: {}",
                stderr(&out)
            );
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "hostile parameters were worked on"
        );
    }
}

/// `memvault passwd` killed with SIGKILL at seeded random moments: after
/// each kill the old or the new passphrase opens the vault (never neither,
/// never both), and the content is intact.
#[test]
fn passwd_killed_at_random_moments_leaves_one_passphrase_working() {
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
        }
    }
    let mut rng = Rng(0x6b65_7973_2d70_7764);
    let v = PassVault::new("pass-0");
    let out = v.exec(
        "pass-0",
        json!({"command": "create", "path": "/memories/a.md", "file_text": "survives\n"}),
    );
    assert!(out.status.success(), "{}", stderr(&out));

    // How long an uninterrupted run takes here, to spread the kills over.
    let start = Instant::now();
    let out = v
        .cmd("pass-0")
        .arg("passwd")
        .args(TINY)
        .env("MEMVAULT_NEW_PASSPHRASE", "pass-1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let full = start.elapsed().as_micros() as u64;
    let mut current = "pass-1".to_string();
    let (mut old_won, mut new_won) = (0, 0);
    for round in 2..42 {
        let next = format!("pass-{round}");
        let mut child = v
            .cmd(&current)
            .arg("passwd")
            .args(TINY)
            .env("MEMVAULT_NEW_PASSPHRASE", &next)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros(rng.below(full)));
        let _ = child.kill();
        child.wait().unwrap();

        let old = open_with_pass(&v.vault, &current);
        let new = open_with_pass(&v.vault, &next);
        let (vault, winner) = match (old, new) {
            (Ok(vault), Err(VaultError::WrongSecret)) => {
                old_won += 1;
                (vault, current.clone())
            }
            // The old passphrase's slot is gone (replaced): said as such
            // when this machine last unlocked with it.
            (Err(VaultError::WrongSecret | VaultError::SlotRemoved(_)), Ok(vault)) => {
                new_won += 1;
                (vault, next.clone())
            }
            (Ok(_), Ok(_)) => panic!("round {round}: both passphrases open the vault"),
            (o, n) => panic!(
                "round {round}: neither passphrase opens the vault: {:?} / {:?}",
                o.err(),
                n.err()
            ),
        };
        drop(vault);
        let out = v.exec(&winner, view("/memories/a.md"));
        assert!(
            stdout(&out).contains("survives"),
            "round {round}: {}",
            stderr(&out)
        );
        current = winner;
    }
    eprintln!("passwd crash test: old passphrase kept {old_won} times, new one {new_won} times");
    assert!(old_won + new_won == 40);
}

/// A handle opened before a rekey (a running `serve`) cannot know the new
/// epoch: it must refuse to write rather than write under the old epoch or
/// damage anything; a fresh handle works.
#[test]
fn a_handle_from_before_the_rekey_refuses_to_write() {
    let v = TestVault::new();
    let mut stale = v.open_library("stale");
    let out = v.cmd().arg("rekey").output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let memory = memvault::memory_for_vault(&stale).unwrap();
    let input = json!({"command": "create", "path": "/memories/late.md", "file_text": "x\n"});
    let result = memory.execute_json(&mut stale, &input);
    assert!(result.is_error, "{result:?}");
    let said = format!("{result:?}");
    assert!(said.contains("rekeyed by another process"), "{said}");
    drop(stale);
    let r = v.one(view("/memories"));
    assert!(!is_error(&r), "{r}");
    assert!(!text(&r).contains("late.md"));
    let out = v.cmd().arg("verify").output().unwrap();
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let r = v.one(json!({"command": "create", "path": "/memories/late.md", "file_text": "x\n"}));
    assert!(!is_error(&r), "{r}");
    assert_eq!(meta_epoch(&v.vault, "refs/heads/main"), 1);
}

/// `passwd` unlocked with a key file changes the only passphrase slot;
/// `--slot` naming a key-file slot is refused.
#[test]
fn passwd_from_a_key_file_changes_the_passphrase_slot() {
    let v = TestVault::new();
    let out = v
        .cmd()
        .args(["key", "add"])
        .args(TINY)
        .env("MEMVAULT_NEW_PASSPHRASE", "first")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let list = stdout(&v.cmd().args(["key", "list"]).output().unwrap());
    let keyfile_slot = list
        .lines()
        .find(|l| l.contains("key-file"))
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .to_string();
    let out = v
        .cmd()
        .args(["passwd", "--slot", &keyfile_slot])
        .env("MEMVAULT_NEW_PASSPHRASE", "second")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("not a passphrase slot"),
        "{}",
        stderr(&out)
    );

    let out = v
        .cmd()
        .arg("passwd")
        .args(TINY)
        .env("MEMVAULT_NEW_PASSPHRASE", "second")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(open_with_pass(&v.vault, "first").is_err());
    assert!(open_with_pass(&v.vault, "second").is_ok());
    assert!(
        v.cmd()
            .args(["key", "list"])
            .output()
            .unwrap()
            .status
            .success()
    );
    let list = stdout(&v.cmd().args(["key", "list"]).output().unwrap());
    assert_eq!(slot_ids(&list).len(), 2, "{list}");
}

/// `memvault rekey` killed at seeded random moments: the key file always
/// opens the vault, at the old epoch or the next, and old content reads.
#[test]
fn rekey_killed_at_random_moments_leaves_the_vault_open() {
    let mut seed: u64 = 0x7265_6b65_795f_6b6c;
    let mut below = |n: u64| {
        seed ^= seed >> 12;
        seed ^= seed << 25;
        seed ^= seed >> 27;
        seed.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    };
    let v = TestVault::new();
    let r =
        v.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "survives\n"}));
    assert!(!is_error(&r), "{r}");
    let start = Instant::now();
    assert!(v.cmd().arg("rekey").output().unwrap().status.success());
    let full = start.elapsed().as_micros() as u64;
    let mut epoch = 1;
    for round in 0..20 {
        let mut child = v
            .cmd()
            .arg("rekey")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros(below(full)));
        let _ = child.kill();
        child.wait().unwrap();
        let lib = v.open_library("check");
        let now = lib.keys().current_epoch();
        assert!(
            now == epoch || now == epoch + 1,
            "round {round}: epoch {now}"
        );
        epoch = now;
        drop(lib);
        let r = v.one(view("/memories/a.md"));
        assert!(text(&r).contains("survives"), "round {round}: {r}");
    }
    let out = v.cmd().arg("verify").output().unwrap();
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
}

/// `passwd` refuses a new passphrase that already opens a slot (another
/// one, or the same one again), as `key add` does: one secret in two
/// slots would make a later change or removal of one revoke nothing.
#[test]
fn passwd_refuses_a_passphrase_a_slot_already_has() {
    let v = PassVault::new("alice one");
    let bob = v.file("bob.txt", "bob two\n");
    let out = v
        .cmd("alice one")
        .args(["key", "add", "--new-passphrase-file"])
        .arg(&bob)
        .args(TINY)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let keys_before = git(&v.vault, &["rev-parse", "refs/memvault/keys"]).stdout;
    let same = v.file("same.txt", "alice one\n");
    for (new, says) in [
        (&bob, "that passphrase already opens keyslot"),
        (&same, "that is the passphrase keyslot"),
    ] {
        let out = v.passwd("alice one", new, &TINY);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        assert!(stderr(&out).contains(says), "{}", stderr(&out));
        assert!(stderr(&out).contains("nothing was changed"));
        assert!(!stderr(&out).contains("alice one") && !stderr(&out).contains("bob two"));
    }
    assert_eq!(
        git(&v.vault, &["rev-parse", "refs/memvault/keys"]).stdout,
        keys_before,
        "a refused passwd changed the key state"
    );
    for pass in ["alice one", "bob two"] {
        let out = v.exec(pass, json!({"command": "view", "path": "/memories"}));
        assert!(out.status.success(), "{pass}: {}", stderr(&out));
    }
}

/// `key add --new-key-file FILE` for a file that does not exist yet (as
/// the README's steps for a second machine write it) makes a new key
/// file there (0600) and a slot that opens the vault with it; an existing
/// file is taken as it is, never overwritten.
#[test]
fn key_add_of_a_key_file_not_there_yet_writes_one_and_its_slot_opens_the_vault() {
    use std::os::unix::fs::PermissionsExt;
    let v = TestVault::new();
    let laptop = v.tmp.path().join("laptop.key");
    let out = v
        .cmd()
        .args(["key", "add", "--new-key-file"])
        .arg(&laptop)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("wrote a new key file"),
        "{}",
        stderr(&out)
    );
    let meta = std::fs::metadata(&laptop).unwrap();
    assert_eq!(meta.len(), 32);
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let key = std::fs::read(&laptop).unwrap();
    let out = std::process::Command::new(bin())
        .arg("--vault")
        .arg(&v.vault)
        .arg("--key-file")
        .arg(&laptop)
        .args(["exec", r#"{"command":"view","path":"/memories"}"#])
        .env_remove("MEMVAULT_KEY_FILE")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // Again: the file is there now, and its key already has a slot.
    let out = v
        .cmd()
        .args(["key", "add", "--new-key-file"])
        .arg(&laptop)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(std::fs::read(&laptop).unwrap(), key);
}

/// Two `passwd` of one slot, both unlocked with the old passphrase: the
/// second one's handle may already have read the first one's key state
/// (then its own slot is gone and the one passphrase slot is the first
/// one's new slot). It must refuse, never replace that slot: the first
/// one said its new passphrase opens the vault (round 36a: 3 rounds in
/// 80 had both succeed and one new passphrase open nothing).
#[test]
fn a_passwd_that_lost_the_race_for_its_slot_replaces_no_other_slot() {
    use memvault::crypto::KdfParams;
    let tiny = KdfParams {
        m_kib: 64,
        t: 1,
        p: 1,
    };
    for refreshed in [false, true] {
        let v = PassVault::new("p-old");
        let mut a = open_with_pass(&v.vault, "p-old").unwrap();
        let mut b = open_with_pass(&v.vault, "p-old").unwrap();
        a.change_passphrase(None, &Passphrase::new("p-new-X".into()), tiny)
            .unwrap();
        if refreshed {
            // b reads the key state the first passwd left.
            b.tip().unwrap();
        }
        let lost = b.change_passphrase(None, &Passphrase::new("p-new-Y".into()), tiny);
        assert!(
            matches!(&lost, Err(VaultError::Refused(m)) if m.contains("meanwhile")),
            "refreshed={refreshed}: {:?}",
            lost.map(|_| ())
        );
        drop((a, b));
        assert!(
            open_with_pass(&v.vault, "p-new-X").is_ok(),
            "refreshed={refreshed}"
        );
        assert!(open_with_pass(&v.vault, "p-new-Y").is_err());
        assert!(open_with_pass(&v.vault, "p-old").is_err());
    }
}

/// A handle opened before another process's `rekey` refuses with the
/// rekey's reason, not as damage; and commands started while a `rekey`
/// runs either open the rekeyed vault or say it was rekeyed, never that
/// it is damaged (round 36a: 11 of 45 racing commands were told "the
/// vault is damaged", and `verify` then said ok).
#[test]
fn commands_racing_a_rekey_are_never_told_the_vault_is_damaged() {
    let v = TestVault::new();
    let who = || Attribution {
        session: "test".into(),
        actor: "test".into(),
    };
    let key = memvault::crypto::KeyFileKey::from_bytes(&std::fs::read(&v.key).unwrap()).unwrap();
    let old = Vault::open(&v.vault, &Unlock::KeyFile(&key), who()).unwrap();
    let out = v
        .cmd()
        .args(["rekey", "--drop-other-slots"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    match old.reopen(who()) {
        Err(VaultError::Refused(m)) => assert!(m.contains("rekeyed by another process"), "{m}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    let out = v
        .cmd()
        .args([
            "exec",
            &json!({"command": "create", "path": "/memories/a.md", "file_text": "x\n"}).to_string(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    for round in 0..6 {
        let mut children = Vec::new();
        for _ in 0..2 {
            children.push(
                v.cmd()
                    .args(["rekey", "--drop-other-slots"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap(),
            );
            children.push(
                v.cmd()
                    .args(["exec", &view("/memories/a.md").to_string()])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap(),
            );
        }
        for c in children {
            let out = c.wait_with_output().unwrap();
            assert!(
                !stderr(&out).contains("damaged"),
                "round {round}: {}",
                stderr(&out)
            );
        }
    }
    let out = v.cmd().arg("verify").output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
}

/// `init` at a link (to an empty folder) is refused as a link, naming
/// it, and writes nothing where it points.
#[test]
fn init_at_a_link_is_refused_as_one_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("target");
    std::fs::create_dir(&target).unwrap();
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let key = tmp.path().join("k");
    keygen(&key);
    let out = Command::new(bin())
        .arg("--vault")
        .arg(&link)
        .arg("--key-file")
        .arg(&key)
        .arg("init")
        .env_remove("MEMVAULT_DIR")
        .env_remove("MEMVAULT_KEY_FILE")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("symbolic link"), "{}", stderr(&out));
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0);
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
}
