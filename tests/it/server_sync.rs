//! `memvault server --sync` and moving a tenant between two servers
//! through its git remote (`tenant remote`, `tenant sync`, `tenant
//! export-key`, `tenant add --clone`): real servers on loopback, a real
//! bare repository as the remote.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

use super::server::{Root, tenant_cmd};
use crate::util::bin;

fn note(i: usize) -> (String, String) {
    (
        format!("/memories/notes/n{i}.md"),
        format!("note {i}: written through the server\n"),
    )
}

fn commits(hub: &Path) -> usize {
    let out = Command::new("git")
        .arg("--git-dir")
        .arg(hub)
        .args(["rev-list", "--count", "refs/heads/main"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// A bare git repository at `path`, to be a tenant's remote.
fn bare_repo(path: &Path) {
    let init = Command::new("git")
        .args(["init", "-q", "--bare"])
        .arg(path)
        .output()
        .unwrap();
    assert!(init.status.success());
}

fn tenant(root: &Root, args: &[&str]) -> std::process::Output {
    root.tenant()
        .args(args)
        .arg("--root")
        .arg(&root.root)
        .output()
        .unwrap()
}

/// A tenant's vault is pushed by the server itself (`--sync`), then moved
/// to a second server while the first keeps serving another tenant: every
/// write acknowledged by either server is in the moved vault, and in the
/// remote after the second server's graceful stop; the first server no
/// longer knows the tenant's token.
#[test]
fn a_tenant_moves_between_two_servers_through_its_remote_without_losing_a_write() {
    let a = Root::new(&[("ana", "memory,audit"), ("bo", "memory")]);
    let b = Root::new(&[]);
    let hub = a.tmp.path().join("hub.git");
    bare_repo(&hub);
    let o = tenant(&a, &["remote", "ana", hub.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // A remote for a tenant that does not exist: refused.
    let o = tenant(&a, &["remote", "nobody", hub.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let server_a = a.start(&["--sync", "origin", "--sync-every", "1s"]);
    let ana_a = a.tokens["ana"].clone();
    let bo = a.tokens["bo"].clone();
    for i in 0..20 {
        let (path, text) = note(i);
        let r = server_a.memory(
            &ana_a,
            json!({"command": "create", "path": path, "file_text": text}),
        );
        assert_eq!(r["is_error"], false, "{r}");
    }
    // The server pushes them itself: init and 20 creates reach the hub.
    let deadline = Instant::now() + Duration::from_secs(60);
    while commits(&hub) < 21 {
        assert!(
            Instant::now() < deadline,
            "the server did not push: {}",
            server_a.stderr.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // More writes, then the move: the router stops sending ana's requests
    // to A, the operator syncs ana's vault beside the running server and
    // hands its key to B.
    for i in 20..30 {
        let (path, text) = note(i);
        server_a.memory(
            &ana_a,
            json!({"command": "create", "path": path, "file_text": text}),
        );
    }
    let o = tenant(&a, &["sync", "ana", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let key = b.tmp.path().join("ana.key");
    let o = tenant(&a, &["export-key", "ana", "--out", key.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Never over an existing file.
    let o = tenant(&a, &["export-key", "ana", "--out", key.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let o = tenant(
        &b,
        &[
            "add",
            "ana",
            "--scopes",
            "memory,audit",
            "--clone",
            hub.to_str().unwrap(),
            "--vault-key-file",
            key.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ana_b = String::from_utf8(o.stdout).unwrap().trim().to_string();
    assert!(ana_b.starts_with("mvt_"), "{ana_b}");
    // A forgets ana and keeps serving bo.
    let o = tenant(&a, &["remove", "ana"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(server_a.view_status(&ana_a), 401);
    assert_eq!(server_a.view_status(&bo), 200);
    let server_b = b.start(&["--sync", "origin", "--sync-every", "1h"]);
    for i in 30..35 {
        let (path, text) = note(i);
        server_b.memory(
            &ana_b,
            json!({"command": "create", "path": path, "file_text": text}),
        );
    }
    // Every write, A's and B's, is in ana's vault on B.
    for i in 0..35 {
        let (path, text) = note(i);
        let r = server_b.memory(&ana_b, json!({"command": "view", "path": path}));
        assert!(
            r["content"]
                .as_str()
                .unwrap_or_default()
                .contains(text.trim_end()),
            "{path}: {r}"
        );
    }
    // History moved with it: the changes made on A, and B's.
    let (status, h) = server_b.req("GET", "/v1/history", Some(&ana_b), "");
    assert_eq!(status, 200, "{h}");
    let h = h.to_string();
    assert!(
        h.contains("/memories/notes/n0.md") && h.contains("/memories/notes/n34.md"),
        "{h}"
    );
    // A graceful stop of B pushes what it acknowledged last.
    let before = commits(&hub);
    assert!(server_b.stop().success());
    assert!(
        commits(&hub) >= before + 5,
        "B's last writes were not pushed"
    );
    // A fresh clone of the hub holds all 35 notes and verifies.
    let check = b.tmp.path().join("check");
    let o = Command::new(bin())
        .args(["clone", hub.to_str().unwrap(), "--vault"])
        .arg(&check)
        .arg("--key-file")
        .arg(&key)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for i in 0..35 {
        let (path, text) = note(i);
        let o = tenant_cmd(&key)
            .arg("--vault")
            .arg(&check)
            .args([
                "exec",
                &json!({"command": "view", "path": path}).to_string(),
            ])
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&o.stdout).contains(text.trim_end()),
            "{path}: {}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
    let v = tenant_cmd(&key)
        .arg("--vault")
        .arg(&check)
        .arg("verify")
        .output()
        .unwrap();
    assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stdout));
    drop(server_a);
}

/// Usage errors of the new options are code 2; a clone from a remote that
/// holds no vault, or with the wrong key, is refused and registers
/// nothing.
#[test]
fn a_tenant_clone_that_fails_registers_nothing() {
    let a = Root::new(&[("ana", "memory")]);
    let hub = a.tmp.path().join("empty.git");
    bare_repo(&hub);
    let key = a.tmp.path().join("other.key");
    crate::util::keygen(&key);
    let o = tenant(
        &a,
        &[
            "add",
            "cy",
            "--clone",
            hub.to_str().unwrap(),
            "--vault-key-file",
            key.to_str().unwrap(),
        ],
    );
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.stdout.is_empty());
    let list = String::from_utf8(tenant(&a, &["list"]).stdout).unwrap();
    assert!(!list.contains("cy"), "{list}");
    // --clone without its key file, or with two names: usage.
    let o = tenant(&a, &["add", "cy", "--clone", hub.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let o = tenant(
        &a,
        &[
            "add",
            "cy",
            "dee",
            "--clone",
            hub.to_str().unwrap(),
            "--vault-key-file",
            key.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    // Another tenant's vault directory as the source: refused (it became
    // the clone's remote, which no sync can push to; round 41c).
    let ana_dir = std::fs::read_dir(a.root.join("tenants"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_dir())
        .unwrap();
    let o = tenant(
        &a,
        &[
            "add",
            "cy",
            "--clone",
            ana_dir.to_str().unwrap(),
            "--vault-key-file",
            key.to_str().unwrap(),
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("vault's own directory"), "{err}");
    let list = String::from_utf8(tenant(&a, &["list"]).stdout).unwrap();
    assert!(!list.contains("cy"), "{list}");
    let o = tenant(&a, &["sync", "ana"]);
    assert_eq!(o.status.code(), Some(1), "no remote origin");
    let o = Command::new(bin())
        .args(["server", "--root"])
        .arg(&a.root)
        .args(["--sync-every", "5m"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "--sync-every needs --sync");
}

/// `tenant remove` of a tenant whose remote lacks some of its changes
/// (written after its last sync, e.g. by a server still serving it during
/// a move) is refused and removes nothing; after a sync it goes through;
/// `--force` removes it anyway.
#[test]
fn tenant_remove_refuses_while_a_remote_lacks_its_changes_unless_forced() {
    let a = Root::new(&[("ana", "memory"), ("bo", "memory")]);
    let hub = a.tmp.path().join("hub.git");
    let hub_bo = a.tmp.path().join("hub-bo.git");
    for h in [&hub, &hub_bo] {
        bare_repo(h);
    }
    for (t, h) in [("ana", &hub), ("bo", &hub_bo)] {
        let o = tenant(&a, &["remote", t, h.to_str().unwrap()]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let server = a.start(&[]);
    let (ana, bo) = (a.tokens["ana"].clone(), a.tokens["bo"].clone());
    let write = |token: &str, i: usize| {
        let (path, text) = note(i);
        let r = server.memory(
            token,
            json!({"command": "create", "path": path, "file_text": text}),
        );
        assert_eq!(r["is_error"], false, "{r}");
    };
    // `tenant list` says what each vault stores and whether its remote
    // holds every change.
    let listed = |name: &str| {
        let o = tenant(&a, &["list", "--json"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|t| t["name"] == name)
            .unwrap()
    };
    let holds = |t: &serde_json::Value| t["remotes"][0]["holds_every_change"].as_bool().unwrap();
    let before = listed("ana");
    assert!(!holds(&before), "never synced: {before}");
    write(&ana, 0);
    let o = tenant(&a, &["sync", "ana"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let synced = listed("ana");
    assert!(holds(&synced), "{synced}");
    assert_eq!(synced["remotes"][0]["name"], "origin");
    assert!(
        synced["stored_bytes"].as_u64().unwrap() > before["stored_bytes"].as_u64().unwrap(),
        "{before} {synced}"
    );
    // Written after the sync: the remote lacks it.
    write(&ana, 1);
    assert!(!holds(&listed("ana")));
    // A URL refused for the remote changes nothing: ana keeps hers, which
    // still guards the removal below (it was removed before the new one
    // was checked, and a plain `remove` then erased an unsynced write;
    // round 41c). A fragment is refused, and not echoed.
    for bad in [
        "http://example.com/typo.git",
        "https://example.com/x.git#glpat-abcdefghijklmnop",
    ] {
        let o = tenant(&a, &["remote", "ana", bad]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{bad}: {err}");
        assert!(!err.contains("glpat"), "{err}");
        let kept = listed("ana");
        assert_eq!(kept["remotes"][0]["name"], "origin", "{bad}: {kept}");
        assert!(!holds(&kept));
    }
    // Ana's URL given to bo too: bo's first sync says the remote holds
    // another vault, not that it was tampered with; bo's own URL back.
    let o = tenant(&a, &["remote", "bo", hub.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = tenant(&a, &["sync", "bo"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("it holds another vault's history"), "{err}");
    let o = tenant(&a, &["remote", "bo", hub_bo.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8(tenant(&a, &["list"]).stdout).unwrap();
    let line = text.lines().find(|l| l.starts_with("ana ")).unwrap();
    assert!(
        line.contains("remote origin lacks changes made since its last sync")
            && line.contains(" bytes, no quota"),
        "{text}"
    );
    let o = tenant(&a, &["remove", "ana"]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("has not received") && err.contains("Nothing was removed"),
        "{err}"
    );
    assert_eq!(server.view_status(&ana), 200, "ana is still served");
    // Synced again: nothing is missing there, and the removal goes through.
    let o = tenant(&a, &["sync", "ana"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(commits(&hub), 3, "init and both creates are on the remote");
    let o = tenant(&a, &["remove", "ana"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(server.view_status(&ana), 401);
    // A remote never synced lacks everything; --force removes anyway.
    write(&bo, 2);
    let o = tenant(&a, &["remove", "bo"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = tenant(&a, &["remove", "bo", "--force"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(server.view_status(&bo), 401);
}

/// A tenant whose sync fails is named in the server's stderr by its id
/// (which `tenant list` maps to its name), never by its name, remote or
/// path; the others' syncs go on.
#[test]
fn a_failed_tenant_sync_is_logged_by_tenant_id_only() {
    let a = Root::new(&[("ana", "memory"), ("bo", "memory")]);
    let hub = a.tmp.path().join("hub.git");
    bare_repo(&hub);
    let missing = a.tmp.path().join("no-such-remote.git");
    for (t, h) in [("ana", &missing), ("bo", &hub)] {
        let o = tenant(&a, &["remote", t, h.to_str().unwrap()]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let list = tenant(&a, &["list", "--json"]);
    let ids: Vec<(String, String)> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["name"].as_str().unwrap().to_string(),
                v["id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let id_of = |n: &str| ids.iter().find(|(name, _)| name == n).unwrap().1.clone();
    let server = a.start(&["--sync", "origin", "--sync-every", "1s"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let err = server.stderr.lock().unwrap().clone();
        if err.contains("failed, tenant ids") {
            assert!(err.contains(&id_of("ana")), "{err}");
            assert!(!err.contains(&id_of("bo")), "{err}");
            assert!(
                !err.contains("ana") && !err.contains("no-such-remote"),
                "{err}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "no failed sync logged: {err}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(commits(&hub) >= 1, "bo's vault was pushed");
    // /healthz (no token) counts the last round: one synced, one failed,
    // no tenant named.
    let (status, v) = server.req("GET", "/healthz", None, "");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(
        (v["sync"]["synced"].clone(), v["sync"]["failed"].clone()),
        (json!(1), json!(1)),
        "{v}"
    );
    assert!(
        v["sync"]["last_round"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{v}"
    );
    let text = v.to_string();
    assert!(
        !text.contains(&id_of("ana")) && !text.contains("ana"),
        "{v}"
    );
}

/// `config set` on a tenant's vault while the server has it open holds
/// from the server's next request on that vault (the server read the
/// settings when it opened the vault).
#[test]
fn a_settings_change_on_a_tenant_vault_holds_for_the_running_server() {
    let r = Root::new(&[("ana", "memory")]);
    let s = r.start(&[]);
    let token = r.tokens["ana"].clone();
    let secret = json!({"command": "create", "path": "/memories/a.md", "file_text": "password = Hunter2!xyzQ\n"});
    let first = s.memory(&token, json!({"command": "view", "path": "/memories"}));
    assert_eq!(first["is_error"], false, "{first}");
    let key = r.tmp.path().join("ana.key");
    let o = tenant(&r, &["export-key", "ana", "--out", key.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let dir = std::fs::read_dir(r.root.join("tenants"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_dir())
        .unwrap();
    let o = std::process::Command::new(bin())
        .arg("--vault")
        .arg(&dir)
        .arg("--key-file")
        .arg(&key)
        .env_remove("MEMVAULT_DIR")
        .env_remove("MEMVAULT_KEY_FILE")
        .args(["config", "set", "redaction.mode", "reject"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r2 = s.memory(&token, secret);
    assert_eq!(r2["is_error"], true, "a secret in reject mode: {r2}");
    let v = s.memory(&token, json!({"command": "view", "path": "/memories/a.md"}));
    assert_eq!(v["is_error"], true, "it was written: {v}");
}

/// A round of `server --sync` leaves a vault another process holds locked
/// for the next round rather than waiting for it (the round would stall
/// every tenant after it); `/healthz` counts it as busy, and the next
/// round after the lock goes syncs it.
#[test]
fn a_sync_round_passes_over_a_vault_held_locked_and_takes_it_next_time() {
    let a = Root::new(&[("ana", "memory"), ("bo", "memory")]);
    let (hub_a, hub_b) = (a.tmp.path().join("a.git"), a.tmp.path().join("b.git"));
    bare_repo(&hub_a);
    bare_repo(&hub_b);
    for (t, h) in [("ana", &hub_a), ("bo", &hub_b)] {
        let o = tenant(&a, &["remote", t, h.to_str().unwrap()]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let ana = a.ids()["ana"].clone();
    let held =
        std::fs::File::open(a.root.join("tenants").join(&ana).join("memvault/lock")).unwrap();
    held.lock().unwrap();
    let server = a.start(&["--sync", "origin", "--sync-every", "1s"]);
    let round = |want: &dyn Fn(&serde_json::Value) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, v) = server.req("GET", "/healthz", None, "");
            if want(&v["sync"]) {
                return v;
            }
            assert!(Instant::now() < deadline, "no such round: {v}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let v = round(&|s| s["busy"] == 1 && s["synced"] == 1);
    assert_eq!(v["sync"]["failed"], 0, "{v}");
    assert!(commits(&hub_b) >= 1 && commits(&hub_a) == 0);
    assert!(
        server
            .stderr
            .lock()
            .unwrap()
            .contains("left for the next round")
    );
    drop(held);
    round(&|s| s["busy"] == 0 && s["synced"] == 2);
    assert!(commits(&hub_a) >= 1, "ana's vault was pushed once free");
}
