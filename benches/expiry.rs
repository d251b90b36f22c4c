//! memvault's expiry benchmark: a vault of 10,000 files of which 5,000
//! were viewed recently; `expire --dry-run` and the real sweep (5,000
//! files removed, their keys destroyed, the old key states pruned) through
//! the real binary; and the cost a view pays for access tracking (median
//! of a file view with tracking, minus the same view with tracking
//! switched off).
//!
//! Run: `cargo bench --all-features --bench expiry` (`-- --quick` for 1,000 files).

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use memvault::crypto::{KeyFileKey, Unlock};
use memvault::memory::{MemoryPath, Outcome, Snapshot, Store, StoreError, ToolResult};
use memvault::vault::ImportFile;
use memvault::vault::{Attribution, InitSecret, Vault, VaultConfig};
use serde_json::json;
use zeroize::Zeroizing;

const DAY: u64 = 86_400_000;

fn who() -> Attribution {
    Attribution {
        session: "bench".into(),
        actor: "bench".into(),
    }
}

/// The vault with access tracking switched off (a view records nothing).
struct Untracked<'a>(&'a mut Vault);

impl Store for Untracked<'_> {
    fn read(
        &mut self,
        f: &mut dyn FnMut(&dyn Snapshot) -> Result<ToolResult, StoreError>,
    ) -> Result<ToolResult, StoreError> {
        self.0.read(f)
    }
    fn write(
        &mut self,
        f: &mut dyn FnMut(&dyn Snapshot) -> Result<Outcome, StoreError>,
    ) -> Result<ToolResult, StoreError> {
        self.0.write(f)
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let files = if quick { 1_000 } else { 10_000 };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("vault");
    let key_path = tmp.path().join("vault.key");
    let key = KeyFileKey::generate();
    std::fs::write(&key_path, key.expose_secret()).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let copy = KeyFileKey::from_bytes(key.expose_secret()).unwrap();
    drop(
        Vault::init(
            &dir,
            InitSecret::KeyFile(copy),
            VaultConfig::default(),
            who(),
        )
        .unwrap(),
    );
    let mut vault = Vault::open(&dir, &Unlock::KeyFile(&key), who()).unwrap();
    let t = Instant::now();
    let batch: Vec<ImportFile> = (0..files)
        .map(|i| ImportFile {
            path: MemoryPath::parse(&format!("/memories/d{:02}/n{i:05}.md", i % 50)).unwrap(),
            content: Zeroizing::new(format!("# note {i}\n{}\n", "x".repeat(200)).into_bytes()),
            redactions: Vec::new(),
        })
        .collect();
    vault.import_files(batch).unwrap();
    if std::env::args().any(|a| a == "--checkpoint") {
        vault.checkpoint().unwrap();
    }
    println!(
        "memvault expiry benchmark: {files} files (imported in {:.2} s)",
        t.elapsed().as_secs_f64()
    );

    // The view cost of access tracking, through the library.
    let memory = memvault::memory_for_vault(&vault).unwrap();
    let samples = if quick { 300 } else { 2_000 };
    let mut tracked = Vec::new();
    let mut untracked = Vec::new();
    for i in 0..samples {
        let cmd = json!({"command": "view", "path": format!("/memories/d{:02}/n{:05}.md", i % 50, i % files)});
        // Warm the caches for this file first, then time both kinds in
        // alternating order, so neither pays for the other's cold reads.
        assert!(
            !memory
                .execute_json(&mut Untracked(&mut vault), &cmd)
                .is_error
        );
        for with_tracking in [i % 2 == 0, i % 2 == 1] {
            let t = Instant::now();
            let r = if with_tracking {
                memory.execute_json(&mut vault, &cmd)
            } else {
                memory.execute_json(&mut Untracked(&mut vault), &cmd)
            };
            let e = t.elapsed();
            assert!(!r.is_error);
            if with_tracking {
                tracked.push(e)
            } else {
                untracked.push(e)
            }
        }
    }
    let (mt, mu) = (median(tracked), median(untracked));
    println!(
        "view median: {:.1} µs with access tracking, {:.1} µs without: tracking adds {:.1} µs (target ≤ 50 µs)",
        mt.as_secs_f64() * 1e6,
        mu.as_secs_f64() * 1e6,
        (mt.as_secs_f64() - mu.as_secs_f64()) * 1e6
    );
    drop(vault);

    // Half the files are viewed 40 days later; the sweep runs then.
    let later = memvault::vault::now_ms() + 40 * DAY;
    let bin = env!("CARGO_BIN_EXE_memvault");
    let cmd = |args: &[&str]| {
        let mut c = Command::new(bin);
        c.arg("--vault")
            .arg(&dir)
            .arg("--key-file")
            .arg(&key_path)
            .args(args)
            .env("MEMVAULT_TEST_NOW_MS", later.to_string());
        c
    };
    let mut serve = cmd(&["serve", "--session", "viewer"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    {
        let mut stdin = serve.stdin.take().unwrap();
        for i in (0..files).step_by(2) {
            let line =
                json!({"command": "view", "path": format!("/memories/d{:02}/n{i:05}.md", i % 50)});
            writeln!(stdin, "{line}").unwrap();
        }
    }
    assert!(serve.wait().unwrap().success());
    let t = Instant::now();
    let out = cmd(&["expire", "--older-than", "30d", "--dry-run", "--json"])
        .output()
        .unwrap();
    let dry = t.elapsed();
    assert!(out.status.success());
    let listed = out.stdout.iter().filter(|&&b| b == b'\n').count() - 1;
    println!(
        "expire --dry-run: {:.2} s, {listed} files listed (target ≤ 2 s)",
        dry.as_secs_f64()
    );
    let t = Instant::now();
    let out = cmd(&["expire", "--older-than", "30d"]).output().unwrap();
    let real = t.elapsed();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!(
        "expire (real sweep, keys destroyed, key states pruned): {:.2} s: {} (target ≤ 2 s)",
        real.as_secs_f64(),
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or("")
    );
}
