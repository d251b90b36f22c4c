//! A hostile vault directory on the local disk (issue 16, section 2, holes
//! 3, 4 and 8): links planted inside the vault, permissions that let
//! another user in, and a `serve.sock` that is not the leader's.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::json;

use crate::util::{
    TestVault, Writer, bin, copy_dir, git, is_error, parse_lines, run_with_stdin, text,
};

/// Every file and directory below `dir`, links not followed: its kind and
/// bytes (a link: its target).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        for e in std::fs::read_dir(&p).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            let rel = e.path().strip_prefix(dir).unwrap().to_path_buf();
            if t.is_symlink() {
                let target = std::fs::read_link(e.path()).unwrap();
                out.insert(rel, target.into_os_string().into_encoded_bytes());
            } else if t.is_dir() {
                out.insert(rel, b"<dir>".to_vec());
                stack.push(e.path());
            } else if t.is_file() {
                out.insert(rel, std::fs::read(e.path()).unwrap());
            } else {
                out.insert(rel, b"<other>".to_vec());
            }
        }
    }
    out
}

fn create(path: &str) -> String {
    json!({"command": "create", "path": path, "file_text": "x\n"}).to_string()
}

fn view(path: &str) -> String {
    json!({"command": "view", "path": path}).to_string()
}

/// Run `cmd` with `input` on stdin; its exit status and stderr.
fn run(cmd: &mut Command, input: &str) -> (ExitStatus, String) {
    let out = run_with_stdin(cmd, input.as_bytes());
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A path inside the vault replaced by a link to a place outside it.
struct Planted {
    v: TestVault,
    outside: PathBuf,
    before: BTreeMap<PathBuf, Vec<u8>>,
}

/// Replace `rel` (a file or directory of the vault, or a name memvault
/// creates there) by a symbolic link into a folder outside the vault. A
/// file's link points to a copy of it (so following it would look like a
/// healthy vault), a missing file's link dangles, a directory's link points
/// to a copy holding a pack-like file gc would delete.
fn plant_link(rel: &str) -> Planted {
    let v = TestVault::new();
    // Something for gc to repack and for views to read.
    let r = v.serve(&[create("/memories/a.md")]);
    assert!(!is_error(&r[0]), "{}", r[0]);
    let outside = v.tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let inside = v.vault.join(rel);
    let target = outside.join("target");
    match std::fs::symlink_metadata(&inside) {
        Ok(m) if m.is_dir() => {
            copy_dir(&inside, &target);
            std::fs::write(target.join("pack-0000.keep"), b"not memvault's").unwrap();
            std::fs::remove_dir_all(&inside).unwrap();
        }
        Ok(_) => {
            std::fs::copy(&inside, &target).unwrap();
            std::fs::remove_file(&inside).unwrap();
        }
        Err(_) => {} // dangling: memvault would create the file outside
    }
    std::os::unix::fs::symlink(&target, &inside).unwrap();
    let before = snapshot(&outside);
    Planted { v, outside, before }
}

#[test]
fn a_link_anywhere_inside_the_vault_is_refused_and_its_target_left_untouched() {
    let paths = [
        "memvault/wal",
        "memvault/access",
        "memvault/lock",
        "memvault/keys-garbage",
        "memvault/config.json",
        "memvault/format",
        "memvault/history-index",
        "memvault/history-index.lock",
        "memvault/verified-head",
        "memvault/erase-pending",
        "memvault/serve.lock",
        "memvault/serve.sock",
        "refs/heads/main",
        "refs/memvault/keys",
        "objects/pack",
        "objects",
        "refs",
        "memvault",
    ];
    for rel in paths {
        let p = plant_link(rel);
        let commands: [(&str, Vec<&str>, String); 5] = [
            (
                "serve",
                vec!["serve", "--session", "t"],
                format!("{}\n{}\n", create("/memories/b.md"), view("/memories/a.md")),
            ),
            ("gc", vec!["gc"], String::new()),
            ("verify", vec!["verify"], String::new()),
            (
                "expire",
                vec!["expire", "--older-than", "1m"],
                String::new(),
            ),
            ("purge", vec!["purge", "/memories/a.md"], String::new()),
        ];
        for (name, args, input) in commands {
            let (status, stderr) = run(p.v.cmd().args(&args), &input);
            assert_eq!(
                status.code(),
                Some(1),
                "{name} with a link at {rel}: {stderr}"
            );
            assert!(
                stderr.contains("symbolic link") && stderr.contains(rel),
                "{name} with a link at {rel} must say so: {stderr}"
            );
        }
        assert_eq!(
            snapshot(&p.outside),
            p.before,
            "the target of the link at {rel} was changed"
        );
    }
}

#[test]
fn a_linked_loose_object_directory_is_neither_written_nor_emptied_by_gc() {
    let v = TestVault::new();
    let outside = v.tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("precious"), b"keep me").unwrap();
    // Every possible fan-out directory that is not there yet links outside.
    for i in 0..=255u8 {
        let d = v.vault.join("objects").join(format!("{i:02x}"));
        if std::fs::symlink_metadata(&d).is_err() {
            std::os::unix::fs::symlink(&outside, &d).unwrap();
        }
    }
    let before = snapshot(&outside);
    let (status, stderr) = run(
        v.cmd().args(["serve", "--session", "t"]),
        &format!("{}\n", create("/memories/a.md")),
    );
    assert_eq!(status.code(), Some(1), "serve: {stderr}");
    assert!(stderr.contains("symbolic link"), "{stderr}");
    let (status, stderr) = run(v.cmd().arg("gc"), "");
    assert_eq!(status.code(), Some(1), "gc: {stderr}");
    assert!(stderr.contains("symbolic link"), "{stderr}");
    assert_eq!(snapshot(&outside), before, "gc: {stderr}");
}

