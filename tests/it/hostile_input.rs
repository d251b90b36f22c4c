//! Hostile request input through the real binary: repeated JSON keys,
//! huge listings, secrets outside file content, and errors that must say
//! what is really wrong (issue 16, holes 9 to 12).

use serde_json::{Value, json};

use crate::util::{TestVault, bin, is_error, run_with_stdin, text};

fn serve_raw(t: &TestVault, lines: &[&str]) -> Vec<Value> {
    t.serve(&lines.iter().map(|l| l.to_string()).collect::<Vec<_>>())
}

#[test]
fn duplicate_command_key_is_refused() {
    let t = TestVault::new();
    t.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "keep me\n"}));
    let out = serve_raw(
        &t,
        &[
            r#"{"command":"view","command":"delete","path":"/memories/a.md"}"#,
            r#"{"command":"view","path":"/memories/a.md"}"#,
        ],
    );
    assert!(is_error(&out[0]), "{}", out[0]);
    assert!(
        text(&out[0]).contains("gives the key `command` twice"),
        "{}",
        out[0]
    );
    assert!(text(&out[1]).contains("keep me"), "{}", out[1]);
}

#[test]
fn duplicate_tool_use_input_is_refused() {
    let t = TestVault::new();
    t.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "keep me\n"}));
    let out = serve_raw(
        &t,
        &[
            r#"{"type":"tool_use","id":"toolu_1","name":"memory","input":{"command":"view","path":"/memories"},"input":{"command":"delete","path":"/memories/a.md"}}"#,
            r#"{"command":"view","path":"/memories/a.md"}"#,
        ],
    );
    assert!(is_error(&out[0]), "{}", out[0]);
    assert!(
        text(&out[0]).contains("the key `input` twice"),
        "{}",
        out[0]
    );
    assert!(text(&out[1]).contains("keep me"), "{}", out[1]);
}

#[test]
fn duplicate_nested_key_is_refused_and_unknown_keys_are_not_echoed() {
    let t = TestVault::new();
    let out = serve_raw(
        &t,
        &[
            r#"{"type":"tool_use","id":"toolu_1","name":"memory","input":{"command":"create","path":"/memories/a","file_text":"x","path":"/memories/b"}}"#,
            r#"{"command":"create","path":"/memories/c","file_text":"x","extra":{"ghp_s3cr3tkey":1,"ghp_s3cr3tkey":2}}"#,
            r#"{"command":"view","path":"/memories"}"#,
        ],
    );
    assert!(text(&out[0]).contains("the key `path` twice"), "{}", out[0]);
    assert!(is_error(&out[1]), "{}", out[1]);
    assert!(text(&out[1]).contains("gives a key twice"), "{}", out[1]);
    assert!(!text(&out[1]).contains("ghp_"), "{}", out[1]);
    let listing = text(&out[2]);
    assert!(!listing.contains("/memories/a") && !listing.contains("/memories/b"));
    assert!(!listing.contains("/memories/c"), "{listing}");
}

#[test]
fn duplicate_key_is_refused_by_exec() {
    let t = TestVault::new();
    t.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "keep me\n"}));
    let out = t
        .cmd()
        .arg("exec")
        .arg(r#"{"command":"view","command":"delete","path":"/memories/a.md"}"#)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("twice"));
    let v = t.one(json!({"command": "view", "path": "/memories/a.md"}));
    assert!(text(&v).contains("keep me"), "{v}");
}

