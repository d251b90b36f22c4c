//! `memvault server` under load (issue 19), on loopback, bounded in time.
//!
//! Run: `cargo bench --all-features --bench server`. In one run:
//!
//! 1. the baselines: one `memvault serve` process on a fresh vault driven
//!    by one client (fsync on), doing 1 KiB creates one after the other,
//!    and doing the load's own mix (4 views of a note in 5, a 1 KiB create
//!    in the other): durable mutations a second of each (measured before
//!    and after the loads; the higher is used);
//! 2. `memvault server` on a root of 1,000 tenants (each with one 1 KiB
//!    note), every tenant's vault opened and written once (a view, a
//!    create) before the clock starts (steady state), then 64 concurrent
//!    keep-alive clients, each request for a random
//!    tenant: 80% views of that note, 20% creates of a new 1 KiB note.
//!    Throughput, durable mutations a second (and their ratio to the
//!    baseline), p50 and p99 of all requests and of each kind;
//! 3. the same workload through `/mcp` (JSON-RPC `tools/call`, stateless);
//! 4. memory: a server on a root of 10,000 tenants, each touched once (a
//!    view), then its resident memory (VmRSS, and the peak VmHWM).
//!
//! Flags (after `--`): `--tenants N` (1000), `--clients N` (64),
//! `--seconds S` (10 per workload), `--touch N` (10000; 0 skips part 4),
//! `--max-open N` (the server's: default, the number of tenants for the
//! load and the server's own default for the memory part), `--quick` (200 tenants,
//! 16 clients, 3 s, 1,000 touched), `--probe` (instead: 401s alone, then
//! creates alone and views alone on 1 and on all tenants: what the HTTP
//! path, a create and a view each cost the server).
//!
//! The roots are made once and kept under `target/bench-vaults/` (their
//! tokens beside them, mode 0600); later runs reuse them. The load runs
//! in a fresh copy of its root (`cp -a`), so every run starts from the
//! same vaults; the memory part only views. Everything talks
//! to 127.0.0.1 only and stops by itself.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_memvault");

struct Args {
    tenants: usize,
    clients: usize,
    seconds: u64,
    touch: usize,
    max_open: Option<usize>,
}

fn args() -> Args {
    let mut a = Args {
        tenants: 1000,
        clients: 64,
        seconds: 10,
        touch: 10_000,
        max_open: None,
    };
    let argv: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < argv.len() {
        let next = |i: usize| argv.get(i + 1).and_then(|v| v.parse::<usize>().ok());
        match argv[i].as_str() {
            "--tenants" => a.tenants = next(i).expect("--tenants N"),
            "--clients" => a.clients = next(i).expect("--clients N"),
            "--seconds" => a.seconds = next(i).expect("--seconds S") as u64,
            "--touch" => a.touch = next(i).expect("--touch N"),
            "--max-open" => a.max_open = next(i),
            "--quick" => {
                (a.tenants, a.clients, a.seconds, a.touch) = (200, 16, 3, 1000);
                i += 1;
                continue;
            }
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    a
}

/// A small xorshift generator: the workload is the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn note(seed: u64) -> String {
    let mut s = format!("note {seed}: ");
    while s.len() < 1024 {
        s.push_str("the quick brown fox jumps over the lazy dog. ");
    }
    s.truncate(1024);
    s
}

/// A root of `n` tenants under target/bench-vaults (made once): its
/// directory, key file and tokens (in tenant order).
/// A copy of `root` (the pristine one [`root_of`] made) for one run to
/// write into, made afresh each time: every run starts from the same
/// vaults, not from what the runs before it wrote.
fn fresh_copy(root: &Path) -> PathBuf {
    let run = root.with_file_name("run");
    let _ = std::fs::remove_dir_all(&run);
    let ok = Command::new("cp")
        .arg("-a")
        .arg(root)
        .arg(&run)
        .status()
        .unwrap()
        .success();
    assert!(ok, "cp -a of the bench root failed");
    settle();
    run
}

/// Write back every dirty page (the build's output, a root just copied)
/// before a measured part: left to the kernel's writeback, it lands in
/// the middle of the part and each `fdatasync` waits behind it (one took
/// 290 us median and 800 us at p90 in `target/` right after a build,
/// against 170 and 210 once written back).
fn settle() {
    let _ = Command::new("sync").status();
}

fn root_of(n: usize) -> (PathBuf, PathBuf, Vec<String>) {
    // (v2: the load runs in a copy; roots made before were written by
    // earlier runs.)
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("target/bench-vaults/server-v2-{n}"));
    let (root, key, tokens) = (dir.join("root"), dir.join("server.key"), dir.join("tokens"));
    if !tokens.exists() {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        eprintln!("making a root of {n} tenants in {} (once)", dir.display());
        assert!(
            Command::new(BIN)
                .arg("keygen")
                .arg(&key)
                .status()
                .unwrap()
                .success()
        );
        let names: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
        let out = Command::new(BIN)
            .arg("--key-file")
            .arg(&key)
            .args(["tenant", "add"])
            .args(&names)
            .arg("--root")
            .arg(&root)
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        let list: Vec<String> = text
            .lines()
            .map(|l| l.split_once(' ').map_or(l, |(_, t)| t).to_string())
            .collect();
        assert_eq!(list.len(), n);
        // One 1 KiB note in each tenant, through the server.
        let server = Server::start(&root, &key, &["--rate", "0"]);
        std::thread::scope(|s| {
            for part in list.chunks(n.div_ceil(8)) {
                let port = server.port;
                s.spawn(move || {
                    let mut c = Conn::new(port);
                    for t in part {
                        let body = json!({"command": "create", "path": "/memories/note.md", "file_text": note(1)});
                        let (st, _) = c.post("/v1/memory", t, &body.to_string());
                        assert_eq!(st, 200);
                    }
                });
            }
        });
        server.stop();
        let tmp = tokens.with_extension("tmp");
        std::fs::write(&tmp, list.join("\n")).unwrap();
        std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        std::fs::rename(&tmp, &tokens).unwrap();
    }
    let list = std::fs::read_to_string(&tokens)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    (root, key, list)
}

struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(root: &Path, key: &Path, extra: &[&str]) -> Server {
        let mut child = Command::new(BIN)
            .arg("--key-file")
            .arg(key)
            .arg("server")
            .arg("--root")
            .arg(root)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut reader = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        let mut port = None;
        while reader.read_line(&mut line).unwrap() > 0 {
            if let Some(at) = line.find("://127.0.0.1:") {
                port = line[at + 13..].trim().parse().ok();
                break;
            }
            line.clear();
        }
        std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = reader.read_to_string(&mut rest);
            eprint!("{rest}");
        });
        Server {
            child,
            port: port.expect("the server did not start"),
        }
    }

    fn rss_kib(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    fn stop(mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

/// One keep-alive HTTP/1.1 connection.
struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    fn new(port: u16) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_nodelay(true).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        Conn {
            writer: s.try_clone().unwrap(),
            reader: BufReader::new(s),
        }
    }

    fn post(&mut self, path: &str, token: &str, body: &str) -> (u16, Vec<u8>) {
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.writer.write_all(req.as_bytes()).unwrap();
        let mut status = 0;
        let mut len = 0usize;
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                self.reader.read_line(&mut line).unwrap() > 0,
                "connection closed"
            );
            if status == 0 {
                status = line
                    .split(' ')
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
            } else if line == "\r\n" {
                break;
            } else if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0u8; len];
        self.reader.read_exact(&mut body).unwrap();
        (status, body)
    }
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1000.0
}

