//! `memvault server` and `memvault tenant`: many tenants' vaults behind one
//! authenticated HTTP endpoint (`/v1/...`) and MCP endpoint (`/mcp`).
//!
//! Layout of a root and the registry: see [`registry`]. Open vaults and
//! group commit: [`pool`]. Routes and the token check: [`http`]. MCP:
//! [`mcp`].
//!
//! Connections are served by hand (hyper's HTTP/1.1 server): each has a
//! header timeout (which also closes idle keep-alive connections), the
//! server a limit on open connections, and SIGTERM or SIGINT stops it
//! gracefully: no new connection is taken, requests in flight finish
//! (each mutation already durable when answered), then every vault is
//! synced and closed.

mod http;
mod mcp;
mod pool;
mod registry;

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::json;

use super::{CliError, Global, Secret, no_core_dumps, source};
use crate::vault::erase::parse_duration_ms;
use crate::vault::{Attribution, InitSecret, Vault, VaultConfig};
use registry::{HexKey, Root, Scope, add_tenant, check_name, erase_tree, put_token};

#[derive(Args, Debug)]
pub(crate) struct ServerArgs {
    /// The server root: the tenant registry and every tenant's vault
    #[arg(long, value_name = "DIR")]
    pub root: PathBuf,
    /// The address to listen on (port 0: any free port; the address is
    /// printed on stderr)
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8700")]
    pub listen: String,
    /// A PEM certificate chain: serve HTTPS (with --tls-key)
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve plain HTTP on an address that is not loopback: only behind a
    /// proxy that terminates TLS
    #[arg(long)]
    pub behind_tls_proxy: bool,
    /// At most this many tenant vaults open at once (the least recently
    /// used is closed first)
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub max_open: usize,
    /// Close a tenant's vault (its keys wiped) after this long without a
    /// request: 30s, 10m, 1h
    #[arg(long, value_name = "AGE", default_value = "10m")]
    pub idle_close: String,
    /// At most this many client connections at once
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub max_connections: usize,
    /// The largest request body, in bytes (the default is what `serve`
    /// and `mcp` take as one line by default, so what they take, this
    /// takes)
    #[arg(long, value_name = "BYTES", default_value_t = 8 << 20)]
    pub max_body: usize,
    /// The most request body bytes all requests together hold at once
    /// (at least four times --max-body); past it a request is answered
    /// 503 with Retry-After
    #[arg(long, value_name = "BYTES", default_value_t = 256 << 20)]
    pub max_bodies: usize,
    /// The largest answer of an audit route (`/v1/history`, `/v1/diff`,
    /// ...), in bytes: a larger one is refused (422) with what to ask for
    /// instead (admin routes, whose answer follows their change, are not
    /// capped)
    #[arg(long, value_name = "BYTES", default_value_t = 8 << 20)]
    pub max_answer: usize,
    /// Requests a second per tenant (bursts of twice that); 0: no limit
    #[arg(long, value_name = "N", default_value_t = 500)]
    pub rate: u32,
    /// A host name (or host:port) that /mcp accepts in the Host header
    /// (repeatable) [default: localhost, 127.0.0.1, ::1]
    #[arg(long, value_name = "HOST")]
    pub allowed_host: Vec<String>,
    /// An Origin that /mcp accepts from browsers, e.g.
    /// https://app.example.com (its default port; `:*` for any port)
    /// (repeatable) [default: loopback origins]
    #[arg(long, value_name = "ORIGIN")]
    pub allowed_origin: Vec<String>,
    /// Sync every tenant vault that has this git remote (`memvault tenant
    /// remote`) at start, every --sync-every, and once more at shutdown;
    /// requests keep flowing meanwhile
    #[arg(long, value_name = "REMOTE")]
    pub sync: Option<String>,
    /// The period of --sync (e.g. 30s, 5m, 1h)
    #[arg(long, value_name = "AGE", default_value = "5m", requires = "sync")]
    pub sync_every: String,
}