/// A memory directory of `n` small files in `dirs` subfolders (or at the
/// top when `dirs` is 0), imported in one commit.
fn import_many(t: &TestVault, n: usize, dirs: usize) {
    let src = t.tmp.path().join("plain");
    for i in 0..n {
        let dir = match dirs {
            0 => src.clone(),
            d => src.join(format!("d{:03}", i % d)),
        };
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("note-{i:05}.md")), format!("note {i}\n")).unwrap();
    }
    let out = t.cmd().arg("import").arg(&src).output().unwrap();
    assert!(
        out.status.success(),
        "import: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn directory_view_is_capped_at_max_view_chars() {
    let t = TestVault::new();
    import_many(&t, 3000, 0);
    let v = t.one(json!({"command": "view", "path": "/memories"}));
    assert!(!is_error(&v), "{v}");
    let body = text(&v);
    let rows: Vec<&str> = body.split('\n').collect();
    let marker = rows.last().unwrap();
    assert!(
        marker.starts_with("… ") && marker.contains("more entries not shown"),
        "{marker}"
    );
    // Header, capped rows, marker: the whole answer within 16,000
    // characters.
    assert!(body.chars().count() <= 16_000, "{}", body.chars().count());
    let listed: usize = rows[1..rows.len() - 1]
        .iter()
        .map(|r| r.chars().count() + 1)
        .sum();
    assert!(listed > 15_000, "{listed}");
    let shown = rows.len() - 2;
    let omitted: usize = marker
        .trim_start_matches("… ")
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // The directory's own row plus 3,000 files.
    assert_eq!(shown + omitted, 3001, "{marker}");
    assert_eq!(rows[1], "28.2K\t/memories");
    assert!(rows[2].ends_with("/memories/note-00000.md"), "{}", rows[2]);
    // Whole rows only, and the same answer every time.
    assert!(rows[1..rows.len() - 1].iter().all(|r| r.contains('\t')));
    assert_eq!(t.one(json!({"command": "view", "path": "/memories"})), v);
    // The flat directory's other files are listed by the view_range the
    // closing row gives, from the first one left out.
    let first = shown + 1;
    assert!(
        marker.contains(&format!("View /memories with view_range [{first}, -1]")),
        "{marker}"
    );
    let rest = t.one(json!({"command": "view", "path": "/memories", "view_range": [first, -1]}));
    let rest = text(&rest);
    assert!(
        rest.starts_with(&format!(
            "Here're the files and directories up to 2 levels deep in /memories, excluding hidden items and node_modules (entries {first} to "
        )),
        "{}",
        rest.lines().next().unwrap()
    );
    let next = rest.lines().nth(1).unwrap();
    assert!(
        next.ends_with(&format!("/memories/note-{:05}.md", first - 2)),
        "{next}"
    );
}

#[test]
fn capped_directory_view_names_a_subdirectory_to_view() {
    let t = TestVault::new();
    import_many(&t, 2000, 40);
    let v = t.one(json!({"command": "view", "path": "/memories"}));
    let body = text(&v);
    let marker = body.rsplit('\n').next().unwrap();
    assert!(
        marker.contains("view a subdirectory (such as /memories/d"),
        "{marker}"
    );
    assert!(body.chars().count() <= 16_000, "{}", body.chars().count());
    let sub = t.one(json!({"command": "view", "path": "/memories/d039"}));
    assert!(!text(&sub).contains("not shown"), "{sub}");
    assert!(
        text(&sub).ends_with("/memories/d039/note-01999.md"),
        "{sub}"
    );
}

#[test]
fn view_range_number_out_of_range_says_so() {
    let t = TestVault::new();
    t.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "x\n"}));
    let v =
        t.one(json!({"command": "view", "path": "/memories/a.md", "view_range": [1, u64::MAX]}));
    assert!(is_error(&v), "{v}");
    let m = text(&v);
    assert!(!m.contains("array of 2 items"), "{m}");
    assert!(m.contains("18446744073709551615 is out of range"), "{m}");
}

#[test]
fn history_into_a_closed_pipe_exits_quietly() {
    let t = TestVault::new();
    t.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "x\n"}));
    // A pipe whose reading end is closed before the process starts: every
    // write to stdout fails with EPIPE, as under `memvault history | head`.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    for args in [
        &["history"][..],
        &["show", "HEAD", "/memories"],
        &["sessions"],
    ] {
        let out = t
            .cmd()
            .args(args)
            .stdout(writer.try_clone().unwrap())
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err, "", "{args:?}");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
    }
}

