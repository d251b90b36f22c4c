//! Helpers that drive the real `memvault` binary on a temporary vault.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// The memvault binary the tests run: the one cargo built with them, or
/// the one `MEMVAULT_TEST_BIN` names (to run, say, the crash test's
/// rounds against a release build: `MEMVAULT_TEST_BIN=target/release/memvault
/// cargo test --test it crash::`).
pub fn bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("MEMVAULT_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_memvault").into())
    })
}

/// Whether the binary under test is a default build (no `test-hooks`):
/// the one cargo built with these tests when they are built without the
/// feature, or the one `MEMVAULT_TEST_BIN` names (`.ci/test` runs the
/// tests named `*without_test_hooks` so, against its default build, with
/// the tests built with the feature). A test of what a default build does
/// not read returns at once otherwise, saying so on stderr.
pub fn default_build_under_test(test: &str) -> bool {
    let default = !cfg!(feature = "test-hooks") || std::env::var_os("MEMVAULT_TEST_BIN").is_some();
    if !default {
        eprintln!(
            "{test}: not run: the binary cargo built with these tests has the test hooks; \
             run it with MEMVAULT_TEST_BIN naming a default build"
        );
    }
    default
}

/// A fresh vault unlocked by a key file, in its own temporary directory.
pub struct TestVault {
    pub tmp: tempfile::TempDir,
    pub vault: PathBuf,
    pub key: PathBuf,
}

impl TestVault {
    pub fn new() -> TestVault {
        let tmp = tempfile::tempdir().unwrap();
        let vault = tmp.path().join("vault");
        let key = tmp.path().join("vault.key");
        keygen(&key);
        let t = TestVault { tmp, vault, key };
        let out = t.cmd().arg("init").output().unwrap();
        assert!(
            out.status.success(),
            "init: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        t
    }

    /// A `memvault` command with this vault and key selected.
    pub fn cmd(&self) -> Command {
        self.cmd_of(std::path::Path::new(bin()))
    }

    /// The same, running the binary at `program` (a copy of [`bin`]).
    pub fn cmd_of(&self, program: &std::path::Path) -> Command {
        let mut c = Command::new(program);
        c.arg("--vault")
            .arg(&self.vault)
            .arg("--key-file")
            .arg(&self.key);
        c.env_remove("MEMVAULT_DIR")
            .env_remove("MEMVAULT_KEY_FILE")
            .env_remove("MEMVAULT_PASSPHRASE")
            .env_remove("MEMVAULT_SESSION")
            .env_remove("MEMVAULT_ACTOR");
        c
    }

    /// Run `serve` with these request lines; return the parsed result lines.
    pub fn serve(&self, lines: &[String]) -> Vec<Value> {
        let mut input = String::new();
        for l in lines {
            input.push_str(l);
            input.push('\n');
        }
        let out = run_with_stdin(
            self.cmd().arg("serve").arg("--session").arg("test"),
            input.as_bytes(),
        );
        assert!(
            out.status.success(),
            "serve failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        parse_lines(&out.stdout)
    }

    /// Run one command through `serve`.
    pub fn one(&self, cmd: Value) -> Value {
        let mut v = self.serve(&[cmd.to_string()]);
        assert_eq!(v.len(), 1);
        v.remove(0)
    }

    /// Open this vault through the library, as a Rust agent would.
    pub fn open_library(&self, session: &str) -> memvault::vault::Vault {
        let key =
            memvault::crypto::KeyFileKey::from_bytes(&std::fs::read(&self.key).unwrap()).unwrap();
        let who = memvault::vault::Attribution {
            session: session.into(),
            actor: session.into(),
        };
        memvault::vault::Vault::open(&self.vault, &memvault::crypto::Unlock::KeyFile(&key), who)
            .unwrap()
    }

    /// Number of commits on refs/heads/main.
    pub fn commits(&self) -> usize {
        let out = git(&self.vault, &["rev-list", "--count", "refs/heads/main"]);
        String::from_utf8(out.stdout)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
}

pub fn run_with_stdin(cmd: &mut Command, input: &[u8]) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let data = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&data);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

pub fn parse_lines(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8(stdout.to_vec())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect()
}

pub fn git(repo: &Path, args: &[&str]) -> Output {
    let out = Command::new("git")
        .arg("--git-dir")
        .arg(repo)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The text content of a tool result.
pub fn text(v: &Value) -> &str {
    v["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no text content: {v}"))
}

pub fn is_error(v: &Value) -> bool {
    v["is_error"].as_bool().unwrap()
}

/// Does `needle` occur in any file below `dir` or in any git object
/// (decompressed by `git cat-file --batch-all-objects --batch`)?
pub fn plaintext_anywhere(dir: &Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        for e in std::fs::read_dir(&p).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                let bytes = std::fs::read(e.path()).unwrap();
                if contains(&bytes, needle.as_bytes()) {
                    found.push(e.path().display().to_string());
                }
            }
        }
    }
    let out = Command::new("git")
        .arg("--git-dir")
        .arg(dir)
        .args(["cat-file", "--batch-all-objects", "--batch", "--unordered"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(
        out.stdout.len() > 100,
        "git cat-file printed almost nothing"
    );
    if contains(&out.stdout, needle.as_bytes()) {
        found.push("a git object".into());
    }
    found
}

pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Run `cmd` with `input` on stdin; None if it did not finish within
/// `timeout` (it is killed then). Polling the child is the event here:
/// std has no wait for a process with a deadline.
pub fn run_bounded(cmd: &mut Command, input: &str, timeout: std::time::Duration) -> Option<Output> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        let mut stdin = child.stdin.take().unwrap();
        let _ = stdin.write_all(input.as_bytes());
    }
    let start = std::time::Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return Some(child.wait_with_output().unwrap());
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Copy a directory tree (files and folders only).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// Turn every pack of the vault into loose objects (a checkpoint writes a
/// pack; the pack is moved out first, or git would skip what it holds).
pub fn unpack_all(v: &TestVault) {
    let pack_dir = v.vault.join("objects/pack");
    for e in pack_dir.read_dir().unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_some_and(|x| x == "pack") {
            let moved = v.tmp.path().join("unpack.pack");
            std::fs::rename(&path, &moved).unwrap();
            std::fs::remove_file(path.with_extension("idx")).unwrap();
            let out = Command::new("git")
                .env("GIT_DIR", &v.vault)
                .arg("unpack-objects")
                .arg("-q")
                .stdin(std::fs::File::open(&moved).unwrap())
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    assert!(
        !pack_dir.read_dir().unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".pack")),
        "the test needs loose objects, not packs"
    );
}