#[derive(Subcommand, Debug)]
pub(crate) enum TenantCommand {
    /// Create a tenant's vault and print its first token (once) on stdout;
    /// creates the root if it does not exist. Several names: one line
    /// `NAME TOKEN` each, all added in one registry change
    Add {
        /// The tenant's name: lowercase letters, digits, '-' and '_'
        #[arg(required = true, num_args = 1..)]
        names: Vec<String>,
        #[arg(long, value_name = "DIR")]
        root: PathBuf,
        /// What the token may do: memory, audit, admin (comma-separated)
        #[arg(long, value_delimiter = ',', default_value = "memory")]
        scopes: Vec<Scope>,
        /// Make the tenant's vault a clone of this git remote (a tenant
        /// moved from another server; one name only, with
        /// --vault-key-file); the remote becomes its `origin`
        #[arg(long, value_name = "URL", requires = "vault_key_file")]
        clone: Option<String>,
        /// The key file of the vault cloned with --clone (`memvault tenant
        /// export-key` on the server it comes from)
        #[arg(long, value_name = "FILE", requires = "clone")]
        vault_key_file: Option<PathBuf>,
        /// Its storage quota, as `tenant quota` takes it (500MB, 2GiB,
        /// bytes)
        #[arg(long, value_name = "SIZE")]
        quota: Option<String>,
    },
    /// Set the most bytes a tenant's vault may store, its history
    /// included (what is on disk but the log's preallocated zeros): past
    /// it, `memvault server` answers a memory command that adds content
    /// (create, str_replace, insert, rename) with 429, and `/mcp` with the
    /// tool's error; views, deletes and the audit and admin routes still
    /// run. `none` removes it. A running server applies it at once
    Quota {
        /// The tenant
        name: String,
        /// A size: 500MB, 2GiB, 1048576 (bytes), or none
        size: String,
        #[arg(long, value_name = "DIR")]
        root: PathBuf,
    },
    /// Set the git remote a tenant's vault syncs with (`server --sync`,
    /// `tenant sync`), or remove it with --remove
    Remote {
        /// The tenant
        name: String,
        /// The remote's URL: a path, file://, ssh://, user@host:path or
        /// https://
        #[arg(required_unless_present = "remove")]
        url: Option<String>,
        #[arg(long, value_name = "DIR")]
        root: PathBuf,
        /// The remote's name in the tenant's vault
        #[arg(long, value_name = "NAME", default_value = "origin")]
        remote: String,
        /// Remove the remote instead
        #[arg(long, conflicts_with = "url")]
        remove: bool,
    },
    /// Sync a tenant's vault with its remote now (pull, merge, push); safe
    /// beside a running server
    Sync {
        /// The tenant
        name: String,
        #[arg(long, value_name = "DIR")]
        root: PathBuf,
        #[arg(long, value_name = "NAME", default_value = "origin")]
        remote: String,
        /// One JSON line
        #[arg(long)]
        json: bool,
    },
    /// Write a tenant's vault key to a new key file (mode 0600), so that
    /// another server can serve its vault (`tenant add --clone`)
    ExportKey {
        /// The tenant
        name: String,
        #[arg(long, value_name = "DIR")]
        root: PathBuf,
        /// The key file to create (never overwritten)
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// List the tenants: tokens' names and scopes (no secret), storage
    /// used against the quota, and whether each remote holds every change
    List {
        #[arg(long, value_name = "DIR")]
        root: PathBuf,
        /// One JSON object per tenant
        #[arg(long)]
        json: bool,
    },
    /// Create a token (printed once on stdout), or --rotate or --revoke one
    Token {
        /// The tenant
        name: String,
        #[arg(long, value_name = "DIR")]
        root: PathBuf,
        /// The token's name, recorded as the principal of each change made
        /// with it [default: the tenant's name]
        #[arg(long, value_name = "NAME")]
        token_name: Option<String>,
        /// Scopes of a new token, or of the rotated one [default: memory, or
        /// the rotated token's own]
        #[arg(long, value_delimiter = ',')]
        scopes: Option<Vec<Scope>>,
        /// Replace the token: the old one stops working at once
        #[arg(long, conflicts_with = "revoke")]
        rotate: bool,
        /// Remove the token
        #[arg(long)]
        revoke: bool,
    },
    /// Remove a tenant: its tokens stop working, its vault key is
    /// destroyed and its vault deleted (refused while its vault holds
    /// changes a remote of it has not received, unless --force)
    Remove {
        name: String,
        #[arg(long, value_name = "DIR")]
        root: PathBuf,
        /// Remove it even though a remote lacks some of its changes (they
        /// are destroyed with it)
        #[arg(long)]
        force: bool,
    },
}

fn usage(message: impl Into<String>) -> CliError {
    CliError {
        message: message.into(),
        code: 2,
    }
}

fn secret(global: &Global) -> Result<Secret, CliError> {
    no_core_dumps();
    source(global).resolve()
}

/// A quota's size: digits with an optional unit (B; kB, MB, GB, TB in
/// powers of 1,000; KiB, MiB, GiB, TiB in powers of 1,024; any case), or
/// `none`.
fn parse_quota(size: &str) -> Result<Option<u64>, CliError> {
    let bad = || {
        usage(format!(
            "quota {size:?}: give a size such as 500MB, 2GiB or 1048576 (bytes), or none"
        ))
    };
    let s = size.trim();
    if s.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(digits);
    let n: u64 = n.parse().map_err(|_| bad())?;
    let unit = unit.trim().to_ascii_lowercase();
    let times: u64 = match unit.as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => return Err(bad()),
    };
    match n.checked_mul(times) {
        // Past any disk: a typo, not a quota.
        Some(q) if q > 1 << 60 => Err(bad()),
        Some(0) => Err(usage(format!(
            "quota {size:?}: a quota of nothing would refuse every write; give a size, or none"
        ))),
        Some(q) => Ok(Some(q)),
        None => Err(bad()),
    }
}

fn unknown_tenant(name: &str) -> CliError {
    CliError::failure(format!(
        "no tenant named {name} (see `memvault tenant list`); nothing was changed"
    ))
}

