//! memvault's vault benchmark: median and p99 per memory command on a vault
//! of 2,000 notes of 1 KiB in 20 directories, with fsync on (the default)
//! and off, through the library and through `memvault serve`; throughput
//! of 1 and 4 concurrent `serve` writers (creates spread over the 20
//! directories; clients that wait for each reply, as an agent does, and
//! clients that stream their requests); open without key derivation;
//! repository size after `gc` against the sum of blob sizes; unlock with
//! the default Argon2 parameters.
//!
//! Run: `cargo bench --all-features --bench vault` (add `-- --quick` for a short run,
//! `--notes N`, `--samples N`, `--library-only` to stop after the
//! library figures, `--throughput-only` to fill and then run only the
//! 1- and 4-writer throughput, `--clients N` to run only N waiting
//! clients, `--serve-only` for the per-command figures through `serve`;
//! these for profiling and comparisons).
//!
//! Scale runs: `cargo bench --all-features --bench vault -- --scale --notes 20000` and
//! `-- --scale --commits 200000` build the vault once (fsync off), cache it
//! under `target/bench-vaults/`, and report the write and read medians,
//! open time (in this process, and a one-shot `memvault exec` view in a new
//! one), and repository size against blob bytes after `gc`, without
//! the serve and unlock parts. `--commits N` makes N commits in all: the
//! notes, then edits of them in turn. `--scale-pair` (with `--notes` or
//! `--commits`) runs the commands on that vault and on the cached
//! 2,000-note one side by side, alternating, and reports their ratios.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use memvault::crypto::{KdfParams, KeyFileKey, Passphrase, Unlock};
use memvault::memory::Memory;
use memvault::vault::{Attribution, InitSecret, Vault, VaultConfig, fsync};
use serde_json::{Value, json};

#[derive(Clone)]
struct Args {
    notes: usize,
    samples: usize,
    unlock_samples: usize,
    scale: bool,
    /// `--scale-pair`: the scale vault and a 2,000-note one, side by side.
    scale_pair: bool,
    commits: usize,
    library_only: bool,
    throughput_only: bool,
    /// `--serve-only`: only the per-command figures through `serve`.
    serve_only: bool,
    /// `--clients N`: run only the N-client closed-loop throughput (profiling).
    clients: Option<usize>,
}

