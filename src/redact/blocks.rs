//! Multi-part secrets read by hand: PEM private key blocks (RSA, EC, DSA,
//! PKCS#8, encrypted PKCS#8, OpenSSH, PGP, SSH2), PuTTY key files, and
//! JWTs.
//!
//! A key block is redacted whole: from the `BEGIN` line through the `END`
//! line. When the `END` line is missing (a truncated paste) the block runs
//! to the last line of its base64 body. Bodies may be split by real
//! newlines, by `\n` escapes (a key inside a JSON string, as in a GCP
//! service-account file; `\\n` once more escaped, `&#10;` in XML), or by
//! spaces (a key pasted onto one line). A block whose `BEGIN` line starts
//! with a prefix (`# `, `> `, `// `, ` * `, `; `, `| `, a line number, a
//! quote) is read with that prefix taken off each line, and a line's
//! closing quote, `+` or `,` (a key written as concatenated strings)
//! taken off its end. A block whose lines are wrapped each its own way
//! (a string per line after `KEY = (`, a shell string's `\` line ends, a
//! numbered list) is taken loosely: from `BEGIN` through its `END` line.
//! Each
//! parser reads forward from its keyword over its own body only, so the
//! total work stays linear in the text.

use super::checks::{b64url_decode_prefix, contains_ci, is_b64, is_b64url};

/// The length of a line break written as an escape at `i`: `\n` (and
/// `\r`, `\t`), `\\n` (escaped twice), `&#10;` / `&#13;` (XML).
fn escaped_break(b: &[u8], i: usize) -> Option<usize> {
    match b.get(i)? {
        b'\\' if matches!(b.get(i + 1), Some(b'n' | b'r' | b't')) => Some(2),
        b'\\' if b.get(i + 1) == Some(&b'\\') && matches!(b.get(i + 2), Some(b'n' | b'r')) => {
            Some(3)
        }
        b'&' if b[i..].starts_with(b"&#10;") || b[i..].starts_with(b"&#13;") => Some(5),
        _ => None,
    }
}

/// Skips whitespace and escaped line breaks; with a line `prefix` (see
/// [`line_prefix`]), also what ends a prefixed line (a closing quote, a
/// `+` or `,` joining strings) and the prefix that starts the next one.
fn skip_seps(b: &[u8], mut i: usize, prefix: &[u8]) -> usize {
    while i < b.len() {
        match b[i] {
            b' ' | b'\t' | b'\r' => i += 1,
            b'\n' => {
                i += 1;
                if let Some(len) = prefix_at(b, i, prefix) {
                    i += len;
                }
            }
            b'"' | b'\'' | b'+' | b',' | b';' | b')'
                if !prefix.is_empty() && rest_of_line_is_junk(b, i) =>
            {
                i += 1
            }
            _ => match escaped_break(b, i) {
                Some(len) => i += len,
                None => break,
            },
        }
    }
    i
}

/// Whether from `i` to the end of its line there is only what closes a
/// string on a prefixed line: quotes, `+`, `,`, `;`, `)`, spaces and
/// escaped breaks.
fn rest_of_line_is_junk(b: &[u8], mut i: usize) -> bool {
    while i < b.len() && b[i] != b'\n' {
        match b[i] {
            b'"' | b'\'' | b'+' | b',' | b';' | b')' | b' ' | b'\t' | b'\r' => i += 1,
            _ => match escaped_break(b, i) {
                Some(len) => i += len,
                None => return false,
            },
        }
    }
    true
}