/// `memvault tenant ...`.
pub(crate) fn tenant(
    global: &Global,
    cmd: &TenantCommand,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<u8, CliError> {
    // A name no tenant can have is a usage error (exit 2) for every
    // subcommand, as for `add` and `token`, not "no tenant named".
    if let TenantCommand::Quota { name, .. }
    | TenantCommand::Remote { name, .. }
    | TenantCommand::Sync { name, .. }
    | TenantCommand::ExportKey { name, .. }
    | TenantCommand::Remove { name, .. } = cmd
    {
        check_name("tenant", name)?;
    }
    match cmd {
        TenantCommand::Add {
            names,
            root,
            scopes,
            clone: Some(url),
            vault_key_file: Some(key_file),
            quota,
        } => {
            let [name] = names.as_slice() else {
                return Err(usage("--clone makes one tenant: give one name"));
            };
            let quota = quota.as_deref().map(parse_quota).transpose()?.flatten();
            check_name("tenant", name)?;
            if scopes.is_empty() {
                return Err(usage("give at least one scope"));
            }
            // The clone's source becomes the tenant's remote: a vault's
            // own directory (another server's tenant) cannot be one, and a
            // server serving it may hold writes its refs do not show
            // (round 41c: accepted, then every sync failed).
            if crate::vault::names_a_vault_dir(url) {
                return Err(usage(format!(
                    "--clone {url}: that is a memvault vault's own directory, not a git remote; clone from the tenant's remote (on the first server, `tenant remote` and `tenant sync` push it there)"
                )));
            }
            let key = super::unlock::read_key_file(key_file)?;
            let secret = secret(global)?;
            let root = Root::open(root, &secret, true)?;
            let token = root.change(|reg| {
                let (id, key, token) =
                    add_tenant(reg, root.keys(), name, scopes, Some(HexKey::of(&key)))?;
                if let Some(t) = reg.tenants.get_mut(&id) {
                    t.quota = quota;
                }
                let k = key
                    .key()
                    .ok_or_else(|| CliError::failure("a key did not round-trip"))?;
                crate::vault::sync_without_prompts();
                let (vault, report) = crate::vault::clone_vault(
                    url,
                    &root.tenant_dir(&id),
                    &crate::crypto::Unlock::KeyFile(&k),
                    super::sync::sync_attribution(),
                )
                .map_err(|e| match e {
                    crate::vault::VaultError::WrongSecret
                    | crate::vault::VaultError::SlotRemoved(_) => CliError::failure(
                        "the key in --vault-key-file does not open the vault at that remote (check that it is this tenant's, from `tenant export-key`); nothing was registered",
                    ),
                    e => e.into(),
                })?;
                drop(vault);
                writeln!(
                    err,
                    "memvault: cloned tenant {name}'s vault: {} commits",
                    report.commits
                )?;
                Ok(token)
            })?;
            out.write_all(format!("{}\n", token.as_str()).as_bytes())?;
            out.flush()?;
            writeln!(
                err,
                "memvault: created tenant {name} from its remote; its token ({}) is printed above, once: store it now",
                scope_list(scopes)
            )?;
            Ok(0)
        }
        TenantCommand::Add {
            names,
            root,
            scopes,
            quota,
            ..
        } => {
            for name in names {
                check_name("tenant", name)?;
            }
            let quota = quota.as_deref().map(parse_quota).transpose()?.flatten();
            let mut seen = std::collections::BTreeSet::new();
            if let Some(dup) = names.iter().find(|n| !seen.insert(n.as_str())) {
                return Err(usage(format!("{dup} is named twice")));
            }
            if scopes.is_empty() {
                return Err(usage("give at least one scope"));
            }
            let secret = secret(global)?;
            let root = Root::open(root, &secret, true)?;
            // The vaults first, under fresh ids; then the registry entries
            // that make them reachable, in one change. A crash before it
            // leaves orphan directories no token reaches.
            let tokens = root.change(|reg| {
                if let Some(name) = names.iter().find(|n| reg.by_name(n).is_some()) {
                    return Err(CliError::failure(format!(
                        "a tenant named {name} exists; nothing was changed"
                    )));
                }
                let mut tokens = Vec::with_capacity(names.len());
                for name in names {
                    let (id, key, token) = add_tenant(reg, root.keys(), name, scopes, None)?;
                    if let Some(t) = reg.tenants.get_mut(&id) {
                        t.quota = quota;
                    }
                    let k = key
                        .key()
                        .ok_or_else(|| CliError::failure("a new key did not round-trip"))?;
                    let who = Attribution {
                        session: "init".into(),
                        actor: "memvault".into(),
                    };
                    Vault::init(
                        &root.tenant_dir(&id),
                        InitSecret::KeyFile(k),
                        VaultConfig::default(),
                        who,
                    )?;
                    tokens.push(token);
                }
                Ok(tokens)
            })?;
            sweep_leftovers(&root, err)?;
            let mut text = zeroize::Zeroizing::new(String::new());
            for (name, token) in names.iter().zip(&tokens) {
                if names.len() > 1 {
                    text.push_str(name);
                    text.push(' ');
                }
                text.push_str(token);
                text.push('\n');
            }
            out.write_all(text.as_bytes())?;
            out.flush()?;
            let what = if names.len() == 1 {
                format!(
                    "tenant {}; its token ({}) is printed above",
                    names[0],
                    scope_list(scopes)
                )
            } else {
                format!(
                    "{} tenants; their tokens ({}) are printed above",
                    names.len(),
                    scope_list(scopes)
                )
            };
            writeln!(err, "memvault: created {what}, once: store them now")?;
            Ok(0)
        }
        TenantCommand::List { root, json } => {
            let root = Root::open(root, &secret(global)?, false)?;
            let reg = root.load()?;
            let mut rows: Vec<_> = reg.tenants.iter().collect();
            rows.sort_by(|a, b| a.1.name.cmp(&b.1.name));
            for (id, t) in rows {
                let state = tenant_state(&root.tenant_dir(id), &t.key);
                if *json {
                    let tokens: Vec<_> = t
                        .tokens
                        .values()
                        .map(|k| json!({"name": k.name, "scopes": k.scopes, "created": super::history::rfc3339(k.created_ms)}))
                        .collect();
                    let mut line = json!({"name": t.name, "id": id, "created": super::history::rfc3339(t.created_ms), "tokens": tokens, "quota_bytes": t.quota});
                    match &state {
                        Ok(st) => {
                            line["stored_bytes"] = json!(st.stored);
                            line["remotes"] = st
                                .remotes
                                .iter()
                                .map(|(name, behind)| json!({"name": name, "holds_every_change": !behind}))
                                .collect();
                        }
                        Err(why) => line["unreadable"] = json!(why),
                    }
                    writeln!(out, "{line}")?;
                } else {
                    let toks: Vec<String> = t
                        .tokens
                        .values()
                        .map(|k| format!("{} ({})", k.name, scope_list(&k.scopes)))
                        .collect();
                    let toks = if toks.is_empty() {
                        "no token".to_owned()
                    } else {
                        toks.join(", ")
                    };
                    let usage = match (&state, t.quota) {
                        (Ok(st), Some(q)) => format!(
                            "  stores {} bytes of its quota of {q} ({}%)",
                            st.stored,
                            st.stored.saturating_mul(100) / q.max(1)
                        ),
                        (Ok(st), None) => format!("  stores {} bytes, no quota", st.stored),
                        (Err(why), q) => format!(
                            "{}  vault unreadable: {why}",
                            q.map(|q| format!("  quota {q} bytes")).unwrap_or_default()
                        ),
                    };
                    let sync = match &state {
                        Ok(st) if st.remotes.is_empty() => "  no remote".to_owned(),
                        Ok(st) => st
                            .remotes
                            .iter()
                            .map(|(name, behind)| {
                                if *behind {
                                    format!(
                                        "  remote {name} lacks changes made since its last sync"
                                    )
                                } else {
                                    format!("  remote {name} holds every change")
                                }
                            })
                            .collect(),
                        Err(_) => String::new(),
                    };
                    writeln!(out, "{}  {}  {toks}{usage}{sync}", t.name, id)?;
                }
            }
            out.flush()?;
            Ok(0)
        }
        TenantCommand::Token {
            name,
            root,
            token_name,
            scopes,
            rotate,
            revoke,
        } => {
            check_name("tenant", name)?;
            let token_name = token_name.as_deref().unwrap_or(name);
            check_name("token", token_name)?;
            let root = Root::open(root, &secret(global)?, false)?;
            let printed = root.change(|reg| {
                let (_, tenant) = reg
                    .tenants
                    .iter_mut()
                    .find(|(_, t)| t.name == *name)
                    .ok_or_else(|| unknown_tenant(name))?;
                let existing = tenant
                    .tokens
                    .values()
                    .find(|t| t.name == token_name)
                    .map(|t| t.scopes.clone());
                match (existing, *rotate, *revoke) {
                    (Some(_), false, true) => {
                        tenant.tokens.retain(|_, t| t.name != token_name);
                        Ok(None)
                    }
                    (Some(old), true, false) => {
                        let scopes = scopes.clone().unwrap_or(old);
                        Ok(Some((put_token(tenant, root.keys(), token_name, &scopes), scopes)))
                    }
                    (None, false, false) => {
                        let scopes = scopes.clone().unwrap_or_else(|| vec![Scope::Memory]);
                        if scopes.is_empty() {
                            return Err(usage("give at least one scope"));
                        }
                        Ok(Some((put_token(tenant, root.keys(), token_name, &scopes), scopes)))
                    }
                    (Some(_), false, false) => Err(CliError::failure(format!(
                        "tenant {name} has a token named {token_name}: give --rotate to replace it or --revoke to remove it; nothing was changed"
                    ))),
                    (None, _, _) => Err(CliError::failure(format!(
                        "tenant {name} has no token named {token_name}; nothing was changed"
                    ))),
                    (Some(_), true, true) => Err(usage("give --rotate or --revoke, not both")),
                }
            })?;
            match printed {
                Some((token, scopes)) => {
                    writeln!(out, "{}", token.as_str())?;
                    out.flush()?;
                    writeln!(
                        err,
                        "memvault: token {token_name} of tenant {name} ({}){}; printed above, once",
                        scope_list(&scopes),
                        if *rotate {
                            ", rotated: the old one no longer works"
                        } else {
                            ""
                        }
                    )?;
                }
                None => writeln!(err, "memvault: token {token_name} of tenant {name} revoked")?,
            }
            Ok(0)
        }
        TenantCommand::Quota { name, size, root } => {
            let quota = parse_quota(size)?;
            let root = Root::open(root, &secret(global)?, false)?;
            root.change(|reg| {
                let (_, tenant) = reg
                    .tenants
                    .iter_mut()
                    .find(|(_, t)| t.name == *name)
                    .ok_or_else(|| unknown_tenant(name))?;
                tenant.quota = quota;
                Ok(())
            })?;
            match quota {
                Some(q) => writeln!(
                    err,
                    "memvault: tenant {name}'s vault may store {q} bytes (history included)"
                )?,
                None => writeln!(err, "memvault: tenant {name} has no storage quota")?,
            }
            Ok(0)
        }
        TenantCommand::Remote {
            name,
            url,
            root,
            remote,
            remove,
        } => {
            let (mut vault, _) = open_tenant(global, root, name)?;
            match (url, remove) {
                (_, true) => {
                    vault.remove_remote(remote)?;
                    writeln!(err, "memvault: tenant {name}: removed remote {remote}")?;
                }
                (Some(url), false) => {
                    let stored = vault.set_remote(remote, url)?;
                    writeln!(err, "memvault: tenant {name}: remote {remote} is {stored}")?;
                }
                (None, false) => return Err(usage("give the remote's URL, or --remove")),
            }
            drop(vault.checkpoint());
            Ok(0)
        }
        TenantCommand::Sync {
            name,
            root,
            remote,
            json,
        } => {
            crate::vault::sync_without_prompts();
            let (mut vault, _) = open_tenant(global, root, name)?;
            let report = vault.sync(remote).map_err(|e| match &e {
                crate::vault::VaultError::Sync(s)
                    if matches!(**s, crate::vault::SyncError::NoSuchRemote(_)) =>
                {
                    CliError::failure(format!(
                        "tenant {name} has no remote named {remote:?}: give it one with `memvault tenant remote {name} URL --root DIR{}`",
                        if remote == "origin" {
                            String::new()
                        } else {
                            format!(" --remote {remote}")
                        }
                    ))
                }
                _ => CliError::from(e),
            })?;
            super::sync::write_sync(out, &report, *json)?;
            Ok(0)
        }
        TenantCommand::ExportKey {
            name,
            root,
            out: file,
        } => {
            let (_, _, key) = tenant_key(global, root, name)?;
            super::write_new_key_file(file, &key)?;
            writeln!(
                err,
                "memvault: wrote tenant {name}'s vault key to {}: it opens the tenant's vault and every copy of it; keep it as you keep the server key",
                file.display()
            )?;
            Ok(0)
        }
        TenantCommand::Remove { name, root, force } => {
            // First what an earlier remove or add killed half way left:
            // a vault no tenant owns any more (its key went with it).
            let root = Root::open(root, &secret(global)?, false)?;
            sweep_leftovers(&root, err)?;
            // Unless --force, nothing a remote lacks goes with the tenant (a
            // tenant moved through its remote, written since its last
            // sync). An unknown tenant or a wrong key is said as such; a
            // vault that cannot be checked refuses too.
            if !force {
                let (id, key) = key_in(&root, name)?;
                let behind = Vault::open(
                    &root.tenant_dir(&id),
                    &crate::crypto::Unlock::KeyFile(&key),
                    super::sync::sync_attribution(),
                )
                .and_then(|mut vault| vault.remotes_behind());
                match behind {
                    Ok(behind) => {
                        if let Some(remote) = behind.first() {
                            return Err(CliError::failure(format!(
                                "tenant {name} holds changes its remote {remote} has not received: stop its writes (`memvault tenant token {name} --revoke`), run `memvault tenant sync {name}`, then remove it; or pass --force to destroy those changes with it. Nothing was removed"
                            )));
                        }
                    }
                    Err(e) => {
                        return Err(CliError::failure(format!(
                            "tenant {name}'s vault could not be checked for changes its remotes lack ({e}); pass --force to remove it anyway. Nothing was removed"
                        )));
                    }
                }
            }
            // The registry first: the tenant's tokens stop working and its
            // vault key is gone from it; then the vault is erased.
            let id = root.change(|reg| {
                let id = reg
                    .by_name(name)
                    .map(|(id, _)| id.clone())
                    .ok_or_else(|| unknown_tenant(name))?;
                reg.tenants.remove(&id);
                Ok(id)
            })?;
            // Out of the server's way at once (a running server that still
            // holds it open writes to a directory no longer there), then
            // erased.
            let live = root.tenant_dir(&id);
            let dir = root.tenant_dir(&format!("{id}.removed"));
            if let Err(e) = std::fs::rename(&live, &dir)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                return Err(CliError::failure(format!(
                    "tenant {name} is removed and its key destroyed, but its vault directory {} could not be moved away ({}): delete it by hand",
                    live.display(),
                    super::describe_io(&e)
                )));
            }
            erase_tree(&dir).map_err(|e| {
                CliError::failure(format!(
                    "tenant {name} is removed and its key destroyed, but its vault directory {} could not be deleted ({}): delete it by hand",
                    dir.display(),
                    super::describe_io(&e)
                ))
            })?;
            crate::vault::sync_dir(&root.tenant_dir(""));
            writeln!(
                err,
                "memvault: removed tenant {name}: its tokens no longer work, its vault key is destroyed and its vault deleted"
            )?;
            Ok(0)
        }
    }
}

