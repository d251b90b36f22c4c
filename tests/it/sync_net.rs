//! Sync over real network transports on loopback: OpenSSH's `sshd`
//! (throwaway host and user keys, reached through an ssh config host
//! alias, as a user's `~/.ssh/config` would) and smart HTTP (`git
//! http-backend` behind `lighttpd`). Each test starts its own server and
//! stops it when done. `.ci/run` installs `openssh-server` and `lighttpd`.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::sync::{MARK, Machine, world_with};
use crate::util::*;

/// A server process, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for_port(port: u16, child: &mut Child) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the server exited early: {status}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the server did not listen on {port}");
}

fn need(program: &str, package: &str) -> PathBuf {
    let found = [
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/usr/local/sbin",
        "/usr/local/bin",
    ]
    .iter()
    .map(|d| Path::new(d).join(program))
    .find(|p| p.exists());
    found.unwrap_or_else(|| {
        panic!("{program} is needed for this test: install Debian's {package} (`.ci/run` does)")
    })
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An sshd on 127.0.0.1 accepting one throwaway user key for the current
/// user, and an ssh config naming it `mvtest`: (server, the env that
/// makes git's ssh read that config).
fn sshd(dir: &Path) -> (Server, Vec<(String, String)>) {
    let sshd = need("sshd", "openssh-server");
    let keygen = need("ssh-keygen", "openssh-client");
    std::fs::create_dir_all(dir).unwrap();
    for name in ["host_key", "user_key"] {
        run_ok(
            Command::new(&keygen)
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(dir.join(name)),
        );
    }
    std::fs::copy(dir.join("user_key.pub"), dir.join("authorized_keys")).unwrap();
    let host_pub = std::fs::read_to_string(dir.join("host_key.pub")).unwrap();
    std::fs::write(dir.join("known_hosts"), format!("mvtest {host_pub}")).unwrap();
    // sshd's privilege separation directory.
    let _ = std::fs::create_dir_all("/run/sshd");
    let port = free_port();
    let user = String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout)
        .unwrap()
        .trim()
        .to_string();
    let d = dir.display();
    std::fs::write(
        dir.join("sshd_config"),
        format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nPidFile {d}/sshd.pid\n\
             AuthorizedKeysFile {d}/authorized_keys\nStrictModes no\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nPubkeyAuthentication yes\nUsePAM no\n\
             PermitRootLogin prohibit-password\nLogLevel ERROR\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("ssh_config"),
        format!(
            "Host mvtest\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  IdentityFile {d}/user_key\n  \
             IdentitiesOnly yes\n  HostKeyAlias mvtest\n  UserKnownHostsFile {d}/known_hosts\n  \
             StrictHostKeyChecking yes\n  BatchMode yes\n"
        ),
    )
    .unwrap();
    let mut child = Command::new(&sshd)
        .args(["-D", "-e", "-f"])
        .arg(dir.join("sshd_config"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_port(port, &mut child);
    let env = vec![(
        "GIT_SSH_COMMAND".to_string(),
        format!("ssh -F {d}/ssh_config"),
    )];
    (Server(child), env)
}

#[test]
fn a_vault_syncs_over_ssh_through_a_host_alias_and_the_server_holds_only_ciphertext() {
    let tmp = tempfile::tempdir().unwrap();
    let (_server, env) = sshd(&tmp.path().join("ssh"));
    let w = world_with(|hub| format!("mvtest:{}", hub.display()), &env, 1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    assert_eq!(a.files(), b.files());
    // The ssh:// form of the same URL reaches it too.
    let mut c = Machine::new(w.hub.with_file_name("third"), a.key.clone());
    c.env = env.clone();
    c.ok(&["clone", &format!("ssh://mvtest{}", w.hub.display())]);
    a.write("/memories/from-a.md", &format!("{MARK} over ssh\n"));
    b.edit("/memories/notes.md", "two", "TWO over ssh");
    b.ok(&["sync"]);
    let out = a.ok(&["sync"]);
    assert!(out.contains("merged"), "{out}");
    b.ok(&["sync"]);
    c.ok(&["pull"]);
    assert_eq!(a.files(), b.files());
    assert_eq!(a.files(), c.files());
    assert_eq!(plaintext_anywhere(&w.hub, MARK), Vec::<String>::new());
    // A host key that does not match known_hosts: refused, nothing made.
    let bad_known = tmp.path().join("ssh/known_hosts");
    std::fs::write(
        &bad_known,
        "mvtest ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBlD3XJZz9DOVIdIR9fKyF3Y9vHbdEo3Dq7h5R9lgqjA\n",
    )
    .unwrap();
    let mut d = Machine::new(w.hub.with_file_name("fourth"), a.key.clone());
    d.env = env.clone();
    let err = d.fails(&["clone", &format!("mvtest:{}", w.hub.display())], 1);
    assert!(err.contains("remote origin"), "{err}");
    assert!(!d.dir.exists());
    a.write("/memories/later.md", "later\n");
    let err = a.fails(&["push"], 1);
    assert!(err.contains("remote origin"), "{err}");
}

/// lighttpd serving `git http-backend` for the repositories under `root`
/// at http://127.0.0.1:PORT/git/.
fn http_backend(dir: &Path, root: &Path) -> (Server, u16) {
    let lighttpd = need("lighttpd", "lighttpd");
    let exec_path = String::from_utf8(
        Command::new("git")
            .arg("--exec-path")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .to_string();
    std::fs::create_dir_all(dir.join("www")).unwrap();
    let port = free_port();
    let d = dir.display();
    std::fs::write(
        dir.join("lighttpd.conf"),
        format!(
            "server.bind = \"127.0.0.1\"\nserver.port = {port}\nserver.document-root = \"{d}/www\"\n\
             server.errorlog = \"{d}/error.log\"\nserver.pid-file = \"{d}/lighttpd.pid\"\n\
             server.modules = (\"mod_alias\", \"mod_cgi\", \"mod_setenv\")\n\
             alias.url = (\"/git\" => \"{exec_path}/git-http-backend\")\n\
             $HTTP[\"url\"] =~ \"^/git\" {{\n  cgi.assign = (\"\" => \"\")\n  \
             setenv.add-environment = (\"GIT_PROJECT_ROOT\" => \"{root}\", \"GIT_HTTP_EXPORT_ALL\" => \"1\")\n}}\n",
            root = root.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(&lighttpd)
        .args(["-D", "-f"])
        .arg(dir.join("lighttpd.conf"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_port(port, &mut child);
    (Server(child), port)
}

#[test]
fn a_vault_syncs_over_smart_http_through_git_http_backend() {
    let tmp = tempfile::tempdir().unwrap();
    // The world's hub lives in its own temporary directory: serve that.
    let port_cell = std::cell::Cell::new(0u16);
    let server = std::cell::RefCell::new(None);
    let w = world_with(
        |hub| {
            // git http-backend pushes only where receive-pack is on.
            git(hub, &["config", "http.receivepack", "true"]);
            let (s, port) = http_backend(&tmp.path().join("http"), hub.parent().unwrap());
            *server.borrow_mut() = Some(s);
            port_cell.set(port);
            format!("http://127.0.0.1:{port}/git/hub.git")
        },
        &[],
        1,
    );
    let (a, b) = (&w.machines[0], &w.machines[1]);
    assert_eq!(a.files(), b.files());
    a.write("/memories/from-a.md", &format!("{MARK} over http\n"));
    b.write("/memories/from-b.md", &format!("{MARK} over http too\n"));
    b.ok(&["sync"]);
    let err = a.fails(&["push"], 1);
    assert!(err.contains("moved since"), "{err}");
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    assert_eq!(a.files(), b.files());
    assert_eq!(
        a.read("/memories/from-b.md").unwrap(),
        format!("{MARK} over http too\n")
    );
    assert_eq!(plaintext_anywhere(&w.hub, MARK), Vec::<String>::new());
    // The server goes away: a clear error naming the remote, nothing lost.
    drop(server.borrow_mut().take());
    let err = a.fails(&["pull"], 1);
    assert!(err.contains("remote origin"), "{err}");
    a.ok(&["verify"]);
    let _ = port_cell.get();
}
