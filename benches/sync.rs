//! Sync through a git remote against the git CLI doing the same transfer
//! (issue: `memvault sync` at most 1.5x `git fetch` + `git push`,
//! `memvault clone` at most 2x `git clone`), on loopback, bounded in time.
//!
//! Run: `cargo bench --all-features --bench sync`. In one run, over a
//! path remote and over SSH (a throwaway `sshd` on 127.0.0.1, reached as
//! `tests/it/sync_net.rs` does: its own host and user keys, an ssh config
//! host alias, `GIT_SSH_COMMAND="ssh -F config"`):
//!
//! 1. sync: a vault of 20,000 commits pushed to a bare repository (the
//!    hub) and two clones of it, A and B (`memvault clone`). Per round,
//!    not timed: B pulls (so it has nothing to pull next), then A and B
//!    each create one 1 KiB note. Timed: `memvault sync` on B (nothing to
//!    pull, push its change), then `memvault sync` on A (fetch B's change,
//!    merge, push). Beside it, the git CLI on two plain bare clones of a
//!    copy of the same hub (the same 20,000 commits, the same packs): each
//!    round one 1 KiB commit on each side made with plumbing
//!    (`hash-object`, `mktree`, `commit-tree`; not timed), then timed:
//!    on B `git fetch` + `git push`, on A `git fetch` + `git merge-tree
//!    --write-tree` + `commit-tree` + `update-ref` + `git push`. Medians
//!    over the rounds (the first, a warm-up, left out), the ratios
//!    memvault/git, the objects each side sends per push (the hub's
//!    `count-objects`), and a breakdown of one more sync of each side by
//!    its git commands (`GIT_TRACE_PERFORMANCE`) and memvault's own work;
//! 2. clone: `memvault clone` of a vault of 2,000 notes of 1 KiB (2,000
//!    commits) against `git clone --mirror` of the same hub (`--mirror`:
//!    all refs, so the key state travels too; over a path with
//!    `--no-local`, as a plain local clone only hardlinks the packs: that
//!    one is shown for reference). Medians and the ratio;
//! 3. a push never repacks the remote: before and after every timed
//!    push, the hub's packs (name, size, mtime): at most one new pack,
//!    none rewritten or removed (the hubs run with `receive.autoGc`
//!    off, so that git's own auto gc, which a hub runs after every
//!    push, does not blur what the push did); and its `git count-objects
//!    -v` before and after. A violation is printed and the run exits 1.
//!
//! Flags (after `--`): `--quick` (3 rounds, 3 clone samples), `--rounds
//! N` (7), `--samples N` (clone samples, 5), `--no-ssh`.
//!
//! The vaults are made once and kept under `target/bench-vaults/`
//! (`sync-20k/`: its key file, the hub, clones A and B; `sync-2k-files/`:
//! its key file and hub), built with `MEMVAULT_BENCH_NO_FSYNC=1` (the
//! bench-hooks build honours it; the timed commands run without it).
//! Each run works in fresh copies (`cp -a`) in `sync-run/` beside them.
//! Everything talks to 127.0.0.1 only and stops by itself (about a
//! minute and a half here, after the first run's fixtures).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_memvault");

/// Commits in the sync fixture, notes in the clone fixture.
const COMMITS: usize = 20_000;
const FILES: usize = 2_000;
/// The targets: memvault/git.
const SYNC_TARGET: f64 = 1.5;
const CLONE_TARGET: f64 = 2.0;

struct Args {
    rounds: usize,
    samples: usize,
    ssh: bool,
}

fn args() -> Args {
    let mut a = Args {
        rounds: 7,
        samples: 5,
        ssh: true,
    };
    let argv: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < argv.len() {
        let num = |i: usize| -> usize {
            argv.get(i + 1)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{} N", argv[i]))
        };
        match argv[i].as_str() {
            "--quick" => (a.rounds, a.samples) = (3, 3),
            "--rounds" => {
                a.rounds = num(i).max(1);
                i += 1;
            }
            "--samples" => {
                a.samples = num(i).max(1);
                i += 1;
            }
            "--no-ssh" => a.ssh = false,
            _ => {}
        }
        i += 1;
    }
    a
}

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn median<T: Ord + Copy>(v: &[T]) -> T {
    let mut v = v.to_vec();
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

fn mark(r: f64, target: f64) -> &'static str {
    if r <= target { "ok" } else { "OVER" }
}

/// A note of exactly 1 KiB.
fn note(tag: &str) -> String {
    let mut s = format!("# {tag}\n");
    while s.len() < 1024 {
        s.push_str("- the customer prefers email follow-ups on Tuesdays\n");
    }
    s.truncate(1023);
    s.push('\n');
    s
}

