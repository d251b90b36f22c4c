//! Secrets as people write them in notes, with no `KEY=value` around
//! them: passwords on command lines that take them as arguments
//! (`htpasswd -b`, `net use`, `smbclient -U user%pw`, `gh secret set
//! --body`), base64 credentials (`_auth=`, a Docker `auth`, a base64
//! database URL), seed phrases and lists of recovery codes, and the
//! checks of the prose and configuration rules in `rules.rs`.

use data_encoding::BASE64;

use super::assign::command_value;
use super::checks::{Classes, is_placeholder, random_suffix, reads_like_words};

/// The longest command line read after a tool's name.
const MAX_LINE: usize = 600;

/// One argument of a command line: its span in the text, without quotes.
#[derive(Clone, Copy)]
struct Arg {
    start: usize,
    end: usize,
}

/// The arguments after `from` to the end of the command (a line break, or
/// `|`, `;`, `&&`, `||` outside quotes), at most [`MAX_LINE`] bytes.
fn args(b: &[u8], from: usize) -> (Vec<Arg>, usize) {
    let limit = (from + MAX_LINE).min(b.len());
    let mut out = Vec::new();
    let mut i = from;
    while i < limit {
        match b[i] {
            b'\n' | b'\r' | b'|' | b';' => break,
            b'&' if b.get(i + 1) == Some(&b'&') => break,
            b' ' | b'\t' => i += 1,
            q @ (b'"' | b'\'') => {
                let start = i + 1;
                let mut j = start;
                while j < limit && b[j] != q && b[j] != b'\n' {
                    j += 1;
                }
                out.push(Arg { start, end: j });
                i = j + 1;
            }
            _ => {
                let start = i;
                while i < limit && !matches!(b[i], b' ' | b'\t' | b'\n' | b'\r' | b'"' | b'\'') {
                    if b[i] == b';' || b[i] == b'|' {
                        break;
                    }
                    i += 1;
                }
                out.push(Arg { start, end: i });
            }
        }
    }
    (out, i)
}

