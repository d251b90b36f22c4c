//! The `memvault` command line: clap types and one thin handler per
//! subcommand. Results go to stdout, diagnostics to stderr; exit status 0
//! on success, 1 on failure, 2 on a usage error.
//!
//! Handlers write to the `out` and `err` sinks they are given (gitoxide
//! style): `run` locks stdout and stderr once and passes them, tests pass
//! buffers (see `tests.rs`). `serve` and `mcp` own their protocol streams.

mod audit;
mod config;
mod demo;
mod expiry;
mod history;
mod keys;
mod mcp;
mod mcpwire;
mod redact;
mod serve;
mod server;
mod sync;
#[cfg(test)]
mod tests;
mod transfer;
mod unlock;

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::crypto::{KdfParams, KeyFileKey, Unlock};
use crate::memory::{Memory, MemoryPath, Snapshot};
use crate::protocol;
use crate::redact::{Mode, Redactor};
use crate::vault::{Attribution, InitSecret, Vault, VaultConfig, VaultError};
pub(crate) use unlock::{Secret, SecretSource};

/// A failure with the sentence a person needs, and its exit status.
#[derive(Debug)]
pub(crate) struct CliError {
    pub message: String,
    pub code: u8,
}

impl CliError {
    pub(crate) fn failure(message: impl Into<String>) -> Self {
        CliError {
            message: message.into(),
            code: 1,
        }
    }
}

impl CliError {
    /// The reader of stdout went away (`memvault history | head`): the
    /// process ends quietly with success, as ripgrep does. `main` prints
    /// nothing for an error with an empty message.
    fn broken_pipe() -> Self {
        CliError {
            message: String::new(),
            code: 0,
        }
    }

    /// A permission error, naming the vault file that cannot be opened
    /// when one can be found.
    fn permission_denied(e: &io::Error) -> Self {
        if let Some(dir) = OPENED_VAULT.get()
            && let Some((path, what)) = inaccessible_in(dir)
        {
            return CliError::failure(format!(
                "cannot {what} {}: permission denied (memvault must read and write every file in the vault; check that file's owner and mode)",
                path.display()
            ));
        }
        CliError::failure(format!(
            "I/O error: {e} (memvault must read and write every file in the vault and its key or passphrase file; check their owner and mode)"
        ))
    }
}

/// The vault this process opened, for messages that must name one of its
/// files (a CLI process opens one vault).
static OPENED_VAULT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// The first file or folder of the vault at `dir` that this process cannot
/// open (or, for memvault's own files, open for writing), with the verb for
/// the message. Looks at `memvault/` first, then the rest, symbolic links
/// not followed, at most 100,000 entries.
fn inaccessible_in(dir: &Path) -> Option<(PathBuf, &'static str)> {
    use std::fs;
    let denied =
        |r: io::Result<()>| matches!(r, Err(e) if e.kind() == io::ErrorKind::PermissionDenied);
    let own = dir.join("memvault");
    let mut stack = vec![dir.to_path_buf(), own.clone()];
    let mut seen = 0usize;
    while let Some(d) = stack.pop() {
        let entries = match fs::read_dir(&d) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return Some((d, "open")),
            Err(_) => continue,
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > 100_000 {
                return None;
            }
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                if path != own {
                    stack.insert(0, path);
                }
            } else if kind.is_file() {
                if denied(fs::File::open(&path).map(drop)) {
                    return Some((path, "open"));
                }
                let writable = || fs::OpenOptions::new().write(true).open(&path).map(drop);
                if d == own && denied(writable()) {
                    return Some((path, "write to"));
                }
            }
        }
    }
    None
}

impl From<VaultError> for CliError {
    fn from(e: VaultError) -> Self {
        // libgit2 keeps no errno: a full disk it met is said as such.
        if matches!(e, VaultError::Git(_)) && e.is_disk_full() {
            return CliError::failure(
                "the disk holding the vault is full (no space left on device); free space there and run the command again (what was acknowledged before is kept)",
            );
        }
        if let VaultError::Io(io) = &e {
            return io_error(io);
        }
        if let VaultError::Sync(s) = &e
            && let crate::vault::SyncError::LocalIo(io) = &**s
        {
            return io_error(io);
        }
        if let VaultError::Sync(s) = &e
            && matches!(
                **s,
                crate::vault::SyncError::BadUrl(_) | crate::vault::SyncError::BadName
            )
        {
            return CliError {
                message: e.to_string(),
                code: 2,
            };
        }
        let hint = match &e {
            VaultError::WrongSecret => " (check the passphrase or --key-file; nothing was changed)",
            VaultError::SlotRemoved(_) => {
                " (nothing was changed; if its passphrase was changed with `memvault passwd`, give the new one; if the slot was removed, ask someone whose secret still opens the vault to add one for you with `memvault key add`)"
            }
            VaultError::Damaged(_) | VaultError::Object(_)
                if e.to_string().contains(PACK_DAMAGED) =>
            {
                " (nothing was changed: move that pack file and its index out of objects/pack, or put both back from a backup; `memvault verify` then names every version that was only in it)"
            }
            VaultError::Damaged(_) | VaultError::Object(_) => VERIFY_HINT,
            VaultError::RolledBack(_) => {
                " (nothing was changed; someone put back older ref files: restore them, or the vault from a backup)"
            }
            _ => "",
        };
        CliError::failure(format!("{e}{hint}"))
    }
}

