//! memvault against the peer a user would otherwise pick (issue 17): the
//! official Python SDK's `BetaLocalFilesystemMemoryTool` (package
//! `anthropic`, pinned in `integrations/python/requirements.txt`), served
//! by `benches/peer/sdk_serve.py` over the JSON-lines protocol of
//! `memvault serve`, run alternately with `memvault serve` (the release
//! binary) on the same machine.
//!
//! Run: `cargo bench --all-features --bench peer`. Parts:
//!
//! - peer comparison (fsync on, then off on both sides): per round, a
//!   fresh directory of 2,000 notes of 1 KiB in 20 directories for each
//!   tool (not timed: memvault through the library with fsync off, the
//!   peer through its tool with `--no-fsync`, then `sync`), then create,
//!   str_replace, insert, rename, delete, view of a file and view of
//!   `/memories` (the listing; a sixth of the samples, as the SDK's takes
//!   about 100 ms), and a view of `/etc/passwd`, which both refuse without
//!   touching storage (the round trip's floor: what a view costs above it,
//!   and what the view target leaves memvault), one request at a time,
//!   round trip included. Each
//!   round's medians and p99s, the ratio memvault/SDK of the medians per
//!   round and the median of the ratios, marked against the issue's
//!   targets; beside them the cost of one `fdatasync` of a small write;
//! - CPU per mutation (fsync off): utime+stime of the serving process
//!   (`/proc/PID/stat`) over 1,000 creates and 1,000 str_replaces of
//!   1 KiB, for memvault and for the peer;
//! - directory size: one vault with a directory of 100 files and one of
//!   10,000 (filled by import, fsync off); medians of create, str_replace,
//!   rename and delete in each through `serve` (fsync on), and the bytes
//!   the vault grows per mutation before `gc` (files under `objects/` plus
//!   the used part of `memvault/wal`, while `serve` runs, and after it
//!   closes, i.e. after its closing checkpoint); then the time to rename a
//!   directory of 1,000 notes.
//!
//! Flags (after `--`): `--quick` (small sizes, for a try), `--samples N`,
//! `--rounds N`, `--peer-only` (the comparison and `fdatasync`),
//! `--cpu-only`, `--dirsize-only` (directory size and directory rename);
//! these add up (`--cpu-only --dirsize-only` runs both).
//! The first run makes `target/bench-venv` with pip from the requirements
//! file (the only network use); later runs reuse it.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use memvault::crypto::KeyFileKey;
use memvault::memory::{Memory, MemoryPath};
use memvault::vault::{Attribution, ImportFile, InitSecret, Vault, VaultConfig, fsync};
use serde_json::{Value, json};

struct Args {
    notes: usize,
    samples: usize,
    rounds: usize,
    cpu_batch: usize,
    big: usize,
    dir_samples: usize,
    peer: bool,
    cpu: bool,
    dirsize: bool,
}

fn args() -> Args {
    let mut a = Args {
        notes: 2000,
        samples: 300,
        rounds: 3,
        cpu_batch: 1000,
        big: 10_000,
        dir_samples: 100,
        peer: true,
        cpu: true,
        dirsize: true,
    };
    let argv: Vec<String> = std::env::args().collect();
    // The `--*-only` flags add up: the first clears the other parts.
    let mut any_only = false;
    let mut only = |a: &mut Args, part: usize| {
        if !any_only {
            (a.peer, a.cpu, a.dirsize) = (false, false, false);
            any_only = true;
        }
        *[&mut a.peer, &mut a.cpu, &mut a.dirsize][part] = true;
    };
    let mut i = 1;
    while i < argv.len() {
        let num = |i: usize| -> usize {
            argv.get(i + 1)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{} N", argv[i]))
        };
        match argv[i].as_str() {
            "--quick" => {
                a.notes = 200;
                a.samples = 30;
                a.cpu_batch = 200;
                a.big = 1000;
                a.dir_samples = 20;
            }
            "--samples" => {
                a.samples = num(i);
                i += 1;
            }
            "--rounds" => {
                a.rounds = num(i).max(1);
                i += 1;
            }
            "--peer-only" => only(&mut a, 0),
            "--cpu-only" => only(&mut a, 1),
            "--dirsize-only" => only(&mut a, 2),
            _ => {}
        }
        i += 1;
    }
    a
}

fn who() -> Attribution {
    Attribution {
        session: "bench".into(),
        actor: "bench".into(),
    }
}

/// A note of exactly 1 KiB.
fn note(i: usize) -> String {
    let mut s = format!("# Note {i}\n");
    while s.len() < 1024 - 40 {
        s.push_str("- the customer prefers email follow-ups\n");
    }
    s.truncate(1024 - 12);
    s.push_str(&format!("\nend {i:05}\n"));
    s.truncate(1024);
    s
}