/// Make a key file at `path` with `memvault keygen`.
pub fn keygen(path: &Path) {
    let out = Command::new(bin())
        .arg("keygen")
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "keygen: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A `serve` process fed one request at a time.
pub struct Writer {
    pub child: std::process::Child,
    pub input: Option<std::process::ChildStdin>,
    output: std::io::BufReader<std::process::ChildStdout>,
}

impl Writer {
    /// `serve --session SESSION` on the test vault.
    pub fn start(t: &TestVault, session: &str) -> Writer {
        Writer::spawn(t.cmd().args(["serve", "--session", session]))
    }

    /// A `serve` command (its pipes are set here; stderr is discarded).
    pub fn spawn(cmd: &mut Command) -> Writer {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Writer {
            input: child.stdin.take(),
            output: std::io::BufReader::new(child.stdout.take().unwrap()),
            child,
        }
    }

    /// Send `request` and check that its reply is no error.
    pub fn send(&mut self, request: &Value) {
        let reply = self.ask(request);
        assert!(reply.contains("\"is_error\":false"), "{request}: {reply}");
    }

    /// Send `request`; its reply line.
    pub fn ask(&mut self, request: &Value) -> String {
        use std::io::BufRead;
        writeln!(self.input.as_mut().unwrap(), "{request}").unwrap();
        let mut reply = String::new();
        self.output.read_line(&mut reply).unwrap();
        reply
    }

    /// End its input and wait for it to exit; whether it exited 0.
    pub fn finish(mut self) -> bool {
        drop(self.input.take());
        self.child.wait().unwrap().success()
    }
}

/// Every file key any key-table object in the repository at `vault`
/// holds, reachable or not, opened with the vault's keys (unlocked by the
/// key file `key`).
pub fn keys_in_any_object(vault: &Path, key: &Path) -> std::collections::BTreeSet<String> {
    use memvault::crypto::ShardLayout;
    let k = memvault::crypto::KeyFileKey::from_bytes(&std::fs::read(key).unwrap()).unwrap();
    let who = memvault::vault::Attribution {
        session: "probe".into(),
        actor: "probe".into(),
    };
    let opened =
        memvault::vault::Vault::open(vault, &memvault::crypto::Unlock::KeyFile(&k), who).unwrap();
    let list = git(vault, &["cat-file", "--batch-all-objects", "--batch-check"]).stdout;
    let mut found = std::collections::BTreeSet::new();
    for line in String::from_utf8(list).unwrap().lines() {
        let mut parts = line.split(' ');
        let (oid, kind) = (parts.next().unwrap(), parts.next().unwrap());
        if kind != "blob" {
            continue;
        }
        let bytes = git(vault, &["cat-file", "blob", oid]).stdout;
        for layout in [ShardLayout::Byte, ShardLayout::Wide] {
            for shard in 0..layout.shards() {
                if let Ok(table) = opened.keys().open_table_shard(layout, shard, &bytes) {
                    for (id, _) in table.iter() {
                        found.insert(id.to_hex());
                    }
                }
            }
        }
    }
    found
}

/// Assert that a command succeeded (what it printed shown if not); its
/// stdout.
pub fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "failed ({:?}): {}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}
