//! Creating and unlocking vaults: key files, passphrases, wrong secrets.

use std::process::Command;

use crate::util::*;

fn plain_cmd() -> Command {
    let mut c = Command::new(bin());
    c.env_remove("MEMVAULT_DIR")
        .env_remove("MEMVAULT_KEY_FILE")
        .env_remove("MEMVAULT_PASSPHRASE");
    c
}

const VIEW: &str = r#"{"command":"view","path":"/memories"}"#;

#[test]
fn passphrase_vault_opens_with_the_right_passphrase_only() {
    let tmp = tempfile::tempdir().unwrap();
    let vault = tmp.path().join("v");
    let out = plain_cmd()
        .arg("--vault")
        .arg(&vault)
        .args(["init", "--argon2-memory", "64", "--argon2-passes", "1"])
        .env("MEMVAULT_PASSPHRASE", "correct horse battery staple")
        .output()
        .unwrap();
    ok(&out);

    let ok = plain_cmd()
        .arg("--vault")
        .arg(&vault)
        .args(["exec", VIEW])
        .env("MEMVAULT_PASSPHRASE", "correct horse battery staple")
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );

    let pf = tmp.path().join("pass.txt");
    std::fs::write(&pf, "correct horse battery staple\n").unwrap();
    let ok = plain_cmd()
        .arg("--vault")
        .arg(&vault)
        .arg("--passphrase-file")
        .arg(&pf)
        .args(["exec", VIEW])
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "passphrase file: {}",
        String::from_utf8_lossy(&ok.stderr)
    );

    let bad = plain_cmd()
        .arg("--vault")
        .arg(&vault)
        .args(["exec", VIEW])
        .env("MEMVAULT_PASSPHRASE", "wrong horse")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(1));
    assert!(bad.stdout.is_empty(), "nothing on stdout for a failure");
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("does not unlock this vault"), "{err}");
    assert!(!err.contains("wrong horse"));
}

#[test]
fn wrong_key_file_is_refused() {
    let v = TestVault::new();
    let other = v.tmp.path().join("other.key");
    assert!(
        plain_cmd()
            .arg("keygen")
            .arg(&other)
            .status()
            .unwrap()
            .success()
    );
    let out = plain_cmd()
        .arg("--vault")
        .arg(&v.vault)
        .arg("--key-file")
        .arg(&other)
        .args(["exec", VIEW])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not unlock this vault"));
    // A passphrase cannot open a key-file-only vault either, without work.
    let out = plain_cmd()
        .arg("--vault")
        .arg(&v.vault)
        .args(["exec", VIEW])
        .env("MEMVAULT_PASSPHRASE", "anything")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no keyslot of that kind"));
}

#[test]
fn no_secret_and_no_terminal_is_a_clear_error_not_a_hang() {
    let v = TestVault::new();
    let out = plain_cmd()
        .arg("--vault")
        .arg(&v.vault)
        .args(["exec", VIEW])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    // (setsid is not used: under a test harness there may be a terminal;
    // skip the assertion then.)
    if std::fs::File::open("/dev/tty").is_err() {
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("no secret to unlock the vault"), "{err}");
    }
}

#[test]
fn key_file_via_environment_and_default_vault_location() {
    let v = TestVault::new();
    let out = plain_cmd()
        .env("MEMVAULT_DIR", &v.vault)
        .env("MEMVAULT_KEY_FILE", &v.key)
        .args(["exec", VIEW])
        .output()
        .unwrap();
    ok(&out);
}

#[test]
fn keygen_writes_mode_0600_and_never_overwrites() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let key = tmp.path().join("k");
    assert!(
        plain_cmd()
            .arg("keygen")
            .arg(&key)
            .status()
            .unwrap()
            .success()
    );
    let meta = std::fs::metadata(&key).unwrap();
    assert_eq!(meta.len(), 32);
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let first = std::fs::read(&key).unwrap();
    let again = plain_cmd().arg("keygen").arg(&key).output().unwrap();
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("never overwrites"));
    assert_eq!(std::fs::read(&key).unwrap(), first);
}

#[test]
fn init_refuses_an_existing_vault_and_open_refuses_a_missing_one() {
    let v = TestVault::new();
    let again = v.cmd().arg("init").output().unwrap();
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("not an empty directory"));
    let missing = plain_cmd()
        .arg("--vault")
        .arg(v.tmp.path().join("nowhere"))
        .arg("--key-file")
        .arg(&v.key)
        .args(["exec", VIEW])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("memvault init"));
}

