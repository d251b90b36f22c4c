//! Tests of the filter, one module per family. Test secrets are generated
//! (deterministic pseudo-random bodies, real checksums) so that no
//! credential-shaped literal sits in the source.

use std::sync::OnceLock;

use super::checks::{base62_6, bech32_encode, crc32};
use super::*;

// ------------------------------------------------------------------ helpers

fn redactor() -> &'static Redactor {
    static R: OnceLock<Redactor> = OnceLock::new();
    R.get_or_init(|| Redactor::new(&RedactConfig::default()).expect("default settings compile"))
}

/// Deterministic xorshift64* generator.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

const ALNUM: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
const UPPER_DIGITS: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
const HEX: &str = "0123456789abcdef";
const B64: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const B64URL: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// `n` characters from `alphabet`; from eight characters on, guaranteed to
/// hold an upper-case letter, a lower-case letter and a digit when the
/// alphabet has them.
fn rand(seed: u64, alphabet: &str, n: usize) -> String {
    let a = alphabet.as_bytes();
    let mut rng = Rng::new(seed);
    loop {
        let s: String = (0..n).map(|_| a[rng.below(a.len())] as char).collect();
        let has = |f: fn(&u8) -> bool| !a.iter().any(f) || s.as_bytes().iter().any(f);
        if n < 8
            || (has(u8::is_ascii_uppercase)
                && has(u8::is_ascii_lowercase)
                && has(u8::is_ascii_digit))
        {
            return s;
        }
    }
}

/// A GitHub classic token with a valid checksum.
fn github_token(prefix: &str, seed: u64) -> String {
    let body = rand(seed, ALNUM, 30);
    let check = base62_6(crc32(body.as_bytes()));
    format!("{prefix}{body}{}", std::str::from_utf8(&check).unwrap())
}

pub(super) fn b64_encode(data: &[u8], alphabet: &str, pad: bool) -> String {
    let a = alphabet.as_bytes();
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let v = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &b)| acc | (u32::from(b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(a[((v >> (18 - 6 * i)) & 63) as usize] as char);
        }
        if pad {
            for _ in chunk.len()..3 {
                out.push('=');
            }
        }
    }
    out
}

