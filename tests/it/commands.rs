//! Every command through the real binary and the encrypted vault: exact
//! strings of SPEC.md, and the same answers as the in-memory reference.

use serde_json::{Value, json};

use crate::util::*;

fn script() -> Vec<Value> {
    let long: String = (1..=3000)
        .map(|i| format!("line {i} of a long note\n"))
        .collect();
    vec![
        json!({"command": "view", "path": "/memories"}),
        json!({"command": "create", "path": "/memories/notes.txt", "file_text": "Hello World\nThis is line two\n"}),
        json!({"command": "create", "path": "/memories/notes.txt", "file_text": "again"}),
        json!({"command": "create", "path": "/memories/a/b/c/deep.md", "file_text": "deep\n"}),
        json!({"command": "create", "path": "/memories/a/.hidden", "file_text": "secret-ish but hidden\n"}),
        json!({"command": "create", "path": "/memories/a/node_modules/x.js", "file_text": "x\n"}),
        json!({"command": "create", "path": "/memories/a/b2.txt", "file_text": "b2"}),
        json!({"command": "create", "path": "/memories/long.txt", "file_text": long}),
        json!({"command": "view", "path": "/memories"}),
        json!({"command": "view", "path": "/memories/a"}),
        json!({"command": "view", "path": "/memories/notes.txt"}),
        json!({"command": "view", "path": "/memories/notes.txt", "view_range": [2, 2]}),
        json!({"command": "view", "path": "/memories/notes.txt", "view_range": [1, -1]}),
        json!({"command": "view", "path": "/memories/notes.txt", "view_range": [3, 1]}),
        json!({"command": "view", "path": "/memories/long.txt"}),
        json!({"command": "view", "path": "/memories/long.txt", "view_range": [1500, 1502]}),
        json!({"command": "view", "path": "/memories/missing.txt"}),
        json!({"command": "str_replace", "path": "/memories/notes.txt", "old_str": "line two", "new_str": "line 2"}),
        json!({"command": "str_replace", "path": "/memories/notes.txt", "old_str": "absent", "new_str": "x"}),
        json!({"command": "str_replace", "path": "/memories/long.txt", "old_str": "of a long note", "new_str": "x"}),
        json!({"command": "str_replace", "path": "/memories/notes.txt", "old_str": "Hello "}),
        json!({"command": "str_replace", "path": "/memories/a", "old_str": "x", "new_str": "y"}),
        json!({"command": "str_replace", "path": "/memories/nope", "old_str": "x", "new_str": "y"}),
        json!({"command": "insert", "path": "/memories/notes.txt", "insert_line": 0, "insert_text": "first\n"}),
        json!({"command": "insert", "path": "/memories/notes.txt", "insert_line": 3, "insert_text": "last"}),
        json!({"command": "insert", "path": "/memories/notes.txt", "insert_line": 9, "insert_text": "x"}),
        json!({"command": "insert", "path": "/memories/nope", "insert_line": 0, "insert_text": "x"}),
        json!({"command": "view", "path": "/memories/notes.txt"}),
        json!({"command": "rename", "old_path": "/memories/notes.txt", "new_path": "/memories/a/b2.txt"}),
        json!({"command": "rename", "old_path": "/memories/nope", "new_path": "/memories/x"}),
        json!({"command": "rename", "old_path": "/memories/a", "new_path": "/memories/a/inside"}),
        json!({"command": "rename", "old_path": "/memories", "new_path": "/memories/x"}),
        json!({"command": "rename", "old_path": "/memories/a", "new_path": "/memories/z/moved"}),
        json!({"command": "view", "path": "/memories"}),
        json!({"command": "view", "path": "/memories/z/moved/b/c/deep.md"}),
        json!({"command": "rename", "old_path": "/memories/notes.txt", "new_path": "/memories/n/notes.txt"}),
        json!({"command": "delete", "path": "/memories"}),
        json!({"command": "delete", "path": "/memories/nope"}),
        json!({"command": "delete", "path": "/memories/z"}),
        json!({"command": "delete", "path": "/memories/n/notes.txt"}),
        json!({"command": "create", "path": "/memories/long.txt/child", "file_text": "x"}),
        json!({"command": "view", "path": "/memories/../etc/passwd"}),
        json!({"command": "view", "path": "/memories"}),
    ]
}

