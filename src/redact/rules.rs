//! The built-in rules: one table entry per secret format, each built from
//! the format's public structure (fixed prefix, alphabet, length, checksum).
//!
//! An entry says which literal keywords ("anchors") make it run, how far
//! around each keyword a match can lie, and how to find and confirm it:
//! a regex plus a check on the matched bytes, a hand-written parser run at
//! each keyword (assignments, key blocks, JWTs), or a parser run on each
//! long run of digits (cards, SSNs, IBANs). Several entries may share one
//! rule id; disabling the id disables them all.

use super::checks::{
    Classes, b64url_decode_prefix, bech32_ok, class_changes, contains_ci, entropy,
    github_checksum_ok, is_hex, is_placeholder, random_suffix,
};
use super::{assign, blocks, digits, notes};

/// A byte class that must not touch a match on the given side, so that a
/// token is not cut out of a longer one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Edge {
    /// Anything may touch the match.
    Free,
    /// No ASCII letter or digit.
    Alnum,
    /// No letter, digit or `_`.
    Word,
    /// No letter, digit, `_` or `-`.
    Token,
    /// No base64 character (`A-Za-z0-9+/=`).
    B64,
    /// No base64 character other than padding (`A-Za-z0-9+/`).
    B64Body,
}

impl Edge {
    pub(crate) fn blocks(self, b: u8) -> bool {
        match self {
            Edge::Free => false,
            Edge::Alnum => b.is_ascii_alphanumeric(),
            Edge::Word => b.is_ascii_alphanumeric() || b == b'_',
            Edge::Token => b.is_ascii_alphanumeric() || b == b'_' || b == b'-',
            Edge::B64 => b.is_ascii_alphanumeric() || b == b'+' || b == b'/' || b == b'=',
            Edge::B64Body => b.is_ascii_alphanumeric() || b == b'+' || b == b'/',
        }
    }
}

/// A parser run at a keyword hit `(text, start, end, skip)`: returns the
/// secret's span, and may raise `skip` to a position before which further
/// hits need not be parsed again (keeps the work linear).
pub(crate) type HitFn = fn(&str, usize, usize, &mut usize) -> Option<(usize, usize)>;

/// A parser run at a keyword hit, like [`HitFn`], that may find several
/// secrets (a table's column): pushes their spans.
pub(crate) type ManyFn = fn(&str, usize, usize, &mut usize, &mut Vec<(usize, usize)>);

/// A parser run on a run of digits `[start, end)`: pushes secret spans.
pub(crate) type RunFn = fn(&str, usize, usize, &mut Vec<(usize, usize)>);

/// A regex rule. The regex runs on the windows `[hit - back, hit_end + fwd]`
/// around keyword hits (merged where they overlap), so `fwd` must cover the
/// longest match measured from the keyword.
pub(crate) struct ReSpec {
    pub re: &'static str,
    pub back: usize,
    pub fwd: usize,
    /// The capture group that is the secret (0: the whole match).
    pub group: usize,
    /// The capture group handed to `check`.
    pub check_group: usize,
    pub left: Edge,
    pub right: Edge,
    pub check: fn(&[u8]) -> bool,
}

pub(crate) enum How {
    Re(ReSpec),
    Hit(HitFn),
    Many(ManyFn),
    Run(RunFn),
}

pub(crate) struct Spec {
    pub id: &'static str,
    /// Overlaps keep the rule with the highest priority: 4 key blocks,
    /// 3 exact token formats, 2 formats confirmed by context, 1 generic.
    pub prio: u8,
    pub anchors: &'static [&'static str],
    pub how: How,
}

const fn token(
    re: &'static str,
    fwd: usize,
    left: Edge,
    right: Edge,
    check: fn(&[u8]) -> bool,
) -> How {
    How::Re(ReSpec {
        re,
        back: 0,
        fwd,
        group: 0,
        check_group: 0,
        left,
        right,
        check,
    })
}

const fn context(
    re: &'static str,
    back: usize,
    fwd: usize,
    group: usize,
    edge: Edge,
    check: fn(&[u8]) -> bool,
) -> How {
    How::Re(ReSpec {
        re,
        back,
        fwd,
        group,
        check_group: group,
        left: edge,
        right: edge,
        check,
    })
}

// ---------------------------------------------------------------- checks

/// Strips a vendor prefix (through the first `_`, `-` or `.` within the
/// first 12 bytes) before looking at how random the rest is.
fn random_tail(v: &[u8]) -> bool {
    let cut = v
        .iter()
        .take(12)
        .position(|&b| matches!(b, b'_' | b'-' | b'.'))
        .map_or(0, |i| i + 1);
    random_suffix(v, cut)
}

fn aws_key_id(v: &[u8]) -> bool {
    !contains_ci(v, b"EXAMPLE") && random_suffix(v, 4)
}

fn aws_secret(v: &[u8]) -> bool {
    let c = Classes::of(v);
    c.upper
        && c.lower
        && c.digit
        && !contains_ci(v, b"EXAMPLE")
        && !is_hex(v)
        && entropy(v) >= 3.5
        && class_changes(v) >= 16
        && random_suffix(v, 0)
}

/// An AWS secret key after the word `secret` (any case; the hit is
/// `ecret`): the first run of exactly 40 base64 characters that starts
/// within 41 bytes after the word, on its line.
fn aws_secret_after_keyword(
    text: &str,
    s: usize,
    e: usize,
    skip: &mut usize,
) -> Option<(usize, usize)> {
    let b = text.as_bytes();
    if s == 0 || !matches!(b[s - 1], b's' | b'S') {
        return None;
    }
    let body = |c: u8| c.is_ascii_alphanumeric() || c == b'/' || c == b'+';
    let mut i = e;
    while i < b.len() && i <= e + 40 && b[i] != b'\n' {
        if body(b[i]) {
            i += 1;
            continue;
        }
        let rs = i + 1;
        let mut re = rs;
        while re < b.len() && re - rs <= 40 && body(b[re]) {
            re += 1;
        }
        if re - rs == 40
            && !b.get(re).is_some_and(|&c| Edge::B64.blocks(c))
            && aws_secret(&b[rs..re])
        {
            *skip = re;
            return Some((rs, re));
        }
        i = re.max(i + 1);
    }
    None
}

fn github(v: &[u8]) -> bool {
    github_checksum_ok(v) && random_suffix(v, 4)
}

/// Keys published in Stripe's documentation.
const STRIPE_DOC_KEYS: &[&[u8]] = &[
    b"sk_test_4eC39HqLyjWDarjtT1zdp7dc",
    b"sk_test_BQokikJOvBiI2HlWgH4olfQ2",
];

fn stripe(v: &[u8]) -> bool {
    !STRIPE_DOC_KEYS.contains(&v) && random_suffix(v, 8)
}

fn huggingface(v: &[u8]) -> bool {
    let c = Classes::of(&v[3..]);
    c.upper && c.lower && random_suffix(v, 3)
}

fn hex_mixed(v: &[u8]) -> bool {
    let c = Classes::of(v);
    c.digit && c.letter() && random_tail(v)
}

fn mailgun_key(v: &[u8]) -> bool {
    hex_mixed(&v[4..])
}

fn telegram(v: &[u8]) -> bool {
    v.iter()
        .position(|&b| b == b':')
        .is_some_and(|i| random_suffix(v, i + 1))
}

/// Discord bot tokens start with the bot's user id (a snowflake, 17 to 20
/// decimal digits) in base64.
fn discord_bot(v: &[u8]) -> bool {
    let Some(dot) = v.iter().position(|&b| b == b'.') else {
        return false;
    };
    let Some(id) = b64url_decode_prefix(&v[..dot], 32) else {
        return false;
    };
    (17..=20).contains(&id.len()) && id.iter().all(u8::is_ascii_digit) && random_suffix(v, dot + 1)
}

/// The last path segment of a webhook URL is its secret.
fn webhook(v: &[u8]) -> bool {
    let last = v
        .rsplit(|&b| b == b'/')
        .find(|s| !s.is_empty())
        .unwrap_or(v);
    last.len() >= 16 && random_suffix(last, 0)
}

fn sk_generic(v: &[u8]) -> bool {
    let c = Classes::of(&v[3..]);
    c.digit && c.letter() && entropy(&v[3..]) >= 3.5 && random_suffix(v, 3)
}

fn azure_key(v: &[u8]) -> bool {
    entropy(v) >= 4.0 && random_suffix(v, 0)
}

fn sas(v: &[u8]) -> bool {
    contains_ci(v, b"sv=")
}

fn age(v: &[u8]) -> bool {
    bech32_ok(v)
}

/// Letters and digits, and random.
fn mixed_random(v: &[u8]) -> bool {
    let c = Classes::of(v);
    c.letter() && c.digit && random_suffix(v, 0)
}

/// Where a token's fixed prefix ends: after the last separator (`_ - . $ ~`)
/// in its first 24 bytes.
fn prefix_end(v: &[u8]) -> usize {
    v.iter()
        .take(24)
        .rposition(|&b| matches!(b, b'_' | b'-' | b'.' | b'$' | b'~'))
        .map_or(0, |i| i + 1)
}

/// The part after a multi-part prefix (`pscale_tkn_`, `access_token$production$`) looks random.
fn random_tail_last(v: &[u8]) -> bool {
    random_suffix(v, prefix_end(v))
}

/// The part after the `!` looks random (a Salesforce session id).
fn tail_after_bang(v: &[u8]) -> bool {
    let cut = v.iter().position(|&b| b == b'!').map_or(0, |i| i + 1);
    random_suffix(v, cut)
}

/// A Django key's generated part: any 30 or more printable characters
/// after its fixed prefix (its alphabet is letters, digits and symbols).
fn django_tail(v: &[u8]) -> bool {
    v.len() >= "django-insecure-".len() + 30
}

/// A value that is not a documentation placeholder (`<password>`,
/// `changeme`, `${PASS}`).
fn not_placeholder(v: &[u8]) -> bool {
    v.len() >= 4 && !matches!(v[0], b'$' | b'{' | b'<' | b'%') && !is_placeholder(v)
}

/// Any value: the format alone is the secret (a webhook's path).
fn any_value(_: &[u8]) -> bool {
    true
}

/// The part after the last `.` looks random (`dp.st.dev.<random>`).
fn tail_after_last_dot(v: &[u8]) -> bool {
    let cut = v.iter().rposition(|&b| b == b'.').map_or(0, |i| i + 1);
    random_suffix(v, cut)
}

/// Dropbox long-lived tokens: 11 characters, ten `A`s, 43 more.
fn dropbox_long(v: &[u8]) -> bool {
    random_suffix(&v[21..], 0) && random_suffix(&v[..11], 0)
}

/// Intercom tokens are base64 of `tok:...`.
fn random_suffix_5(v: &[u8]) -> bool {
    random_suffix(v, 5)
}

/// The part after the last `/` or `=` looks random (a webhook's key).
fn random_tail_last_slash(v: &[u8]) -> bool {
    let cut = v
        .iter()
        .rposition(|&b| b == b'/' || b == b'=')
        .map_or(0, |i| i + 1);
    random_suffix(v, cut)
}

/// MaxMind license keys (`<6>_<29>_mmk`) and Fernet tokens
/// (`gAAAAAB` and the rest of a timestamp, then the random part).
fn random_suffix_7(v: &[u8]) -> bool {
    random_suffix(v, 7)
}

/// A PASETO token's payload after `vN.local.` or `vN.public.`.
fn paseto_body(v: &[u8]) -> bool {
    let cut = v
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'.')
        .nth(1)
        .map_or(0, |(i, _)| i + 1);
    random_suffix(v, cut)
}

/// Twitter app bearer tokens: 22 `A`s, then the random part.
fn twitter_bearer(v: &[u8]) -> bool {
    random_suffix(v, 22)
}

/// An Airtable personal access token: `pat`, 14 letters or digits, `.`
/// and 64 hex digits. The hit is `pat`; read by hand, since `path` and
/// `pattern` are common.
fn airtable(text: &str, s: usize, e: usize, skip: &mut usize) -> Option<(usize, usize)> {
    let b = text.as_bytes();
    if s > 0 && Edge::Word.blocks(b[s - 1]) {
        return None;
    }
    let id_end = e + 14;
    let end = id_end + 65;
    if end > b.len() || !b[e..id_end].iter().all(u8::is_ascii_alphanumeric) || b[id_end] != b'.' {
        return None;
    }
    let hex = &b[id_end + 1..end];
    if !hex
        .iter()
        .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
    {
        return None;
    }
    if b.get(end).is_some_and(|&c| Edge::Word.blocks(c)) {
        return None;
    }
    *skip = end;
    random_suffix(hex, 0).then_some((s, end))
}

