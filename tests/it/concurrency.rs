//! Several processes writing one vault at once lose nothing.

use std::process::Stdio;

use serde_json::json;

use crate::util::*;

#[test]
fn four_writers_making_100_mutations_each_lose_none() {
    let v = TestVault::new();
    let writers = 4;
    let per = 100;
    let mut children = Vec::new();
    for w in 0..writers {
        let mut input = String::new();
        for i in 0..per {
            // Alternate creates and edits of a file shared by all writers,
            // so the writers really contend for the same tree.
            let cmd = if i % 4 == 3 {
                json!({"command": "insert", "path": "/memories/shared.log", "insert_line": 0,
                       "insert_text": format!("w{w} line {i}")})
            } else {
                json!({"command": "create", "path": format!("/memories/w{w}/n{i:03}.md"),
                       "file_text": format!("writer {w} note {i}\n")})
            };
            input.push_str(&cmd.to_string());
            input.push('\n');
        }
        let mut cmd = v.cmd();
        cmd.args(["serve", "--session", &format!("writer-{w}")])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        children.push((cmd, input));
    }
    // The shared file must exist before writers insert into it.
    let first =
        v.one(json!({"command": "create", "path": "/memories/shared.log", "file_text": ""}));
    assert!(!is_error(&first));
    let handles: Vec<_> = children
        .into_iter()
        .map(|(mut cmd, input)| {
            std::thread::spawn(move || run_with_stdin(&mut cmd, input.as_bytes()))
        })
        .collect();
    for h in handles {
        let out = h.join().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let results = parse_lines(&out.stdout);
        assert_eq!(results.len(), per);
        for r in &results {
            assert!(!is_error(r), "{r}");
        }
    }
    assert_eq!(v.commits(), 1 + 1 + writers * per);
    // Every note is there, and the shared file has every writer's lines.
    let listing = v.one(json!({"command": "view", "path": "/memories/shared.log"}));
    let shared = text(&listing);
    for w in 0..writers {
        for i in (0..per).filter(|i| i % 4 == 3) {
            assert!(
                shared.contains(&format!("\tw{w} line {i}\n"))
                    || shared.ends_with(&format!("\tw{w} line {i}")),
                "lost w{w} line {i}"
            );
        }
        let mut reqs = Vec::new();
        for i in (0..per).filter(|i| i % 4 != 3) {
            reqs.push(
                json!({"command": "view", "path": format!("/memories/w{w}/n{i:03}.md")})
                    .to_string(),
            );
        }
        for (r, i) in v.serve(&reqs).iter().zip((0..per).filter(|i| i % 4 != 3)) {
            assert_eq!(
                text(r),
                format!(
                    "Here's the content of /memories/w{w}/n{i:03}.md with line numbers:\n     1\twriter {w} note {i}"
                )
            );
        }
    }
}