/// Passwords given as command arguments, the hit being the command's
/// name (`htpasswd`, `rabbitmqctl`, `net use`, `net user`, `smbclient`,
/// `lftp`, `gh secret`, `openssl`, `ssh-keygen`, `npm config set`, and
/// `az` commands that create servers or machines).
pub(crate) fn command_args(
    text: &str,
    s: usize,
    e: usize,
    skip: &mut usize,
) -> Option<(usize, usize)> {
    let b = text.as_bytes();
    if s > 0 && (b[s - 1].is_ascii_alphanumeric() || matches!(b[s - 1], b'_' | b'-' | b'.' | b'/'))
    {
        return None;
    }
    let name = b[s..e].to_ascii_lowercase();
    // The tool's name ends at a word boundary.
    if b.get(e)
        .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
    {
        return None;
    }
    let (a, end) = args(b, e);
    *skip = end;
    let arg = |i: usize| a.get(i).map(|x| &b[x.start..x.end]);
    let span = |x: Arg| -> Option<(usize, usize)> {
        command_value(&b[x.start..x.end]).then_some((x.start, x.end))
    };
    // The value of a flag: `-p VALUE`, `--password=VALUE`, `-pVALUE` for
    // single-letter flags that take it attached.
    let flag_value = |flags: &[&[u8]]| -> Option<(usize, usize)> {
        for (i, x) in a.iter().enumerate() {
            let t = &b[x.start..x.end];
            for f in flags {
                if t == *f {
                    return a.get(i + 1).and_then(|&v| span(v));
                }
                if t.len() > f.len() + 1 && t.starts_with(f) && t[f.len()] == b'=' {
                    return span(Arg {
                        start: x.start + f.len() + 1,
                        end: x.end,
                    });
                }
            }
        }
        None
    };
    let positionals = |skip_flags_with_value: &[&[u8]]| -> Vec<Arg> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < a.len() {
            let t = &b[a[i].start..a[i].end];
            if t.len() > 1 && t[0] == b'-' {
                i += 1 + usize::from(skip_flags_with_value.contains(&t));
                continue;
            }
            out.push(a[i]);
            i += 1;
        }
        out
    };
    match name.as_slice() {
        b"htpasswd" => {
            // `-b`: the password is an argument: `htpasswd -b[c] FILE USER
            // PASSWORD`, or `htpasswd -nb USER PASSWORD` (no file).
            let flags: Vec<&[u8]> = a
                .iter()
                .map(|x| &b[x.start..x.end])
                .filter(|t| t.len() > 1 && t[0] == b'-')
                .collect();
            let has = |c: u8| {
                flags
                    .iter()
                    .any(|f| !f.starts_with(b"--") && f.contains(&c))
            };
            if !has(b'b') {
                return None;
            }
            let pos = positionals(&[b"-C", b"-r"]);
            span(*pos.get(if has(b'n') { 1 } else { 2 })?)
        }
        b"rabbitmqctl" => {
            let pos = positionals(&[b"-n", b"--node"]);
            let sub = &b[pos.first()?.start..pos.first()?.end];
            (sub == b"change_password" || sub == b"add_user")
                .then(|| span(*pos.get(2)?))
                .flatten()
        }
        b"net use" | b"net user" => {
            // `net use [X:] \\host\share PASSWORD /user:NAME`, `net user
            // NAME PASSWORD [/add]`: switches aside, `*` asks for it.
            let pos: Vec<Arg> = a
                .iter()
                .copied()
                .filter(|x| !b[x.start..x.end].starts_with(b"/"))
                .collect();
            let at = if name.as_slice() == b"net use" {
                let unc = pos
                    .iter()
                    .position(|x| b[x.start..x.end].starts_with(b"\\\\"))?;
                unc + 1
            } else {
                1
            };
            let pw = *pos.get(at)?;
            (&b[pw.start..pw.end] != b"*").then(|| span(pw)).flatten()
        }
        b"smbclient" | b"rpcclient" | b"smbmap" | b"crackmapexec" | b"netexec" => {
            // `-U [DOMAIN\]user%password`, `--user=...`.
            let (_, user) = flag_value(&[b"-U", b"--user"]).or_else(|| {
                a.iter().find_map(|x| {
                    let t = &b[x.start..x.end];
                    (t.len() > 2 && t.starts_with(b"-U")).then_some((x.start + 2, x.end))
                })
            })?;
            let (us, ue) = a.iter().find(|x| x.end == user).map(|x| {
                let t = &b[x.start..x.end];
                let from = if t.starts_with(b"-U") || t.starts_with(b"--user=") {
                    x.start + t.iter().position(|&c| c == b'=').map_or(2, |p| p + 1)
                } else {
                    x.start
                };
                (from, x.end)
            })?;
            let pct = b[us..ue].iter().position(|&c| c == b'%')?;
            span(Arg {
                start: us + pct + 1,
                end: ue,
            })
        }
        b"lftp" => {
            let (us, ue) = flag_value(&[b"-u", b"--user"]).or_else(|| {
                let i = a.iter().position(|x| &b[x.start..x.end] == b"-u")?;
                a.get(i + 1).map(|x| (x.start, x.end))
            })?;
            let comma = b[us..ue].iter().position(|&c| c == b',')?;
            // Anonymous FTP's password is a convention, not a secret.
            if matches!(&b[us..us + comma], b"anonymous" | b"ftp") {
                return None;
            }
            span(Arg {
                start: us + comma + 1,
                end: ue,
            })
        }
        b"gh secret" => {
            // `gh secret set NAME --body VALUE` (`-b VALUE`, `--body=VALUE`).
            if arg(0)? != b"set" {
                return None;
            }
            // `--body us-east-1` sets a plain setting: only a value shaped
            // like a password or a token is taken.
            let (vs, ve) = flag_value(&[b"--body", b"-b"])?;
            let v = &b[vs..ve];
            let c = Classes::of(v);
            (strong_password(v) || (v.len() >= 16 && c.digit && c.letter() && random_suffix(v, 0)))
                .then_some((vs, ve))
        }
        b"openssl" => match arg(0)? {
            b"passwd" => {
                let pos = positionals(&[b"-salt", b"-in"]);
                span(*pos.get(1)?)
            }
            _ => flag_value(&[b"-k"]).or_else(|| {
                // `-pass pass:VALUE`, `-passin pass:VALUE`, `-passout pass:VALUE`.
                let (vs, ve) = a.iter().enumerate().find_map(|(i, x)| {
                    let t = &b[x.start..x.end];
                    matches!(t, b"-pass" | b"-passin" | b"-passout")
                        .then(|| a.get(i + 1).map(|v| (v.start, v.end)))
                        .flatten()
                })?;
                b[vs..ve].starts_with(b"pass:").then(|| {
                    span(Arg {
                        start: vs + 5,
                        end: ve,
                    })
                })?
            }),
        },
        b"npm config set" | b"npm set" | b"yarn config set" | b"pnpm config set" => {
            // `//registry/:_authToken VALUE`, `//registry/:_authToken=VALUE`
            // (and `_auth`, `_password`).
            let key = a.iter().position(|x| {
                let t = &b[x.start..x.end];
                [
                    &b":_authToken"[..],
                    b":_auth",
                    b":_password",
                    b"_authToken",
                    b"_auth",
                ]
                .iter()
                .any(|k| {
                    t.ends_with(k)
                        || t.windows(k.len() + 1)
                            .any(|w| w.starts_with(k) && w[k.len()] == b'=')
                })
            })?;
            let x = a[key];
            let t = &b[x.start..x.end];
            let v = match t.iter().position(|&c| c == b'=') {
                Some(eq) => Arg {
                    start: x.start + eq + 1,
                    end: x.end,
                },
                None => *a.get(key + 1)?,
            };
            // npm's tokens may be UUIDs.
            let t = &b[v.start..v.end];
            (t.len() >= 8 && !matches!(t[0], b'$' | b'<' | b'{') && !is_placeholder(t))
                .then_some((v.start, v.end))
        }
        _ if name.starts_with(b"az ") => flag_value(&[
            b"-p",
            b"--password",
            b"--admin-password",
            b"--administrator-login-password",
            b"--admin-pass",
            b"--secret",
        ]),
        _ => None,
    }
}

