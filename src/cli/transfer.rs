//! `memvault import DIR` and `memvault export DIR`: migration from a plain
//! memory directory (the SDKs' `<base>/memories` layout), and a decrypted
//! copy for an audit.

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

use super::{CliError, Global, SessionArgs, open_vault};
use crate::memory::MemoryPath;
use crate::redact::{Mode, RedactError, Redactor};
use crate::vault::ImportFile;

#[derive(clap::Args, Debug)]
pub struct ImportArgs {
    /// A memory directory: `<base>` holding `memories/`, or that folder itself
    pub dir: PathBuf,
    /// Session id stored with the import [default: a new random id]
    #[arg(long, env = "MEMVAULT_SESSION", value_name = "ID")]
    pub session: Option<String>,
    /// Who is importing (stored in the commit; an operator's act, not an
    /// agent's)
    #[arg(
        long,
        env = "MEMVAULT_ACTOR",
        value_name = "NAME",
        default_value = "operator"
    )]
    pub actor: String,
}

#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// An empty or new directory; the files go to DIR/memories/ (mode 0600)
    pub dir: PathBuf,
    /// Export the vault as it was at this revision [default: the tip]
    #[arg(long, value_name = "REV")]
    pub at: Option<String>,
}

/// The folder that maps to `/memories`: `DIR/memories` when DIR holds
/// that folder and nothing else, else DIR itself. DIR holding `memories/`
/// beside other entries is refused (which one was meant?), and so is a
/// `memories` that is a link (import reads no link). A DIR itself named
/// `memories` holding only `memories/` is read as a base too (`export
/// memories` then `import memories` round-trips), with a note on stderr
/// for the other reading (an export's `OUT/memories` of a vault with a
/// `/memories/memories/` folder): import `OUT`, which reads it that way.
fn memories_root(dir: &Path) -> Result<PathBuf, CliError> {
    let inner = dir.join("memories");
    match fs::symlink_metadata(&inner) {
        Ok(m) if m.file_type().is_symlink() => Err(CliError::failure(format!(
            "{} is a symbolic link; import copies regular files only (give the folder it points to)",
            shown_path(&inner)
        ))),
        Ok(m) if m.is_dir() => {
            let others = fs::read_dir(dir)
                .map_err(|e| CliError::failure(format!("cannot read {}: {e}", shown_path(dir))))?
                .filter_map(Result::ok)
                .filter(|e| e.file_name() != "memories")
                .count();
            if others > 0 {
                return Err(CliError::failure(format!(
                    "{} holds a memories/ folder and {others} other entr{} beside it; nothing was imported. Give {} to import that folder, or move the rest into it",
                    shown_path(dir),
                    if others == 1 { "y" } else { "ies" },
                    shown_path(&inner)
                )));
            }
            if dir.file_name().is_some_and(|n| n == "memories") {
                eprintln!(
                    "memvault: note: {} holds only a memories/ folder: read as a base, that folder is /memories; to import it as /memories/memories instead, import the folder that holds {}",
                    shown_path(dir),
                    shown_path(dir)
                );
            }
            Ok(inner)
        }
        _ => Ok(dir.to_path_buf()),
    }
}

/// A path as a message may show it: control and format characters
/// escaped (a file name may hold terminal escapes).
fn shown_path(p: &Path) -> String {
    crate::memory::path::shown(&p.to_string_lossy())
}

/// A regular file `collect` found to import.
struct Found {
    path: MemoryPath,
    source: PathBuf,
    dev: u64,
    ino: u64,
}