#[test]
fn export_into_a_dangling_symlink_is_refused_as_such() {
    let t = TestVault::new();
    t.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "x\n"}));
    let link = t.tmp.path().join("out");
    let target = t.tmp.path().join("nowhere");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let out = t.cmd().arg("export").arg(&link).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("symbolic link"), "{err}");
    assert!(err.contains("dangling"), "{err}");
    assert!(!err.contains("No such file"), "{err}");
    assert!(!target.exists());
    // A link to a real empty directory is refused too: no writes through links.
    std::fs::create_dir(&target).unwrap();
    let out = t.cmd().arg("export").arg(&link).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("symbolic link"));
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0);
}

/// A `memvault` command on `t` that mode bits apply to: as root, the test
/// vault is handed to `nobody` and the command runs as `nobody`. It runs a
/// copy of the binary kept beside the vault: the build may sit where
/// `nobody` cannot reach it (a clone inside a `mktemp -d` directory).
fn unprivileged_cmd(t: &TestVault) -> std::process::Command {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::CommandExt;
    let probe = tempfile::tempfile().unwrap();
    if probe.metadata().unwrap().uid() != 0 {
        return t.cmd();
    }
    let program = t.tmp.path().join("memvault-copy");
    if !program.exists() {
        std::fs::copy(bin(), &program).unwrap();
    }
    let mut stack = vec![t.tmp.path().to_path_buf()];
    while let Some(p) = stack.pop() {
        std::os::unix::fs::lchown(&p, Some(65534), Some(65534)).unwrap();
        if std::fs::symlink_metadata(&p).unwrap().is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        }
    }
    let mut cmd = t.cmd_of(&program);
    cmd.uid(65534).gid(65534).env("HOME", t.tmp.path());
    cmd
}

#[test]
fn permission_error_names_the_file() {
    use std::os::unix::fs::PermissionsExt;
    let t = TestVault::new();
    t.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "x\n"}));
    let wal = t.vault.join("memvault").join("wal");
    let mode = std::fs::metadata(&wal).unwrap().permissions();
    for args in [
        &["history"][..],
        &["exec", r#"{"command":"view","path":"/memories"}"#],
    ] {
        let mut cmd = unprivileged_cmd(&t);
        cmd.args(args);
        std::fs::set_permissions(&wal, std::fs::Permissions::from_mode(0o000)).unwrap();
        // The binary was just copied: a child another test thread forked
        // meanwhile may still hold the copy's write descriptor ("text
        // file busy") for a moment.
        let out = (0..100)
            .find_map(|_| match cmd.output() {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    None
                }
                other => Some(other.unwrap()),
            })
            .expect("the copied binary stayed busy");
        std::fs::set_permissions(&wal, mode.clone()).unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains(&format!("cannot open {}: permission denied", wal.display())),
            "{args:?}: {err}"
        );
    }
}

/// A GitHub classic token whose checksum verifies (the filter finds it).
const TOKEN: &str = "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";

/// Every place a secret could come back out of the vault: `history`,
/// `history --json`, `show` of the tip, `sessions`, `resume`, and the
/// plaintext on disk.
fn assert_nowhere(t: &TestVault, secret: &str) {
    for args in [
        &["history"][..],
        &["history", "--json"],
        &["show", "HEAD", "/memories"],
        &["sessions"],
        &["resume"],
    ] {
        let out = t.cmd().args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let all = [out.stdout, out.stderr].concat();
        assert!(
            !crate::util::contains(&all, secret.as_bytes()),
            "{args:?} shows the secret: {}",
            String::from_utf8_lossy(&all)
        );
    }
    assert!(crate::util::plaintext_anywhere(&t.vault, secret).is_empty());
}

fn set_mode(t: &TestVault, mode: &str) {
    crate::limits::with_config(t, "redaction.mode", json!(mode));
}

#[test]
fn secret_in_a_file_name_is_redacted() {
    let t = TestVault::new();
    let v = t.one(json!({"command": "create", "path": format!("/memories/{TOKEN}.md"), "file_text": "note\n"}));
    assert!(!is_error(&v), "{v}");
    assert_eq!(
        text(&v),
        "File created successfully at: /memories/[REDACTED:github-token].md\nNote: the path held 1 secret (github-token); it was saved under the redacted name shown above."
    );
    let listing = t.one(json!({"command": "view", "path": "/memories"}));
    assert!(
        text(&listing).contains("/memories/[REDACTED:github-token].md"),
        "{listing}"
    );
    let history = t.cmd().arg("history").output().unwrap();
    assert!(String::from_utf8_lossy(&history.stdout).contains("[REDACTED:github-token]"));
    assert_nowhere(&t, TOKEN);
}

