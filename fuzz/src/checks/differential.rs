//! The same commands on the in-memory store and on a real encrypted vault
//! give the same results, leave the same files, and record the same audit
//! facts.
//!
//! Each input runs on a fresh vault (key file `[0x4b; 32]`, default
//! settings) in a temporary directory, under `/dev/shm` when it exists.
//! Both stores share one executor, built as the vault builds it (default
//! settings, redaction on).
//!
//! Input: up to 12 commands. Each starts with a byte picking the command;
//! paths mostly come from a small set of names (so commands meet each
//! other's files), sometimes from raw input; texts and `old_str` likewise.

use std::collections::BTreeMap;

use memvault::crypto::KeyFileKey;
use memvault::memory::{Command, MemStore, MemoryPath, NodeKind, Snapshot, Store, ToolResult};
use memvault::vault::{Attribution, InitSecret, Vault, VaultConfig};

use super::input::Input;
use super::protocol_line::memory;

const NAMES: &[&str] = &["a", "b", "notes.md", "x.png", "d", "B", "é", "a b"];

const TEXTS: &[&str] = &[
    "",
    "hello\n",
    "one\ntwo\nthree\n",
    "one\ntwo",
    "\n\n",
    "line\r\nline\r\n",
    "password = hunter2hunter2\n",
    "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYzzzzzzzzzz\n",
    "token ghp_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "[REDACTED:x]",
    "\u{89}PNG",
    "é\u{301}",
];

const PIECES: &[&str] = &[
    "", "one", "two", "\n", "hello", "line", "o", "e\nt", "password",
];

/// One path: a few names deep, or raw input.
fn path(input: &mut Input) -> String {
    let choice = input.byte();
    if choice >= 0xf0 {
        return input.text(64);
    }
    let mut p = String::from("/memories");
    for _ in 0..choice % 4 {
        p.push('/');
        p.push_str(input.pick(NAMES));
    }
    if choice & 0x80 != 0 {
        p.push('/');
    }
    p
}

fn text(input: &mut Input, choices: &[&str]) -> String {
    let choice = input.byte();
    if choice >= 0xe0 {
        return input.text(96);
    }
    let mut t = input.pick(choices).to_owned();
    if choice & 1 != 0 {
        t.push_str(input.pick(choices));
    }
    t
}

/// A small number, or any `i64` now and then.
fn number(input: &mut Input) -> i64 {
    match input.byte() {
        0xff => i64::from_le_bytes(std::array::from_fn(|_| input.byte())),
        b => i64::from(b % 8) - 2,
    }
}

fn command(input: &mut Input) -> Command {
    match input.byte() % 6 {
        0 => Command::View {
            path: path(input),
            view_range: (input.byte() & 1 != 0).then(|| [number(input), number(input)]),
        },
        1 => Command::Create {
            path: path(input),
            file_text: text(input, TEXTS),
        },
        2 => Command::StrReplace {
            path: path(input),
            old_str: text(input, PIECES),
            new_str: (input.byte() & 3 != 0).then(|| text(input, PIECES)),
        },
        3 => Command::Insert {
            path: path(input),
            insert_line: number(input),
            insert_text: text(input, TEXTS),
        },
        4 => Command::Delete { path: path(input) },
        _ => Command::Rename {
            old_path: path(input),
            new_path: path(input),
        },
    }
}

pub fn check(data: &[u8]) {
    let mut input = Input::new(data);
    let mut commands = Vec::new();
    while !input.is_empty() && commands.len() < 12 {
        commands.push(command(&mut input));
    }

    let tmp = super::scratch_dir();
    let key = KeyFileKey::from_bytes(&[0x4b; 32]).expect("32 bytes");
    let who = Attribution {
        session: "fuzz".into(),
        actor: "fuzz".into(),
    };
    let dir = tmp.path().join("vault");
    let mut vault =
        Vault::init(&dir, InitSecret::KeyFile(key), VaultConfig::default(), who).expect("a vault");
    assert_eq!(vault.config(), &VaultConfig::default());
    let mut mem = MemStore::new();
    let memory = memory();

    for (i, cmd) in commands.iter().enumerate() {
        let in_memory = memory.execute(&mut mem, cmd);
        let in_vault = memory.execute(&mut vault, cmd);
        assert_eq!(in_memory, in_vault, "command {i}: {cmd:?}");
    }

    assert_eq!(
        files(&mut mem),
        files(&mut vault),
        "the stores hold different files"
    );
    let history = vault.history().expect("the vault's history reads");
    let (init, commits) = history.split_last().expect("the init commit");
    assert_eq!(init.1.op, "init");
    let in_vault: Vec<_> = commits
        .iter()
        .rev()
        .map(|(_, m)| {
            (
                m.op.clone(),
                m.lines_added,
                m.lines_removed,
                m.redactions.clone(),
            )
        })
        .collect();
    let in_memory: Vec<_> = mem
        .log()
        .iter()
        .map(|(op, f)| {
            (
                op.as_str().to_owned(),
                f.lines_added,
                f.lines_removed,
                f.redactions.clone(),
            )
        })
        .collect();
    assert_eq!(in_memory, in_vault, "the stores recorded different commits");
}

/// Every file in a store with its content, read through the `Store` trait.
fn files(store: &mut dyn Store) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    store
        .read(&mut |snap| {
            out.clear();
            walk(snap, &MemoryPath::root(), &mut out);
            Ok(ToolResult::ok(""))
        })
        .expect("the store reads");
    out
}

fn walk(snap: &dyn Snapshot, dir: &MemoryPath, out: &mut BTreeMap<String, Vec<u8>>) {
    for entry in snap.list(dir).expect("a listed directory lists") {
        let path = dir.join(&entry.name).expect("a stored name is valid");
        match entry.kind {
            NodeKind::File => {
                let content = snap.read(&path).expect("a listed file reads");
                assert_eq!(entry.size, content.len() as u64, "size of {path}");
                out.insert(path.as_str().to_owned(), content.to_vec());
            }
            NodeKind::Dir => walk(snap, &path, out),
        }
    }
}