impl From<io::Error> for CliError {
    fn from(e: io::Error) -> Self {
        io_error(&e)
    }
}

/// What a damaged pack's message starts with.
const PACK_DAMAGED: &str = "a pack in objects/pack is damaged";
/// The hint after damage a command met (`verify` says its own).
pub(crate) const VERIFY_HINT: &str =
    " (nothing was changed; run `memvault verify` to locate the damage)";

fn io_error(e: &io::Error) -> CliError {
    match e.kind() {
        io::ErrorKind::BrokenPipe => CliError::broken_pipe(),
        io::ErrorKind::PermissionDenied => CliError::permission_denied(e),
        io::ErrorKind::ReadOnlyFilesystem => CliError::failure(
            "the vault is on a read-only file system: every command, reads included, writes there (its lock, its log, records of use); nothing was read or changed. To inspect a read-only copy, copy it to a writable place first (`cp -a`), and open the copy",
        ),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => CliError::failure(format!(
            "I/O error: {e}: the disk holding the vault is full; free space there and run the command again (what was acknowledged before is kept)"
        )),
        _ => CliError::failure(format!("I/O error: {e}")),
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "memvault",
    version,
    about = "Encrypted, git-versioned storage for Claude's memory tool",
    long_about = None
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct Global {
    /// The vault directory [default: $MEMVAULT_DIR, else $XDG_DATA_HOME/memvault/vault, else ~/.local/share/memvault/vault]
    #[arg(long, global = true, value_name = "DIR")]
    pub vault: Option<PathBuf>,
    /// A raw 32-byte key file that unlocks the vault (also MEMVAULT_KEY_FILE)
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        conflicts_with = "passphrase_file"
    )]
    pub key_file: Option<PathBuf>,
    /// A file holding the passphrase on one line (without either flag: MEMVAULT_KEY_FILE, then MEMVAULT_PASSPHRASE, then a prompt)
    #[arg(long, global = true, value_name = "FILE")]
    pub passphrase_file: Option<PathBuf>,
    /// Give up on a remote (sync, push, pull, clone) after this many seconds of one git transfer; nothing changes here then
    #[arg(long, global = true, value_name = "SECONDS", env = "MEMVAULT_REMOTE_TIMEOUT",
          default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub remote_timeout: u64,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Create a new vault
    Init(InitArgs),
    /// Write a new random key file (mode 0600; never overwrites)
    Keygen {
        /// Where to write the key file
        file: PathBuf,
    },
    /// Answer memory tool calls as JSON lines on stdin/stdout
    Serve(ServeArgs),
    /// Serve the memory tool to MCP clients (Claude Code, Claude Desktop) on stdin/stdout
    Mcp(SessionArgs),
    /// Run one memory command (JSON argument, or stdin) and print its result line
    Exec {
        #[command(flatten)]
        session: SessionArgs,
        /// The tool_use block or command object; read from stdin when absent
        json: Option<String>,
    },
    /// Replay a realistic agent session on a throwaway vault, offline
    Demo {
        /// Keep the throwaway vault in this directory instead of deleting it
        #[arg(long, value_name = "DIR")]
        keep: Option<PathBuf>,
    },
    /// List the changes in the vault, newest first (decrypted audit log)
    History(history::HistoryArgs),
    /// Repack the vault into one pack and delete unreachable objects
    /// (old key tables included); also runs by itself when packs pile up
    Gc,
    /// Print a file or directory as it was at a revision (as `view` shows it)
    Show(audit::ShowArgs),
    /// Unified diff of decrypted content: REV against its parent, or REV..REV2
    Diff(audit::DiffArgs),
    /// Undo one change, or a whole session (--session), as a new commit
    Revert(audit::RevertArgs),
    /// Put a file or directory back as it was at a revision, as a new commit
    Restore(audit::RestoreArgs),
    /// One line per session: id, actor, first and last time, changes, files
    Sessions(audit::SessionsArgs),
    /// A briefing for the next agent session (fit for a system prompt)
    Resume(audit::ResumeArgs),
    /// Check all of history: MACs, every stored file, the key table, rollback
    Verify(audit::VerifyArgs),
    /// Remove files not viewed or written recently, and destroy their keys
    Expire(expiry::ExpireArgs),
    /// Erase a file or directory from all of history (destroys its keys)
    Purge(expiry::PurgeArgs),
    /// Load a plain memory directory (the SDKs' <base>/memories) as one commit
    Import(transfer::ImportArgs),
    /// Write a decrypted copy of the memory to an empty directory (for an audit)
    Export(transfer::ExportArgs),
    /// Change a passphrase: rewrites its keyslot, re-encrypts no data
    Passwd(keys::PasswdArgs),
    /// Manage keyslots: add, list, remove
    #[command(subcommand)]
    Key(keys::KeyCommand),
    /// Start a new data-key epoch for future writes (old history is not re-encrypted)
    Rekey(keys::RekeyArgs),
    /// Show or change the vault's settings (authenticated; each change is recorded in history)
    #[command(subcommand)]
    Config(config::ConfigCommand),
    /// Serve many tenants' vaults over HTTP (/v1/memory, audit and admin
    /// routes) and MCP (/mcp), each tenant chosen by its bearer token
    Server(server::ServerArgs),
    /// Manage the tenants of a server root: add, list, token, quota, remote, sync, export-key, remove
    #[command(subcommand)]
    Tenant(server::TenantCommand),
    /// Make a working vault from a git remote (unlocked with your key file or passphrase)
    Clone(sync::CloneArgs),
    /// Manage the vault's git remotes: add, list, remove
    #[command(subcommand)]
    Remote(sync::RemoteCommand),
    /// Send this vault's history to a remote (never forced: fails if it moved; then `sync`)
    Push(sync::SyncArgs),
    /// Fetch a remote's history, check it, and merge it into this vault
    Pull(sync::SyncArgs),
    /// Pull, then push (pulling again if the remote moved in between)
    Sync(sync::SyncArgs),
    /// Show this machine's id and name (every commit names it), or set the name
    Machine(sync::MachineArgs),
    /// Print text with secrets redacted (stdin by default), by the built-in
    /// rules as a new vault has them: no vault is opened, so a vault's own
    /// redaction settings (custom or disabled rules) are not applied
    Redact {
        /// The file to read
        file: Option<PathBuf>,
        /// Print findings (rule, description, line, column) as JSON lines instead of the text
        #[arg(long)]
        report: bool,
        /// Each input line is one text, as a JSON string: print each one
        /// redacted, as a JSON string on a line of its own (texts are
        /// redacted one by one, none sees another)
        #[arg(long, conflicts_with = "report")]
        json_lines: bool,
        /// Print every built-in rule (id, then a one-line description) and exit
        #[arg(long, conflicts_with_all = ["file", "report", "json_lines"])]
        list_rules: bool,
    },
}