/// The bytes of a found file: opened without following a link, and only
/// if it is still the file `collect` found (a link or another file put in
/// its place since, or a folder on its way made a link, is refused), and
/// only up to the vault's limit per file (a larger one is refused before
/// it is read whole).
fn read_found(f: &Found, max_bytes: usize) -> Result<Zeroizing<Vec<u8>>, CliError> {
    use std::io::Read;
    let cannot = |e: std::io::Error| {
        CliError::failure(format!(
            "nothing was imported: cannot read {}: {e}",
            shown_path(&f.source)
        ))
    };
    let file = crate::vault::fsx::open_read(&f.source).map_err(cannot)?;
    let meta = file.metadata().map_err(cannot)?;
    if (meta.dev(), meta.ino()) != (f.dev, f.ino) {
        return Err(CliError::failure(format!(
            "nothing was imported: {} changed while it was being imported (it is now another file, or a folder on its way is now a link); import again once the folder is left alone",
            shown_path(&f.source)
        )));
    }
    let over = |len: u64| {
        CliError::failure(format!(
            "nothing was imported: {} is {len} bytes, over this vault's limit of {max_bytes} bytes per file",
            f.path.as_str()
        ))
    };
    if meta.len() > max_bytes as u64 {
        return Err(over(meta.len()));
    }
    let mut bytes = Zeroizing::new(Vec::with_capacity(meta.len() as usize));
    file.take(max_bytes as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    if bytes.len() > max_bytes {
        return Err(over(bytes.len() as u64));
    }
    Ok(bytes)
}

fn collect(
    root: &Path,
    dir: &Path,
    base: &MemoryPath,
    out: &mut Vec<Found>,
    empty: &mut usize,
) -> Result<(), CliError> {
    let mut entries: Vec<fs::DirEntry> = fs::read_dir(dir)
        .map_err(|e| CliError::failure(format!("cannot read {}: {e}", shown_path(dir))))?
        .collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name();
        let Some(name) = name.to_str() else {
            return Err(CliError::failure(format!(
                "{} has a name that is not UTF-8; rename it before importing",
                shown_path(&e.path())
            )));
        };
        let path = base.join_new(name).map_err(|err| {
            CliError::failure(format!(
                "{} cannot be a memory path ({err}); rename it before importing",
                shown_path(e.path().strip_prefix(root).unwrap_or(&e.path()))
            ))
        })?;
        let kind = e.file_type()?;
        if kind.is_symlink() {
            return Err(CliError::failure(format!(
                "{} is a symbolic link; import copies regular files only",
                shown_path(&e.path())
            )));
        } else if kind.is_dir() {
            // A folder with no file below it is left out (a vault keeps
            // files, and folders only as their paths): counted, and each
            // folder below it.
            let (before, mut inner) = (out.len(), 0);
            collect(root, &e.path(), &path, out, &mut inner)?;
            *empty += inner + usize::from(out.len() == before);
        } else if kind.is_file() {
            // The file as found (not through a link): it is read only if
            // it is still this one (see [`read_found`]).
            let meta = e.metadata()?;
            out.push(Found {
                path,
                source: e.path(),
                dev: meta.dev(),
                ino: meta.ino(),
            });
        } else {
            return Err(CliError::failure(format!(
                "{} is not a regular file or directory",
                shown_path(&e.path())
            )));
        }
    }
    Ok(())
}