/// What a `BEGIN` line carries before its dashes, if it is a prefix every
/// line of the block would carry: at most 24 bytes of spaces, comment and
/// quote marks, `|` and line numbers (`# `, `> `, `// `, ` * `, `  3 | `,
/// `"`). Empty when the line starts with the dashes (or after spaces
/// only, which [`skip_seps`] takes anyway).
fn line_prefix(b: &[u8], begin: usize) -> &[u8] {
    // Looked for within 25 bytes only: the work stays linear on text with
    // many `BEGIN`s and no line break.
    let from = begin.saturating_sub(25);
    let start = match b[from..begin].iter().rposition(|&c| c == b'\n') {
        Some(p) => from + p + 1,
        None if from == 0 => 0,
        None => return &[],
    };
    let prefix = &b[start..begin];
    let allowed = |c: u8| {
        matches!(
            c,
            b' ' | b'\t'
                | b'#'
                | b'>'
                | b'/'
                | b'*'
                | b';'
                | b'|'
                | b'"'
                | b'\''
                | b'-'
                | b'%'
                | b'!'
        ) || c.is_ascii_digit()
    };
    if prefix.len() > 24
        || !prefix.iter().all(|&c| allowed(c))
        || prefix.iter().all(|&c| c == b' ' || c == b'\t')
    {
        return &[];
    }
    prefix
}

/// The length of the line prefix `prefix` at `i`: the same bytes, a digit
/// where it has a digit or a space (line numbers of any width), and its
/// trailing spaces optional (an empty line of a commented block).
fn prefix_at(b: &[u8], i: usize, prefix: &[u8]) -> Option<usize> {
    if prefix.is_empty() {
        return None;
    }
    let mut k = 0;
    for &p in prefix {
        match b.get(i + k) {
            Some(&c) if c == p || (c.is_ascii_digit() && (p.is_ascii_digit() || p == b' ')) => {
                k += 1
            }
            _ if p == b' ' || p == b'\t' => {}
            _ => return None,
        }
    }
    Some(k)
}

fn ends_token(b: &[u8], i: usize) -> bool {
    i >= b.len()
        || matches!(b[i], b' ' | b'\t' | b'\r' | b'\n' | b'"' | b'\'' | b',')
        || escaped_break(b, i).is_some()
        || end_marker(b, i).is_some()
}

/// Four or five dashes, as PEM (`-----`) and SSH2 (`----`) write them.
fn dashes(b: &[u8], mut i: usize) -> Option<usize> {
    let s = i;
    while i < b.len() && b[i] == b'-' && i - s < 5 {
        i += 1;
    }
    (i - s >= 4).then_some(i)
}

/// Upper-case label words (`RSA PRIVATE KEY`), ending before the dashes.
fn label(b: &[u8], mut i: usize) -> (usize, &[u8]) {
    let s = i;
    while i < b.len()
        && i - s < 64
        && (b[i].is_ascii_uppercase() || b[i].is_ascii_digit() || b[i] == b' ')
    {
        i += 1;
    }
    let mut e = i;
    while e > s && b[e - 1] == b' ' {
        e -= 1;
    }
    (i, &b[s..e])
}

/// `-----END ... -----` (or `---- END ... ----`) at `i`: its end.
fn end_marker(b: &[u8], i: usize) -> Option<usize> {
    let mut j = dashes(b, i)?;
    if b.get(j) == Some(&b' ') {
        j += 1;
    }
    if !b[j..].starts_with(b"END") {
        return None;
    }
    if b[j + 3..].starts_with(b" OpenVPN Static key V1") {
        return dashes(b, j + 3 + b" OpenVPN Static key V1".len());
    }
    let (j, _) = label(b, j + 3);
    dashes(b, j)
}

