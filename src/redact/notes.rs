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
        b"net use" => {
            // `net use [X:] \\host\share PASSWORD /user:NAME`.
            let pos: Vec<Arg> = a
                .iter()
                .copied()
                .filter(|x| !b[x.start..x.end].starts_with(b"/"))
                .collect();
            let unc = pos
                .iter()
                .position(|x| b[x.start..x.end].starts_with(b"\\\\"))?;
            let pw = *pos.get(unc + 1)?;
            (&b[pw.start..pw.end] != b"*").then(|| span(pw)).flatten()
        }
        b"net user" => {
            // `net user NAME PASSWORD [/add]`.
            let pos: Vec<Arg> = a
                .iter()
                .copied()
                .filter(|x| !b[x.start..x.end].starts_with(b"/"))
                .collect();
            let pw = *pos.get(1)?;
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
            flag_value(&[b"--body", b"-b"])
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
        b"ssh-keygen" => flag_value(&[b"-N", b"-P"]),
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
pub(crate) fn prose_password(v: &[u8]) -> bool {
    super::assign::prose_password(v)
}

/// A door, gate or alarm code: four or more characters, digits among them.
pub(crate) fn access_code(v: &[u8]) -> bool {
    let c = Classes::of(v);
    v.len() >= 4 && (c.digit || (c.upper && c.lower)) && !is_placeholder(v)
}

/// A session cookie's value: long, and not a word or a placeholder.
pub(crate) fn cookie_value(v: &[u8]) -> bool {
    let c = Classes::of(v);
    v.len() >= 16 && (c.digit || (c.upper && c.lower)) && !is_placeholder(v) && !reads_like_words(v)
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
    printable && colon >= 1 && plain.len() - colon > 3 && !is_placeholder(&plain[colon + 1..])
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
    userinfo
        .iter()
        .position(|&c| c == b':')
        .is_some_and(|c| userinfo.len() - c > 3 && !is_placeholder(&userinfo[c + 1..]))
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
        && !is_placeholder(&compact)
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
    let (start, end) = best?;
    *skip = end;
    Some((start, end))
}

/// Whether `t` is shaped like one recovery code: `0314c-c3a58` (GitHub),
/// `4688 0435` (Google; joined by the caller), `JTH2-NN43-40GI`, or eight
/// to twelve digits.
fn recovery_code(t: &[u8]) -> bool {
    let groups: Vec<&[u8]> = t.split(|&c| c == b'-' || c == b' ').collect();
    let c = Classes::of(t);
    if !c.digit {
        return false;
    }
    match groups.len() {
        1 => {
            (8..=12).contains(&t.len())
                && (t.iter().all(u8::is_ascii_digit) || (c.letter() && random_suffix(t, 0)))
        }
        2..=4 => groups
            .iter()
            .all(|g| (4..=6).contains(&g.len()) && g.iter().all(u8::is_ascii_alphanumeric)),
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
        if recovery_code(t) {
            first.get_or_insert(ts);
            last_end = te;
            count += 1;
        } else if t.len() <= 2 && t.iter().all(|c| c.is_ascii_digit() || *c == b'-') {
            // A list number or mark.
        } else if first.is_some() {
            break;
        } else {
            words_before += 1;
            if words_before > 12 {
                return None;
            }
        }
    }
    let first = first?;
    (count >= 2).then(|| {
        *skip = last_end;
        (first, last_end)
    })
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
        for t in ["hello-world", "2026-11-03", "abcd", "v1.2.3"] {
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