/// A file's memory path after the secret filter, and whether it changed.
/// A name is held to the rule content is held to (redacted, or refused in
/// `reject` mode); the messages do not show the name that held the secret.
fn import_name(
    redactor: &Redactor,
    path: MemoryPath,
) -> Result<(MemoryPath, Vec<(String, u32)>), CliError> {
    let kinds = |kinds: &[(String, u32)]| {
        kinds
            .iter()
            .map(|(k, _)| k.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match redactor.filter(path.as_str()) {
        Ok(r) if r.findings.is_empty() => Ok((path, Vec::new())),
        Ok(r) => match MemoryPath::parse(&r.text) {
            Ok(redacted) => Ok((redacted, r.kinds())),
            Err(_) => Err(CliError::failure(format!(
                "nothing was imported: a file name holds secrets ({}), and with them redacted it would not be a valid memory path; rename it",
                kinds(&r.kinds())
            ))),
        },
        Err(RedactError::Rejected { kinds: k }) => Err(CliError::failure(format!(
            "nothing was imported: a file or folder name holds secrets ({}) and this vault rejects them; rename it",
            kinds(&k)
        ))),
        Err(e) => Err(CliError::failure(e.to_string())),
    }
}

/// A file that is not UTF-8 text (an image, say) cannot be redacted
/// without breaking it: it is refused when its text runs hold a secret, so
/// a key inside a `.png` is never stored.
fn refuse_binary_secret(
    redactor: &Redactor,
    path: &MemoryPath,
    bytes: &[u8],
) -> Result<(), CliError> {
    // UTF-8 text (with NUL bytes) is redacted as text: only its UTF-16
    // readings are checked here.
    let utf8 = std::str::from_utf8(bytes).is_ok();
    // Its text runs as UTF-8, and, when it holds NUL bytes, as UTF-16 in
    // either byte order and at either alignment: a secret in a Windows
    // "Unicode" text file (UTF-16, with or without its byte order mark)
    // or in an image's UTF-16 strings is found too.
    let mut texts = Vec::new();
    if !utf8 {
        texts.push(Zeroizing::new(String::from_utf8_lossy(bytes).into_owned()));
    }
    if bytes.contains(&0) {
        // UTF-32 too (rarer: some editors' "Unicode" option), at each of
        // its four alignments.
        for skip in 0..4 {
            let units = bytes.get(skip..).unwrap_or_default().chunks_exact(4);
            for le in [true, false] {
                let decoded: String = units
                    .clone()
                    .map(|u| {
                        let u = [u[0], u[1], u[2], u[3]];
                        let n = if le {
                            u32::from_le_bytes(u)
                        } else {
                            u32::from_be_bytes(u)
                        };
                        char::from_u32(n).unwrap_or('\u{FFFD}')
                    })
                    .collect();
                texts.push(Zeroizing::new(decoded));
            }
        }
        for skip in [0, 1] {
            let units = bytes.get(skip..).unwrap_or_default().chunks_exact(2);
            let le = units.clone().map(|u| u16::from_le_bytes([u[0], u[1]]));
            let be = units.map(|u| u16::from_be_bytes([u[0], u[1]]));
            for decoded in [
                char::decode_utf16(le)
                    .map(|c| c.unwrap_or('\u{FFFD}'))
                    .collect::<String>(),
                char::decode_utf16(be)
                    .map(|c| c.unwrap_or('\u{FFFD}'))
                    .collect::<String>(),
            ] {
                texts.push(Zeroizing::new(decoded));
            }
        }
    }
    let mut kinds = std::collections::BTreeSet::new();
    for text in &texts {
        let found = redactor.redact(text);
        kinds.extend(found.kinds().into_iter().map(|(k, _)| k));
    }
    if kinds.is_empty() {
        return Ok(());
    }
    Err(CliError::failure(format!(
        "nothing was imported: {} is not UTF-8 text and holds secrets ({}), in its text read as UTF-8, UTF-16 or UTF-32; memvault cannot redact inside a binary file, so remove the secret or leave the file out (a UTF-16 or UTF-32 text file: save it as UTF-8), and import again",
        path.as_str(),
        kinds.into_iter().collect::<Vec<_>>().join(", ")
    )))
}

/// `memvault import DIR`: every file as one commit, redacted as the vault's
/// settings say; nothing is written when anything is refused.
pub fn import(global: &Global, args: &ImportArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let root = memories_root(&args.dir)?;
    if !root.is_dir() {
        let what = if root.exists() {
            "is not a directory"
        } else {
            "does not exist"
        };
        return Err(CliError::failure(format!(
            "{} {what}",
            shown_path(&args.dir)
        )));
    }
    let mut found = Vec::new();
    let mut empty = 0;
    collect(&root, &root, &MemoryPath::root(), &mut found, &mut empty)?;
    let attribution = SessionArgs {
        session: args.session.clone(),
        actor: args.actor.clone(),
    }
    .attribution_quiet()?;
    let mut vault = open_vault(global, attribution)?;
    let redactor = Redactor::new(&vault.config().redaction).map_err(|e| {
        CliError::failure(format!(
            "invalid redaction settings: {e} (change them with `memvault config set`)"
        ))
    })?;
    let mut files = Vec::with_capacity(found.len());
    let mut redacted = 0usize;
    let mut renamed = 0usize;
    let mut taken = std::collections::HashSet::new();
    let max_bytes = vault.config().max_file_bytes;
    for f in found {
        let (path, name_kinds) = import_name(&redactor, f.path.clone())?;
        if !name_kinds.is_empty() {
            renamed += 1;
        }
        if !taken.insert(path.clone()) {
            return Err(CliError::failure(format!(
                "nothing was imported: two files would both be {} once the secrets in their names are redacted; rename one",
                path.as_str()
            )));
        }
        let bytes = read_found(&f, max_bytes)?;
        // Not UTF-8, or UTF-8 with NUL bytes (UTF-16 text without a byte
        // order mark reads as UTF-8): checked as a binary file too.
        let binary = std::str::from_utf8(&bytes).is_err() || bytes.contains(&0);
        if binary && redactor.mode() != Mode::Off {
            refuse_binary_secret(&redactor, &path, &bytes)?;
        }
        // Text goes through the secret filter; images and other binary
        // files (checked above) are stored as they are.
        let (content, redactions) = match std::str::from_utf8(&bytes) {
            Ok(text) if redactor.mode() != Mode::Off => match redactor.filter(text) {
                Ok(r) => {
                    let kinds = r.kinds();
                    if !kinds.is_empty() {
                        redacted += 1;
                    }
                    (Zeroizing::new(r.text.into_bytes()), kinds)
                }
                Err(RedactError::Rejected { kinds }) => {
                    return Err(CliError::failure(format!(
                        "nothing was imported: {} holds secrets ({}) and this vault rejects them",
                        path.as_str(),
                        kinds
                            .iter()
                            .map(|(k, _)| k.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
                Err(e) => return Err(CliError::failure(e.to_string())),
            },
            _ => (bytes, Vec::new()),
        };
        // The name's secrets count among the file's redactions too.
        let mut redactions = redactions;
        for (kind, n) in name_kinds {
            match redactions.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, m)) => *m += n,
                None => redactions.push((kind, n)),
            }
        }
        files.push(ImportFile {
            path,
            content,
            redactions,
        });
    }
    let n = files.len();
    let commit = vault.import_files(files).map_err(|e| match e {
        crate::vault::VaultError::Refused(m) => {
            CliError::failure(format!("nothing was imported: {m}"))
        }
        other => other.into(),
    })?;
    writeln!(
        out,
        "imported {n} file{} as revision {}{}",
        if n == 1 { "" } else { "s" },
        commit.short(),
        match (redacted, renamed) {
            (0, 0) => String::new(),
            (r, 0) => format!(" ({r} with secrets redacted)"),
            (0, n) => format!(" ({n} saved under a name with its secrets redacted)"),
            (r, n) => format!(
                " ({r} with secrets redacted, {n} saved under a name with its secrets redacted)"
            ),
        }
    )?;
    if empty > 0 {
        writeln!(
            out,
            "left out {empty} folder{} holding no file (a vault keeps files; a folder exists while a file is in it)",
            if empty == 1 { "" } else { "s" }
        )?;
    }
    out.flush()?;
    Ok(0)
}

/// `memvault export DIR`: a decrypted copy under DIR/memories/, files
/// 0600 and folders 0700; refuses a target that is not empty.
pub fn export(global: &Global, args: &ExportArgs, err: &mut dyn Write) -> Result<u8, CliError> {
    refuse_link(&args.dir)?;
    if args.dir.exists() {
        let mut entries = fs::read_dir(&args.dir).map_err(|e| {
            CliError::failure(format!("cannot read {}: {e}", shown_path(&args.dir)))
        })?;
        if entries.next().is_some() {
            return Err(CliError::failure(format!(
                "{} is not empty; export writes only into an empty or new directory",
                args.dir.display()
            )));
        }
    }
    let mut vault = open_vault(
        global,
        crate::vault::Attribution {
            session: "export".into(),
            actor: "memvault".into(),
        },
    )?;
    let rev = match &args.at {
        // Malformed: a usage error; well formed but unknown: a failure.
        Some(r) => Some(vault.resolve_rev(r).map_err(|e| CliError {
            code: if matches!(e, crate::vault::VaultError::BadRevision(_)) {
                2
            } else {
                1
            },
            message: e.to_string(),
        })?),
        None => vault.tip()?,
    };
    // Never inside the vault: it holds no readable content.
    if inside(&args.dir, vault.dir()) {
        return Err(CliError::failure(format!(
            "{} is inside the vault directory, which must hold no readable content; export to a directory outside it",
            args.dir.display()
        )));
    }
    let (files, erased) = vault.files_at_but_erased(rev)?;
    let root = args.dir.join("memories");
    make_private_dir(&args.dir)?;
    make_private_dir(&root)?;
    // The directory was empty or new: on a failure part way (a link
    // planted meanwhile, a full disk), what was written is removed, so no
    // decrypted copy is left half made without a word.
    if let Err(e) = write_export(&root, &files) {
        let cleaned = match fs::remove_dir_all(&root) {
            Ok(()) => "the files written before it were removed".to_string(),
            Err(r) => format!(
                "decrypted files written before it are left in {} ({}): delete them",
                shown_path(&root),
                super::describe_io(&r)
            ),
        };
        return Err(CliError::failure(format!("{}; {cleaned}", e.message)));
    }
    writeln!(
        err,
        "memvault: exported {} file{} to {} (decrypted: keep it safe, delete it when the audit is done)",
        files.len(),
        if files.len() == 1 { "" } else { "s" },
        root.display()
    )?;
    if !erased.is_empty() {
        let names: Vec<&str> = erased.iter().map(MemoryPath::as_str).collect();
        writeln!(
            err,
            "memvault: left out {} file{} whose version there was erased since (expired or purged): {}",
            erased.len(),
            if erased.len() == 1 { "" } else { "s" },
            names.join(", ")
        )?;
    }
    Ok(0)
}

/// Write each file under `root` (mode 0600, folders 0700), never through
/// a link.
fn write_export(root: &Path, files: &[(MemoryPath, Zeroizing<Vec<u8>>)]) -> Result<(), CliError> {
    let root = root.to_path_buf();
    for (path, content) in files {
        let rel: PathBuf = path.segments().collect();
        let target = root.join(&rel);
        if let Some(parent) = target.parent() {
            let mut p = root.clone();
            for seg in parent.strip_prefix(&root).unwrap_or(Path::new("")).iter() {
                p.push(seg);
                make_private_dir(&p)?;
            }
        }
        let mut opts = fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts
            .open(&target)
            .map_err(|e| CliError::failure(format!("cannot create {}: {e}", target.display())))?;
        f.write_all(content)?;
        f.sync_all()?;
    }
    Ok(())
}

/// Whether `target` (which may not exist yet) is `vault` or below it,
/// links resolved in what exists of it.
fn inside(target: &Path, vault: &Path) -> bool {
    let Ok(vault) = fs::canonicalize(vault) else {
        return false;
    };
    let mut at = match std::env::current_dir() {
        Ok(cwd) => cwd.join(target),
        Err(_) => target.to_path_buf(),
    };
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = fs::canonicalize(&at) {
            let mut full = real;
            for part in rest.iter().rev() {
                full.push(part);
            }
            return full.starts_with(&vault);
        }
        match (at.file_name().map(|n| n.to_os_string()), at.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                at = parent.to_path_buf();
            }
            _ => return false,
        }
    }
}

/// Export never writes through a symbolic link: the target and every
/// folder it creates must be real directories (or not exist yet).
fn refuse_link(p: &Path) -> Result<(), CliError> {
    let Ok(meta) = fs::symlink_metadata(p) else {
        return Ok(());
    };
    if !meta.file_type().is_symlink() {
        return Ok(());
    }
    let state = if fs::metadata(p).is_err() {
        "a dangling symbolic link (its target does not exist)"
    } else {
        "a symbolic link"
    };
    Err(CliError::failure(format!(
        "{} is {state}; export does not write through symbolic links: give the path of a real, empty or new directory",
        p.display()
    )))
}

fn make_private_dir(p: &Path) -> Result<(), CliError> {
    match fs::create_dir(p) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => refuse_link(p)?,
        Err(e) => {
            return Err(CliError::failure(format!(
                "cannot create {}: {e}",
                p.display()
            )));
        }
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(p, fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file swapped for a link, or for another file, after `collect`
    /// found it is refused, not read; one left alone is read.
    #[test]
    fn a_found_file_is_read_only_while_it_is_the_one_found() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("memories");
        fs::create_dir(&dir).unwrap();
        let outside = tmp.path().join("outside.txt");
        fs::write(&outside, "OUTSIDE").unwrap();
        fs::write(dir.join("a.md"), "a").unwrap();
        let found = || {
            let mut out = Vec::new();
            collect(&dir, &dir, &MemoryPath::root(), &mut out, &mut 0).unwrap();
            out.pop().unwrap()
        };
        let f = found();
        assert_eq!(&read_found(&f, 100).unwrap()[..], b"a");
        // Held by a second name, so no later file can reuse its inode.
        fs::hard_link(dir.join("a.md"), tmp.path().join("held")).unwrap();
        // A link in its place.
        fs::remove_file(dir.join("a.md")).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("a.md")).unwrap();
        assert!(read_found(&f, 100).is_err());
        // Another file in its place.
        let other = tmp.path().join("other.md");
        fs::write(&other, "b").unwrap();
        fs::rename(&other, dir.join("a.md")).unwrap();
        let err = read_found(&f, 100).map(|_| ()).unwrap_err();
        assert!(
            err.message.contains("changed while it was being imported"),
            "{}",
            err.message
        );
        // Over the limit, by its size.
        let f = found();
        let err = read_found(&f, 0).map(|_| ()).unwrap_err();
        assert!(
            err.message.contains("over this vault's limit of 0 bytes"),
            "{}",
            err.message
        );
    }
}