/// Reads a key body from `i`: base64 tokens, and `Name: value` header
/// lines (before the body, or anywhere for PuTTY). Returns where the
/// block ends and how many base64 characters it held.
fn body(
    b: &[u8],
    start: usize,
    headers_anywhere: bool,
    stop_after_mac: bool,
    prefix: &[u8],
) -> (usize, usize) {
    let n = b.len();
    let mut end = start;
    let mut count = 0usize;
    let mut i = start;
    loop {
        let j = skip_seps(b, i, prefix);
        if j >= n {
            break;
        }
        if let Some(e) = end_marker(b, j) {
            end = e;
            break;
        }
        let mut k = j;
        while k < n && is_b64(b[k]) {
            k += 1;
        }
        if k > j && ends_token(b, k) {
            let len = k - j;
            let next_is_end = end_marker(b, skip_seps(b, k, prefix)).is_some();
            if len >= 16
                || b[j] == b'='
                || b[k - 1] == b'='
                || next_is_end
                || (headers_anywhere && count > 0)
            {
                count += len;
                end = k;
                i = k;
                if k < n && matches!(b[k], b'"' | b'\'' | b',') && !rest_of_line_is_junk(b, k)
                    || (k < n && prefix.is_empty() && matches!(b[k], b'"' | b'\'' | b','))
                {
                    break;
                }
                continue;
            }
            break;
        }
        if headers_anywhere || count == 0 {
            let mut k = j;
            while k < n && k - j < 40 && (b[k].is_ascii_alphanumeric() || b[k] == b'-') {
                k += 1;
            }
            if k > j && b.get(k) == Some(&b':') {
                let name = &b[j..k];
                let mut m = k + 1;
                while m < n
                    && m - k < 200
                    && b[m] != b'\n'
                    && !(b[m] == b'\\' && b.get(m + 1) == Some(&b'n'))
                {
                    m += 1;
                }
                end = m;
                i = m;
                if stop_after_mac && (name == b"Private-MAC" || name == b"Private-Hash") {
                    break;
                }
                continue;
            }
        }
        break;
    }
    (end, count)
}

/// The body of a PEM private key whose `BEGIN` line was cut off (copied
/// from the middle of a file, or left out): the base64 lines just before
/// an `-----END ... PRIVATE KEY-----` line, at least 32 characters of
/// them, and that line. The hit is the `END` line's dashes and word.
pub(crate) fn pem_end(text: &str, s: usize, e: usize, skip: &mut usize) -> Option<(usize, usize)> {
    let b = text.as_bytes();
    let (i, lab) = label(b, e);
    if !(lab.ends_with(b"PRIVATE KEY") || lab.ends_with(b"PRIVATE KEY BLOCK")) {
        return None;
    }
    let end = dashes(b, i)?;
    // Back over the lines before it while each is base64 alone (after
    // what a quoted or commented block puts around it), at most 64 KiB.
    let trim = |c: &u8| {
        matches!(
            c,
            b' ' | b'\t' | b'\r' | b'#' | b'>' | b'"' | b'\'' | b'/' | b'*'
        )
    };
    // The `END` line's own prefix (`> `, `# `, a quote), at most 24 bytes.
    let mut start = s;
    while start > 0 && s - start < 24 && trim(&b[start - 1]) {
        start -= 1;
    }
    let mut count = 0usize;
    while start > 0 && s - start < 64 << 10 && b[start - 1] == b'\n' {
        let line_end = start - 1;
        let line_start = b[..line_end]
            .iter()
            .rposition(|&c| c == b'\n')
            .map_or(0, |p| p + 1);
        let line = &b[line_start..line_end];
        let Some(first) = line.iter().position(|c| !trim(c)) else {
            break;
        };
        let last = line.iter().rposition(|c| !trim(c)).unwrap_or(first);
        let body = &line[first..=last];
        // The line just above the `END` line is the body's last: it may be
        // short (what a 64-column body leaves, PGP's `=` checksum line).
        let min = if count == 0 { 1 } else { 16 };
        if body.len() < min || !body.iter().all(|&c| is_b64(c)) {
            break;
        }
        count += body.len();
        start = line_start;
    }
    if count < 32 {
        return None;
    }
    *skip = end;
    Some((start, end))
}