/// A value after a password word in a sentence or a note (`pass X`,
/// `mot de passe : X`, `Passwort lautet X`): a chosen password's shape.
/// A closing parenthesis or sentence mark after the value is read with it
/// (and redacted with it), not judged as part of it.
pub(crate) fn prose_password(v: &[u8]) -> bool {
    super::assign::prose_password(trim_closing(v))
}

/// [`prose_password`] where only a weak word names the value: a strong
/// password's shape (see `assign::strong_password`).
pub(crate) fn strong_password(v: &[u8]) -> bool {
    let v = trim_closing(v);
    // Wi-Fi security modes (`WPA2-Enterprise`, `PEAP-MSCHAPv2`).
    let mode = [&b"WPA"[..], b"WEP", b"PEAP", b"EAP", b"TTLS", b"802.1"]
        .iter()
        .any(|m| v.starts_with(m));
    !mode && super::assign::strong_password(v)
}

/// A passphrase given to `ssh-keygen -N` or `-P`: not one lower-case word
/// (the manual's `newphrase`).
pub(crate) fn keygen_passphrase(v: &[u8]) -> bool {
    !v.iter().all(u8::is_ascii_lowercase) && super::assign::command_value(v)
}

/// A value without the closing parenthesis or sentence mark read with it.
fn trim_closing(v: &[u8]) -> &[u8] {
    let end = v.len()
        - v.iter()
            .rev()
            .take_while(|&&c| matches!(c, b')' | b']' | b'.' | b',' | b';' | b':' | b'!' | b'?'))
            .count();
    if end >= 6 && !v[..end].contains(&b'(') {
        &v[..end]
    } else {
        v
    }
}

/// A door, gate or alarm code: four or more characters, digits among them.
pub(crate) fn access_code(v: &[u8]) -> bool {
    let v = trim_closing(v);
    ((4..=12).contains(&v.len()) && v.iter().all(u8::is_ascii_digit) && !is_placeholder(v))
        || strong_password(v)
}

/// A session cookie's value: long, and not a word or a placeholder.
pub(crate) fn cookie_value(v: &[u8]) -> bool {
    let c = Classes::of(v);
    v.len() >= 16 && (c.digit || (c.upper && c.lower)) && !is_placeholder(v) && !reads_like_words(v)
}