fn args() -> Args {
    let mut a = Args {
        notes: 2000,
        samples: 300,
        unlock_samples: 5,
        scale: false,
        scale_pair: false,
        commits: 0,
        library_only: false,
        throughput_only: false,
        serve_only: false,
        clients: None,
    };
    let argv: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < argv.len() {
        match argv[i].as_str() {
            "--quick" => {
                a.notes = 200;
                a.samples = 50;
                a.unlock_samples = 1;
            }
            "--notes" => {
                a.notes = argv[i + 1].parse().expect("--notes N");
                i += 1;
            }
            "--scale" => a.scale = true,
            "--scale-pair" => {
                a.scale = true;
                a.scale_pair = true;
            }
            "--library-only" => a.library_only = true,
            "--throughput-only" => a.throughput_only = true,
            "--serve-only" => a.serve_only = true,
            "--clients" => {
                a.clients = Some(argv[i + 1].parse().expect("--clients N"));
                a.throughput_only = true;
                i += 1;
            }
            "--commits" => {
                a.commits = argv[i + 1].parse().expect("--commits N");
                i += 1;
            }
            "--samples" => {
                a.samples = argv[i + 1].parse().expect("--samples N");
                i += 1;
            }
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

fn stats(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    let med = v[v.len() / 2];
    let p99 = v[((v.len() as f64 * 0.99).ceil() as usize).min(v.len()) - 1];
    (med, p99)
}

fn fmt(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else {
        format!("{:.2} ms", us / 1000.0)
    }
}

fn run(memory: &Memory, vault: &mut Vault, cmd: &Value) -> Duration {
    let t = Instant::now();
    let r = memory.execute_json(vault, cmd);
    let d = t.elapsed();
    assert!(!r.is_error, "{cmd} -> {:?}", r.text());
    d
}

fn bench_ops(label: &str, a: &Args, key: &KeyFileKey, dir: &std::path::Path) {
    let rows = ops_rows(a.notes, a.samples, &label.replace(' ', "_"), key, dir);
    println!(
        "\n{label}: {} notes of 1 KiB in 20 directories, {} samples per operation",
        a.notes, a.samples
    );
    println!("  {:<26} {:>10} {:>10}", "operation", "median", "p99");
    for (name, v) in rows {
        let (m, p) = stats(v);
        println!("  {:<26} {:>10} {:>10}", name, fmt(m), fmt(p));
    }
}

type Rows = Vec<(&'static str, Vec<Duration>)>;

/// `n` samples of each command on the vault in `dir` of `notes` notes
/// (opened here, so its caches start cold), new files under `bench_{tag}`.
fn ops_rows(notes: usize, n: usize, tag: &str, key: &KeyFileKey, dir: &Path) -> Rows {
    let mut vault = Vault::open(dir, &Unlock::KeyFile(key), who()).unwrap();
    let memory = memvault::memory_for_vault(&vault).unwrap();
    let mut rows: Rows = Vec::new();
    let mut create = Vec::new();
    for i in 0..n {
        create.push(run(&memory, &mut vault, &json!({"command": "create", "path": format!("/memories/bench_{tag}/n{i}.md"), "file_text": note(i)})));
    }
    rows.push(("create", create));
    let mut view = Vec::new();
    for i in 0..n {
        let j = (i * 7) % notes;
        let p = format!("/memories/d{:02}/note{j:05}.md", j % 20);
        view.push(run(
            &memory,
            &mut vault,
            &json!({"command": "view", "path": p}),
        ));
    }
    rows.push(("view", view));
    let mut sr = Vec::new();
    for i in 0..n {
        sr.push(run(&memory, &mut vault, &json!({"command": "str_replace", "path": format!("/memories/bench_{tag}/n{i}.md"), "old_str": format!("# Note {i}\n"), "new_str": format!("# Note {i} (edited)\n")})));
    }
    rows.push(("str_replace", sr));
    let mut ins = Vec::new();
    for i in 0..n {
        ins.push(run(&memory, &mut vault, &json!({"command": "insert", "path": format!("/memories/bench_{tag}/n{i}.md"), "insert_line": 1, "insert_text": "- inserted line"})));
    }
    rows.push(("insert", ins));
    let mut ren = Vec::new();
    for i in 0..n {
        ren.push(run(&memory, &mut vault, &json!({"command": "rename", "old_path": format!("/memories/bench_{tag}/n{i}.md"), "new_path": format!("/memories/bench_{tag}/r{i}.md")})));
    }
    rows.push(("rename", ren));
    let mut del = Vec::new();
    for i in 0..n {
        del.push(run(
            &memory,
            &mut vault,
            &json!({"command": "delete", "path": format!("/memories/bench_{tag}/r{i}.md")}),
        ));
    }
    rows.push(("delete", del));
    let mut list = Vec::new();
    for _ in 0..n.min(100) {
        list.push(run(
            &memory,
            &mut vault,
            &json!({"command": "view", "path": "/memories"}),
        ));
    }
    rows.push(("view /memories (listing)", list));
    rows
}

fn serve_cmd(dir: &Path, keyfile: &Path, session: &str) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_memvault"))
        .arg("--vault")
        .arg(dir)
        .arg("--key-file")
        .arg(keyfile)
        .args(["serve", "--session", session])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn memvault serve")
}

/// Median and p99 per command through one `serve` process, one request
/// at a time (round trip over the pipes included).
fn bench_serve(a: &Args, dir: &Path, keyfile: &Path) {
    let mut child = serve_cmd(dir, keyfile, "bench-serve");
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let n = a.samples;
    let mut line = String::new();
    let mut call = |cmd: Value| {
        let t = Instant::now();
        // One write per request: `writeln!` on the unbuffered pipe writes
        // it in pieces, each waking the server.
        stdin.write_all(format!("{cmd}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
        line.clear();
        out.read_line(&mut line).unwrap();
        let d = t.elapsed();
        assert!(!line.contains("\"is_error\":true"), "{cmd} -> {line}");
        d
    };
    let mut rows: Vec<(&str, Vec<Duration>)> = Vec::new();
    let p = |i: usize| format!("/memories/bench_serve/n{i}.md");
    rows.push((
        "create",
        (0..n)
            .map(|i| call(json!({"command": "create", "path": p(i), "file_text": note(i)})))
            .collect(),
    ));
    rows.push(("view", (0..n).map(|i| {
        let j = (i * 7) % a.notes;
        call(json!({"command": "view", "path": format!("/memories/d{:02}/note{j:05}.md", j % 20)}))
    }).collect()));
    rows.push(("str_replace", (0..n).map(|i| call(json!({"command": "str_replace", "path": p(i), "old_str": format!("# Note {i}\n"), "new_str": format!("# Note {i} (edited)\n")}))).collect()));
    rows.push(("insert", (0..n).map(|i| call(json!({"command": "insert", "path": p(i), "insert_line": 1, "insert_text": "- inserted line"}))).collect()));
    rows.push(("rename", (0..n).map(|i| call(json!({"command": "rename", "old_path": p(i), "new_path": format!("/memories/bench_serve/r{i}.md")}))).collect()));
    rows.push((
        "delete",
        (0..n)
            .map(|i| {
                call(json!({"command": "delete", "path": format!("/memories/bench_serve/r{i}.md")}))
            })
            .collect(),
    ));
    rows.push((
        "view /memories (listing)",
        (0..n.min(100))
            .map(|_| call(json!({"command": "view", "path": "/memories"})))
            .collect(),
    ));
    drop(stdin);
    child.wait().unwrap();
    println!(
        "\nthrough `memvault serve` (fsync on): {n} samples per operation, round trip included"
    );
    println!("  {:<26} {:>10} {:>10}", "operation", "median", "p99");
    for (name, v) in rows {
        let (m, p) = stats(v);
        println!("  {:<26} {:>10} {:>10}", name, fmt(m), fmt(p));
    }
}

/// Creates per second with `clients` concurrent `serve` processes, timed
/// from when every process has answered a first request to the last
/// reply (process start, unlock and the closing checkpoint are not
/// counted). `closed_loop`: each client sends a request and waits for its
/// reply before the next, as an agent does with a tool call; otherwise it
/// streams all its requests without waiting (pipelined).
fn throughput(
    dir: &Path,
    keyfile: &Path,
    clients: usize,
    per: usize,
    tag: &str,
    closed_loop: bool,
) -> f64 {
    // Dirty pages written back first (see the server bench's `settle`).
    let _ = Command::new("sync").status();
    let ready = std::sync::Arc::new(std::sync::Barrier::new(clients + 1));
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            let dir = dir.to_path_buf();
            let keyfile = keyfile.to_path_buf();
            let tag = format!("{tag}{}", if closed_loop { "c" } else { "p" });
            let ready = ready.clone();
            std::thread::spawn(move || {
                let mut child = serve_cmd(&dir, &keyfile, &format!("tp-{tag}-{c}"));
                let mut stdin = child.stdin.take().unwrap();
                let mut out = BufReader::new(child.stdout.take().unwrap());
                let mut line = String::new();
                // Warm-up: the process is open and answering.
                let warm = json!({"command": "view", "path": "/memories"});
                stdin.write_all(format!("{warm}\n").as_bytes()).unwrap();
                out.read_line(&mut line).unwrap();
                let lines: Vec<String> = (0..per)
                    .map(|i| {
                        let cmd = json!({"command": "create", "path": format!("/memories/d{:02}/tp_{tag}_{c}_{i}.md", i % 20), "file_text": note(i)});
                        format!("{cmd}\n")
                    })
                    .collect();
                ready.wait();
                let check = |l: &str| assert!(!l.contains("\"is_error\":true"), "{l}");
                if closed_loop {
                    for l in &lines {
                        stdin.write_all(l.as_bytes()).unwrap();
                        line.clear();
                        out.read_line(&mut line).unwrap();
                        check(&line);
                    }
                } else {
                    let writer = std::thread::spawn(move || {
                        for l in &lines {
                            stdin.write_all(l.as_bytes()).unwrap();
                        }
                        stdin
                    });
                    for _ in 0..per {
                        line.clear();
                        out.read_line(&mut line).unwrap();
                        check(&line);
                    }
                    stdin = writer.join().unwrap();
                }
                let end = Instant::now();
                drop(stdin);
                child.wait().unwrap();
                end
            })
        })
        .collect();
    ready.wait();
    let t = Instant::now();
    let end = handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .max()
        .unwrap();
    (clients * per) as f64 / (end - t).as_secs_f64()
}

/// Fill a new vault at `dir` with `a.notes` notes, then edits up to
/// `a.commits` commits in all (fsync off).
fn fill(a: &Args, dir: &Path, key: KeyFileKey) {
    fsync::set_for_benchmark(false);
    let t = Instant::now();
    let mut vault =
        Vault::init(dir, InitSecret::KeyFile(key), VaultConfig::default(), who()).unwrap();
    let memory = memvault::memory_for_vault(&vault).unwrap();
    let path = |i: usize| format!("/memories/d{:02}/note{i:05}.md", i % 20);
    for i in 0..a.notes {
        run(
            &memory,
            &mut vault,
            &json!({"command": "create", "path": path(i), "file_text": note(i)}),
        );
        if i % 5000 == 4999 {
            eprintln!("  {} notes, {:.0} s", i + 1, t.elapsed().as_secs_f64());
        }
    }
    for c in a.notes..a.commits {
        let i = c % a.notes;
        let round = c / a.notes;
        let old = if round == 1 {
            format!("end {i:05}")
        } else {
            format!("end {i:05} r{}", round - 1)
        };
        run(
            &memory,
            &mut vault,
            &json!({"command": "str_replace", "path": path(i), "old_str": old, "new_str": format!("end {i:05} r{round}")}),
        );
        if c % 10000 == 9999 {
            eprintln!("  {} commits, {:.0} s", c + 1, t.elapsed().as_secs_f64());
        }
    }
    drop(vault);
    println!(
        "filled {} notes, {} commits in {:.1} s (fsync off)",
        a.notes,
        a.commits.max(a.notes),
        t.elapsed().as_secs_f64()
    );
}

/// Open times (no key derivation), median and p99.
fn open_times(dir: &Path, key: &KeyFileKey, label: &str) {
    let mut opens = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let v = Vault::open(dir, &Unlock::KeyFile(key), who()).unwrap();
        opens.push(t.elapsed());
        drop(v);
    }
    let (m, p) = stats(opens);
    println!("{label}: median {}, p99 {}", fmt(m), fmt(p));
}

/// A one-shot `memvault exec` view of one note in a new process (open,
/// unlock with the key file, the view, exit), median and p99 of 10: what
/// every CLI command and every `serve` start pays on this vault.
fn process_open_times(dir: &Path, keyfile: &Path, label: &str) {
    let view = json!({"command": "view", "path": "/memories/d03/note00003.md"}).to_string();
    let mut times = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_memvault"))
            .arg("--vault")
            .arg(dir)
            .arg("--key-file")
            .arg(keyfile)
            .args(["exec", &view])
            .stderr(Stdio::null())
            .output()
            .unwrap();
        times.push(t.elapsed());
        assert!(
            out.status.success()
                && !String::from_utf8_lossy(&out.stdout).contains("is_error\":true"),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let (m, p) = stats(times);
    println!("{label}: median {}, p99 {}", fmt(m), fmt(p));
}

/// gc, then the repository's object bytes against the distinct blob bytes
/// reachable from main.
fn gc_ratio(dir: &Path, key: &KeyFileKey) {
    let mut v = Vault::open(dir, &Unlock::KeyFile(key), who()).unwrap();
    let t = Instant::now();
    let r = v.gc().unwrap();
    let gc_time = t.elapsed();
    let blobs = v.reachable_blob_bytes().unwrap();
    let commits = v.history().unwrap().len();
    println!(
        "gc: {} objects, {} commits, {:.1} s; objects/ {} bytes for {} bytes of distinct blobs ({:.2}x)",
        r.objects,
        commits,
        gc_time.as_secs_f64(),
        r.bytes_after,
        blobs,
        r.bytes_after as f64 / blobs as f64
    );
}

/// The scale run: a cached vault of `a.notes` notes and `a.commits`
/// commits.
fn scale(a: &Args) {
    if a.scale_pair {
        scale_pair(a);
        return;
    }
    let (dir, keyfile) = cached_vault(a);
    let key = KeyFileKey::from_bytes(&std::fs::read(&keyfile).unwrap()).unwrap();
    fsync::set_for_benchmark(true);
    open_times(&dir, &key, "open with a key file (no key derivation)");
    process_open_times(&dir, &keyfile, "a one-shot `exec` view in a new process");
    bench_ops("fsync on (default)", a, &key, &dir);
    gc_ratio(&dir, &key);
    open_times(&dir, &key, "open after gc (no key derivation)");
    process_open_times(&dir, &keyfile, "a one-shot `exec` view after gc");
}

/// `--scale-pair`: the commands on the scale vault and on the cached
/// 2,000-note vault of 2,000 commits, side by side in one run: rounds
/// alternating between the two (each opens its vault anew), the ratio
/// of their medians per round, and the median of those ratios.
fn scale_pair(a: &Args) {
    let small_args = Args {
        notes: 2000,
        commits: 0,
        ..a.clone()
    };
    let (small, small_keyfile) = cached_vault(&small_args);
    let (big, big_keyfile) = cached_vault(a);
    let small_key = KeyFileKey::from_bytes(&std::fs::read(&small_keyfile).unwrap()).unwrap();
    let big_key = KeyFileKey::from_bytes(&std::fs::read(&big_keyfile).unwrap()).unwrap();
    fsync::set_for_benchmark(true);
    let rounds = 3;
    let mut ratios: Vec<(&'static str, Vec<f64>)> = Vec::new();
    println!(
        "side by side: {} notes / {} commits against 2,000 notes / 2,000 commits, {} samples per command, {rounds} rounds (fsync on)",
        a.notes,
        a.commits.max(a.notes),
        a.samples
    );
    for r in 0..rounds {
        let tag = format!("pair{r}_{}", std::process::id());
        let s = ops_rows(2000, a.samples, &tag, &small_key, &small);
        let b = ops_rows(a.notes, a.samples, &tag, &big_key, &big);
        println!(
            "  round {r}: {:<26} {:>10} {:>10} {:>7}",
            "operation", "small", "large", "ratio"
        );
        for ((name, sv), (_, bv)) in s.into_iter().zip(b) {
            let (sm, _) = stats(sv);
            let (bm, _) = stats(bv);
            let ratio = bm.as_secs_f64() / sm.as_secs_f64();
            println!(
                "           {:<26} {:>10} {:>10} {:>6.2}x",
                name,
                fmt(sm),
                fmt(bm),
                ratio
            );
            match ratios.iter_mut().find(|(n, _)| *n == name) {
                Some((_, v)) => v.push(ratio),
                None => ratios.push((name, vec![ratio])),
            }
        }
    }
    println!("  median of the rounds' ratios (large over small; target 1.5x):");
    for (name, mut v) in ratios {
        v.sort_by(f64::total_cmp);
        let rs: Vec<String> = v.iter().map(|x| format!("{x:.2}")).collect();
        println!(
            "           {:<26} {:>6.2}x  ({})",
            name,
            v[v.len() / 2],
            rs.join(", ")
        );
    }
}

/// The cached scale vault of `a.notes` notes and `a.commits` commits
/// (built once, fsync off): its directory and key file.
fn cached_vault(a: &Args) -> (std::path::PathBuf, std::path::PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-vaults");
    let name = format!("n{}-c{}", a.notes, a.commits.max(a.notes));
    let dir = root.join(&name);
    let keyfile = root.join(format!("{name}.key"));
    if !dir.join("memvault/format").exists() || !keyfile.exists() {
        std::fs::create_dir_all(&root).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        // Build under another name: an interrupted fill is not a cache.
        let building = root.join(format!("{name}.building"));
        let _ = std::fs::remove_dir_all(&building);
        let key = KeyFileKey::generate();
        std::fs::write(&keyfile, key.expose_secret()).unwrap();
        std::fs::set_permissions(
            &keyfile,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        fill(a, &building, key);
        std::fs::rename(&building, &dir).unwrap();
    } else {
        println!("using the cached vault {}", dir.display());
    }
    (dir, keyfile)
}

fn main() {
    let a = args();
    if a.scale {
        scale(&a);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("vault");
    let key = KeyFileKey::generate();
    let key_copy = KeyFileKey::from_bytes(key.expose_secret()).unwrap();
    // Fill the vault quickly (fsync off), then measure with it on and off.
    fsync::set_for_benchmark(false);
    let t = Instant::now();
    {
        let mut vault = Vault::init(
            &dir,
            InitSecret::KeyFile(key),
            VaultConfig::default(),
            who(),
        )
        .unwrap();
        let memory = memvault::memory_for_vault(&vault).unwrap();
        for i in 0..a.notes {
            run(
                &memory,
                &mut vault,
                &json!({"command": "create", "path": format!("/memories/d{:02}/note{i:05}.md", i % 20), "file_text": note(i)}),
            );
        }
    }
    println!(
        "filled {} notes in {:.1} s (fsync off)",
        a.notes,
        t.elapsed().as_secs_f64()
    );

    fsync::set_for_benchmark(true);
    let keyfile = tmp.path().join("vault.key");
    std::fs::write(&keyfile, key_copy.expose_secret()).unwrap();
    if a.serve_only {
        bench_serve(&a, &dir, &keyfile);
        return;
    }
    if !a.throughput_only {
        bench_ops("fsync on (default)", &a, &key_copy, &dir);
        fsync::set_for_benchmark(false);
        bench_ops("fsync off (comparison)", &a, &key_copy, &dir);
        fsync::set_for_benchmark(true);
        if a.library_only {
            return;
        }
        bench_serve(&a, &dir, &keyfile);
    }
    // Every run makes the same number of creates, whatever its number
    // of clients: a checkpoint falls due every few MiB of log and runs
    // in the vault's turn, so a run that made four times the creates of
    // the other would also carry about four times its checkpoints.
    let total = a.samples.max(20) * 4;
    if let Some(n) = a.clients {
        let r = throughput(&dir, &keyfile, n, total / n, "only", true);
        println!("\nthroughput of creates through `serve` (fsync on): {n} clients {r:.0}/s");
        return;
    }
    for closed_loop in [true, false] {
        // Rounds alternate one and four clients (this machine's speed
        // drifts over minutes); the ratio is the median of the rounds'.
        let mut rows = Vec::new();
        for round in 0..3 {
            let one = throughput(
                &dir,
                &keyfile,
                1,
                total,
                &format!("one{round}"),
                closed_loop,
            );
            let four = throughput(
                &dir,
                &keyfile,
                4,
                total / 4,
                &format!("four{round}"),
                closed_loop,
            );
            rows.push((four / one, one, four));
        }
        rows.sort_by(|x, y| x.0.total_cmp(&y.0));
        let (ratio, one, four) = rows[rows.len() / 2];
        println!(
            "\nthroughput of creates through `serve` (fsync on, {}; {total} creates per run, median of {} rounds): 1 client {one:.0}/s, 4 concurrent clients {four:.0}/s ({ratio:.2}x; rounds {})",
            if closed_loop {
                "each client waits for each reply"
            } else {
                "each client streams its requests"
            },
            rows.len(),
            rows.iter()
                .map(|r| format!("{:.2}x", r.0))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if a.throughput_only {
        return;
    }

    // Open without key derivation (key file); repository size after
    // maintenance against the blobs it must hold; then unlock with the
    // default Argon2id parameters.
    println!();
    open_times(&dir, &key_copy, "open with a key file (no key derivation)");
    gc_ratio(&dir, &key_copy);
    open_times(&dir, &key_copy, "open after gc (no key derivation)");

    let pdir = tmp.path().join("pvault");
    let pass = Passphrase::new("correct horse battery staple".into());
    Vault::init(
        &pdir,
        InitSecret::Passphrase(
            Passphrase::new("correct horse battery staple".into()),
            KdfParams::DEFAULT,
        ),
        VaultConfig::default(),
        who(),
    )
    .unwrap();
    let mut unlocks = Vec::new();
    for _ in 0..a.unlock_samples {
        let t = Instant::now();
        let v = Vault::open(&pdir, &Unlock::Passphrase(&pass), who()).unwrap();
        unlocks.push(t.elapsed());
        drop(v);
    }
    let (m, p) = stats(unlocks);
    println!(
        "unlock with a passphrase, Argon2id m={} KiB t={} p={}: median {}, max {}",
        KdfParams::DEFAULT.m_kib,
        KdfParams::DEFAULT.t,
        KdfParams::DEFAULT.p,
        fmt(m),
        fmt(p)
    );
}
