//! Protocol lines against the in-memory store: `handle_line` never panics,
//! answers every line with exactly one well-formed `tool_result`, and an
//! error result changes nothing.
//!
//! Input: up to 16 request lines separated by `\n`, run in order on one
//! store that starts with a few files (so edits and views find something).

use std::sync::OnceLock;

use memvault::memory::{Content, MemStore, Memory, MemoryPath};
use memvault::protocol::handle_line;
use memvault::redact::{RedactConfig, Redactor};
use memvault::vault::VaultConfig;
use serde_json::Value;

/// The executor as a vault with default settings builds it (redaction on).
pub fn memory() -> &'static Memory {
    static MEMORY: OnceLock<Memory> = OnceLock::new();
    MEMORY.get_or_init(|| {
        let redactor = Redactor::new(&RedactConfig::default()).expect("default filter builds");
        memvault::memory_for_config(&VaultConfig::default(), redactor)
    })
}

/// Files every run starts with.
const SEED: &[(&str, &[u8])] = &[
    ("/memories/notes.md", b"# Notes\nfirst line\nsecond line\n"),
    ("/memories/dir/a.txt", b"alpha\nbeta\ngamma"),
    ("/memories/dir/sub/b.txt", b""),
    ("/memories/img.png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"),
    ("/memories/bin.dat", b"\xff\xfe\x00binary"),
];

pub fn check(data: &[u8]) {
    let memory = memory();
    let mut store = MemStore::new();
    for (path, content) in SEED {
        let path = MemoryPath::parse(path).expect("seed paths are valid");
        store.seed(&path, *content).expect("seed files fit");
    }
    for line in data.split(|&b| b == b'\n').take(16) {
        let before = files(&store);
        let commits = store.commits();
        let reply = handle_line(memory, &mut store, line);

        let out: Value = serde_json::from_str(&reply.to_line()).expect("the reply is JSON");
        assert_eq!(out["type"], "tool_result");
        assert_eq!(out["is_error"], Value::Bool(reply.result.is_error));
        match &reply.result.content {
            Content::Text(text) => {
                assert!(!text.trim().is_empty(), "empty result for {line:?}");
                assert_eq!(out["content"], Value::String(text.clone()));
            }
            Content::Image { .. } => assert!(!reply.result.is_error),
        }
        // The id comes back only from a tool_use block that carried it.
        if let Some(id) = &reply.tool_use_id {
            let request: Value = serde_json::from_slice(line).expect("an id means JSON");
            assert_eq!(request["type"], "tool_use");
            assert_eq!(request["id"].as_str(), Some(id.as_str()));
        }
        if reply.result.is_error {
            assert_eq!(store.commits(), commits, "an error committed: {line:?}");
            assert!(
                files(&store) == before,
                "an error changed the store: {line:?}"
            );
        } else {
            assert!(store.commits() <= commits + 1, "two commits for {line:?}");
        }
    }
}

fn files(store: &MemStore) -> Vec<(String, Vec<u8>)> {
    store
        .paths()
        .map(|p| {
            let path = MemoryPath::parse(p).expect("stored paths are valid");
            (p.to_owned(), store.get(&path).unwrap_or_default().to_vec())
        })
        .collect()
}