/// A network device's secret: not a placeholder, and not an ordinary
/// word (`snmp-server community string ...`, `password 7 encryption`).
pub(crate) fn device_secret(v: &[u8]) -> bool {
    v.len() >= 4
        && v.iter().any(u8::is_ascii_alphanumeric)
        && !is_placeholder(v)
        && !v.iter().all(|c| c.is_ascii_lowercase() || *c == b'-')
        && !v.iter().all(u8::is_ascii_uppercase)
        && !matches!(v[0], b'$' | b'<' | b'{' | b'.')
}

/// `user:password`, `test:test`: a documentation template or a default
/// login, not a secret.
fn template_login(user: &[u8], pw: &[u8]) -> bool {
    let word = |w: &[u8], list: &[&[u8]]| list.iter().any(|x| w.eq_ignore_ascii_case(x));
    user.eq_ignore_ascii_case(pw)
        || (word(
            user,
            &[b"user", b"username", b"usr", b"login", b"name", b"admin"],
        ) && word(
            pw,
            &[b"password", b"pass", b"passwd", b"pwd", b"pw", b"secret"],
        ))
}

/// Base64 text, padded or not.
fn base64_decode(v: &[u8]) -> Option<Vec<u8>> {
    let mut padded = v.to_vec();
    while !padded.len().is_multiple_of(4) {
        padded.push(b'=');
    }
    BASE64.decode(&padded).ok()
}

/// Base64 of `user:password` (HTTP Basic, npm's `_auth`, a Docker
/// `auth`), or of a registry config holding credentials.
pub(crate) fn base64_credentials(v: &[u8]) -> bool {
    let Some(plain) = base64_decode(v) else {
        return false;
    };
    if plain.starts_with(b"{") {
        return docker_config(&plain);
    }
    let printable = plain
        .iter()
        .all(|&c| (0x21..0x7f).contains(&c) || c == b' ');
    let Some(colon) = plain.iter().position(|&c| c == b':') else {
        return false;
    };
    let pw = &plain[colon + 1..];
    // `User:12345`: a type and an id (a GraphQL node id), not a login.
    printable
        && colon >= 1
        && pw.len() >= 4
        && !pw.iter().all(u8::is_ascii_digit)
        && !is_placeholder(pw)
        && !template_login(&plain[..colon], pw)
}

/// A Docker registry config (`.dockerconfigjson`) holding credentials.
fn docker_config(plain: &[u8]) -> bool {
    let s = String::from_utf8_lossy(plain);
    (s.contains("\"auths\"") || s.contains("\"credHelpers\"") || s.contains("\"auth\""))
        && (s.contains("\"auth\"") || s.contains("\"password\"") || s.contains("\"identitytoken\""))
}

/// Base64 of a `.dockerconfigjson`.
pub(crate) fn base64_docker_config(v: &[u8]) -> bool {
    base64_decode(v).is_some_and(|p| docker_config(&p))
}

/// Base64 of a URL with a password (`postgres://app:pw@db/app`).
pub(crate) fn base64_url_with_password(v: &[u8]) -> bool {
    let Some(plain) = base64_decode(v) else {
        return false;
    };
    let Some(scheme) = plain.windows(3).position(|w| w == b"://") else {
        return false;
    };
    let rest = &plain[scheme + 3..];
    let Some(at) = rest.iter().rposition(|&c| c == b'@') else {
        return false;
    };
    let userinfo = &rest[..at];
    userinfo.iter().position(|&c| c == b':').is_some_and(|c| {
        userinfo.len() - c > 3
            && !is_placeholder(&userinfo[c + 1..])
            && !template_login(&userinfo[..c], &userinfo[c + 1..])
    })
}