/// What `tenant list` says of a tenant's vault.
struct TenantState {
    /// What its storage quota is measured against (`Vault::stored_bytes`).
    stored: u64,
    /// Each remote, and whether it lacks some of main by what the vault
    /// last saw there (no network).
    remotes: Vec<(String, bool)>,
}

/// A tenant vault's usage and remotes, or why it could not be read (a
/// fixed description of the failure's kind: no path).
fn tenant_state(dir: &Path, key: &HexKey) -> Result<TenantState, String> {
    let key = key
        .key()
        .ok_or_else(|| "its key is not one memvault made".to_owned())?;
    let mut vault = Vault::open(
        dir,
        &crate::crypto::Unlock::KeyFile(&key),
        super::sync::sync_attribution(),
    )
    .map_err(|e| describe_open_failure(&e))?;
    let behind = vault
        .remotes_behind()
        .map_err(|e| describe_open_failure(&e))?;
    let remotes = vault
        .remotes()
        .map_err(|e| describe_open_failure(&e))?
        .into_iter()
        .map(|r| {
            let lacks = behind.contains(&r.name);
            (r.name, lacks)
        })
        .collect();
    Ok(TenantState {
        stored: vault.stored_bytes(),
        remotes,
    })
}

fn describe_open_failure(e: &crate::vault::VaultError) -> String {
    use crate::vault::VaultError as E;
    match e {
        E::NotFound(_) | E::NotAVault(_) => "its vault directory is missing".into(),
        E::WrongSecret | E::SlotRemoved(_) => "its key does not open it".into(),
        E::NewerFormat(n) => format!("format {n}, newer than this memvault"),
        e if e.is_damage() => "damaged (its /v1/verify report says where)".into(),
        E::Lock(_) => "locked by another process".into(),
        _ => "it could not be opened".into(),
    }
}