#[derive(Args, Debug)]
pub(crate) struct InitArgs {
    /// Argon2id memory in KiB for a passphrase slot
    #[arg(long, default_value_t = KdfParams::DEFAULT.m_kib, value_name = "KIB")]
    pub argon2_memory: u32,
    /// Argon2id passes
    #[arg(long, default_value_t = KdfParams::DEFAULT.t, value_name = "N")]
    pub argon2_passes: u32,
    /// Argon2id lanes
    #[arg(long, default_value_t = KdfParams::DEFAULT.p, value_name = "N")]
    pub argon2_lanes: u32,
    /// `create` on an existing file overwrites it (history keeps the old one)
    #[arg(long)]
    pub overwrite_on_create: bool,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    pub session: SessionArgs,
    /// Before serving, write the `memvault resume` briefing to stderr as one
    /// JSON line: {"briefing": TEXT}
    #[arg(long)]
    pub briefing: bool,
    /// Also run the expiry sweep (`memvault expire`, the vault's period)
    /// every AGE (e.g. 1h) inside this process
    #[arg(long, value_name = "AGE")]
    pub expire_every: Option<String>,
    /// Also sync with this remote (`memvault sync REMOTE`) at start and then
    /// every --sync-every, inside this process; requests keep flowing
    #[arg(long, value_name = "REMOTE")]
    pub sync: Option<String>,
    /// The period of --sync (e.g. 30s, 5m, 1h)
    #[arg(long, value_name = "AGE", default_value = "5m", requires = "sync")]
    pub sync_every: String,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct SessionArgs {
    /// Session id stored with every change [default: a new random id]
    #[arg(long, env = "MEMVAULT_SESSION", value_name = "ID")]
    pub session: Option<String>,
    /// Who is acting (agent or service name)
    #[arg(
        long,
        env = "MEMVAULT_ACTOR",
        value_name = "NAME",
        default_value = "agent"
    )]
    pub actor: String,
}

impl SessionArgs {
    /// The attribution, with a generated session id when none was given.
    pub(crate) fn attribution_quiet(&self) -> Result<Attribution, CliError> {
        self.attribution(false)
    }

    fn attribution(&self, announce: bool) -> Result<Attribution, CliError> {
        let session = match &self.session {
            Some(s) => {
                if !crate::memory::path::is_new_label(s) {
                    return Err(CliError {
                        message: "a session id is 1 to 128 bytes of printable characters (no control, invisible or line-separator character, no space at either end, no two spaces in a row)".into(),
                        code: 2,
                    });
                }
                s.clone()
            }
            None => {
                let id = new_session_id();
                if announce {
                    eprintln!("memvault: session {id}");
                }
                id
            }
        };
        if !crate::memory::path::is_new_label(&self.actor) {
            return Err(CliError {
                message: ACTOR_RULE.into(),
                code: 2,
            });
        }
        if crate::memory::path::is_reserved_label(self.session.as_deref(), &self.actor) {
            return Err(CliError {
                message: RESERVED_RULE.into(),
                code: 2,
            });
        }
        Ok(Attribution {
            session: redact_label(&session)?,
            actor: redact_label(&self.actor)?,
        })
    }
}