#[test]
fn usage_errors_exit_2() {
    let out = plain_cmd().arg("frobnicate").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = plain_cmd()
        .args(["init", "--argon2-memory", "notanumber"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn hostile_argon2_parameters_are_refused_before_any_work() {
    let tmp = tempfile::tempdir().unwrap();
    let out = plain_cmd()
        .arg("--vault")
        .arg(tmp.path().join("v"))
        .args([
            "init",
            "--argon2-memory",
            "4294967295",
            "--argon2-passes",
            "1000000",
        ])
        .env("MEMVAULT_PASSPHRASE", "x")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Argon2"));
    assert!(!tmp.path().join("v").exists());
}

/// Where the secret comes from, when more than one is given, and files
/// that are not one secret: a flag beats the environment, both flags are
/// a usage error, a passphrase file of several lines and a key file that
/// is a FIFO are refused (the FIFO at once, not after a hang).
#[test]
fn secret_sources_flags_beat_the_environment_and_odd_files_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let vault = tmp.path().join("v");
    let pf = tmp.path().join("pass.txt");
    std::fs::write(&pf, "correct horse battery staple\r\n").unwrap();
    let out = plain_cmd()
        .arg("--vault")
        .arg(&vault)
        .arg("--passphrase-file")
        .arg(&pf)
        .args(["init", "--argon2-memory", "64", "--argon2-passes", "1"])
        .output()
        .unwrap();
    ok(&out);
    let wrong = tmp.path().join("wrong.key");
    keygen(&wrong);
    let run = |args: &[&std::ffi::OsStr], env_key: Option<&std::path::Path>| {
        let mut c = plain_cmd();
        c.arg("--vault").arg(&vault).args(args).args(["exec", VIEW]);
        if let Some(k) = env_key {
            c.env("MEMVAULT_KEY_FILE", k);
        }
        let out = c.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let pf_args = [std::ffi::OsStr::new("--passphrase-file"), pf.as_os_str()];
    // --passphrase-file given: MEMVAULT_KEY_FILE (a wrong key) is not used.
    let (code, err) = run(&pf_args, Some(&wrong));
    assert_eq!(code, Some(0), "{err}");
    // Both flags: a usage error.
    let both = [
        std::ffi::OsStr::new("--passphrase-file"),
        pf.as_os_str(),
        std::ffi::OsStr::new("--key-file"),
        wrong.as_os_str(),
    ];
    let (code, err) = run(&both, None);
    assert_eq!(code, Some(2), "{err}");
    // A passphrase file of two lines: refused, whichever line is right.
    let two = tmp.path().join("two.txt");
    std::fs::write(&two, "correct horse battery staple\nsecond line\n").unwrap();
    let (code, err) = run(
        &[std::ffi::OsStr::new("--passphrase-file"), two.as_os_str()],
        None,
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("more than one line"), "{err}");
    assert!(!err.contains("correct horse"), "{err}");
    // A FIFO as the key file, with no writer: refused at once.
    let fifo = tmp.path().join("fifo.key");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let started = std::time::Instant::now();
    let mut child = plain_cmd()
        .arg("--vault")
        .arg(&vault)
        .arg("--key-file")
        .arg(&fifo)
        .args(["exec", VIEW])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert_eq!(status.code(), Some(1));
            break;
        }
        if started.elapsed() > std::time::Duration::from_secs(20) {
            child.kill().unwrap();
            panic!("a FIFO key file hung the command");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let err = std::io::read_to_string(child.stderr.take().unwrap()).unwrap();
    assert!(err.contains("not a regular file"), "{err}");
}

/// A key file for a new slot must look like `memvault keygen`'s 32 random
/// bytes: 32 typed characters (a password saved without a line end) or
/// one repeated byte are refused by `init` and `key add`, changing
/// nothing; a passphrase file readable by others is warned about, as a
/// key file is.
#[test]
fn weak_key_files_get_no_slot_and_open_passphrase_files_are_warned_about() {
    let tmp = tempfile::tempdir().unwrap();
    let typed = tmp.path().join("typed.key");
    std::fs::write(&typed, "abcdefghijklmnopqrstuvwxyz012345").unwrap();
    let zeros = tmp.path().join("zeros.key");
    std::fs::write(&zeros, [0u8; 32]).unwrap();
    for (key, says) in [
        (&typed, "typed characters"),
        (&zeros, "a few values repeated"),
    ] {
        std::fs::set_permissions(key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let dir = tmp.path().join("v");
        let o = plain_cmd()
            .arg("--vault")
            .arg(&dir)
            .arg("--key-file")
            .arg(key)
            .arg("init")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            err.contains(says) && err.contains("memvault keygen"),
            "{err}"
        );
        assert!(!dir.exists(), "a refused init left a vault");
        let v = TestVault::new();
        let o = v
            .cmd()
            .args(["key", "add", "--new-key-file"])
            .arg(key)
            .output()
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(1),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let list = String::from_utf8_lossy(&v.cmd().args(["key", "list"]).output().unwrap().stdout)
            .into_owned();
        assert_eq!(
            list.lines().filter(|l| l.contains("key-file")).count(),
            1,
            "{list}"
        );
    }
    let pass = tmp.path().join("pass.txt");
    std::fs::write(&pass, "a passphrase\n").unwrap();
    std::fs::set_permissions(&pass, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let o = plain_cmd()
        .arg("--vault")
        .arg(tmp.path().join("pv"))
        .arg("--passphrase-file")
        .arg(&pass)
        .args(["init", "--argon2-memory", "64", "--argon2-passes", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("is readable by other users; run `chmod 600`"),
        "{err}"
    );
}