/// A TOTP seed named as such (an `otpauth://` URI's `secret=`, or a value
/// next to a TOTP, 2FA or MFA keyword): base32, and random, letters alone
/// allowed (about one seed in thirty has no digit).
pub(crate) fn named_base32_seed(v: &[u8]) -> bool {
    let compact: Vec<u8> = v
        .iter()
        .copied()
        .filter(|&b| b != b' ' && b != b'=')
        .collect();
    let c = Classes::of(&compact);
    compact.len() >= 16
        && c.letter()
        && random_suffix(&compact, 0)
        && !reads_like_words(&compact)
        && !reads_like_words(&compact.to_ascii_lowercase())
        && !is_placeholder(&compact)
        // Letters alone: random base32 has about one vowel in five;
        // `SOFTWARETOKENMFA`, `VIRTUALMFADEVICE` are words.
        && (c.digit || {
            let vowels = compact
                .iter()
                .filter(|b| matches!(b.to_ascii_uppercase(), b'A' | b'E' | b'I' | b'O' | b'U'))
                .count();
            vowels * 10 < compact.len() * 3
        })
}

/// The BIP-0039 English word list (bitcoin/bips, BSD-2-Clause), sorted.
static BIP39: &str = include_str!("bip39_english.txt");

fn bip39_words() -> &'static [&'static str] {
    static WORDS: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    WORDS.get_or_init(|| BIP39.split_ascii_whitespace().collect())
}

fn is_bip39(w: &[u8]) -> bool {
    let Ok(w) = std::str::from_utf8(w) else {
        return false;
    };
    bip39_words().binary_search(&w).is_ok()
}

/// A wallet's seed phrase: twelve or more words of the BIP-0039 list in a
/// row (separated by blanks, line breaks, commas or list numbers), found
/// after a keyword such as `seed`, `mnemonic` or `recovery phrase`.
pub(crate) fn seed_phrase(
    text: &str,
    _s: usize,
    e: usize,
    skip: &mut usize,
) -> Option<(usize, usize)> {
    let b = text.as_bytes();
    let limit = (e + 800).min(b.len());
    let mut i = e;
    // The current run of list words: its start, its last word's end, its
    // length.
    let mut run: Option<(usize, usize, usize)> = None;
    let mut best: Option<(usize, usize)> = None;
    while i < limit {
        if !b[i].is_ascii_alphanumeric() {
            // Blanks, line breaks, commas, quotes, list marks.
            if !matches!(
                b[i],
                b' ' | b'\t'
                    | b'\n'
                    | b'\r'
                    | b','
                    | b'.'
                    | b')'
                    | b'-'
                    | b'"'
                    | b'\''
                    | b'['
                    | b']'
                    | b':'
                    | b'='
            ) {
                run = None;
            }
            i += 1;
            continue;
        }
        let ws = i;
        while i < limit && b[i].is_ascii_alphanumeric() {
            i += 1;
        }
        let w = &b[ws..i];
        if w.iter().all(u8::is_ascii_digit) && w.len() <= 2 {
            continue; // a list number
        }
        if w.iter().all(u8::is_ascii_lowercase) && is_bip39(w) {
            let (start, _, n) = run.unwrap_or((ws, i, 0));
            run = Some((start, i, n + 1));
            if n + 1 >= 12 {
                best = Some((start, i));
                if n + 1 == 24 {
                    break;
                }
            }
        } else if best.is_some() {
            break;
        } else {
            run = None;
        }
    }
    // A phrase that starts in the first part of the window was found
    // whole: a later keyword there need not look again.
    *skip = i.saturating_sub(300).max(e);
    let (start, end) = best?;
    *skip = end;
    // Test phrases repeat words (`test test ... junk`, BIP-0039's test
    // vectors); Ganache's default is public.
    let words: Vec<&[u8]> = b[start..end]
        .split(|c| !c.is_ascii_lowercase())
        .filter(|w| !w.is_empty())
        .collect();
    let mut distinct = words.clone();
    distinct.sort_unstable();
    distinct.dedup();
    let public = words.starts_with(&[&b"candy"[..], b"maple", b"cake"]);
    (distinct.len() + 1 >= words.len() && !public).then_some((start, end))
}

