//! memvault's audit benchmark: the real binary on a vault with a long
//! history (100,000 commits by default, in sessions of 100): the first
//! page of `history`, `history PATH` for one file, `sessions`, `resume`,
//! and `verify` throughput.
//!
//! Run: `cargo bench --all-features --bench audit` (`-- --quick` for 5,000 commits,
//! `--commits N`). The vault is built once (fsync off, through the
//! library) and kept under target/bench-audit-N for later runs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use memvault::crypto::{KeyFileKey, Unlock};
use memvault::vault::{Attribution, InitSecret, Vault, VaultConfig, fsync};
use serde_json::json;

const FILES: usize = 200;

fn who(session: usize) -> Attribution {
    Attribution {
        session: format!("bench-{session:05}"),
        actor: "bench".into(),
    }
}

fn build(dir: &Path, key_path: &Path, commits: usize) {
    let key = KeyFileKey::generate();
    std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
    std::fs::write(key_path, key.expose_secret()).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(key_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let copy = KeyFileKey::from_bytes(key.expose_secret()).unwrap();
    fsync::set_for_benchmark(false);
    drop(
        Vault::init(
            dir,
            InitSecret::KeyFile(copy),
            VaultConfig::default(),
            who(0),
        )
        .unwrap(),
    );
    let mut vault = Vault::open(dir, &Unlock::KeyFile(&key), who(0)).unwrap();
    let memory = memvault::memory_for_vault(&vault).unwrap();
    let start = Instant::now();
    for i in 0..commits {
        if i % 100 == 0 {
            vault.set_attribution(who(i / 100));
        }
        let f = i % FILES;
        let path = format!("/memories/d{}/f{f:03}.md", f % 10);
        let cmd = if i < FILES {
            json!({"command": "create", "path": path, "file_text": format!("note {f}\nline 0\n")})
        } else {
            json!({"command": "insert", "path": path, "insert_line": 1, "insert_text": format!("line {i}")})
        };
        let r = memory.execute_json(&mut vault, &cmd);
        assert!(!r.is_error, "{:?}", r.text());
        if i % 10_000 == 9_999 {
            eprintln!(
                "  built {} commits in {:.0} s",
                i + 1,
                start.elapsed().as_secs_f64()
            );
        }
    }
    fsync::set_for_benchmark(true);
}

fn time(bin: &str, vault: &Path, key: &Path, args: &[&str], runs: usize) -> (Duration, usize) {
    let mut times = Vec::new();
    let mut lines = 0;
    for _ in 0..runs {
        let t = Instant::now();
        let out = Command::new(bin)
            .arg("--vault")
            .arg(vault)
            .arg("--key-file")
            .arg(key)
            .args(args)
            .output()
            .unwrap();
        times.push(t.elapsed());
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        lines = out.stdout.iter().filter(|&&b| b == b'\n').count();
    }
    times.sort();
    (times[times.len() / 2], lines)
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    let mut commits = 100_000;
    let mut i = 1;
    while i < argv.len() {
        match argv[i].as_str() {
            "--quick" => commits = 5_000,
            "--commits" => {
                commits = argv[i + 1].parse().expect("--commits N");
                i += 1;
            }
            _ => {}
        }
        i += 1;
    }
    let base = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join(format!("bench-audit-{commits}"));
    let vault = base.join("vault");
    let key = base.join("vault.key");
    if !vault.join("memvault/format").exists() {
        let _ = std::fs::remove_dir_all(&base);
        eprintln!(
            "building a vault with {commits} commits in {}",
            base.display()
        );
        build(&vault, &key, commits);
    }
    let bin = env!("CARGO_BIN_EXE_memvault");
    println!(
        "memvault audit benchmark: {commits} commits (+ init), {FILES} files, sessions of 100"
    );
    println!("(each figure: median of the real binary's wall time, including unlock by key file)");
    let (t, n) = time(bin, &vault, &key, &["history", "--limit", "50"], 5);
    println!(
        "history --limit 50          {:>9.1} ms  ({n} lines)",
        t.as_secs_f64() * 1e3
    );
    let (t, n) = time(bin, &vault, &key, &["history", "/memories/d3/f123.md"], 3);
    println!(
        "history PATH (one file)     {:>9.1} ms  ({n} lines)",
        t.as_secs_f64() * 1e3
    );
    let (t, n) = time(bin, &vault, &key, &["sessions"], 3);
    println!(
        "sessions                    {:>9.1} ms  ({n} sessions)",
        t.as_secs_f64() * 1e3
    );
    let (t, _) = time(bin, &vault, &key, &["resume"], 3);
    println!(
        "resume                      {:>9.1} ms",
        t.as_secs_f64() * 1e3
    );
    let (t, _) = time(bin, &vault, &key, &["verify"], 1);
    println!(
        "verify                      {:>9.1} s   ({:.0} commits/s)",
        t.as_secs_f64(),
        (commits + 1) as f64 / t.as_secs_f64()
    );
}