/// `sh -c 'umask 000; exec memvault …'`.
fn under_umask_000(v: &TestVault, args: &[&str]) -> Command {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg("umask 000; exec \"$@\"")
        .arg("sh")
        .arg(bin())
        .arg("--vault")
        .arg(&v.vault)
        .arg("--key-file")
        .arg(&v.key)
        .args(args);
    c
}

/// Paths below `dir` whose mode has any group or other bit.
fn open_to_others(dir: &Path) -> Vec<String> {
    let mut bad = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p).unwrap();
        if m.mode() & 0o077 != 0 {
            bad.push(format!("{} {:o}", p.display(), m.mode() & 0o7777));
        }
        if m.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
    }
    bad
}

#[test]
fn under_umask_000_nothing_in_the_vault_is_open_to_group_or_others() {
    let tmp = tempfile::tempdir().unwrap();
    let v = TestVault {
        vault: tmp.path().join("vault"),
        key: tmp.path().join("vault.key"),
        tmp,
    };
    let out = Command::new(bin())
        .arg("keygen")
        .arg(&v.key)
        .output()
        .unwrap();
    assert!(out.status.success());
    let (status, stderr) = run(&mut under_umask_000(&v, &["init"]), "");
    assert!(status.success(), "init: {stderr}");
    assert_eq!(open_to_others(&v.vault), Vec::<String>::new(), "after init");
    // Enough objects for a checkpoint pack, then a few loose ones, then gc.
    let lines: String = (0..12)
        .map(|i| create(&format!("/memories/d{i}/f{i}.md")) + "\n")
        .collect();
    let (status, stderr) = run(
        &mut under_umask_000(&v, &["serve", "--session", "t"]),
        &lines,
    );
    assert!(status.success(), "serve: {stderr}");
    let (status, stderr) = run(
        &mut under_umask_000(&v, &["serve", "--session", "t"]),
        &(create("/memories/one.md") + "\n" + &view("/memories/d1/f1.md") + "\n"),
    );
    assert!(status.success(), "serve: {stderr}");
    assert_eq!(
        open_to_others(&v.vault),
        Vec::<String>::new(),
        "after creates"
    );
    let (status, stderr) = run(&mut under_umask_000(&v, &["verify"]), "");
    assert!(status.success(), "verify: {stderr}");
    let (status, stderr) = run(&mut under_umask_000(&v, &["gc"]), "");
    assert!(status.success(), "gc: {stderr}");
    assert_eq!(open_to_others(&v.vault), Vec::<String>::new(), "after gc");
}

