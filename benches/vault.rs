//! memvault's vault benchmark: median and p99 per memory command on a vault
//! of 2,000 notes of 1 KiB in 20 directories, with fsync on (the default)
//! and off, plus unlock with the default Argon2 parameters.
//!
//! Run: `cargo bench --bench vault` (add `-- --quick` for a short run,
//! `--notes N`, `--samples N`).

use std::time::{Duration, Instant};

use memvault::crypto::{KdfParams, KeyFileKey, Passphrase, Unlock};
use memvault::memory::Memory;
use memvault::vault::{Attribution, InitSecret, Vault, VaultConfig, fsync};
use serde_json::{Value, json};

struct Args {
    notes: usize,
    samples: usize,
    unlock_samples: usize,
}

fn args() -> Args {
    let mut a = Args {
        notes: 2000,
        samples: 300,
        unlock_samples: 5,
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
    let mut vault = Vault::open(dir, &Unlock::KeyFile(key), who()).unwrap();
    let memory = memvault::memory_for_vault(&vault).unwrap();
    let n = a.samples;
    let tag = label.replace(' ', "_");
    let mut rows: Vec<(&str, Vec<Duration>)> = Vec::new();
    let mut create = Vec::new();
    for i in 0..n {
        create.push(run(&memory, &mut vault, &json!({"command": "create", "path": format!("/memories/bench_{tag}/n{i}.md"), "file_text": note(i)})));
    }
    rows.push(("create", create));
    let mut view = Vec::new();
    for i in 0..n {
        let j = (i * 7) % a.notes;
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
    println!(
        "\n{label}: {} notes of 1 KiB in 20 directories, {n} samples per operation",
        a.notes
    );
    println!("  {:<26} {:>10} {:>10}", "operation", "median", "p99");
    for (name, v) in rows {
        let (m, p) = stats(v);
        println!("  {:<26} {:>10} {:>10}", name, fmt(m), fmt(p));
    }
}

fn main() {
    let a = args();
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
    bench_ops("fsync on (default)", &a, &key_copy, &dir);
    fsync::set_for_benchmark(false);
    bench_ops("fsync off (comparison)", &a, &key_copy, &dir);
    fsync::set_for_benchmark(true);

    // Open without key derivation (key file), and unlock with the default
    // Argon2id parameters.
    let mut opens = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let v = Vault::open(&dir, &Unlock::KeyFile(&key_copy), who()).unwrap();
        opens.push(t.elapsed());
        drop(v);
    }
    let (m, p) = stats(opens);
    println!(
        "\nopen with a key file (no key derivation): median {}, p99 {}",
        fmt(m),
        fmt(p)
    );

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