/// The attribution of an operator's command (`revert`, `restore`,
/// `expire`, `purge`, `config set`): a session of its own, the actor as
/// given, checked as an agent's is.
pub(crate) fn operator_attribution(actor: &str) -> Result<Attribution, CliError> {
    if !crate::memory::path::is_new_label(actor) {
        return Err(CliError {
            message: ACTOR_RULE.into(),
            code: 2,
        });
    }
    if crate::memory::path::is_reserved_label(None, actor) {
        return Err(CliError {
            message: RESERVED_RULE.into(),
            code: 2,
        });
    }
    Ok(Attribution {
        session: new_session_id(),
        actor: redact_label(actor)?,
    })
}

/// What an actor name must be (see [`crate::memory::path::is_plain_label`]).
pub(crate) const ACTOR_RULE: &str = "an actor name is 1 to 128 bytes of printable characters (no control, invisible or line-separator character, no space at either end, no two spaces in a row)";

/// Why a session or actor memvault's own commits carry is refused (see
/// [`crate::memory::path::is_reserved_label`]).
pub(crate) const RESERVED_RULE: &str = "the session ids init, migrate, sync and keys and the actor memvault are those of memvault's own commits (the vault's creation, a format migration, a sync's merge, a keyslot change); give another, so that history does not list these changes as memvault's";

/// A session id or actor name with any secret in it redacted, whatever the
/// vault's redaction mode: they go into every commit's metadata and
/// `history`, and are labels, never memory content.
pub(crate) fn redact_label(label: &str) -> Result<String, CliError> {
    let (text, kinds) = redacted_label(label)?;
    if !kinds.is_empty() {
        eprintln!(
            "memvault: warning: a --session or --actor value held a secret ({}); it is recorded redacted, as {text:?}, which any other value with a secret of that kind in the same place is recorded as too (history, sessions and revert --session take them for one)",
            kinds_named(&kinds)
        );
    }
    Ok(text)
}

/// The kinds of secret a filter found, for a message: `a, b`.
pub(crate) fn kinds_named(kinds: &[(String, u32)]) -> String {
    kinds
        .iter()
        .map(|(k, _)| k.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// [`redact_label`] without its warning on stderr: the label and the kinds
/// of secret taken out of it (for the server, whose labels come from its
/// clients' headers, and whose log a client must not be able to fill).
pub(crate) fn redacted_label(label: &str) -> Result<(String, Vec<(String, u32)>), CliError> {
    // Short plain words ("agent", "test") cannot hold a secret the filter
    // finds (its shortest formats, an SSN or a card number, are longer),
    // and the default names and generated session ids are memvault's own:
    // no filter is compiled for them.
    let plain = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    let generated = label.len() == 18
        && label.starts_with("s-")
        && label[2..].bytes().all(|b| b.is_ascii_hexdigit());
    if (label.len() <= 8 && plain(label)) || generated {
        return Ok((label.to_owned(), Vec::new()));
    }
    static BUILT_IN: std::sync::OnceLock<Result<Redactor, String>> = std::sync::OnceLock::new();
    let redactor = BUILT_IN
        .get_or_init(|| {
            Redactor::new(&crate::redact::RedactConfig {
                mode: Mode::Redact,
                ..Default::default()
            })
            .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| CliError::failure(e.clone()))?;
    let red = redactor.redact(label);
    let kinds = red.kinds();
    Ok((red.text, kinds))
}

/// An I/O error in the words of a message: "permission denied", not
/// "Permission denied (os error 13)".
pub(crate) fn describe_io(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::PermissionDenied => "permission denied".into(),
        io::ErrorKind::NotFound => "it does not exist".into(),
        _ => e.to_string(),
    }
}

/// A new random session id.
pub(crate) fn new_session_id() -> String {
    format!(
        "s-{}",
        data_encoding::HEXLOWER.encode(&crate::crypto::random_bytes::<8>())
    )
}

/// The vault directory: `--vault`, else `$MEMVAULT_DIR`, else the per-user
/// data directory.
pub(crate) fn vault_dir(global: &Global) -> Result<PathBuf, CliError> {
    if let Some(v) = &global.vault {
        return Ok(v.clone());
    }
    if let Some(v) = std::env::var_os("MEMVAULT_DIR").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(v));
    }
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(x).join("memvault").join("vault"));
    }
    if let Some(h) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(h).join(".local/share/memvault/vault"));
    }
    Err(CliError::failure(
        "no vault location: give --vault DIR or set MEMVAULT_DIR",
    ))
}

pub(crate) fn source(global: &Global) -> SecretSource {
    SecretSource {
        key_file: global.key_file.clone(),
        passphrase_file: global.passphrase_file.clone(),
    }
}

/// Before a secret is read: no core dumps for the rest of the process.
pub(crate) fn no_core_dumps() {
    if let Err(e) = crate::hygiene::disable_core_dumps() {
        eprintln!("memvault: warning: cannot disable core dumps: {e}");
    }
}