#[test]
fn a_vault_or_state_directory_or_file_others_can_write_is_refused_and_left_as_it_is() {
    for (rel, mode) in [
        ("", 0o777),
        ("", 0o770),
        ("memvault", 0o777),
        ("memvault", 0o722),
        // Inside: another user could plant packs, move refs or write the
        // log under a running writer.
        ("objects", 0o777),
        ("objects/pack", 0o775),
        ("refs", 0o777),
        ("refs/heads", 0o770),
        ("memvault/wal", 0o666),
        ("refs/heads/main", 0o664),
    ] {
        let v = TestVault::new();
        let r = v.serve(&[create("/memories/a.md")]);
        assert!(!is_error(&r[0]));
        let dir = v.vault.join(rel);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
        let before = snapshot(&v.vault);
        for (args, input) in [
            (
                vec!["serve", "--session", "t"],
                create("/memories/b.md") + "\n",
            ),
            (vec!["gc"], String::new()),
        ] {
            let (status, stderr) = run(v.cmd().args(&args), &input);
            assert_eq!(
                status.code(),
                Some(1),
                "{args:?} on {rel:?} {mode:o}: {stderr}"
            );
            assert!(
                stderr.contains("writable by"),
                "{args:?} on {rel:?} {mode:o} must say why: {stderr}"
            );
        }
        assert_eq!(
            snapshot(&v.vault),
            before,
            "{rel:?} {mode:o}: the vault changed"
        );
        let m = std::fs::metadata(&dir).unwrap().mode() & 0o777;
        assert_eq!(m, mode);
        // Put right, it opens again.
        let private = if dir.is_dir() { 0o700 } else { 0o600 };
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(private)).unwrap();
        let r = v.one(json!({"command": "view", "path": "/memories/a.md"}));
        assert!(!is_error(&r), "{r}");
    }
}

/// A `serve` kept open.
struct Client {
    child: Child,
    stdin: Option<std::process::ChildStdin>,
    out: BufReader<std::process::ChildStdout>,
}

impl Client {
    fn start(v: &TestVault) -> Client {
        let mut child = v
            .cmd()
            .args(["serve", "--session", "t"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().unwrap());
        Client { child, stdin, out }
    }

    fn call(&mut self, line: &str) -> serde_json::Value {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
        let mut reply = String::new();
        assert!(self.out.read_line(&mut reply).unwrap() > 0, "no reply");
        serde_json::from_str(&reply).unwrap()
    }

    /// Close its input; its exit status, or None if it has not exited
    /// within `limit` (it is then killed).
    fn finish_within(mut self, limit: Duration) -> Option<ExitStatus> {
        drop(self.stdin.take());
        wait_within(self.child, limit)
    }
}

/// Wait for `child` at most `limit` (in a thread: no polling); kill it if
/// it is still running then.
fn wait_within(mut child: Child, limit: Duration) -> Option<ExitStatus> {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(child.wait().unwrap());
    });
    let status = rx.recv_timeout(limit).ok();
    if status.is_none() {
        let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
    }
    waiter.join().unwrap();
    status
}

#[test]
fn a_leader_exits_when_its_input_ends_even_if_its_socket_was_deleted_or_replaced() {
    for replace in [false, true] {
        let v = TestVault::new();
        let mut leader = Client::start(&v);
        let r = leader.call(&create("/memories/a.md"));
        assert!(!is_error(&r), "{r}");
        let sock = v.vault.join("memvault/serve.sock");
        assert!(sock.exists(), "the leader listens");
        std::fs::remove_file(&sock).unwrap();
        // A listener that never accepts, in its place.
        let _planted = replace.then(|| std::os::unix::net::UnixListener::bind(&sock).unwrap());
        let status = leader.finish_within(Duration::from_secs(10));
        assert!(
            status.is_some_and(|s| s.success()),
            "the leader did not exit after its input ended (socket {})",
            if replace { "replaced" } else { "deleted" }
        );
    }
}