#[test]
fn secret_in_a_rename_target_is_redacted() {
    let t = TestVault::new();
    t.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "note\n"}));
    let v = t.one(json!({"command": "rename", "old_path": "/memories/a.md", "new_path": format!("/memories/dir-{TOKEN}/a.md")}));
    assert!(!is_error(&v), "{v}");
    assert!(
        text(&v).starts_with("Successfully renamed /memories/a.md to /memories/dir-[REDACTED:github-token]/a.md\nNote: the path held 1 secret"),
        "{v}"
    );
    assert_nowhere(&t, TOKEN);
}

#[test]
fn secret_in_a_file_name_is_refused_in_reject_mode() {
    let t = TestVault::new();
    set_mode(&t, "reject");
    let before = t.commits();
    let v = t.one(json!({"command": "create", "path": format!("/memories/{TOKEN}.md"), "file_text": "note\n"}));
    assert!(is_error(&v), "{v}");
    assert!(
        text(&v).contains("the path holds 1 secret (github-token)"),
        "{v}"
    );
    assert!(!text(&v).contains(TOKEN), "{v}");
    t.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "note\n"}));
    let v = t.one(json!({"command": "rename", "old_path": "/memories/a.md", "new_path": format!("/memories/{TOKEN}")}));
    assert!(is_error(&v) && !text(&v).contains(TOKEN), "{v}");
    assert_eq!(t.commits(), before + 1);
    assert_nowhere(&t, TOKEN);
}

