//! `import` and `export`: a plain memory directory in, a decrypted copy out,
//! byte for byte; no overwrite on import, no non-empty target on export,
//! no plaintext anywhere else.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::json;

use crate::util::*;

const STRIPE: &str = "sk_live_51HqLyjWDarjtT1zdp7dcXk2mQ9vRb4nZe8aYf3Lw";
const MARK: &str = "TRANSFERMARK";

fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                let rel = e
                    .path()
                    .strip_prefix(dir)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.insert(rel, std::fs::read(e.path()).unwrap());
            }
        }
    }
    out
}

fn source(base: &Path) -> BTreeMap<String, Vec<u8>> {
    let m = base.join("memories");
    std::fs::create_dir_all(m.join("projects/ünïcode/deeper")).unwrap();
    std::fs::write(m.join("notes.md"), format!("{MARK} notes\n")).unwrap();
    std::fs::write(m.join(".hidden"), format!("{MARK} hidden\n")).unwrap();
    std::fs::write(
        m.join("projects/ünïcode/deeper/çà.md"),
        format!("{MARK} deep\n"),
    )
    .unwrap();
    let png: Vec<u8> = [
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR".as_slice(),
        &[0xff, 0x00, 0x7f, 0x80],
    ]
    .concat();
    std::fs::write(m.join("projects/pixel.png"), png).unwrap();
    tree(&m)
}

#[test]
fn import_then_export_round_trips_exactly_and_writes_plaintext_only_to_the_export() {
    let v = TestVault::new();
    let src = v.tmp.path().join("src");
    let want = source(&src);
    let n = v.commits();
    let o = v
        .cmd()
        .args(["import"])
        .arg(&src)
        .args(["--session", "migration"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(v.commits(), n + 1, "one commit for the whole import");
    let h = v
        .cmd()
        .args(["history", "--json", "--limit", "1"])
        .output()
        .unwrap();
    let top: serde_json::Value = serde_json::from_slice(&h.stdout).unwrap();
    assert_eq!(top["op"], "import");
    assert_eq!(top["session"], "migration");
    // Hidden files are imported but stay out of listings.
    let listing = v.one(json!({"command": "view", "path": "/memories"}));
    assert!(!text(&listing).contains(".hidden"), "{}", text(&listing));
    let hidden = v.one(json!({"command": "view", "path": "/memories/.hidden"}));
    assert!(text(&hidden).contains("hidden"));
    // The vault holds no plaintext; the source and export are the user's.
    std::fs::remove_dir_all(&src).unwrap();
    assert!(plaintext_anywhere(&v.vault, MARK).is_empty());
    let out = v.tmp.path().join("audit");
    let o = v.cmd().arg("export").arg(&out).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(tree(&out.join("memories")), want);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&out.join("memories/notes.md")), 0o600);
        assert_eq!(mode(&out.join("memories/projects")), 0o700);
    }
    // An export is importable again (the SDK layout), into a fresh vault.
    let w = TestVault::new();
    let o = w.cmd().arg("import").arg(&out).output().unwrap();
    assert!(o.status.success());
    let again = w.tmp.path().join("again");
    assert!(
        w.cmd()
            .arg("export")
            .arg(&again)
            .output()
            .unwrap()
            .status
            .success()
    );
    assert_eq!(tree(&again.join("memories")), want);
}

#[test]
fn import_never_overwrites_and_export_never_writes_into_a_non_empty_directory() {
    let v = TestVault::new();
    v.one(json!({"command": "create", "path": "/memories/notes.md", "file_text": "mine\n"}));
    let src = v.tmp.path().join("src");
    source(&src);
    let n = v.commits();
    let o = v.cmd().arg("import").arg(&src).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("/memories/notes.md") && err.contains("nothing was imported"),
        "{err}"
    );
    assert_eq!(v.commits(), n);
    assert!(
        text(&v.one(json!({"command": "view", "path": "/memories/notes.md"}))).contains("mine")
    );
    // A directory that cannot be a memory path is refused before anything.
    std::fs::write(src.join("memories/bad\u{7}name"), "x").unwrap();
    let o = v.cmd().arg("import").arg(&src).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(v.commits(), n);
    // Export into a non-empty directory is refused and touches nothing.
    let target = v.tmp.path().join("busy");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("keep.txt"), "keep").unwrap();
    let o = v.cmd().arg("export").arg(&target).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(tree(&target).len(), 1);
}

