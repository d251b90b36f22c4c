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
    github_checksum_ok, is_hex, random_suffix,
};
use super::{assign, blocks, digits};

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
    *skip = j;
    let pe = at?;
    let host_ok = b.get(pe + 1).is_some_and(|&c| !stop(c) && c != b'@');
    let v = &b[ps..pe];
    if !host_ok || v.is_empty() {
        return None;
    }
    let template = matches!(v[0], b'$' | b'{' | b'<' | b'%');
    let port_like = v.len() <= 5 && v.iter().all(u8::is_ascii_digit);
    (!template && !port_like && !super::checks::is_placeholder(v)).then_some((ps, pe))
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
        anchors: &["AKIA", "ASIA"],
        how: token(
            "(?:AKIA|ASIA)[A-Z0-9]{16}",
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
        how: How::Re(ReSpec {
            re: r"(?i:secret)[^\n]{0,40}?[^A-Za-z0-9/+\n]([A-Za-z0-9/+]{40})",
            back: 1,
            fwd: 100,
            group: 1,
            check_group: 1,
            left: Edge::B64Body,
            right: Edge::B64,
            check: aws_secret,
        }),
    },
    Spec {
        id: "aws-secret-access-key",
        prio: 2,
        anchors: &["AKIA", "ASIA"],
        how: How::Re(ReSpec {
            re: r"(?:AKIA|ASIA)[A-Z0-9]{16}[^A-Za-z0-9/+]{1,12}([A-Za-z0-9/+]{40})",
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
            re: r#"(?:(?:DefaultEndpointsProtocol|AccountName|BlobEndpoint|QueueEndpoint|TableEndpoint|FileEndpoint|EndpointSuffix)=[^;\s"'<>]{0,200};[ \t]*)*AccountKey=([A-Za-z0-9+/]{40,100}={0,2})(?:;[ \t]*(?:EndpointSuffix|BlobEndpoint|QueueEndpoint|TableEndpoint|FileEndpoint|SharedAccessSignature)=[^;\s"'<>]{0,300})*;?"#,
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
            re: r#"(?:(?:Endpoint|HostName)=[^;\s"'<>]{1,200};[ \t]*)?(?:SharedAccessKeyName=[^;\s"'<>]{1,100};[ \t]*)?SharedAccessKey=([A-Za-z0-9+/]{40,60}={0,2})(?:;[ \t]*EntityPath=[^;\s"'<>]{0,200})?"#,
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
            re: r#"(?:(?:sv|ss|srt|sp|se|st|spr|sip|sr|si|sdd|skoid|sktid|skt|ske|sks|skv|saoid|suoid|scid|rscc|rscd|rsce|rscl|rsct|ses)=[^&\s"'<>]{0,200}&(?:amp;)?)+sig=[A-Za-z0-9%+/=]{20,200}(?:&(?:amp;)?[a-z]{1,20}=[^&\s"'<>]{0,200})*"#,
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
        anchors: &["xox"],
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
            re: "[0-9]{6,12}:AA[A-Za-z0-9_-]{31,38}",
            back: 12,
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
        anchors: &["key"],
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
        anchors: &["k_live_", "k_test_"],
        how: How::Re(ReSpec {
            re: "sk_(?:live|test)_[0-9A-Za-z]{10,247}",
            back: 1,
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
        anchors: &["k_live_", "k_test_"],
        how: How::Re(ReSpec {
            re: "rk_(?:live|test)_[0-9A-Za-z]{10,247}",
            back: 1,
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
        anchors: &["shp"],
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
        anchors: &["pass", "PASS", "assw", "ASSW", "pwd", "Pwd", "PWD"],
        how: How::Hit(assign::password),
    },
    Spec {
        id: "password-assignment",
        prio: 1,
        anchors: &["mysql", "curl"],
        how: How::Hit(assign::command_line),
    },
    Spec {
        id: "secret-assignment",
        prio: 1,
        anchors: SECRET_WORDS,
        how: How::Hit(assign::secret),
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
];

/// The built-in rule ids, each once, in table order.
pub(crate) fn ids() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for s in SPECS {
        if !out.contains(&s.id) {
            out.push(s.id);
        }
    }
    out
}