/// Whether `t` is shaped like one recovery code: `0314c-c3a58` (GitHub),
/// `4688 0435` (Google; joined by the caller), `JTH2-NN43-40GI`, or eight
/// to twelve digits.
fn recovery_code(t: &[u8]) -> bool {
    let groups: Vec<&[u8]> = t.split(|&c| c == b'-' || c == b' ').collect();
    if !Classes::of(t).digit {
        return false;
    }
    let mixed = |g: &&&[u8]| {
        let c = Classes::of(g);
        c.digit && c.letter()
    };
    match groups.len() {
        1 => (8..=12).contains(&t.len()) && t.iter().all(u8::is_ascii_digit),
        // Groups of one size (`0314c-c3a58`, `JTH2-NN43-40GI`), digits or
        // mostly mixed (`PROJ-1234` is a label and a number).
        2..=4 => {
            groups
                .iter()
                .all(|g| (4..=6).contains(&g.len()) && g.iter().all(u8::is_ascii_alphanumeric))
                && groups.iter().all(|g| g.len() == groups[0].len())
                && (t
                    .iter()
                    .all(|b| b.is_ascii_digit() || matches!(b, b' ' | b'-'))
                    || groups.iter().filter(mixed).count() * 2 >= groups.len())
        }
        _ => false,
    }
}

/// A list of two-factor recovery (backup) codes after a keyword such as
/// `recovery codes` or `backup_codes`: redacted from the first code to
/// the last (list marks between them included).
pub(crate) fn recovery_codes(
    text: &str,
    _s: usize,
    e: usize,
    skip: &mut usize,
) -> Option<(usize, usize)> {
    let b = text.as_bytes();
    let limit = (e + 2000).min(b.len());
    let is_code_byte = |c: u8| c.is_ascii_alphanumeric() || c == b'-';
    let mut i = e;
    let mut first: Option<usize> = None;
    let mut last_end = 0;
    let mut count = 0;
    let mut words_before = 0;
    let mut gap = 0;
    while i < limit {
        if !is_code_byte(b[i]) {
            i += 1;
            continue;
        }
        let ts = i;
        while i < limit && is_code_byte(b[i]) {
            i += 1;
        }
        let mut te = i;
        // `4688 0435`: two groups of four digits.
        if te - ts == 4
            && b[ts..te].iter().all(u8::is_ascii_digit)
            && b.get(te) == Some(&b' ')
            && te + 5 <= limit
            && b[te + 1..te + 5].iter().all(u8::is_ascii_digit)
            && !b.get(te + 5).is_some_and(|c| is_code_byte(*c))
        {
            te += 5;
            i = te;
        }
        let t = &b[ts..te];
        let compact: Vec<u8> = t
            .iter()
            .copied()
            .filter(u8::is_ascii_alphanumeric)
            .collect();
        let patterned = is_placeholder(&compact)
            || compact.windows(2).all(|w| w[1] == w[0].wrapping_add(1))
            || compact.windows(2).all(|w| w[1].wrapping_add(1) == w[0]);
        if recovery_code(t) && !patterned {
            first.get_or_insert(ts);
            last_end = te;
            count += 1;
            gap = 0;
        } else if t.len() <= 2 && t.iter().all(|c| c.is_ascii_digit() || *c == b'-') {
            // A list number or mark.
        } else if first.is_some() {
            // A note beside a code (`(used)`, `used 2024-05-01`, `and
            // also`): the list goes on if a code follows soon.
            gap += 1;
            if gap > 5 {
                break;
            }
        } else {
            words_before += 1;
            if words_before > 12 {
                *skip = i;
                return None;
            }
        }
    }
    *skip = i.saturating_sub(600).max(e);
    let first = first?;
    // Labels that share a prefix (`LTO8-0001`, `LTO8-0002`) are no codes.
    let codes: Vec<&[u8]> = b[first..last_end]
        .split(|c| !(c.is_ascii_alphanumeric() || *c == b'-'))
        .filter(|w| w.len() >= 4 && recovery_code(w))
        .collect();
    if codes.len() >= 2 && codes.iter().all(|w| w[..4] == codes[0][..4]) {
        return None;
    }
    (count >= 2).then(|| {
        *skip = last_end;
        (first, last_end)
    })
}