fn check(out: Output, what: &str) -> Vec<u8> {
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn run(cmd: &mut Command) -> Vec<u8> {
    let what = format!("{cmd:?}");
    check(cmd.output().unwrap(), &what)
}

/// `cp -a from to` (to must not exist).
fn copy(from: &Path, to: &Path) {
    run(Command::new("cp").arg("-a").arg(from).arg(to));
}

/// One machine's vault (all share one key file), with the environment
/// its git needs (`GIT_SSH_COMMAND`).
struct Vault {
    dir: PathBuf,
    key: PathBuf,
    env: Vec<(String, String)>,
}

impl Vault {
    fn cmd(&self) -> Command {
        let mut c = Command::new(BIN);
        for v in [
            "MEMVAULT_DIR",
            "MEMVAULT_KEY_FILE",
            "MEMVAULT_PASSPHRASE",
            "MEMVAULT_SESSION",
            "MEMVAULT_ACTOR",
            "MEMVAULT_BENCH_NO_FSYNC",
        ] {
            c.env_remove(v);
        }
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c.arg("--vault")
            .arg(&self.dir)
            .arg("--key-file")
            .arg(&self.key);
        c
    }

    /// Run a command that must succeed: its stdout.
    fn ok(&self, args: &[&str]) -> String {
        String::from_utf8(run(self.cmd().args(args))).unwrap()
    }

    fn create(&self, path: &str, text: &str) {
        let c = json!({"command": "create", "path": path, "file_text": text});
        let out = self.ok(&["exec", &c.to_string()]);
        assert!(out.contains("\"is_error\":false"), "{out}");
    }

    /// `memvault sync REMOTE`, timed: (time, objects its pulls received).
    /// With `trace`, git's `GIT_TRACE_PERFORMANCE` goes to that file.
    fn sync(&self, remote: &str, trace: Option<&PathBuf>) -> (Duration, usize) {
        let mut c = self.cmd();
        if let Some(f) = trace {
            c.env("GIT_TRACE_PERFORMANCE", f);
        }
        c.args(["sync", remote, "--json"]);
        let t = Instant::now();
        let out = c.output().unwrap();
        let d = t.elapsed();
        let v: Value = serde_json::from_slice(&check(out, "memvault sync")).unwrap();
        let objects = v["pulls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["objects"].as_u64().unwrap() as usize)
            .sum();
        (d, objects)
    }
}

/// `git` with nothing of the caller's repository environment, a fixed
/// identity for `commit-tree`, and `env`.
fn git(env: &[(String, String)]) -> Command {
    let mut c = Command::new("git");
    for v in [
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_OBJECT_DIRECTORY",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_TRACE",
        "GIT_TRACE_PERFORMANCE",
    ] {
        c.env_remove(v);
    }
    for (k, v) in [
        ("GIT_AUTHOR_NAME", "bench"),
        ("GIT_AUTHOR_EMAIL", "bench@localhost"),
        ("GIT_COMMITTER_NAME", "bench"),
        ("GIT_COMMITTER_EMAIL", "bench@localhost"),
    ] {
        c.env(k, v);
    }
    c.envs(env.iter().map(|(k, v)| (k, v)));
    c
}

/// `git --git-dir=DIR ARGS` that must succeed: its stdout, trimmed.
fn git_in(dir: &Path, env: &[(String, String)], args: &[&str]) -> String {
    let mut c = git(env);
    c.arg("--git-dir").arg(dir).args(args);
    String::from_utf8(run(&mut c)).unwrap().trim().to_string()
}

fn git_with_stdin(dir: &Path, args: &[&str], input: &[u8]) -> String {
    let mut child = git(&[])
        .arg("--git-dir")
        .arg(dir)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(check(out, "git"))
        .unwrap()
        .trim()
        .to_string()
}

fn bare_repo(dir: &Path) {
    run(git(&[])
        .args(["init", "-q", "--bare", "-b", "main"])
        .arg(dir));
}

/// The packs of a repository: name -> (size, mtime).
fn packs(repo: &Path) -> BTreeMap<String, (u64, SystemTime)> {
    std::fs::read_dir(repo.join("objects/pack"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".pack"))
        .map(|e| {
            let m = e.metadata().unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                (m.len(), m.modified().unwrap()),
            )
        })
        .collect()
}

/// `git count-objects -v` of a repository.
fn count_objects(repo: &Path) -> BTreeMap<String, u64> {
    git_in(repo, &[], &["count-objects", "-v"])
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(": ")?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

/// Objects in a repository (loose and packed).
fn objects_in(repo: &Path) -> u64 {
    let c = count_objects(repo);
    c["count"] + c["in-pack"]
}

/// What the pushes did to the hub's packs (part 3).
#[derive(Default)]
struct PackCheck {
    pushes: usize,
    max_new: usize,
    violations: Vec<String>,
}

impl PackCheck {
    fn after_push(
        &mut self,
        what: &str,
        before: &BTreeMap<String, (u64, SystemTime)>,
        after: &BTreeMap<String, (u64, SystemTime)>,
    ) {
        self.pushes += 1;
        let new = after.keys().filter(|k| !before.contains_key(*k)).count();
        self.max_new = self.max_new.max(new);
        if new > 1 {
            self.violations
                .push(format!("{what}: {new} new packs on the hub"));
        }
        for (name, meta) in before {
            match after.get(name) {
                None => self
                    .violations
                    .push(format!("{what}: the hub's {name} was removed")),
                Some(m) if m != meta => self
                    .violations
                    .push(format!("{what}: the hub's {name} was rewritten")),
                Some(_) => {}
            }
        }
    }
}

/// Feed JSON lines to one `memvault serve` (fsync off): the fixture's
/// history, one commit a line.
fn serve_lines(v: &Vault, lines: Vec<String>) {
    let mut child = v
        .cmd()
        .env("MEMVAULT_BENCH_NO_FSYNC", "1")
        .arg("serve")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let n = lines.len();
    let writer = std::thread::spawn(move || {
        let mut w = std::io::BufWriter::new(&mut stdin);
        for l in lines {
            writeln!(w, "{l}").unwrap();
        }
        w.flush().unwrap();
    });
    let out = BufReader::new(child.stdout.take().unwrap());
    let mut got = 0;
    for line in out.lines() {
        let line = line.unwrap();
        assert!(line.contains("\"is_error\":false"), "{line}");
        got += 1;
    }
    writer.join().unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(got, n);
}

/// A new vault at `dir` (key file beside it) pushed to a new hub.
fn vault_and_hub(dir: &Path, lines: Vec<String>) -> (Vault, PathBuf) {
    let key = dir.join("vault.key");
    run(Command::new(BIN).arg("keygen").arg(&key));
    let v = Vault {
        dir: dir.join("vault"),
        key,
        env: vec![("MEMVAULT_BENCH_NO_FSYNC".into(), "1".into())],
    };
    v.ok(&["init"]);
    serve_lines(&v, lines);
    let hub = dir.join("hub.git");
    bare_repo(&hub);
    v.ok(&["remote", "add", "origin", hub.to_str().unwrap()]);
    v.ok(&["push"]);
    (v, hub)
}

/// The sync fixture: `target/bench-vaults/sync-20k/` with the key file,
/// the hub (20,000 commits) and clones `a` and `b` of it (made once).
fn sync_fixture() -> PathBuf {
    let dir = manifest().join("target/bench-vaults/sync-20k");
    if dir.join("done").exists() {
        return dir;
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    eprintln!(
        "making a vault of {COMMITS} commits in {} (once)",
        dir.display()
    );
    let t = Instant::now();
    // 2,000 small notes, then edits of them round and round: one commit
    // a line.
    let lines = (0..COMMITS)
        .map(|i| {
            let j = i % FILES;
            let path = format!("/memories/d{:02}/n{j:05}.md", j % 20);
            if i < FILES {
                json!({"command": "create", "path": path, "file_text": format!("note {j}\nrev 0\n")})
            } else {
                let k = i / FILES - 1;
                json!({"command": "str_replace", "path": path,
                       "old_str": format!("rev {k}\n"), "new_str": format!("rev {}\n", k + 1)})
            }
            .to_string()
        })
        .collect();
    let (v, hub) = vault_and_hub(&dir, lines);
    for name in ["a", "b"] {
        let c = Vault {
            dir: dir.join(name),
            key: v.key.clone(),
            env: v.env.clone(),
        };
        c.ok(&["clone", hub.to_str().unwrap()]);
    }
    std::fs::remove_dir_all(&v.dir).unwrap();
    std::fs::write(dir.join("done"), "").unwrap();
    eprintln!("  made in {:.1} s", t.elapsed().as_secs_f64());
    dir
}

/// The clone fixture: `target/bench-vaults/sync-2k-files/` with the key
/// file and a hub holding 2,000 notes of 1 KiB (made once).
fn clone_fixture() -> PathBuf {
    let dir = manifest().join("target/bench-vaults/sync-2k-files");
    if dir.join("done").exists() {
        return dir;
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    eprintln!(
        "making a vault of {FILES} notes in {} (once)",
        dir.display()
    );
    let lines = (0..FILES)
        .map(|i| {
            json!({"command": "create", "path": format!("/memories/d{:02}/note{i:05}.md", i % 20),
                   "file_text": note(&format!("note {i}"))})
            .to_string()
        })
        .collect();
    let (v, _) = vault_and_hub(&dir, lines);
    std::fs::remove_dir_all(&v.dir).unwrap();
    std::fs::write(dir.join("done"), "").unwrap();
    dir
}

/// A server process, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An sshd on 127.0.0.1 accepting one throwaway user key, and an ssh
/// config naming it `mvbench` (as `tests/it/sync_net.rs` does): the
/// server and the environment that makes git's ssh read that config.
fn sshd(dir: &Path) -> (Server, Vec<(String, String)>) {
    let sshd = ["/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("sshd (Debian's openssh-server) is needed; or pass --no-ssh");
    std::fs::create_dir_all(dir).unwrap();
    for name in ["host_key", "user_key"] {
        run(Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(dir.join(name)));
    }
    std::fs::copy(dir.join("user_key.pub"), dir.join("authorized_keys")).unwrap();
    let host_pub = std::fs::read_to_string(dir.join("host_key.pub")).unwrap();
    std::fs::write(dir.join("known_hosts"), format!("mvbench {host_pub}")).unwrap();
    // sshd's privilege separation directory.
    let _ = std::fs::create_dir_all("/run/sshd");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let user = String::from_utf8(run(Command::new("id").arg("-un")))
        .unwrap()
        .trim()
        .to_string();
    let d = dir.display();
    std::fs::write(
        dir.join("sshd_config"),
        format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nPidFile {d}/sshd.pid\n\
             AuthorizedKeysFile {d}/authorized_keys\nStrictModes no\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nPubkeyAuthentication yes\nUsePAM no\n\
             PermitRootLogin prohibit-password\nLogLevel ERROR\nMaxStartups 50\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("ssh_config"),
        format!(
            "Host mvbench\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  IdentityFile {d}/user_key\n  \
             IdentitiesOnly yes\n  HostKeyAlias mvbench\n  UserKnownHostsFile {d}/known_hosts\n  \
             StrictHostKeyChecking yes\n  BatchMode yes\n"
        ),
    )
    .unwrap();
    let mut child = Command::new(&sshd)
        .args(["-D", "-e", "-f"])
        .arg(dir.join("sshd_config"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(st)) = child.try_wait() {
            panic!("sshd exited early: {st}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "sshd did not listen"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let env = vec![(
        "GIT_SSH_COMMAND".to_string(),
        format!("ssh -F {d}/ssh_config"),
    )];
    (Server(child), env)
}

/// A transport: how memvault names the remote, git's URL for a hub, and
/// the environment both need.
struct Transport {
    name: &'static str,
    remote: &'static str,
    env: Vec<(String, String)>,
}

impl Transport {
    fn url(&self, hub: &Path) -> String {
        match self.name {
            "ssh" => format!("mvbench:{}", hub.display()),
            _ => hub.display().to_string(),
        }
    }
}

/// A plain bare repository standing for one machine on the git side.
struct GitSide {
    dir: PathBuf,
}

impl GitSide {
    /// One commit of a 1 KiB note on main (plumbing; not timed).
    fn commit(&self, tag: &str) {
        let d = &self.dir;
        let blob = git_with_stdin(d, &["hash-object", "-w", "--stdin"], note(tag).as_bytes());
        let mut listing = git_in(d, &[], &["ls-tree", "refs/heads/main"]);
        listing.push_str(&format!("\n100644 blob {blob}\t{tag}.md\n"));
        let tree = git_with_stdin(d, &["mktree"], listing.as_bytes());
        let c = git_in(
            d,
            &[],
            &["commit-tree", &tree, "-p", "refs/heads/main", "-m", tag],
        );
        git_in(d, &[], &["update-ref", "refs/heads/main", &c]);
    }

    fn fetch(&self, t: &Transport, url: &str) {
        git_in(
            &self.dir,
            &t.env,
            &[
                "fetch",
                "-q",
                "--no-tags",
                url,
                "+refs/heads/main:refs/remotes/origin/main",
            ],
        );
    }

    fn push(&self, t: &Transport, url: &str) {
        git_in(
            &self.dir,
            &t.env,
            &["push", "-q", url, "refs/heads/main:refs/heads/main"],
        );
    }

    /// Bring main to the remote's (a fast-forward; not timed).
    fn catch_up(&self, t: &Transport, url: &str) {
        self.fetch(t, url);
        git_in(
            &self.dir,
            &[],
            &["update-ref", "refs/heads/main", "refs/remotes/origin/main"],
        );
    }

    /// Fetch, merge the remote's main into ours, push: timed.
    fn fetch_merge_push(&self, t: &Transport, url: &str) -> Duration {
        let start = Instant::now();
        self.fetch(t, url);
        let d = &self.dir;
        let merged = git_in(
            d,
            &[],
            &[
                "merge-tree",
                "--write-tree",
                "refs/heads/main",
                "refs/remotes/origin/main",
            ],
        );
        let tree = merged.lines().next().unwrap().to_string();
        let c = git_in(
            d,
            &[],
            &[
                "commit-tree",
                &tree,
                "-p",
                "refs/heads/main",
                "-p",
                "refs/remotes/origin/main",
                "-m",
                "merge",
            ],
        );
        git_in(d, &[], &["update-ref", "refs/heads/main", &c]);
        self.push(t, url);
        start.elapsed()
    }

    /// Fetch (nothing new), push: timed.
    fn fetch_push(&self, t: &Transport, url: &str) -> Duration {
        let start = Instant::now();
        self.fetch(t, url);
        self.push(t, url);
        start.elapsed()
    }
}

/// One transport's results of part 1.
struct SyncResult {
    mv_b: Duration,
    mv_a: Duration,
    git_b: Duration,
    git_a: Duration,
    mv_round: Duration,
    git_round: Duration,
    mv_objects_pulled: usize,
    mv_objects_per_push: f64,
    git_objects_per_push: f64,
    phases_b: Vec<(String, Duration)>,
    phases_a: Vec<(String, Duration)>,
}

/// The git commands a traced memvault run ran itself (those with its
/// `-c core.hooksPath=/dev/null`), summed by subcommand, in order of
/// first use, and the rest of `total` as memvault's own work.
fn phases(trace: &Path, total: Duration) -> Vec<(String, Duration)> {
    let text = std::fs::read_to_string(trace).unwrap_or_default();
    let mut out: Vec<(String, Duration)> = Vec::new();
    for line in text.lines() {
        let Some((_, rest)) = line.split_once("performance: ") else {
            continue;
        };
        let Some((secs, cmd)) = rest.split_once(" s: git command: ") else {
            continue;
        };
        if !cmd.starts_with("git -c core.hooksPath=/dev/null") {
            continue;
        }
        let mut words = cmd.split_whitespace().skip(1);
        let mut sub = "?";
        while let Some(w) = words.next() {
            if w == "-c" {
                words.next();
            } else {
                sub = w;
                break;
            }
        }
        let d = Duration::from_secs_f64(secs.trim().parse().unwrap_or(0.0));
        match out.iter_mut().find(|(n, _)| n == sub) {
            Some(e) => e.1 += d,
            None => out.push((sub.to_string(), d)),
        }
    }
    let git: Duration = out.iter().map(|e| e.1).sum();
    out.push(("memvault itself".into(), total.saturating_sub(git)));
    out
}

#[allow(clippy::too_many_arguments)]
fn sync_part(
    a: &Args,
    t: &Transport,
    run_dir: &Path,
    hub: &Path,
    ghub: &Path,
    va: &Vault,
    vb: &Vault,
    ga: &GitSide,
    gb: &GitSide,
    check: &mut PackCheck,
) -> SyncResult {
    let gurl = t.url(ghub);
    let (mut mv_b, mut mv_a, mut git_b, mut git_a) = (vec![], vec![], vec![], vec![]);
    let (mut mv_round, mut git_round, mut pulled) = (vec![], vec![], vec![]);
    let (hub_before, ghub_before) = (objects_in(hub), objects_in(ghub));
    let mut pushes = 0;
    let tag = t.name;
    // Round 0 warms up (and settles what each vault last saw of this
    // remote); the last, traced, gives the phases.
    let mut phases_b = Vec::new();
    let mut phases_a = Vec::new();
    for r in 0..=a.rounds + 1 {
        let traced = r == a.rounds + 1;
        // memvault: B catches up (not timed), one change on each side.
        vb.ok(&["pull", t.remote]);
        va.create(&format!("/memories/bench/{tag}-a{r}.md"), &note("a"));
        vb.create(&format!("/memories/bench/{tag}-b{r}.md"), &note("b"));
        let trace_b = run_dir.join(format!("trace-{tag}-b"));
        let trace_a = run_dir.join(format!("trace-{tag}-a"));
        let before = packs(hub);
        let (tb, _) = vb.sync(t.remote, traced.then_some(&trace_b));
        let mid = packs(hub);
        check.after_push(&format!("{tag} round {r}, B's push"), &before, &mid);
        let (ta, objects) = va.sync(t.remote, traced.then_some(&trace_a));
        check.after_push(&format!("{tag} round {r}, A's push"), &mid, &packs(hub));
        pushes += 2;
        // git: the same on plain bare clones of the same history.
        gb.catch_up(t, &gurl);
        ga.commit(&format!("{tag}-a{r}"));
        gb.commit(&format!("{tag}-b{r}"));
        let gtb = gb.fetch_push(t, &gurl);
        let gta = ga.fetch_merge_push(t, &gurl);
        if traced {
            phases_b = phases(&trace_b, tb);
            phases_a = phases(&trace_a, ta);
        } else if r > 0 {
            mv_b.push(tb);
            mv_a.push(ta);
            git_b.push(gtb);
            git_a.push(gta);
            mv_round.push(tb + ta);
            git_round.push(gtb + gta);
            pulled.push(objects);
        }
        eprintln!(
            "  {tag} round {r}{}: memvault B {} A {} ({objects} objects pulled); git B {} A {}",
            if r == 0 {
                " (warm-up)"
            } else if traced {
                " (traced)"
            } else {
                ""
            },
            ms(tb),
            ms(ta),
            ms(gtb),
            ms(gta)
        );
    }
    SyncResult {
        mv_b: median(&mv_b),
        mv_a: median(&mv_a),
        git_b: median(&git_b),
        git_a: median(&git_a),
        mv_round: median(&mv_round),
        git_round: median(&git_round),
        mv_objects_pulled: median(&pulled),
        mv_objects_per_push: (objects_in(hub) - hub_before) as f64 / pushes as f64,
        git_objects_per_push: (objects_in(ghub) - ghub_before) as f64 / pushes as f64,
        phases_b,
        phases_a,
    }
}

/// A table: a label column, then one column per transport.
struct Table {
    head: Vec<String>,
    rows: Vec<(String, Vec<String>)>,
}

impl Table {
    fn new(head: &[&str]) -> Table {
        Table {
            head: head.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, label: &str, cells: Vec<String>) {
        self.rows.push((label.to_string(), cells));
    }

    fn print(&self) {
        let w0 = self
            .rows
            .iter()
            .map(|r| r.0.chars().count())
            .chain([self.head[0].chars().count()])
            .max()
            .unwrap();
        let ncol = self.head.len() - 1;
        let widths: Vec<usize> = (0..ncol)
            .map(|i| {
                self.rows
                    .iter()
                    .map(|r| r.1.get(i).map_or(0, |c| c.chars().count()))
                    .chain([self.head[i + 1].chars().count()])
                    .max()
                    .unwrap()
            })
            .collect();
        let line = |label: &str, cells: &[String]| {
            let mut s = format!("{label:<w0$}");
            for (i, w) in widths.iter().enumerate() {
                let c = cells.get(i).map_or("", String::as_str);
                s.push_str(&format!("  {c:>w$}"));
            }
            println!("{}", s.trim_end());
        };
        line(&self.head[0], &self.head[1..]);
        println!(
            "{}",
            "-".repeat(w0 + widths.iter().map(|w| w + 2).sum::<usize>())
        );
        for (label, cells) in &self.rows {
            line(label, cells);
        }
    }
}

fn phase_text(p: &[(String, Duration)]) -> String {
    let total: Duration = p.iter().map(|e| e.1).sum();
    let parts: Vec<String> = p
        .iter()
        .map(|(n, d)| format!("{n} {:.0}", d.as_secs_f64() * 1e3))
        .collect();
    format!(
        "{} (ms, of {:.0})",
        parts.join(", "),
        total.as_secs_f64() * 1e3
    )
}

/// Part 2: clone samples, one transport: (memvault, git --mirror,
/// git local (path only)).
fn clone_part(
    a: &Args,
    t: &Transport,
    hub: &Path,
    key: &Path,
    dir: &Path,
) -> (Duration, Duration, Option<Duration>) {
    let url = t.url(hub);
    let (mut mv, mut g, mut local) = (vec![], vec![], vec![]);
    for s in 0..=a.samples {
        let to = dir.join(format!("{}-{s}", t.name));
        let v = Vault {
            dir: to.clone(),
            key: key.to_path_buf(),
            env: t.env.clone(),
        };
        let start = Instant::now();
        v.ok(&["clone", &url]);
        let tm = start.elapsed();
        std::fs::remove_dir_all(&to).unwrap();
        let mut c = git(&t.env);
        c.args(["clone", "-q", "--mirror"]);
        if t.name == "path" {
            c.arg("--no-local");
        }
        c.arg(&url).arg(&to);
        let start = Instant::now();
        run(&mut c);
        let tg = start.elapsed();
        std::fs::remove_dir_all(&to).unwrap();
        let mut tl = None;
        if t.name == "path" {
            let start = Instant::now();
            run(git(&[])
                .args(["clone", "-q", "--mirror"])
                .arg(&url)
                .arg(&to));
            tl = Some(start.elapsed());
            std::fs::remove_dir_all(&to).unwrap();
        }
        eprintln!(
            "  {} clone {s}{}: memvault {} git {}",
            t.name,
            if s == 0 { " (warm-up)" } else { "" },
            ms(tm),
            ms(tg)
        );
        if s > 0 {
            mv.push(tm);
            g.push(tg);
            local.extend(tl);
        }
    }
    (
        median(&mv),
        median(&g),
        (!local.is_empty()).then(|| median(&local)),
    )
}

fn main() {
    let a = args();
    let started = Instant::now();
    let fixture = sync_fixture();
    let clone_fix = clone_fixture();
    let key = fixture.join("vault.key");
    let run_dir = fixture.parent().unwrap().join("sync-run");
    let _ = std::fs::remove_dir_all(&run_dir);
    std::fs::create_dir_all(&run_dir).unwrap();
    let run_dir = std::fs::canonicalize(&run_dir).unwrap();

    // Fresh copies: the hubs (memvault's, git's) and the two vaults.
    let hub = run_dir.join("hub.git");
    let ghub = run_dir.join("git-hub.git");
    copy(&fixture.join("hub.git"), &hub);
    copy(&fixture.join("hub.git"), &ghub);
    for h in [&hub, &ghub] {
        git_in(h, &[], &["config", "receive.autoGc", "false"]);
    }
    let clone_hub = run_dir.join("clone-hub.git");
    copy(&clone_fix.join("hub.git"), &clone_hub);
    let (_sshd, ssh_env) = if a.ssh {
        let (s, e) = sshd(&run_dir.join("ssh"));
        (Some(s), e)
    } else {
        (None, Vec::new())
    };
    let mut transports = vec![Transport {
        name: "path",
        remote: "origin",
        env: Vec::new(),
    }];
    if a.ssh {
        transports.push(Transport {
            name: "ssh",
            remote: "ssh",
            env: ssh_env.clone(),
        });
    }
    let mut machines = Vec::new();
    for name in ["a", "b"] {
        let dir = run_dir.join(name);
        copy(&fixture.join(name), &dir);
        let v = Vault {
            dir,
            key: key.clone(),
            env: ssh_env.clone(),
        };
        // The copies' origin is the fixture's hub: point it at the copy.
        v.ok(&["remote", "remove", "origin"]);
        v.ok(&["remote", "add", "origin", hub.to_str().unwrap()]);
        if a.ssh {
            v.ok(&[
                "remote",
                "add",
                "ssh",
                &format!("mvbench:{}", hub.display()),
            ]);
        }
        machines.push(v);
    }
    let (va, vb) = (&machines[0], &machines[1]);
    // What one SSH connection costs here (`ssh mvbench true`): memvault
    // and git pay it once per git command that talks to the remote.
    let ssh_connect = a.ssh.then(|| {
        let samples: Vec<Duration> = (0..4)
            .map(|_| {
                let (ssh, args) = ssh_env[0].1.split_once(' ').unwrap();
                let start = Instant::now();
                run(Command::new(ssh)
                    .args(args.split(' '))
                    .args(["mvbench", "true"]));
                start.elapsed()
            })
            .collect();
        median(&samples[1..])
    });
    let mut sides = Vec::new();
    for name in ["git-a.git", "git-b.git"] {
        let dir = run_dir.join(name);
        run(git(&[])
            .args(["clone", "-q", "--bare"])
            .arg(&ghub)
            .arg(&dir));
        sides.push(GitSide { dir });
    }
    let _ = Command::new("sync").status();
    let commits = git_in(&hub, &[], &["rev-list", "--count", "refs/heads/main"]);
    let hub_counts_before = count_objects(&hub);
    let hub_packs_before = packs(&hub).len();

    eprintln!(
        "part 1: sync, {} rounds (+ a warm-up and a traced one) per transport",
        a.rounds
    );
    let mut pack_check = PackCheck::default();
    let results: Vec<SyncResult> = transports
        .iter()
        .map(|t| {
            sync_part(
                &a,
                t,
                &run_dir,
                &hub,
                &ghub,
                va,
                vb,
                &sides[0],
                &sides[1],
                &mut pack_check,
            )
        })
        .collect();
    let hub_counts_after = count_objects(&hub);

    eprintln!("part 2: clone, {} samples per transport", a.samples);
    let clones_dir = run_dir.join("clones");
    std::fs::create_dir_all(&clones_dir).unwrap();
    let clone_key = clone_fix.join("vault.key");
    let clones: Vec<_> = transports
        .iter()
        .map(|t| clone_part(&a, t, &clone_hub, &clone_key, &clones_dir))
        .collect();

    let names: Vec<&str> = transports.iter().map(|t| t.name).collect();
    let cols = |f: &dyn Fn(usize) -> String| -> Vec<String> { (0..names.len()).map(f).collect() };

    println!();
    println!(
        "1. sync of a vault of {commits} commits (hub and clones A, B); medians of {} rounds",
        a.rounds
    );
    let mut head = vec!["B: nothing to pull, push one 1 KiB change"];
    head.extend(&names);
    let mut tb = Table::new(&head);
    let r = &results;
    tb.row("  memvault sync", cols(&|i| ms(r[i].mv_b)));
    tb.row("  git fetch + push", cols(&|i| ms(r[i].git_b)));
    tb.row(
        &format!("  ratio (target <= {SYNC_TARGET}x)"),
        cols(&|i| {
            let x = ratio(r[i].mv_b, r[i].git_b);
            format!("{x:.2}x {}", mark(x, SYNC_TARGET))
        }),
    );
    tb.row("A: fetch B's change, merge, push", vec![]);
    tb.row("  memvault sync", cols(&|i| ms(r[i].mv_a)));
    tb.row(
        "  git fetch + merge-tree + commit + push",
        cols(&|i| ms(r[i].git_a)),
    );
    tb.row(
        &format!("  ratio (target <= {SYNC_TARGET}x)"),
        cols(&|i| {
            let x = ratio(r[i].mv_a, r[i].git_a);
            format!("{x:.2}x {}", mark(x, SYNC_TARGET))
        }),
    );
    tb.row("a round (B + A)", vec![]);
    tb.row("  memvault", cols(&|i| ms(r[i].mv_round)));
    tb.row("  git", cols(&|i| ms(r[i].git_round)));
    tb.row(
        &format!("  ratio (target <= {SYNC_TARGET}x)"),
        cols(&|i| {
            let x = ratio(r[i].mv_round, r[i].git_round);
            format!("{x:.2}x {}", mark(x, SYNC_TARGET))
        }),
    );
    tb.row(
        "objects A's pull received (memvault)",
        cols(&|i| r[i].mv_objects_pulled.to_string()),
    );
    tb.row(
        "objects per push on the hub: memvault",
        cols(&|i| format!("{:.0}", r[i].mv_objects_per_push)),
    );
    tb.row(
        "objects per push on the hub: git",
        cols(&|i| format!("{:.0}", r[i].git_objects_per_push)),
    );
    tb.print();
    if let Some(d) = ssh_connect {
        println!("  one SSH connection here (ssh mvbench true): {}", ms(d));
    }
    for (i, n) in names.iter().enumerate() {
        println!("  one traced round, {n}:");
        println!("    B's sync: {}", phase_text(&r[i].phases_b));
        println!("    A's sync: {}", phase_text(&r[i].phases_a));
    }

    println!();
    println!(
        "2. clone of a vault of {FILES} notes of 1 KiB; medians of {} samples",
        a.samples
    );
    let mut head = vec!["clone"];
    head.extend(&names);
    let mut tc = Table::new(&head);
    tc.row("  memvault clone", cols(&|i| ms(clones[i].0)));
    tc.row(
        "  git clone --mirror (path: --no-local)",
        cols(&|i| ms(clones[i].1)),
    );
    tc.row(
        &format!("  ratio (target <= {CLONE_TARGET}x)"),
        cols(&|i| {
            let x = ratio(clones[i].0, clones[i].1);
            format!("{x:.2}x {}", mark(x, CLONE_TARGET))
        }),
    );
    tc.row(
        "  (git clone --mirror, local: hardlinks)",
        cols(&|i| clones[i].2.map(ms).unwrap_or_default()),
    );
    tc.print();

    println!();
    println!("3. the hub's packs around each push (receive.autoGc off on the hub)");
    println!(
        "  pushes checked: {}; new packs per push: at most {}; packs rewritten or removed: {}",
        pack_check.pushes,
        pack_check.max_new,
        pack_check
            .violations
            .iter()
            .filter(|v| !v.contains("new packs"))
            .count()
    );
    let show = |c: &BTreeMap<String, u64>| {
        format!(
            "packs {}, in-pack {}, loose {}, size-pack {} KiB",
            c["packs"], c["in-pack"], c["count"], c["size-pack"]
        )
    };
    println!(
        "  count-objects before part 1: {} ({hub_packs_before} .pack files)",
        show(&hub_counts_before)
    );
    println!("  count-objects after part 1:  {}", show(&hub_counts_after));
    for v in &pack_check.violations {
        println!("  VIOLATION: {v}");
    }
    println!(
        "  {}",
        if pack_check.violations.is_empty() {
            "ok: a push adds at most one pack and never rewrites the remote's"
        } else {
            "FAILED"
        }
    );
    println!("\ntotal {:.0} s", started.elapsed().as_secs_f64());
    drop(_sshd);
    if !pack_check.violations.is_empty() {
        std::process::exit(1);
    }
}