/// Open and unlock the vault named by the global options.
pub(crate) fn open_vault(global: &Global, attribution: Attribution) -> Result<Vault, CliError> {
    let dir = vault_dir(global)?;
    match std::fs::metadata(&dir) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(VaultError::NotFound(dir).into());
        }
        Err(e) => {
            return Err(CliError::failure(format!(
                "cannot open {}: {}",
                dir.display(),
                describe_io(&e)
            )));
        }
    }
    let _ = OPENED_VAULT.set(dir.clone());
    no_core_dumps();
    let secret = source(global).resolve()?;
    let unlock = match &secret {
        Secret::KeyFile(k) => Unlock::KeyFile(k),
        Secret::Passphrase(p) => Unlock::Passphrase(p),
    };
    Ok(Vault::open(&dir, &unlock, attribution)?)
}

/// The vault a subcommand runs on: the one the command line names (opened
/// and unlocked here), or one the caller holds open with its attribution
/// already set (`memvault server`).
pub(crate) enum On<'a> {
    Cli(&'a Global),
    Open(&'a mut Vault),
}

impl On<'_> {
    /// Run `f` on the vault; `who` is the attribution a vault opened here
    /// writes under.
    pub(crate) fn with<T>(
        self,
        who: impl FnOnce() -> Result<Attribution, CliError>,
        f: impl FnOnce(&mut Vault) -> Result<T, CliError>,
    ) -> Result<T, CliError> {
        match self {
            On::Cli(global) => {
                let mut vault = open_vault(global, who()?)?;
                f(&mut vault)
            }
            On::Open(vault) => f(vault),
        }
    }
}

/// Build the command executor for a vault's settings.
/// The memory tool for a vault's settings as they are now, in a process
/// that keeps running (`serve`, `mcp`): the one it started with stays in
/// use until another process changes the settings (`config set`); then one
/// for the new settings is made at the next request, and used for it.
pub(crate) struct LiveMemory {
    start: VaultConfig,
    live: std::sync::Mutex<Option<(VaultConfig, std::sync::Arc<Memory>)>>,
}

impl LiveMemory {
    pub(crate) fn new(start: &VaultConfig) -> LiveMemory {
        LiveMemory {
            start: start.clone(),
            live: std::sync::Mutex::new(None),
        }
    }

    /// None while the settings are the ones the process started with
    /// (use its own memory tool); else the tool for the settings now, or
    /// the error to answer with when they cannot be used.
    pub(crate) fn now(&self, vault: &mut Vault) -> Result<Option<std::sync::Arc<Memory>>, String> {
        // A vault that cannot catch up reports it through the command.
        let Ok(config) = vault.refreshed_config() else {
            return Ok(None);
        };
        if *config == self.start {
            return Ok(None);
        }
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((c, m)) = &*live
            && c == config
        {
            return Ok(Some(std::sync::Arc::clone(m)));
        }
        let memory = std::sync::Arc::new(memory_for(config).map_err(|e| {
            format!(
                "Error: the vault's settings cannot be used: {}; nothing was done",
                e.message
            )
        })?);
        *live = Some((config.clone(), std::sync::Arc::clone(&memory)));
        Ok(Some(memory))
    }
}

/// A path an operator gave (`history`, `show`, `diff`, `restore`) as the
/// memory tool resolves it: as given when anything is there now, else,
/// when a secret in a name makes it differ, the redacted name the tool
/// stored it as (see [`redacted_path`]). (`purge` tries both.)
pub(crate) fn stored_path(vault: &mut Vault, path: MemoryPath) -> Result<MemoryPath, CliError> {
    let Some(redacted) = redacted_path(vault, &path) else {
        return Ok(path);
    };
    let tip = vault.tip()?;
    let there = vault
        .snapshot_at(tip)?
        .kind(&path)
        .map_err(|e| CliError::failure(e.to_string()))?
        .is_some();
    Ok(if there { path } else { redacted })
}

/// `path` with its names' secrets replaced by their markers, as the
/// memory tool stores a path it is given, when that differs; None too
/// when the vault's filter settings cannot be built (the operator's
/// commands stay usable to repair a vault).
pub(crate) fn redacted_path(vault: &Vault, path: &MemoryPath) -> Option<MemoryPath> {
    if path.is_root() {
        return None;
    }
    memory_for(vault.config()).ok()?.redacted_path(path)
}

pub(crate) fn memory_for(config: &VaultConfig) -> Result<Memory, CliError> {
    memory_with(config, false)
}

/// [`memory_for`], its filter's rules all compiled now: for an executor
/// several tenants share (see [`Redactor::compile_all`]).
pub(crate) fn shared_memory_for(config: &VaultConfig) -> Result<Memory, CliError> {
    memory_with(config, true)
}