/// One client's request for tenant `t`: a view or a create.
fn request(mcp: bool, view: bool, client: usize, i: u64) -> (String, &'static str) {
    let args = if view {
        json!({"command": "view", "path": "/memories/note.md"})
    } else {
        json!({"command": "create", "path": format!("/memories/c{client}/n{i}.md"), "file_text": note(i)})
    };
    if mcp {
        let rpc = json!({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": "memory", "arguments": args}});
        (rpc.to_string(), "/mcp")
    } else {
        (args.to_string(), "/v1/memory")
    }
}

fn is_error(mcp: bool, body: &[u8]) -> bool {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    if mcp {
        v["result"]["isError"] != false
    } else {
        v["is_error"] != false
    }
}

/// Run the mixed workload; print and return (mutations/s, p99 ms).
fn workload(
    label: &str,
    port: u16,
    tokens: &[String],
    clients: usize,
    seconds: u64,
    mcp: bool,
    epoch: u64,
) -> (f64, f64) {
    let views_only = label.contains("views only");
    let creates_only = label.contains("creates only");
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let results: Vec<(Vec<Duration>, Vec<Duration>, usize)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                let stop = stop.clone();
                s.spawn(move || {
                    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((c as u64 + 1) * 7919) ^ epoch);
                    let mut conn = Conn::new(port);
                    let (mut views, mut writes, mut errors) = (vec![], vec![], 0);
                    let mut i = epoch * 1_000_000;
                    while !stop.load(Ordering::Relaxed) {
                        let t = &tokens[(rng.next() % tokens.len() as u64) as usize];
                        let view = views_only || (!creates_only && !rng.next().is_multiple_of(5));
                        let (body, path) = request(mcp, view, c, i);
                        i += 1;
                        let at = Instant::now();
                        let (st, resp) = conn.post(path, t, &body);
                        let took = at.elapsed();
                        if t == "probe" {
                            views.push(took);
                            continue;
                        }
                        if st != 200 || is_error(mcp, &resp) {
                            errors += 1;
                            if errors < 3 {
                                eprintln!("{label}: {st} {}", String::from_utf8_lossy(&resp));
                            }
                            continue;
                        }
                        if view {
                            views.push(took)
                        } else {
                            writes.push(took)
                        }
                    }
                    (views, writes, errors)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs(seconds));
        stop.store(true, Ordering::Relaxed);
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let elapsed = start.elapsed().as_secs_f64();
    let mut views: Vec<Duration> = results.iter().flat_map(|r| r.0.iter().copied()).collect();
    let mut writes: Vec<Duration> = results.iter().flat_map(|r| r.1.iter().copied()).collect();
    let errors: usize = results.iter().map(|r| r.2).sum();
    let mut all: Vec<Duration> = views.iter().chain(&writes).copied().collect();
    views.sort();
    writes.sort();
    all.sort();
    let mps = writes.len() as f64 / elapsed;
    println!(
        "{label}: {:.0} requests/s ({:.0} views/s, {mps:.0} durable mutations/s), all p50 {:.2} ms p99 {:.2} ms; views p50 {:.2} p99 {:.2}; creates p50 {:.2} p99 {:.2}{}",
        all.len() as f64 / elapsed,
        views.len() as f64 / elapsed,
        pct(&all, 0.5),
        pct(&all, 0.99),
        pct(&views, 0.5),
        pct(&views, 0.99),
        pct(&writes, 0.5),
        pct(&writes, 0.99),
        if errors > 0 {
            format!(" ({errors} errors)")
        } else {
            String::new()
        }
    );
    (mps, pct(&all, 0.99))
}

/// One `serve` process, one client, for `seconds`: 1 KiB creates only,
/// or (`mixed`) the server load's own mix, 4 views of a note in 5 and a
/// 1 KiB create in the other. Its durable mutations per second.
fn baseline(seconds: u64, mixed: bool) -> f64 {
    settle();
    let tmp = tempfile::tempdir_in(concat!(env!("CARGO_MANIFEST_DIR"), "/target")).unwrap();
    let (vault, key) = (tmp.path().join("v"), tmp.path().join("k"));
    assert!(
        Command::new(BIN)
            .arg("keygen")
            .arg(&key)
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    );
    let base = |c: &mut Command| {
        c.arg("--vault").arg(&vault).arg("--key-file").arg(&key);
    };
    let mut init = Command::new(BIN);
    base(&mut init);
    assert!(
        init.arg("init")
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    );
    let mut serve = Command::new(BIN);
    base(&mut serve);
    let mut child = serve
        .args(["serve", "--session", "bench"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let mut output = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let mut ask = |req: Value| {
        // One write per request (`writeln!` on the unbuffered pipe writes
        // the line and its newline apart, waking the server twice).
        input.write_all(format!("{req}\n").as_bytes()).unwrap();
        line.clear();
        output.read_line(&mut line).unwrap();
        assert!(line.contains("\"is_error\":false"), "{line}");
    };
    if mixed {
        ask(json!({"command": "create", "path": "/memories/note.md", "file_text": note(0)}));
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_secs(seconds) {
        if mixed && !rng.next().is_multiple_of(5) {
            ask(json!({"command": "view", "path": "/memories/note.md"}));
            continue;
        }
        ask(
            json!({"command": "create", "path": format!("/memories/n{n}.md"), "file_text": note(n)}),
        );
        n += 1;
    }
    let mps = n as f64 / start.elapsed().as_secs_f64();
    drop(input);
    let _ = child.wait();
    println!(
        "baseline: one `serve` process, one client: {mps:.0} durable mutations/s ({})",
        if mixed {
            "the load's mix: 80% views, 20% 1 KiB creates"
        } else {
            "1 KiB creates only"
        }
    );
    mps
}

fn main() {
    let a = args();
    // The load: every tenant's vault may stay open (--max-open, unless
    // given, is the number of tenants); the memory part: the server's
    // default, the least recently used vaults closed past it.
    let load_open = a.max_open.unwrap_or(a.tenants.max(1)).to_string();
    let extra = ["--rate", "0", "--max-open", load_open.as_str()];
    let mem_open = a.max_open.map(|m| m.to_string());
    let mut mem_extra = vec!["--rate", "0"];
    if let Some(m) = &mem_open {
        mem_extra.extend(["--max-open", m.as_str()]);
    }
    let (pristine, key, tokens) = root_of(a.tenants);
    let root = fresh_copy(&pristine);
    let epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        % 1_000_000;

    if std::env::args().any(|x| x == "--probe") {
        // The HTTP path alone (a bad token, answered 401 before any
        // vault), then creates alone and views alone: what each costs.
        let server = Server::start(&root, &key, &extra);
        let probe = vec!["probe".to_string()];
        workload(
            "probe: 401s only",
            server.port,
            &probe,
            a.clients,
            a.seconds,
            false,
            epoch,
        );
        for kind in ["creates", "views"] {
            for n in [1, tokens.len()] {
                // Each run its own file names.
                workload(
                    &format!("probe: {kind} only, {n} tenants"),
                    server.port,
                    &tokens[..n],
                    a.clients,
                    a.seconds,
                    false,
                    epoch + n as u64,
                );
            }
        }
        server.stop();
        return;
    }
    let base = baseline(a.seconds.div_ceil(2).max(2), false);
    let base_mixed = baseline(a.seconds.div_ceil(2).max(2), true);
    let server = Server::start(&root, &key, &extra);
    // Steady state: every tenant's vault is opened (unlocked, its log
    // read) and written once (its files counted, as the first create
    // after an open does) before the clock starts, as in a server that
    // has run a while.
    let start = Instant::now();
    touch_each(server.port, &tokens);
    write_each(server.port, &tokens, epoch + 2);
    println!(
        "warm-up: {} tenants' vaults opened and written once (a view, a create) in {:.1} s",
        tokens.len(),
        start.elapsed().as_secs_f64()
    );
    let label = format!(
        "{} tenants, {} clients, 80% views / 20% creates, /v1/memory",
        a.tenants, a.clients
    );
    let (mps, p99) = workload(
        &label,
        server.port,
        &tokens,
        a.clients,
        a.seconds,
        false,
        epoch,
    );
    let (rss, hwm) = server.rss_kib();
    let loaded = (mps, p99, rss, hwm);
    let label = format!(
        "{} tenants, {} clients, 80% views / 20% creates, /mcp",
        a.tenants, a.clients
    );
    let (mps, p99) = workload(
        &label,
        server.port,
        &tokens,
        a.clients,
        a.seconds,
        true,
        epoch + 1,
    );
    server.stop();
    // The baseline again after the loads (this machine's speed drifts
    // over minutes): the ratios are to the higher of the two.
    let base = base.max(baseline(a.seconds.div_ceil(2).max(2), false));
    let base_mixed = base_mixed.max(baseline(a.seconds.div_ceil(2).max(2), true));
    let (v1_mps, v1_p99, rss, hwm) = loaded;
    println!(
        "/v1/memory: durable mutations/s {:.2}x one serve process doing creates only (the higher baseline, {base:.0}/s; target >= 2x), {:.2}x one serve process on the same 80/20 mix (the higher, {base_mixed:.0}/s); p99 {v1_p99:.2} ms (target <= 20 ms); server RSS {} MiB (peak {} MiB)",
        v1_mps / base,
        v1_mps / base_mixed,
        rss / 1024,
        hwm / 1024
    );
    println!(
        "/mcp: durable mutations/s {:.2}x one serve process doing creates only, {:.2}x on the same mix; p99 {p99:.2} ms",
        mps / base,
        mps / base_mixed
    );

    if a.touch > 0 {
        let (root, key, tokens) = root_of(a.touch);
        let server = Server::start(&root, &key, &mem_extra);
        let start = Instant::now();
        touch_each(server.port, &tokens);
        let (rss, hwm) = server.rss_kib();
        println!(
            "memory: {} tenants each touched once (one view) in {:.1} s: server RSS {} MiB, peak {} MiB (target <= 300 MB)",
            a.touch,
            start.elapsed().as_secs_f64(),
            rss / 1024,
            hwm / 1024
        );
        server.stop();
    }
}

/// One view in each tenant's vault, from 16 connections at once.
fn touch_each(port: u16, tokens: &[String]) {
    std::thread::scope(|s| {
        for part in tokens.chunks(tokens.len().div_ceil(16)) {
            s.spawn(move || {
                let mut c = Conn::new(port);
                for t in part {
                    let (st, body) = c.post(
                        "/v1/memory",
                        t,
                        r#"{"command":"view","path":"/memories/note.md"}"#,
                    );
                    assert!(st == 200 && !is_error(false, &body), "{st}");
                }
            });
        }
    });
}

/// One create in each tenant's vault, from 16 connections at once.
fn write_each(port: u16, tokens: &[String], epoch: u64) {
    std::thread::scope(|s| {
        for (n, part) in tokens.chunks(tokens.len().div_ceil(16)).enumerate() {
            s.spawn(move || {
                let mut c = Conn::new(port);
                for (i, t) in part.iter().enumerate() {
                    let body = json!({"command": "create", "path": format!("/memories/w{epoch}/{n}-{i}.md"), "file_text": note(i as u64)});
                    let (st, body) = c.post("/v1/memory", t, &body.to_string());
                    assert!(st == 200 && !is_error(false, &body), "{st}");
                }
            });
        }
    });
}