/// The password of `scheme://user:password@host`: the hit is `://`.
/// The password runs to the last `@` before the host, so an unescaped `@`
/// in it is covered too.
fn url_credentials(text: &str, s: usize, e: usize, skip: &mut usize) -> Option<(usize, usize)> {
    let b = text.as_bytes();
    let mut a = s;
    while a > 0
        && s - a < 32
        && (b[a - 1].is_ascii_alphanumeric() || matches!(b[a - 1], b'+' | b'.' | b'-'))
    {
        a -= 1;
    }
    if a == s || !b[a].is_ascii_alphabetic() {
        return None;
    }
    let stop = |c: u8| {
        c.is_ascii_whitespace()
            || matches!(
                c,
                b'/' | b'?' | b'#' | b'"' | b'\'' | b'<' | b'>' | b'[' | b']' | b'\\'
            )
    };
    let mut i = e;
    while i < b.len() && i - e <= 128 && !stop(b[i]) && b[i] != b':' && b[i] != b'@' {
        i += 1;
    }
    if b.get(i) != Some(&b':') {
        return None;
    }
    let ps = i + 1;
    let mut at = None;
    let mut j = ps;
    while j < b.len() && j - ps <= 256 && !stop(b[j]) {
        if b[j] == b'@' {
            at = Some(j);
        }
        j += 1;
    }
    // A password with a raw `/`, `?` or `#` in it (`p@ss/w0rd@db`): the
    // scan stopped inside it. A later `@` before the end of the URL, with
    // no `.` or `:` between (no host name, no port), ends the password
    // there instead: a host there would have one.
    if j < b.len() && matches!(b[j], b'/' | b'?' | b'#') {
        let from = at.map_or(ps, |a| a + 1);
        let mut k = j;
        let mut later = None;
        while k < b.len()
            && k - ps <= 256
            && !b[k].is_ascii_whitespace()
            && !matches!(b[k], b'"' | b'\'' | b'<' | b'>')
        {
            if b[k] == b'@' {
                later = Some(k);
            }
            k += 1;
        }
        if let Some(l) = later
            && !b[from..l].iter().any(|&c| c == b'.' || c == b':')
            && b.get(l + 1).is_some_and(u8::is_ascii_alphanumeric)
        {
            at = Some(l);
            j = k;
        }
    }
    *skip = j;
    let pe = at?;
    let host_ok = b.get(pe + 1).is_some_and(|&c| !stop(c) && c != b'@');
    let v = &b[ps..pe];
    if !host_ok || v.is_empty() {
        return None;
    }
    let template = matches!(v[0], b'$' | b'{' | b'<' | b'%');
    let port_like = v.len() <= 5 && v.iter().all(u8::is_ascii_digit);
    // `user:password@`, `username:pass@`: the documentation's template.
    let user = &b[e..ps - 1];
    let word = |w: &[u8], list: &[&[u8]]| list.iter().any(|x| w.eq_ignore_ascii_case(x));
    let doc_template = word(user, &[b"user", b"username", b"usr", b"login", b"name"])
        && word(v, &[b"password", b"passwd", b"secret"]);
    (!template && !port_like && !doc_template && !super::checks::is_placeholder(v))
        .then_some((ps, pe))
}

// ---------------------------------------------------------------- table

const SECRET_WORDS: &[&str] = &[
    "ecret",
    "ECRET",
    "oken",
    "OKEN",
    "key",
    "Key",
    "KEY",
    "uthoriz",
    "redential",
    "REDENTIAL",
    "earer",
    "ession",
    "ESSION",
];