/// A PEM or PGP private key block; the hit is its `BEGIN`.
pub(crate) fn pem(text: &str, s: usize, e: usize, skip: &mut usize) -> Option<(usize, usize)> {
    let b = text.as_bytes();
    let mut a = s;
    if a > 0 && b[a - 1] == b' ' {
        a -= 1;
    }
    let mut d = 0;
    while a > 0 && b[a - 1] == b'-' && d < 5 {
        a -= 1;
        d += 1;
    }
    if d < 4 || b.get(e) != Some(&b' ') {
        return None;
    }
    // An OpenVPN static key (`tls-auth`, `secret`) names itself in mixed
    // case; its body is hex.
    const OPENVPN: &[u8] = b"OpenVPN Static key V1";
    let i = if b[e + 1..].starts_with(OPENVPN) {
        e + 1 + OPENVPN.len()
    } else {
        let (i, lab) = label(b, e + 1);
        if !(lab.ends_with(b"PRIVATE KEY") || lab.ends_with(b"PRIVATE KEY BLOCK")) {
            return None;
        }
        i
    };
    let i = dashes(b, i)?;
    let prefix = line_prefix(b, a);
    let (end, count) = body(b, i, false, false, prefix);
    if count >= 32 {
        *skip = end;
        return Some((a, end));
    }
    // Lines the reader above cannot take apart (each wrapped its own way:
    // `KEY = ("...\n"` then `    "...\n"`, a shell string's `\` line
    // ends, a numbered list): the block is still the key.
    let end = loose_block(b, i)?;
    *skip = end;
    Some((a, end))
}

/// A key block read loosely from just after its `BEGIN` line's dashes,
/// when every line of it is wrapped in code its own way: the rest of the
/// `BEGIN` line holds only what wraps a string (a quote, `\n`, `\`,
/// `+`, ...), then each line is one base64 run between such wrappers
/// (a numbered list's `12. ` before it), at least 40 characters long but
/// for the last, up to the `END` line (wrapped too). Without an `END`
/// line (a truncated paste) the block ends at the last such line, if
/// there are two or more. Prose between a `BEGIN` and an `END` line is no
/// block. The scan ends at the first line of another shape, so the work
/// stays linear.
fn loose_block(b: &[u8], from: usize) -> Option<usize> {
    let n = b.len();
    // Past the wrappers from `i` to the end of the line (or the first
    // byte that is none).
    let wrapped = |mut i: usize| {
        while i < n && b[i] != b'\n' {
            match wrap_len(b, i) {
                Some(len) => i += len,
                None => break,
            }
        }
        i
    };
    // The rest of the `BEGIN` line.
    let mut i = wrapped(from);
    if i < n && b[i] != b'\n' {
        return None;
    }
    let (mut lines, mut b64, mut end, mut short) = (0usize, 0usize, None, false);
    while i < n {
        let start = i + 1;
        let mut j = start;
        // A list's number (`12. `, `3) `), then what opens a string.
        while j < n && b[j].is_ascii_digit() && j - start < 6 {
            j += 1;
        }
        if !(j > start && matches!(b.get(j), Some(b'.' | b')'))) {
            j = start;
        } else {
            j += 1;
        }
        // (`+` is base64 too: a wrapper when no base64 follows it.)
        while j < n
            && b[j] != b'\n'
            && b[j] != b'-'
            && (!is_b64(b[j]) || (b[j] == b'+' && !b.get(j + 1).is_some_and(|&c| is_b64(c))))
        {
            match wrap_len(b, j) {
                Some(len) => j += len,
                None => break,
            }
        }
        if let Some(e) = end_marker(b, j) {
            return (b64 >= 32 && lines >= 1).then_some(e);
        }
        // A line after a short one is not the key's.
        if short {
            break;
        }
        let run_start = j;
        while j < n && is_b64(b[j]) {
            j += 1;
        }
        let run = j - run_start;
        let run_end = j;
        let j = wrapped(j);
        if run < 4 || (j < n && b[j] != b'\n') {
            break;
        }
        if run < 40 {
            short = true;
        } else {
            end = Some(run_end);
        }
        lines += 1;
        b64 += run;
        i = j;
    }
    // No `END` line: through the last long line, if two or more.
    let long = if short { lines - 1 } else { lines };
    if long >= 2 { end } else { None }
}

