//! A held-out evaluation of the filter: secrets generated from each
//! family's public format (prefix, alphabet, length, checksum) with a
//! seeded generator, embedded in the places people write them (prose,
//! `.env`, YAML, JSON, TOML, shell, code), beside look-alikes that must be
//! left alone. Written apart from the rules and from `tests.rs`: nothing
//! here is a string a rule was tuned on.
//!
//! A secret counts as removed when no 12-character piece of it (the whole
//! secret if shorter) is left in the output; a look-alike counts as
//! touched when its text changes at all.
//!
//! Run: `cargo test --lib redact::eval -- --nocapture` prints recall and
//! false positives per family.

use super::{RedactConfig, Redactor};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
    /// `n` characters of `alphabet`.
    fn s(&mut self, alphabet: &str, n: usize) -> String {
        let a = alphabet.as_bytes();
        (0..n).map(|_| a[self.below(a.len())] as char).collect()
    }
    fn digits(&mut self, n: usize) -> String {
        self.s(D, n)
    }
}

const D: &str = "0123456789";
const HEXL: &str = "0123456789abcdef";
const HEXU: &str = "0123456789ABCDEF";
const AN: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
const LOWER_AN: &str = "abcdefghijklmnopqrstuvwxyz0123456789";
const UPPER_AN: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
const B64: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const B64URL: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
const BASE32: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

use super::tests::b64_encode as b64;

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                0xEDB8_8320 ^ (crc >> 1)
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn base62(mut v: u32, n: usize) -> String {
    let a = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut out = vec![b'0'; n];
    for slot in out.iter_mut().rev() {
        *slot = a[(v % 62) as usize];
        v /= 62;
    }
    String::from_utf8(out).unwrap_or_default()
}

fn luhn_complete(prefix: &str, len: usize, rng: &mut Rng) -> String {
    let mut s = prefix.to_owned();
    s.push_str(&rng.digits(len - prefix.len() - 1));
    for d in 0..10 {
        let cand = format!("{s}{d}");
        let sum: u32 = cand
            .bytes()
            .rev()
            .enumerate()
            .map(|(i, c)| {
                let mut v = u32::from(c - b'0');
                if i % 2 == 1 {
                    v *= 2;
                    if v > 9 {
                        v -= 9;
                    }
                }
                v
            })
            .sum();
        if sum.is_multiple_of(10) {
            return cand;
        }
    }
    unreachable!()
}

fn iban(country: &str, bban: &str) -> String {
    let rearranged = format!("{bban}{country}00");
    let mut rem = 0u64;
    for c in rearranged.bytes() {
        if c.is_ascii_digit() {
            rem = (rem * 10 + u64::from(c - b'0')) % 97;
        } else {
            rem = (rem * 100 + u64::from(c - b'A') + 10) % 97;
        }
    }
    format!("{country}{:02}{bban}", 98 - rem)
}

// ---------------------------------------------------------------- secret families

/// How a family's secret may be written.
#[derive(Clone, Copy, PartialEq)]
enum Ctx {
    /// A vendor token with a fixed prefix: any context, prose without a
    /// key name included.
    Prefixed,
    /// A token with no prefix: only next to a key name that says what it is.
    Named,
    /// The generator writes the whole line itself.
    Own,
}

struct Family {
    name: &'static str,
    /// Env-style key names for the secret.
    keys: &'static [&'static str],
    /// How a person names it in prose.
    vendor: &'static str,
    ctx: Ctx,
    /// Returns (text to embed, the secret inside it).
    make: fn(&mut Rng) -> (String, String),
}

fn tok(s: String) -> (String, String) {
    (s.clone(), s)
}

fn github_classic(rng: &mut Rng, prefix: &str) -> String {
    let body = rng.s(AN, 30);
    let c = base62(crc32(body.as_bytes()), 6);
    format!("{prefix}{body}{c}")
}

fn pw(rng: &mut Rng) -> String {
    // A chosen password: a word, digits, a symbol, mixed case.
    let words = [
        "Sunset", "tiger", "Maple", "orange", "Falcon", "river", "Winter", "copper", "Delta",
        "violet",
    ];
    let sym = ["!", "#", "$", "%", "&", "*", "@", "-", "_", "+"];
    match rng.below(3) {
        0 => format!(
            "{}{}{}",
            words[rng.below(words.len())],
            {
                let n = 2 + rng.below(3);
                rng.digits(n)
            },
            sym[rng.below(sym.len())]
        ),
        1 => format!(
            "{}{}{}{}",
            rng.s(AN, 4),
            sym[rng.below(sym.len())],
            rng.s(AN, 5),
            rng.digits(2)
        ),
        _ => {
            let n = 12 + rng.below(8);
            rng.s(AN, n)
        }
    }
}