/// Every built-in rule.
pub(crate) const SPECS: &[Spec] = &[
    // ------------------------------------------------------------ cloud
    Spec {
        id: "aws-access-key-id",
        prio: 3,
        anchors: &["AKIA", "ASIA", "ABIA", "ACCA"],
        how: token(
            "(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}",
            24,
            Edge::Alnum,
            Edge::Alnum,
            aws_key_id,
        ),
    },
    Spec {
        id: "aws-secret-access-key",
        prio: 2,
        anchors: &["ecret", "ECRET"],
        how: How::Hit(aws_secret_after_keyword),
    },
    Spec {
        id: "aws-secret-access-key",
        prio: 2,
        anchors: &["AKIA", "ASIA", "ABIA", "ACCA"],
        how: How::Re(ReSpec {
            re: r"(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}[^A-Za-z0-9/+]{1,12}([A-Za-z0-9/+]{40})",
            back: 0,
            fwd: 80,
            group: 1,
            check_group: 1,
            left: Edge::B64Body,
            right: Edge::B64,
            check: aws_secret,
        }),
    },
    // The same pair once the key id was redacted by an earlier write: the
    // secret arriving in a later edit is still next to its id.
    Spec {
        id: "aws-secret-access-key",
        prio: 2,
        anchors: &["[REDACTED:aws-access-key-id]"],
        how: How::Re(ReSpec {
            re: r"\[REDACTED:aws-access-key-id\][^A-Za-z0-9/+]{1,12}([A-Za-z0-9/+]{40})",
            back: 0,
            fwd: 80,
            group: 1,
            check_group: 1,
            left: Edge::B64Body,
            right: Edge::B64,
            check: aws_secret,
        }),
    },
    Spec {
        id: "google-api-key",
        prio: 3,
        anchors: &["AIza"],
        how: token(
            "AIza[0-9A-Za-z_-]{35}",
            40,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "google-oauth-client-secret",
        prio: 3,
        anchors: &["GOCSPX-"],
        how: token(
            "GOCSPX-[0-9A-Za-z_-]{28}",
            36,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "google-oauth-access-token",
        prio: 3,
        anchors: &["ya29."],
        how: token(
            r"ya29\.[0-9A-Za-z_-]{20,400}",
            410,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "azure-storage-connection-string",
        prio: 3,
        anchors: &["AccountKey="],
        how: How::Re(ReSpec {
            re: r#"(?:(?:DefaultEndpointsProtocol|AccountName|BlobEndpoint|QueueEndpoint|TableEndpoint|FileEndpoint|EndpointSuffix)=[^;\s"'<>]*;[ \t]*)*AccountKey=([A-Za-z0-9+/]{40,100}={0,2})(?:;[ \t]*(?:EndpointSuffix|BlobEndpoint|QueueEndpoint|TableEndpoint|FileEndpoint|SharedAccessSignature)=[^;\s"'<>]*)*;?"#,
            back: 1200,
            fwd: 1200,
            group: 0,
            check_group: 1,
            left: Edge::Alnum,
            right: Edge::Free,
            check: azure_key,
        }),
    },
    Spec {
        id: "azure-shared-access-key",
        prio: 3,
        anchors: &["SharedAccessKey="],
        how: How::Re(ReSpec {
            re: r#"(?:(?:Endpoint|HostName)=[^;\s"'<>]+;[ \t]*)?(?:SharedAccessKeyName=[^;\s"'<>]+;[ \t]*)?SharedAccessKey=([A-Za-z0-9+/]{40,60}={0,2})(?:;[ \t]*EntityPath=[^;\s"'<>]*)?"#,
            back: 340,
            fwd: 300,
            group: 0,
            check_group: 1,
            left: Edge::Alnum,
            right: Edge::Free,
            check: azure_key,
        }),
    },
    Spec {
        id: "azure-sas-token",
        prio: 3,
        anchors: &["sig="],
        how: How::Re(ReSpec {
            re: r#"(?:(?:sv|ss|srt|sp|se|st|spr|sip|sr|si|sdd|skoid|sktid|skt|ske|sks|skv|saoid|suoid|scid|rscc|rscd|rsce|rscl|rsct|ses)=[^&\s"'<>]*&(?:amp;)?)+sig=[A-Za-z0-9%+/=]{20,200}(?:&(?:amp;)?[a-z]{1,20}=[^&\s"'<>]*)*"#,
            back: 1200,
            fwd: 1200,
            group: 0,
            check_group: 0,
            left: Edge::Alnum,
            right: Edge::Free,
            check: sas,
        }),
    },
    // ------------------------------------------------------------ code hosts and registries
    Spec {
        id: "github-token",
        prio: 3,
        anchors: &["ghp_", "gho_", "ghu_", "ghs_", "ghr_"],
        how: token(
            "gh[pousr]_[A-Za-z0-9]{36}",
            40,
            Edge::Word,
            Edge::Word,
            github,
        ),
    },
    Spec {
        id: "github-fine-grained-token",
        prio: 3,
        anchors: &["github_pat_"],
        how: token(
            "github_pat_[A-Za-z0-9]{20,30}_[A-Za-z0-9]{50,70}",
            104,
            Edge::Word,
            Edge::Word,
            random_tail,
        ),
    },
    Spec {
        id: "gitlab-token",
        prio: 3,
        anchors: &[
            "glpat-", "gldt-", "glrt-", "glptt-", "glft-", "glcbt-", "gloas-",
        ],
        how: token(
            r"gl(?:pat|dt|rt|ptt|ft|cbt|oas|soat)-[0-9A-Za-z_-]{20,64}(?:\.[0-9a-z]{2}\.[0-9a-z]{6,12})?",
            90,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "npm-token",
        prio: 3,
        anchors: &["npm_"],
        how: token(
            "npm_[A-Za-z0-9]{36}",
            40,
            Edge::Word,
            Edge::Word,
            random_tail,
        ),
    },
    Spec {
        id: "pypi-token",
        prio: 3,
        anchors: &["pypi-AgE"],
        how: token(
            "pypi-AgE[A-Za-z0-9_-]{50,400}",
            410,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "dockerhub-token",
        prio: 3,
        anchors: &["dckr_"],
        how: token(
            "dckr_(?:pat|oat)_[A-Za-z0-9_-]{20,64}",
            75,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "huggingface-token",
        prio: 3,
        anchors: &["hf_"],
        how: token(
            "hf_[A-Za-z0-9]{30,40}",
            45,
            Edge::Word,
            Edge::Word,
            huggingface,
        ),
    },
    // ------------------------------------------------------------ chat and SaaS
    Spec {
        id: "slack-token",
        prio: 3,
        anchors: &[
            "xoxb-", "xoxp-", "xoxa-", "xoxr-", "xoxs-", "xoxo-", "xoxe-", "xoxe.",
        ],
        how: token(
            r"xox(?:[abposr]|e\.xox[bp]|e)-[0-9]{1,20}-[0-9A-Za-z-]{8,250}",
            290,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "slack-token",
        prio: 3,
        anchors: &["xapp-"],
        how: token(
            "xapp-[0-9]-[A-Z0-9]{6,20}-[0-9]{6,20}-[a-f0-9]{32,80}",
            140,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "slack-webhook-url",
        prio: 3,
        anchors: &["hooks.slack.com"],
        how: How::Re(ReSpec {
            re: r"https?://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_/-]{20,200}",
            back: 8,
            fwd: 240,
            group: 0,
            check_group: 0,
            left: Edge::Alnum,
            right: Edge::Token,
            check: webhook,
        }),
    },
    Spec {
        id: "discord-bot-token",
        prio: 3,
        anchors: &["iscord", "ISCORD"],
        how: context(
            r"[MNO][A-Za-z0-9_-]{23,27}\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,40}",
            0,
            300,
            0,
            Edge::Token,
            discord_bot,
        ),
    },
    Spec {
        id: "discord-webhook-url",
        prio: 3,
        anchors: &["iscord"],
        how: How::Re(ReSpec {
            re: r"https?://(?:(?:ptb|canary)\.)?discord(?:app)?\.com/api(?:/v[0-9]{1,2})?/webhooks/[0-9]{17,20}/[A-Za-z0-9_-]{60,80}",
            back: 20,
            fwd: 200,
            group: 0,
            check_group: 0,
            left: Edge::Alnum,
            right: Edge::Token,
            check: webhook,
        }),
    },
    Spec {
        id: "telegram-bot-token",
        prio: 3,
        anchors: &[":AA"],
        how: How::Re(ReSpec {
            // In its API URL it follows `/bot`: taken with it.
            re: "(?:bot)?[0-9]{6,12}:AA[A-Za-z0-9_-]{31,38}",
            back: 15,
            fwd: 44,
            group: 0,
            check_group: 0,
            left: Edge::Word,
            right: Edge::Token,
            check: telegram,
        }),
    },
    Spec {
        id: "twilio-api-key",
        prio: 3,
        anchors: &["wilio", "WILIO"],
        how: context("SK[0-9a-fA-F]{32}", 0, 200, 0, Edge::Word, hex_mixed),
    },
    Spec {
        id: "sendgrid-api-key",
        prio: 3,
        anchors: &["SG."],
        how: token(
            r"SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}",
            70,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "mailgun-api-key",
        prio: 3,
        anchors: &["key-"],
        how: token(
            "key-[0-9a-z]{32}",
            36,
            Edge::Alnum,
            Edge::Alnum,
            mailgun_key,
        ),
    },
    Spec {
        id: "mailgun-api-key",
        prio: 2,
        anchors: &["ailgun"],
        how: context(
            r"(?i:mailgun)[^\n]{0,60}?[^0-9a-f]([0-9a-f]{32}-[0-9a-f]{8}-[0-9a-f]{8})",
            1,
            140,
            1,
            Edge::Alnum,
            hex_mixed,
        ),
    },
    Spec {
        id: "stripe-secret-key",
        prio: 3,
        anchors: &["sk_live_", "sk_test_"],
        how: How::Re(ReSpec {
            re: "sk_(?:live|test)_[0-9A-Za-z]{10,247}",
            back: 0,
            fwd: 256,
            group: 0,
            check_group: 0,
            left: Edge::Word,
            right: Edge::Word,
            check: stripe,
        }),
    },
    Spec {
        id: "stripe-restricted-key",
        prio: 3,
        anchors: &["rk_live_", "rk_test_"],
        how: How::Re(ReSpec {
            re: "rk_(?:live|test)_[0-9A-Za-z]{10,247}",
            back: 0,
            fwd: 256,
            group: 0,
            check_group: 0,
            left: Edge::Word,
            right: Edge::Word,
            check: stripe,
        }),
    },
    Spec {
        id: "stripe-webhook-secret",
        prio: 3,
        anchors: &["whsec_"],
        how: token(
            "whsec_[A-Za-z0-9+/=]{24,90}",
            100,
            Edge::Word,
            Edge::B64,
            random_tail,
        ),
    },
    Spec {
        id: "shopify-token",
        prio: 3,
        anchors: &["shpat_", "shpca_", "shppa_", "shpss_"],
        how: token(
            "shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}",
            40,
            Edge::Word,
            Edge::Word,
            random_tail,
        ),
    },
    // ------------------------------------------------------------ AI vendors
    Spec {
        id: "anthropic-api-key",
        prio: 3,
        anchors: &["sk-"],
        how: token(
            "sk-ant-[a-z]{2,8}[0-9]{0,3}-[A-Za-z0-9_-]{20,200}",
            220,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "openrouter-api-key",
        prio: 3,
        anchors: &["sk-"],
        how: token(
            "sk-or-v1-[a-f0-9]{64}",
            75,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "openai-api-key",
        prio: 3,
        anchors: &["sk-"],
        how: token(
            "sk-(?:proj|svcacct|admin|None)-[A-Za-z0-9_-]{20,250}",
            270,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "openai-api-key",
        prio: 2,
        anchors: &["sk-"],
        how: token(
            "sk-[A-Za-z0-9]{32,100}",
            105,
            Edge::Token,
            Edge::Token,
            sk_generic,
        ),
    },
    Spec {
        id: "groq-api-key",
        prio: 3,
        anchors: &["gsk_"],
        how: token(
            "gsk_[A-Za-z0-9]{48,56}",
            62,
            Edge::Word,
            Edge::Word,
            random_tail,
        ),
    },
    Spec {
        id: "xai-api-key",
        prio: 3,
        anchors: &["xai-"],
        how: token(
            "xai-[A-Za-z0-9]{70,90}",
            96,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "perplexity-api-key",
        prio: 3,
        anchors: &["pplx-"],
        how: token(
            "pplx-[A-Za-z0-9]{40,56}",
            64,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "replicate-api-token",
        prio: 3,
        anchors: &["r8_"],
        how: token(
            "r8_[A-Za-z0-9]{30,45}",
            50,
            Edge::Word,
            Edge::Word,
            random_tail,
        ),
    },
    Spec {
        id: "langsmith-api-key",
        prio: 3,
        anchors: &["lsv2_"],
        how: token(
            "lsv2_(?:pt|sk)_[a-f0-9]{32}_[a-f0-9]{10}",
            55,
            Edge::Word,
            Edge::Word,
            random_tail,
        ),
    },
    Spec {
        id: "nvidia-api-key",
        prio: 3,
        anchors: &["nvapi-"],
        how: token(
            "nvapi-[A-Za-z0-9_-]{60,70}",
            80,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "ai-api-key",
        prio: 3,
        anchors: &[
            "tgp_v1_", "fw_", "pcsk_", "csk-", "api_org_", "esecret_", "pa-",
        ],
        how: token(
            "(?:tgp_v1_[A-Za-z0-9_-]{43}|fw_[A-Za-z0-9]{24,48}|pcsk_[A-Za-z0-9]{4,8}_[A-Za-z0-9]{50,80}|csk-[a-z0-9]{40,60}|api_org_[A-Za-z]{34}|esecret_[A-Za-z0-9]{20,40}|pa-[A-Za-z0-9_-]{43})",
            90,
            Edge::Token,
            Edge::Token,
            random_tail_last,
        ),
    },
    Spec {
        id: "elevenlabs-api-key",
        prio: 2,
        anchors: &["sk_"],
        how: token("sk_[a-f0-9]{48}", 52, Edge::Word, Edge::Word, hex_mixed),
    },
    Spec {
        id: "langfuse-secret-key",
        prio: 3,
        anchors: &["sk-"],
        how: token(
            "sk-lf-[a-f0-9]{8}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{12}",
            45,
            Edge::Token,
            Edge::Token,
            random_tail_last,
        ),
    },
    // ------------------------------------------------------------ more vendors (formats from each vendor's documentation)
    Spec {
        id: "aws-bedrock-api-key",
        prio: 3,
        anchors: &["ABSK"],
        how: token(
            "ABSK[A-Za-z0-9+/]{109,269}={0,2}",
            280,
            Edge::B64Body,
            Edge::B64,
            random_tail,
        ),
    },
    Spec {
        id: "azure-ad-client-secret",
        prio: 3,
        anchors: &["Q~"],
        how: How::Re(ReSpec {
            re: "[A-Za-z0-9_~.]{3}[0-9]Q~[A-Za-z0-9_~.-]{31,34}",
            back: 4,
            fwd: 40,
            group: 0,
            check_group: 0,
            left: Edge::Token,
            right: Edge::Token,
            check: mixed_random,
        }),
    },
    Spec {
        id: "alibaba-access-key-id",
        prio: 3,
        anchors: &["LTAI"],
        how: token(
            "LTAI[A-Za-z0-9]{12,20}",
            24,
            Edge::Alnum,
            Edge::Alnum,
            mixed_random,
        ),
    },
    Spec {
        id: "digitalocean-token",
        prio: 3,
        anchors: &["dop_v1_", "doo_v1_", "dor_v1_"],
        how: token(
            "do[por]_v1_[a-f0-9]{64}",
            72,
            Edge::Word,
            Edge::Word,
            random_tail,
        ),
    },
    Spec {
        id: "doppler-token",
        prio: 3,
        anchors: &[
            "dp.pt.",
            "dp.st.",
            "dp.sa.",
            "dp.ct.",
            "dp.scim.",
            "dp.audit.",
        ],
        how: token(
            r"dp\.(?:pt|st|sa|ct|scim|audit)\.(?:[a-z0-9_-]{1,40}\.)?[A-Za-z0-9]{40,44}",
            100,
            Edge::Token,
            Edge::Token,
            tail_after_last_dot,
        ),
    },
    Spec {
        id: "grafana-token",
        prio: 3,
        anchors: &["glsa_", "glc_"],
        how: token(
            "gl(?:sa_[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}|c_[A-Za-z0-9+/]{32,400}={0,3})",
            410,
            Edge::Word,
            Edge::B64,
            random_tail,
        ),
    },
    Spec {
        id: "grafana-token",
        prio: 3,
        anchors: &["eyJ"],
        how: token(
            "eyJrIjoi[A-Za-z0-9]{40,400}={0,3}",
            410,
            Edge::B64Body,
            Edge::B64,
            random_tail,
        ),
    },
    Spec {
        id: "hashicorp-vault-token",
        prio: 3,
        anchors: &["hvs.", "hvb.", "hvr."],
        how: token(
            r"hv[sbr]\.[A-Za-z0-9_-]{90,300}",
            310,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "terraform-cloud-token",
        prio: 3,
        anchors: &[".atlasv1."],
        how: How::Re(ReSpec {
            re: r"[A-Za-z0-9]{14}\.atlasv1\.[A-Za-z0-9_=-]{60,70}",
            back: 14,
            fwd: 80,
            group: 0,
            check_group: 0,
            left: Edge::Token,
            right: Edge::Token,
            check: tail_after_last_dot,
        }),
    },
    Spec {
        id: "pulumi-token",
        prio: 3,
        anchors: &["pul-"],
        how: token(
            "pul-[a-f0-9]{40}",
            44,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "planetscale-token",
        prio: 3,
        anchors: &["pscale_"],
        how: token(
            r"pscale_(?:tkn|pw|oauth)_[A-Za-z0-9_=.-]{32,64}",
            80,
            Edge::Word,
            Edge::Token,
            random_tail_last,
        ),
    },
    Spec {
        id: "supabase-token",
        prio: 3,
        anchors: &["sbp_", "sb_secret_"],
        how: token(
            "(?:sbp_(?:oauth_)?[a-f0-9]{40}|sb_secret_[A-Za-z0-9_-]{31,64})",
            80,
            Edge::Word,
            Edge::Token,
            random_tail_last,
        ),
    },
    Spec {
        id: "vercel-token",
        prio: 3,
        anchors: &["vcp_", "vci_", "vca_", "vcr_", "vck_"],
        how: token(
            "vc[pciark]_[A-Za-z0-9]{24,80}",
            90,
            Edge::Word,
            Edge::Word,
            random_tail,
        ),
    },
    Spec {
        id: "netlify-token",
        prio: 3,
        anchors: &["nfp_", "nfo_", "nfc_", "nfu_"],
        how: token(
            "nf[pocu]_[A-Za-z0-9]{36,40}",
            48,
            Edge::Word,
            Edge::Word,
            random_tail,
        ),
    },
    Spec {
        id: "cloudflare-origin-ca-key",
        prio: 3,
        anchors: &["v1.0-"],
        how: token(
            r"v1\.0-[a-f0-9]{24}-[a-f0-9]{146}",
            180,
            Edge::Token,
            Edge::Token,
            random_tail_last,
        ),
    },
    Spec {
        id: "flyio-token",
        prio: 3,
        anchors: &["fo1_", "fm1a_", "fm1r_", "fm2_"],
        how: token(
            "(?:fo1_[A-Za-z0-9_-]{43}|(?:fm1[ar]|fm2)_[A-Za-z0-9+/=_-]{40,}(?:,fm2_[A-Za-z0-9+/=_-]{40,}){0,3})",
            8100,
            Edge::Word,
            Edge::B64,
            random_tail,
        ),
    },
    Spec {
        id: "heroku-api-key",
        prio: 3,
        anchors: &["HRKU-"],
        how: token(
            "HRKU-AA[0-9A-Za-z_-]{58}",
            66,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "databricks-token",
        prio: 3,
        anchors: &["dapi"],
        how: token(
            "dapi[a-f0-9]{32}(?:-[0-9])?",
            40,
            Edge::Word,
            Edge::Word,
            hex_mixed,
        ),
    },
    Spec {
        id: "atlassian-api-token",
        prio: 3,
        anchors: &["ATATT3", "ATCTT3"],
        how: token(
            "AT[AC]TT3[A-Za-z0-9_=-]{150,300}",
            310,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "linear-api-key",
        prio: 3,
        anchors: &["lin_api_", "lin_oauth_"],
        how: token(
            "lin_(?:api_[A-Za-z0-9]{40}|oauth_[a-f0-9]{64})",
            76,
            Edge::Word,
            Edge::Word,
            random_tail_last,
        ),
    },
    Spec {
        id: "notion-token",
        prio: 3,
        anchors: &["ntn_", "secret_"],
        how: token(
            "(?:ntn_[0-9]{11}[A-Za-z0-9]{35}|secret_[A-Za-z0-9]{43})",
            52,
            Edge::Word,
            Edge::Word,
            random_tail_last,
        ),
    },
    Spec {
        id: "airtable-token",
        prio: 3,
        anchors: &["pat"],
        how: How::Hit(airtable),
    },
    Spec {
        id: "postman-api-key",
        prio: 3,
        anchors: &["PMAK-"],
        how: token(
            "PMAK-[a-f0-9]{24}-[a-f0-9]{34}",
            64,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "sentry-token",
        prio: 3,
        anchors: &["sntryu_", "sntrys_"],
        how: token(
            "(?:sntryu_[a-f0-9]{64}|sntrys_eyJ[A-Za-z0-9+/=]{20,800}_[A-Za-z0-9+/]{43})",
            860,
            Edge::Word,
            Edge::B64,
            random_tail_last,
        ),
    },
    Spec {
        id: "new-relic-key",
        prio: 3,
        anchors: &["NRAK-", "NRAA-", "NRII-", "NRJS-"],
        how: token(
            "NR(?:AK-[A-Z0-9]{27}|AA-[a-f0-9]{27}|II-[A-Za-z0-9_-]{32}|JS-[a-f0-9]{19})",
            40,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "square-token",
        prio: 3,
        anchors: &["sq0atp-", "sq0csp-", "sq0idp-", "EAAA"],
        how: token(
            "(?:sq0(?:atp|csp|idp)-[A-Za-z0-9_-]{22,60}|EAAA[A-Za-z0-9_-]{60})",
            70,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "braintree-access-token",
        prio: 3,
        anchors: &["access_token$"],
        how: token(
            r"access_token\$(?:production|sandbox)\$[a-z0-9]{16}\$[a-f0-9]{32}",
            80,
            Edge::Word,
            Edge::Word,
            random_tail_last,
        ),
    },
    Spec {
        id: "adyen-api-key",
        prio: 3,
        anchors: &["AQE"],
        how: token(
            r#"AQE[A-Za-z0-9+/]{40,200}={0,2}-[A-Za-z0-9+/]{30,60}={0,2}(?:-[^\s"'`<>]{4,32})?"#,
            300,
            Edge::B64Body,
            Edge::Free,
            mixed_random,
        ),
    },
    Spec {
        id: "dropbox-token",
        prio: 3,
        anchors: &["sl."],
        how: token(
            r"sl\.(?:u\.)?[A-Za-z0-9_-]{130,1400}",
            1410,
            Edge::Token,
            Edge::Token,
            random_tail_last,
        ),
    },
    Spec {
        id: "dropbox-token",
        prio: 3,
        anchors: &["AAAAAAAAAA"],
        how: How::Re(ReSpec {
            re: "[A-Za-z0-9]{11}AAAAAAAAAA[A-Za-z0-9_=-]{43}",
            back: 11,
            fwd: 53,
            group: 0,
            check_group: 0,
            left: Edge::Token,
            right: Edge::Token,
            check: dropbox_long,
        }),
    },
    Spec {
        id: "asana-token",
        prio: 2,
        anchors: &[],
        how: How::Run(digits::asana),
    },
    Spec {
        id: "mapbox-secret-token",
        prio: 3,
        anchors: &["sk.eyJ", "tk.eyJ"],
        how: token(
            r"[st]k\.eyJ[A-Za-z0-9_-]{20,400}\.[A-Za-z0-9_-]{20,40}",
            460,
            Edge::Token,
            Edge::Token,
            tail_after_last_dot,
        ),
    },
    Spec {
        id: "contentful-token",
        prio: 3,
        anchors: &["CFPAT-"],
        how: token(
            "CFPAT-[A-Za-z0-9_-]{43}",
            50,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "intercom-token",
        prio: 3,
        anchors: &["dG9rO"],
        how: token(
            "dG9rO[A-Za-z0-9+/]{40,120}={0,2}",
            130,
            Edge::B64Body,
            Edge::B64,
            random_suffix_5,
        ),
    },
    Spec {
        id: "twilio-auth-token",
        prio: 3,
        anchors: &["wilio", "WILIO"],
        how: context(
            "AC[a-f0-9]{32}[^A-Za-z0-9\n]{1,12}([a-f0-9]{32})",
            300,
            300,
            1,
            Edge::Alnum,
            hex_mixed,
        ),
    },
    Spec {
        id: "onepassword-secret",
        prio: 3,
        anchors: &["A3-", "ops_eyJ"],
        how: token(
            "(?:A3-[A-Z0-9]{6}-(?:[A-Z0-9]{11}|[A-Z0-9]{6}-[A-Z0-9]{5})-[A-Z0-9]{5}-[A-Z0-9]{5}-[A-Z0-9]{5}|ops_eyJ[A-Za-z0-9+/]{250,}={0,3})",
            2010,
            Edge::Token,
            Edge::B64,
            random_tail,
        ),
    },
    Spec {
        id: "artifactory-token",
        prio: 3,
        anchors: &["AKCp", "cmVmd"],
        how: token(
            "(?:AKCp[A-Za-z0-9]{69}|cmVmd[A-Za-z0-9]{59})",
            75,
            Edge::Alnum,
            Edge::Alnum,
            random_tail,
        ),
    },
    Spec {
        id: "dynatrace-token",
        prio: 3,
        anchors: &["dt0c01."],
        how: token(
            r"dt0c01\.[A-Z0-9]{24}\.[A-Z0-9]{64}",
            100,
            Edge::Token,
            Edge::Token,
            tail_after_last_dot,
        ),
    },
    Spec {
        id: "easypost-api-key",
        prio: 3,
        anchors: &["EZAK", "EZTK"],
        how: token(
            "EZ[AT]K[A-Za-z0-9]{54}",
            60,
            Edge::Alnum,
            Edge::Alnum,
            random_tail,
        ),
    },
    Spec {
        id: "brevo-api-key",
        prio: 3,
        anchors: &["xkeysib-", "xsmtpsib-"],
        how: token(
            "x(?:keysib|smtpsib)-[a-f0-9]{64}-[A-Za-z0-9]{16}",
            92,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "sourcegraph-token",
        prio: 3,
        anchors: &["sgp_"],
        how: token(
            "sgp_(?:(?:[a-f0-9]{16}|local)_)?[a-f0-9]{40}",
            64,
            Edge::Word,
            Edge::Word,
            random_tail_last,
        ),
    },
    Spec {
        id: "sonarqube-token",
        prio: 3,
        anchors: &["squ_", "sqp_", "sqa_"],
        how: token(
            "sq[upa]_[a-f0-9]{40}",
            44,
            Edge::Word,
            Edge::Word,
            hex_mixed,
        ),
    },
    Spec {
        id: "package-registry-token",
        prio: 3,
        anchors: &["CLOJARS_", "rubygems_", "pnu_", "rdme_"],
        how: token(
            "(?:CLOJARS_[a-z0-9]{60}|rubygems_[a-f0-9]{48}|pnu_[A-Za-z0-9]{36}|rdme_[a-z0-9]{70})",
            80,
            Edge::Word,
            Edge::Word,
            random_tail,
        ),
    },
    Spec {
        id: "saas-api-token",
        prio: 3,
        anchors: &[
            "shippo_", "tfp_", "fio-u-", "duffel_", "ico-", "tk-us-", "sm_", "p8e-", "FLWSECK",
        ],
        how: token(
            r"(?:shippo_(?:live|test)_[a-f0-9]{40}|tfp_[A-Za-z0-9_.=-]{59}|fio-u-[A-Za-z0-9_=-]{64}|duffel_(?:test|live)_[A-Za-z0-9_=-]{43}|ico-[A-Za-z0-9]{32}|tk-us-[A-Za-z0-9_-]{48}|sm_(?:aat|pat|sat)_[A-Za-z0-9]{16}|p8e-[A-Za-z0-9]{32}|FLWSECK(?:_TEST)?-[a-h0-9]{32}-X)",
            80,
            Edge::Token,
            Edge::Token,
            random_tail_last,
        ),
    },
    Spec {
        id: "docker-swarm-token",
        prio: 3,
        anchors: &["SWMTKN-1-"],
        how: token(
            r"SWMTKN-1-[a-z0-9]{50}-[a-z0-9]{25}",
            90,
            Edge::Token,
            Edge::Token,
            random_tail_last,
        ),
    },
    Spec {
        id: "maxmind-license-key",
        prio: 3,
        anchors: &["_mmk"],
        how: context(
            r"([A-Za-z0-9]{6}_[A-Za-z0-9]{29}_mmk)",
            40,
            4,
            1,
            Edge::Word,
            random_suffix_7,
        ),
    },
    Spec {
        id: "nostr-secret-key",
        prio: 3,
        anchors: &["nsec1"],
        how: token(
            "nsec1[02-9ac-hj-np-z]{58}",
            63,
            Edge::Alnum,
            Edge::Alnum,
            random_suffix_5,
        ),
    },
    Spec {
        id: "paseto-token",
        prio: 3,
        anchors: &[
            "v1.local.",
            "v2.local.",
            "v3.local.",
            "v4.local.",
            "v1.public.",
            "v2.public.",
            "v3.public.",
            "v4.public.",
        ],
        how: token(
            r"v[1-4]\.(?:local|public)\.[A-Za-z0-9_-]{40,}(?:\.[A-Za-z0-9_-]+)?",
            4096,
            Edge::Token,
            Edge::Token,
            paseto_body,
        ),
    },
    Spec {
        id: "fernet-token",
        prio: 3,
        anchors: &["gAAAAAB"],
        how: token(
            "gAAAAAB[A-Za-z0-9_-]{73,}={0,2}",
            4096,
            Edge::B64Body,
            Edge::B64,
            random_suffix_7,
        ),
    },
    Spec {
        id: "facebook-access-token",
        prio: 3,
        anchors: &["EAAC", "EAAM", "EAAG"],
        how: token(
            "EAA[CMG][A-Za-z0-9]{100,400}",
            410,
            Edge::Alnum,
            Edge::Alnum,
            random_tail,
        ),
    },
    Spec {
        id: "openshift-token",
        prio: 3,
        anchors: &["sha256~"],
        how: token(
            "sha256~[A-Za-z0-9_-]{43}",
            52,
            Edge::Token,
            Edge::Token,
            random_tail_last,
        ),
    },
    Spec {
        id: "teams-webhook-url",
        prio: 3,
        anchors: &["webhook.office.com"],
        how: How::Re(ReSpec {
            re: r"https://[a-z0-9-]{1,60}\.webhook\.office\.com/webhookb2/[a-f0-9-]{36}@[a-f0-9-]{36}/IncomingWebhook/[A-Za-z0-9]{32}/[a-f0-9-]{36}(?:/[A-Za-z0-9_-]{20,80})?",
            back: 80,
            fwd: 300,
            group: 0,
            check_group: 0,
            left: Edge::Alnum,
            right: Edge::Token,
            check: webhook,
        }),
    },
    Spec {
        id: "mailchimp-api-key",
        prio: 3,
        anchors: &["-us"],
        how: How::Re(ReSpec {
            re: "[a-f0-9]{32}-us[0-9]{1,2}",
            back: 32,
            fwd: 5,
            group: 0,
            check_group: 0,
            left: Edge::Alnum,
            right: Edge::Alnum,
            check: hex_mixed,
        }),
    },
    Spec {
        id: "yandex-token",
        prio: 3,
        anchors: &["AQVN", "t1."],
        how: token(
            r"(?:AQVN[A-Za-z0-9_-]{35,38}|t1\.[A-Za-z0-9_-]{10,200}={0,2}\.[A-Za-z0-9_-]{86}={0,2})",
            300,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "twitter-bearer-token",
        prio: 3,
        anchors: &["AAAAAAAAAAAAAAAAAAAAA"],
        how: token(
            "A{22}[A-Za-z0-9%]{80,120}",
            150,
            Edge::Alnum,
            Edge::Alnum,
            twitter_bearer,
        ),
    },
    // ------------------------------------------------------------ keys and tokens
    Spec {
        id: "private-key",
        prio: 4,
        anchors: &["BEGIN"],
        how: How::Hit(blocks::pem),
    },
    Spec {
        id: "private-key",
        prio: 4,
        anchors: &["-----END "],
        how: How::Hit(blocks::pem_end),
    },
    Spec {
        id: "private-key",
        prio: 4,
        anchors: &["PuTTY-User-Key-File-"],
        how: How::Hit(blocks::putty),
    },
    Spec {
        id: "private-key",
        prio: 4,
        anchors: &["LS0tLS1CRUdJTi"],
        how: How::Hit(blocks::pem_base64),
    },
    Spec {
        id: "jwt",
        prio: 3,
        anchors: &["eyJ"],
        how: How::Hit(blocks::jwt),
    },
    Spec {
        id: "age-secret-key",
        prio: 3,
        anchors: &["AGE-SECRET-KEY-1"],
        how: token(
            "AGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7Lqpzry9x8gf2tvdw0s3jn54khce6mua7l]{58}",
            80,
            Edge::Token,
            Edge::Token,
            age,
        ),
    },
    // ------------------------------------------------------------ credentials in text
    Spec {
        id: "url-credentials",
        prio: 1,
        anchors: &["://"],
        how: How::Hit(url_credentials),
    },
    Spec {
        id: "password-assignment",
        prio: 1,
        anchors: &[
            "pass",
            "PASS",
            "Pass",
            "assw",
            "ASSW",
            "pwd",
            "Pwd",
            "PWD",
            "pw",
            "PW",
            "Pw",
            "psk",
            "PSK",
            "Psk", // the word in other languages (`passwort` has `pass`)
            "wort",
            "WORT",
            "woord",
            "WOORD",
            "salasana",
            "SALASANA",
            "Salasana",
            "heslo",
            "HESLO",
            "Heslo",
            "haslo",
            "HASLO",
            "Haslo",
            "parola",
            "PAROLA",
            "Parola",
            "sifre",
            "SIFRE",
            "Sifre",
            "senha",
            "SENHA",
            "Senha",
            "contrasena",
            "Contrasena",
        ],
        how: How::Hit(assign::password),
    },
    Spec {
        id: "password-assignment",
        prio: 1,
        anchors: &[
            "mysql",
            "mariadb",
            "mongo",
            "sshpass",
            "redis-cli",
            "curl",
            "docker",
            "sqlcmd",
            "ipmitool",
            "ldapsearch",
            "ldapmodify",
            "ldapadd",
            "ldapdelete",
            "zip",
            "keytool",
            "psexec",
            "az login",
        ],
        how: How::Hit(assign::command_line),
    },
    Spec {
        id: "password-assignment",
        prio: 1,
        anchors: &["pass", "Pass", "PASS"],
        how: How::Hit(assign::use_as_password),
    },
    Spec {
        id: "password-assignment",
        prio: 2,
        anchors: &["IDENTIFIED", "identified", "Identified"],
        how: context(
            r"(?i:identified)\s+(?i:by)\s+(?:password\s+)?'([^'\n]{4,128})'",
            0,
            160,
            1,
            Edge::Free,
            not_placeholder,
        ),
    },
    // MySQL's `SET PASSWORD [FOR user] = 'x'` (or `= PASSWORD('x')`).
    Spec {
        id: "password-assignment",
        prio: 2,
        anchors: &[
            "SET PASSWORD",
            "set password",
            "Set password",
            "Set Password",
            "SET password",
        ],
        how: context(
            r"(?i:set)\s+(?i:password)(?:\s+(?i:for)\s+[^=;\n]{1,160})?\s*=\s*(?:(?i:password)\s*\(\s*)?'([^'\n]{4,128})'",
            0,
            320,
            1,
            Edge::Free,
            not_placeholder,
        ),
    },
    Spec {
        id: "password-assignment",
        prio: 2,
        anchors: &["requirepass", "masterauth"],
        how: context(
            r#"(?m:^[ \t]*(?:requirepass|masterauth)[ \t]+"?([^\s"]{4,128}))"#,
            0,
            150,
            1,
            Edge::Free,
            not_placeholder,
        ),
    },
    Spec {
        id: "password-assignment",
        prio: 1,
        anchors: &[":5432:", ":6432:", ":5433:", ":*:"],
        how: How::Hit(assign::pgpass),
    },
    Spec {
        id: "password-hash",
        prio: 2,
        anchors: &[
            "$2a$", "$2b$", "$2y$", "$apr1$", "$1$", "$5$", "$6$", "{SHA}",
        ],
        how: token(
            r"(?:\$2[aby]\$[0-9]{2}\$[./A-Za-z0-9]{53}|\$(?:apr1|1)\$[./A-Za-z0-9]{1,8}\$[./A-Za-z0-9]{22}|\$[56]\$(?:rounds=[0-9]{1,9}\$)?[./A-Za-z0-9]{1,16}\$[./A-Za-z0-9]{43,86}|\{SHA\}[A-Za-z0-9+/]{27}=)",
            130,
            Edge::Free,
            Edge::Token,
            random_tail_last,
        ),
    },
    Spec {
        id: "totp-seed",
        prio: 3,
        anchors: &["totp", "hotp"],
        how: context(
            r"otpauth://[a-z]{3,5}/[^?\s]*\?(?:[^\s#]*&)?secret=([A-Za-z2-7]{16,128}=*)",
            10,
            1000,
            1,
            Edge::Alnum,
            notes::named_base32_seed,
        ),
    },
    Spec {
        id: "totp-seed",
        prio: 3,
        anchors: &["TOTP", "totp", "Totp", "2FA", "2fa", "MFA", "OTP"],
        how: context(
            r"(?i:totp|2fa|mfa|otp)[^\n]{0,80}?[^A-Za-z0-9]([A-Z2-7]{4}(?: ?[A-Z2-7]{4}){3,15}=*|[a-z2-7]{4}(?: ?[a-z2-7]{4}){3,15})",
            0,
            260,
            1,
            Edge::Alnum,
            notes::named_base32_seed,
        ),
    },
    Spec {
        id: "secret-assignment",
        prio: 1,
        anchors: SECRET_WORDS,
        how: How::Hit(assign::secret),
    },
    // ------------------------------------------------------------ more vendor formats
    Spec {
        id: "tailscale-key",
        prio: 3,
        anchors: &["tskey-"],
        how: token(
            r"tskey-(?:auth|api|client|scim|webhook)-[A-Za-z0-9]{6,40}-[A-Za-z0-9]{16,64}",
            110,
            Edge::Token,
            Edge::Token,
            random_tail_last,
        ),
    },
    Spec {
        id: "nuget-api-key",
        prio: 3,
        anchors: &["oy2"],
        how: token(
            r"oy2[a-z0-9]{43}",
            46,
            Edge::Alnum,
            Edge::Alnum,
            random_tail,
        ),
    },
    Spec {
        id: "crates-io-token",
        prio: 3,
        anchors: &["cio"],
        how: token(
            r"cio[A-Za-z0-9]{32}",
            35,
            Edge::Alnum,
            Edge::Alnum,
            random_tail,
        ),
    },
    Spec {
        id: "circleci-token",
        prio: 3,
        anchors: &["CCIPAT_", "CCIPRJ_"],
        how: token(
            r"CCIP(?:AT|RJ)_[A-Za-z0-9]{22}_[a-f0-9]{40}",
            75,
            Edge::Word,
            Edge::Word,
            random_tail,
        ),
    },
    Spec {
        id: "bitbucket-app-password",
        prio: 3,
        anchors: &["ATBB"],
        how: token(
            r"ATBB[A-Za-z0-9]{32,40}",
            44,
            Edge::Alnum,
            Edge::Alnum,
            random_tail,
        ),
    },
    Spec {
        id: "atlassian-token",
        prio: 3,
        anchors: &["ATTA", "ATCTT3xFfGN0"],
        how: token(
            r"(?:ATTA[a-f0-9]{64}[A-F0-9]{8}|ATCTT3xFfGN0[A-Za-z0-9_=-]{150,300})",
            310,
            Edge::Alnum,
            Edge::Alnum,
            random_tail,
        ),
    },
    Spec {
        id: "figma-token",
        prio: 3,
        anchors: &["figd_", "figu_"],
        how: token(
            r"fig[du]_[A-Za-z0-9_-]{40}",
            45,
            Edge::Word,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "hubspot-token",
        prio: 3,
        anchors: &["pat-na", "pat-eu", "pat-ap"],
        how: token(
            r"pat-(?:na|eu|ap)[0-9]-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            50,
            Edge::Token,
            Edge::Token,
            random_tail_last,
        ),
    },
    Spec {
        id: "plaid-token",
        prio: 3,
        anchors: &[
            "access-sandbox-",
            "access-development-",
            "access-production-",
        ],
        how: token(
            r"access-(?:sandbox|development|production)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            60,
            Edge::Token,
            Edge::Token,
            random_tail_last,
        ),
    },
    Spec {
        id: "google-refresh-token",
        prio: 3,
        anchors: &["1//0"],
        how: token(
            r"1//0[A-Za-z0-9_-]{40,300}",
            310,
            Edge::Alnum,
            Edge::Token,
            random_tail_last,
        ),
    },
    Spec {
        id: "fcm-server-key",
        prio: 3,
        anchors: &[":APA91b"],
        how: How::Re(ReSpec {
            re: "AAAA[A-Za-z0-9_-]{7}:APA91b[A-Za-z0-9_-]{120,200}",
            back: 12,
            fwd: 210,
            group: 0,
            check_group: 0,
            left: Edge::Token,
            right: Edge::Token,
            check: telegram,
        }),
    },
    Spec {
        id: "bip32-private-key",
        prio: 3,
        anchors: &["xprv", "tprv"],
        how: token(
            r"[xt]prv[1-9A-HJ-NP-Za-km-z]{100,108}",
            112,
            Edge::Alnum,
            Edge::Alnum,
            random_tail,
        ),
    },
    Spec {
        id: "buildkite-token",
        prio: 3,
        anchors: &["bkua_"],
        how: token(
            r"bkua_[a-f0-9]{40}",
            45,
            Edge::Word,
            Edge::Word,
            random_tail,
        ),
    },
    Spec {
        id: "salesforce-session",
        prio: 3,
        anchors: &["00D"],
        how: token(
            r"00D[A-Za-z0-9]{12,15}![A-Za-z0-9._]{80,200}",
            220,
            Edge::Alnum,
            Edge::Alnum,
            tail_after_bang,
        ),
    },
    Spec {
        id: "octopus-api-key",
        prio: 3,
        anchors: &["API-"],
        how: token(
            r"API-[A-Z0-9]{26}",
            30,
            Edge::Token,
            Edge::Token,
            random_tail,
        ),
    },
    Spec {
        id: "harness-token",
        prio: 3,
        anchors: &["pat.", "sat."],
        how: token(
            r"(?:pat|sat)\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9]{24}\.[A-Za-z0-9]{20}",
            75,
            Edge::Alnum,
            Edge::Alnum,
            random_tail_last,
        ),
    },
    Spec {
        id: "neon-api-key",
        prio: 3,
        anchors: &["napi_"],
        how: token(
            r"napi_[a-z0-9]{64}",
            70,
            Edge::Word,
            Edge::Word,
            random_tail,
        ),
    },
    Spec {
        id: "render-api-key",
        prio: 3,
        anchors: &["rnd_"],
        how: token(
            r"rnd_[A-Za-z0-9]{24,40}",
            36,
            Edge::Word,
            Edge::Word,
            random_tail,
        ),
    },
    Spec {
        id: "runpod-api-key",
        prio: 3,
        anchors: &["rpa_"],
        how: token(r"rpa_[A-Z0-9]{40}", 44, Edge::Word, Edge::Word, random_tail),
    },
    Spec {
        id: "honeycomb-api-key",
        prio: 3,
        anchors: &["hcaik_", "hcxik_"],
        how: token(
            r"hc[ax]ik_[a-z0-9]{58}",
            64,
            Edge::Word,
            Edge::Word,
            random_tail,
        ),
    },
    Spec {
        id: "resend-api-key",
        prio: 3,
        anchors: &["re_"],
        how: token(
            r"re_[A-Za-z0-9]{8}_[A-Za-z0-9]{24}",
            36,
            Edge::Word,
            Edge::Word,
            random_tail_last,
        ),
    },
    Spec {
        id: "clickup-token",
        prio: 3,
        anchors: &["pk_"],
        how: token(
            r"pk_[0-9]{6,10}_[A-Z0-9]{32}",
            45,
            Edge::Word,
            Edge::Word,
            random_tail_last,
        ),
    },
    Spec {
        id: "tencent-secret-id",
        prio: 3,
        anchors: &["AKID"],
        how: token(
            r"AKID[A-Za-z0-9]{32}",
            36,
            Edge::Alnum,
            Edge::Alnum,
            random_tail,
        ),
    },
    Spec {
        id: "django-secret-key",
        prio: 3,
        anchors: &["django-insecure-"],
        how: token(
            r"django-insecure-[!-&(-~]{30,80}",
            100,
            Edge::Alnum,
            Edge::Free,
            django_tail,
        ),
    },
    // Chat and automation webhooks whose URL alone lets anyone post.
    Spec {
        id: "chat-webhook",
        prio: 3,
        anchors: &[
            "open.feishu.cn/open-apis/bot/v2/hook/",
            "open.larksuite.com/open-apis/bot/v2/hook/",
            "qyapi.weixin.qq.com/cgi-bin/webhook/send?",
            "maker.ifttt.com/",
            "webexapis.com/v1/webhooks/incoming/",
            "hook.make.com/",
            "hook.eu1.make.com/",
            "hook.eu2.make.com/",
            "hook.us1.make.com/",
            "hook.us2.make.com/",
            "hook.integromat.com/",
            "hook.eu1.integromat.com/",
            "hook.eu2.integromat.com/",
            "hook.us1.integromat.com/",
        ],
        how: token(
            r"(?:open\.(?:feishu\.cn|larksuite\.com)/open-apis/bot/v2/hook/[A-Za-z0-9-]{20,64}|qyapi\.weixin\.qq\.com/cgi-bin/webhook/send\?(?:[A-Za-z0-9_.-]{1,32}=[A-Za-z0-9_.-]{0,64}&){0,4}key=[A-Za-z0-9-]{20,64}|maker\.ifttt\.com/(?:trigger/[A-Za-z0-9_.-]{1,64}/(?:json/)?with/key|use)/[A-Za-z0-9_-]{16,64}|webexapis\.com/v1/webhooks/incoming/[A-Za-z0-9_-]{40,200}|hook\.(?:[a-z]{2}[0-9]\.)?(?:make|integromat)\.com/[a-z0-9]{24,40})",
            300,
            Edge::Alnum,
            Edge::Alnum,
            random_tail_last_slash,
        ),
    },
    Spec {
        id: "zapier-webhook",
        prio: 3,
        anchors: &["hooks.zapier.com/hooks/catch/"],
        how: token(
            r"hooks\.zapier\.com/hooks/catch/[0-9]{4,12}/[A-Za-z0-9]{4,12}/?",
            70,
            Edge::Alnum,
            Edge::Alnum,
            any_value,
        ),
    },
    Spec {
        id: "mattermost-webhook",
        prio: 3,
        anchors: &["/hooks/"],
        how: token(
            r"/hooks/[a-z0-9]{26}",
            34,
            Edge::Free,
            Edge::Alnum,
            random_tail_last,
        ),
    },
    // ------------------------------------------------------------ personal data
    Spec {
        id: "credit-card",
        prio: 2,
        anchors: &[],
        how: How::Run(digits::cards),
    },
    Spec {
        id: "us-ssn",
        prio: 2,
        anchors: &[],
        how: How::Run(digits::ssn),
    },
    Spec {
        id: "iban",
        prio: 2,
        anchors: &[],
        how: How::Run(digits::iban),
    },
    // ------------------------------------------------------------ secrets in notes
    // Passwords on command lines that take them as arguments.
    Spec {
        id: "password-assignment",
        prio: 1,
        anchors: &[
            "htpasswd",
            "rabbitmqctl",
            "net use",
            "NET USE",
            "Net use",
            "net user",
            "NET USER",
            "smbclient",
            "rpcclient",
            "smbmap",
            "crackmapexec",
            "netexec",
            "lftp",
            "gh secret",
            "openssl",
            "ssh-keygen",
            "npm config set",
            "npm set",
            "yarn config set",
            "pnpm config set",
            "az sql",
            "az vm",
            "az postgres",
            "az mysql",
            "az webapp",
            "az ad",
            "az aks",
        ],
        how: How::Hit(notes::command_args),
    },
    Spec {
        id: "password-assignment",
        prio: 2,
        anchors: &["chpasswd"],
        how: context(
            r#"echo[\t\n\x0B\x0C\r ]+(?:-[en]+[\t\n\x0B\x0C\r ]+)?['"]?[A-Za-z0-9_.@-]{1,64}:([^\t\n\x0B\x0C\r '":]{4,128})['"]?[\t\n\x0B\x0C\r ]*\|[\t\n\x0B\x0C\r ]*(?:sudo[\t\n\x0B\x0C\r ]+)?chpasswd"#,
            300,
            20,
            1,
            Edge::Free,
            assign::command_value,
        ),
    },
    Spec {
        id: "password-assignment",
        prio: 2,
        anchors: &["chpasswd"],
        how: context(
            r#"chpasswd[\t\n\x0B\x0C\r ]*<<<[\t\n\x0B\x0C\r ]*['"]?[A-Za-z0-9_.@-]{1,64}:([^\t\n\x0B\x0C\r '":]{4,128})"#,
            0,
            300,
            1,
            Edge::Free,
            assign::command_value,
        ),
    },
    Spec {
        id: "password-assignment",
        prio: 2,
        anchors: &["ssh-keygen"],
        how: context(
            r#"ssh-keygen(?-u:\b)[^\n]*?[\t\n\x0B\x0C\r ]-N[\t\n\x0B\x0C\r ]*['"]?([^\t\n\x0B\x0C\r '"]{4,256})"#,
            0,
            600,
            1,
            Edge::Free,
            notes::keygen_passphrase,
        ),
    },
    Spec {
        id: "password-assignment",
        prio: 2,
        anchors: &["ssh-keygen"],
        how: context(
            r#"ssh-keygen(?-u:\b)[^\n]*?[\t\n\x0B\x0C\r ]-P[\t\n\x0B\x0C\r ]*['"]?([^\t\n\x0B\x0C\r '"]{4,256})"#,
            0,
            600,
            1,
            Edge::Free,
            notes::keygen_passphrase,
        ),
    },
    Spec {
        id: "password-assignment",
        prio: 2,
        anchors: &[
            "ConvertTo-SecureString",
            "convertto-securestring",
            "CONVERTTO-SECURESTRING",
        ],
        how: context(
            r#"(?i-u:convertto-securestring)[\t\n\x0B\x0C\r ]+(?:-String[\t\n\x0B\x0C\r ]+)?["']([^"'\n$]{4,256})["']"#,
            0,
            300,
            1,
            Edge::Free,
            not_placeholder,
        ),
    },
    Spec {
        id: "secret-assignment",
        prio: 2,
        anchors: &["gh auth login", "--password-stdin", "--with-token"],
        how: context(
            r#"echo[\t\n\x0B\x0C\r ]+(?:-n[\t\n\x0B\x0C\r ]+)?['"]?([^\t\n\x0B\x0C\r '"|$]{8,512})['"]?[\t\n\x0B\x0C\r ]*\|[\t\n\x0B\x0C\r ]*(?:sudo[\t\n\x0B\x0C\r ]+)?(?:gh[\t\n\x0B\x0C\r ]+auth[\t\n\x0B\x0C\r ]+login|[A-Za-z0-9_.-]+(?:[\t\n\x0B\x0C\r ]+[A-Za-z0-9_.-]+)?[\t\n\x0B\x0C\r ]+login)[^\n]*?(?:--with-token|--password-stdin)"#,
            400,
            200,
            1,
            Edge::Free,
            not_placeholder,
        ),
    },
    // Passwords in sentences and notes, in English, French, German and
    // Spanish.
    Spec {
        id: "password-assignment",
        prio: 1,
        anchors: &[
            "pass", "Pass", "PASS", "passcode", "Passcode", "PASSCODE", "pw", "PW", "pwd", "PWD",
        ],
        how: context(
            r#"(?i-u:(?-u:\b)(?:passcode|pass|pw|pwd))[\t\n\x0B\x0C\r ]*(?::|=|->|(?-u:\b)is(?-u:\b)|(?-u:\b)was(?-u:\b))[\t\n\x0B\x0C\r ]*([^\t\n\x0B\x0C\r "'<>|`$\-{(][^\t\n\x0B\x0C\r "'<>|`]{5,})"#,
            0,
            170,
            1,
            Edge::Free,
            notes::strong_password,
        ),
    },
    Spec {
        id: "password-assignment",
        prio: 1,
        anchors: &[
            "pass ",
            "Pass ",
            "PASS ",
            "passcode ",
            "Passcode ",
            "pw ",
            "PW ",
        ],
        how: context(
            r#"(?i-u:(?-u:\b)(?:passcode|(?:vpn|wifi|wi-fi|root|admin|db|ssh|sudo|router|server|email|my|new|old|current)[\t\n\x0B\x0C\r ]+pass|pw))[\t\n\x0B\x0C\r ]+([^\t\n\x0B\x0C\r "'<>|`$\-{(][^\t\n\x0B\x0C\r "'<>|`]{5,127})"#,
            40,
            170,
            1,
            Edge::Free,
            notes::strong_password,
        ),
    },
    Spec {
        id: "password-assignment",
        prio: 1,
        anchors: &[
            "login",
            "Login",
            "LOGIN",
            "creds",
            "Creds",
            "CREDS",
            "credentials",
            "Credentials",
            "Zugangsdaten",
            "zugangsdaten",
            "identifiants",
            "Identifiants",
            "Wi-Fi",
            "wi-fi",
            "WiFi",
            "wifi",
            "Wifi",
            "WIFI",
            "WLAN",
            "wlan",
        ],
        how: context(
            r#"(?i-u:(?-u:\b)(?:login|creds|credentials|zugangsdaten|identifiants|wi-?fi|wlan))(?:[\t\n\x0B\x0C\r ]*:?[\t\n\x0B\x0C\r ]+[A-Za-z0-9_.@+-]{1,64}[\t\n\x0B\x0C\r ]*/[\t\n\x0B\x0C\r ]*|[\t\n\x0B\x0C\r ]*:[\t\n\x0B\x0C\r ]+[A-Za-z][A-Za-z0-9_.@+-]{0,63}:|[\t\n\x0B\x0C\r ]+is[\t\n\x0B\x0C\r ]+[A-Za-z0-9_.@+-]{1,64}[\t\n\x0B\x0C\r ]+(?:with|and|/)[\t\n\x0B\x0C\r ]+)([^\t\n\x0B\x0C\r "'<>|`/][^\t\n\x0B\x0C\r "'<>|`]{5,})"#,
            0,
            240,
            1,
            Edge::Free,
            notes::strong_password,
        ),
    },
    Spec {
        id: "password-assignment",
        prio: 1,
        anchors: &[
            "password",
            "Password",
            "PASSWORD",
            "passphrase",
            "Passphrase",
            "passcode",
        ],
        how: context(
            r#"(?:^|[\t\n\x0B\x0C\r "'>(:])([^\t\n\x0B\x0C\r "'<>|`]{6,})[\t\n\x0B\x0C\r ]+(?:is|was)[\t\n\x0B\x0C\r ]+(?:the|my|our|his|her|their)[\t\n\x0B\x0C\r ]+(?:[A-Za-z0-9_-]+[\t\n\x0B\x0C\r ]+){0,3}(?i-u:password|passphrase|passcode)(?-u:\b)[\t\n\x0B\x0C\r ]*(?:$|[.,;!)"'<]|(?-u:\b)(?:and|but|for|of|on|to)(?-u:\b))"#,
            220,
            40,
            1,
            Edge::Free,
            notes::strong_password,
        ),
    },
    Spec {
        id: "password-assignment",
        prio: 1,
        anchors: &[
            "password",
            "Password",
            "PASSWORD",
            "passphrase",
            "Passphrase",
            "passcode",
            "pw ",
            "PW ",
        ],
        how: context(
            r#"(?i-u:(?-u:\b)(?:password|passphrase|passcode|pw|pwd)(?-u:\b))(?:[\t\n\x0B\x0C\r ]+(?:for[\t\n\x0B\x0C\r ]+\S+[\t\n\x0B\x0C\r ]+)?(?:was[\t\n\x0B\x0C\r ]+|has[\t\n\x0B\x0C\r ]+been[\t\n\x0B\x0C\r ]+|is[\t\n\x0B\x0C\r ]+|got[\t\n\x0B\x0C\r ]+|just[\t\n\x0B\x0C\r ]+)?(?:changed|set|reset|updated|rotated)[\t\n\x0B\x0C\r ]+to|[\t\n\x0B\x0C\r ]+(?:for|of|to)[\t\n\x0B\x0C\r ]+[^\t\n\x0B\x0C\r :=]+[\t\n\x0B\x0C\r ]*[:=])[\t\n\x0B\x0C\r ]*([^\t\n\x0B\x0C\r "'<>|`]{6,})"#,
            0,
            220,
            1,
            Edge::Free,
            notes::strong_password,
        ),
    },
    Spec {
        id: "password-assignment",
        prio: 1,
        anchors: &[
            "keypad", "Keypad", "alarm", "Alarm", "door", "Door", "gate", "Gate", "garage",
            "Garage",
        ],
        how: context(
            r#"(?i:(?-u:\b)(?:keypad|alarm|door|gate|garage|safe|lock)(?-u:\b)[^\n]{0,40}?(?-u:\b)code(?-u:\b)[^\n]{0,30}?(?:(?-u:\b)is(?-u:\b)|:|=)|(?-u:\b)code[\t\n\x0B\x0C\r ]+(?:for|of|to)[\t\n\x0B\x0C\r ]+[^\n]{0,40}?(?-u:\b)(?:keypad|alarm|door|gate|garage|safe|lock)(?-u:\b)[^\n]{0,30}?(?:(?-u:\b)is(?-u:\b)|:|=))[\t\n\x0B\x0C\r ]*([^\t\n\x0B\x0C\r "'<>|`]{4,64})"#,
            40,
            200,
            1,
            Edge::Free,
            notes::access_code,
        ),
    },
    // The word for a password in languages the rules above do not read,
    // then up to 40 characters on its line (`от сервера`), then a colon,
    // an equals sign or the language's "is", then the value
    // (`Пароль от сервера: X`, `数据库密码：X`, `パスワードは X です`).
    Spec {
        id: "password-assignment",
        prio: 1,
        anchors: &[
            "пароль",
            "Пароль",
            "ПАРОЛЬ",
            "密码",
            "密碼",
            "パスワード",
            "hasło",
            "Hasło",
            "HASŁO",
            "şifre",
            "Şifre",
            "ŞİFRE",
            "lösenord",
            "Lösenord",
            "LÖSENORD",
            "jelszó",
            "Jelszó",
            "JELSZÓ",
            "κωδικός",
            "Κωδικός",
            "κωδικό",
            "Κωδικό",
            "كلمة المرور",
            "كلمة السر",
            "סיסמה",
            "סיסמא",
            "पासवर्ड",
            "mật khẩu",
            "Mật khẩu",
            "MẬT KHẨU",
            "kata sandi",
            "Kata sandi",
            "KATA SANDI",
            "passord",
            "Passord",
            "PASSORD",
            "adgangskode",
            "Adgangskode",
            "parolă",
            "Parolă",
            "mat khau",
            "Mat khau",
            "MAT KHAU",
        ],
        how: context(
            r#"(?i:пароль|密码|密碼|パスワード|hasło|şifre|ŞİFRE|lösenord|jelszó|κωδικό[ςσ]?|كلمة المرور|كلمة السر|סיסמ[הא]|पासवर्ड|mật khẩu|mat khau|kata sandi|passord|adgangskode|parolă)(?:[^\n:=：＝]{0,40}?)(?:[\t ]*(?:[:=：＝]|->)[\t ]*|[\t ]+(?:on|är|er|jest|là|adalah|je|είναι|هي|היא|है|это)[\t ]*:?[\t ]*|[\t ]*(?:是|为|為|は)[\t ]*)([!#-&(-;=?-_a-{}~]{6,128})"#,
            0,
            240,
            1,
            Edge::Free,
            notes::prose_password,
        ),
    },
    // The words the rules above read with a colon or `=`, with the "is"
    // of Italian, Portuguese, Spanish, Romanian, Finnish or Turkish
    // (`La password del router è X`, `A senha do wifi é X`).
    Spec {
        id: "password-assignment",
        prio: 1,
        anchors: &[
            "password", "Password", "PASSWORD", "senha", "Senha", "SENHA", "salasana", "Salasana",
            "parola", "Parola", "PAROLA",
        ],
        how: context(
            r#"(?i:password|senha|salasana|parola)(?:[^\n:=]{0,40}?)[\t ]+(?:è|é|on|este|es)[\t ]*:?[\t ]*([!#-&(-;=?-_a-{}~]{6,128})"#,
            0,
            240,
            1,
            Edge::Free,
            notes::prose_password,
        ),
    },
    Spec {
        id: "password-assignment",
        prio: 1,
        anchors: &[
            "mot de passe",
            "Mot de passe",
            "MOT DE PASSE",
            "mdp",
            "MDP",
            "Mdp",
            "code wifi",
            "Code wifi",
            "code Wi-Fi",
            "code WiFi",
            "Code WiFi",
            "Code Wi-Fi",
            "code wi-fi",
        ],
        how: context(
            r#"(?i-u:(?-u:\b)(?:mot[\t\n\x0B\x0C\r ]+de[\t\n\x0B\x0C\r ]+passe|mdp|code[\t\n\x0B\x0C\r ]+wi-?fi))(?:[\t\n\x0B\x0C\r ]+(?:du|de[\t\n\x0B\x0C\r ]+la|de|des|pour)[\t\n\x0B\x0C\r ]+[^\n:=]{0,40}?)?(?:[\t\n\x0B\x0C\r ]+(?:wi-?fi|wlan))?(?:[\t\n\x0B\x0C\r ]*(?:(?-u:\b)est(?-u:\b)|:|=|->)[\t\n\x0B\x0C\r ]*|[\t\n\x0B\x0C\r ]+)([^\t\n\x0B\x0C\r "'<>|`]{6,128})"#,
            0,
            220,
            1,
            Edge::Free,
            notes::strong_password,
        ),
    },
    Spec {
        id: "password-assignment",
        prio: 1,
        anchors: &[
            "asswort",
            "ASSWORT",
            "ennwort",
            "ENNWORT",
            "chlüssel",
            "CHLÜSSEL",
            "chluessel",
            "ugangscode",
        ],
        how: context(
            r#"(?i:(?:passwort|kennwort|wlan-schl(?:ü|ue)ssel|netzwerkschl(?:ü|ue)ssel|zugangscode))(?:[\t\n\x0B\x0C\r ]+(?:f(?:ü|ue)r|des|der|vom|von)[\t\n\x0B\x0C\r ]+[^\n:=]{0,40}?)?(?:[\t\n\x0B\x0C\r ]*(?:(?-u:\b)lautet(?-u:\b)|(?-u:\b)ist(?-u:\b)|:|=)[\t\n\x0B\x0C\r ]*|[\t\n\x0B\x0C\r ]+)([^\t\n\x0B\x0C\r "'<>|`]{6,128})"#,
            20,
            220,
            1,
            Edge::Free,
            notes::strong_password,
        ),
    },
    Spec {
        id: "password-assignment",
        prio: 1,
        anchors: &[
            "contrase", "Contrase", "CONTRASE", "clave", "Clave", "CLAVE",
        ],
        how: context(
            r#"(?i:(?-u:\b)(?:contrase(?:ñ|n)a|clave))(?:[\t\n\x0B\x0C\r ]+(?:del?|para)[\t\n\x0B\x0C\r ]+[^\n:=]{0,40}?)?[\t\n\x0B\x0C\r ]*(?:(?-u:\b)es(?-u:\b)|:|=)[\t\n\x0B\x0C\r ]*([^\t\n\x0B\x0C\r "'<>|`]{6,128})"#,
            0,
            220,
            1,
            Edge::Free,
            notes::strong_password,
        ),
    },
    Spec {
        id: "password-assignment",
        prio: 1,
        anchors: &["PIN", "PUK"],
        how: context(
            r"(?-u:\b)(?:PIN|PUK)(?-u:\b)[\t\n\x0B\x0C\r ]*(?:code[\t\n\x0B\x0C\r ]*)?(?:[:=]|(?-u:\b)is(?-u:\b))?[\t\n\x0B\x0C\r ]*(\d{4,8})(?-u:\b)",
            0,
            40,
            1,
            Edge::Free,
            any_value,
        ),
    },
    // Markdown tables with a column of credentials.
    Spec {
        id: "password-assignment",
        prio: 1,
        anchors: &[
            "password",
            "Password",
            "PASSWORD",
            "passwd",
            "pw",
            "PW",
            "Pw",
            "pass",
            "Pass",
            "PASS",
            "creds",
            "Creds",
            "CREDS",
            "credentials",
            "Credentials",
            "secret",
            "Secret",
            "SECRET",
            "token",
            "Token",
            "TOKEN",
            "API key",
            "api key",
            "API Key",
            "PIN",
            "mot de passe",
            "Mot de passe",
            "Passwort",
            "passwort",
            "Kennwort",
            "contraseña",
            "Contraseña",
            "login",
            "Login",
            "mdp",
            "MDP",
        ],
        how: How::Many(notes::table_column),
    },
    // Session cookies.
    Spec {
        id: "session-cookie",
        prio: 2,
        anchors: &[
            "PHPSESSID",
            "connect.sid",
            "_session",
            ".AspNetCore.",
            "ASP.NET_SessionId",
            "JSESSIONID",
            "sessionid",
            "session_id",
            "session-token",
            "SESSIONID",
        ],
        how: context(
            r#"(?:PHPSESSID|connect\.sid|[A-Za-z0-9_.-]*_session|\.AspNetCore\.(?:Cookies|Session|Identity\.Application|[A-Za-z]*Auth[A-Za-z]*)|ASP\.NET_SessionId|JSESSIONID|sessionid|SESSIONID|session_id|[A-Za-z0-9_.-]*session-token)(?:[\t\n\x0B\x0C\r ]+cookie[^\n]{0,60}?[\t\n\x0B\x0C\r ]+is[\t\n\x0B\x0C\r ]+|["']?[\t\n\x0B\x0C\r ]*[=:][\t\n\x0B\x0C\r ]*["']?)([^;\t\n\x0B\x0C\r "'<>,()]{16,})"#,
            40,
            4200,
            1,
            Edge::Free,
            notes::cookie_value,
        ),
    },
    // Base64 credentials.
    Spec {
        id: "basic-auth-credentials",
        prio: 2,
        anchors: &["auth", "Auth", "AUTH"],
        how: context(
            r#"(?i-u:auth)[A-Za-z_.-]{0,20}["']?(?:[\t\n\x0B\x0C\r ]*[:=][\t\n\x0B\x0C\r ]*["']?(?:Basic[\t\n\x0B\x0C\r ]+)?|[\t\n\x0B\x0C\r ]+(?:value[\t\n\x0B\x0C\r ]+)?is[\t\n\x0B\x0C\r ]+|[\t\n\x0B\x0C\r ]+Basic[\t\n\x0B\x0C\r ]+)([A-Za-z0-9+/]{12,2048}={0,2})"#,
            0,
            2200,
            1,
            Edge::B64,
            notes::base64_credentials,
        ),
    },
    Spec {
        id: "basic-auth-credentials",
        prio: 2,
        anchors: &["dockerconfigjson", "dockercfg"],
        how: context(
            r#"docker(?:configjson|cfg)["']?(?:[\t\n\x0B\x0C\r ]*[:=]|[\t\n\x0B\x0C\r ]+(?:value[\t\n\x0B\x0C\r ]+)?is)[\t\n\x0B\x0C\r ]*["']?([A-Za-z0-9+/]{20,}={0,2})"#,
            0,
            66000,
            1,
            Edge::B64,
            notes::base64_docker_config,
        ),
    },
    Spec {
        id: "basic-auth-credentials",
        prio: 2,
        anchors: &[
            "cG9zdGdyZXM6Ly9",
            "cG9zdGdyZXNxbDovL",
            "bXlzcWw6Ly9",
            "bW9uZ29kYjovL",
            "bW9uZ29kYitzcnY6Ly9",
            "cmVkaXM6Ly9",
            "cmVkaXNzOi8v",
            "YW1xcDovL",
            "YW1xcHM6Ly9",
        ],
        how: token(
            r"[A-Za-z0-9+/]{16,}={0,2}",
            4100,
            Edge::B64,
            Edge::B64,
            notes::base64_url_with_password,
        ),
    },
    // Wallet seed phrases and two-factor recovery codes.
    Spec {
        id: "seed-phrase",
        prio: 2,
        anchors: &[
            "seed",
            "Seed",
            "SEED",
            "mnemonic",
            "Mnemonic",
            "MNEMONIC",
            "recovery phrase",
            "Recovery phrase",
            "secret phrase",
            "Secret phrase",
            "backup phrase",
            "wallet",
            "Wallet",
        ],
        how: How::Hit(notes::seed_phrase),
    },
    Spec {
        id: "recovery-codes",
        prio: 2,
        anchors: &[
            "recovery code",
            "Recovery code",
            "RECOVERY CODE",
            "recovery_code",
            "RECOVERY_CODE",
            "backup code",
            "Backup code",
            "BACKUP CODE",
            "backup_code",
            "BACKUP_CODE",
            "recoveryCode",
            "backupCode",
        ],
        how: How::Hit(notes::recovery_codes),
    },
    // Network devices and VPNs.
    Spec {
        id: "network-device-secret",
        prio: 2,
        anchors: &["$9$", "$8$"],
        how: token(
            r"\$[89]\$[A-Za-z0-9./-]{8,512}(?:\$[A-Za-z0-9./]{8,128})?",
            660,
            Edge::Free,
            Edge::Token,
            any_value,
        ),
    },
    Spec {
        id: "network-device-secret",
        prio: 2,
        anchors: &[
            "enable secret",
            "enable password",
            "username ",
            "password 7",
            "password 0",
            "key 7",
            "key 0",
            "snmp-server community",
            "message-digest-key",
            "tacacs-server",
            "radius-server",
            "tacacs server",
            "isakmp key",
            "set-key",
            "PSK",
        ],
        how: context(
            r#"(?m:(?:(?:^|[\t\n\x0B\x0C\r `'"(:])enable[\t\n\x0B\x0C\r ]+(?:secret|password)|(?:^|[\t\n\x0B\x0C\r `'"(:])username[\t\n\x0B\x0C\r ]+\S+(?:[\t\n\x0B\x0C\r ]+privilege[\t\n\x0B\x0C\r ]+\d+)?[\t\n\x0B\x0C\r ]+(?:secret|password)|(?-u:\b)(?:password|key)[\t\n\x0B\x0C\r ]+7|(?:^|[\t\n\x0B\x0C\r `'"(:])snmp-server[\t\n\x0B\x0C\r ]+community|(?-u:\b)message-digest-key[\t\n\x0B\x0C\r ]+\d+[\t\n\x0B\x0C\r ]+md5|(?:^|[\t\n\x0B\x0C\r `'"(:])(?:tacacs-server|radius-server)[\t\n\x0B\x0C\r ]+(?:host[\t\n\x0B\x0C\r ]+\S+[\t\n\x0B\x0C\r ]+)?key|(?-u:\b)tacacs[\t\n\x0B\x0C\r ]+server[^\n]*\n[\t\n\x0B\x0C\r ]*key|crypto[\t\n\x0B\x0C\r ]+isakmp[\t\n\x0B\x0C\r ]+key|set-key[\t\n\x0B\x0C\r ]+(?:ascii|hex)|:[\t\n\x0B\x0C\r ]*PSK)[\t\n\x0B\x0C\r ]+(?:[0-9][\t\n\x0B\x0C\r ]+)?["']?([^\t\n\x0B\x0C\r "'`]{4,256}))"#,
            80,
            300,
            1,
            Edge::Free,
            notes::device_secret,
        ),
    },
    Spec {
        id: "network-device-secret",
        prio: 2,
        anchors: &["snmp-server user", "auth sha", "auth md5"],
        how: context(
            r"(?-u:\b)auth[\t\n\x0B\x0C\r ]+(?:md5|sha\S*)[\t\n\x0B\x0C\r ]+(\S{4,128})",
            0,
            200,
            1,
            Edge::Free,
            not_placeholder,
        ),
    },
    Spec {
        id: "network-device-secret",
        prio: 2,
        anchors: &["priv des", "priv 3des", "priv aes"],
        how: context(
            r"(?-u:\b)priv[\t\n\x0B\x0C\r ]+(?:des|3des|aes(?:[\t\n\x0B\x0C\r ]+\d+)?)[\t\n\x0B\x0C\r ]+(\S{4,128})",
            0,
            200,
            1,
            Edge::Free,
            not_placeholder,
        ),
    },
    Spec {
        id: "network-device-secret",
        prio: 2,
        anchors: &["WIFI:"],
        how: context(
            r"WIFI:(?:[^;\n]*;){0,6}?P:((?:[^;\\\n]|\\.){4,128});",
            0,
            600,
            1,
            Edge::Free,
            not_placeholder,
        ),
    },
    Spec {
        id: "network-device-secret",
        prio: 2,
        anchors: &[
            "pre-shared-key",
            "PRE-SHARED-KEY",
            "preshared-key",
            "preshared_key",
        ],
        how: context(
            r#"(?i-u:pre-?shared[-_]key)["']?[\t\n\x0B\x0C\r ]*[=:][\t\n\x0B\x0C\r ]*["']?([^\t\n\x0B\x0C\r "'`]{8,128})"#,
            0,
            170,
            1,
            Edge::Free,
            not_placeholder,
        ),
    },
    Spec {
        id: "network-device-secret",
        prio: 2,
        anchors: &["private-key"],
        how: context(
            r#"private-key[\t\n\x0B\x0C\r ]+<\([\t\n\x0B\x0C\r ]*echo[\t\n\x0B\x0C\r ]+['"]?([A-Za-z0-9+/]{42,43}=)"#,
            0,
            120,
            1,
            Edge::Free,
            any_value,
        ),
    },
];

/// Every built-in rule id with a one-line description, in the order
/// `memvault redact --list-rules` prints them.
pub(crate) const RULES: &[(&str, &str)] = &[
    (
        "aws-access-key-id",
        "AWS access key id: AKIA/ASIA/ABIA/ACCA and 16 base32 characters",
    ),
    (
        "aws-secret-access-key",
        "AWS secret access key: 40 base64 characters next to `secret` or an access key id",
    ),
    (
        "aws-bedrock-api-key",
        "Amazon Bedrock long-lived API key (ABSK...)",
    ),
    (
        "google-api-key",
        "Google (GCP, Gemini, Firebase) API key (AIza...)",
    ),
    (
        "google-oauth-client-secret",
        "Google OAuth client secret (GOCSPX-...)",
    ),
    (
        "google-oauth-access-token",
        "Google OAuth access token (ya29....)",
    ),
    (
        "azure-storage-connection-string",
        "Azure Storage connection string with an AccountKey",
    ),
    (
        "azure-shared-access-key",
        "Azure Service Bus / Event Hubs / IoT SharedAccessKey",
    ),
    (
        "azure-sas-token",
        "Azure shared access signature (sv=...&sig=...)",
    ),
    (
        "azure-ad-client-secret",
        "Microsoft Entra ID (Azure AD) client secret (...Q~...)",
    ),
    (
        "alibaba-access-key-id",
        "Alibaba Cloud AccessKey id (LTAI...)",
    ),
    (
        "digitalocean-token",
        "DigitalOcean personal, OAuth and refresh tokens (dop_v1_, doo_v1_, dor_v1_)",
    ),
    (
        "doppler-token",
        "Doppler personal, service, service-account, CLI, SCIM and audit tokens (dp.pt., dp.st., ...)",
    ),
    (
        "grafana-token",
        "Grafana Cloud tokens, service-account tokens and API keys (glc_, glsa_, eyJrIjoi...)",
    ),
    (
        "hashicorp-vault-token",
        "HashiCorp Vault service, batch and recovery tokens (hvs., hvb., hvr.)",
    ),
    (
        "terraform-cloud-token",
        "HCP Terraform / Terraform Cloud API token (....atlasv1....)",
    ),
    ("pulumi-token", "Pulumi access token (pul-...)"),
    (
        "planetscale-token",
        "PlanetScale service token, password and OAuth token (pscale_tkn_, pscale_pw_, pscale_oauth_)",
    ),
    (
        "supabase-token",
        "Supabase access token and secret key (sbp_, sb_secret_)",
    ),
    (
        "vercel-token",
        "Vercel access, integration and app tokens (vcp_, vci_, vca_, vcr_, vck_)",
    ),
    (
        "netlify-token",
        "Netlify personal access and OAuth tokens (nfp_, nfo_, nfc_, nfu_)",
    ),
    (
        "cloudflare-origin-ca-key",
        "Cloudflare Origin CA key (v1.0-...)",
    ),
    (
        "flyio-token",
        "Fly.io access tokens and macaroons (fo1_, fm1a_, fm1r_, fm2_)",
    ),
    ("heroku-api-key", "Heroku API key (HRKU-AA...)"),
    (
        "databricks-token",
        "Databricks personal access token (dapi...)",
    ),
    (
        "github-token",
        "GitHub classic, OAuth, app and refresh tokens (ghp_, gho_, ghu_, ghs_, ghr_; CRC32 checked)",
    ),
    (
        "github-fine-grained-token",
        "GitHub fine-grained personal access token (github_pat_...)",
    ),
    (
        "gitlab-token",
        "GitLab personal, deploy, runner, trigger, feed, CI job, OAuth, SCIM, agent and mail tokens (glpat-, gldt-, glrt-, ...)",
    ),
    ("npm-token", "npm access token (npm_...)"),
    ("pypi-token", "PyPI upload token (pypi-AgE...)"),
    (
        "dockerhub-token",
        "Docker Hub personal and organisation access tokens (dckr_pat_, dckr_oat_)",
    ),
    (
        "huggingface-token",
        "Hugging Face user and organisation tokens (hf_, api_org_)",
    ),
    (
        "package-registry-token",
        "Clojars, RubyGems, Prefect and ReadMe tokens (CLOJARS_, rubygems_, pnu_, rdme_)",
    ),
    (
        "artifactory-token",
        "JFrog Artifactory API key and reference token (AKCp..., cmVmd...)",
    ),
    ("sourcegraph-token", "Sourcegraph access token (sgp_...)"),
    (
        "sonarqube-token",
        "SonarQube user, project and analysis tokens (squ_, sqp_, sqa_)",
    ),
    (
        "atlassian-api-token",
        "Atlassian (Jira, Confluence, Bitbucket) API token (ATATT3..., ATCTT3...)",
    ),
    (
        "linear-api-key",
        "Linear API key and OAuth token (lin_api_, lin_oauth_)",
    ),
    (
        "notion-token",
        "Notion integration token (ntn_..., secret_...)",
    ),
    ("airtable-token", "Airtable personal access token (pat....)"),
    (
        "asana-token",
        "Asana personal access token (1/... or 2/.../...:hex)",
    ),
    ("postman-api-key", "Postman API key (PMAK-...)"),
    (
        "sentry-token",
        "Sentry user and organisation auth tokens (sntryu_, sntrys_)",
    ),
    (
        "new-relic-key",
        "New Relic user, admin, insert and browser keys (NRAK-, NRAA-, NRII-, NRJS-)",
    ),
    ("dynatrace-token", "Dynatrace API token (dt0c01....)"),
    (
        "contentful-token",
        "Contentful personal access token (CFPAT-...)",
    ),
    (
        "intercom-token",
        "Intercom access token (base64 of tok:...)",
    ),
    (
        "onepassword-secret",
        "1Password account secret key and service account token (A3-..., ops_eyJ...)",
    ),
    (
        "slack-token",
        "Slack bot, user, app, workspace, config and refresh tokens (xoxb-, xoxp-, xapp-, ...)",
    ),
    (
        "slack-webhook-url",
        "Slack incoming webhook and workflow URL (hooks.slack.com/...)",
    ),
    (
        "teams-webhook-url",
        "Microsoft Teams incoming webhook URL (....webhook.office.com/webhookb2/...)",
    ),
    (
        "discord-bot-token",
        "Discord bot token near the word discord (the user id in it is decoded)",
    ),
    (
        "discord-webhook-url",
        "Discord webhook URL (discord.com/api/webhooks/...)",
    ),
    ("telegram-bot-token", "Telegram bot token (<bot id>:AA...)"),
    (
        "twilio-api-key",
        "Twilio API key sid near the word twilio (SK + 32 hex)",
    ),
    (
        "twilio-auth-token",
        "Twilio auth token written after its account sid (AC... then 32 hex)",
    ),
    ("sendgrid-api-key", "SendGrid API key (SG....)"),
    (
        "brevo-api-key",
        "Brevo (Sendinblue) API and SMTP keys (xkeysib-, xsmtpsib-)",
    ),
    (
        "mailgun-api-key",
        "Mailgun API and signing keys (key-..., hex near mailgun)",
    ),
    ("mailchimp-api-key", "Mailchimp API key (32 hex -usN)"),
    (
        "stripe-secret-key",
        "Stripe secret key (sk_live_, sk_test_)",
    ),
    (
        "stripe-restricted-key",
        "Stripe restricted key (rk_live_, rk_test_)",
    ),
    (
        "stripe-webhook-secret",
        "Stripe webhook signing secret (whsec_...)",
    ),
    (
        "square-token",
        "Square access token and OAuth secret (EAAA..., sq0atp-, sq0csp-)",
    ),
    (
        "braintree-access-token",
        "Braintree / PayPal access token (access_token$production$...)",
    ),
    ("adyen-api-key", "Adyen API key (AQE...-...)"),
    (
        "shopify-token",
        "Shopify access tokens and shared secret (shpat_, shpca_, shppa_, shpss_)",
    ),
    (
        "dropbox-token",
        "Dropbox short-lived and long-lived access tokens (sl...., ...AAAAAAAAAA...)",
    ),
    (
        "mapbox-secret-token",
        "Mapbox secret and temporary tokens (sk.eyJ..., tk.eyJ...)",
    ),
    (
        "easypost-api-key",
        "EasyPost production and test API keys (EZAK, EZTK)",
    ),
    (
        "saas-api-token",
        "Shippo, Typeform, Frame.io, Duffel, Infracost, Scalingo, SettleMint, Adobe and Flutterwave tokens",
    ),
    (
        "docker-swarm-token",
        "Docker swarm join tokens (SWMTKN-1-...)",
    ),
    ("maxmind-license-key", "MaxMind license keys (..._mmk)"),
    ("nostr-secret-key", "Nostr secret keys (nsec1...)"),
    (
        "paseto-token",
        "PASETO tokens (v1-v4, local and public: v4.local....)",
    ),
    ("fernet-token", "Fernet tokens (gAAAAAB...)"),
    (
        "facebook-access-token",
        "Facebook / Meta access token (EAAC..., EAAM..., EAAG...)",
    ),
    (
        "twitter-bearer-token",
        "X (Twitter) app bearer token (AAAA...)",
    ),
    (
        "yandex-token",
        "Yandex Cloud API key and IAM token (AQVN..., t1....)",
    ),
    ("openshift-token", "OpenShift user token (sha256~...)"),
    (
        "anthropic-api-key",
        "Anthropic API and admin keys (sk-ant-...)",
    ),
    (
        "openai-api-key",
        "OpenAI project, service-account, admin and legacy keys (sk-proj-, sk-svcacct-, sk-...)",
    ),
    ("openrouter-api-key", "OpenRouter API key (sk-or-v1-...)"),
    ("groq-api-key", "Groq API key (gsk_...)"),
    ("xai-api-key", "xAI API key (xai-...)"),
    ("perplexity-api-key", "Perplexity API key (pplx-...)"),
    ("replicate-api-token", "Replicate API token (r8_...)"),
    (
        "langsmith-api-key",
        "LangSmith API key (lsv2_pt_, lsv2_sk_)",
    ),
    ("langfuse-secret-key", "Langfuse secret key (sk-lf-...)"),
    ("nvidia-api-key", "NVIDIA API key (nvapi-...)"),
    ("elevenlabs-api-key", "ElevenLabs API key (sk_ + 48 hex)"),
    (
        "ai-api-key",
        "Together, Fireworks, Pinecone, Cerebras, Anyscale and Voyage AI keys (tgp_v1_, fw_, pcsk_, csk-, esecret_, pa-)",
    ),
    (
        "private-key",
        "Private key blocks of every PEM kind, PGP, OpenSSH, SSH2 and PuTTY, also in JSON and base64",
    ),
    ("jwt", "JSON Web Token with its signature (eyJ...)"),
    (
        "age-secret-key",
        "age secret key (AGE-SECRET-KEY-1...; bech32 checked)",
    ),
    (
        "url-credentials",
        "Password in a URL or connection string (postgres, mysql, mongodb, redis, amqp, ...://user:PASSWORD@host)",
    ),
    (
        "password-assignment",
        "Password in an assignment, config line, connection string, credential file, command-line flag or sentence",
    ),
    (
        "password-hash",
        "Password hash in an .htpasswd or shadow line (bcrypt, apr1, sha-crypt)",
    ),
    (
        "secret-assignment",
        "Secret, API key, token or Authorization header value in an assignment, header or sentence (a UUID too, after a Heroku, HubSpot or Snyk key name or a name that says secret, token or API key)",
    ),
    (
        "session-cookie",
        "Session cookie value (PHPSESSID, connect.sid, JSESSIONID, sessionid, *_session, .AspNetCore.*, next-auth session-token)",
    ),
    (
        "basic-auth-credentials",
        "Base64 credentials: user:password (HTTP Basic, npm _auth, a Docker auth), a .dockerconfigjson, or a database URL with its password",
    ),
    (
        "seed-phrase",
        "Wallet seed phrase: 12 to 24 BIP-0039 words after seed, mnemonic or recovery phrase",
    ),
    (
        "recovery-codes",
        "Two-factor recovery (backup) codes listed after recovery codes or backup codes",
    ),
    (
        "network-device-secret",
        "Network device and VPN secrets: Cisco enable/username secrets, type 7 passwords and keys, SNMP communities and v3 keys, OSPF and TACACS/RADIUS keys, IKE and IPsec PSKs, Juniper $9$, Wi-Fi QR codes, WireGuard keys",
    ),
    (
        "totp-seed",
        "TOTP / 2FA seed: secret= of an otpauth:// URI, or base32 next to a TOTP, 2FA or MFA keyword",
    ),
    (
        "tailscale-key",
        "Tailscale auth, API, OAuth client, SCIM and webhook keys (tskey-...)",
    ),
    ("nuget-api-key", "NuGet API key (oy2...)"),
    ("crates-io-token", "crates.io API token (cio...)"),
    (
        "circleci-token",
        "CircleCI personal and project API tokens (CCIPAT_, CCIPRJ_)",
    ),
    ("bitbucket-app-password", "Bitbucket app password (ATBB...)"),
    (
        "atlassian-token",
        "Atlassian API and Trello tokens (ATTA..., ATCTT3xFfGN0...)",
    ),
    (
        "figma-token",
        "Figma personal and OAuth tokens (figd_, figu_)",
    ),
    (
        "hubspot-token",
        "HubSpot private app token (pat-na1-..., pat-eu1-...)",
    ),
    ("plaid-token", "Plaid access token (access-production-...)"),
    (
        "google-refresh-token",
        "Google OAuth refresh token (1//0...)",
    ),
    (
        "fcm-server-key",
        "Firebase Cloud Messaging legacy server key (AAAA...:APA91b...)",
    ),
    (
        "bip32-private-key",
        "BIP32 extended private key (xprv..., tprv...)",
    ),
    ("buildkite-token", "Buildkite user API token (bkua_...)"),
    (
        "salesforce-session",
        "Salesforce session or access token (00D...!...)",
    ),
    ("octopus-api-key", "Octopus Deploy API key (API-...)"),
    (
        "harness-token",
        "Harness personal and service account tokens (pat., sat.)",
    ),
    ("neon-api-key", "Neon API key (napi_...)"),
    ("render-api-key", "Render API key (rnd_...)"),
    ("runpod-api-key", "RunPod API key (rpa_...)"),
    (
        "honeycomb-api-key",
        "Honeycomb ingest API keys (hcaik_, hcxik_)",
    ),
    ("resend-api-key", "Resend API key (re_..._...)"),
    ("clickup-token", "ClickUp personal API token (pk_..._...)"),
    ("tencent-secret-id", "Tencent Cloud SecretId (AKID...)"),
    (
        "django-secret-key",
        "Django generated SECRET_KEY (django-insecure-...)",
    ),
    (
        "chat-webhook",
        "Feishu/Lark, WeCom, IFTTT, Webex and Make (Integromat) webhook URLs",
    ),
    (
        "zapier-webhook",
        "Zapier catch hook URL (hooks.zapier.com/hooks/catch/...)",
    ),
    (
        "mattermost-webhook",
        "Mattermost incoming webhook URL (/hooks/ and a 26-character id)",
    ),
    (
        "credit-card",
        "Payment card number (network prefix and length, Luhn checked)",
    ),
    (
        "us-ssn",
        "US Social Security number (valid ranges; dashed, or bare next to SSN)",
    ),
    (
        "iban",
        "IBAN, compact or in groups of four (registered length, mod-97 checked)",
    ),
];

/// The built-in rule ids, in listing order.
pub(crate) fn ids() -> Vec<&'static str> {
    RULES.iter().map(|(id, _)| *id).collect()
}