fn note_path(i: usize) -> String {
    format!("/memories/d{:02}/note{i:05}.md", i % 20)
}

fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[v.len() / 2]
}

fn p99(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len()) - 1]
}

fn fmt(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else {
        format!("{:.2} ms", us / 1000.0)
    }
}

fn median_f(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn kib(bytes: f64) -> String {
    format!("{:.1} KiB", bytes / 1024.0)
}

/// `sync(1)`: write back what a fill left dirty, so it does not land in
/// the timings.
fn sync_disk() {
    let _ = Command::new("sync").status();
}

#[derive(Clone, Copy, PartialEq)]
enum Tool {
    Memvault,
    Sdk,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Memvault => "memvault",
            Tool::Sdk => "SDK",
        }
    }
}

/// A serving process (either tool), one request at a time.
struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    out: BufReader<ChildStdout>,
    line: String,
}

impl Server {
    fn start(mut cmd: Command) -> Server {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the server");
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().unwrap());
        Server {
            child,
            stdin,
            out,
            line: String::new(),
        }
    }

    fn memvault(dir: &Path, keyfile: &Path, fsync_on: bool) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_memvault"));
        cmd.arg("--vault")
            .arg(dir)
            .arg("--key-file")
            .arg(keyfile)
            .args(["serve", "--session", "bench-peer"]);
        if !fsync_on {
            cmd.env("MEMVAULT_BENCH_NO_FSYNC", "1");
        }
        Server::start(cmd)
    }

    fn sdk(python: &Path, root: &Path, fsync_on: bool) -> Server {
        let mut cmd = Command::new(python);
        cmd.arg(manifest().join("benches/peer/sdk_serve.py"))
            .arg("--root")
            .arg(root);
        if !fsync_on {
            cmd.arg("--no-fsync");
        }
        Server::start(cmd)
    }

    /// One request and its reply; the round trip's time.
    fn call(&mut self, cmd: &Value) -> Duration {
        // One write per request: `writeln!` of a `Value` to the unbuffered
        // pipe would write it in many small pieces, each waking the server.
        let mut text = cmd.to_string();
        text.push('\n');
        let t = Instant::now();
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(text.as_bytes()).unwrap();
        self.line.clear();
        self.out.read_line(&mut self.line).unwrap();
        let d = t.elapsed();
        // Only the floor's request is refused, by both tools.
        let refused = cmd["path"] == "/etc/passwd";
        assert!(
            self.line.contains("\"is_error\":false") != refused,
            "{cmd} -> {}",
            self.line
        );
        d
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// End of input: the process finishes (memvault checkpoints) and exits.
    fn close(mut self) {
        drop(self.stdin.take());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "server exited with {status}");
    }
}

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The venv's python with the pinned `anthropic`: `target/bench-venv`,
/// made with pip from the requirements file if missing.
fn python() -> PathBuf {
    let req = manifest().join("integrations/python/requirements.txt");
    let pinned = std::fs::read_to_string(&req)
        .unwrap()
        .lines()
        .find_map(|l| l.trim().strip_prefix("anthropic==").map(str::to_owned))
        .expect("anthropic pinned in the requirements file");
    let venv = manifest().join("target/bench-venv");
    let py = venv.join("bin/python");
    let check = format!(
        "import anthropic, sys; from anthropic.tools.memory import BetaLocalFilesystemMemoryTool; sys.exit(anthropic.__version__ != {pinned:?})"
    );
    let ok = |py: &Path| {
        Command::new(py)
            .args(["-c", &check])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !ok(&py) {
        eprintln!(
            "making {} (pip install -r {})",
            venv.display(),
            req.display()
        );
        let _ = std::fs::remove_dir_all(&venv);
        let made = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .expect("python3 -m venv");
        assert!(made.success(), "python3 -m venv failed");
        let pip = Command::new(venv.join("bin/pip"))
            .args(["install", "-q", "--disable-pip-version-check", "-r"])
            .arg(&req)
            .status()
            .expect("pip install");
        assert!(pip.success(), "pip install -r {} failed", req.display());
        assert!(ok(&py), "the venv has no anthropic=={pinned}");
    }
    let v = Command::new(&py)
        .args(["-c", "import sys; print(sys.version.split()[0])"])
        .output()
        .unwrap();
    println!(
        "peer: anthropic=={pinned} (BetaLocalFilesystemMemoryTool), Python {}",
        String::from_utf8_lossy(&v.stdout).trim()
    );
    py
}

/// The key file of the vault at `dir`, beside it (mode 0600).
fn write_key(dir: &Path, key: &KeyFileKey) -> PathBuf {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.with_extension("key");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .unwrap();
    f.write_all(key.expose_secret()).unwrap();
    path
}

/// A new vault at `dir` holding `notes` notes in 20 directories, made
/// through the library with fsync off; writes its key file beside it.
fn fill_memvault(dir: &Path, notes: usize) -> PathBuf {
    fsync::set_for_benchmark(false);
    let key = KeyFileKey::generate();
    let keyfile = write_key(dir, &key);
    {
        let mut vault =
            Vault::init(dir, InitSecret::KeyFile(key), VaultConfig::default(), who()).unwrap();
        let memory: Memory = memvault::memory_for_vault(&vault).unwrap();
        for i in 0..notes {
            let cmd = json!({"command": "create", "path": note_path(i), "file_text": note(i)});
            let r = memory.execute_json(&mut vault, &cmd);
            assert!(!r.is_error, "{cmd} -> {:?}", r.text());
        }
    }
    fsync::set_for_benchmark(true);
    keyfile
}

/// The same notes through the peer's own tool, fsync off.
fn fill_sdk(python: &Path, root: &Path, notes: usize) {
    let mut s = Server::sdk(python, root, false);
    for i in 0..notes {
        s.call(&json!({"command": "create", "path": note_path(i), "file_text": note(i)}));
    }
    s.close();
}

const OPS: [&str; 8] = [
    "create",
    "str_replace",
    "insert",
    "rename",
    "delete",
    "view",
    "listing",
    // A view of a path outside /memories, which both refuse without
    // touching storage: the round trip's floor (no target).
    "floor",
];

/// The issue's target for memvault/SDK per op, fsync on.
fn target(op: &str) -> f64 {
    match op {
        "create" | "str_replace" | "insert" => 0.7,
        "rename" | "delete" => 1.0,
        "view" => 0.35,
        _ => 0.05,
    }
}

/// Every op's samples on a filled directory, in the order of [`OPS`].
fn run_ops(s: &mut Server, a: &Args) -> Vec<Vec<Duration>> {
    let n = a.samples;
    let p = |i: usize| format!("/memories/d{:02}/new{i:05}.md", i % 20);
    let r = |i: usize| format!("/memories/d{:02}/ren{i:05}.md", i % 20);
    // Warm-up: the process is up, the files it reads are cached.
    s.call(&json!({"command": "view", "path": "/memories"}));
    for i in 0..20 {
        s.call(&json!({"command": "view", "path": note_path(i * 13 % a.notes)}));
    }
    let mut out = Vec::new();
    out.push(
        (0..n)
            .map(|i| s.call(&json!({"command": "create", "path": p(i), "file_text": note(i)})))
            .collect(),
    );
    out.push((0..n).map(|i| s.call(&json!({"command": "str_replace", "path": p(i), "old_str": format!("# Note {i}\n"), "new_str": format!("# Note {i} (edited)\n")}))).collect());
    out.push((0..n).map(|i| s.call(&json!({"command": "insert", "path": p(i), "insert_line": 1, "insert_text": "- inserted line"}))).collect());
    out.push(
        (0..n)
            .map(|i| s.call(&json!({"command": "rename", "old_path": p(i), "new_path": r(i)})))
            .collect(),
    );
    out.push(
        (0..n)
            .map(|i| s.call(&json!({"command": "delete", "path": r(i)})))
            .collect(),
    );
    out.push(
        (0..n)
            .map(|i| s.call(&json!({"command": "view", "path": note_path(i * 7 % a.notes)})))
            .collect(),
    );
    out.push(
        (0..listing_samples(a))
            .map(|_| s.call(&json!({"command": "view", "path": "/memories"})))
            .collect(),
    );
    out.push(
        (0..n)
            .map(|_| s.call(&json!({"command": "view", "path": "/etc/passwd"})))
            .collect(),
    );
    out
}

fn listing_samples(a: &Args) -> usize {
    (a.samples / 6).max(5)
}

/// One op's ratios memvault/SDK: per round, their median, the target.
struct Ratios {
    op: &'static str,
    rounds: Vec<f64>,
    median: f64,
    target: f64,
}

/// The compact table printed last.
#[derive(Default)]
struct Summary {
    /// Fsync on, fsync off.
    peer: [Vec<Ratios>; 2],
    lines: Vec<String>,
}

impl Summary {
    fn add(&mut self, s: String) {
        self.lines.push(s);
    }

    fn print(&self) {
        let mark = |r: &Ratios| {
            if r.median <= r.target {
                "ok"
            } else {
                "**MISS**"
            }
        };
        if !self.peer[0].is_empty() {
            println!(
                "| op | fsync on, per round | median | target | fsync off, per round | median | target |"
            );
            println!("|---|---|---|---|---|---|---|");
            for (k, on) in self.peer[0].iter().enumerate() {
                let each = |r: &Ratios| {
                    r.rounds
                        .iter()
                        .map(|x| format!("{x:.2}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                let off = &self.peer[1][k];
                println!(
                    "| {} | {} | {:.2}x | <={}x {} | {} | {:.2}x | <={}x {} |",
                    on.op,
                    each(on),
                    on.median,
                    on.target,
                    mark(on),
                    each(off),
                    off.median,
                    off.target,
                    mark(off)
                );
            }
            println!();
        }
        for l in &self.lines {
            println!("{l}");
        }
    }
}

/// Median and p99 of one `fdatasync` after a small write: a 1 KiB
/// overwrite of a preallocated file (as memvault's log), and a new 1 KiB
/// file (as the SDK's create).
fn fdatasync_cost(dir: &Path, samples: usize) -> (Vec<Duration>, Vec<Duration>) {
    let path = dir.join("fdatasync.probe");
    let f = std::fs::File::create(&path).unwrap();
    f.write_all_at(&vec![0u8; 1 << 20], 0).unwrap();
    f.sync_all().unwrap();
    let block = vec![7u8; 1024];
    let mut over = Vec::new();
    for i in 0..samples {
        f.write_all_at(&block, (i as u64 * 4096) % (1 << 20))
            .unwrap();
        let t = Instant::now();
        f.sync_data().unwrap();
        over.push(t.elapsed());
    }
    let mut new = Vec::new();
    for i in 0..samples.min(100) / 2 {
        let p = dir.join(format!("fdatasync.new{i}"));
        let mut g = std::fs::File::create(&p).unwrap();
        g.write_all(&block).unwrap();
        let t = Instant::now();
        g.sync_data().unwrap();
        new.push(t.elapsed());
        std::fs::remove_file(&p).unwrap();
    }
    std::fs::remove_file(&path).unwrap();
    (over, new)
}

/// Above this, one fdatasync of a small write says the shared disk is in a
/// slow phase (about a 4 ms tick each, seen while other machines sync).
const SLOW_DISK: Duration = Duration::from_millis(1);

/// The comparison, fsync on or off on both sides.
fn peer(
    a: &Args,
    python: &Path,
    tmp: &Path,
    fsync_on: bool,
    fdatasync: Duration,
    sum: &mut Summary,
) {
    let mode = if fsync_on { "fsync on" } else { "fsync off" };
    // [tool][round][op] -> samples
    let mut res: [Vec<Vec<Vec<Duration>>>; 2] = [Vec::new(), Vec::new()];
    // [tool][round] -> one fdatasync's median just before and after the run:
    // this shared disk has slow phases (other machines' syncs), which show.
    let mut disk: [Vec<(Duration, Duration)>; 2] = [Vec::new(), Vec::new()];
    let t0 = Instant::now();
    for round in 0..a.rounds {
        // Alternate which tool goes first.
        let order = if round % 2 == 0 {
            [Tool::Memvault, Tool::Sdk]
        } else {
            [Tool::Sdk, Tool::Memvault]
        };
        for tool in order {
            // A run during a slow phase of the disk (one fdatasync over
            // SLOW_DISK just before or after it) is run again, twice at most.
            for attempt in 0..3 {
                let dir = tmp.join(format!(
                    "{}-{}-r{round}-{attempt}",
                    tool.name(),
                    if fsync_on { "on" } else { "off" }
                ));
                let mut s = match tool {
                    Tool::Memvault => {
                        let keyfile = fill_memvault(&dir, a.notes);
                        sync_disk();
                        Server::memvault(&dir, &keyfile, fsync_on)
                    }
                    Tool::Sdk => {
                        fill_sdk(python, &dir, a.notes);
                        sync_disk();
                        Server::sdk(python, &dir, fsync_on)
                    }
                };
                let before = median(&fdatasync_cost(tmp, 50).0);
                let ops = run_ops(&mut s, a);
                let after = median(&fdatasync_cost(tmp, 50).0);
                s.close();
                let _ = std::fs::remove_dir_all(&dir);
                if before.max(after) > SLOW_DISK && attempt < 2 {
                    println!(
                        "  ({mode}, round {}, {}: one fdatasync took {}/{} before/after the run, over {}: run again)",
                        round + 1,
                        tool.name(),
                        fmt(before),
                        fmt(after),
                        fmt(SLOW_DISK)
                    );
                    continue;
                }
                res[tool as usize].push(ops);
                disk[tool as usize].push((before, after));
                break;
            }
        }
    }
    println!(
        "\npeer comparison, {mode} on both sides: {} notes of 1 KiB in 20 directories, {} samples per op ({} for the listing), {} rounds alternating, round trip included ({:.0} s)",
        a.notes,
        a.samples,
        listing_samples(a),
        a.rounds,
        t0.elapsed().as_secs_f64()
    );
    println!(
        "  {:<12} {:>5} {:>11} {:>11} {:>11} {:>11} {:>7}",
        "op", "round", "mv median", "mv p99", "SDK median", "SDK p99", "ratio"
    );
    let mut ratios_of = Vec::new();
    for (k, op) in OPS.iter().enumerate() {
        let mut ratios = Vec::new();
        for (r, (mv, sdk)) in res[0].iter().zip(&res[1]).enumerate() {
            let (m, s) = (&mv[k], &sdk[k]);
            let ratio = median(m).as_secs_f64() / median(s).as_secs_f64();
            ratios.push(ratio);
            println!(
                "  {:<12} {:>5} {:>11} {:>11} {:>11} {:>11} {:>6.2}x",
                op,
                r + 1,
                fmt(median(m)),
                fmt(p99(m)),
                fmt(median(s)),
                fmt(p99(s)),
                ratio
            );
        }
        ratios_of.push(ratios);
    }
    let around = |d: &(Duration, Duration)| format!("{}/{}", fmt(d.0), fmt(d.1));
    for (r, (m, s)) in disk[0].iter().zip(&disk[1]).enumerate() {
        println!(
            "  round {}: one fdatasync alone just before/after the run: memvault's {}, SDK's {}",
            r + 1,
            around(m),
            around(s)
        );
    }
    println!("  memvault/SDK, median of the rounds' ratios, against the issue's targets:");
    let median_of = |tool: usize, k: usize| {
        median_f(
            &(0..a.rounds)
                .map(|r| median(&res[tool][r][k]).as_secs_f64())
                .collect::<Vec<_>>(),
        )
    };
    for (k, &op) in OPS.iter().enumerate() {
        let ratios = &ratios_of[k];
        if op == "floor" {
            // What a view costs above the floor, and what the view target
            // leaves memvault for it.
            let (floor, view) = (
                (median_of(0, k), median_of(1, k)),
                (median_of(0, 5), median_of(1, 5)),
            );
            let us = |x: f64| fmt(Duration::from_secs_f64(x.max(0.0)));
            let line = format!(
                "the round trip of a refused path (no storage touched): memvault {}, SDK {} ({:.2}x); a view above it: memvault {}, SDK {}; a 0.35x view leaves memvault {} above its floor",
                us(floor.0),
                us(floor.1),
                median_f(ratios),
                us(view.0 - floor.0),
                us(view.1 - floor.1),
                us(0.35 * view.1 - floor.0)
            );
            println!("  {line}");
            sum.add(format!("- {line} ({mode})"));
            continue;
        }
        let med = median_f(ratios);
        // Fsync off, rename and delete: the target is 0.5x when one
        // fdatasync alone costs more than the SDK's whole rename.
        let sdk_rename = median_f(
            &(0..a.rounds)
                .map(|r| median(&res[1][r][3]).as_secs_f64())
                .collect::<Vec<_>>(),
        );
        let t = if !fsync_on && (op == "rename" || op == "delete") {
            0.5
        } else {
            target(op)
        };
        let mark = if med <= t { "ok" } else { "MISS" };
        let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        let mut line = format!(
            "{:<12} {:<18} {:>6.2}x  target <={t}x  {mark}",
            op,
            each.join(" "),
            med
        );
        if fsync_on && (op == "rename" || op == "delete") {
            line.push_str(&format!(
                "  (one fdatasync alone {}, SDK {op} median {})",
                fmt(fdatasync),
                fmt(Duration::from_secs_f64(median_f(
                    &(0..a.rounds)
                        .map(|r| median(&res[1][r][k]).as_secs_f64())
                        .collect::<Vec<_>>()
                )))
            ));
        }
        if !fsync_on && (op == "rename" || op == "delete") {
            line.push_str(&format!(
                "  (0.5x applies as fdatasync {} {} the SDK's rename {})",
                fmt(fdatasync),
                if fdatasync.as_secs_f64() > sdk_rename {
                    ">"
                } else {
                    "<="
                },
                fmt(Duration::from_secs_f64(sdk_rename))
            ));
        }
        println!("  {line}");
        sum.peer[usize::from(!fsync_on)].push(Ratios {
            op,
            rounds: ratios.clone(),
            median: med,
            target: t,
        });
    }
    if fsync_on {
        let sdk = |k: usize| {
            fmt(Duration::from_secs_f64(median_f(
                &(0..a.rounds)
                    .map(|r| median(&res[1][r][k]).as_secs_f64())
                    .collect::<Vec<_>>(),
            )))
        };
        sum.add(format!(
            "- one fdatasync of a small write {}; the SDK's rename {}, delete {} (fsync on, median of rounds)",
            fmt(fdatasync),
            sdk(3),
            sdk(4)
        ));
    }
}

/// utime+stime of a process, in seconds.
fn cpu_seconds(pid: u32, tick: f64) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of proc(5); `rest` starts at field 3.
    let utime: f64 = f[11].parse().unwrap();
    let stime: f64 = f[12].parse().unwrap();
    (utime + stime) / tick
}

fn clock_tick() -> f64 {
    let out = Command::new("getconf").arg("CLK_TCK").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// CPU per mutation of each tool's serving process, fsync off.
fn cpu(a: &Args, python: Option<&Path>, tmp: &Path, sum: &mut Summary) {
    let tick = clock_tick();
    let n = a.cpu_batch;
    println!(
        "\nCPU per mutation of the serving process (utime+stime from /proc/PID/stat, {tick:.0} ticks/s), fsync off, {} notes, batches of {n}:",
        a.notes
    );
    let mut tools = vec![Tool::Memvault];
    if python.is_some() {
        tools.push(Tool::Sdk);
    }
    for tool in tools {
        let dir = tmp.join(format!("cpu-{}", tool.name()));
        let mut s = match tool {
            Tool::Memvault => {
                let keyfile = fill_memvault(&dir, a.notes);
                sync_disk();
                Server::memvault(&dir, &keyfile, false)
            }
            Tool::Sdk => {
                let py = python.unwrap();
                fill_sdk(py, &dir, a.notes);
                sync_disk();
                Server::sdk(py, &dir, false)
            }
        };
        // Warm: caches filled, the log and its first checkpoint behind.
        for i in 0..100 {
            let p = format!("/memories/d{:02}/warm{i:05}.md", i % 20);
            s.call(&json!({"command": "create", "path": p, "file_text": note(i)}));
            s.call(&json!({"command": "str_replace", "path": p, "old_str": format!("# Note {i}\n"), "new_str": format!("# Note {i} (edited)\n")}));
        }
        let p = |i: usize| format!("/memories/d{:02}/cpu{i:05}.md", i % 20);
        let c0 = cpu_seconds(s.pid(), tick);
        let t = Instant::now();
        for i in 0..n {
            s.call(&json!({"command": "create", "path": p(i), "file_text": note(i)}));
        }
        let wall_c = t.elapsed().as_secs_f64();
        let c1 = cpu_seconds(s.pid(), tick);
        let t = Instant::now();
        for i in 0..n {
            s.call(&json!({"command": "str_replace", "path": p(i), "old_str": format!("# Note {i}\n"), "new_str": format!("# Note {i} (edited)\n")}));
        }
        let wall_e = t.elapsed().as_secs_f64();
        let c2 = cpu_seconds(s.pid(), tick);
        s.close();
        let _ = std::fs::remove_dir_all(&dir);
        let per = |c: f64| c * 1e3 / n as f64;
        let line = format!(
            "{:<8} create {:.3} ms CPU/op (wall {:.3} ms/op), str_replace {:.3} ms CPU/op (wall {:.3} ms/op){}",
            tool.name(),
            per(c1 - c0),
            per(wall_c),
            per(c2 - c1),
            per(wall_e),
            if tool == Tool::Memvault {
                "  target <=0.2 ms"
            } else {
                ""
            }
        );
        println!("  {line}");
        sum.add(format!("- CPU per mutation, fsync off: {line}"));
    }
}

/// The entry at `pos` of a log's bytes: its length and its body's first 8
/// bytes, the generation (each entry is `"MVWL" kind:u8 len:u32le body
/// checksum:20`, and every body starts with the generation). Checksums
/// are not checked: the log is read while nothing writes to it.
fn wal_entry(bytes: &[u8], pos: usize) -> Option<(usize, &[u8])> {
    let h = bytes.get(pos..pos + 9)?;
    if &h[..4] != b"MVWL" {
        return None;
    }
    let len = u32::from_le_bytes([h[5], h[6], h[7], h[8]]) as usize;
    bytes.get(pos + 9 + len..pos + 29 + len)?;
    Some((29 + len, bytes.get(pos + 9..pos + 17)?))
}

/// The used part of `memvault/wal`: the head and the records of its
/// generation that follow it (the file is preallocated: what follows is
/// zeros, or an earlier generation's remains).
fn wal_used(vault: &Path) -> u64 {
    let Ok(bytes) = std::fs::read(vault.join("memvault/wal")) else {
        return 0;
    };
    let Some((mut pos, generation)) = wal_entry(&bytes, 0) else {
        return 0;
    };
    while let Some((len, g)) = wal_entry(&bytes, pos) {
        if g != generation {
            break;
        }
        pos += len;
    }
    pos as u64
}

fn dir_bytes(p: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(p) else {
        return 0;
    };
    rd.flatten()
        .map(|e| {
            let m = e.metadata().unwrap();
            if m.is_dir() {
                dir_bytes(&e.path())
            } else {
                m.len()
            }
        })
        .sum()
}

/// objects/ bytes plus the used part of the log.
fn vault_bytes(vault: &Path) -> u64 {
    dir_bytes(&vault.join("objects")) + wal_used(vault)
}

fn import(vault: &mut Vault, dir: &str, prefix: &str, n: usize) {
    let files = (0..n)
        .map(|i| ImportFile {
            path: MemoryPath::parse(&format!("/memories/{dir}/{prefix}{i:05}.md")).unwrap(),
            content: note(i).into_bytes().into(),
            redactions: Vec::new(),
        })
        .collect();
    vault.import_files(files).unwrap();
}

/// The records of the log's current generation (since its last
/// checkpoint): how many, and their bytes.
fn wal_records(vault: &Path) -> (usize, u64) {
    let Ok(bytes) = std::fs::read(vault.join("memvault/wal")) else {
        return (0, 0);
    };
    let mut pos = match wal_entry(&bytes, 0) {
        Some((len, _)) => len,
        None => return (0, 0),
    };
    let head_len = pos;
    let generation = &bytes[9..17];
    let mut n = 0;
    while let Some((len, g)) = wal_entry(&bytes, pos) {
        if g != generation {
            break;
        }
        pos += len;
        n += 1;
    }
    (n, (pos - head_len) as u64)
}

/// A batch's samples, log bytes per record, growth per op, disk probe.
type Batch = (Vec<Duration>, f64, f64, Duration);

/// Open `serve` on `vault` (fsync on), run `batch` one request at a
/// time, close it (its closing checkpoint packs the log). The samples,
/// the log bytes per record before the checkpoint, and what
/// [`vault_bytes`] grew by from before the open to after the close, and
/// the slower of one fdatasync's medians before and after.
fn serve_batch(vault: &Path, keyfile: &Path, warm: &str, batch: &[Value]) -> Batch {
    let probe = || median(&fdatasync_cost(vault.parent().unwrap(), 30).0);
    let disk = probe();
    let before = vault_bytes(vault);
    let mut s = Server::memvault(vault, keyfile, true);
    s.call(&json!({"command": "view", "path": warm}));
    let v: Vec<Duration> = batch.iter().map(|c| s.call(c)).collect();
    let (records, log_bytes) = wal_records(vault);
    s.close();
    let after = vault_bytes(vault);
    let per_record = if records > 0 {
        log_bytes as f64 / records as f64
    } else {
        f64::NAN
    };
    (
        v,
        per_record,
        (after as f64 - before as f64) / batch.len() as f64,
        disk.max(probe()),
    )
}

/// Directory size, then the rename of a directory of 1,000 notes.
fn dirsize(a: &Args, tmp: &Path, sum: &mut Summary) {
    let dir = tmp.join("dirsize");
    let key = KeyFileKey::generate();
    let keyfile = write_key(&dir, &key);
    let t = Instant::now();
    fsync::set_for_benchmark(false);
    {
        let mut vault = Vault::init(
            &dir,
            InitSecret::KeyFile(key),
            VaultConfig::default(),
            who(),
        )
        .unwrap();
        import(&mut vault, "small", "s", 100);
        import(&mut vault, "big", "b", a.big);
        import(&mut vault, "thousand", "t", 1000);
    }
    fsync::set_for_benchmark(true);
    sync_disk();
    let n = a.dir_samples;
    println!(
        "\ndirectory size: one vault, a directory of 100 files and one of {} (and one of 1,000), filled by import, fsync off ({:.1} s); through `serve`, fsync on, {n} samples per op; each batch in its own `serve`, closed after it",
        a.big,
        t.elapsed().as_secs_f64()
    );
    // A first session: whatever a vault's first mutations set up.
    let warm: Vec<Value> = (0..20)
        .flat_map(|i| {
            let p = format!("/memories/warm/w{i}.md");
            [
                json!({"command": "create", "path": p, "file_text": note(i)}),
                json!({"command": "delete", "path": p}),
            ]
        })
        .collect();
    serve_batch(&dir, &keyfile, "/memories", &warm);
    let names = ["create", "str_replace", "rename", "delete"];
    let dirs = ["small", "big"];
    // [op][dir] -> (samples, log bytes per record, growth per op)
    let mut res: Vec<Vec<Batch>> = Vec::new();
    for (k, op) in names.iter().enumerate() {
        let mut row = vec![(Vec::new(), 0.0, 0.0, Duration::ZERO); 2];
        // Alternate which directory goes first.
        let order = if k % 2 == 0 { [0, 1] } else { [1, 0] };
        for j in order {
            let d = dirs[j];
            let p = |i: usize| format!("/memories/{d}/x{i:05}.md");
            let q = |i: usize| format!("/memories/{d}/y{i:05}.md");
            let batch: Vec<Value> = (0..n)
                .map(|i| match *op {
                    "create" => json!({"command": "create", "path": p(i), "file_text": note(i)}),
                    "str_replace" => json!({"command": "str_replace", "path": p(i), "old_str": format!("# Note {i}\n"), "new_str": format!("# Note {i} (edited)\n")}),
                    "rename" => json!({"command": "rename", "old_path": p(i), "new_path": q(i)}),
                    _ => json!({"command": "delete", "path": q(i)}),
                })
                .collect();
            row[j] = serve_batch(&dir, &keyfile, &format!("/memories/{d}"), &batch);
        }
        res.push(row);
    }
    let big = a.big.to_string();
    println!(
        "  {:<12} {:>9} {:>9} {:>9} {:>9} {:>6}  {:>10} {:>10}  {:>10} {:>10}  {:>15}",
        "op",
        "100 med",
        "100 p99",
        format!("{big} med"),
        format!("{big} p99"),
        "ratio",
        "log/op 100",
        format!("log/op {big}"),
        "grows 100",
        format!("grows {big}"),
        "fdatasync 100/big"
    );
    sum.add(String::new());
    sum.add(format!(
        "| op (fsync on, serve) | dir of 100 | dir of {big} | ratio (<=1.5x) | grows/op 100 | grows/op {big} (<=4 KiB) |"
    ));
    sum.add("|---|---|---|---|---|---|".into());
    let mark = |ok: bool| if ok { "ok" } else { "**MISS**" };
    for (k, op) in names.iter().enumerate() {
        let (s, b) = (&res[k][0], &res[k][1]);
        let (ms, mb) = (median(&s.0), median(&b.0));
        let ratio = mb.as_secs_f64() / ms.as_secs_f64();
        println!(
            "  {:<12} {:>9} {:>9} {:>9} {:>9} {:>5.2}x  {:>10} {:>10}  {:>10} {:>10}  {:>15}",
            op,
            fmt(ms),
            fmt(p99(&s.0)),
            fmt(mb),
            fmt(p99(&b.0)),
            ratio,
            kib(s.1),
            kib(b.1),
            kib(s.2),
            kib(b.2),
            format!("{}/{}", fmt(s.3), fmt(b.3))
        );
        sum.add(format!(
            "| {op} | {} | {} | {ratio:.2}x {} | {} | {} {} |",
            fmt(ms),
            fmt(mb),
            mark(ratio <= 1.5),
            kib(s.2),
            kib(b.2),
            mark(s.2.max(b.2) <= 4096.0)
        ));
    }
    println!(
        "  log/op: bytes of log per record before the closing checkpoint; grows: objects/ plus the used part of memvault/wal, from before `serve` opened to after it closed, per op (before gc); fdatasync: one alone, the slower median of before and after the batch (over 1 ms: the disk was in a slow phase)"
    );
    sum.add(String::new());

    // The rename of a directory of 1,000 notes, there and back.
    let batch: Vec<Value> = (0..5)
        .map(|i| {
            let (from, to) = if i % 2 == 0 {
                ("/memories/thousand", "/memories/thousand2")
            } else {
                ("/memories/thousand2", "/memories/thousand")
            };
            json!({"command": "rename", "old_path": from, "new_path": to})
        })
        .collect();
    let (v, log, grows, disk) = serve_batch(&dir, &keyfile, "/memories/thousand", &batch);
    let each: Vec<String> = v.iter().map(|d| fmt(*d)).collect();
    let line = format!(
        "rename of a directory of 1,000 notes through serve (fsync on): median {} ({}); log {} per rename, vault grows {} per rename (before gc); one fdatasync {}",
        fmt(median(&v)),
        each.join(", "),
        kib(log),
        kib(grows),
        fmt(disk)
    );
    println!("\n{line}");
    sum.add(format!("- {line}"));
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    let a = args();
    // Under target/: the same disk as the build, not a RAM-backed /tmp.
    let root = manifest().join("target/tmp");
    std::fs::create_dir_all(&root).unwrap();
    let tmp = tempfile::tempdir_in(&root).unwrap();
    let mut sum = Summary::default();
    let t0 = Instant::now();
    let py = (a.peer || a.cpu).then(python);
    if let Some(py) = py.as_deref().filter(|_| a.peer) {
        let (over, new) = fdatasync_cost(tmp.path(), 300);
        let fdatasync = median(&over);
        println!(
            "one fdatasync after a 1 KiB write, on the disk of {}: overwrite of a preallocated file median {} (p99 {}); a new 1 KiB file median {} (p99 {})",
            root.display(),
            fmt(fdatasync),
            fmt(p99(&over)),
            fmt(median(&new)),
            fmt(p99(&new))
        );
        peer(&a, py, tmp.path(), true, fdatasync, &mut sum);
        peer(&a, py, tmp.path(), false, fdatasync, &mut sum);
    }
    if a.cpu {
        cpu(&a, py.as_deref(), tmp.path(), &mut sum);
    }
    if a.dirsize {
        dirsize(&a, tmp.path(), &mut sum);
    }
    println!(
        "\nsummary (memvault/SDK: median of the rounds' ratios of medians; {:.0} s in all):",
        t0.elapsed().as_secs_f64()
    );
    sum.print();
}
