//! A hostile or damaged pack beside a vault's own: opening the vault, the
//! checkpoint that merges small packs, and `verify` never panic or hang,
//! and every file shows its genuine content or an error, never other
//! content (a pack can make the vault refuse; it cannot make it lie).
//!
//! The template is a real vault (built once per process, key file,
//! default settings) with eight packs, one per checkpoint of ten
//! creates; the input adds
//! a ninth, so the next checkpoint merges the small ones, the input's
//! included.
//!
//! Input: the first byte picks a mode.
//! - even: two bytes (big endian) give the index's length `n`; the next
//!   `n` bytes are the index, the rest the pack;
//! - odd: a copy of the template's smallest pack and its index, mutated by
//!   the rest of the input in groups of 4 bytes (op, position high,
//!   position low, value): the op's low bit picks the index or the pack,
//!   the rest flips a bit, sets a byte, truncates, inserts or removes a
//!   byte.
//!
//! Each input runs on a fresh copy of the template.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use memvault::crypto::{KeyFileKey, Unlock};
use memvault::vault::{Attribution, InitSecret, Vault, VaultConfig};
use serde_json::json;

const KEY: [u8; 32] = [0x6b; 32];
const PACKS: usize = 8;
const EXTRA: &str = "pack-00000000000000000000000000000000000000ff";

struct Template {
    _root: tempfile::TempDir,
    dir: PathBuf,
    idx: Vec<u8>,
    pack: Vec<u8>,
    /// Every file and its content.
    files: BTreeMap<String, String>,
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

fn view(vault: &mut Vault, path: &str) -> Option<String> {
    let memory = super::protocol_line::memory();
    let r = memory.execute_json(vault, &json!({"command": "view", "path": path}));
    (!r.is_error).then(|| r.text().unwrap_or_default().to_string())
}

/// The packs in `dir`'s repository, smallest first, by file stem.
fn packs(dir: &Path) -> Vec<String> {
    let mut out: Vec<(u64, String)> = std::fs::read_dir(dir.join("objects/pack"))
        .expect("pack dir")
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let stem = name.strip_suffix(".pack")?.to_string();
            Some((e.metadata().ok()?.len(), stem))
        })
        .collect();
    out.sort();
    out.into_iter().map(|(_, s)| s).collect()
}

fn template() -> &'static Template {
    static T: OnceLock<Template> = OnceLock::new();
    T.get_or_init(|| {
        let root = super::scratch_dir();
        let dir = root.path().join("vault");
        let mut vault = Vault::init(
            &dir,
            InitSecret::KeyFile(key()),
            VaultConfig::default(),
            who(),
        )
        .expect("template vault");
        let memory = super::protocol_line::memory();
        let mut files = BTreeMap::new();
        let mut i = 0;
        // A checkpoint of more than 64 objects writes a pack (fewer are
        // written loose): ten creates each.
        while packs(&dir).len() < PACKS {
            for _ in 0..10 {
                let path = format!("/memories/n{i}.md");
                let text = format!("note {i}\n");
                let r = memory.execute_json(
                    &mut vault,
                    &json!({"command": "create", "path": path, "file_text": text}),
                );
                assert!(!r.is_error, "template create");
                files.insert(path, text);
                i += 1;
            }
            vault.checkpoint().expect("checkpoint");
            assert!(i < 200, "checkpoints make packs: {:?}", packs(&dir));
        }
        for (path, text) in &files {
            assert!(view(&mut vault, path).is_some_and(|v| v.contains(text.trim_end())));
        }
        drop(vault);
        let smallest = packs(&dir).remove(0);
        let read = |ext: &str| {
            std::fs::read(dir.join(format!("objects/pack/{smallest}.{ext}"))).expect("a pack")
        };
        Template {
            idx: read("idx"),
            pack: read("pack"),
            _root: root,
            dir,
            files,
        }
    })
}

/// Apply the input's mutations (groups of 4 bytes: op, position high,
/// position low, value) to an index and a pack.
pub fn mutate(mut idx: Vec<u8>, mut pack: Vec<u8>, ops: &[u8]) -> (Vec<u8>, Vec<u8>) {
    for op in ops.chunks_exact(4) {
        let bytes = if op[0] & 1 == 0 { &mut idx } else { &mut pack };
        let at = (usize::from(op[1]) << 8 | usize::from(op[2])) % (bytes.len() + 1);
        match (op[0] >> 1) % 5 {
            0 if at < bytes.len() => bytes[at] ^= 1 << (op[3] % 8),
            1 if at < bytes.len() => bytes[at] = op[3],
            2 => bytes.truncate(at),
            3 => bytes.insert(at, op[3]),
            4 if at < bytes.len() => {
                bytes.remove(at);
            }
            _ => {}
        }
    }
    (idx, pack)
}

pub fn check(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let t = template();
    let (idx, pack) = if mode % 2 == 0 {
        let Some((len, rest)) = rest.split_first_chunk::<2>() else {
            return;
        };
        let n = usize::from(u16::from_be_bytes(*len)).min(rest.len());
        (rest[..n].to_vec(), rest[n..].to_vec())
    } else {
        mutate(t.idx.clone(), t.pack.clone(), rest)
    };
    let work = super::scratch_dir();
    let dir = work.path().join("vault");
    super::copy_dir(&t.dir, &dir, &[]);
    std::fs::write(dir.join(format!("objects/pack/{EXTRA}.idx")), &idx).expect("write");
    std::fs::write(dir.join(format!("objects/pack/{EXTRA}.pack")), &pack).expect("write");

    let key = key();
    let Ok(mut vault) = Vault::open(&dir, &Unlock::KeyFile(&key), who()) else {
        // Refusing is allowed; panicking or hanging is not.
        return;
    };
    let merged = vault.checkpoint().is_ok();
    let genuine = idx == t.idx && pack == t.pack;
    for (path, text) in &t.files {
        match view(&mut vault, path) {
            Some(v) => assert!(
                v.contains(text.trim_end()),
                "{path} shows content it never had: {v:?}"
            ),
            None => assert!(!genuine, "a copy of a genuine pack hid {path}"),
        }
    }
    if genuine {
        assert!(merged, "merging a copy of a genuine pack failed");
    }
    let _ = vault.verify();
}
