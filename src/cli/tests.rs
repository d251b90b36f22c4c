//! Handlers called in-process with buffers for stdout and stderr, on a
//! temporary vault made by the `keygen` and `init` handlers themselves.

use std::path::Path;

use super::config::ConfigCommand;
use super::history::HistoryArgs;
use super::{Command, Global, InitArgs, SessionArgs, handle};
use crate::crypto::KdfParams;

/// What one handler wrote, and its exit status.
struct Ran {
    code: u8,
    out: String,
    err: String,
}

fn run(global: &Global, command: Command) -> Ran {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = match handle(global, &command, &mut out, &mut err) {
        Ok(code) => code,
        Err(e) => panic!("{command:?} failed: {}", e.message),
    };
    Ran {
        code,
        out: String::from_utf8(out).unwrap(),
        err: String::from_utf8(err).unwrap(),
    }
}

/// A new vault in `dir`, unlocked by a key file beside it.
fn new_vault(dir: &Path) -> Global {
    let key = dir.join("vault.key");
    let global = Global {
        vault: Some(dir.join("vault")),
        key_file: Some(key.clone()),
        passphrase_file: None,
        remote_timeout: 300,
    };
    let made = run(&global, Command::Keygen { file: key });
    assert!(made.err.starts_with("memvault: wrote a new key file"));
    let init = InitArgs {
        argon2_memory: KdfParams::DEFAULT.m_kib,
        argon2_passes: KdfParams::DEFAULT.t,
        argon2_lanes: KdfParams::DEFAULT.p,
        overwrite_on_create: false,
    };
    let created = run(&global, Command::Init(init));
    assert!(created.out.is_empty(), "{}", created.out);
    assert!(created.err.starts_with("memvault: created a vault at"));
    global
}

fn exec(global: &Global, input: serde_json::Value) -> Ran {
    let session = SessionArgs {
        session: Some("s-test".into()),
        actor: "tester".into(),
    };
    run(
        global,
        Command::Exec {
            session,
            json: Some(input.to_string()),
        },
    )
}

fn history(limit: Option<usize>) -> Command {
    Command::History(HistoryArgs {
        path: None,
        session: None,
        actor: None,
        principal: None,
        op: None,
        since: None,
        until: None,
        limit,
        json: false,
    })
}

#[test]
fn history_handler_writes_one_line_per_change_to_its_sink() {
    let tmp = tempfile::tempdir().unwrap();
    let global = new_vault(tmp.path());
    let created = exec(
        &global,
        serde_json::json!({"command": "create", "path": "/memories/a.md", "file_text": "one\ntwo\n"}),
    );
    assert_eq!(created.code, 0, "{}", created.out);
    assert!(
        created.out.contains("File created successfully"),
        "{}",
        created.out
    );

    let ran = run(&global, history(None));
    assert_eq!(ran.code, 0);
    assert!(ran.err.is_empty(), "{}", ran.err);
    let lines: Vec<&str> = ran.out.lines().collect();
    assert_eq!(lines.len(), 2, "{}", ran.out);
    let fields: Vec<&str> = lines[0].split("  ").collect();
    assert_eq!(fields[0].len(), 12);
    assert!(fields[0].bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(
        &fields[2..6],
        ["s-test", "tester", "create", "/memories/a.md"]
    );
    assert!(lines[0].contains("  8B  +2 -0  on "), "{}", lines[0]);
    assert!(lines[1].contains("  init  memvault  init"), "{}", lines[1]);

    let newest = run(&global, history(Some(1)));
    assert_eq!(newest.out.lines().collect::<Vec<_>>(), [lines[0]]);
}

#[test]
fn config_handlers_read_and_change_a_setting_through_their_sinks() {
    let tmp = tempfile::tempdir().unwrap();
    let global = new_vault(tmp.path());
    let get = |key: &str| {
        run(
            &global,
            Command::Config(ConfigCommand::Get {
                key: Some(key.into()),
            }),
        )
    };
    let before = get("max_files");
    assert_eq!(before.out, "100000\n");
    assert!(before.err.is_empty(), "{}", before.err);
    assert_eq!(get("redaction.mode").out, "\"redact\"\n");

    let set = run(
        &global,
        Command::Config(ConfigCommand::Set {
            key: "max_files".into(),
            value: "123".into(),
            actor: "tester".into(),
        }),
    );
    assert_eq!(set.code, 0);
    assert!(set.out.is_empty(), "{}", set.out);
    assert!(
        set.err.starts_with("memvault: set max_files"),
        "{}",
        set.err
    );
    assert_eq!(get("max_files").out, "123\n");
    let newest = run(&global, history(Some(1)));
    assert!(
        newest.out.contains("  tester  config  setting max_files"),
        "{}",
        newest.out
    );
}