/// Open tenant `name`'s vault with its key from the registry (for the
/// operator's commands beside a running server: the writer lock orders
/// them). Returns the vault and the tenant's id.
fn open_tenant(global: &Global, root: &Path, name: &str) -> Result<(Vault, String), CliError> {
    let (root, id, key) = tenant_key(global, root, name)?;
    let vault = Vault::open(
        &root.tenant_dir(&id),
        &crate::crypto::Unlock::KeyFile(&key),
        super::sync::sync_attribution(),
    )?;
    Ok((vault, id))
}

/// Erase the vault directories no tenant owns ([`Root::sweep_leftovers`])
/// and say how many there were; one that cannot be erased now is left for
/// the next time, unsaid.
fn sweep_leftovers(root: &Root, err: &mut dyn Write) -> Result<(), CliError> {
    let erased = root.sweep_leftovers()?;
    if erased > 0 {
        writeln!(
            err,
            "memvault: erased {erased} leftover vault director{} that no tenant owns (left by a `tenant add` or `tenant remove` that was interrupted, or written again by a server that still had a removed tenant's vault open)",
            if erased == 1 { "y" } else { "ies" }
        )?;
    }
    Ok(())
}

/// The root, tenant `name`'s id and its vault key, from the registry.
fn tenant_key(
    global: &Global,
    root: &Path,
    name: &str,
) -> Result<(Root, String, crate::crypto::KeyFileKey), CliError> {
    let root = Root::open(root, &secret(global)?, false)?;
    let (id, key) = key_in(&root, name)?;
    Ok((root, id, key))
}

/// Tenant `name`'s id and vault key in the registry of `root`.
fn key_in(root: &Root, name: &str) -> Result<(String, crate::crypto::KeyFileKey), CliError> {
    let reg = root.load()?;
    let (id, tenant) = reg.by_name(name).ok_or_else(|| unknown_tenant(name))?;
    let key = tenant
        .key
        .key()
        .ok_or_else(|| CliError::failure("the tenant's key is not one memvault made"))?;
    Ok((id.clone(), key))
}

/// Scopes as the registry keeps them (sorted, each once), for people.
fn scope_list(scopes: &[Scope]) -> String {
    let mut scopes = scopes.to_vec();
    scopes.sort();
    scopes.dedup();
    scopes
        .iter()
        .map(|s| s.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// How long a connection may go without its writes making progress (a
/// client that stops reading its responses) before it is closed.
const WRITE_STALL: Duration = Duration::from_secs(30);

/// A connection's stream, closed with an error when a write makes no
/// progress for [`WRITE_STALL`] (reads are bounded by the header and body
/// timeouts).
struct Stall<T> {
    io: T,
    waiting: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<T> Stall<T> {
    fn new(io: T) -> Stall<T> {
        Stall { io, waiting: None }
    }

    fn progress<R>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        polled: std::task::Poll<std::io::Result<R>>,
    ) -> std::task::Poll<std::io::Result<R>> {
        use std::task::Poll;
        match polled {
            Poll::Ready(r) => {
                self.waiting = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let sleep = self
                    .waiting
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(WRITE_STALL)));
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the client stopped reading",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Stall<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Stall<T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.io).poll_write(cx, buf);
        this.progress(cx, polled)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.progress(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.io).poll_flush(cx);
        this.progress(cx, polled)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.io).poll_shutdown(cx);
        this.progress(cx, polled)
    }
}

fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

/// What serves TLS: rustls, in a build with the `tls` feature (default).
#[cfg(feature = "tls")]
type Acceptor = tokio_rustls::TlsAcceptor;
/// A build without the `tls` feature has no TLS acceptor.
#[cfg(not(feature = "tls"))]
type Acceptor = std::convert::Infallible;

#[cfg(not(feature = "tls"))]
fn tls_acceptor(_cert: &Path, _key: &Path) -> Result<Acceptor, CliError> {
    Err(CliError::failure(
        "this memvault was built without TLS (the `tls` cargo feature): serve plain HTTP behind a TLS proxy, or use a default build",
    ))
}

#[cfg(feature = "tls")]
fn tls_acceptor(cert: &Path, key: &Path) -> Result<Acceptor, CliError> {
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(tls_config(
        cert, key,
    )?)))
}

