//! Opening a vault whose write-ahead log (`memvault/wal`) holds hostile or
//! damaged bytes: opening never panics or hangs, and a vault that opens
//! shows exactly one of the states its genuine writer acknowledged: the
//! log can lose a tail (a torn record), never invent or mix states.
//!
//! The template is a real vault (built once per process, key file, default
//! settings) copied while its writer was still open, as a crash leaves it:
//! the ref files and packs hold state 0, the log a head and three records
//! (state 1: create `c.md`; 2: edit `a.md`; 3: delete `b.md`).
//!
//! Input: the first byte picks a mode.
//! - even: the rest is the whole log, as raw bytes;
//! - odd: the genuine log, then mutations from the rest of the input, in
//!   groups of 4 bytes (op, position high, position low, value): flip a
//!   bit, set a byte, truncate, insert a byte, remove a byte.
//!
//! Each input runs on a fresh copy of the template.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use memvault::crypto::{KeyFileKey, Unlock};
use memvault::vault::{Attribution, InitSecret, Vault, VaultConfig};
use serde_json::json;

const KEY: [u8; 32] = [0x5a; 32];
const PATHS: [&str; 3] = ["/memories/a.md", "/memories/b.md", "/memories/c.md"];

struct Template {
    _root: tempfile::TempDir,
    dir: PathBuf,
    wal: Vec<u8>,
    /// The content of each path (None: absent) in states 0 to 3.
    states: Vec<BTreeMap<&'static str, Option<String>>>,
}

fn who() -> Attribution {
    Attribution {
        session: "fuzz".into(),
        actor: "fuzz".into(),
    }
}

fn key() -> KeyFileKey {
    KeyFileKey::from_bytes(&KEY).expect("32 bytes make a key file")
}

fn run(vault: &mut Vault, cmd: serde_json::Value) {
    let r = super::protocol_line::memory().execute_json(vault, &cmd);
    assert!(!r.is_error, "template step failed: {cmd}");
}

/// The content of every path of [`PATHS`] as the vault shows it.
fn contents(vault: &mut Vault) -> BTreeMap<&'static str, Option<String>> {
    let memory = super::protocol_line::memory();
    PATHS
        .iter()
        .map(|p| {
            let r = memory.execute_json(vault, &json!({"command": "view", "path": p}));
            (
                *p,
                (!r.is_error).then(|| r.text().unwrap_or_default().to_string()),
            )
        })
        .collect()
}

fn template() -> &'static Template {
    static T: OnceLock<Template> = OnceLock::new();
    T.get_or_init(|| {
        let root = super::scratch_dir();
        let live = root.path().join("live");
        let mut vault = Vault::init(&live, InitSecret::KeyFile(key()), VaultConfig::default(), who())
            .expect("template vault");
        run(&mut vault, json!({"command": "create", "path": PATHS[0], "file_text": "alpha\n"}));
        run(&mut vault, json!({"command": "create", "path": PATHS[1], "file_text": "beta\n"}));
        // State 0 in git itself.
        vault.checkpoint().expect("checkpoint");
        let mut states = vec![contents(&mut vault)];
        run(&mut vault, json!({"command": "create", "path": PATHS[2], "file_text": "gamma\n"}));
        states.push(contents(&mut vault));
        run(&mut vault, json!({"command": "str_replace", "path": PATHS[0], "old_str": "alpha", "new_str": "ALPHA"}));
        states.push(contents(&mut vault));
        run(&mut vault, json!({"command": "delete", "path": PATHS[1]}));
        states.push(contents(&mut vault));
        // The crash image: copied while the writer is open.
        let dir = root.path().join("image");
        // The log is copied last, below (each input writes its own).
        super::copy_dir(&live, &dir, &["wal"]);
        std::fs::copy(live.join("memvault/wal"), dir.join("memvault/wal")).expect("copy the log");
        drop(vault);
        let mut wal = std::fs::read(dir.join("memvault/wal")).expect("the log");
        // The file is preallocated with zeros after its records: keep the
        // records (each input copies and mutates this).
        // The zeros ahead of the records, cut; 32 are kept, since a record
        // may itself end in zero bytes (its checksum's last byte is zero
        // once in 256 templates: the genuine log then lost its last record).
        let end = wal.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        wal.truncate((end + 32).min(wal.len()));
        assert!(wal.len() > 100, "the template log holds records");
        Template {
            _root: root,
            dir,
            wal,
            states,
        }
    })
}

fn mutate(mut log: Vec<u8>, ops: &[u8]) -> Vec<u8> {
    for op in ops.chunks_exact(4) {
        let at = (usize::from(op[1]) << 8 | usize::from(op[2])) % (log.len() + 1);
        match op[0] % 5 {
            0 if at < log.len() => log[at] ^= 1 << (op[3] % 8),
            1 if at < log.len() => log[at] = op[3],
            2 => log.truncate(at),
            3 => log.insert(at, op[3]),
            4 if at < log.len() => {
                log.remove(at);
            }
            _ => {}
        }
    }
    log
}

pub fn check(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let t = template();
    let log = if mode % 2 == 0 {
        rest.to_vec()
    } else {
        mutate(t.wal.clone(), rest)
    };
    let work = super::scratch_dir();
    let dir = work.path().join("vault");
    super::copy_dir(&t.dir, &dir, &["wal"]);
    std::fs::write(dir.join("memvault/wal"), &log).expect("write the log");

    let key = key();
    let Ok(mut vault) = Vault::open(&dir, &Unlock::KeyFile(&key), who()) else {
        // Refusing is allowed; panicking or hanging is not.
        return;
    };
    let seen = contents(&mut vault);
    assert!(
        t.states.contains(&seen),
        "the vault shows a state its writer never acknowledged: {seen:?}"
    );
    if log == t.wal {
        assert_eq!(
            &seen,
            t.states.last().expect("states"),
            "the genuine log lost a record"
        );
    }
}
