//! Malformed protocol input: one error result per line, and the server
//! keeps serving.

use serde_json::json;

use crate::util::*;

#[test]
fn malformed_lines_each_get_one_error_and_change_nothing() {
    let v = TestVault::new();
    let big = format!(
        "{{\"command\":\"create\",\"path\":\"/memories/big.txt\",\"file_text\":\"{}\"}}",
        "A".repeat(50 * 1024 * 1024)
    );
    let lines = vec![
        "this is not json".to_string(),
        "{\"command\": \"view\", \"path\": ".to_string(),
        "[]".to_string(),
        "42".to_string(),
        json!({"command": "explode", "path": "/memories"}).to_string(),
        json!({"path": "/memories"}).to_string(),
        json!({"command": "create", "path": "/memories/x.txt"}).to_string(),
        json!({"command": "create", "path": 7, "file_text": "x"}).to_string(),
        json!({"command": "insert", "path": "/memories/x.txt", "insert_line": "two", "insert_text": "x"}).to_string(),
        json!({"command": "view", "path": "/memories", "view_range": "all"}).to_string(),
        json!({"type": "tool_use", "id": "toolu_9", "name": "memory"}).to_string(),
        json!({"type": "tool_use", "id": "toolu_8", "name": "bash", "input": {"command": "ls"}}).to_string(),
        big,
        "\u{0}\u{1}binary\u{7f}".to_string(),
        json!({"type": "tool_use", "id": "toolu_ok", "name": "memory", "input": {"command": "view", "path": "/memories"}}).to_string(),
    ];
    let out = v.serve(&lines);
    assert_eq!(out.len(), lines.len(), "one answer per line");
    for (i, o) in out[..lines.len() - 1].iter().enumerate() {
        assert!(is_error(o), "line {i} should be an error: {o}");
        assert!(text(o).len() < 400, "error for line {i} is too long");
    }
    assert!(text(&out[0]).contains("not valid JSON"));
    assert!(text(&out[4]).contains("explode"));
    assert!(text(&out[6]).contains("file_text"));
    assert!(text(&out[7]).contains("path"));
    assert!(text(&out[8]).contains("insert_line"));
    assert_eq!(out[10]["tool_use_id"], "toolu_9");
    assert_eq!(out[11]["tool_use_id"], "toolu_8");
    assert!(text(&out[12]).contains("limit"), "{}", text(&out[12]));
    let last = out.last().unwrap();
    assert!(!is_error(last));
    assert_eq!(last["tool_use_id"], "toolu_ok");
    assert!(text(last).ends_with("0B\t/memories"));
    assert_eq!(v.commits(), 1, "no bad line made a commit");
}

#[test]
fn exec_runs_one_command_from_argument_or_stdin() {
    let v = TestVault::new();
    let out = v
        .cmd()
        .args([
            "exec",
            r#"{"command":"create","path":"/memories/e.txt","file_text":"via exec\n"}"#,
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let lines = parse_lines(&out.stdout);
    assert_eq!(lines.len(), 1);
    assert_eq!(
        text(&lines[0]),
        "File created successfully at: /memories/e.txt"
    );
    let out = run_with_stdin(
        v.cmd().arg("exec"),
        br#"{"type":"tool_use","id":"toolu_x","name":"memory","input":{"command":"view","path":"/memories/nope"}}"#,
    );
    assert_eq!(out.status.code(), Some(1), "an error result exits 1");
    let lines = parse_lines(&out.stdout);
    assert_eq!(lines[0]["tool_use_id"], "toolu_x");
    assert_eq!(lines[0]["is_error"], true);
}

#[test]
fn end_of_input_ends_serve_with_status_0_and_stdout_holds_only_results() {
    let v = TestVault::new();
    let out = run_with_stdin(v.cmd().arg("serve"), b"");
    assert!(out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("session s-"),
        "a generated session id is announced on stderr: {err}"
    );
}

/// A client that stops reading results: `serve` ends with status 1 and
/// says so on stderr (a supervisor can tell it from the end of input);
/// the request it ran is kept, and nothing after it was read.
#[test]
fn serve_whose_stdout_reader_is_gone_fails_and_says_so() {
    use std::io::Write;
    let v = TestVault::new();
    let mut child = v
        .cmd()
        .arg("serve")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let mut stdin = child.stdin.take().unwrap();
    let line =
        serde_json::json!({"command": "create", "path": "/memories/ran.md", "file_text": "x\n"});
    let _ = writeln!(stdin, "{line}");
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("closed its end of stdout"), "{err}");
    let r = v.one(serde_json::json!({"command": "view", "path": "/memories/ran.md"}));
    assert!(!is_error(&r), "{r}");
}