#[test]
fn import_applies_the_secret_filter_to_text() {
    let v = TestVault::new();
    let src = v.tmp.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("billing.md"), format!("key: {STRIPE}\n")).unwrap();
    let o = v.cmd().arg("import").arg(&src).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("redacted"));
    let r = v.one(json!({"command": "view", "path": "/memories/billing.md"}));
    assert!(!text(&r).contains(STRIPE));
    assert!(text(&r).contains("[REDACTED:"), "{}", text(&r));
    assert!(plaintext_anywhere(&v.vault, STRIPE).is_empty());
}

/// Empty folders cannot be kept (a vault keeps files): an import says how
/// many it left out, each nested one too (round 38b: a folder of empty
/// folders counted as one).
#[test]
fn import_names_the_empty_folders_it_leaves_out() {
    let v = TestVault::new();
    let src = v.tmp.path().join("src");
    for d in ["kept", "empty", "nested/deeper/deepest"] {
        std::fs::create_dir_all(src.join(d)).unwrap();
    }
    std::fs::write(src.join("kept/a.md"), "a\n").unwrap();
    let o = v.cmd().arg("import").arg(&src).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(said.contains("imported 1 file"), "{said}");
    assert!(
        said.contains("left out 4 folders holding no file"),
        "{said}"
    );
}

/// Round 38b: an export's `OUT/memories` holding only a `memories/`
/// folder (the vault's `/memories/memories/`) is read as a base, with a
/// note naming the other reading (it lost a level without a word), and
/// `import OUT` keeps that level; a file `view` could not show (over
/// 999,999 lines) is refused, and a size refusal says when the markers of
/// redacted secrets made the file grow.
#[test]
fn import_names_the_other_reading_of_a_memories_folder_and_refuses_files_no_command_could_write() {
    let v = TestVault::new();
    let r =
        v.one(json!({"command": "create", "path": "/memories/memories/x.md", "file_text": "x\n"}));
    assert!(!is_error(&r), "{r}");
    let out = v.tmp.path().join("out");
    let o = v.cmd().arg("export").arg(&out).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let u = TestVault::new();
    let o = u
        .cmd()
        .arg("import")
        .arg(out.join("memories"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(said.contains("holds only a memories/ folder"), "{said}");
    assert!(said.contains("import the folder that holds"), "{said}");
    let r = u.one(json!({"command": "view", "path": "/memories/x.md"}));
    assert!(!is_error(&r), "{r}");
    let w = TestVault::new();
    let o = w.cmd().arg("import").arg(&out).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = w.one(json!({"command": "view", "path": "/memories/memories/x.md"}));
    assert!(!is_error(&r), "{r}");

    let src = v.tmp.path().join("lines");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("many.md"), "\n".repeat(1_000_000)).unwrap();
    let o = w.cmd().arg("import").arg(&src).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("/memories/many.md is 1000000 lines, over the limit of 999,999 lines"),
        "{e}"
    );
    let r = w.one(json!({"command": "view", "path": "/memories/many.md"}));
    assert!(is_error(&r), "{r}");

    let o = w
        .cmd()
        .args(["config", "set", "max_file_bytes", "200"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let src = v.tmp.path().join("keys");
    std::fs::create_dir_all(&src).unwrap();
    let keys = "AKIAIOSFODNN7EXAMPLQ\n".repeat(9);
    assert!(keys.len() <= 200);
    std::fs::write(src.join("keys.md"), &keys).unwrap();
    let o = w.cmd().arg("import").arg(&src).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("bytes once its secrets are replaced by [REDACTED:…] markers, over this vault's limit of 200"),
        "{e}"
    );
}

/// Export never writes inside the vault (which holds no readable
/// content), and an export of a revision whose files were erased since
/// writes the rest and names what it left out. Import refuses a folder
/// holding `memories/` beside other entries (which was meant?) and a
/// `memories` that is a link, and shows names with their control
/// characters escaped.
#[test]
fn export_stays_out_of_the_vault_and_skips_erased_versions_and_import_refuses_ambiguity() {
    let v = TestVault::new();
    for (p, t) in [
        ("/memories/keep.md", "keep\n"),
        ("/memories/gone.md", "gone\n"),
    ] {
        let r = v.one(json!({"command": "create", "path": p, "file_text": t}));
        assert!(!is_error(&r), "{r}");
    }
    for inside in [v.vault.join("inside"), v.vault.join("memvault/x")] {
        let out = v.cmd().arg("export").arg(&inside).output().unwrap();
        assert_eq!(out.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&out.stderr).contains("inside the vault"));
        assert!(!inside.exists());
    }
    let out = v
        .cmd()
        .args(["purge", "/memories/gone.md"])
        .output()
        .unwrap();
    ok(&out);
    let to = v.tmp.path().join("audit");
    let out = v
        .cmd()
        .arg("export")
        .arg(&to)
        .args(["--at", "HEAD~1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("left out 1 file") && err.contains("/memories/gone.md"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(to.join("memories/keep.md")).unwrap(),
        "keep\n"
    );
    assert!(!to.join("memories/gone.md").exists());

    let refs = String::from_utf8(git(&v.vault, &["for-each-ref"]).stdout).unwrap();
    let amb = v.tmp.path().join("amb");
    std::fs::create_dir_all(amb.join("memories")).unwrap();
    std::fs::write(amb.join("memories/inner.md"), "inner\n").unwrap();
    std::fs::write(amb.join("top.md"), "top\n").unwrap();
    let out = v.cmd().arg("import").arg(&amb).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("other entr"));
    let linked = v.tmp.path().join("linked");
    std::fs::create_dir_all(&linked).unwrap();
    std::os::unix::fs::symlink(amb.join("memories"), linked.join("memories")).unwrap();
    let out = v.cmd().arg("import").arg(&linked).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("symbolic link"));
    let odd = v.tmp.path().join("odd");
    std::fs::create_dir_all(odd.join("memories")).unwrap();
    std::fs::write(odd.join("memories/a\u{1b}]0;pwned\u{7}.md"), "z\n").unwrap();
    let out = v.cmd().arg("import").arg(&odd).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        !out.stderr.contains(&0x1b),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(git(&v.vault, &["for-each-ref"]).stdout).unwrap(),
        refs
    );
}