/// The most a `--tls-cert` or `--tls-key` file is read: a PEM chain of a
/// few certificates is a few KiB.
#[cfg(feature = "tls")]
const TLS_FILE_MAX: u64 = 1 << 20;

/// The bytes of the regular file `path` of `what` (`--tls-cert`), at most
/// [`TLS_FILE_MAX`] (a device or a FIFO given by mistake is refused, not
/// read for ever).
#[cfg(feature = "tls")]
fn read_tls_file(path: &Path, what: &str) -> Result<Vec<u8>, CliError> {
    use std::io::Read;
    let fail = |why: String| CliError::failure(format!("{what} {}: {why}", path.display()));
    // Checked on the open handle (a path swapped for a FIFO after a
    // check would block here); opened without blocking, so a FIFO does
    // not wait for a writer first.
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| fail(e.to_string()))?
    };
    let meta = file.metadata().map_err(|e| fail(e.to_string()))?;
    if !meta.is_file() {
        return Err(fail("not a regular file".into()));
    }
    // Sized once: a key's bytes are not left behind by a growing buffer.
    let mut bytes = Vec::with_capacity(meta.len().min(TLS_FILE_MAX) as usize + 1);
    file.take(TLS_FILE_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| fail(e.to_string()))?;
    if bytes.len() as u64 > TLS_FILE_MAX {
        return Err(fail(format!(
            "larger than {} MiB, which no PEM file of a certificate or key is",
            TLS_FILE_MAX >> 20
        )));
    }
    Ok(bytes)
}