fn jwt(seed: u64) -> String {
    let header = b64_encode(br#"{"alg":"HS256","typ":"JWT"}"#, B64URL, false);
    let payload = b64_encode(
        br#"{"sub":"1234567890","name":"Ada","iat":1516239022}"#,
        B64URL,
        false,
    );
    format!("{header}.{payload}.{}", rand(seed, B64URL, 43))
}

fn discord_token(seed: u64) -> String {
    let id = b64_encode(b"412345678901234567", B64URL, false);
    format!(
        "{id}.{}.{}",
        rand(seed, B64URL, 6),
        rand(seed + 1, B64URL, 38)
    )
}

fn age_key(seed: u64) -> String {
    let mut rng = Rng::new(seed);
    let data: Vec<u8> = (0..52).map(|_| (rng.next() % 32) as u8).collect();
    bech32_encode("age-secret-key-", &data).to_ascii_uppercase()
}

fn pem_body(seed: u64, lines: usize) -> String {
    (0..lines)
        .map(|i| rand(seed + i as u64, B64, 64))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every text the tests redact, for the idempotence check.
fn inputs() -> &'static std::sync::Mutex<Vec<String>> {
    static I: OnceLock<std::sync::Mutex<Vec<String>>> = OnceLock::new();
    I.get_or_init(Default::default)
}

fn record(text: &str) {
    let mut v = inputs().lock().unwrap_or_else(|e| e.into_inner());
    if v.len() < 2000 {
        v.push(text.to_owned());
    }
}

/// `input` holds `secret`: it is replaced by a `rule` marker, no 12-byte
/// piece of it survives, the text around it is kept, and redacting again
/// changes nothing.
#[track_caller]
fn assert_redacted(input: &str, secret: &str, rule: &str) {
    record(input);
    assert!(input.contains(secret), "test bug: secret not in input");
    let out = redactor().redact(input);
    let marker = format!("[REDACTED:{rule}]");
    assert!(
        out.text.contains(&marker),
        "expected {marker} in:\n{}\n(findings {:?})",
        out.text,
        out.findings
    );
    let s = secret.as_bytes();
    for w in s.windows(12.min(s.len())) {
        let piece = std::str::from_utf8(w).unwrap_or("");
        assert!(
            piece.is_empty() || !out.text.contains(piece),
            "piece {piece:?} of the secret survives in:\n{}",
            out.text
        );
    }
    for part in input.split(secret) {
        for line in part.lines().map(str::trim).filter(|l| l.len() >= 3) {
            assert!(
                out.text.contains(line),
                "surrounding text {line:?} lost:\n{}",
                out.text
            );
        }
    }
    assert_eq!(
        redactor().redact(&out.text).text,
        out.text,
        "not idempotent"
    );
    assert!(out.findings.iter().any(|f| f.rule == rule));
}

/// `input` is left exactly as it is.
#[track_caller]
fn assert_clean(input: &str) {
    record(input);
    let out = redactor().redact(input);
    assert_eq!(
        out.text, input,
        "look-alike was changed (findings {:?})",
        out.findings
    );
    assert!(out.findings.is_empty());
}

// ------------------------------------------------------------------ cloud

mod cloud {
    use super::*;

    fn aws_id(seed: u64) -> String {
        format!("AKIA{}", rand(seed, UPPER_DIGITS, 16))
    }

    fn aws_secret(seed: u64) -> String {
        rand(seed, B64, 40)
    }

    #[test]
    fn aws_access_key_id() {
        let k = aws_id(1);
        assert_redacted(
            &format!("The deploy user's key is {k}, rotate it monthly."),
            &k,
            "aws-access-key-id",
        );
        let k = aws_id(2);
        assert_redacted(
            &format!("AWS_ACCESS_KEY_ID={k}\nAWS_REGION=us-east-1\n"),
            &k,
            "aws-access-key-id",
        );
        let k = format!("ASIA{}", rand(3, UPPER_DIGITS, 16));
        assert_redacted(
            &format!("{{\"AccessKeyId\": \"{k}\", \"Expiration\": \"2025-01-01\"}}"),
            &k,
            "aws-access-key-id",
        );
        let k = aws_id(4);
        assert_redacted(&format!("- `{k}` (ci user)"), &k, "aws-access-key-id");
    }

    /// Keys pasted together with nothing between (round 32d): each one is
    /// redacted, none is left because a letter touches it.
    #[test]
    fn aws_access_key_ids_glued_together() {
        let (a, b, c) = (aws_id(21), aws_id(22), aws_id(23));
        for text in [format!("{a}{b}"), format!("ids: {a}{b}{c}.")] {
            let out = redactor().redact(&text);
            for k in [&a, &b, &c] {
                assert!(!out.text.contains(k.as_str()), "{}", out.text);
                assert!(!out.text.contains(&k[4..]), "{}", out.text);
            }
            assert!(
                out.text.contains("[REDACTED:aws-access-key-id]"),
                "{}",
                out.text
            );
        }
        // A run of hex is not cut into keys of a hex format.
        assert_clean("sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 ok");
    }

    #[test]
    fn aws_access_key_id_lookalikes() {
        assert_clean("The docs use AKIAIOSFODNN7EXAMPLE as the access key id.");
        assert_clean("AWS_ACCESS_KEY_ID=AKIAXXXXXXXXXXXXXXXX");
        assert_clean("AKIA1234 is too short, and so is ASIA.");
        assert_clean(&format!("XAKIA{}", rand(5, UPPER_DIGITS, 16)));
        assert_clean(&format!("AKIA{}Q", rand(6, UPPER_DIGITS, 17)));
        assert_clean("Travel notes: ASIA trip, AKIA is a name.");
    }

    #[test]
    fn aws_secret_access_key() {
        let s = aws_secret(10);
        assert_redacted(
            &format!("AWS_SECRET_ACCESS_KEY={s}\n"),
            &s,
            "aws-secret-access-key",
        );
        let s = aws_secret(11);
        assert_redacted(
            &format!("aws_secret_access_key = {s}\n"),
            &s,
            "aws-secret-access-key",
        );
        let s = aws_secret(12);
        assert_redacted(
            &format!("The AWS secret key is {s} (prod account)."),
            &s,
            "aws-secret-access-key",
        );
        let s = aws_secret(13);
        assert_redacted(
            &format!("  \"SecretAccessKey\": \"{s}\",\n"),
            &s,
            "aws-secret-access-key",
        );
        // The key id redacted by an earlier write, the secret added on the
        // next line by a later one: still next to its id.
        let s = aws_secret(15);
        let out = redactor().redact(&format!(
            "aws_access_key_id [REDACTED:aws-access-key-id]\n{s}\n"
        ));
        assert_eq!(
            out.text,
            "aws_access_key_id [REDACTED:aws-access-key-id]\n[REDACTED:aws-secret-access-key]\n"
        );
        // The console's CSV: the secret sits next to its key id.
        let (id, s) = (aws_id(14), aws_secret(14));
        let out = redactor().redact(&format!("Access key ID,Secret access key\n{id},{s}\n"));
        assert_eq!(
            out.text,
            "Access key ID,Secret access key\n[REDACTED:aws-access-key-id],[REDACTED:aws-secret-access-key]\n"
        );
    }

    #[test]
    fn aws_secret_lookalikes() {
        assert_clean("secret: wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY");
        assert_clean("the secret commit was 9fceb02d0ae598e95dc970b74767f19372d61af8 on main");
        assert_clean("Keep the secret sauce recipe in the shared drive, not here.");
        assert_clean("aws secret: see 1Password entry \"prod/aws\"");
    }

    #[test]
    fn gcp_service_account_json() {
        let body: String = pem_body(20, 6).replace('\n', "\\n");
        let key = format!("-----BEGIN PRIVATE KEY-----\\n{body}\\n-----END PRIVATE KEY-----\\n");
        let json = format!(
            "{{\n  \"type\": \"service_account\",\n  \"project_id\": \"demo-project\",\n  \"private_key\": \"{key}\",\n  \"client_email\": \"svc@demo-project.iam.gserviceaccount.com\"\n}}\n"
        );
        let secret = key.trim_end_matches("\\n");
        assert_redacted(&json, secret, "private-key");
        let out = redactor().redact(&json);
        assert!(
            out.text
                .contains("\"client_email\": \"svc@demo-project.iam.gserviceaccount.com\"")
        );
    }

    #[test]
    fn google_api_key() {
        let k = format!("AIza{}", rand(30, B64URL, 35));
        assert_redacted(&format!("GOOGLE_API_KEY={k}"), &k, "google-api-key");
        let k = format!("AIza{}", rand(31, B64URL, 35));
        assert_redacted(
            &format!("Maps key ({k}) is restricted to our domain."),
            &k,
            "google-api-key",
        );
        let k = format!("GOCSPX-{}", rand(32, B64URL, 28));
        assert_redacted(
            &format!("client secret {k}"),
            &k,
            "google-oauth-client-secret",
        );
        assert_clean("AIzaXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX and AIza-short");
    }

    #[test]
    fn azure_connection_string() {
        let key = format!("{}==", rand(40, B64, 86));
        let conn = format!(
            "DefaultEndpointsProtocol=https;AccountName=notesstore;AccountKey={key};EndpointSuffix=core.windows.net"
        );
        assert_redacted(
            &format!("AZURE_STORAGE_CONNECTION_STRING=\"{conn}\"\n"),
            &conn,
            "azure-storage-connection-string",
        );
        let key = format!("{}=", rand(41, B64, 43));
        let conn = format!(
            "Endpoint=sb://notes.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={key}"
        );
        assert_redacted(&format!("bus: {conn}\n"), &conn, "azure-shared-access-key");
        assert_clean("AccountKey=<your-account-key> goes in the connection string.");
    }

    #[test]
    fn azure_sas_token() {
        let sig = format!("{}%3D", rand(42, ALNUM, 43));
        let sas =
            format!("sv=2022-11-02&ss=b&srt=sco&sp=rl&se=2025-06-01T00:00:00Z&spr=https&sig={sig}");
        let url = format!("https://notesstore.blob.core.windows.net/backups/notes.tar?{sas}");
        assert_redacted(
            &format!("Download from {url} before Friday."),
            &sas,
            "azure-sas-token",
        );
        let out = redactor().redact(&url);
        assert!(
            out.text
                .starts_with("https://notesstore.blob.core.windows.net/backups/notes.tar?")
        );
        assert_clean("The query string had sig=abc only, with no version.");
    }
}

// ------------------------------------------------------------------ code hosts

mod code_hosts {
    use super::*;

    #[test]
    fn github_classic_and_app_tokens() {
        for (i, p) in ["ghp_", "gho_", "ghu_", "ghs_", "ghr_"].iter().enumerate() {
            let t = github_token(p, 100 + i as u64);
            assert_redacted(&format!("export GH_TOKEN={t}\n"), &t, "github-token");
        }
        let t = github_token("ghp_", 110);
        assert_redacted(
            &format!("Use the PAT {t} for the release job."),
            &t,
            "github-token",
        );
    }

    #[test]
    fn exact_tokens_joined_to_words_by_a_dash_or_underscore_are_found() {
        // Names join words with `-` and `_`: `prod-<token>.md`.
        let gh = github_token("ghp_", 130);
        let ant = format!("sk-ant-api03-{}AA", rand(131, B64URL, 93));
        let gl = format!("glpat-{}", rand(132, ALNUM, 20));
        for (t, rule) in [
            (&gh, "github-token"),
            (&ant, "anthropic-api-key"),
            (&gl, "gitlab-token"),
        ] {
            for joined in [
                format!("/memories/k/prod-{t}.md"),
                format!("/memories/k/x_{t}.md"),
                format!("the key is in notes_{t}\n"),
            ] {
                assert_redacted(&joined, t, rule);
            }
        }
        // After a token whose alphabet has no `_` (an Anthropic key's
        // has: its match takes the rest of the word with it).
        assert_redacted(&format!("{gh}_backup.md"), &gh, "github-token");
        // Glued to a letter or digit it is part of a longer string.
        assert_clean(&format!("x{gh}"));
        assert_clean(&format!("9{gl}"));
    }

    #[test]
    fn github_checksum_failures_are_left_alone() {
        let t = github_token("ghp_", 120);
        let mut bad = t.clone().into_bytes();
        bad[39] = if bad[39] == b'A' { b'B' } else { b'A' };
        let bad = String::from_utf8(bad).unwrap();
        assert_clean(&format!("see {bad} in the docs"));
        assert_clean("ghp_ prefix means a personal token; ghp_short is not one.");
    }

    #[test]
    fn github_fine_grained() {
        let t = format!(
            "github_pat_11{}_{}",
            rand(130, ALNUM, 20),
            rand(131, ALNUM, 59)
        );
        assert_redacted(&format!("token: {t}"), &t, "github-fine-grained-token");
        assert_redacted(
            &format!("gh auth login --with-token <<< {t}"),
            &t,
            "github-fine-grained-token",
        );
    }

    #[test]
    fn gitlab() {
        let t = format!("glpat-{}", rand(140, B64URL, 20));
        assert_redacted(&format!("GITLAB_TOKEN={t}"), &t, "gitlab-token");
        let t = format!("gldt-{}", rand(141, ALNUM, 20));
        assert_redacted(
            &format!("deploy token {t} (read_registry)"),
            &t,
            "gitlab-token",
        );
        assert_clean("glpat-xxxxxxxxxxxxxxxxxxxx is the placeholder in the README");
    }

    #[test]
    fn registries() {
        let t = format!("npm_{}", rand(150, ALNUM, 36));
        assert_redacted(
            &format!("//registry.npmjs.org/:_authToken={t}\n"),
            &t,
            "npm-token",
        );
        let t = format!("pypi-AgEIcHlwaS5vcmc{}", rand(151, B64URL, 120));
        assert_redacted(
            &format!("[pypi]\n  username = __token__\n  password = {t}\n"),
            &t,
            "pypi-token",
        );
        let t = format!("dckr_pat_{}", rand(152, B64URL, 27));
        assert_redacted(&format!("docker login -u me -p {t}"), &t, "dockerhub-token");
        let t = format!(
            "hf_{}",
            rand(
                153,
                "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
                34
            )
        );
        assert_redacted(&format!("HF_TOKEN={t}"), &t, "huggingface-token");
        assert_clean("run npm_config_cache=/tmp npm ci; hf_hub_download(repo_id=\"gpt2\")");
    }
}

// ------------------------------------------------------------------ chat and SaaS

mod saas {
    use super::*;

    #[test]
    fn slack() {
        let t = format!(
            "xoxb-{}-{}-{}",
            1_234_567_890_123u64,
            9_876_543_210_987u64,
            rand(200, ALNUM, 24)
        );
        assert_redacted(&format!("SLACK_BOT_TOKEN={t}"), &t, "slack-token");
        let t = format!(
            "xoxp-1234567890-1234567890-1234567890123-{}",
            rand(201, HEX, 32)
        );
        assert_redacted(&format!("user token: `{t}`"), &t, "slack-token");
        let url = format!(
            "https://hooks.slack.com/services/T0123ABCD/B0456EFGH/{}",
            rand(202, ALNUM, 24)
        );
        assert_redacted(
            &format!("Alerts go to {url} (channel #ops)."),
            &url,
            "slack-webhook-url",
        );
        assert_clean(
            "xoxb-your-token-here and https://hooks.slack.com/services/T000/B000/XXXXXXXXXXXXXXXXXXXXXXXX",
        );
    }

    #[test]
    fn discord() {
        let t = discord_token(210);
        assert_redacted(&format!("DISCORD_BOT_TOKEN={t}"), &t, "discord-bot-token");
        let t = discord_token(211);
        assert_redacted(
            &format!("The Discord bot logs in with {t}."),
            &t,
            "discord-bot-token",
        );
        let url = format!(
            "https://discord.com/api/webhooks/123456789012345678/{}",
            rand(212, B64URL, 68)
        );
        assert_redacted(&format!("webhook: {url}"), &url, "discord-webhook-url");
        // Looks like a token, but the first part is not a user id.
        assert_clean(&format!(
            "discord: {}.{}.{}",
            rand(213, ALNUM, 24),
            rand(214, ALNUM, 6),
            rand(215, ALNUM, 27)
        ));
    }

    #[test]
    fn telegram() {
        let t = format!("7123456789:AA{}", rand(220, B64URL, 33));
        assert_redacted(&format!("TELEGRAM_BOT_TOKEN={t}"), &t, "telegram-bot-token");
        let t = format!("123456789:AA{}", rand(221, B64URL, 33));
        assert_redacted(
            &format!("bot {t} posts to the channel"),
            &t,
            "telegram-bot-token",
        );
        assert_clean("at 12:AA the meeting started; ticket 123456789:AAB");
    }

    #[test]
    fn twilio_sendgrid_mailgun() {
        let t = format!("SK{}", rand(230, HEX, 32));
        assert_redacted(&format!("twilio api key sid {t}"), &t, "twilio-api-key");
        let t = format!("SG.{}.{}", rand(231, B64URL, 22), rand(232, B64URL, 43));
        assert_redacted(&format!("SENDGRID_API_KEY='{t}'"), &t, "sendgrid-api-key");
        let t = format!(
            "key-{}",
            rand(233, "abcdefghijklmnopqrstuvwxyz0123456789", 32)
        );
        assert_redacted(&format!("mailgun: {t}"), &t, "mailgun-api-key");
        let t = format!(
            "{}-{}-{}",
            rand(234, HEX, 32),
            rand(235, HEX, 8),
            rand(236, HEX, 8)
        );
        assert_redacted(
            &format!("Mailgun private API key {t}"),
            &t,
            "mailgun-api-key",
        );
        assert_clean("SKU 12345 and SG. are fine; key-value stores are not keys.");
    }

    #[test]
    fn stripe_and_shopify() {
        let t = format!("sk_live_51{}", rand(240, ALNUM, 40));
        assert_redacted(&format!("Payments API key: {t}"), &t, "stripe-secret-key");
        let t = format!("rk_live_51{}", rand(241, ALNUM, 40));
        assert_redacted(
            &format!("STRIPE_RESTRICTED={t}"),
            &t,
            "stripe-restricted-key",
        );
        let t = format!("sk_test_{}", rand(242, ALNUM, 24));
        assert_redacted(&format!("test mode: {t}"), &t, "stripe-secret-key");
        let t = format!("shpat_{}", rand(243, HEX, 32));
        assert_redacted(&format!("X-Shopify-Access-Token: {t}"), &t, "shopify-token");
        assert_clean(
            "Stripe docs: sk_test_4eC39HqLyjWDarjtT1zdp7dc, and sk_live_xxxxxxxxxxxxxxxxxxxxxxxx.",
        );
    }

    #[test]
    fn the_demo_key_is_redacted() {
        let text = "- Payments API key: sk_live_51HqLyjWDarjtT1zdp7dcXk2mQ9vRb4nZe8aYf3Lw\n";
        assert_redacted(
            text,
            "sk_live_51HqLyjWDarjtT1zdp7dcXk2mQ9vRb4nZe8aYf3Lw",
            "stripe-secret-key",
        );
    }
}

// ------------------------------------------------------------------ AI vendors

mod ai {
    use super::*;

    #[test]
    fn anthropic() {
        let t = format!("sk-ant-api03-{}AA", rand(300, B64URL, 93));
        assert_redacted(&format!("ANTHROPIC_API_KEY={t}"), &t, "anthropic-api-key");
        let t = format!("sk-ant-admin01-{}", rand(301, B64URL, 80));
        assert_redacted(&format!("the admin key is {t}."), &t, "anthropic-api-key");
    }

    #[test]
    fn openai() {
        let t = format!("sk-proj-{}", rand(310, B64URL, 156));
        assert_redacted(&format!("OPENAI_API_KEY=\"{t}\""), &t, "openai-api-key");
        let t = format!(
            "sk-{}T3BlbkFJ{}",
            rand(311, ALNUM, 20),
            rand(312, ALNUM, 20)
        );
        assert_redacted(&format!("old key {t} (revoked?)"), &t, "openai-api-key");
        let t = format!("sk-svcacct-{}", rand(313, B64URL, 100));
        assert_redacted(
            &format!("client = OpenAI(api_key=\"{t}\")"),
            &t,
            "openai-api-key",
        );
        assert_clean("sk-your-key-here, sk-... and sk-learn are not keys; use scikit-learn.");
    }

    #[test]
    fn other_vendors() {
        let cases = [
            (format!("gsk_{}", rand(320, ALNUM, 52)), "groq-api-key"),
            (format!("xai-{}", rand(321, ALNUM, 80)), "xai-api-key"),
            (
                format!("pplx-{}", rand(322, ALNUM, 48)),
                "perplexity-api-key",
            ),
            (
                format!("r8_{}", rand(323, ALNUM, 37)),
                "replicate-api-token",
            ),
            (
                format!("sk-or-v1-{}", rand(324, HEX, 64)),
                "openrouter-api-key",
            ),
            (
                format!("lsv2_pt_{}_{}", rand(325, HEX, 32), rand(326, HEX, 10)),
                "langsmith-api-key",
            ),
            (format!("nvapi-{}", rand(327, B64URL, 64)), "nvidia-api-key"),
        ];
        for (t, rule) in cases {
            assert_redacted(&format!("key for the eval harness: {t}\n"), &t, rule);
        }
    }
}

// ------------------------------------------------------------------ more vendors

mod vendors {
    use super::*;

    const LOWER_AN: &str = "abcdefghijklmnopqrstuvwxyz0123456789";
    const UPPER_AN: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

    /// One token of each vendor format, with the rule that must name it.
    fn tokens() -> Vec<(String, &'static str)> {
        vec![
            (
                format!("dop_v1_{}", rand(700, HEX, 64)),
                "digitalocean-token",
            ),
            (
                format!("dor_v1_{}", rand(701, HEX, 64)),
                "digitalocean-token",
            ),
            (format!("dp.pt.{}", rand(702, ALNUM, 43)), "doppler-token"),
            (
                format!("dp.st.dev.{}", rand(703, ALNUM, 40)),
                "doppler-token",
            ),
            (
                format!("glsa_{}_{}", rand(704, ALNUM, 32), rand(705, HEX, 8)),
                "grafana-token",
            ),
            (format!("glc_{}", rand(706, B64, 120)), "grafana-token"),
            (
                format!("hvs.{}", rand(707, B64URL, 95)),
                "hashicorp-vault-token",
            ),
            (
                format!("{}.atlasv1.{}", rand(708, ALNUM, 14), rand(709, ALNUM, 67)),
                "terraform-cloud-token",
            ),
            (format!("pul-{}", rand(710, HEX, 40)), "pulumi-token"),
            (
                format!("pscale_tkn_{}", rand(711, B64URL, 43)),
                "planetscale-token",
            ),
            (format!("sbp_{}", rand(712, HEX, 40)), "supabase-token"),
            (
                format!("sb_secret_{}", rand(713, B64URL, 31)),
                "supabase-token",
            ),
            (format!("vcp_{}", rand(714, ALNUM, 48)), "vercel-token"),
            (format!("nfp_{}", rand(715, ALNUM, 36)), "netlify-token"),
            (
                format!("v1.0-{}-{}", rand(716, HEX, 24), rand(717, HEX, 146)),
                "cloudflare-origin-ca-key",
            ),
            (format!("fo1_{}", rand(718, B64URL, 43)), "flyio-token"),
            (format!("fm2_{}", rand(719, B64, 150)), "flyio-token"),
            (
                format!("HRKU-AA{}", rand(720, B64URL, 58)),
                "heroku-api-key",
            ),
            (format!("dapi{}", rand(721, HEX, 32)), "databricks-token"),
            (
                format!(
                    "ATATT3xFfGF0{}={}",
                    rand(722, B64URL, 170),
                    rand(723, UPPER_AN, 8)
                ),
                "atlassian-api-token",
            ),
            (
                format!("lin_api_{}", rand(724, ALNUM, 40)),
                "linear-api-key",
            ),
            (
                format!(
                    "ntn_{}{}",
                    rand(725, "0123456789", 11),
                    rand(726, ALNUM, 35)
                ),
                "notion-token",
            ),
            (
                format!("pat{}.{}", rand(727, ALNUM, 14), rand(728, HEX, 64)),
                "airtable-token",
            ),
            (
                format!("PMAK-{}-{}", rand(729, HEX, 24), rand(730, HEX, 34)),
                "postman-api-key",
            ),
            (format!("sntryu_{}", rand(731, HEX, 64)), "sentry-token"),
            (format!("NRAK-{}", rand(732, UPPER_AN, 27)), "new-relic-key"),
            (format!("EAAA{}", rand(733, B64URL, 60)), "square-token"),
            (format!("sq0csp-{}", rand(734, B64URL, 43)), "square-token"),
            (
                format!(
                    "access_token$production${}${}",
                    rand(735, LOWER_AN, 16),
                    rand(736, HEX, 32)
                ),
                "braintree-access-token",
            ),
            (
                format!(
                    "AQEy{}==-{}=-{}",
                    rand(737, B64, 90),
                    rand(738, B64, 43),
                    rand(739, ALNUM, 12)
                ),
                "adyen-api-key",
            ),
            (format!("sl.{}", rand(740, B64URL, 138)), "dropbox-token"),
            (
                format!(
                    "2/{}/{}:{}",
                    rand(741, "0123456789", 16),
                    rand(742, "0123456789", 16),
                    rand(743, HEX, 32)
                ),
                "asana-token",
            ),
            (
                format!(
                    "sk.{}.{}",
                    b64_encode(
                        br#"{"u":"acme","a":"ckx1q2w3e4r5t6y7u8i9o0p"}"#,
                        B64URL,
                        false
                    ),
                    rand(744, B64URL, 22)
                ),
                "mapbox-secret-token",
            ),
            (
                format!("CFPAT-{}", rand(745, B64URL, 43)),
                "contentful-token",
            ),
            (
                b64_encode(format!("tok:{}", rand(746, HEX, 36)).as_bytes(), B64, true),
                "intercom-token",
            ),
            (
                format!(
                    "A3-{}-{}-{}-{}-{}",
                    rand(747, UPPER_AN, 6),
                    rand(748, UPPER_AN, 11),
                    rand(749, UPPER_AN, 5),
                    rand(750, UPPER_AN, 5),
                    rand(751, UPPER_AN, 5)
                ),
                "onepassword-secret",
            ),
            (format!("AKCp{}", rand(752, ALNUM, 69)), "artifactory-token"),
            (
                format!(
                    "dt0c01.{}.{}",
                    rand(753, UPPER_AN, 24),
                    rand(754, UPPER_AN, 64)
                ),
                "dynatrace-token",
            ),
            (format!("EZAK{}", rand(755, ALNUM, 54)), "easypost-api-key"),
            (
                format!("xkeysib-{}-{}", rand(756, HEX, 64), rand(757, ALNUM, 16)),
                "brevo-api-key",
            ),
            (
                format!("sgp_{}_{}", rand(758, HEX, 16), rand(759, HEX, 40)),
                "sourcegraph-token",
            ),
            (format!("squ_{}", rand(760, HEX, 40)), "sonarqube-token"),
            (
                format!("rubygems_{}", rand(761, HEX, 48)),
                "package-registry-token",
            ),
            (
                format!("shippo_live_{}", rand(762, HEX, 40)),
                "saas-api-token",
            ),
            (
                format!("EAAG{}", rand(763, ALNUM, 150)),
                "facebook-access-token",
            ),
            (
                format!("sha256~{}", rand(764, B64URL, 43)),
                "openshift-token",
            ),
            (format!("{}-us14", rand(765, HEX, 32)), "mailchimp-api-key"),
            (format!("AQVN{}", rand(766, B64URL, 36)), "yandex-token"),
            (
                format!("{}{}", "A".repeat(22), rand(767, ALNUM, 90)),
                "twitter-bearer-token",
            ),
            (
                format!("ABSK{}", rand(768, B64, 130)),
                "aws-bedrock-api-key",
            ),
            (
                format!("{}8Q~{}", rand(769, ALNUM, 3), rand(770, ALNUM, 34)),
                "azure-ad-client-secret",
            ),
            (
                format!("LTAI{}", rand(771, ALNUM, 20)),
                "alibaba-access-key-id",
            ),
            (format!("tgp_v1_{}", rand(772, B64URL, 43)), "ai-api-key"),
            (
                format!("pcsk_{}_{}", rand(773, ALNUM, 6), rand(774, ALNUM, 63)),
                "ai-api-key",
            ),
            (format!("sk_{}", rand(775, HEX, 48)), "elevenlabs-api-key"),
        ]
    }

    #[test]
    fn every_vendor_format_in_prose_config_and_json() {
        for (i, (t, rule)) in tokens().into_iter().enumerate() {
            let contexts = [
                format!("The new one is {t}, rotated on Monday.\n"),
                format!("SERVICE_TOKEN={t}\n"),
                format!("{{\"token\": \"{t}\"}}\n"),
                format!("- `{t}`\n"),
            ];
            assert_redacted(&contexts[i % contexts.len()], &t, rule);
            assert_redacted(&contexts[(i + 1) % contexts.len()], &t, rule);
        }
    }

    /// `FAkE` inside a random token is not the word `fake`.
    #[test]
    fn placeholder_words_count_only_as_words() {
        let t = format!(
            "sk_live_{}FAkE{}",
            rand(790, ALNUM, 10),
            rand(791, ALNUM, 20)
        );
        assert_redacted(&format!("key {t}\n"), &t, "stripe-secret-key");
        assert_clean("sk_live_fake0000111122223333 and sk_live_FAKE0000111122223333\n");
    }

    #[test]
    fn vendor_lookalikes() {
        for text in [
            "DIGITALOCEAN_TOKEN=dop_v1_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
            "the path is patterns/abcdefghijklmn.txt",
            "dp.pt.short and hvs.tooshort are fragments",
            "v1.0-beta and pul-request are words",
            "use sl.no as the row number, sk.eyJ alone is nothing",
            "the file glc_config.yaml and NRAK-README",
            "ticket 2/15 at 10:30 and ratio 1/1234567890123456 here",
            "curl https://api.example.com/v1.0-preview/items",
            "mypat12345678901234.abc is not hex",
            "sq0atp-short, EAAA, AQE and ABSK are prefixes only",
        ] {
            assert_clean(text);
        }
    }

    #[test]
    fn heroku_and_other_uuid_keys_by_their_key_name() {
        let id = "5b9d6cb3-930f-4cb5-abc3-b43d15a0035c";
        assert_redacted(&format!("HEROKU_API_KEY={id}\n"), id, "secret-assignment");
        assert_redacted(
            &format!("The Heroku API key is {id}.\n"),
            id,
            "secret-assignment",
        );
        assert_clean(&format!("request_id: {id}\n"));
        assert_clean(&format!("REQUEST_KEY={id}\n"));
    }

    #[test]
    fn twilio_auth_token_after_its_account_sid() {
        let sid = format!("AC{}", rand(780, HEX, 32));
        let tok = rand(781, HEX, 32);
        assert_redacted(
            &format!("twilio client: Client(\"{sid}\", \"{tok}\")\n"),
            &tok,
            "twilio-auth-token",
        );
    }

    /// A token across the boundary of the scanner's blocks of hits.
    #[test]
    fn tokens_across_block_boundaries() {
        let block = 1 << 18;
        for (t, rule) in tokens().into_iter().take(12) {
            for shift in [1, 3, 7, t.len() / 2, t.len() - 1] {
                let pad = "x ".repeat((block - shift) / 2);
                let text = format!(
                    "{pad}{}{t} end",
                    if (block - shift) % 2 == 1 { " " } else { "" }
                );
                let out = redactor().redact(&text);
                assert!(
                    out.text.contains(&format!("[REDACTED:{rule}]"))
                        && !out.text.contains(&t[..12]),
                    "{rule} at shift {shift}"
                );
            }
        }
    }
}

mod prefixless {
    use super::*;

    #[test]
    fn credential_files() {
        let pw = "Wint3r-Falcon#88";
        assert_redacted(
            &format!("db.internal:5432:app:app_user:{pw}\n"),
            pw,
            "password-assignment",
        );
        assert_redacted(&format!("*:*:*:postgres:{pw}\n"), pw, "password-assignment");
        assert_redacted(
            &format!("machine api.example.com login deploy password {pw}\n"),
            pw,
            "password-assignment",
        );
        assert_redacted(
            &format!("[client]\nuser=root\npassword={pw}\n"),
            pw,
            "password-assignment",
        );
        let h = format!("$apr1${}${}", rand(790, ALNUM, 8), rand(791, ALNUM, 22));
        assert_redacted(&format!("admin:{h}\n"), &h, "password-hash");
        let h = format!("$2y$10${}", rand(792, ALNUM, 53));
        assert_redacted(&format!("ops:{h}\n"), &h, "password-hash");
        assert_clean("listen 127.0.0.1:5432: ok\nport range :*: none\n");
    }

    #[test]
    fn command_line_flags() {
        for (cmd, pw) in [
            (
                "mongosh --username admin -p Vx9-q2Lm8 --host mongo",
                "Vx9-q2Lm8",
            ),
            ("sshpass -p 'Rr7&kk2Zt' ssh admin@10.0.0.12", "Rr7&kk2Zt"),
            ("redis-cli -h cache -a Ka8sdQ2mZ ping", "Ka8sdQ2mZ"),
            (
                "pg_dump --password XciLjeAHJZEYV -h db app",
                "XciLjeAHJZEYV",
            ),
            (
                "docker login -u ci --password L3xw&WUO0885 registry.example.com",
                "L3xw&WUO0885",
            ),
        ] {
            assert_redacted(&format!("$ {cmd}\n"), pw, "password-assignment");
        }
        assert_clean("mongosh -p 27017 --host mongo\nssh -p 2222 host\nredis-cli -a\n");
    }

    #[test]
    fn connection_strings_and_mixed_case_keys() {
        assert_redacted(
            "Server=sql01;Database=Shop;User Id=shop;Password=NdzBAGYopHjth;\n",
            "NdzBAGYopHjth",
            "password-assignment",
        );
        assert_redacted(
            "{\"Default\": \"Server=sql01;User Id=shop;Password=NdzBAGYopHjth;\"}\n",
            "NdzBAGYopHjth",
            "password-assignment",
        );
        assert_redacted(
            "PassWord=7pZQ#lQUct56\n",
            "7pZQ#lQUct56",
            "password-assignment",
        );
        assert_redacted(
            "  \"password\": \"WGXN%djaDM44\",\n",
            "WGXN%djaDM44",
            "password-assignment",
        );
        assert_redacted(
            "jdbc:postgresql://db:5432/app?user=app&password=Qz81mmPwx&ssl=true\n",
            "Qz81mmPwx",
            "password-assignment",
        );
    }

    #[test]
    fn passwords_in_sentences() {
        for (text, pw) in [
            (
                "Use orange7973! as the password for the admin account.",
                "orange7973!",
            ),
            (
                "Note to self: the root password is now river75@.",
                "river75@.",
            ),
            (
                "The database password is fL10&iYZoP45 (rotate in May).",
                "fL10&iYZoP45",
            ),
            (
                "the wifi password changed to Gr33n-T3a-42 yesterday",
                "Gr33n-T3a-42",
            ),
        ] {
            assert_redacted(text, pw, "password-assignment");
        }
        assert_clean("Use the password manager as the source of truth.");
        assert_clean("We use it as the password reset flow.");
    }

    #[test]
    fn totp_seeds() {
        let seed = rand(800, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 32);
        assert_redacted(
            &format!("otpauth://totp/Acme:ada@acme.io?secret={seed}&issuer=Acme\n"),
            &seed,
            "totp-seed",
        );
        assert_redacted(
            &format!("2FA seed for the root account is {seed}\n"),
            &seed,
            "totp-seed",
        );
        let spaced = seed
            .as_bytes()
            .chunks(4)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect::<Vec<_>>()
            .join(" ");
        assert_redacted(&format!("MFA secret key: {spaced}\n"), &spaced, "totp-seed");
        assert_clean("TOTP codes are six digits; MFA IS REQUIRED FOR THE ADMIN ROLE.");
    }

    #[test]
    fn bare_ssn_next_to_its_name() {
        assert_redacted("SSN: 203267001\n", "203267001", "us-ssn");
        assert_redacted("social security no. 456123789\n", "456123789", "us-ssn");
        assert_clean("invoice 203267001 paid\n");
        assert_clean("SSN: 000123456\n");
    }
}

// ------------------------------------------------------------------ keys and tokens

mod keys {
    use super::*;

    fn block(label: &str, seed: u64) -> String {
        format!(
            "-----BEGIN {label}-----\n{}\n{}==\n-----END {label}-----",
            pem_body(seed, 5),
            rand(seed + 99, B64, 22)
        )
    }

    #[test]
    fn pem_blocks_of_every_kind() {
        for (i, label) in [
            "RSA PRIVATE KEY",
            "EC PRIVATE KEY",
            "DSA PRIVATE KEY",
            "PRIVATE KEY",
            "ENCRYPTED PRIVATE KEY",
            "OPENSSH PRIVATE KEY",
            "PGP PRIVATE KEY BLOCK",
        ]
        .iter()
        .enumerate()
        {
            let b = block(label, 400 + 10 * i as u64);
            assert_redacted(
                &format!("Key for the box:\n{b}\nDo not share.\n"),
                &b,
                "private-key",
            );
        }
    }

    #[test]
    fn pem_with_headers_indentation_and_one_line() {
        let b = format!(
            "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,{}\n\n{}\n-----END RSA PRIVATE KEY-----",
            rand(480, HEX, 32).to_uppercase(),
            pem_body(481, 4)
        );
        assert_redacted(&format!("{b}\n"), &b, "private-key");
        let indented = format!(
            "tls:\n  key: |\n    {}\n",
            block("EC PRIVATE KEY", 482).replace('\n', "\n    ")
        );
        let secret = block("EC PRIVATE KEY", 482).replace('\n', "\n    ");
        assert_redacted(&indented, &secret, "private-key");
        let one_line = block("OPENSSH PRIVATE KEY", 483).replace('\n', " ");
        assert_redacted(&format!("pasted: {one_line} end"), &one_line, "private-key");
    }

    #[test]
    fn truncated_block_is_redacted_to_its_last_line() {
        let body = pem_body(490, 3);
        let b = format!("-----BEGIN OPENSSH PRIVATE KEY-----\n{body}");
        assert_redacted(
            &format!("{b}\n\n(the rest got cut off)\n"),
            &b,
            "private-key",
        );
    }

    /// A key body whose `BEGIN` line was cut off: the base64 lines before
    /// the `END` line are the key (they were stored as they were).
    #[test]
    fn a_key_body_with_only_its_end_line_is_redacted() {
        let body = pem_body(495, 5);
        let b = format!("{body}\n-----END RSA PRIVATE KEY-----");
        assert_redacted(
            &format!("the rest of the key:\n{b}\nthanks\n"),
            &b,
            "private-key",
        );
        let quoted = format!(
            "> {}\n> -----END PRIVATE KEY-----",
            pem_body(496, 3).replace('\n', "\n> ")
        );
        assert_redacted(&format!("{quoted}\n"), &quoted, "private-key");
        // A short last line: what a 64-column body leaves, and PGP's
        // checksum line.
        let b = format!(
            "{}\nAB12Cd==\n-----END RSA PRIVATE KEY-----",
            pem_body(498, 3)
        );
        assert_redacted(&format!("{b}\n"), &b, "private-key");
        let b = format!(
            "{}\n=Xy3K\n-----END PGP PRIVATE KEY BLOCK-----",
            pem_body(499, 3)
        );
        assert_redacted(&format!("{b}\n"), &b, "private-key");
        assert_clean(&format!(
            "{}\n-----END CERTIFICATE-----\n",
            pem_body(497, 3)
        ));
        assert_clean("It ends at the line\n-----END RSA PRIVATE KEY-----\nand nothing before.\n");
    }

    #[test]
    fn putty_key_file() {
        let ppk = format!(
            "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: eddsa-key-20240101\nPublic-Lines: 2\n{}\n{}\nPrivate-Lines: 1\n{}\nPrivate-MAC: {}",
            rand(500, B64, 64),
            rand(501, B64, 4),
            rand(502, B64, 44),
            rand(503, HEX, 64)
        );
        assert_redacted(&format!("my ppk:\n{ppk}\nthanks\n"), &ppk, "private-key");
    }

    #[test]
    fn pem_lookalikes() {
        assert_clean(
            "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUQ0x1\n-----END CERTIFICATE-----",
        );
        assert_clean(
            "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----",
        );
        assert_clean("-----BEGIN RSA PRIVATE KEY-----\n...\n-----END RSA PRIVATE KEY-----");
        assert_clean("Paste it between -----BEGIN PRIVATE KEY----- and the END line.");
        assert_clean("BEGIN TRANSACTION; COMMIT;");
    }

    #[test]
    fn jwt_with_signature() {
        let t = jwt(510);
        assert_redacted(&format!("Authorization header was Bearer {t}\n"), &t, "jwt");
        let t = jwt(511);
        assert_redacted(&format!("id_token={t}&state=xyz"), &t, "jwt");
        let t = jwt(512);
        assert_redacted(&format!("{{\"token\": \"{t}\"}}"), &t, "jwt");
    }

    #[test]
    fn jwt_lookalikes() {
        assert_clean("eyJhbGciOi is how a JWT starts; eyJ alone is nothing.");
        let not_json = format!(
            "{}.{}.{}",
            rand(513, ALNUM, 20),
            rand(514, ALNUM, 20),
            rand(515, ALNUM, 20)
        );
        assert_clean(&format!("eyJ{not_json}"));
    }

    #[test]
    fn age_secret_key() {
        let k = age_key(520);
        assert_redacted(
            &format!("# created: 2024-01-01\n# public key: age1abc\n{k}\n"),
            &k,
            "age-secret-key",
        );
        let mut bad = k.into_bytes();
        let last = bad.len() - 1;
        bad[last] = if bad[last] == b'Q' { b'P' } else { b'Q' };
        assert_clean(&String::from_utf8(bad).unwrap());
    }
}

// ------------------------------------------------------------------ credentials in text

mod credentials {
    use super::*;

    /// memvault's own session labels (`s-` and 16 hex digits), as
    /// `resume` and `history` name them, are not session tokens; a token
    /// after `session` still is.
    #[test]
    fn memvault_session_labels_are_kept() {
        for text in [
            "Continued from session s-9b77d6eb7428f416.\n",
            "session: s-c62e623d6ac6a026\n",
            "undone: Session s-0123456789abcdef, 3 changes\n",
        ] {
            assert_clean(text);
        }
        let t = rand(610, ALNUM, 32);
        assert_redacted(&format!("SESSION_SECRET={t}\n"), &t, "secret-assignment");
        let t = format!("s-{}", rand(611, "0123456789abcdef", 20));
        assert_redacted(&format!("session_token = {t}\n"), &t, "secret-assignment");
    }

    #[test]
    fn url_passwords() {
        let p = rand(600, ALNUM, 16);
        let input = format!("DATABASE_URL=postgres://app:{p}@db.internal:5432/notes");
        assert_redacted(&input, &p, "url-credentials");
        assert_eq!(
            redactor().redact(&input).text,
            "DATABASE_URL=postgres://app:[REDACTED:url-credentials]@db.internal:5432/notes"
        );
        let out = redactor().redact("connect to postgres://user:pass@host/db");
        assert_eq!(
            out.text,
            "connect to postgres://user:[REDACTED:url-credentials]@host/db"
        );
        let p = format!("{}@{}", rand(601, ALNUM, 8), rand(602, ALNUM, 8));
        assert_redacted(
            &format!("mongodb+srv://admin:{p}@cluster0.example.net/"),
            &p,
            "url-credentials",
        );
        let p = rand(603, ALNUM, 20);
        assert_redacted(
            &format!("curl https://bob:{p}@api.example.com/v1/me"),
            &p,
            "url-credentials",
        );
        assert_redacted(&format!("redis://:{p}@cache:6379/0"), &p, "url-credentials");
    }

    #[test]
    fn url_lookalikes() {
        assert_clean("postgres://app@db.internal:5432/notes and https://example.com:8443/path");
        assert_clean("postgres://app:${DB_PASSWORD}@db/notes");
        assert_clean("postgres://app:<password>@db/notes");
        assert_clean("mysql://root:****@localhost/test");
        assert_clean("ssh://git@github.com/org/repo.git");
    }

    #[test]
    fn password_assignments() {
        let cases = [
            ("DB_PASSWORD=", "Tr0ub4dor&3x", "\n"),
            ("password: ", "hunter2-Blue", "\n"),
            ("  \"password\": \"", "c0rrect-h0rse", "\",\n"),
            ("password = \"", "s3cret!pass", "\"\n"),
            ("export PGPASSWORD='", "Pg_pass_2024", "'\n"),
            ("The wifi password is ", "Gr33nTea!42", " for guests.\n"),
            ("mysql --password ", "RootPw_991", " -h db\n"),
            ("<password>", "xml-Secret-77", "</password>\n"),
            ("smtp:\n  pass: ", "mail2024pw!", "\n"),
            ("dbPassword := \"", "G0lang#pw", "\"\n"),
            (
                "env:\n- name: DB_PASSWORD\n  value: \"",
                "k8s-Pa55word",
                "\"\n",
            ),
            ("Server=db;Uid=app;Pwd=", "Abc!2345x", ";\n"),
            ("spring.datasource.password=", "S3cr3tSpr1ng!", "\n"),
            ("DB_PASSWORD=", "sunshinemeadow", "\n"),
        ];
        for (pre, secret, post) in cases {
            let input = format!("{pre}{secret}{post}");
            assert_redacted(&input, secret, "password-assignment");
            assert!(
                redactor()
                    .redact(&input)
                    .text
                    .starts_with(pre.trim_end_matches(['"', '\'', ' '])),
                "{input}"
            );
        }
    }

    #[test]
    fn secret_assignments() {
        let cases = [
            ("API_KEY=", rand(610, ALNUM, 32), ""),
            ("api_key: \"", rand(611, HEX, 32), "\""),
            ("client_secret = \"", rand(612, B64URL, 40), "\""),
            ("{\"access_token\": \"", rand(613, B64URL, 48), "\"}"),
            ("Authorization: Bearer ", rand(614, B64URL, 40), ""),
            (
                "Authorization: Basic ",
                b64_encode(b"admin:Sup3rSecret!", B64, true),
                "",
            ),
            ("x-api-key: ", rand(615, ALNUM, 40), ""),
            ("SECRET_KEY_BASE=", rand(616, HEX, 64), ""),
            ("The API key for staging is ", rand(617, ALNUM, 32), "."),
            ("OPENWEATHER_KEY=", rand(618, HEX, 32), ""),
            ("apiKey: '", rand(619, ALNUM, 24), "',"),
            (
                "<add key=\"ApiKey\" value=\"",
                rand(620, ALNUM, 32),
                "\" />",
            ),
            (
                "SECRET_KEY = '",
                "django-insecure-9x!@k2#m$p7&q*w3e(r)t5y".to_owned(),
                "'",
            ),
        ];
        for (pre, secret, post) in cases {
            let input = format!("{pre}{secret}{post}\n");
            // Base64 `user:password` is named for what it is.
            let rule = if pre.ends_with("Basic ") {
                "basic-auth-credentials"
            } else {
                "secret-assignment"
            };
            assert_redacted(&input, &secret, rule);
        }
    }

    /// Chosen passwords hold punctuation anywhere: inside a dotted or
    /// `=`-holding value, at its start, as brackets that do not pair, a
    /// `;` in an env line; random letters are no camelCase name; a secret
    /// in markdown bold, a PHP `define`, a UUID or a `0x` key under a
    /// secret's name.
    #[test]
    fn short_and_foreign_password_keys_and_more_sentence_forms() {
        for (input, secret) in [
            ("pw=Kiwi-Banana-42\n", "Kiwi-Banana-42"),
            ("DB_PW: Kiwi-Banana-42\n", "Kiwi-Banana-42"),
            ("root_pw=Kiwi-Banana-42\n", "Kiwi-Banana-42"),
            ("psk=Kiwi-Banana-42\n", "Kiwi-Banana-42"),
            (
                "Das WLAN-Passwort ist Sonnenblume!2026\n",
                "Sonnenblume!2026",
            ),
            ("wachtwoord: Tulp3nVeld!\n", "Tulp3nVeld!"),
            ("Kennwort: Sonnenblume!2026\n", "Sonnenblume!2026"),
            ("Le mot de passe est Fromage-Bleu-33\n", "Fromage-Bleu-33"),
            ("senha: Saudade2026!\n", "Saudade2026!"),
            (
                "I changed the password to Orchid#77lake yesterday\n",
                "Orchid#77lake",
            ),
            ("Password (prod): Orchid#77lake\n", "Orchid#77lake"),
            (
                "master password (1password): Ocean-Forest-Piano-77\n",
                "Ocean-Forest-Piano-77",
            ),
            ("password -> Orchid#77lake\n", "Orchid#77lake"),
            ("PASSWORD ?= Mak3file!pw\n", "Mak3file!pw"),
        ] {
            assert_redacted(input, secret, "password-assignment");
        }
        // A value longer than 1,024 characters is still one value.
        let long = rand(
            7,
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
            3000,
        );
        assert_redacted(&format!("password={long}\n"), &long, "password-assignment");
        for clean in [
            "the pw is weak\n",
            "send it to me, pw protected\n",
            "the password to the server is in the vault\n",
            "x += 1\n",
            "Kennwort vergessen? Hilfe gibt es hier.\n",
        ] {
            assert_clean(clean);
        }
    }

    #[test]
    fn passwords_with_punctuation_and_other_written_forms() {
        let cases = [
            (
                "DB_PASSWORD=",
                "Xk9mQ2.vL8Zr4Tq",
                "\n",
                "password-assignment",
            ),
            (
                "\"password\": \"",
                "Xk9mQ2.vL8Zr4Tq",
                "\"\n",
                "password-assignment",
            ),
            (
                "DB_PASSWORD=",
                "L1smg67)4cLT3g",
                "\n",
                "password-assignment",
            ),
            (
                "DB_PASSWORD=",
                "L1smg67]4cLT3g",
                "\n",
                "password-assignment",
            ),
            (
                "DB_PASSWORD=",
                "L1smg67=4cLT3g",
                "\n",
                "password-assignment",
            ),
            (
                "DB_PASSWORD=",
                "!L1smg67^4cLT3g",
                "\n",
                "password-assignment",
            ),
            (
                "DB_PASSWORD=",
                "L1smg67;4cLT3g",
                "\n",
                "password-assignment",
            ),
            (
                "password: \"",
                "&kt4t2mDs4LNVXBb",
                "\"\n",
                "password-assignment",
            ),
            (
                "password: \"",
                "{whGcTZc)1UW-b5f",
                "\"\n",
                "password-assignment",
            ),
            (
                "password: \"",
                "a28M<2P77myt@ujV",
                "\"\n",
                "password-assignment",
            ),
            (
                "password=",
                "Xk9mQ2vL8Zr4Tq.md",
                "\n",
                "password-assignment",
            ),
            (
                "DB_PASSWORD=",
                "hNgVpqCzGdWmPyag",
                "\n",
                "password-assignment",
            ),
            (
                "**Password**: ",
                "t3IF5uFtd7Kkv7vg",
                "\n",
                "password-assignment",
            ),
            (
                "**Password:** ",
                "t3IF5uFtd7Kkv7vg",
                "\n",
                "password-assignment",
            ),
            (
                "define('DB_PASSWORD', '",
                "kTdfkgLBLQ9k6MP6sm6M7",
                "');\n",
                "password-assignment",
            ),
            (
                "SECRET_KEY='",
                "zv1m1r2hf=um8d3t",
                "'\n",
                "secret-assignment",
            ),
            (
                "SECRET_KEY = '",
                "5eslh)m=^u6t!)uthk9v4el65!=c-69^82k#0&40(9%b#$b=o=",
                "'\n",
                "secret-assignment",
            ),
            (
                "NPM_TOKEN=",
                "c7e209c5-7481-4238-a969-0d7023083576",
                "\n",
                "secret-assignment",
            ),
            (
                "ETH_PRIVATE_KEY=",
                "0xedb702d544922b62edb5d029b98ed6f0428eece128da0e4c955f4878d4637d13",
                "\n",
                "secret-assignment",
            ),
        ];
        for (pre, secret, post, rule) in cases {
            assert_redacted(&format!("{pre}{secret}{post}"), secret, rule);
        }
        // A `;` that starts the next field still ends the value.
        let out = redactor()
            .redact("Server=db;Uid=app;Pwd=Abc!2345x;Database=prod\n")
            .text;
        assert!(out.ends_with(";Database=prod\n"), "{out}");
    }

    #[test]
    fn assignment_lookalikes() {
        for text in [
            "password: ${DB_PASSWORD}",
            "password = os.environ[\"DB_PASSWORD\"]",
            "password: <your-password>",
            "password: \"changeme\"",
            "password: xxxxxxxx",
            "password: ********",
            "PASSWORD=",
            "password is required and must be 12 characters",
            "Forgot password? Click reset.",
            "password_hint: your pet's name",
            "password_min_length: 12",
            "the password is stored in Vault under prod/db",
            "api_key: YOUR_API_KEY_HERE",
            "api_key = settings.API_KEY",
            "api_key: str = Field(..., description=\"key\")",
            "token: null",
            "token_type: bearer",
            "max_tokens: 4096",
            "next_page_token: CiAKGjBpNDd2Nmp2Zml2cXRwYjBpOXA0ZjhobXIQAQ",
            "secret_name: prod-db-credentials",
            "primary key: id",
            "The key insight is that caching helps.",
            "public_key: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx5dGVzdGtleWJvZHk",
            "Authorization: Bearer $TOKEN",
            "Authorization: Bearer <token>",
            "export PATH=$PATH:$PWD/bin",
            "passport number is on file",
            "token expired yesterday; the secret is to retry",
            "keyboard: us-intl",
            "credentials_file: ~/.aws/credentials",
            "commit 9fceb02d0ae598e95dc970b74767f19372d61af8 changed the token parser",
            "GITHUB_TOKEN: ${{ secrets.GITHUB_TOKEN }}",
            "api_key = getenv(\"API_KEY\")",
            "password: !vault |",
            "SECRET_KEY=[REDACTED:secret-assignment]",
            "API key rotation: 2024-05-01T00:00:00Z",
            "REQUEST_ID_KEY=01234567-89ab-4def-8123-456789abcdef",
            "please pass async_req=True to the call",
            "USER_PASSWORD_AUTH = \"USER_PASSWORD_AUTH\"",
            "self.passwd = password_mgr",
            "self._passphrase = passphrase",
            "proxy_password=self._socks_options[\"password\"],",
            "credentials: Optional[ga_credentials.Credentials] = None,",
            "let paren_token = parenthesized!(content in input);",
            "pub const DEVCONF_STABLE_SECRET: _bindgen_ty_3 = _bindgen_ty_3::DEVCONF_STABLE_SECRET;",
            "    \"AWS::SecretsManager::Secret\": \"c85175a4ebcce361\",",
            "--targets \"Key=instanceids,Values=i-1234567890abcdef0\"",
            "'automount_service_account_token': 'automountServiceAccountToken'",
            "//registry.example.com/:_authToken=MYTOKEN2",
            "--seed-phrase-reference-secret=projects/my-project/secrets/my-seed-phrase",
            "m = re.match(r\"^projects/(?P<project>.+?)/secrets/(?P<secret>.+?)/versions\")",
            "format!(\"ANTHROPIC_API_KEY=sk-ant-api03-{}\\n\", body)",
            "secretsTarget = _messages.MessageField('GooglePrivacyDlpV2SecretsDiscoveryTarget', 5)",
            "crypto_key: Base64-encoded string of a CSEK, or the name of a KMS key",
            "if key == 'kerberos-5p-read-only':",
            "key=usage_text.GetArgSortKey)[0],",
            "loader = get_loader(token_filename=\"not_exists_file_1123\")",
            "CREDENTIALS_FROM_PASSWORD_STORES: T1555",
            "Utilities to get a password and/or the current user name.",
            "DEVSTAT_TYPE_PASS = 0x100,",
            "make_cert('localhost-ecc', key='param:secp384r1.pem')",
            "(key = 'ExistingLabelKey1', value = 'ExistingLabelValue1')",
            "key: PKCS12PrivateKeyTypes | None,",
            "oauth2ClientCredentialsConfig: Oauth2.0 Client Credentials.",
            "Example key: zones/us-central1-a",
            "passwd anonymous@",
            "    password: SafeString,",
            "\"dataStorePassword\": \"dataStoreTestQuery\",",
            "password_changed_at: 2024-05-01T10:00:00Z",
            "secret: 10.0.0.5",
            "token_owner: ops@example.com",
            "api_key: ops-team@example.com",
            "password = self.db.password",
            "password = db_config.password2",
            "password: !vault |",
            "password: &default_password",
            "password: *.example.com",
            "password = tokens[0]",
            "x = d.get('password', 'default')",
            "os.getenv(\"API_KEY\", \"dev-key\")",
            "password: ChallengePassword",
            "color_key: 0xdeadbeef",
            "client_id: 01234567-89ab-4def-8123-456789abcdef",
            "password: <db password>",
            "S3 object key 3f9a1c2e7b4d8e6f0a1b2c3d4e5f6a7b",
            "Primary key: 3f9a1c2e7b4d8e6f0a1b2c3d",
            "cache key: v1-deps-222f828767efc2f91624a8940f1f836f99eee369",
        ] {
            assert_clean(text);
        }
    }
}

mod command_lines {
    use super::*;

    #[test]
    fn passwords_on_command_lines() {
        assert_redacted(
            "mysql -u root -pMyS3cretPw! -h db\n",
            "MyS3cretPw!",
            "password-assignment",
        );
        assert_redacted(
            "curl -u admin:Adm1nP4ss! https://ci.internal/api\n",
            "Adm1nP4ss!",
            "password-assignment",
        );
        assert_redacted(
            "curl --user 'deploy:Zx8-qq-41b' https://x.example\n",
            "Zx8-qq-41b",
            "password-assignment",
        );
        assert_redacted(
            "session cookie: sessionid=8f14e45fceea167a5a36dedd4bea2543; path=/",
            "8f14e45fceea167a5a36dedd4bea2543",
            "session-cookie",
        );
    }

    #[test]
    fn command_line_lookalikes() {
        assert_clean("mkdir -p build && docker run -p 8080:80 nginx");
        assert_clean("mysql -u root -p -h localhost   # prompts for the password");
        assert_clean("curl -u \"$USER:$TOKEN\" https://api.example.com");
        assert_clean("curl -X POST -d @body.json https://api.example.com/v1/items");
        assert_clean("session_timeout: 3600, session_name: sid");
    }

    #[test]
    fn passphrases_in_config() {
        assert_redacted(
            "password: \"correct horse battery staple\"\n",
            "correct horse battery staple",
            "password-assignment",
        );
        assert_clean("  \"password\": \"must be at least 8 characters\",");
        assert_clean("\"password\": \"The user password\"");
    }

    #[test]
    fn base64_encoded_key_block() {
        let pem = format!(
            "-----BEGIN RSA PRIVATE KEY-----\n{}\n-----END RSA PRIVATE KEY-----\n",
            pem_body(950, 3)
        );
        let enc = b64_encode(pem.as_bytes(), B64, true);
        assert_redacted(
            &format!("users:\n- name: admin\n  user:\n    client-key-data: {enc}\n"),
            &enc,
            "private-key",
        );
        let cert = b64_encode(
            b"-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUQ0x1\n-----END CERTIFICATE-----\n",
            B64,
            true,
        );
        assert_clean(&format!("    client-certificate-data: {cert}"));
    }
}

mod realistic {
    use super::*;

    #[test]
    fn a_deploy_note() {
        let pw = rand(960, ALNUM, 14);
        let key = format!("AKIA{}", rand(961, UPPER_DIGITS, 16));
        let secret = rand(962, B64, 40);
        let note = format!(
            "# Deploy checklist (2024-05-02)\n\n\
             1. Bump the version in `Cargo.toml` to 1.4.2 and tag it.\n\
             2. Staging DB: `postgres://deploy:{pw}@staging-db.internal:5432/app`\n\
             3. CI needs these (ask Priya if they expire):\n\
             ```\nAWS_ACCESS_KEY_ID={key}\nAWS_SECRET_ACCESS_KEY={secret}\nAWS_REGION=eu-west-1\n```\n\
             4. Ping #releases when done. The key thing is to run the smoke tests first.\n"
        );
        let out = redactor().redact(&note);
        let expected = "# Deploy checklist (2024-05-02)\n\n\
             1. Bump the version in `Cargo.toml` to 1.4.2 and tag it.\n\
             2. Staging DB: `postgres://deploy:[REDACTED:url-credentials]@staging-db.internal:5432/app`\n\
             3. CI needs these (ask Priya if they expire):\n\
             ```\nAWS_ACCESS_KEY_ID=[REDACTED:aws-access-key-id]\nAWS_SECRET_ACCESS_KEY=[REDACTED:aws-secret-access-key]\nAWS_REGION=eu-west-1\n```\n\
             4. Ping #releases when done. The key thing is to run the smoke tests first.\n";
        assert_eq!(out.text, expected);
        assert_eq!(
            out.findings.iter().map(|f| f.line).collect::<Vec<_>>(),
            vec![4, 7, 8]
        );
        record(&note);
    }

    #[test]
    fn a_user_preferences_note_stays_as_is() {
        assert_clean(
            "<user_preferences>\n- Prefers TypeScript over JavaScript; strict mode on\n- Uses a passkey, not a password, \
             for GitHub\n- Token budget per task: about 20k\n- Keyboard-driven: vim bindings everywhere\n- The secret \
             Santa exchange is on 12/19 (budget $30)\n- Phone ends in 4567; timezone UTC-5\n</user_preferences>\n",
        );
    }

    #[test]
    fn a_code_review_note_stays_as_is() {
        assert_clean(
            "## Review of PR #812 (auth middleware)\n\n```python\ndef login(username: str, password: str) -> Token:\n    \
             user = db.get_user(username)\n    if not verify(password, user.password_hash):\n        raise AuthError(\"bad \
             password\")\n    return issue_token(user, ttl=timedelta(minutes=15))\n```\n\nNotes: token TTL is fine; \
             the secret_key comes from settings.SECRET_KEY; api_key lookups use hash(api_key).\n\
             Commit 3f2a1bc9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3 addresses the review.\n",
        );
    }

    #[test]
    fn a_support_ticket_with_personal_data() {
        let note = "Customer: Dana R. (ticket 48213)\nCard ending 1111 was charged twice: 4111 1111 1111 1111.\n\
                    Refund to IBAN GB82 WEST 1234 5698 7654 32. SSN given by mistake: 536-22-8745.\n";
        let out = redactor().redact(note);
        assert_eq!(
            out.text,
            "Customer: Dana R. (ticket 48213)\nCard ending 1111 was charged twice: [REDACTED:credit-card].\n\
             Refund to IBAN [REDACTED:iban]. SSN given by mistake: [REDACTED:us-ssn].\n"
        );
        record(note);
    }
}

// ------------------------------------------------------------------ personal data

mod personal {
    use super::*;

    #[test]
    fn cards() {
        for (card, rule) in [
            ("4111 1111 1111 1111", "credit-card"),
            ("4111-1111-1111-1111", "credit-card"),
            ("4242424242424242", "credit-card"),
            ("5555 5555 5555 4444", "credit-card"),
            ("2223 0031 2200 3222", "credit-card"),
            ("3782 822463 10005", "credit-card"),
            ("3714-496353-98431", "credit-card"),
            ("6011 1111 1111 1117", "credit-card"),
        ] {
            assert_redacted(&format!("Card on file: {card}, exp 12/27.\n"), card, rule);
        }
    }

    #[test]
    fn card_lookalikes() {
        assert_clean("Card on file: 4111 1111 1111 1112 (typo)");
        assert_clean("order 1234 5678 9012 3456 shipped");
        assert_clean("pi is 3.14159265358979323846");
        assert_clean("timestamp 1716239022123 ms; phone +1 555-123-4567");
        assert_clean("uuid 550e8400-e29b-41d4-a716-446655440000");
        assert_clean("0000 0000 0000 0000");
        assert_clean("26 => (0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25)");
    }

    #[test]
    fn ssn() {
        assert_redacted("SSN: 123-45-6789\n", "123-45-6789", "us-ssn");
        assert_redacted("her ssn is 536-22-8745.", "536-22-8745", "us-ssn");
        assert_redacted("SSN 401 13 2468 on the form", "401 13 2468", "us-ssn");
        for bad in [
            "000-12-3456",
            "666-12-3456",
            "900-12-3456",
            "123-00-4567",
            "123-45-0000",
            "078-05-1120",
        ] {
            assert_clean(&format!("SSN: {bad}"));
        }
        assert_clean("date 2024-05-01, version 1-2-3, call 1-800-555-1234");
    }

    #[test]
    fn iban() {
        for iban in [
            "GB82 WEST 1234 5698 7654 32",
            "GB82WEST12345698765432",
            "DE89 3704 0044 0532 0130 00",
            "NL91 ABNA 0417 1643 00",
            "FR14 2004 1010 0505 0001 3M02 606",
            "BE68 5390 0754 7034",
        ] {
            assert_redacted(&format!("Pay to IBAN {iban} by Friday.\n"), iban, "iban");
            // Written all in lower case.
            let lower = iban.to_ascii_lowercase();
            assert_redacted(&format!("iban {lower}\n"), &lower, "iban");
        }
        assert_redacted(
            "IBAN: BE68 5390 0754 7034 THEN stop",
            "BE68 5390 0754 7034",
            "iban",
        );
    }

    #[test]
    fn iban_lookalikes() {
        assert_clean("IBAN GB82 WEST 1234 5698 7654 33 (check digits wrong)");
        assert_clean("ZZ12 3456 7890 1234 5678 is not a country");
        assert_clean("DE89 3704 0044 0532 0130 0 is too short");
        // Cases mixed within one: not an IBAN as written.
        assert_clean("gb82WEST12345698765432");
        assert_clean("Gb82 west 1234 5698 7654 32");
    }
}

// ------------------------------------------------------------------ held-out misses (session 32)

mod held_out {
    use super::*;

    #[test]
    fn passwords_named_in_other_languages() {
        for (text, secret) in [
            ("Пароль от сервера: Kx7#mQ2pLr9z", "Kx7#mQ2pLr9z"),
            ("数据库密码：Qw3rT#9zLp2x", "Qw3rT#9zLp2x"),
            ("管理画面のパスワードは Zt8!kLm3Qp2w です", "Zt8!kLm3Qp2w"),
            ("パスワード=d6wQmx@c5GkkM^2NE", "d6wQmx@c5GkkM^2NE"),
            ("Hasło do routera: Lp9#xQ2mZt7k", "Lp9#xQ2mZt7k"),
            ("Lösenordet är Vb4!nQ8zKp2m", "Vb4!nQ8zKp2m"),
            ("WiFi şifre: Mn5$pQ9xLz3k", "Mn5$pQ9xLz3k"),
            (
                "La password del router è ozYS6u+Fp0IEg+b3Q",
                "ozYS6u+Fp0IEg+b3Q",
            ),
            ("A senha do wifi é Quartzbzup2015#", "Quartzbzup2015#"),
            ("ŞİFRE: Kx7#mQ2pLr9z", "Kx7#mQ2pLr9z"),
            ("La password è: Tq4!zLm8Rw2x", "Tq4!zLm8Rw2x"),
            ("mat khau: Hb6$kQ1zLp9w", "Hb6$kQ1zLp9w"),
            ("Hasło: Zaq12wsxCde3", "Zaq12wsxCde3"),
        ] {
            assert_redacted(text, secret, "password-assignment");
        }
    }

    #[test]
    fn passwords_in_other_languages_lookalikes() {
        assert_clean("Пароль: смотрите в менеджере паролей");
        assert_clean("La password del router è scritta sul retro");
        assert_clean("パスワードは 管理者に聞いてください");
        assert_clean("Lösenordet är hemligt");
        // Where the password is kept is not the password.
        assert_clean("パスワード：1Passwordを参照");
        assert_clean("password: Bitwarden");
        assert_clean("Passwort: KeePassXC");
        // A value in the language's own script is prose, not a password.
        assert_clean("パスワードは8文字以上である必要があります。");
        assert_clean("密码：请联系管理员");
    }

    #[test]
    fn tokens_with_a_fixed_prefix() {
        let swarm = format!(
            "SWMTKN-1-{}-{}",
            rand(40, "abcdefghijklmnopqrstuvwxyz0123456789", 50),
            rand(41, "abcdefghijklmnopqrstuvwxyz0123456789", 25)
        );
        assert_redacted(
            &format!("docker swarm join --token {swarm} 10.0.0.5:2377"),
            &swarm,
            "docker-swarm-token",
        );
        let mmk = format!("{}_{}_mmk", rand(42, ALNUM, 6), rand(43, ALNUM, 29));
        assert_redacted(
            &format!("GeoIP license {mmk} (prod)"),
            &mmk,
            "maxmind-license-key",
        );
        let nsec = format!("nsec1{}", rand(44, "023456789acdefghjklmnpqrstuvwxyz", 58));
        assert_redacted(&format!("my nostr key: {nsec}"), &nsec, "nostr-secret-key");
        let paseto = format!("v4.local.{}", rand(45, B64URL, 120));
        assert_redacted(
            &format!("session {paseto} expires soon"),
            &paseto,
            "paseto-token",
        );
        let fernet = format!("gAAAAAB{}==", rand(46, B64URL, 90));
        assert_redacted(
            &format!("encrypted blob {fernet} in the db"),
            &fernet,
            "fernet-token",
        );
        assert_clean("v4.local. is the PASETO header for local tokens");
        assert_clean(
            "gAAAAABAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        );
    }

    #[test]
    fn chat_webhooks() {
        let uuid = "6f1c2b9e-4a7d-4e2b-9c1f-3d5e7a9b1c2d";
        for url in [
            format!("https://open.feishu.cn/open-apis/bot/v2/hook/{uuid}"),
            format!("https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key={uuid}"),
            format!(
                "https://maker.ifttt.com/trigger/door_open/with/key/{}",
                rand(47, ALNUM, 22)
            ),
            format!(
                "https://webexapis.com/v1/webhooks/incoming/{}",
                rand(48, ALNUM, 80)
            ),
            format!(
                "https://hook.eu1.make.com/{}",
                rand(49, "abcdefghijklmnopqrstuvwxyz0123456789", 32)
            ),
            format!(
                "https://hook.integromat.com/{}",
                rand(50, "abcdefghijklmnopqrstuvwxyz0123456789", 32)
            ),
            format!("https://qyapi.weixin.qq.com/cgi-bin/webhook/send?debug=1&key={uuid}"),
        ] {
            let out = redactor().redact(&format!("post alerts to {url} please"));
            assert!(
                out.text.contains("[REDACTED:chat-webhook]")
                    && !out.text.contains(&url[url.len() - 12..]),
                "{url}: {}",
                out.text
            );
        }
        assert_clean("see https://open.feishu.cn/open-apis/bot/v2/hook/ for the docs");
    }
}

// ------------------------------------------------------------------ left alone

mod left_alone {
    use super::*;

    #[test]
    fn hashes_ids_and_images() {
        assert_clean("request 123e4567-e89b-12d3-a456-426614174000 failed");
        assert_clean(
            "commit 9fceb02d0ae598e95dc970b74767f19372d61af8\nsha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        );
        assert_clean(
            "integrity sha512-z4PhNX7vuL3xVChQ1m2AB9Yg5AULVxXcg/SpIdNs6c5H0NE8XYXysP+DGNKHfuwvY7kxvUdBeoGlODJ6+SfaPg==",
        );
        let png = format!(
            "![chart](data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAA{}AKIA{}=)",
            rand(700, B64, 200),
            rand(701, UPPER_DIGITS, 16)
        );
        assert_clean(&png);
        assert_clean(&format!(
            "<img src=\"data:image/jpeg;base64,/9j/4AAQSkZJRg{}\">",
            rand(702, B64, 300)
        ));
    }

    #[test]
    fn placeholders() {
        for text in [
            "API_KEY=xxxx",
            "api_key: <your-key>",
            "token: ${VAR}",
            "OPENAI_API_KEY=your_api_key_here",
            "STRIPE_KEY=sk_live_...",
            "password: '...'",
            "secret: ''",
            "AWS_SECRET_ACCESS_KEY=<secret>",
            "ghp_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        ] {
            assert_clean(text);
        }
    }

    #[test]
    fn already_redacted_text() {
        for text in [
            "key [REDACTED:aws-access-key-id] and [REDACTED:private-key]",
            "password = [REDACTED:password-assignment]",
            "postgres://user:[REDACTED:url-credentials]@host/db",
            "Authorization: Bearer [REDACTED:jwt]",
        ] {
            assert_clean(text);
        }
    }

    #[test]
    fn prose_without_secrets() {
        assert_clean(
            "# Project notes\n\nThe user prefers dark mode. We passed the review on Monday; the key \
             decision was to keep tokens short-lived. Remember: secrets go in Vault, never in notes.\n\
             - pass the `--dry-run` flag first\n- the auth flow uses PKCE\n",
        );
    }
}

// ------------------------------------------------------------------ findings and API

mod api {
    use super::*;

    #[test]
    fn findings_have_positions_and_no_text() {
        let k = format!("AKIA{}", rand(800, UPPER_DIGITS, 16));
        let text = format!("première ligne\nclé: {k}\n");
        let f = redactor().scan(&text);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].rule, "aws-access-key-id");
        assert_eq!(&text[f[0].start..f[0].end], k);
        assert_eq!((f[0].line, f[0].column), (2, 6));
        let dbg = format!("{:?}", f[0]);
        assert!(!dbg.contains(&k[4..]), "Debug shows the secret: {dbg}");
    }

    #[test]
    fn overlapping_matches_merge() {
        let t = github_token("ghp_", 801);
        let text = format!("password = {t}\n");
        let f = redactor().scan(&text);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].rule, "github-token");
        assert_eq!(
            redactor().redact(&text).text,
            "password = [REDACTED:github-token]\n"
        );
    }

    #[test]
    fn kinds_are_sorted_and_counted() {
        let text = format!(
            "{} {} {}",
            jwt(802),
            format_args!("AKIA{}", rand(803, UPPER_DIGITS, 16)),
            jwt(804)
        );
        let out = redactor().redact(&text);
        assert_eq!(
            out.kinds(),
            vec![("aws-access-key-id".to_owned(), 1), ("jwt".to_owned(), 2)]
        );
    }

    #[test]
    fn clean_text_comes_back_unchanged() {
        let out = redactor().redact("nothing to see");
        assert_eq!(out.text, "nothing to see");
        assert!(out.findings.is_empty() && out.kinds().is_empty());
        assert!(redactor().redact("").findings.is_empty());
    }

    #[test]
    fn rule_ids_are_kebab_case_and_unique() {
        let ids = Redactor::rule_ids();
        assert!(ids.len() >= 35);
        for id in &ids {
            assert!(super::super::engine::valid_id(id), "{id}");
            assert_eq!(ids.iter().filter(|x| x == &id).count(), 1);
        }
        for needed in [
            "aws-access-key-id",
            "aws-secret-access-key",
            "google-api-key",
            "azure-storage-connection-string",
            "azure-sas-token",
            "github-token",
            "github-fine-grained-token",
            "gitlab-token",
            "npm-token",
            "pypi-token",
            "dockerhub-token",
            "huggingface-token",
            "slack-token",
            "slack-webhook-url",
            "discord-bot-token",
            "discord-webhook-url",
            "telegram-bot-token",
            "twilio-api-key",
            "sendgrid-api-key",
            "mailgun-api-key",
            "stripe-secret-key",
            "stripe-restricted-key",
            "shopify-token",
            "anthropic-api-key",
            "openai-api-key",
            "private-key",
            "jwt",
            "age-secret-key",
            "url-credentials",
            "password-assignment",
            "secret-assignment",
            "credit-card",
            "us-ssn",
            "iban",
        ] {
            assert!(ids.contains(&needed), "{needed}");
        }
    }

    #[test]
    fn redactor_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Redactor>();
    }
}