/// Whether a table cell names a credential (`password`, `root pw`,
/// `Creds`, `API key`, `mot de passe`): a short label.
fn credential_label(cell: &str) -> Option<Label> {
    let l = cell
        .trim()
        .trim_matches('*')
        .trim_matches('`')
        .trim()
        .to_lowercase();
    if l.is_empty() || l.len() > 32 || l.split_whitespace().count() > 4 {
        return None;
    }
    let words: Vec<&str> = l
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let has = |w: &str| words.contains(&w);
    if has("creds") || has("credentials") || has("login") && words.len() > 1 {
        return Some(Label::Pair);
    }
    let named = [
        "password",
        "passwort",
        "passwd",
        "pass",
        "pw",
        "pwd",
        "passphrase",
        "passcode",
        "pin",
        "secret",
        "token",
        "contraseña",
        "kennwort",
        "mdp",
    ]
    .iter()
    .any(|w| has(w))
        || l.contains("mot de passe")
        || l.contains("api key")
        || l.contains("apikey")
        || l.contains("api_key");
    // `password policy`, `token expiry`: a column about them, not of them.
    let about = [
        "policy",
        "length",
        "expiry",
        "expires",
        "expiration",
        "rotation",
        "hint",
        "reset",
        "type",
        "rules",
        "manager",
        "strength",
        "scope",
        "scopes",
        "count",
        "ttl",
        "name",
        "id",
        "location",
        "stored",
        "where",
        "vault",
    ]
    .iter()
    .any(|w| has(w));
    (named && !about).then_some(Label::Secret)
}

/// What a table column of credentials holds.
#[derive(Clone, Copy, PartialEq)]
enum Label {
    /// The secret itself.
    Secret,
    /// `user / password` or `user:password`.
    Pair,
}

/// The cells of a table row (`| a | b |`): their spans inside the line,
/// without the bars, or None when the line is no table row.
fn cells(b: &[u8], ls: usize, le: usize) -> Option<Vec<(usize, usize)>> {
    let mut i = ls;
    while i < le && (b[i] == b' ' || b[i] == b'\t') {
        i += 1;
    }
    if i >= le || b[i] != b'|' {
        return None;
    }
    let mut out = Vec::new();
    let mut start = i + 1;
    let mut j = i + 1;
    while j < le {
        if b[j] == b'\\' {
            j += 2;
            continue;
        }
        if b[j] == b'|' {
            out.push((start, j));
            start = j + 1;
        }
        j += 1;
    }
    if start < le && b[start..le].iter().any(|c| !c.is_ascii_whitespace()) {
        out.push((start, le));
    }
    Some(out)
}

/// A `|---|:--:|` row.
fn separator_row(b: &[u8], cells: &[(usize, usize)]) -> bool {
    !cells.is_empty()
        && cells.iter().all(|&(s, e)| {
            let c = &b[s..e];
            c.contains(&b'-') && c.iter().all(|&x| matches!(x, b'-' | b':' | b' ' | b'\t'))
        })
}

/// The line `[start, end)` around `pos`.
fn line_at(b: &[u8], pos: usize) -> (usize, usize) {
    let ls = b[..pos]
        .iter()
        .rposition(|&c| c == b'\n')
        .map_or(0, |i| i + 1);
    let le = b[pos..]
        .iter()
        .position(|&c| c == b'\n')
        .map_or(b.len(), |i| pos + i);
    let le = if le > ls && b[le - 1] == b'\r' {
        le - 1
    } else {
        le
    };
    (ls, le)
}

/// A table cell's value, trimmed of blanks and of the backticks or
/// asterisks around it.
fn cell_value(b: &[u8], (s, e): (usize, usize)) -> (usize, usize) {
    let (mut s, mut e) = (s, e);
    while s < e && matches!(b[s], b' ' | b'\t' | b'`' | b'*') {
        s += 1;
    }
    while e > s && matches!(b[e - 1], b' ' | b'\t' | b'`' | b'*') {
        e -= 1;
    }
    (s, e)
}