#[test]
fn a_planted_serve_socket_does_not_stall_a_starting_serve() {
    for silent_listener in [true, false] {
        let v = TestVault::new();
        // Someone holds the lead, and serve.sock is not theirs to answer on.
        let lead = std::fs::OpenOptions::new()
            .write(true)
            .open(v.vault.join("memvault/serve.lock"))
            .or_else(|_| std::fs::File::create(v.vault.join("memvault/serve.lock")))
            .unwrap();
        lead.lock().unwrap();
        let sock = v.vault.join("memvault/serve.sock");
        let _planted = if silent_listener {
            Some(std::os::unix::net::UnixListener::bind(&sock).unwrap())
        } else {
            std::fs::write(&sock, b"not a socket").unwrap();
            None
        };
        let input = format!("{}\n{}\n", create("/memories/a.md"), view("/memories/a.md"));
        let mut child = v
            .cmd()
            .args(["serve", "--session", "t"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input.as_bytes()).unwrap();
        drop(stdin);
        let mut stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut s = Vec::new();
            std::io::Read::read_to_end(&mut stdout, &mut s).unwrap();
            s
        });
        let status = wait_within(child, Duration::from_secs(5));
        let out = reader.join().unwrap();
        assert!(
            status.is_some_and(|s| s.success()),
            "serve with a planted {} did not answer within 5 s",
            if silent_listener {
                "silent listener"
            } else {
                "regular file"
            }
        );
        let replies = parse_lines(&out);
        assert_eq!(replies.len(), 2);
        assert!(replies.iter().all(|r| !is_error(r)), "{replies:?}");
    }
}

#[test]
fn a_link_planted_while_serve_runs_is_not_written_through() {
    let v = TestVault::new();
    let mut leader = Client::start(&v);
    let r = leader.call(&create("/memories/a.md"));
    assert!(!is_error(&r), "{r}");
    let outside = v.tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    // The files a running serve opens again for each write: links to
    // copies of them, or dangling links.
    for name in ["access", "keys-garbage"] {
        let inside = v.vault.join("memvault").join(name);
        let target = outside.join(name);
        if std::fs::symlink_metadata(&inside).is_ok() {
            std::fs::copy(&inside, &target).unwrap();
            std::fs::remove_file(&inside).unwrap();
        }
        std::os::unix::fs::symlink(&target, &inside).unwrap();
    }
    let before = snapshot(&outside);
    for i in 0..3 {
        // A new file: a key-state change (keys-garbage) and an access
        // record (access).
        let r = leader.call(&create(&format!("/memories/n{i}.md")));
        assert!(!is_error(&r), "{r}");
        let r = leader.call(&view(&format!("/memories/n{i}.md")));
        assert!(!is_error(&r), "{r}");
    }
    assert!(leader.finish_within(Duration::from_secs(10)).is_some());
    assert_eq!(snapshot(&outside), before);
}

/// A command on `v` whose checkpoints meet a full disk (a test hook on a
/// checkpoint's first write).
fn on_full_disk(v: &TestVault) -> Command {
    let mut c = v.cmd();
    c.env("MEMVAULT_TEST_DISK_FULL", "checkpoint");
    c
}

/// Where the ref files point (`git for-each-ref`).
fn ref_files(v: &TestVault) -> String {
    String::from_utf8(git(&v.vault, &["for-each-ref"]).stdout).unwrap()
}