// ------------------------------------------------------------------ settings

mod settings {
    use super::*;

    fn custom(id: &str, regex: &str, keywords: &[&str]) -> CustomRule {
        CustomRule {
            id: id.into(),
            regex: regex.into(),
            keywords: keywords.iter().map(|s| (*s).into()).collect(),
        }
    }

    fn err(config: RedactConfig) -> String {
        Redactor::new(&config)
            .map(|_| ())
            .expect_err("settings should be refused")
            .to_string()
    }

    #[test]
    fn serde_defaults_and_modes() {
        let c: RedactConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(c, RedactConfig::default());
        assert_eq!(c.mode, Mode::Redact);
        let c: RedactConfig = serde_json::from_str(
            r#"{"mode":"reject","disabled":["iban"],"custom_rules":[{"id":"acme-token","regex":"acme_[a-z0-9]{20}"}]}"#,
        )
        .unwrap();
        assert_eq!(c.mode, Mode::Reject);
        assert!(c.custom_rules[0].keywords.is_empty());
        assert!(serde_json::from_str::<RedactConfig>(r#"{"mode":"loud"}"#).is_err());
        assert!(serde_json::from_str::<RedactConfig>(r#"{"modes":"off"}"#).is_err());
        assert_eq!(serde_json::to_string(&Mode::Off).unwrap(), "\"off\"");
    }

    #[test]
    fn invalid_settings_are_clear_errors() {
        let e = err(RedactConfig {
            disabled: vec!["aws-key".into()],
            ..Default::default()
        });
        assert!(
            e.contains("`disabled`") && e.contains("aws-key") && e.contains("aws-access-key-id"),
            "{e}"
        );
        let e = err(RedactConfig {
            custom_rules: vec![custom("", "x", &[])],
            ..Default::default()
        });
        assert!(
            e.contains("custom_rules[0].id") && e.contains("empty"),
            "{e}"
        );
        let e = err(RedactConfig {
            custom_rules: vec![custom("Bad_Id", "x", &[])],
            ..Default::default()
        });
        assert!(e.contains("kebab-case"), "{e}");
        let e = err(RedactConfig {
            custom_rules: vec![custom("jwt", "x", &[])],
            ..Default::default()
        });
        assert!(e.contains("built-in"), "{e}");
        let e = err(RedactConfig {
            custom_rules: vec![custom("a", "x", &[]), custom("a", "y", &[])],
            ..Default::default()
        });
        assert!(
            e.contains("custom_rules[1]") && e.contains("earlier custom rule"),
            "{e}"
        );
        let e = err(RedactConfig {
            custom_rules: vec![custom("bad-re", "(unclosed", &[])],
            ..Default::default()
        });
        assert!(
            e.contains("custom_rules[0].regex") && e.contains("bad-re"),
            "{e}"
        );
        let e = err(RedactConfig {
            custom_rules: vec![custom("empty", "a*", &[])],
            ..Default::default()
        });
        assert!(e.contains("empty string"), "{e}");
        let e = err(RedactConfig {
            custom_rules: vec![custom("kw", "a+", &[""])],
            ..Default::default()
        });
        assert!(e.contains("keywords"), "{e}");
    }

    #[test]
    fn disabled_rules_do_not_run() {
        let r = Redactor::new(&RedactConfig {
            disabled: vec!["jwt".into(), "iban".into()],
            ..Default::default()
        })
        .unwrap();
        let text = format!("{} GB82 WEST 1234 5698 7654 32", jwt(900));
        assert!(r.scan(&text).is_empty());
        assert_eq!(redactor().scan(&text).len(), 2);
    }

    #[test]
    fn custom_rules() {
        let r = Redactor::new(&RedactConfig {
            custom_rules: vec![
                custom("acme-token", r"\bacme_[a-z0-9]{20}\b", &[]),
                custom(
                    "internal-ticket-secret",
                    r"ticket-secret:\s*(?P<secret>[A-Z]{8})",
                    &["TICKET-SECRET"],
                ),
            ],
            ..Default::default()
        })
        .unwrap();
        let text = "use acme_abcdefghij0123456789 now\nticket-secret: ABCDEFGH\n";
        let out = r.redact(text);
        assert_eq!(
            out.text,
            "use [REDACTED:acme-token] now\nticket-secret: [REDACTED:internal-ticket-secret]\n"
        );
        assert_eq!(r.redact(&out.text).text, out.text);
        // Without its keyword on the line, the keyword rule does not run.
        assert!(r.scan("ABCDEFGH").is_empty());
    }

    #[test]
    fn modes() {
        let k = format!("AKIA{}", rand(901, UPPER_DIGITS, 16));
        let text = format!("key {k}");
        let reject = Redactor::new(&RedactConfig {
            mode: Mode::Reject,
            ..Default::default()
        })
        .unwrap();
        let e = reject.filter(&text).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("aws-access-key-id (1)") && !msg.contains(&k[4..]),
            "{msg}"
        );
        assert_eq!(
            e,
            RedactError::Rejected {
                kinds: vec![("aws-access-key-id".into(), 1)]
            }
        );
        assert_eq!(reject.filter("clean").unwrap().text, "clean");
        let off = Redactor::new(&RedactConfig {
            mode: Mode::Off,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(off.mode(), Mode::Off);
        assert_eq!(off.filter(&text).unwrap().text, text);
        assert_eq!(
            redactor().filter(&text).unwrap().text,
            "key [REDACTED:aws-access-key-id]"
        );
    }
}

// ------------------------------------------------------------------ properties

mod properties {
    use super::*;

    fn secrets(seed: u64) -> Vec<String> {
        vec![
            format!("AKIA{}", rand(seed, UPPER_DIGITS, 16)),
            github_token("ghp_", seed),
            jwt(seed),
            format!("sk-ant-api03-{}", rand(seed, B64URL, 90)),
            format!("password = \"{}\"", rand(seed, ALNUM, 14)),
            format!("api_key: {}", rand(seed, ALNUM, 32)),
            format!("postgres://u:{}@h/db", rand(seed, ALNUM, 12)),
            "4111 1111 1111 1111".into(),
            "GB82 WEST 1234 5698 7654 32".into(),
            "123-45-6789".into(),
            format!(
                "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----",
                pem_body(seed, 2)
            ),
            discord_token(seed),
            age_key(seed),
            format!("sk_live_{}", rand(seed, ALNUM, 30)),
        ]
    }

    const NOISE: &[&str] = &[
        " ",
        "\n",
        "the ",
        "key ",
        "token",
        "secret ",
        "pass",
        "=",
        ": ",
        "\"",
        "'",
        "-----",
        "BEGIN ",
        "AKIA",
        "ghp_",
        "sk-",
        "eyJ",
        "[REDACTED:jwt]",
        "[REDACTED:",
        "]",
        "://",
        "@",
        "4111 ",
        "12-",
        "é",
        "日本",
        "\t",
        "xxxx",
        "${VAR}",
        "Bearer ",
        "GB82 ",
        "0",
        "9",
        ";base64,",
        "-",
        "_",
        ".",
    ];

    /// Mixes secrets, noise and markers; checks idempotence and that the
    /// output grows by at most the markers' length.
    #[test]
    fn idempotent_and_bounded_on_random_mixes() {
        let mut rng = Rng::new(42);
        for case in 0..400u64 {
            let pool = secrets(case);
            let mut text = String::new();
            for _ in 0..rng.below(40) {
                match rng.below(4) {
                    0 => text.push_str(rng.pick(&pool).as_str()),
                    _ => text.push_str(rng.pick::<&str>(NOISE)),
                }
            }
            let out = redactor().redact(&text);
            let again = redactor().redact(&out.text);
            assert_eq!(again.text, out.text, "not idempotent on {text:?}");
            assert!(again.findings.is_empty());
            let markers: usize = out.findings.iter().map(|f| f.rule.len() + 11).sum();
            assert!(out.text.len() <= text.len() + markers);
            let mut prev_end = 0;
            for f in &out.findings {
                assert!(f.start >= prev_end && f.end > f.start && f.end <= text.len());
                assert!(text.is_char_boundary(f.start) && text.is_char_boundary(f.end));
                prev_end = f.end;
            }
        }
    }

    /// Every input used by the family tests, redacted twice.
    #[test]
    fn idempotent_on_all_test_inputs() {
        // Run the family tests' inputs here too so the check does not
        // depend on test order.
        let mut all: Vec<String> = inputs().lock().unwrap_or_else(|e| e.into_inner()).clone();
        for seed in 0..50 {
            all.extend(secrets(seed));
            all.push(secrets(seed).join(" and "));
            all.push(secrets(seed).join("\n"));
        }
        for text in all {
            let once = redactor().redact(&text).text;
            assert_eq!(
                redactor().redact(&once).text,
                once,
                "not idempotent on {text:?}"
            );
        }
    }

    /// Parsers stop at length caps; with multi-byte text at the cap the
    /// spans must still fall on character boundaries.
    #[test]
    fn caps_inside_multibyte_text() {
        let long = "日".repeat(400);
        for text in [
            format!("password={long}"),
            format!("password=x{long} tail"),
            format!(
                "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: {}\n{}\n",
                "é".repeat(150),
                pem_body(970, 2)
            ),
            format!("mysql -u root -p{long}"),
            format!("curl -u user:{}", "ß".repeat(300)),
            format!("<password>{}</password>", "é".repeat(600)),
            format!("postgres://u:{}@host", "é".repeat(200)),
            format!("api_key: \"{}\"", "日".repeat(500)),
        ] {
            let out = redactor().redact(&text);
            assert_eq!(redactor().redact(&out.text).text, out.text);
            for f in &out.findings {
                assert!(text.is_char_boundary(f.start) && text.is_char_boundary(f.end));
            }
        }
    }

    /// Random bytes and near-misses around every keyword never panic and
    /// always give char-aligned findings.
    #[test]
    fn no_panics_on_random_text() {
        let mut rng = Rng::new(7);
        let alphabet: Vec<char> = "aAkK01-_:=./+ \n\"'[]{}@éß日".chars().collect();
        for _ in 0..2000 {
            let len = rng.below(200);
            let mut s: String = (0..len).map(|_| *rng.pick(&alphabet)).collect();
            if rng.below(2) == 0 {
                let i = s
                    .char_indices()
                    .map(|(i, _)| i)
                    .nth(rng.below(len.max(1)))
                    .unwrap_or(0);
                s.insert_str(i, rng.pick::<&str>(NOISE));
            }
            let out = redactor().redact(&s);
            assert_eq!(redactor().redact(&out.text).text, out.text, "{s:?}");
        }
    }
}

// ------------------------------------------------------------------ adversarial

mod adversarial {
    use super::*;

    /// Every keyword (and some longer prefixes) repeated back to back: each
    /// parser and window must stay linear on its own worst case. Set
    /// `REPEAT_SIZE=10000000` to try 10 MB of each (in release: under half
    /// a second each).
    #[test]
    fn each_keyword_repeated_finishes() {
        let size: usize = std::env::var("REPEAT_SIZE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(50_000);
        let mut pieces: Vec<&str> = super::super::rules::SPECS
            .iter()
            .flat_map(|s| s.anchors.iter().copied())
            .collect();
        pieces.extend([
            "-----BEGIN RSA PRIVATE KEY-----",
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA",
            "----BEGIN RSA PRIVATE KEY----\n",
            "----- BEGIN RSA PRIVATE KEY-----\n",
            "-----BEGIN PRIVATE KEY-----\\\n",
            "password=",
            "password: \"",
            "key=\"ApiKey\" value=",
            "- name: DB_PASSWORD\n  value: ",
            "mysql -pX",
            "curl -u a:",
            "://a:b@",
            "eyJhbGciOiJIUzI1NiJ9.",
            "4111 ",
            "123-45-",
            "GB82 ",
            "[REDACTED:x]",
            "data:image/png;base64,",
            "sv=1&sig=",
            "the password is ",
            "use x9! as the password ",
            "1/1234567890123456/",
            "2/1234567890123456/1234567890123456:",
            "patAAAAAAAAAAAAAA.",
            "db:5432:a:b:",
            "dop_v1_",
            "a.b_c-d.",
            "otpauth://totp/x?secret=",
            "9",
            "a",
            "=",
        ]);
        for p in pieces {
            let text = p.repeat(size / p.len() + 1);
            let start = std::time::Instant::now();
            let out = redactor().redact(&text);
            assert_eq!(redactor().redact(&out.text).text, out.text, "{p:?}");
            let took = start.elapsed();
            if took.as_millis() > 50 {
                eprintln!("repeated {p:?}: {} bytes in {took:?}", text.len());
            }
        }
    }

    /// About 10 MB of key-shaped runs and partial prefixes. Not timed: it
    /// must simply finish (linear time; see the report for release timings).
    #[test]
    fn ten_megabytes_of_near_misses_finishes() {
        let mut rng = Rng::new(99);
        let prefixes = [
            "AKIA",
            "ghp_",
            "sk-",
            "sk-ant-",
            "-----BEGIN ",
            "-----BEGIN RSA PRIVATE KEY-----",
            "eyJ",
            "xoxb-",
            "SG.",
            "AIza",
            "password=",
            "key: ",
            "://a:",
            "4111 1111 ",
            "GB82 ",
            "[REDACTED:",
            "PuTTY-User-Key-File-2: ",
            ";base64,",
            "sig=",
            "AccountKey=",
            ":AA",
            "token ",
            "discord ",
            "secret ",
        ];
        let mut text = String::with_capacity(10_500_000);
        while text.len() < 10_000_000 {
            match rng.below(5) {
                0 => {
                    // A long run of key characters.
                    let n = 1000 + rng.below(200_000);
                    for _ in 0..n {
                        text.push(ALNUM.as_bytes()[rng.below(62)] as char);
                    }
                }
                1 => {
                    // Many prefixes glued together.
                    for _ in 0..rng.below(20_000) {
                        text.push_str(rng.pick::<&str>(&prefixes));
                    }
                }
                2 => {
                    for _ in 0..rng.below(50_000) {
                        text.push(*rng.pick(&['A', 'a', '0', '-', '_', '=', '/', '+', '.']));
                    }
                }
                3 => {
                    let p = *rng.pick(&prefixes);
                    for _ in 0..rng.below(10_000) {
                        text.push_str(p);
                        text.push_str(&rand(rng.next(), ALNUM, rng.below(60)));
                    }
                }
                _ => {
                    for _ in 0..rng.below(100_000) {
                        text.push(*rng.pick(&['1', ' ', '-', '4', '9']));
                    }
                }
            }
        }
        let start = std::time::Instant::now();
        let out = redactor().redact(&text);
        eprintln!(
            "adversarial: {} bytes, {} findings, {:?}",
            text.len(),
            out.findings.len(),
            start.elapsed()
        );
        assert!(
            out.text.len()
                <= text.len()
                    + out
                        .findings
                        .iter()
                        .map(|f| f.rule.len() + 11)
                        .sum::<usize>()
        );
    }
}

#[test]
fn compile_all_leaves_no_rule_to_compile_at_its_first_hit() {
    let r = Redactor::new(&RedactConfig::default()).unwrap();
    assert!(!r.engine.all_compiled(), "rules compile lazily by default");
    r.compile_all();
    assert!(r.engine.all_compiled());
}

// ------------------------------------------------------------------ recall round (session 28)

mod more_formats {
    use super::*;

    #[test]
    fn vendor_tokens_added_from_the_recall_corpus_are_found_in_prose_and_tables() {
        let cases = [
            (
                format!(
                    "tskey-auth-k{}CNTRL-{}",
                    rand(1, ALNUM, 16),
                    rand(2, ALNUM, 32)
                ),
                "tailscale-key",
            ),
            (
                format!("oy2{}", rand(3, "abcdefghijklmnopqrstuvwxyz0123456789", 43)),
                "nuget-api-key",
            ),
            (format!("cio{}", rand(4, ALNUM, 32)), "crates-io-token"),
            (
                format!("CCIPAT_{}_{}", rand(5, ALNUM, 22), rand(6, HEX, 40)),
                "circleci-token",
            ),
            (
                format!("ATBB{}", rand(7, ALNUM, 40)),
                "bitbucket-app-password",
            ),
            (format!("figd_{}", rand(8, ALNUM, 40)), "figma-token"),
            (format!("bkua_{}", rand(9, HEX, 40)), "buildkite-token"),
            (
                format!(
                    "napi_{}",
                    rand(10, "abcdefghijklmnopqrstuvwxyz0123456789", 64)
                ),
                "neon-api-key",
            ),
            (format!("rnd_{}", rand(11, ALNUM, 32)), "render-api-key"),
            (format!("AKID{}", rand(12, ALNUM, 32)), "tencent-secret-id"),
            (
                format!("1//0{}", rand(14, B64URL, 96)),
                "google-refresh-token",
            ),
            (
                format!(
                    "access-production-{}-{}-{}-{}-{}",
                    rand(15, HEX, 8),
                    rand(16, HEX, 4),
                    rand(17, HEX, 4),
                    rand(18, HEX, 4),
                    rand(19, HEX, 12)
                ),
                "plaid-token",
            ),
        ];
        for (t, rule) in &cases {
            assert_redacted(t, t, rule);
            assert_redacted(&format!("My key is {t} for the build."), t, rule);
            assert_redacted(&format!("| prod | `{t}` |"), t, rule);
            assert_redacted(&format!("os.environ[\"X\"] = \"{t}\""), t, rule);
        }
    }

    #[test]
    fn a_token_in_url_encoded_text_is_found() {
        let t = github_token("ghp_", 300);
        assert_redacted(
            &format!("payload=%7B%22token%22%3A%20%22{t}%22%7D"),
            &t,
            "github-token",
        );
    }

    #[test]
    fn a_telegram_token_in_its_api_url_is_found() {
        // Taken with the `bot` before it.
        let t = format!("5012345678:AA{}", rand(301, B64URL, 33));
        let out = redactor().redact(&format!("curl https://api.telegram.org/bot{t}/sendMessage"));
        assert_eq!(
            out.text,
            "curl https://api.telegram.org/[REDACTED:telegram-bot-token]/sendMessage"
        );
    }

    #[test]
    fn key_blocks_with_a_prefix_on_each_line_are_found_whole() {
        let body = pem_body(302, 8);
        for (pre, post) in [
            ("# ", ""),
            ("> ", ""),
            ("// ", ""),
            (" * ", ""),
            ("; ", ""),
            ("| ", ""),
            ("\"", "\\n\" +"),
        ] {
            let mut text = format!("{pre}-----BEGIN OPENSSH PRIVATE KEY-----{post}\n");
            for line in body.lines() {
                text.push_str(&format!("{pre}{line}{post}\n"));
            }
            text.push_str(&format!("{pre}-----END OPENSSH PRIVATE KEY-----{post}\n"));
            let out = redactor().redact(&text);
            assert!(
                out.text.contains("[REDACTED:private-key]"),
                "{pre:?}: {}",
                out.text
            );
            for line in body.lines() {
                assert!(
                    !out.text.contains(line),
                    "{pre:?}: {line} survives in {}",
                    out.text
                );
            }
            assert!(!out.text.contains("BEGIN"), "{pre:?}: {}", out.text);
        }
        // Numbered lines, and a key escaped twice or written in XML.
        let mut numbered = String::new();
        let lines: Vec<String> = std::iter::once("-----BEGIN RSA PRIVATE KEY-----".to_string())
            .chain(body.lines().map(str::to_string))
            .chain(std::iter::once("-----END RSA PRIVATE KEY-----".to_string()))
            .collect();
        for (n, l) in lines.iter().enumerate() {
            numbered.push_str(&format!("{:>3} | {l}\n", n + 8));
        }
        for text in [
            numbered,
            format!("key: \"{}\"", lines.join("\\\\n")),
            format!("<k>{}</k>", lines.join("&#10;")),
        ] {
            let out = redactor().redact(&text);
            for line in body.lines() {
                assert!(!out.text.contains(line), "{line} survives in {}", out.text);
            }
        }
        // Prose after a commented key stays.
        let text = format!(
            "# -----BEGIN OPENSSH PRIVATE KEY-----\n# {}\n# -----END OPENSSH PRIVATE KEY-----\n# keep this line\n",
            body.lines().collect::<Vec<_>>().join("\n# ")
        );
        assert!(redactor().redact(&text).text.contains("# keep this line"));
    }

    #[test]
    fn a_url_password_with_a_raw_at_slash_or_hash_is_redacted_whole() {
        for (text, secret) in [
            ("postgres://app:p@ss/w0rd@db:5432/app", "p@ss/w0rd"),
            ("postgres://app:p#ss9Word@db:5432/app", "p#ss9Word"),
            ("mysql://root:Xy?9zQ2w@localhost/db", "Xy?9zQ2w"),
        ] {
            let out = redactor().redact(text);
            assert!(!out.text.contains(secret), "{text} -> {}", out.text);
            assert!(
                out.text.contains("[REDACTED:url-credentials]@"),
                "{}",
                out.text
            );
        }
        // A host with a dot after the first `@` keeps its path's `@`.
        assert_eq!(
            redactor()
                .redact("https://user:Secr3tW0rd@example.com/a@b")
                .text,
            "https://user:[REDACTED:url-credentials]@example.com/a@b"
        );
    }

    #[test]
    fn a_value_assigned_to_a_subscript_named_as_a_secret_is_found() {
        let v = rand(304, HEX, 32);
        assert_redacted(
            &format!("os.environ[\"DD_API_KEY\"] = \"{v}\""),
            &v,
            "secret-assignment",
        );
        assert_redacted(
            &format!("$_ENV['DB_PASSWORD'] = 'Zq8#mP2!vL9x{}';", &v[..4]),
            &format!("Zq8#mP2!vL9x{}", &v[..4]),
            "password-assignment",
        );
        assert_clean("x = d[\"api_key\"]\nprint(os.environ[\"API_KEY\"])\n");
    }

    #[test]
    fn passwords_given_to_more_commands_are_found() {
        let pw = format!("Zq8{}", rand(305, ALNUM, 10));
        for line in [
            format!("docker login -u deploy -p {pw} registry.example.com"),
            format!("docker login --password={pw}"),
            format!("sqlcmd -S db -U sa -P '{pw}'"),
            format!("ipmitool -I lanplus -H 10.0.0.5 -U admin -P {pw} chassis status"),
            format!("ldapsearch -x -D cn=admin -w {pw} -b dc=example"),
            format!("zip -P {pw} secret.zip a.txt"),
            format!("keytool -list -keystore k.jks -storepass {pw}"),
            format!("az login -u me@example.com -p {pw}"),
            format!("CREATE USER 'app'@'%' IDENTIFIED BY '{pw}';"),
            format!("SET PASSWORD FOR 'bob'@'localhost' = '{pw}';"),
            format!("set password for bob = PASSWORD('{pw}');"),
            format!("SET PASSWORD = '{pw}';"),
            format!("requirepass {pw}"),
            format!("masterauth \"{pw}\""),
        ] {
            assert_redacted(&line, &pw, "password-assignment");
        }
        assert_clean("docker run -p 8080:80 -p 127.0.0.1:9090:9090 nginx\nzip -r out.zip dir\n");
        assert_clean("ALTER USER app IDENTIFIED BY 'changeme';\n# requirepass foobared\n");
        assert_clean(
            "SET PASSWORD FOR bob = 'changeme';\nTo set password for an account, run SET PASSWORD.\n",
        );
    }

    #[test]
    fn an_openvpn_static_key_is_found_whole() {
        let hex = rand(303, HEX, 512);
        let mut text = "<tls-auth>\n-----BEGIN OpenVPN Static key V1-----\n".to_string();
        for i in 0..16 {
            text.push_str(&hex[i * 32..(i + 1) * 32]);
            text.push('\n');
        }
        text.push_str("-----END OpenVPN Static key V1-----\n</tls-auth>\n");
        let out = redactor().redact(&text);
        assert_eq!(
            out.text,
            "<tls-auth>\n[REDACTED:private-key]\n</tls-auth>\n"
        );
    }
}

/// Session 37's attack on the filter: forms of code and config it passed
/// over whole.
mod round_37 {
    use super::*;

    /// A key block each of whose lines is wrapped its own way in code
    /// (a string per line, a shell string's `\` line ends, a numbered
    /// list) is redacted whole, with or without its `END` line.
    #[test]
    fn key_blocks_wrapped_line_by_line_in_code() {
        let lines: Vec<String> = (0..6).map(|i| rand(3700 + i, B64, 64)).collect();
        let (b, e) = ("-----BEGIN PRIVATE KEY-----", "-----END PRIVATE KEY-----");
        let python = format!(
            "KEY = (\"{b}\\n\"\n{}       \"{e}\\n\")\n",
            lines
                .iter()
                .map(|l| format!("       \"{l}\\n\"\n"))
                .collect::<String>()
        );
        let kotlin = format!(
            "val k = \"{b}\\n\" +\n{}\"{e}\"\n",
            lines
                .iter()
                .map(|l| format!("\"{l}\\n\" +\n"))
                .collect::<String>()
        );
        let shell = format!("KEY=\"{b}\\\n{}\\\n{e}\"\n", lines.join("\\\n"));
        let numbered: String = std::iter::once(b.to_string())
            .chain(lines.iter().cloned())
            .chain(std::iter::once(e.to_string()))
            .enumerate()
            .map(|(i, l)| format!("{}. {l}\n", i + 1))
            .collect();
        let truncated = format!("key = \"{b}\\n\"\n{}", {
            lines
                .iter()
                .map(|l| format!("  + \"{l}\"\n"))
                .collect::<String>()
        });
        for text in [python, kotlin, shell, numbered, truncated] {
            record(&text);
            let out = redactor().redact(&text);
            assert!(out.text.contains("[REDACTED:private-key]"), "{}", out.text);
            for l in &lines[..5] {
                assert!(!out.text.contains(l.as_str()), "{}", out.text);
            }
            // What the code says before the block stays.
            assert!(out.text.starts_with(&text[..3]), "{}", out.text);
        }
        // A `BEGIN` line alone, or with prose after it, is no key; nor is
        // prose between a `BEGIN` and an `END` line.
        assert_clean("The file starts with -----BEGIN PRIVATE KEY----- and then:\nthe body.\n");
        assert_clean(
            "It must start with -----BEGIN RSA PRIVATE KEY----- on its own line.\n\
             KeyLoaderConfiguration reads it; CertificateAuthorityBundle is separate.\n\
             TODO: check the PemParser handles CRLF.\n\
             The last line must be -----END RSA PRIVATE KEY----- exactly.\n",
        );
        assert_clean(
            "-----BEGIN RSA PRIVATE KEY-----\n\
             KeyLoaderConfiguration reads it; CertificateAuthorityBundle is separate.\n\
             -----END RSA PRIVATE KEY-----\n",
        );
    }

    #[test]
    fn variables_with_sigils_and_type_annotations() {
        let p = "hT4vN8qLw2Rz";
        let t = rand(3710, ALNUM, 36);
        for text in [
            format!("<?php $db_password = '{p}';\n"),
            format!("$password = \"{p}\"\n"),
            format!("my $password = \"{p}\";\n"),
            format!("@password = \"{p}\"\n"),
            format!("$ENV{{DB_PASSWORD}} = '{p}';\n"),
            format!("export const dbPassword: string = \"{p}\";\n"),
            format!("DB_PASSWORD: Final[str] = \"{p}\"\n"),
            format!("password: str = \"{p}\"\n"),
            format!("char password[] = \"{p}\";\n"),
            format!("ENV POSTGRES_PASSWORD {p}\n"),
        ] {
            assert_redacted(&text, p, "password-assignment");
        }
        for text in [
            format!("$api_token = \"{t}\";\n"),
            format!("const API_KEY: &str = \"{t}\";\n"),
            format!("private val secret: String = \"{t}\"\n"),
            format!("let apiKey: String = \"{t}\"\n"),
        ] {
            assert_redacted(&text, &t, "secret-assignment");
        }
        // References and comparisons stay.
        for text in [
            "echo $PASSWORD = done\n",
            "if ($password == $confirm) { ok(); }\n",
            "$db_password = getenv('DB_PASSWORD');\n",
            "password: str = field(default=None)\n",
        ] {
            assert_clean(text);
        }
    }

    #[test]
    fn values_on_the_next_line_and_name_value_pairs() {
        let p = "hT4vN8qLw2Rz";
        let t = rand(3720, ALNUM, 36);
        for text in [
            format!("password: |\n    {p}\n"),
            format!("db:\n  password:\n    {p}\n"),
            format!("{{\"password\":\n  \"{p}\"}}\n"),
            format!("{{\"name\":\"DB_PASSWORD\",\"value\":\"{p}\"}}\n"),
            format!("{{\"Key\": \"password\", \"Value\": \"{p}\"}}\n"),
            format!("aws ssm put-parameter --name /prod/db/password --value \"{p}\"\n"),
            format!("ParameterKey=DbPassword,ParameterValue={p}\n"),
        ] {
            assert_redacted(&text, p, "password-assignment");
        }
        assert_redacted(&format!("token: >-\n    {t}\n"), &t, "secret-assignment");
        // A heading with its description below is no value.
        assert_clean("Password:\n  must be twelve characters or more.\n");
    }

    /// A token as a URL's password keeps the host and path after it.
    #[test]
    fn a_token_as_a_urls_password_keeps_the_rest_of_the_url() {
        let t = rand(3730, ALNUM, 36);
        let out = redactor().redact(&format!(
            "git clone https://x-access-token:{t}@github.com/acme/api.git\n"
        ));
        assert!(!out.text.contains(&t), "{}", out.text);
        assert!(
            out.text.contains("@github.com/acme/api.git"),
            "{}",
            out.text
        );
    }
}

mod round_38 {
    use super::*;

    /// R's `<-`, a fullwidth colon or equals sign, and TOML or Python
    /// triple-quoted strings (round 37b's misses).
    #[test]
    fn r_arrows_fullwidth_operators_and_triple_quotes() {
        let p = format!("Qx7!{}", rand(3800, ALNUM, 14));
        for text in [
            format!("db_password <- \"{p}\"\n"),
            format!("password <<- '{p}'\n"),
            format!("密码：{p}\n"),
            format!("password：{p}\n"),
            format!("password＝{p}\n"),
            format!("password = \"\"\"{p}\"\"\"\n"),
            format!("password = \"\"\"\n{p}\n\"\"\"\n"),
            format!("password = '''{p}'''\n"),
        ] {
            assert_redacted(&text, &p, "password-assignment");
        }
        for text in [
            "password <- readline(prompt = \"Password: \")\n",
            "if (password <-1) stop()\n",
            "WiFi password：贴在路由器背面\n",
            "password = \"\"\"\n\"\"\"\n",
            "docstring = \"\"\"Reads the password from the vault.\"\"\"\n",
        ] {
            assert_clean(text);
        }
    }
}