#[cfg(feature = "tls")]
fn tls_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig, CliError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let cert_pem = read_tls_file(cert, "--tls-cert")?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|_| {
            CliError::failure(format!(
                "cannot read a PEM certificate chain from {}",
                cert.display()
            ))
        })?;
    if certs.is_empty() {
        return Err(CliError::failure(format!(
            "{} holds no PEM certificate",
            cert.display()
        )));
    }
    let key_pem = zeroize::Zeroizing::new(read_tls_file(key, "--tls-key")?);
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| {
        let encrypted = key_pem.windows(9).any(|w| w == b"ENCRYPTED");
        CliError::failure(if encrypted {
            format!(
                "the private key in {} is encrypted, which the server cannot use: give it unencrypted (`openssl pkey -in {} -out PLAIN.key`, then keep PLAIN.key readable by the server alone)",
                key.display(),
                key.display()
            )
        } else {
            format!("cannot read a PEM private key from {}", key.display())
        })
    })?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| CliError::failure(format!("TLS setup failed: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| CliError::failure(format!("the TLS certificate and key do not fit: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The TLS handshake of a connection to an HTTPS port, or `None` where
/// the client spoke plain HTTP (its first byte a letter, as a method's is,
/// where a TLS client's is 22): that client is answered a plain 426
/// (RFC 2817's "use TLS"; a 400 would read as a malformed tool call to the
/// adapters) saying so rather than a TLS alert it would print as noise
/// (its token went out in the clear already: the operator should hear
/// why).
#[cfg(feature = "tls")]
async fn tls_or_refuse_plain(
    mut stream: tokio::net::TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
) -> std::io::Result<Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>> {
    use tokio::io::AsyncWriteExt;
    let mut first = [0u8; 1];
    if stream.peek(&mut first).await? == 1 && first[0].is_ascii_alphabetic() {
        let body = r#"{"error":"this port speaks HTTPS: use an https:// URL"}"#;
        let answer = format!(
            "HTTP/1.1 426 Upgrade Required\r\nupgrade: TLS/1.2\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        use tokio::io::AsyncReadExt;
        stream.write_all(answer.as_bytes()).await?;
        let _ = stream.shutdown().await;
        // What the client sent is read (a little of it, for a moment)
        // before the close, which would otherwise reset the connection
        // and could drop the answer before the client reads it.
        let mut sink = [0u8; 4096];
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            let mut left = 64usize;
            while left > 0 && matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {
                left -= 1;
            }
        })
        .await;
        return Ok(None);
    }
    acceptor.accept(stream).await.map(Some)
}

/// `server --sync REMOTE`: a thread that syncs every tenant vault that has
/// the remote, at start and then every period, each through its own
/// handle (the serving one catches up with a merge as with another
/// process's writes; the writer lock orders them). Its reports on stderr
/// are counts: no tenant name, path, URL or error text.
struct TenantSyncer {
    stop: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    thread: std::thread::JoinHandle<()>,
    app: Arc<http::App>,
    remote: String,
}

impl TenantSyncer {
    fn spawn(app: Arc<http::App>, remote: &str, every_ms: u64) -> TenantSyncer {
        crate::vault::sync_without_prompts();
        let stop = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let thread = {
            let (app, remote, stop) = (app.clone(), remote.to_string(), stop.clone());
            std::thread::spawn(move || {
                loop {
                    sync_tenants(&app, &remote);
                    let (lock, wake) = &*stop;
                    let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
                    let (guard, _) = wake
                        .wait_timeout_while(guard, Duration::from_millis(every_ms), |stop| !*stop)
                        .unwrap_or_else(|p| p.into_inner());
                    if *guard {
                        return;
                    }
                }
            })
        };
        TenantSyncer {
            stop,
            thread,
            app,
            remote: remote.to_string(),
        }
    }

    /// Stop the periodic rounds (waiting for one under way), then one last
    /// round.
    fn finish(self) {
        let (lock, wake) = &*self.stop;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        wake.notify_all();
        let _ = self.thread.join();
        sync_tenants(&self.app, &self.remote);
    }
}

/// One round: every tenant vault that has `remote`, synced (pull, merge,
/// push).
fn sync_tenants(app: &http::App, remote: &str) {
    let Ok(reg) = app.root.load() else {
        eprintln!("memvault: sync: the tenant registry could not be read; no vault was synced");
        app.note_sync_round(0, None, 0);
        return;
    };
    let (mut synced, mut busy) = (0usize, 0usize);
    // The ids (random, as `tenant list` shows them: no name, path or
    // secret in the log) of the tenants whose sync failed.
    let mut failed: Vec<&str> = Vec::new();
    for (id, tenant) in &reg.tenants {
        let Some(key) = tenant.key.key() else {
            failed.push(id);
            continue;
        };
        // A vault held locked (an operator's command, or this server's own
        // request in flight: the lock is per open file, so it counts here
        // too) is left for the next round rather than waited for: the
        // round would stall every tenant after it.
        if Vault::locked_elsewhere(&app.root.tenant_dir(id)) {
            busy += 1;
            continue;
        }
        let opened = Vault::open(
            &app.root.tenant_dir(id),
            &crate::crypto::Unlock::KeyFile(&key),
            super::sync::sync_attribution(),
        );
        let Ok(mut vault) = opened else {
            failed.push(id);
            continue;
        };
        match vault.remotes() {
            Ok(r) if r.iter().any(|r| r.name == remote) => {}
            Ok(_) => continue,
            Err(_) => {
                failed.push(id);
                continue;
            }
        }
        match vault.sync(remote) {
            Ok(_) => synced += 1,
            Err(_) => failed.push(id),
        }
    }
    app.note_sync_round(synced, Some(failed.len()), busy);
    if busy > 0 {
        eprintln!(
            "memvault: sync: {busy} tenant vault(s) held locked (by a request of this server in flight, or by another process) were left for the next round"
        );
    }
    if !failed.is_empty() {
        const SHOWN: usize = 10;
        let more = failed.len().saturating_sub(SHOWN);
        let ids = failed[..failed.len().min(SHOWN)].join(", ");
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        eprintln!(
            "memvault: synced {synced} tenant vault(s) with their remote {remote}; {} failed, tenant ids {ids}{more} (`memvault tenant list` names them; `memvault tenant sync NAME` says why)",
            failed.len()
        );
    } else if synced > 0 {
        eprintln!("memvault: synced {synced} tenant vault(s) with their remote {remote}");
    }
}

/// Descriptors an open tenant vault holds (its log twice, its lock, its
/// access log, and a margin), pack files aside.
const FDS_PER_VAULT: usize = 6;
/// Descriptors kept for the rest: the registry, stdio, sync's pipes.
const SPARE_FDS: usize = 64;

/// `memvault server`.
pub(crate) fn run(global: &Global, args: &ServerArgs) -> Result<u8, CliError> {
    let addr: SocketAddr = args.listen.parse().map_err(|_| {
        usage(format!(
            "--listen {:?}: give an address such as 127.0.0.1:8700",
            args.listen
        ))
    })?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => Some(tls_acceptor(c, k)?),
        _ => None,
    };
    if tls.is_none() && !is_loopback(&addr) && !args.behind_tls_proxy {
        return Err(usage(format!(
            "refusing plain HTTP on {addr}, which is not a loopback address: give --tls-cert and --tls-key, or --behind-tls-proxy when a proxy in front terminates TLS"
        )));
    }
    let idle = parse_duration_ms(&args.idle_close).ok_or_else(|| {
        usage(format!(
            "--idle-close {:?}: give a period such as 30s, 10m or 1h",
            args.idle_close
        ))
    })?;
    if args.max_connections == 0 || args.max_body == 0 || args.max_answer == 0 {
        return Err(usage(
            "--max-connections, --max-body and --max-answer must be at least 1",
        ));
    }
    if args.max_connections > 1_000_000 || args.max_open > 1_000_000 {
        return Err(usage(
            "--max-connections and --max-open take at most 1000000",
        ));
    }
    let sync_every = match &args.sync {
        None => None,
        Some(_) => Some(parse_duration_ms(&args.sync_every).ok_or_else(|| {
            usage(format!(
                "--sync-every {:?}: give a period such as 30s, 5m or 1h",
                args.sync_every
            ))
        })?),
    };
    // Descriptors: one per connection, a few per open vault (its log
    // twice, its lock, its access log), the pack files libgit2 keeps open
    // (bounded below), and some to spare (the registry, sync's pipes).
    // The soft limit is raised to what that needs where the hard limit
    // allows; where it does not, fewer connections and vaults are served,
    // and the operator is told, rather than vaults read as damaged when
    // the descriptors run out.
    let mut max_connections = args.max_connections;
    let mut max_open = args.max_open;
    let mut pack_files = 1024usize;
    let want = max_connections
        .saturating_add(max_open.saturating_mul(FDS_PER_VAULT))
        .saturating_add(pack_files + SPARE_FDS);
    let limit = crate::vault::fsync::raise_open_files(want as u64);
    if limit < want as u64 {
        // Never more than was asked for.
        let room = usize::try_from(limit)
            .unwrap_or(usize::MAX)
            .saturating_sub(SPARE_FDS)
            .max(64);
        max_connections = (room / 4).max(8).min(max_connections);
        pack_files = (room / 4).max(8).min(pack_files);
        max_open = (room / 2 / FDS_PER_VAULT).max(1).min(max_open);
        eprintln!(
            "memvault: the open-files limit ({limit}) is below what --max-connections and --max-open need ({want}): serving at most {max_connections} connections and {max_open} open vaults (raise it: `ulimit -n`, or LimitNOFILE= in a systemd unit)"
        );
    }
    // Many vaults open at once share libgit2's process-wide caches: keep
    // them small (each vault's own caches are bounded by --max-open).
    crate::vault::fsync::limit_for_many_vaults(32 << 20, 32 << 20, pack_files);
    let secret = secret(global)?;
    let root = Root::open(&args.root, &secret, false)?;
    drop(secret);
    sweep_leftovers(&root, &mut std::io::stderr())?;
    let pool = pool::Pool::new(max_open, Duration::from_millis(idle));
    let limits = http::Limits {
        max_body: args.max_body,
        max_bodies: args.max_bodies.max(args.max_body.saturating_mul(4)),
        max_answer: args.max_answer,
        rate: args.rate,
        body_timeout: Duration::from_secs(30),
    };
    let app = Arc::new(http::App::new(root, pool, limits)?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(64)
        .build()
        .map_err(|e| CliError::failure(format!("cannot start the server's runtime: {e}")))?;
    let syncer = match (&args.sync, sync_every) {
        (Some(remote), Some(every)) => Some(TenantSyncer::spawn(app.clone(), remote, every)),
        _ => None,
    };
    let outcome = runtime.block_on(serve(app.clone(), args, addr, tls, idle, max_connections));
    // Requests are over: sync and close every vault (keys wiped).
    app.pool.close_all();
    // Then every tenant vault with the remote once more, so that what was
    // acknowledged last is there too.
    if let Some(syncer) = syncer {
        syncer.finish();
    }
    runtime.shutdown_timeout(Duration::from_secs(5));
    outcome.map(|()| 0)
}

async fn serve(
    app: Arc<http::App>,
    args: &ServerArgs,
    addr: SocketAddr,
    acceptor: Option<Acceptor>,
    idle_ms: u64,
    max_connections: usize,
) -> Result<(), CliError> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
    use tokio::signal::unix::{SignalKind, signal};

    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| CliError::failure(format!("cannot listen on {addr}: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| CliError::failure(format!("cannot listen on {addr}: {e}")))?;
    let hosts = if args.allowed_host.is_empty() {
        vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()]
    } else {
        args.allowed_host.clone()
    };
    let origins: Vec<String> = if args.allowed_origin.is_empty() {
        ["http", "https"]
            .iter()
            .flat_map(|s| ["localhost", "127.0.0.1", "[::1]"].map(|h| format!("{s}://{h}:*")))
            .collect()
    } else {
        args.allowed_origin.iter().map(|o| with_port(o)).collect()
    };
    let mcp_config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_allowed_hosts(hosts)
        .with_allowed_origins(origins)
        .with_max_request_body_bytes(args.max_body);
    let cancel = mcp_config.cancellation_token.clone();
    let mcp_app = app.clone();
    let mcp_service = StreamableHttpService::new(
        move || Ok(mcp::TenantMcp::new(mcp_app.clone())),
        Arc::new(NeverSessionManager::default()),
        mcp_config,
    );
    let router = http::router(app.clone(), axum::routing::any_service(mcp_service));

    let mut term = signal(SignalKind::terminate())
        .map_err(|e| CliError::failure(format!("cannot watch for SIGTERM: {e}")))?;
    let mut int = signal(SignalKind::interrupt())
        .map_err(|e| CliError::failure(format!("cannot watch for SIGINT: {e}")))?;

    // The registry and idle vaults, looked at in the background.
    let sweeper = {
        let app = app.clone();
        let every = Duration::from_millis((idle_ms / 4).clamp(200, 5_000));
        tokio::spawn(async move {
            let mut forced = std::time::Instant::now();
            loop {
                tokio::time::sleep(every).await;
                let app = app.clone();
                let force = forced.elapsed() >= Duration::from_secs(5);
                if force {
                    forced = std::time::Instant::now();
                }
                let _ = tokio::task::spawn_blocking(move || {
                    app.refresh(force);
                    app.pool.sweep(&|id| app.has_tenant(id));
                })
                .await;
            }
        })
    };

    eprintln!(
        "memvault: serving {} tenant{} on {}://{local}",
        app.tenant_count(),
        if app.tenant_count() == 1 { "" } else { "s" },
        if acceptor.is_some() { "https" } else { "http" }
    );
    let permits = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(10))
        .max_buf_size(64 << 10)
        .keep_alive(true);
    let builder = Arc::new(builder);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = term.recv() => break,
            _ = int.recv() => break,
        };
        let (stream, _) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(_) => {
                    // Out of descriptors, or a connection reset before it
                    // was taken: wait a little rather than spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = term.recv() => break,
            _ = int.recv() => break,
        };
        let _ = stream.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match acceptor {
                None => {
                    let conn = builder.serve_connection(TokioIo::new(Stall::new(stream)), service);
                    let _ = watcher.watch(conn).await;
                }
                #[cfg(feature = "tls")]
                Some(acceptor) => {
                    let Ok(Ok(Some(tls))) = tokio::time::timeout(
                        Duration::from_secs(10),
                        tls_or_refuse_plain(stream, acceptor),
                    )
                    .await
                    else {
                        return;
                    };
                    let conn = builder.serve_connection(TokioIo::new(Stall::new(tls)), service);
                    let _ = watcher.watch(conn).await;
                }
                #[cfg(not(feature = "tls"))]
                Some(never) => match never {},
            }
        });
    }
    // Stop: refuse new requests, let those in flight finish.
    eprintln!("memvault: stopping; finishing the requests in flight");
    app.stopping.store(true, Ordering::SeqCst);
    drop(listener);
    sweeper.abort();
    if tokio::time::timeout(Duration::from_secs(30), graceful.shutdown())
        .await
        .is_err()
    {
        eprintln!("memvault: some connections were still open after 30 s; closing them");
    }
    // Only now: rmcp answers the requests it still holds when cancelled.
    cancel.cancel();
    Ok(())
}