/// A full disk with acknowledged records still in the log (a `serve`
/// killed before its checkpoint): a new process cannot move the log into
/// git, and opens anyway, reading through the log; nothing is lost, and
/// the first open with room checkpoints. (The full disk is a test hook on
/// the checkpoint's first write.)
#[test]
fn a_full_disk_at_open_still_reads_through_the_log_and_loses_nothing() {
    let v = TestVault::new();
    let mut w = Writer::start(&v, "before");
    w.send(&json!({"command": "create", "path": "/memories/acked.md", "file_text": "kept\n"}));
    w.child.kill().unwrap();
    w.child.wait().unwrap();
    let refs_before = ref_files(&v);
    let full = |args: &[&str], input: &str| run(on_full_disk(&v).args(args), input);
    let (status, stderr) = full(
        &["exec", r#"{"command":"view","path":"/memories/acked.md"}"#],
        "",
    );
    assert!(status.success(), "a view on a full disk: {stderr}");
    let (status, stderr) = full(&["history"], "");
    assert!(status.success(), "history on a full disk: {stderr}");
    // Nothing was moved into git meanwhile.
    assert_eq!(ref_files(&v), refs_before);
    // With room again: checkpointed, and all there.
    let r = v.one(json!({"command": "view", "path": "/memories/acked.md"}));
    assert!(text(&r).contains("kept"), "{r}");
    assert_ne!(ref_files(&v), refs_before);
    let (status, stderr) = run(v.cmd().arg("verify"), "");
    assert!(status.success(), "{stderr}");
}

/// A one-shot write past the log's checkpoint bound, on a disk with room
/// for its record but not for the checkpoint's pack: the write is durable
/// in the log, so it is answered as done (it was answered "nothing was
/// changed", and an agent that tried again applied it twice; round 40b).
/// The same for an operator's command. The first process with room
/// checkpoints; nothing is lost.
#[test]
fn a_write_whose_checkpoint_meets_a_full_disk_is_answered_as_done() {
    let v = TestVault::new();
    // About 4.5 MiB of records, none checkpointed: `serve` defers its
    // checkpoints past the reply, and each fails.
    let big: String = (0..15_000)
        .map(|i| format!("{i:05} lorem ipsum dolor sit amet consectetur adipiscing elit\n"))
        .collect::<String>()[..900_000]
        .to_string();
    let input: String = (0..5)
        .map(|i| {
            format!(
                "{}\n",
                json!({"command": "create", "path": format!("/memories/big{i}.md"), "file_text": big})
            )
        })
        .collect();
    let out = run_with_stdin(
        on_full_disk(&v).args(["serve", "--session", "fill"]),
        input.as_bytes(),
    );
    let replies = parse_lines(&out.stdout);
    assert_eq!(replies.len(), 5);
    assert!(replies.iter().all(|r| !is_error(r)), "{replies:?}");
    assert!(
        std::fs::metadata(v.vault.join("memvault/wal"))
            .unwrap()
            .len()
            > 4 << 20
    );
    let refs_before = ref_files(&v);

    let full = |args: &[&str]| on_full_disk(&v).args(args).output().unwrap();
    let out = full(&[
        "exec",
        r#"{"command":"insert","path":"/memories/big0.md","insert_line":0,"insert_text":"once"}"#,
    ]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("has been edited") && !said.contains("is_error\":true"),
        "{said}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("checkpoint failed"),
        "the failed checkpoint is said on stderr"
    );
    let out = full(&["revert", "HEAD"]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Nothing was moved into git; the log holds both, each once.
    assert_eq!(ref_files(&v), refs_before);
    let history = v.cmd().arg("history").output().unwrap();
    let history = String::from_utf8_lossy(&history.stdout);
    assert_eq!(history.matches("insert").count(), 1, "{history}");
    assert_eq!(history.matches("revert").count(), 1, "{history}");
    // With room again: checkpointed, all there, the insert undone.
    let r = v.one(json!({"command": "view", "path": "/memories/big0.md", "view_range": [1, 1]}));
    assert!(text(&r).contains("00000 lorem"), "{r}");
    assert_ne!(ref_files(&v), refs_before);
    let (status, stderr) = run(v.cmd().arg("verify"), "");
    assert!(status.success(), "{stderr}");
}

/// A purge or expiry whose commit is made but whose prune meets a full
/// disk says what happened: the files are gone (listed, with the
/// revision), the destroyed keys not yet deleted from the disk, and it
/// exits 1; it was a bare "No space left on device" after a change that
/// was made. A write meanwhile says the disk is full (not that the store
/// failed); the first writer with room finishes the prune.
#[test]
fn an_erasure_committed_on_a_full_disk_says_so_and_the_next_writer_finishes_it() {
    for op in ["purge", "expire"] {
        let v = TestVault::new();
        for name in ["a", "b"] {
            let r = v.one(json!({"command": "create", "path": format!("/memories/{name}.md"), "file_text": "x\n"}));
            assert!(!is_error(&r), "{r}");
        }
        let full = |args: &[&str]| on_full_disk(&v).args(args).output().unwrap();
        let out = match op {
            "purge" => full(&["purge", "/memories/a.md"]),
            _ => {
                std::thread::sleep(Duration::from_millis(1100));
                full(&["expire", "--older-than", "1s"])
            }
        };
        let said = String::from_utf8_lossy(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{op}: {said}{err}");
        assert!(said.contains("/memories/a.md"), "{op}: {said}");
        assert!(said.contains("not finished"), "{op}: {said}");
        assert!(err.contains("the disk is full"), "{op}: {err}");
        assert!(v.vault.join("memvault/erase-pending").exists());
        let r = v.one(json!({"command": "view", "path": "/memories/a.md"}));
        assert!(is_error(&r), "{op}: {r}");
        // Another erasure on the still-full disk: the disk is named.
        let out = full(&["purge", "/memories/b.md"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{op}: {err}");
        assert!(
            err.contains("disk holding the vault is full"),
            "{op}: {err}"
        );
        // A write on the still-full disk.
        let out = full(&[
            "exec",
            r#"{"command":"create","path":"/memories/c.md","file_text":"c\n"}"#,
        ]);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.contains("disk is full"), "{op}: {said}");
        assert!(!said.contains("object store failed"), "{op}: {said}");
        // With room: finished, by `gc` (as the message says) or by the
        // next write.
        if op == "purge" {
            let (status, stderr) = run(v.cmd().arg("gc"), "");
            assert!(status.success(), "{stderr}");
        } else {
            let r =
                v.one(json!({"command": "create", "path": "/memories/c.md", "file_text": "c\n"}));
            assert!(!is_error(&r), "{r}");
        }
        assert!(!v.vault.join("memvault/erase-pending").exists());
        let (status, stderr) = run(v.cmd().arg("verify"), "");
        assert!(status.success(), "{stderr}");
    }
}

/// The user's and the system's git config are not read: a FIFO as
/// `~/.gitconfig` (or the XDG one) made every command hang, and a home
/// the user cannot read made an intact vault "not a memvault vault".
#[test]
fn the_users_git_config_is_never_read() {
    let t = tempfile::tempdir().unwrap();
    let home = t.path().join("home");
    std::fs::create_dir_all(home.join(".config/git")).unwrap();
    for fifo in [home.join(".gitconfig"), home.join(".config/git/config")] {
        let out = Command::new("mkfifo").arg(&fifo).output().unwrap();
        assert!(out.status.success());
    }
    let v = TestVault::new();
    let with_home = |args: &[&str]| {
        let mut c = v.cmd();
        c.args(args)
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", home.join(".config"));
        c
    };
    let create = format!(
        "{}\n",
        json!({"command": "create", "path": "/memories/a.md", "file_text": "hello\n"})
    );
    for (args, input) in [
        (&["serve"][..], create.as_str()),
        (&["verify"][..], ""),
        (&["gc"][..], ""),
        (&["history"][..], ""),
    ] {
        let out = crate::util::run_bounded(&mut with_home(args), input, Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{args:?} hung on a FIFO as the user's git config"));
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // A new vault too.
    let fresh = t.path().join("fresh");
    let mut c = Command::new(bin());
    c.arg("--vault")
        .arg(&fresh)
        .arg("--key-file")
        .arg(&v.key)
        .arg("init")
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env_remove("MEMVAULT_DIR");
    let out = crate::util::run_bounded(&mut c, "", Duration::from_secs(30))
        .expect("init hung on a FIFO as the user's git config");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