/// The secret of a cell in a credential column, if it holds one.
fn cell_secret(b: &[u8], cell: (usize, usize), label: Label) -> Option<(usize, usize)> {
    let (s, e) = cell_value(b, cell);
    let (s, e) = match label {
        Label::Secret => (s, e),
        Label::Pair => {
            // `admin / pw`, `admin:pw`; else the cell is the password.
            let v = &b[s..e];
            // A user name has a letter (`17378654:e742c240` is one secret).
            match v
                .iter()
                .position(|&c| c == b'/' || c == b':')
                .filter(|&k| v[..k].iter().any(u8::is_ascii_alphabetic))
            {
                Some(k) => {
                    let mut ps = s + k + 1;
                    while ps < e && b[ps] == b' ' {
                        ps += 1;
                    }
                    (ps, e)
                }
                None => (s, e),
            }
        }
    };
    let v = &b[s..e];
    let token = v.len() >= 8
        && !v.contains(&b' ')
        && Classes::of(v).digit
        && Classes::of(v).letter()
        && !is_placeholder(v);
    (prose_password(v) || token && super::assign::command_value(v)).then_some((s, e))
}

/// Markdown tables of credentials: a column headed `password`, `pw`,
/// `Creds`, `API key` ... (each row's cell in it), or a row whose first
/// cell names one (`| password | s3cr3t! |`: the next cell).
pub(crate) fn table_column(
    text: &str,
    s: usize,
    _e: usize,
    skip: &mut usize,
    out: &mut Vec<(usize, usize)>,
) {
    let b = text.as_bytes();
    let (ls, le) = line_at(b, s);
    // One look per line: later keywords on it are not looked at again
    // (keeps the work linear on a long line of keywords).
    *skip = le;
    let Some(row) = cells(b, ls, le) else {
        return;
    };
    let Some(k) = row.iter().position(|&(cs, ce)| cs <= s && s < ce) else {
        return;
    };
    let Ok(cell) = std::str::from_utf8(&b[row[k].0..row[k].1]) else {
        return;
    };
    let Some(label) = credential_label(cell) else {
        return;
    };
    // A header: the separator row follows, then the rows.
    let next = (le + 1..b.len()).find(|&i| b[i - 1] == b'\n');
    let header = next.and_then(|ns| {
        let (_, ne) = line_at(b, ns);
        cells(b, ns, ne).filter(|c| separator_row(b, c)).map(|_| ne)
    });
    match header {
        Some(mut at) => {
            let mut rows = 0;
            while at < b.len() && rows < 2000 {
                let ns = at + 1;
                if ns >= b.len() {
                    break;
                }
                let (_, ne) = line_at(b, ns);
                let Some(r) = cells(b, ns, ne) else {
                    break;
                };
                if let Some(&c) = r.get(k)
                    && let Some(span) = cell_secret(b, c, label)
                {
                    out.push(span);
                }
                at = ne;
                rows += 1;
            }
            *skip = at;
        }
        None => {
            // `| password | value |`: the key in one cell, its value in the next.
            if let Some(&c) = row.get(k + 1)
                && let Some(span) = cell_secret(b, c, label)
            {
                out.push(span);
            }
            *skip = le;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_credentials_need_a_user_and_a_password() {
        let enc = |s: &str| BASE64.encode(s.as_bytes());
        assert!(base64_credentials(enc("admin:S3cr3t!pw").as_bytes()));
        assert!(!base64_credentials(enc("just some text").as_bytes()));
        assert!(!base64_credentials(enc("admin:xxxx").as_bytes()));
        assert!(base64_url_with_password(
            enc("postgres://app:pw9x@db01:5432/app").as_bytes()
        ));
        assert!(!base64_url_with_password(
            enc("https://example.com/a@b").as_bytes()
        ));
    }

    #[test]
    fn recovery_codes_have_their_shapes() {
        for t in ["0314c-c3a58", "4688 0435", "JTH2-NN43-40GI", "2898616908"] {
            assert!(recovery_code(t.as_bytes()), "{t}");
        }
        for t in [
            "hello-world",
            "2026-11-03",
            "abcd",
            "v1.2.3",
            "PROJ-1234",
            "a1b2c3d4e5",
        ] {
            assert!(!recovery_code(t.as_bytes()), "{t}");
        }
    }

    #[test]
    fn the_word_list_is_whole_and_sorted() {
        let w = bip39_words();
        assert_eq!(w.len(), 2048);
        assert!(w.windows(2).all(|p| p[0] < p[1]));
        assert!(is_bip39(b"abandon") && is_bip39(b"zoo") && !is_bip39(b"the"));
    }
}