/// The length of what may wrap a key's line in code at `i`: a blank, a
/// quote, `+`, `,`, `;`, a parenthesis, a shell string's `\`, an escaped
/// line break (`\n`), a carriage return, `<br>` (`<br/>`, `<br />`).
fn wrap_len(b: &[u8], i: usize) -> Option<usize> {
    match b[i] {
        b' ' | b'\t' | b'\r' | b'"' | b'\'' | b'`' | b'+' | b',' | b';' | b'(' | b')' => Some(1),
        b'\\' if matches!(b.get(i + 1), Some(b'n' | b'r')) => Some(2),
        b'\\' => Some(1),
        b'<' => [&b"<br>"[..], b"<br/>", b"<br />"]
            .iter()
            .find(|t| b[i..].starts_with(t))
            .map(|t| t.len()),
        _ => None,
    }
}

/// A PuTTY `.ppk` key file, through its `Private-MAC` line.
pub(crate) fn putty(text: &str, s: usize, e: usize, skip: &mut usize) -> Option<(usize, usize)> {
    let b = text.as_bytes();
    if s > 0 && b[s - 1].is_ascii_alphanumeric() {
        return None;
    }
    let mut i = e;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    if i == e || b.get(i) != Some(&b':') {
        return None;
    }
    while i < b.len()
        && i - e < 200
        && b[i] != b'\n'
        && !(b[i] == b'\\' && b.get(i + 1) == Some(&b'n'))
    {
        i += 1;
    }
    let (end, count) = body(b, i, true, true, &[]);
    *skip = end;
    (count >= 32).then_some((s, end))
}

fn run_b64url(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && is_b64url(b[i]) {
        i += 1;
    }
    i
}

/// A JWT (`header.payload.signature`, header and payload base64url JSON):
/// the whole token, signature included. The header must decode to JSON
/// naming an algorithm or type.
pub(crate) fn jwt(text: &str, s: usize, _e: usize, skip: &mut usize) -> Option<(usize, usize)> {
    let b = text.as_bytes();
    if s > 0
        && (is_b64url(b[s - 1]) || b[s - 1] == b'.')
        && !super::engine::after_percent_escape(b, s)
    {
        return None;
    }
    let h_end = run_b64url(b, s);
    *skip = h_end;
    if h_end - s < 10 || b.get(h_end) != Some(&b'.') || !b[h_end + 1..].starts_with(b"eyJ") {
        return None;
    }
    let p_end = run_b64url(b, h_end + 1);
    *skip = p_end;
    if p_end - h_end < 8 || b.get(p_end) != Some(&b'.') {
        return None;
    }
    let mut end = run_b64url(b, p_end + 1);
    // JWE: two more parts.
    while b.get(end) == Some(&b'.') && b.get(end + 1).is_some_and(|&c| is_b64url(c)) {
        end = run_b64url(b, end + 1);
    }
    *skip = end;
    let header = b64url_decode_prefix(&b[s..h_end], 512)?;
    let json_header = header.first() == Some(&b'{')
        && (contains_ci(&header, b"\"alg\"") || contains_ci(&header, b"\"typ\""));
    json_header.then_some((s, end))
}

/// A PEM private key block that was base64-encoded again, as kubeconfig
/// (`client-key-data:`) and Kubernetes secrets store it: the hit is the
/// encoding of `-----BEGIN`, and the decoded label must name a private key.
pub(crate) fn pem_base64(
    text: &str,
    s: usize,
    _e: usize,
    skip: &mut usize,
) -> Option<(usize, usize)> {
    let b = text.as_bytes();
    if s > 0 && is_b64(b[s - 1]) {
        return None;
    }
    let mut end = s;
    while end < b.len() && is_b64(b[end]) {
        end += 1;
    }
    *skip = end;
    let head = b64url_decode_prefix(&b[s..end], 64)?;
    let label_end = head
        .iter()
        .skip(10)
        .position(|&c| c == b'-')
        .map_or(head.len(), |i| i + 10);
    contains_ci(&head[..label_end], b"PRIVATE KEY").then_some((s, end))
}