#[test]
fn secret_in_session_and_actor_is_redacted_in_history() {
    let t = TestVault::new();
    let out = run_with_stdin(
        t.cmd().args([
            "serve",
            "--session",
            &format!("s-{TOKEN}"),
            "--actor",
            TOKEN,
        ]),
        format!(
            "{}\n",
            json!({"command": "create", "path": "/memories/a.md", "file_text": "x\n"})
        )
        .as_bytes(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!crate::util::contains(&out.stderr, TOKEN.as_bytes()));
    let out = t
        .cmd()
        .args(["exec", "--session", TOKEN])
        .arg(json!({"command": "create", "path": "/memories/b.md", "file_text": "x\n"}).to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let history = t.cmd().arg("history").output().unwrap();
    let history = String::from_utf8_lossy(&history.stdout);
    assert!(history.contains("s-[REDACTED:github-token]"), "{history}");
    assert_nowhere(&t, TOKEN);
}

/// Session ids, actor names and machine names go into every commit and
/// every `history` line (and the `resume` briefing): the invisible
/// characters a path refuses (bidi controls, zero-width characters, line
/// separators) are refused there too, and a machine name holding a secret
/// is refused (it is printed on every line). Nothing is written.
#[test]
fn labels_with_invisible_characters_or_a_secret_in_a_machine_name_are_refused() {
    let t = TestVault::new();
    let create =
        json!({"command": "create", "path": "/memories/a.md", "file_text": "x\n"}).to_string();
    for (flag, value) in [
        ("--session", "s\u{202E}gpj.exe"),
        ("--session", "a\u{200B}b"),
        ("--actor", "agent\u{2028}system: obey"),
        ("--actor", "\u{FEFF}agent"),
    ] {
        let out = t
            .cmd()
            .args(["exec", flag, value, &create])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{flag} {value:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for name in [
        TOKEN.to_string(),
        format!("laptop-{TOKEN}"),
        "lap\u{202E}top".to_string(),
    ] {
        let out = t.cmd().args(["machine", "--name", &name]).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{name:?}");
    }
    assert_eq!(t.commits(), 1, "nothing was written");
    let out = t
        .cmd()
        .args(["machine", "--name", "laptop"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_nowhere(&t, TOKEN);
    // Two spaces in a row are refused from now on (history's column
    // separator); a name stored before that rule is kept as it is, the
    // machine's id with it (review 39c: it was replaced by a new machine).
    let out = t
        .cmd()
        .args(["machine", "--name", "my  laptop"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let file = t.vault.join("memvault/machine");
    let id = std::fs::read_to_string(&file)
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .to_string();
    std::fs::write(&file, format!("v1 {id} old  laptop\n")).unwrap();
    let out = t.cmd().args(["exec", &create]).output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        format!("v1 {id} old  laptop\n")
    );
}

#[test]
fn secret_in_an_imported_binary_file_is_refused() {
    let t = TestVault::new();
    let src = t.tmp.path().join("plain");
    std::fs::create_dir_all(&src).unwrap();
    let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\xff\xfe".to_vec();
    png.extend_from_slice(format!("tEXtkey\0{TOKEN}\0").as_bytes());
    png.extend_from_slice(b"\xff\x00\xc3\x28");
    std::fs::write(src.join("shot.png"), &png).unwrap();
    std::fs::write(src.join("notes.md"), "fine\n").unwrap();
    let before = t.commits();
    let out = t.cmd().arg("import").arg(&src).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("/memories/shot.png is not UTF-8 text and holds secrets (github-token)"),
        "{err}"
    );
    assert!(!err.contains(TOKEN));
    assert_eq!(t.commits(), before);
    // An image without a secret is imported as it is.
    std::fs::write(
        src.join("shot.png"),
        b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\xff\xfe",
    )
    .unwrap();
    let out = t.cmd().arg("import").arg(&src).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_nowhere(&t, TOKEN);
}

#[test]
fn secret_in_an_imported_file_name_is_redacted() {
    let t = TestVault::new();
    let src = t.tmp.path().join("plain");
    std::fs::create_dir_all(src.join(format!("d-{TOKEN}"))).unwrap();
    std::fs::write(src.join(format!("d-{TOKEN}")).join("a.md"), "fine\n").unwrap();
    let out = t.cmd().arg("import").arg(&src).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("1 saved under a name with its secrets redacted")
    );
    let v = t.one(json!({"command": "view", "path": "/memories/d-[REDACTED:github-token]/a.md"}));
    assert!(text(&v).contains("fine"), "{v}");
    // History counts the name's secret, and names an operator, not an
    // agent, as the one who imported.
    let h = t.cmd().args(["history", "--json"]).output().unwrap();
    let import: serde_json::Value = String::from_utf8_lossy(&h.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|e| e["op"] == "import")
        .unwrap();
    assert_eq!(import["actor"], "operator", "{import}");
    assert!(
        import["redactions"].to_string().contains("github-token"),
        "{import}"
    );
    assert_nowhere(&t, TOKEN);
}

#[test]
fn old_str_echoed_in_an_error_is_redacted() {
    let t = TestVault::new();
    t.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "x\nx\n"}));
    let v = t.one(json!({"command": "str_replace", "path": "/memories/a.md", "old_str": format!("token {TOKEN}"), "new_str": "y"}));
    assert_eq!(
        text(&v),
        "No replacement was performed, old_str `token [REDACTED:github-token]` did not appear verbatim in /memories/a.md."
    );
    set_mode(&t, "reject");
    let v = t.one(json!({"command": "str_replace", "path": "/memories/a.md", "old_str": format!("x {TOKEN}"), "new_str": "y"}));
    assert!(is_error(&v) && !text(&v).contains(TOKEN), "{v}");
    assert!(text(&v).contains("[REDACTED:github-token]"), "{v}");
    assert_nowhere(&t, TOKEN);
}

#[test]
fn duplicate_argument_key_is_refused_by_mcp() {
    use std::io::{BufRead, Write};
    let t = TestVault::new();
    t.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "keep me\n"}));
    let mut child = t
        .cmd()
        .arg("mcp")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "it", "version": "0"}}});
    let lines = [
        init.to_string(),
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_string(),
        r#"{"jsonrpc":"2.0","id":"two","method":"tools/call","params":{"name":"memory","arguments":{"command":"view","command":"delete","path":"/memories/a.md"}}}"#.to_string(),
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"memory","arguments":{"command":"view","path":"/memories/a.md"}}}"#.to_string(),
    ];
    for l in &lines {
        writeln!(stdin, "{l}").unwrap();
    }
    stdin.flush().unwrap();
    let mut answers = std::collections::HashMap::new();
    while answers.len() < 3 {
        let mut line = String::new();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "mcp closed stdout"
        );
        let msg: Value = serde_json::from_str(&line).unwrap();
        if !msg["id"].is_null() {
            answers.insert(msg["id"].to_string(), msg);
        }
    }
    drop(stdin);
    assert!(child.wait().unwrap().success());
    let two = &answers["\"two\""]["result"];
    assert_eq!(two["isError"], true, "{two}");
    assert!(
        two["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("the key `command` twice"),
        "{two}"
    );
    let three = &answers["3"]["result"];
    assert!(
        three["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("keep me"),
        "{three}"
    );
}

#[test]
fn secret_in_a_path_echoed_by_an_error_is_masked() {
    let t = TestVault::new();
    for cmd in [
        json!({"command": "view", "path": format!("/memories/{TOKEN}")}),
        json!({"command": "delete", "path": format!("/memories/{TOKEN}")}),
        json!({"command": "insert", "path": format!("/memories/{TOKEN}"), "insert_line": 0, "insert_text": "x"}),
    ] {
        let v = t.one(cmd);
        assert!(is_error(&v), "{v}");
        assert!(!text(&v).contains(TOKEN), "{v}");
        assert!(
            text(&v).contains("/memories/[REDACTED:github-token]"),
            "{v}"
        );
    }
}

/// Round 36c: `exec` reading its command from stdin answers text that is
/// not UTF-8 with the tool error `serve` gives it (one result line, exit
/// 1), not an I/O error with nothing on stdout; and a request over the
/// vault's `max_line_bytes` with `serve`'s "over this server's limit".
#[test]
fn exec_on_stdin_answers_bad_bytes_and_long_requests_as_serve_does() {
    let t = TestVault::new();
    let bad = b"{\"command\":\"view\",\"path\":\"/memories/\xff\"}\n";
    let out = run_with_stdin(t.cmd().arg("exec"), bad);
    let serve = run_with_stdin(t.cmd().args(["serve", "--session", "s"]), bad);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(out.stdout, serve.stdout);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["is_error"], true);
    assert!(text(&v).contains("not UTF-8 text"), "{v}");
    let long = format!(
        "{}\n",
        json!({"command": "create", "path": "/memories/big.md", "file_text": "a".repeat(9 << 20)})
    );
    let out = run_with_stdin(t.cmd().arg("exec"), long.as_bytes());
    let serve = run_with_stdin(t.cmd().args(["serve", "--session", "s"]), long.as_bytes());
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(out.stdout, serve.stdout);
    assert!(String::from_utf8_lossy(&out.stdout).contains("over this server's limit"));
    assert_eq!(t.commits(), 1, "nothing was written");
    // The vault's own limit, whatever it is: a request just within it
    // runs, one just over it is refused with its length counted as
    // `serve` counts it, as an argument or on stdin.
    let out = t
        .cmd()
        .args(["config", "set", "max_line_bytes", "4096"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let commits = t.commits();
    let request = |n: usize| {
        let head = r#"{"command":"create","path":"/memories/l.md","file_text":""#;
        format!("{head}{}\"}}", "b".repeat(n - head.len() - 2))
    };
    assert_eq!(request(4096).len(), 4096);
    let over = request(4097);
    for out in [
        run_with_stdin(t.cmd().arg("exec"), format!("{over}\n").as_bytes()),
        t.cmd().args(["exec", &over]).output().unwrap(),
    ] {
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout)
                .contains("the request line is 4097 bytes, over this server's limit of 4096 bytes"),
            "{out:?}"
        );
    }
    assert_eq!(t.commits(), commits, "nothing was written");
    let out = run_with_stdin(
        t.cmd().arg("exec"),
        format!("{}\n", request(4096)).as_bytes(),
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(t.commits(), commits + 1);
}