/// An `--allowed-origin` as an origin is compared: with its port. An
/// `http` or `https` origin given without one means the scheme's default
/// port (an origin includes its port; rmcp would take any port for it),
/// which is how browsers send it (`https://app.example.com`). `:*` still
/// means any port.
fn with_port(origin: &str) -> String {
    let Some((scheme, rest)) = origin.split_once("://") else {
        return origin.to_string();
    };
    let authority = rest.trim_end_matches('/');
    let port_given = match authority.rfind(']') {
        // `[::1]` or `[::1]:8080`.
        Some(end) => authority[end..].contains(':'),
        None => authority.contains(':'),
    };
    let default = match scheme.to_ascii_lowercase().as_str() {
        "http" => 80,
        "https" => 443,
        _ => return origin.to_string(),
    };
    if port_given || authority.is_empty() {
        origin.to_string()
    } else {
        format!("{scheme}://{authority}:{default}")
    }
}

#[cfg(test)]
mod tests {
    use super::with_port;

    #[test]
    fn an_allowed_origin_without_a_port_means_the_default_port() {
        assert_eq!(with_port("http://web.example"), "http://web.example:80");
        assert_eq!(
            with_port("https://app.example.com/"),
            "https://app.example.com:443"
        );
        assert_eq!(
            with_port("https://app.example.com:8443"),
            "https://app.example.com:8443"
        );
        assert_eq!(with_port("http://[::1]"), "http://[::1]:80");
        assert_eq!(with_port("http://[::1]:3000"), "http://[::1]:3000");
        assert_eq!(with_port("http://localhost:*"), "http://localhost:*");
    }
}