fn memory_with(config: &VaultConfig, compile_all: bool) -> Result<Memory, CliError> {
    let redactor = Redactor::new(&config.redaction).map_err(|e| {
        CliError::failure(format!(
            "invalid redaction settings: {e} (change them with `memvault config set`)"
        ))
    })?;
    if compile_all {
        redactor.compile_all();
    }
    Ok(crate::memory_for_config(config, redactor))
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    #[cfg(feature = "bench-hooks")]
    crate::vault::fsync::set_from_env_for_benchmark();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) if e.message.is_empty() => ExitCode::from(e.code),
        Err(e) => {
            // A message may echo what the user typed (a path, a name): it
            // goes through the secret filter, as every label does.
            let message = redacted_label(&e.message).map_or(e.message, |(text, _)| text);
            eprintln!("memvault: {message}");
            ExitCode::from(e.code)
        }
    }
}

fn run(cli: Cli) -> Result<u8, CliError> {
    let global = &cli.global;
    crate::vault::sync::set_remote_timeout(std::time::Duration::from_secs(global.remote_timeout));
    match &cli.command {
        // The protocol servers own stdin and stdout, and their threads
        // write diagnostics to stderr: no lock is held for them.
        Command::Serve(args) => serve(global, args),
        Command::Mcp(session) => mcp::run(global, session),
        Command::Server(args) => server::run(global, args),
        command => {
            // stderr is not held locked: another thread may say something
            // on it meanwhile (a wait for the vault's lock, see
            // `FileLock`), which would otherwise wait for this one.
            let mut out = io::stdout().lock();
            let mut err = io::stderr();
            handle(global, command, &mut out, &mut err)
        }
    }
}