const FAMILIES: &[Family] = &[
    Family {
        name: "aws-access-key-id",
        keys: &["AWS_ACCESS_KEY_ID"],
        vendor: "AWS",
        ctx: Ctx::Prefixed,
        make: |r| tok(format!("AKIA{}", r.s(BASE32, 16))),
    },
    Family {
        name: "aws-secret-access-key",
        keys: &["AWS_SECRET_ACCESS_KEY", "aws_secret_access_key"],
        vendor: "AWS secret",
        ctx: Ctx::Named,
        make: |r| tok(r.s(B64, 40)),
    },
    Family {
        name: "github-classic",
        keys: &["GITHUB_TOKEN", "GH_TOKEN"],
        vendor: "GitHub",
        ctx: Ctx::Prefixed,
        make: |r| {
            let p = r.pick(&["ghp_", "gho_", "ghs_", "ghu_"]);
            tok(github_classic(r, p))
        },
    },
    Family {
        name: "github-fine-grained",
        keys: &["GITHUB_PAT"],
        vendor: "GitHub",
        ctx: Ctx::Prefixed,
        make: |r| {
            tok(format!(
                "github_pat_11{}_{}",
                r.s(UPPER_AN, 20),
                r.s(AN, 59)
            ))
        },
    },
    Family {
        name: "gitlab",
        keys: &["GITLAB_TOKEN", "CI_JOB_TOKEN"],
        vendor: "GitLab",
        ctx: Ctx::Prefixed,
        make: |r| tok(format!("glpat-{}", r.s(B64URL, 20))),
    },
    Family {
        name: "slack",
        keys: &["SLACK_BOT_TOKEN"],
        vendor: "Slack",
        ctx: Ctx::Prefixed,
        make: |r| {
            tok(format!(
                "xoxb-{}-{}-{}",
                r.digits(12),
                r.digits(13),
                r.s(AN, 24)
            ))
        },
    },
    Family {
        name: "slack-webhook",
        keys: &["SLACK_WEBHOOK_URL"],
        vendor: "Slack webhook",
        ctx: Ctx::Prefixed,
        make: |r| {
            tok(format!(
                "https://hooks.slack.com/services/T{}/B{}/{}",
                r.s(UPPER_AN, 8),
                r.s(UPPER_AN, 10),
                r.s(AN, 24)
            ))
        },
    },
    Family {
        name: "stripe",
        keys: &["STRIPE_SECRET_KEY"],
        vendor: "Stripe",
        ctx: Ctx::Prefixed,
        make: |r| {
            let p = r.pick(&["sk_live_", "rk_live_", "sk_test_"]);
            tok(format!("{p}{}", r.s(AN, 99)))
        },
    },
    Family {
        name: "google-api-key",
        keys: &["GOOGLE_API_KEY", "GEMINI_API_KEY"],
        vendor: "Google",
        ctx: Ctx::Prefixed,
        make: |r| tok(format!("AIza{}", r.s(B64URL, 35))),
    },
    Family {
        name: "openai",
        keys: &["OPENAI_API_KEY"],
        vendor: "OpenAI",
        ctx: Ctx::Prefixed,
        make: |r| {
            tok(format!(
                "sk-proj-{}T3BlbkFJ{}",
                r.s(B64URL, 74),
                r.s(B64URL, 74)
            ))
        },
    },
    Family {
        name: "anthropic",
        keys: &["ANTHROPIC_API_KEY"],
        vendor: "Anthropic",
        ctx: Ctx::Prefixed,
        make: |r| tok(format!("sk-ant-api03-{}AA", r.s(B64URL, 93))),
    },
    Family {
        name: "jwt",
        keys: &["ACCESS_TOKEN", "id_token"],
        vendor: "session",
        ctx: Ctx::Prefixed,
        make: |r| {
            let h = b64(br#"{"alg":"RS256","typ":"JWT","kid":"k1"}"#, B64URL, false);
            let p = format!(
                r#"{{"sub":"{}","iss":"https://auth.example.net","exp":{}}}"#,
                r.digits(8),
                r.digits(10)
            );
            tok(format!(
                "{h}.{}.{}",
                b64(p.as_bytes(), B64URL, false),
                r.s(B64URL, 86)
            ))
        },
    },
    Family {
        name: "private-key",
        keys: &["PRIVATE_KEY"],
        vendor: "deploy",
        ctx: Ctx::Own,
        make: |r| {
            let kind = r.pick(&[
                "RSA PRIVATE KEY",
                "PRIVATE KEY",
                "OPENSSH PRIVATE KEY",
                "EC PRIVATE KEY",
            ]);
            let body: Vec<String> = (0..6).map(|_| r.s(B64, 64)).collect();
            let body = body.join("\n");
            let text = format!(
                "Key for the bastion:\n-----BEGIN {kind}-----\n{body}\n-----END {kind}-----\n"
            );
            (text, body[..64].to_owned())
        },
    },
    Family {
        name: "digitalocean",
        keys: &["DIGITALOCEAN_TOKEN", "DO_API_TOKEN"],
        vendor: "DigitalOcean",
        ctx: Ctx::Prefixed,
        make: |r| {
            let p = r.pick(&["dop_v1_", "doo_v1_", "dor_v1_"]);
            tok(format!("{p}{}", r.s(HEXL, 64)))
        },
    },
    Family {
        name: "doppler",
        keys: &["DOPPLER_TOKEN"],
        vendor: "Doppler",
        ctx: Ctx::Prefixed,
        make: |r| {
            let p = r.pick(&["dp.pt.", "dp.st.prd.", "dp.sa.", "dp.ct."]);
            tok(format!("{p}{}", r.s(AN, 43)))
        },
    },
    Family {
        name: "grafana",
        keys: &["GRAFANA_TOKEN", "GRAFANA_API_KEY"],
        vendor: "Grafana",
        ctx: Ctx::Prefixed,
        make: |r| match r.below(3) {
            0 => tok(format!("glsa_{}_{}", r.s(AN, 32), r.s(HEXL, 8))),
            1 => {
                let j = format!(
                    r#"{{"o":"{}","n":"stack-{}-token","k":"{}","m":{{"r":"prod-us-east-0"}}}}"#,
                    r.digits(6),
                    r.digits(6),
                    r.s(AN, 24)
                );
                tok(format!("glc_{}", b64(j.as_bytes(), B64, true)))
            }
            _ => {
                let j = format!(r#"{{"k":"{}","n":"ci","id":{}}}"#, r.s(AN, 32), r.digits(1));
                tok(b64(j.as_bytes(), B64, true))
            }
        },
    },
    Family {
        name: "hashicorp-vault",
        keys: &["VAULT_TOKEN"],
        vendor: "Vault",
        ctx: Ctx::Prefixed,
        make: |r| match r.below(2) {
            0 => tok(format!("hvs.{}", r.s(B64URL, 91))),
            _ => tok(format!("hvb.{}", r.s(B64URL, 138))),
        },
    },
    Family {
        name: "terraform-cloud",
        keys: &["TFE_TOKEN", "TF_API_TOKEN"],
        vendor: "Terraform Cloud",
        ctx: Ctx::Prefixed,
        make: |r| tok(format!("{}.atlasv1.{}", r.s(AN, 14), r.s(AN, 67))),
    },
    Family {
        name: "linear",
        keys: &["LINEAR_API_KEY"],
        vendor: "Linear",
        ctx: Ctx::Prefixed,
        make: |r| tok(format!("lin_api_{}", r.s(AN, 40))),
    },
    Family {
        name: "atlassian",
        keys: &["JIRA_API_TOKEN", "ATLASSIAN_TOKEN"],
        vendor: "Jira",
        ctx: Ctx::Prefixed,
        make: |r| tok(format!("ATATT3xFfGF0{}={}", r.s(B64URL, 170), r.s(HEXU, 8))),
    },
    Family {
        name: "notion",
        keys: &["NOTION_TOKEN", "NOTION_API_KEY"],
        vendor: "Notion",
        ctx: Ctx::Prefixed,
        make: |r| match r.below(2) {
            0 => tok(format!("ntn_{}{}", r.digits(11), r.s(AN, 35))),
            _ => tok(format!("secret_{}", r.s(AN, 43))),
        },
    },
    Family {
        name: "airtable",
        keys: &["AIRTABLE_TOKEN"],
        vendor: "Airtable",
        ctx: Ctx::Prefixed,
        make: |r| tok(format!("pat{}.{}", r.s(AN, 14), r.s(HEXL, 64))),
    },
    Family {
        name: "postman",
        keys: &["POSTMAN_API_KEY"],
        vendor: "Postman",
        ctx: Ctx::Prefixed,
        make: |r| tok(format!("PMAK-{}-{}", r.s(HEXL, 24), r.s(HEXL, 34))),
    },
    Family {
        name: "sentry",
        keys: &["SENTRY_AUTH_TOKEN"],
        vendor: "Sentry",
        ctx: Ctx::Prefixed,
        make: |r| match r.below(2) {
            0 => tok(format!("sntryu_{}", r.s(HEXL, 64))),
            _ => {
                let j = format!(
                    r#"{{"iat":{}.0,"url":"https://sentry.io","region_url":"https://us.sentry.io","org":"acme-{}"}}"#,
                    r.digits(10),
                    r.digits(3)
                );
                tok(format!(
                    "sntrys_{}_{}",
                    b64(j.as_bytes(), B64, false),
                    r.s(B64, 43)
                ))
            }
        },
    },
    Family {
        name: "new-relic",
        keys: &["NEW_RELIC_API_KEY", "NEW_RELIC_LICENSE_KEY"],
        vendor: "New Relic",
        ctx: Ctx::Prefixed,
        make: |r| match r.below(2) {
            0 => tok(format!("NRAK-{}", r.s(UPPER_AN, 27))),
            _ => tok(format!("NRII-{}", r.s(B64URL, 32))),
        },
    },
    Family {
        name: "datadog",
        keys: &["DD_API_KEY", "DATADOG_APP_KEY"],
        vendor: "Datadog API key",
        ctx: Ctx::Named,
        make: |r| match r.below(2) {
            0 => tok(r.s(HEXL, 32)),
            _ => tok(r.s(HEXL, 40)),
        },
    },
    Family {
        name: "planetscale",
        keys: &["PLANETSCALE_TOKEN", "DATABASE_PASSWORD"],
        vendor: "PlanetScale",
        ctx: Ctx::Prefixed,
        make: |r| {
            let p = r.pick(&["pscale_tkn_", "pscale_pw_", "pscale_oauth_"]);
            tok(format!("{p}{}", r.s(B64URL, 43)))
        },
    },
    Family {
        name: "supabase",
        keys: &["SUPABASE_ACCESS_TOKEN", "SUPABASE_SECRET_KEY"],
        vendor: "Supabase",
        ctx: Ctx::Prefixed,
        make: |r| match r.below(2) {
            0 => tok(format!("sbp_{}", r.s(HEXL, 40))),
            _ => tok(format!("sb_secret_{}", r.s(B64URL, 31))),
        },
    },
    Family {
        name: "vercel",
        keys: &["VERCEL_TOKEN"],
        vendor: "Vercel token",
        ctx: Ctx::Named,
        make: |r| tok(r.s(AN, 24)),
    },
    Family {
        name: "netlify",
        keys: &["NETLIFY_AUTH_TOKEN"],
        vendor: "Netlify",
        ctx: Ctx::Prefixed,
        make: |r| tok(format!("nfp_{}", r.s(AN, 36))),
    },
    Family {
        name: "cloudflare",
        keys: &["CLOUDFLARE_API_TOKEN", "CF_API_KEY"],
        vendor: "Cloudflare API token",
        ctx: Ctx::Named,
        make: |r| match r.below(2) {
            0 => tok(r.s(B64URL, 40)),
            _ => tok(r.s(HEXL, 37)),
        },
    },
    Family {
        name: "cloudflare-origin-ca",
        keys: &["CF_ORIGIN_CA_KEY"],
        vendor: "Cloudflare",
        ctx: Ctx::Prefixed,
        make: |r| tok(format!("v1.0-{}-{}", r.s(HEXL, 24), r.s(HEXL, 146))),
    },
    Family {
        name: "flyio",
        keys: &["FLY_API_TOKEN"],
        vendor: "Fly.io",
        ctx: Ctx::Prefixed,
        make: |r| match r.below(2) {
            0 => tok(format!("FlyV1 fm2_{}", r.s(B64, 120))),
            _ => tok(format!("fo1_{}", r.s(B64URL, 43))),
        },
    },
    Family {
        name: "heroku",
        keys: &["HEROKU_API_KEY"],
        vendor: "Heroku",
        ctx: Ctx::Prefixed,
        make: |r| tok(format!("HRKU-AA{}", r.s(B64URL, 58))),
    },
    Family {
        name: "heroku-legacy",
        keys: &["HEROKU_API_KEY"],
        vendor: "Heroku API key",
        ctx: Ctx::Named,
        make: |r| {
            tok(format!(
                "{}-{}-4{}-a{}-{}",
                r.s(HEXL, 8),
                r.s(HEXL, 4),
                r.s(HEXL, 3),
                r.s(HEXL, 3),
                r.s(HEXL, 12)
            ))
        },
    },
    Family {
        name: "pulumi",
        keys: &["PULUMI_ACCESS_TOKEN"],
        vendor: "Pulumi",
        ctx: Ctx::Prefixed,
        make: |r| tok(format!("pul-{}", r.s(HEXL, 40))),
    },
    Family {
        name: "okta",
        keys: &["OKTA_API_TOKEN", "OKTA_CLIENT_TOKEN"],
        vendor: "Okta API token",
        ctx: Ctx::Named,
        make: |r| tok(format!("00{}", r.s(B64URL, 40))),
    },
    Family {
        name: "square",
        keys: &["SQUARE_ACCESS_TOKEN"],
        vendor: "Square",
        ctx: Ctx::Prefixed,
        make: |r| match r.below(2) {
            0 => tok(format!("EAAA{}", r.s(B64URL, 60))),
            _ => tok(format!("sq0csp-{}", r.s(B64URL, 43))),
        },
    },
    Family {
        name: "braintree",
        keys: &["BRAINTREE_ACCESS_TOKEN"],
        vendor: "Braintree",
        ctx: Ctx::Prefixed,
        make: |r| {
            tok(format!(
                "access_token$production${}${}",
                r.s(LOWER_AN, 16),
                r.s(HEXL, 32)
            ))
        },
    },
    Family {
        name: "paypal",
        keys: &["PAYPAL_CLIENT_SECRET"],
        vendor: "PayPal client secret",
        ctx: Ctx::Named,
        make: |r| tok(format!("E{}", r.s(B64URL, 79))),
    },
    Family {
        name: "adyen",
        keys: &["ADYEN_API_KEY"],
        vendor: "Adyen",
        ctx: Ctx::Prefixed,
        make: |r| {
            tok(format!(
                "AQE{}{}==-{}{}=-{}",
                r.s("hijklmn", 1),
                r.s(B64, 90),
                r.s(B64, 40),
                r.s(AN, 3),
                r.s(AN, 12)
            ))
        },
    },
    Family {
        name: "dropbox",
        keys: &["DROPBOX_ACCESS_TOKEN"],
        vendor: "Dropbox",
        ctx: Ctx::Prefixed,
        make: |r| tok(format!("sl.{}", r.s(B64URL, 136))),
    },
    Family {
        name: "asana",
        keys: &["ASANA_PAT", "ASANA_ACCESS_TOKEN"],
        vendor: "Asana",
        ctx: Ctx::Prefixed,
        make: |r| {
            tok(format!(
                "2/{}/{}:{}",
                r.digits(16),
                r.digits(16),
                r.s(HEXL, 32)
            ))
        },
    },
    Family {
        name: "mapbox",
        keys: &["MAPBOX_SECRET_TOKEN"],
        vendor: "Mapbox",
        ctx: Ctx::Prefixed,
        make: |r| {
            let j = format!(
                r#"{{"u":"acme{}","a":"{}"}}"#,
                r.digits(2),
                r.s(LOWER_AN, 25)
            );
            tok(format!(
                "sk.{}.{}",
                b64(j.as_bytes(), B64URL, false),
                r.s(B64URL, 22)
            ))
        },
    },
    Family {
        name: "algolia",
        keys: &["ALGOLIA_ADMIN_KEY", "ALGOLIA_API_KEY"],
        vendor: "Algolia admin key",
        ctx: Ctx::Named,
        make: |r| tok(r.s(HEXL, 32)),
    },
    Family {
        name: "contentful",
        keys: &["CONTENTFUL_MANAGEMENT_TOKEN"],
        vendor: "Contentful",
        ctx: Ctx::Prefixed,
        make: |r| tok(format!("CFPAT-{}", r.s(B64URL, 43))),
    },
    Family {
        name: "intercom",
        keys: &["INTERCOM_ACCESS_TOKEN"],
        vendor: "Intercom",
        ctx: Ctx::Prefixed,
        make: |r| {
            let inner = format!("tok:{}-{}-{}", r.s(HEXL, 8), r.s(HEXL, 4), r.s(HEXL, 24));
            tok(b64(inner.as_bytes(), B64, true))
        },
    },
    Family {
        name: "zendesk",
        keys: &["ZENDESK_API_TOKEN"],
        vendor: "Zendesk API token",
        ctx: Ctx::Named,
        make: |r| tok(r.s(AN, 40)),
    },
    Family {
        name: "twitch",
        keys: &["TWITCH_CLIENT_SECRET", "TWITCH_OAUTH_TOKEN"],
        vendor: "Twitch client secret",
        ctx: Ctx::Named,
        make: |r| tok(r.s(LOWER_AN, 30)),
    },
    Family {
        name: "discord-bot",
        keys: &["DISCORD_BOT_TOKEN"],
        vendor: "Discord bot",
        ctx: Ctx::Named,
        make: |r| {
            let id = format!("{}{}", 1 + r.below(9), r.digits(17));
            tok(format!(
                "{}.{}.{}",
                b64(id.as_bytes(), B64URL, false),
                r.s(B64URL, 6),
                r.s(B64URL, 38)
            ))
        },
    },
    Family {
        name: "discord-webhook",
        keys: &["DISCORD_WEBHOOK"],
        vendor: "Discord webhook",
        ctx: Ctx::Prefixed,
        make: |r| {
            tok(format!(
                "https://discord.com/api/webhooks/{}/{}",
                r.digits(18),
                r.s(B64URL, 68)
            ))
        },
    },
    Family {
        name: "twilio",
        keys: &["TWILIO_API_KEY", "TWILIO_AUTH_TOKEN"],
        vendor: "Twilio",
        ctx: Ctx::Own,
        make: |r| match r.below(3) {
            0 => {
                let s = r.s(HEXL, 32);
                (
                    format!(
                        "TWILIO_ACCOUNT_SID=AC{}\nTWILIO_AUTH_TOKEN={s}\n",
                        r.s(HEXL, 32)
                    ),
                    s,
                )
            }
            1 => {
                let s = r.s(HEXL, 32);
                (
                    format!(
                        "client = Client(\"AC{}\", \"{s}\")  # twilio\n",
                        r.s(HEXL, 32)
                    ),
                    s,
                )
            }
            _ => {
                let s = format!("SK{}", r.s(HEXL, 32));
                (format!("Twilio API key {s} (sid)\n"), s)
            }
        },
    },
    Family {
        name: "sendgrid",
        keys: &["SENDGRID_API_KEY"],
        vendor: "SendGrid",
        ctx: Ctx::Prefixed,
        make: |r| tok(format!("SG.{}.{}", r.s(B64URL, 22), r.s(B64URL, 43))),
    },
    Family {
        name: "huggingface",
        keys: &["HF_TOKEN"],
        vendor: "Hugging Face",
        ctx: Ctx::Prefixed,
        make: |r| {
            tok(format!(
                "hf_{}",
                r.s("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", 34)
            ))
        },
    },
    Family {
        name: "ai-vendors",
        keys: &["LLM_API_KEY", "MODEL_API_KEY"],
        vendor: "the model provider",
        ctx: Ctx::Prefixed,
        make: |r| match r.below(10) {
            0 => tok(format!("gsk_{}", r.s(AN, 52))),
            1 => tok(format!("xai-{}", r.s(AN, 80))),
            2 => tok(format!("pplx-{}", r.s(AN, 48))),
            3 => tok(format!("r8_{}", r.s(AN, 37))),
            4 => tok(format!("tgp_v1_{}", r.s(B64URL, 43))),
            5 => tok(format!("fw_{}", r.s(AN, 24))),
            6 => tok(format!("pcsk_{}_{}", r.s(AN, 6), r.s(AN, 63))),
            7 => tok(format!("csk-{}", r.s(LOWER_AN, 48))),
            8 => tok(format!("sk-or-v1-{}", r.s(HEXL, 64))),
            _ => tok(format!("nvapi-{}", r.s(B64URL, 64))),
        },
    },
    Family {
        name: "ai-vendors-named",
        keys: &[
            "COHERE_API_KEY",
            "MISTRAL_API_KEY",
            "ELEVENLABS_API_KEY",
            "DEEPSEEK_API_KEY",
        ],
        vendor: "model API key",
        ctx: Ctx::Named,
        make: |r| match r.below(4) {
            0 => tok(r.s(AN, 40)),
            1 => tok(r.s(AN, 32)),
            2 => tok(format!("sk_{}", r.s(HEXL, 48))),
            _ => tok(format!("sk-{}", r.s(HEXL, 32))),
        },
    },
    Family {
        name: "registries",
        keys: &["NPM_TOKEN", "PYPI_TOKEN", "DOCKER_TOKEN"],
        vendor: "registry",
        ctx: Ctx::Prefixed,
        make: |r| match r.below(4) {
            0 => tok(format!("npm_{}", r.s(AN, 36))),
            1 => tok(format!("pypi-AgEIcHlwaS5vcmc{}", r.s(B64URL, 70))),
            2 => tok(format!("dckr_pat_{}", r.s(B64URL, 27))),
            _ => tok(format!("rubygems_{}", r.s(HEXL, 48))),
        },
    },
    Family {
        name: "other-vendors",
        keys: &["SERVICE_TOKEN", "CI_TOKEN"],
        vendor: "the service",
        ctx: Ctx::Prefixed,
        make: |r| match r.below(12) {
            0 => tok(format!("dapi{}", r.s(HEXL, 32))),
            1 => tok(format!("shpat_{}", r.s(HEXL, 32))),
            2 => tok(format!("xkeysib-{}-{}", r.s(HEXL, 64), r.s(AN, 16))),
            3 => tok(format!(
                "dt0c01.{}.{}",
                r.s(UPPER_AN, 24),
                r.s(UPPER_AN, 64)
            )),
            4 => tok(format!("LTAI{}", r.s(AN, 20))),
            5 => tok(format!("sgp_{}_{}", r.s(HEXL, 16), r.s(HEXL, 40))),
            6 => tok(format!("glpat-{}", r.s(B64URL, 20))),
            7 => tok(format!("CLOJARS_{}", r.s(LOWER_AN, 60))),
            8 => tok(format!("pnu_{}", r.s(AN, 36))),
            9 => tok(format!("rdme_{}", r.s(LOWER_AN, 70))),
            10 => tok(format!("shippo_live_{}", r.s(HEXL, 40))),
            _ => tok(format!("AKCp{}", r.s(AN, 69))),
        },
    },
    // ------------------------------------------------------------ no prefix
    Family {
        name: "password-assignment",
        keys: &[
            "DB_PASSWORD",
            "password",
            "PassWord",
            "smtpPassword",
            "admin_pass",
        ],
        vendor: "database password",
        ctx: Ctx::Named,
        make: |r| tok(pw(r)),
    },
    Family {
        name: "password-prose",
        keys: &[],
        vendor: "",
        ctx: Ctx::Own,
        make: |r| {
            let p = pw(r);
            let t = match r.below(5) {
                0 => format!("The password for the staging DB is {p} (rotate in May).\n"),
                1 => format!("Wi-Fi password: {p}\n"),
                2 => format!("Note to self: the root password is now {p}.\n"),
                3 => format!("Use {p} as the password for the admin account.\n"),
                _ => format!("Login for Grafana: admin / password {p}\n"),
            };
            (t, p)
        },
    },
    Family {
        name: "credential-files",
        keys: &[],
        vendor: "",
        ctx: Ctx::Own,
        make: |r| {
            let p = pw(r);
            let t = match r.below(5) {
                0 => format!("# ~/.pgpass\ndb.internal:5432:app:app_user:{p}\n"),
                1 => format!("machine api.example.com login deploy password {p}\n"),
                2 => format!("[client]\nuser=root\npassword={p}\nhost=127.0.0.1\n"),
                3 => {
                    let h = format!("$apr1${}${}", r.s(AN, 8), r.s(AN, 22));
                    return (format!("# .htpasswd\nadmin:{h}\n"), h);
                }
                _ => {
                    let h = format!("$2y$10${}", r.s(AN, 53));
                    return (format!("ops:{h}\n"), h);
                }
            };
            (t, p)
        },
    },
    Family {
        name: "password-flags",
        keys: &[],
        vendor: "",
        ctx: Ctx::Own,
        make: |r| {
            let p = pw(r);
            let t = match r.below(5) {
                0 => format!("$ mysql -h db -u root -p{p} app\n"),
                1 => format!("sshpass -p '{p}' ssh admin@10.0.0.12\n"),
                2 => format!("pg_dump --password {p} -h db app > dump.sql\n"),
                3 => format!("docker login -u ci --password {p} registry.example.com\n"),
                _ => format!("mongosh --username admin -p {p} --host mongo\n"),
            };
            (t, p)
        },
    },
    Family {
        name: "authorization-headers",
        keys: &[],
        vendor: "",
        ctx: Ctx::Own,
        make: |r| match r.below(3) {
            0 => {
                let c = b64(format!("deploy:{}", pw(r)).as_bytes(), B64, true);
                (format!("Authorization: Basic {c}\n"), c)
            }
            1 => {
                let t = r.s(B64URL, 40);
                (
                    format!(
                        "curl -H \"Authorization: Bearer {t}\" https://api.example.com/v2/me\n"
                    ),
                    t,
                )
            }
            _ => {
                let t = r.s(AN, 32);
                (
                    format!("headers = {{\"authorization\": \"Bearer {t}\"}}\n"),
                    t,
                )
            }
        },
    },
    Family {
        name: "connection-strings",
        keys: &[],
        vendor: "",
        ctx: Ctx::Own,
        make: |r| {
            let p = pw(r).replace(['@', '#', '%', '+', '&', '$', '*', '!'], "x");
            let t = match r.below(9) {
                0 => format!("DATABASE_URL=postgres://app:{p}@db.internal:5432/app\n"),
                1 => format!("mysql://root:{p}@127.0.0.1:3306/shop\n"),
                2 => format!(
                    "MONGO_URI=\"mongodb://admin:{p}@mongo1:27017,mongo2:27017/?replicaSet=rs0\"\n"
                ),
                3 => format!("mongodb+srv://svc:{p}@cluster0.ab1cd.mongodb.net/prod\n"),
                4 => format!("REDIS_URL=redis://:{p}@cache.internal:6379/0\n"),
                5 => format!("amqp://guest:{p}@rabbit:5672/vhost\n"),
                6 => format!(
                    "\"ConnectionStrings\": {{\"Default\": \"Server=sql01;Database=Shop;User Id=shop;Password={p};\"}}\n"
                ),
                7 => format!("jdbc:postgresql://db:5432/app?user=app&password={p}\n"),
                _ => format!(
                    "spring.datasource.url=jdbc:mysql://db:3306/app?user=app&password={p}&useSSL=true\n"
                ),
            };
            (t, p)
        },
    },
    Family {
        name: "totp-seeds",
        keys: &[],
        vendor: "",
        ctx: Ctx::Own,
        make: |r| {
            let s = r.s(BASE32, 32);
            let t = match r.below(4) {
                0 => format!("otpauth://totp/Acme:alice@acme.io?secret={s}&issuer=Acme\n"),
                1 => format!("TOTP secret: {s}\n"),
                2 => format!("2FA seed for the AWS root account is {s}\n"),
                _ => {
                    let spaced: Vec<String> = s
                        .as_bytes()
                        .chunks(4)
                        .map(|c| String::from_utf8_lossy(c).into_owned())
                        .collect();
                    let spaced = spaced.join(" ");
                    return (format!("MFA secret key: {spaced}\n"), spaced);
                }
            };
            (t, s)
        },
    },
    Family {
        name: "personal-data",
        keys: &[],
        vendor: "",
        ctx: Ctx::Own,
        make: |r| {
            let area = 1 + r.below(665);
            let ssn = format!("{area:03}{:02}{:04}", 1 + r.below(98), 1 + r.below(9998));
            match r.below(5) {
                0 => (format!("SSN: {ssn}\n"), ssn),
                1 => {
                    let d = format!("{}-{}-{}", &ssn[..3], &ssn[3..5], &ssn[5..]);
                    (format!("Her social security number is {d}.\n"), d)
                }
                2 => {
                    let i = iban("DE", &r.digits(18));
                    let spaced: Vec<String> = i
                        .as_bytes()
                        .chunks(4)
                        .map(|c| String::from_utf8_lossy(c).into_owned())
                        .collect();
                    let spaced = spaced.join(" ");
                    (format!("Pay to IBAN {spaced} by Friday.\n"), spaced)
                }
                3 => {
                    let i = iban("GB", &format!("NWBK{}", r.digits(14)));
                    (format!("iban: {i}\n"), i)
                }
                _ => {
                    let c = luhn_complete("4", 16, r);
                    (format!("card on file {c} exp 09/28\n"), c)
                }
            }
        },
    },
];

/// Puts a token in one of the ways people write it.
fn embed(rng: &mut Rng, f: &Family, secret: &str) -> String {
    let key = if f.keys.is_empty() {
        "TOKEN"
    } else {
        rng.pick(f.keys)
    };
    let lower = key.to_ascii_lowercase();
    let camel: String = {
        let mut out = String::new();
        let mut up = false;
        for (i, c) in lower.chars().enumerate() {
            if c == '_' {
                up = i > 0;
            } else if up {
                out.push(c.to_ascii_uppercase());
                up = false;
            } else {
                out.push(c);
            }
        }
        out
    };
    let v = f.vendor;
    let n = if f.ctx == Ctx::Prefixed { 11 } else { 8 };
    match rng.below(n) {
        0 => format!("{key}={secret}\n"),
        1 => format!("services:\n  app:\n    environment:\n      {key}: \"{secret}\"\n"),
        2 => format!("{{\n  \"{camel}\": \"{secret}\",\n  \"region\": \"eu-west-1\"\n}}\n"),
        3 => format!("export {key}='{secret}'\n"),
        4 => format!("[deploy]\n{lower} = \"{secret}\"\n"),
        5 => format!("The {v} is {secret} (do not share).\n"),
        6 => format!("- {v}: `{secret}`\n"),
        7 => format!("settings.{camel} = \"{secret}\"\n"),
        // Prefixed tokens only: no key name near them.
        8 => format!("Rotated it yesterday; the new one is {secret}, the old one is revoked.\n"),
        9 => format!("```\n{secret}\n```\n"),
        _ => format!("client = Client(\"{secret}\", timeout=30)\n"),
    }
}

// ---------------------------------------------------------------- look-alikes

struct LookAlike {
    name: &'static str,
    make: fn(&mut Rng) -> String,
}

fn uuid(r: &mut Rng) -> String {
    format!(
        "{}-{}-4{}-{}{}-{}",
        r.s(HEXL, 8),
        r.s(HEXL, 4),
        r.s(HEXL, 3),
        r.pick(&["8", "9", "a", "b"]),
        r.s(HEXL, 3),
        r.s(HEXL, 12)
    )
}

const LOOKALIKES: &[LookAlike] = &[
    LookAlike {
        name: "uuids",
        make: |r| match r.below(4) {
            0 => format!("request_id: {}\n", uuid(r)),
            1 => format!("Tenant {} was migrated on Monday.\n", uuid(r)),
            2 => format!("{{\"id\": \"{}\", \"type\": \"user\"}}\n", uuid(r)),
            _ => format!("trace={} span={}\n", uuid(r), r.s(HEXL, 16)),
        },
    },
    LookAlike {
        name: "hashes",
        make: |r| match r.below(5) {
            0 => format!("commit {}\nAuthor: Ada <ada@example.com>\n", r.s(HEXL, 40)),
            1 => format!("sha256: {}\n", r.s(HEXL, 64)),
            2 => format!("image: registry.example.com/app@sha256:{}\n", r.s(HEXL, 64)),
            3 => format!("Fixed in {} (see the PR).\n", r.s(HEXL, 7)),
            _ => format!("integrity \"sha512-{}==\"\n", r.s(B64, 86)),
        },
    },
    LookAlike {
        name: "base64-data",
        make: |r| match r.below(3) {
            0 => format!(
                "![logo](data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAA{})\n",
                r.s(B64, 200)
            ),
            1 => {
                let words = "the quick brown fox jumps over the lazy dog and keeps running";
                format!(
                    "payload: {}\n",
                    b64(format!("{words} {}", r.digits(6)).as_bytes(), B64, true)
                )
            }
            _ => format!("font-data: \"{}\"\n", b64(r.s(D, 90).as_bytes(), B64, true)),
        },
    },
    LookAlike {
        name: "documented-examples",
        make: |r| {
            r.pick(&[
                "aws_access_key_id = AKIAIOSFODNN7EXAMPLE\n",
                "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n",
                "Stripe's docs use sk_test_4eC39HqLyjWDarjtT1zdp7dc in every example.\n",
                "export OPENAI_API_KEY=\"sk-...\"\n",
                "GITHUB_TOKEN=ghp_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n",
            ])
            .to_owned()
        },
    },
    LookAlike {
        name: "placeholders",
        make: |r| {
            r.pick(&[
                "password: ${DB_PASSWORD}\n",
                "api_key: <your-api-key>\n",
                "token: xxxxxxxxxxxxxxxx\n",
                "SECRET_KEY=changeme\n",
                "DATADOG_API_KEY=YOUR_API_KEY_HERE\n",
                "password = os.environ[\"DB_PASSWORD\"]\n",
                "token: {{ secrets.DEPLOY_TOKEN }}\n",
                "export VAULT_TOKEN=$(vault print token)\n",
                "\"password\": \"********\"\n",
                "DIGITALOCEAN_TOKEN=dop_v1_<token>\n",
            ])
            .to_owned()
        },
    },
    LookAlike {
        name: "public-keys",
        make: |r| match r.below(3) {
            0 => format!(
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{} ada@laptop\n",
                r.s(B64, 43)
            ),
            1 => format!(
                "-----BEGIN PUBLIC KEY-----\n{}\n{}\n-----END PUBLIC KEY-----\n",
                r.s(B64, 64),
                r.s(B64, 24)
            ),
            _ => format!(
                "-----BEGIN CERTIFICATE-----\n{}\n{}\n-----END CERTIFICATE-----\n",
                r.s(B64, 64),
                r.s(B64, 64)
            ),
        },
    },
    LookAlike {
        name: "redacted-markers",
        make: |r| {
            format!(
                "api_key: [REDACTED:{}]\n",
                r.pick(&["secret-assignment", "aws-access-key-id", "jwt"])
            )
        },
    },
    LookAlike {
        name: "checksum-failures",
        make: |r| match r.below(3) {
            0 => {
                let c = luhn_complete("4", 16, r);
                let last = c.as_bytes()[15] - b'0';
                format!("order {}{}\n", &c[..15], (last + 1) % 10)
            }
            1 => {
                let i = iban("DE", &r.digits(18));
                let bad = if i.as_bytes()[3] == b'9' { '0' } else { '9' };
                format!("ref {}{}{}\n", &i[..3], bad, &i[4..])
            }
            _ => {
                let t = github_classic(r, "ghp_");
                let mut b = t.into_bytes();
                b[39] = if b[39] == b'A' { b'B' } else { b'A' };
                format!("token looks like {}\n", String::from_utf8_lossy(&b))
            }
        },
    },
    LookAlike {
        name: "identifiers",
        make: |r| {
            r.pick(&[
                "password_reset_token_ttl: 3600\n",
                "fn validate_api_key(key: &str) -> bool\n",
                "The PasswordStrengthMeter component renders a bar.\n",
                "primary_key: customer_id\n",
                "token_type: bearer\n",
                "secret_name: prod/db/credentials\n",
                "max_tokens: 4096\n",
                "api_key_header = \"X-Api-Key\"\n",
                "use the SecretsManagerClient to fetch it\n",
                "tokenizer = AutoTokenizer.from_pretrained(\"gpt2\")\n",
            ])
            .to_owned()
        },
    },
    LookAlike {
        name: "paths",
        make: |r| match r.below(3) {
            0 => format!(
                "secret_file: /var/run/secrets/app/{}\n",
                r.pick(&["db", "token", "tls.key"])
            ),
            1 => "password_file = ~/.config/app/password.txt\n".to_owned(),
            _ => format!("See src/auth/token_store.rs line {}.\n", r.below(900)),
        },
    },
    LookAlike {
        name: "dates-versions",
        make: |r| match r.below(3) {
            0 => format!(
                "released 2024-{:02}-{:02}T10:{:02}:00Z\n",
                1 + r.below(12),
                1 + r.below(28),
                r.below(60)
            ),
            1 => format!(
                "version: {}.{}.{}-beta.{}\n",
                r.below(5),
                r.below(30),
                r.below(20),
                r.below(9)
            ),
            _ => format!(
                "token expires_at: 2025-{:02}-{:02} 12:00:00\n",
                1 + r.below(12),
                1 + r.below(28)
            ),
        },
    },
    LookAlike {
        name: "phone-numbers",
        make: |r| match r.below(3) {
            0 => format!("Call +1 415-555-{:04} after 5pm.\n", r.below(10000)),
            1 => format!("phone: (212) 555-{:04}\n", r.below(10000)),
            _ => format!("Tel. +44 20 7946 {:04}\n", r.below(10000)),
        },
    },
    LookAlike {
        name: "prose",
        make: |r| {
            r.pick(&[
                "The password policy requires twelve characters and a symbol.\n",
                "We rotate the API key every quarter; the token bucket refills at 10/s.\n",
                "Secret Santa is on Friday, bring something under 20 euros.\n",
                "Her passport expires next year, so renew it before the trip.\n",
                "The keynote went well and the session ran long.\n",
                "password: must be at least 8 characters\n",
                "Keyboard shortcuts: press the key combination Ctrl+K.\n",
                "Use a bearer token in the Authorization header (see the docs).\n",
                "The SSN field is optional in the signup form.\n",
                "TOTP codes are six digits and change every 30 seconds.\n",
            ])
            .to_owned()
        },
    },
    LookAlike {
        name: "numbers",
        make: |r| match r.below(3) {
            0 => format!("invoice {} paid\n", r.digits(9)),
            1 => format!("tracking number 1Z{}\n", r.s(UPPER_AN, 16)),
            _ => format!("account id {}\n", r.digits(12)),
        },
    },
];

/// Per-family figures.
struct Row {
    name: &'static str,
    total: usize,
    ok: usize,
}

fn removed(out: &str, secret: &str) -> bool {
    let s = secret.as_bytes();
    let w = 12.min(s.len());
    s.windows(w)
        .all(|piece| std::str::from_utf8(piece).map_or(true, |p| !out.contains(p)))
}

fn evaluate() -> (Vec<Row>, Vec<Row>, Vec<String>) {
    let redactor = Redactor::new(&RedactConfig::default()).expect("default settings compile");
    let mut rng = Rng(0x5EED_2026_0020);
    let mut misses = Vec::new();
    let mut recall = Vec::new();
    for f in FAMILIES {
        let mut row = Row {
            name: f.name,
            total: 0,
            ok: 0,
        };
        for _ in 0..60 {
            let (piece, secret) = (f.make)(&mut rng);
            let text = if f.ctx == Ctx::Own {
                piece
            } else {
                embed(&mut rng, f, &piece)
            };
            // A note: a line of prose around the secret.
            let note = format!("Notes from the ops sync.\n{text}Next: check the dashboards.\n");
            let out = redactor.redact(&note).text;
            row.total += 1;
            if removed(&out, &secret) {
                row.ok += 1;
            } else if misses.len() < 5000 {
                misses.push(format!("[{}] {}", f.name, text.trim_end()));
            }
        }
        recall.push(row);
    }
    let mut fp = Vec::new();
    for l in LOOKALIKES {
        let mut row = Row {
            name: l.name,
            total: 0,
            ok: 0,
        };
        for _ in 0..60 {
            let text = (l.make)(&mut rng);
            let out = redactor.redact(&text).text;
            row.total += 1;
            if out == text {
                row.ok += 1;
            } else if misses.len() < 5000 {
                misses.push(format!(
                    "[look-alike {}] {} -> {}",
                    l.name,
                    text.trim_end(),
                    out.trim_end()
                ));
            }
        }
        fp.push(row);
    }
    (recall, fp, misses)
}

/// Recall >= 98% over all families, and at most 1% of look-alikes touched.
#[test]
fn held_out_recall_and_false_positives() {
    let (recall, fp, misses) = evaluate();
    println!("{:<24} {:>6} {:>8}", "family", "n", "removed");
    let (mut n, mut ok) = (0, 0);
    for r in &recall {
        println!(
            "{:<24} {:>6} {:>7.1}%",
            r.name,
            r.total,
            100.0 * r.ok as f64 / r.total as f64
        );
        n += r.total;
        ok += r.ok;
    }
    let rec = ok as f64 / n as f64;
    println!("{:<24} {:>6} {:>7.1}%", "ALL SECRETS", n, 100.0 * rec);
    println!("\n{:<24} {:>6} {:>8}", "look-alikes", "n", "touched");
    let (mut ln, mut lok) = (0, 0);
    for r in &fp {
        println!(
            "{:<24} {:>6} {:>7.1}%",
            r.name,
            r.total,
            100.0 * (r.total - r.ok) as f64 / r.total as f64
        );
        ln += r.total;
        lok += r.ok;
    }
    let fpr = (ln - lok) as f64 / ln as f64;
    println!("{:<24} {:>6} {:>7.1}%", "ALL LOOK-ALIKES", ln, 100.0 * fpr);
    if std::env::var_os("EVAL_SHOW_MISSES").is_some() {
        for m in &misses {
            println!("{m}");
        }
    }
    assert!(rec >= 0.98, "recall {:.1}% < 98%", 100.0 * rec);
    assert!(fpr <= 0.01, "look-alikes touched {:.1}% > 1%", 100.0 * fpr);
}