#[test]
fn vault_answers_exactly_like_the_reference_semantics() {
    let v = TestVault::new();
    let lines: Vec<String> = script().iter().map(|c| c.to_string()).collect();
    let from_vault = v.serve(&lines);

    let config = memvault::vault::VaultConfig::default();
    let redactor = memvault::redact::Redactor::new(&config.redaction).unwrap();
    let memory = memvault::memory_for_config(&config, redactor);
    let mut store = memvault::memory::MemStore::default();
    let from_memory: Vec<Value> = script()
        .iter()
        .map(|c| memvault::protocol::handle_value(&memory, &mut store, c).to_json())
        .collect();
    assert_eq!(from_vault.len(), from_memory.len());
    for (i, (a, b)) in from_vault.iter().zip(&from_memory).enumerate() {
        assert_eq!(a, b, "command {i}: {}", lines[i]);
    }
}

#[test]
fn exact_strings_through_the_vault() {
    let v = TestVault::new();
    let out = v.serve(
        &[
            json!({"command": "view", "path": "/memories"}),
            json!({"command": "create", "path": "/memories/notes.txt", "file_text": "Hello World\nThis is line two\n"}),
            json!({"command": "create", "path": "/memories/notes.txt", "file_text": "x"}),
            json!({"command": "view", "path": "/memories/notes.txt"}),
            json!({"command": "str_replace", "path": "/memories/notes.txt", "old_str": "line two", "new_str": "line 2"}),
            json!({"command": "str_replace", "path": "/memories/notes.txt", "old_str": "zzz", "new_str": "y"}),
            json!({"command": "insert", "path": "/memories/notes.txt", "insert_line": 1, "insert_text": "middle\n"}),
            json!({"command": "insert", "path": "/memories/notes.txt", "insert_line": 7, "insert_text": "x"}),
            json!({"command": "rename", "old_path": "/memories/notes.txt", "new_path": "/memories/d/n.txt"}),
            json!({"command": "view", "path": "/memories"}),
            json!({"command": "delete", "path": "/memories/d"}),
            json!({"command": "view", "path": "/memories/d/n.txt"}),
            json!({"command": "delete", "path": "/memories/d"}),
        ]
        .iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>(),
    );
    let header = "Here're the files and directories up to 2 levels deep in /memories, excluding hidden items and node_modules:";
    assert_eq!(text(&out[0]), format!("{header}\n0B\t/memories"));
    assert!(!is_error(&out[0]));
    assert_eq!(
        text(&out[1]),
        "File created successfully at: /memories/notes.txt"
    );
    assert_eq!(
        text(&out[2]),
        "Error: File /memories/notes.txt already exists"
    );
    assert!(is_error(&out[2]));
    assert_eq!(
        text(&out[3]),
        "Here's the content of /memories/notes.txt with line numbers:\n     1\tHello World\n     2\tThis is line two"
    );
    assert_eq!(
        text(&out[4]),
        "The memory file has been edited. Here is the snippet showing the change (with line numbers):\n     1\tHello World\n     2\tThis is line 2"
    );
    assert_eq!(
        text(&out[5]),
        "No replacement was performed, old_str `zzz` did not appear verbatim in /memories/notes.txt."
    );
    assert!(is_error(&out[5]));
    assert_eq!(
        text(&out[6]),
        "The file /memories/notes.txt has been edited."
    );
    assert_eq!(
        text(&out[7]),
        "Error: Invalid `insert_line` parameter: 7. It should be within the range of lines of the file: [0, 3]"
    );
    assert_eq!(
        text(&out[8]),
        "Successfully renamed /memories/notes.txt to /memories/d/n.txt"
    );
    assert_eq!(
        text(&out[9]),
        format!("{header}\n34B\t/memories\n34B\t/memories/d/\n34B\t/memories/d/n.txt")
    );
    assert_eq!(text(&out[10]), "Successfully deleted /memories/d");
    assert_eq!(
        text(&out[11]),
        "The path /memories/d/n.txt does not exist. Please provide a valid path."
    );
    assert_eq!(text(&out[12]), "Error: The path /memories/d does not exist");
}

#[test]
fn a_new_session_resumes_from_the_same_vault() {
    let v = TestVault::new();
    v.one(
        json!({"command": "create", "path": "/memories/progress.md", "file_text": "step 1 done\n"}),
    );
    // A second, separate process sees the first one's memory.
    let out = v.one(json!({"command": "view", "path": "/memories/progress.md"}));
    assert_eq!(
        text(&out),
        "Here's the content of /memories/progress.md with line numbers:\n     1\tstep 1 done"
    );
}