/// A secret in text saved as UTF-16 (a Windows "Unicode" text file, with
/// or without its byte order mark, or an image's UTF-16 strings) is found
/// and the import refused, changing nothing; a file over the size limit is
/// refused from its size, before it is read (a sparse 2 GiB file here);
/// a file in the vault where a folder would go is named as such.
#[test]
fn import_finds_utf16_secrets_and_refuses_oversize_files_before_reading_them() {
    let v = TestVault::new();
    v.one(json!({"command": "create", "path": "/memories/c.md", "file_text": "x\n"}));
    let commits = v.commits();
    let utf16 = |bom: bool, text: &str| {
        let mut b: Vec<u8> = if bom { vec![0xFF, 0xFE] } else { Vec::new() };
        b.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
        b
    };
    let mut png = b"\x89PNG\r\n\x1a\n\x00\xff".to_vec();
    png.extend(utf16(false, &format!(" {STRIPE} ")));
    png.extend(b"\x00\xff");
    for (name, bytes) in [
        ("bom.md", utf16(true, &format!("key = {STRIPE}\n"))),
        ("plain.md", utf16(false, &format!("key = {STRIPE}\n"))),
        ("shot.png", png),
        (
            "wide.md",
            format!("key = {STRIPE}\n")
                .chars()
                .flat_map(|c| u32::from(c).to_be_bytes())
                .collect(),
        ),
    ] {
        let src = v.tmp.path().join(format!("src-{name}"));
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join(name), bytes).unwrap();
        let o = v.cmd().arg("import").arg(&src).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{name}: {err}");
        assert!(err.contains("holds secrets (stripe"), "{name}: {err}");
        assert!(!err.contains(STRIPE));
    }
    // Over the limit: refused at once, from its size.
    let src = v.tmp.path().join("src-big");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::File::create(src.join("big.md"))
        .unwrap()
        .set_len(2 << 30)
        .unwrap();
    let o = v.cmd().arg("import").arg(&src).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("is 2147483648 bytes, over this vault's limit"),
        "{err}"
    );
    // A file where the import needs a folder.
    let src = v.tmp.path().join("src-in-the-way");
    std::fs::create_dir_all(src.join("c.md")).unwrap();
    std::fs::write(src.join("c.md/inner.md"), "y\n").unwrap();
    let o = v.cmd().arg("import").arg(&src).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "/memories/c.md/inner.md (the file /memories/c.md is where its folder would be)"
        ),
        "{err}"
    );
    assert_eq!(v.commits(), commits, "a refused import changed the vault");
}