/// Run a subcommand other than `serve` and `mcp`: results to `out`,
/// diagnostics to `err` (the process's stdout and stderr, or buffers in
/// tests). A write to a closed `out` ends the command quietly (see
/// [`CliError::broken_pipe`]).
fn handle(
    global: &Global,
    command: &Command,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<u8, CliError> {
    match command {
        Command::Init(args) => init(global, args, err),
        Command::Keygen { file } => keygen(file, err),
        Command::Serve(_) | Command::Mcp(_) | Command::Server(_) => {
            unreachable!("`run` serves these itself")
        }
        Command::Tenant(cmd) => server::tenant(global, cmd, out, err),
        Command::Exec { session, json } => exec(global, session, json.as_deref(), out),
        Command::Demo { keep } => demo::run(keep.as_deref(), out),
        Command::History(args) => history::run(On::Cli(global), args, out),
        Command::Gc => gc(global, err),
        Command::Show(args) => audit::show(On::Cli(global), args, out),
        Command::Diff(args) => audit::diff(On::Cli(global), args, out),
        Command::Revert(args) => audit::revert(On::Cli(global), args, out),
        Command::Restore(args) => audit::restore(On::Cli(global), args, out),
        Command::Sessions(args) => audit::sessions(On::Cli(global), args, out),
        Command::Resume(args) => audit::resume(On::Cli(global), args, out),
        Command::Verify(args) => audit::verify(On::Cli(global), args, out),
        Command::Expire(args) => expiry::expire(On::Cli(global), args, out),
        Command::Import(args) => transfer::import(global, args, out),
        Command::Export(args) => transfer::export(global, args, err),
        Command::Purge(args) => expiry::purge(On::Cli(global), args, out),
        Command::Passwd(args) => keys::passwd(global, args, err),
        Command::Key(cmd) => keys::key(global, cmd, out, err),
        Command::Rekey(args) => keys::rekey(global, args, err),
        Command::Config(cmd) => config::run(global, cmd, out, err),
        Command::Clone(args) => sync::clone(global, args, out),
        Command::Remote(cmd) => sync::remote(global, cmd, out),
        Command::Push(args) => sync::push(global, args, out),
        Command::Pull(args) => sync::pull(global, args, out),
        Command::Sync(args) => sync::sync(global, args, out),
        Command::Machine(args) => sync::machine(global, args, out),
        Command::Redact {
            list_rules: true, ..
        } => list_rules(out),
        Command::Redact {
            file,
            json_lines: true,
            ..
        } => redact::redact_json_lines(file.as_deref(), out, err),
        Command::Redact { file, report, .. } => redact(file.as_deref(), *report, out, err),
    }
}

fn init(global: &Global, args: &InitArgs, err: &mut dyn Write) -> Result<u8, CliError> {
    let dir = vault_dir(global)?;
    let config = VaultConfig {
        overwrite_on_create: args.overwrite_on_create,
        ..VaultConfig::default()
    };
    no_core_dumps();
    let secret = match source(global).resolve_new()? {
        Secret::KeyFile(k) => InitSecret::KeyFile(k),
        Secret::Passphrase(p) => {
            let params = KdfParams {
                m_kib: args.argon2_memory,
                t: args.argon2_passes,
                p: args.argon2_lanes,
            };
            params.validate().map_err(|e| CliError {
                message: format!("Argon2 parameters refused: {e}"),
                code: 2,
            })?;
            InitSecret::Passphrase(p, params)
        }
    };
    let attribution = Attribution {
        session: "init".into(),
        actor: "memvault".into(),
    };
    Vault::init(&dir, secret, config, attribution)?;
    writeln!(err, "memvault: created a vault at {}", dir.display())?;
    Ok(0)
}

fn keygen(file: &Path, err: &mut dyn Write) -> Result<u8, CliError> {
    write_new_key_file(file, &KeyFileKey::generate())?;
    writeln!(err, "memvault: wrote a new key file to {}", file.display())?;
    Ok(0)
}

/// Write `key` to a new key file (mode 0600; an existing file is never
/// overwritten), synced.
pub(crate) fn write_new_key_file(file: &Path, key: &KeyFileKey) -> Result<(), CliError> {
    use std::fs::OpenOptions;
    // Its folder is made if missing (`~/.config` on a new machine), as
    // private as the file.
    if let Some(parent) = file
        .parent()
        .filter(|p| !p.as_os_str().is_empty() && !p.exists())
    {
        let mut dirs = std::fs::DirBuilder::new();
        dirs.recursive(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::DirBuilderExt;
            dirs.mode(0o700);
        }
        dirs.create(parent).map_err(|e| {
            CliError::failure(format!(
                "cannot create the folder {}: {e}",
                parent.display()
            ))
        })?;
    }
    let mut opts = OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(file).map_err(|e| {
        if e.kind() == io::ErrorKind::AlreadyExists {
            CliError::failure(format!(
                "{} already exists; memvault never overwrites a key file (choose another name)",
                file.display()
            ))
        } else {
            CliError::failure(format!("cannot create {}: {e}", file.display()))
        }
    })?;
    // A key file written in part (a full disk) is no key file: removed,
    // and the failure said for that file, not for the vault.
    if let Err(e) = f.write_all(key.expose_secret()).and_then(|()| f.sync_all()) {
        drop(f);
        let _ = std::fs::remove_file(file);
        return Err(CliError::failure(format!(
            "cannot write the key file {}: {e}; nothing was kept there",
            file.display()
        )));
    }
    Ok(())
}

fn serve(global: &Global, args: &ServeArgs) -> Result<u8, CliError> {
    let attribution = args.session.attribution(true)?;
    let mut vault = open_vault(global, attribution)?;
    // First, so that the briefing and the first request see what the
    // other machines wrote.
    let syncer = match &args.sync {
        Some(remote) => Some(sync::start_syncer(&vault, remote, &args.sync_every)?),
        None => None,
    };
    if args.briefing {
        let text = audit::briefing(&mut vault, None)?;
        eprintln!("{}", serde_json::json!({ "briefing": text }));
    }
    if let Some(every) = &args.expire_every {
        let every = crate::vault::erase::parse_duration_ms(every).ok_or_else(|| CliError {
            message: format!("--expire-every {every:?}: give a period such as 90m, 1h or 1d"),
            code: 2,
        })?;
        let period = expiry::period_ms(&vault, None)?;
        let mut sweeper = vault.reopen(Attribution {
            session: new_session_id(),
            actor: "expiry".into(),
        })?;
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(std::time::Duration::from_millis(every));
                match sweeper.expire(period, false) {
                    Ok(r) if !r.expired.is_empty() => {
                        eprintln!("memvault: expiry sweep removed {} file(s)", r.expired.len())
                    }
                    Ok(_) => {}
                    Err(e) => eprintln!("memvault: expiry sweep failed: {e}"),
                }
            }
        });
    }
    // Checkpoints run after a reply is written, not inside the request.
    vault.defer_checkpoints(true);
    let memory = memory_for(vault.config())?;
    let max_line = vault.config().max_line_bytes;
    // Several `serve` processes on one vault hand their requests to one
    // of them, which runs them in batches with one sync (see `serve`).
    let served = serve::run(&mut vault, &memory, max_line);
    // What this process wrote since the last sync goes out now.
    if let Some(syncer) = syncer {
        syncer.finish();
    }
    match served {
        Ok(()) => Ok(0),
        // The client stopped reading: the request whose result could not
        // be written ran (what it changed is kept); nothing after it was
        // read. A supervisor must be able to tell this from end of input.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Err(CliError::failure(
            "the client closed its end of stdout: the last request ran but its result could not be delivered (view what it touched before repeating it); no later request was read",
        )),
        Err(e) => Err(e.into()),
    }
}

fn exec(
    global: &Global,
    session: &SessionArgs,
    json: Option<&str>,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let attribution = session.attribution(false)?;
    let mut vault = open_vault(global, attribution)?;
    let memory = memory_for(vault.config())?;
    let max = vault.config().max_line_bytes;
    // Bytes, as `serve` reads a line: text that is not UTF-8 is answered
    // with the tool error `serve` gives it, not an I/O error; and one over
    // the vault's `max_line_bytes` with `serve`'s "over the limit". What
    // follows the limit is counted (not kept) for that answer, up to
    // COUNT_MAX: past it, input that does not end is not waited for.
    const COUNT_MAX: u64 = 1 << 30;
    let reply = match json {
        Some(j) if j.len() > max => protocol::too_long_reply(j.len(), max, j.as_bytes()),
        Some(j) => protocol::handle_line(&memory, &mut vault, j.trim().as_bytes()),
        None => {
            let mut buf = Vec::new();
            let mut stdin = io::stdin().lock();
            let cap = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(2);
            (&mut stdin).take(cap).read_to_end(&mut buf)?;
            // Counted as `serve` counts a line: without its newline.
            let body = buf.strip_suffix(b"\n").unwrap_or(&buf);
            if body.len() > max {
                // The rest counted, its final newline left out as above.
                let (mut n, mut last) = (buf.len(), buf.last().copied());
                let mut rest = (&mut stdin).take(COUNT_MAX);
                let mut chunk = vec![0u8; 64 << 10];
                loop {
                    let got = rest.read(&mut chunk)?;
                    if got == 0 {
                        break;
                    }
                    n = n.saturating_add(got);
                    last = Some(chunk[got - 1]);
                }
                let n = n - usize::from(last == Some(b'\n'));
                protocol::too_long_reply(n, max, body)
            } else {
                protocol::handle_line(&memory, &mut vault, body.trim_ascii())
            }
        }
    };
    writeln!(out, "{}", reply.to_line())?;
    out.flush()?;
    Ok(if reply.result.is_error { 1 } else { 0 })
}