#[test]
fn image_files_come_back_as_image_blocks() {
    let v = TestVault::new();
    // Images reach a vault through the library (e.g. import); write one
    // with a mutation through the Store trait.
    use memvault::memory::{
        Change, ChangeFacts, MemoryPath, Mutation, Op, Outcome, Store, ToolResult,
    };
    let mut vault = v.open_library("t");
    let png: Vec<u8> = vec![
        0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 13, 0xff, 0xfe,
    ];
    let path = MemoryPath::parse("/memories/pic.PNG").unwrap();
    let png2 = png.clone();
    vault
        .write(&mut |_| {
            Ok(Outcome {
                result: ToolResult::ok("ok"),
                mutation: Some(Mutation {
                    op: Op::Create,
                    change: Change::Write {
                        path: path.clone(),
                        content: zeroize::Zeroizing::new(png2.clone()),
                    },
                    facts: ChangeFacts::default(),
                }),
            })
        })
        .unwrap();
    drop(vault);
    let out = v.one(json!({"command": "view", "path": "/memories/pic.PNG"}));
    assert_eq!(out["is_error"], false);
    let block = &out["content"][0];
    assert_eq!(block["type"], "image");
    assert_eq!(block["source"]["type"], "base64");
    assert_eq!(block["source"]["media_type"], "image/png");
    let data = data_encoding::BASE64
        .decode(block["source"]["data"].as_str().unwrap().as_bytes())
        .unwrap();
    assert_eq!(data, png);
    // `show` tells a person what it is; `--raw` gives its bytes as stored.
    let out = v
        .cmd()
        .args(["show", "HEAD", "/memories/pic.PNG"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "/memories/pic.PNG is an image (image/png, 14 bytes): `--raw` gives its bytes\n"
    );
    let out = v
        .cmd()
        .args(["show", "HEAD", "/memories/pic.PNG", "--raw"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, png);
}

#[test]
fn overwrite_setting_lets_create_replace_a_file() {
    let tmp = tempfile::tempdir().unwrap();
    let vault = tmp.path().join("v");
    let key = tmp.path().join("k");
    assert!(
        std::process::Command::new(bin())
            .arg("keygen")
            .arg(&key)
            .status()
            .unwrap()
            .success()
    );
    let st = std::process::Command::new(bin())
        .arg("--vault")
        .arg(&vault)
        .arg("--key-file")
        .arg(&key)
        .args(["init", "--overwrite-on-create"])
        .status()
        .unwrap();
    assert!(st.success());
    let v = TestVault { tmp, vault, key };
    let out = v.serve(&[
        json!({"command": "create", "path": "/memories/a.txt", "file_text": "one\n"}).to_string(),
        json!({"command": "create", "path": "/memories/a.txt", "file_text": "two\n"}).to_string(),
        json!({"command": "view", "path": "/memories/a.txt"}).to_string(),
    ]);
    assert_eq!(
        text(&out[1]),
        "File created successfully at: /memories/a.txt"
    );
    assert!(text(&out[2]).ends_with("     1\ttwo"));
    assert_eq!(v.commits(), 3);
}

#[test]
fn a_file_over_a_lowered_limit_takes_edits_that_do_not_grow_it() {
    let v = TestVault::new();
    let big = format!("{}\nshort\n", "x".repeat(2000));
    let r = v.one(json!({"command": "create", "path": "/memories/b.md", "file_text": big}));
    assert_eq!(r["is_error"], false, "{r}");
    let out = v
        .cmd()
        .args(["config", "set", "max_file_bytes", "1024"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    for (old, new, ok) in [
        ("short", "SHORT", true),
        ("SHORT\n", "", true),
        ("xxxx", "xxxxx", false),
    ] {
        let r = v.one(json!({"command": "str_replace", "path": "/memories/b.md", "old_str": old, "new_str": new}));
        assert_eq!(r["is_error"], !ok, "{old} -> {new}: {r}");
    }
    let r = v.one(json!({"command": "view", "path": "/memories/b.md"}));
    assert!(!r["content"].as_str().unwrap().contains("short"), "{r}");
}

/// `keygen` into a folder that does not exist yet (`~/.config` on a new
/// machine, as the README's first command has it) makes the folder,
/// private, and the key file, mode 0600 (it failed: "No such file or
/// directory"; round 40d); it still never overwrites a key file.
#[test]
fn keygen_makes_a_missing_folder_private() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let key = tmp.path().join("home/.config/memvault.key");
    let run = || {
        std::process::Command::new(bin())
            .arg("keygen")
            .arg(&key)
            .output()
            .unwrap()
    };
    let out = run();
    assert!(out.status.success(), "{out:?}");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&key), 0o600);
    assert_eq!(mode(&tmp.path().join("home/.config")) & 0o077, 0);
    assert_eq!(std::fs::read(&key).unwrap().len(), 32);
    let out = run();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("never overwrites"));
}