fn gc(global: &Global, err: &mut dyn Write) -> Result<u8, CliError> {
    let attribution = Attribution {
        session: "gc".into(),
        actor: "memvault".into(),
    };
    let mut vault = open_vault(global, attribution)?;
    let r = vault.gc()?;
    writeln!(
        err,
        "memvault: repacked {} into one pack, removed {}; objects/ went from {} to {} bytes",
        count(r.objects as u64, "object"),
        count(r.removed_files as u64, "file"),
        r.bytes_before,
        r.bytes_after
    )?;
    Ok(0)
}

/// `n` and `noun`, plural unless `n` is 1 ("1 object", "2 objects").
pub(crate) fn count(n: u64, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

/// `redact --list-rules`: one rule a line, its id padded to a column, then
/// what it finds.
fn list_rules(out: &mut dyn Write) -> Result<u8, CliError> {
    let rules = Redactor::rules();
    let width = rules.iter().map(|r| r.id.len()).max().unwrap_or(0);
    let mut text = String::new();
    for r in &rules {
        text.push_str(&format!("{:<width$}  {}\n", r.id, r.description));
    }
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(0)
}

/// `redact [FILE]`: the redacted text on `out` (or, with `--report`, one
/// JSON line per finding: rule, description, line, column), and on `err` a
/// one-line summary of the kinds redacted. Exits 1 when something was found.
fn redact(
    file: Option<&Path>,
    report: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<u8, CliError> {
    let redactor = Redactor::new(&crate::redact::RedactConfig {
        mode: Mode::Redact,
        ..Default::default()
    })
    .map_err(|e| CliError::failure(e.to_string()))?;
    let cannot_read =
        |f: &Path, e: io::Error| CliError::failure(format!("cannot read {}: {e}", f.display()));
    let kinds = if report {
        let bytes = match file {
            Some(f) => std::fs::read(f).map_err(|e| cannot_read(f, e))?,
            None => {
                let mut buf = Vec::new();
                io::stdin().lock().read_to_end(&mut buf)?;
                buf
            }
        };
        let text = String::from_utf8(bytes).map_err(|_| {
            CliError::failure("the input is not UTF-8 text; redact reads text files only")
        })?;
        let findings = redactor.scan(&text);
        let mut lines = String::new();
        for f in &findings {
            let line = serde_json::json!({
                "rule": f.rule,
                "description": Redactor::describe(&f.rule).unwrap_or(""),
                "line": f.line,
                "column": f.column,
            });
            lines.push_str(&line.to_string());
            lines.push('\n');
        }
        out.write_all(lines.as_bytes())?;
        crate::redact::kinds(&findings)
    } else {
        // Megabytes of output: when standard output (where the binary
        // sends `out`) is a pipe, a larger buffer saves most of the
        // reader's wake-ups.
        #[cfg(unix)]
        crate::hygiene::widen_pipe(std::os::fd::AsFd::as_fd(&io::stdout()));
        match file {
            // Read twice in pieces: checked as UTF-8 before anything is
            // written, then redacted.
            Some(f) => {
                use std::io::Seek;
                let mut fh = std::fs::File::open(f).map_err(|e| cannot_read(f, e))?;
                #[cfg(unix)]
                if fh.metadata().is_ok_and(|m| m.is_file()) {
                    redact::check_utf8_file(&fh)?;
                } else {
                    redact::check_utf8(&mut fh)?;
                }
                #[cfg(not(unix))]
                redact::check_utf8(&mut fh)?;
                fh.rewind().map_err(|e| cannot_read(f, e))?;
                redact::redact_stream(&redactor, &mut fh, out, redact::PIECE, redact::MARGIN)?
            }
            None => {
                let mut buf = Vec::new();
                io::stdin().lock().read_to_end(&mut buf)?;
                redact::check_utf8(&mut buf.as_slice())?;
                redact::redact_stream(
                    &redactor,
                    &mut buf.as_slice(),
                    out,
                    redact::PIECE,
                    redact::MARGIN,
                )?
            }
        }
    };
    out.flush()?;
    if kinds.is_empty() {
        return Ok(0);
    }
    if !report {
        writeln!(err, "{}", redact::summary(&kinds))?;
    }
    Ok(1)
}
