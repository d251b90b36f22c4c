//! Credentials written as assignments: `password = ...`, `api_key: ...`,
//! `"token": "..."`, `export DB_PASS=...`, `--password ...`,
//! `<password>...</password>`, `Authorization: Bearer ...`, a
//! `name: DB_PASSWORD` / `value: ...` pair, `mysql -p...`, `curl -u
//! user:...`, and prose such as "the password is ...". Also `$password =
//! "..."` (a sigil), `API_KEY: &str = "..."` (a type), `password: |` with
//! the value on the next, deeper line, `{"name": "DB_PASSWORD", "value":
//! "..."}`, `--name /prod/db/password --value ...` and `ENV NAME value`.
//!
//! Run at each hit of a keyword (`pass`, `pwd`, `secret`, `token`, `key`,
//! `authoriz`, `credential`, `bearer`, `session`, in their usual casings),
//! the parser takes the identifier around the hit as the key, splits it
//! into words (`dbPassword` -> `db`, `password`), decides whether it names
//! a password, a secret or neither, then reads the operator and the value.
//! Only the value is redacted, so the note keeps `password = [REDACTED:...]`.
//!
//! The value must also look like a secret. Left alone: placeholders
//! (`xxxx`, `<your-key>`), references (`${VAR}`, `$VAR`,
//! `os.environ[...]`), code (`self.password`, `Optional[str]`,
//! `snake_case_names`), paths, file names, URLs, emails, dates, numbers
//! with separators, UUIDs, type names, and ordinary words in prose.
//! Passwords are accepted with less randomness than API keys, since people
//! choose them; a value after a bare `key` or in prose must look generated.

use std::sync::OnceLock;

use super::checks::{
    Classes, Needles, contains_ci, entropy, is_hex, is_placeholder, is_uuid, joined_words,
    reads_like_words,
};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Class {
    Password,
    Secret,
}

/// How sure the key makes us that its value is a secret.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Tier {
    /// `api_key`, `client_secret`, `access_token`: a token-shaped value is enough.
    Normal,
    /// A bare `key`, or a qualifier we do not know (`stripe_key`): the value
    /// must look generated.
    Strict,
    /// `Bearer <value>`.
    Bearer,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    /// `:` `=` `:=` `=>` `==`
    Assign,
    /// `<password>value</password>`
    Xml,
    /// `--password value`, `Bearer value`
    Space,
    /// `is`, `was`, `are` in prose ("the API key is ...").
    Prose,
    /// Only a space ("api key 9f8e...", "password hunter2!"): the value
    /// must look generated, or like a chosen password after the bare word
    /// `password`.
    Bare,
}

pub(crate) fn password(text: &str, s: usize, e: usize, skip: &mut usize) -> Option<(usize, usize)> {
    assignment(text, s, e, skip, Class::Password)
}

/// `session s-9b77d6eb7428f416`: the label memvault gives a session run
/// without one (`s-` and 16 hex digits), which `history`, `resume` and
/// its messages name, and an agent may copy into its notes: a label, not
/// a session token.
fn memvault_session_label(key: &[u8], v: &[u8]) -> bool {
    key.to_ascii_lowercase()
        .windows(7)
        .any(|w| w == b"session")
        && v.len() >= 18
        && v.starts_with(b"s-")
        && v[2..18]
            .iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
        // A sentence's end after it.
        && v[18..].iter().all(|c| b".,;:)".contains(c))
}

pub(crate) fn secret(text: &str, s: usize, e: usize, skip: &mut usize) -> Option<(usize, usize)> {
    assignment(text, s, e, skip, Class::Secret)
}

/// Passwords on command lines that have no `password` keyword:
/// `mysql -u root -pSecret`, `mongosh -p secret`, `sshpass -p secret`,
/// `redis-cli -a secret` and `curl -u user:secret` (or `--user`). The hit
/// is the tool's name; the rest of its line is read (at most 400 bytes).
pub(crate) fn command_line(
    text: &str,
    s: usize,
    e: usize,
    skip: &mut usize,
) -> Option<(usize, usize)> {
    #[derive(PartialEq)]
    enum Tool {
        /// `-pVALUE`, attached (mysql, mariadb).
        Attached,
        /// `-p VALUE` or `-pVALUE` (mongo, mongosh, sshpass).
        Flag,
        /// `-a VALUE` (redis-cli).
        Redis,
        /// `-u user:VALUE`, `--user user:VALUE` (curl).
        Curl,
        /// One of these flags, then the value (`docker login -p VALUE`,
        /// `--password=VALUE`, `sqlcmd -P`, `ldapsearch -w`, `zip -P`,
        /// `keytool -storepass`, ...).
        Named(&'static [&'static [u8]]),
    }
    let b = text.as_bytes();
    if s > 0 && (b[s - 1].is_ascii_alphanumeric() || b[s - 1] == b'_') {
        return None;
    }
    let name = &b[s..e];
    let tool = match name {
        // `-p` is a password for `docker login` only (`docker run -p`
        // publishes a port).
        b"docker" if b[e..].starts_with(b" login") => Tool::Named(&[b"-p", b"--password"]),
        b"docker" => return None,
        b"az login" | b"psexec" => Tool::Named(&[b"-p", b"--password"]),
        b"sqlcmd" | b"ipmitool" | b"zip" => Tool::Named(&[b"-P"]),
        b"ldapsearch" | b"ldapmodify" | b"ldapadd" | b"ldapdelete" => Tool::Named(&[b"-w"]),
        b"keytool" => Tool::Named(&[
            b"-storepass",
            b"-keypass",
            b"-srcstorepass",
            b"-deststorepass",
            b"-srckeypass",
            b"-destkeypass",
        ]),
        _ => match b[s] {
            b'c' => Tool::Curl,
            b'r' => Tool::Redis,
            b's' => Tool::Flag,
            _ if name.starts_with(b"mongo") => Tool::Flag,
            _ => Tool::Attached,
        },
    };
    // The tool's name ends at a word boundary (`mongosh`, `mysqldump` too).
    let mut name_end = e;
    while name_end < b.len() && name_end - e < 8 && b[name_end].is_ascii_alphanumeric() {
        name_end += 1;
    }
    let mut le = name_end;
    while le < b.len() && le - e < 400 && b[le] != b'\n' {
        le += 1;
    }
    *skip = le;
    let line = &b[name_end..le];
    let mut i = 0;
    while i + 3 < line.len() {
        let at_flag = is_blank(line[i]) && line[i + 1] == b'-';
        if !at_flag {
            i += 1;
            continue;
        }
        let flag_start = i + 1;
        let mut j = flag_start;
        while j < line.len() && !is_blank(line[j]) && line[j] != b'=' {
            j += 1;
        }
        let flag = &line[flag_start..j];
        let attached = flag.len() > 2 && flag.starts_with(b"-p") && !flag.starts_with(b"--");
        let next = || {
            let k = skip_blank(line, j);
            (k > j && k < line.len() && line[k] != b'-').then_some(k)
        };
        let value_start = match tool {
            Tool::Attached if attached => Some(flag_start + 2),
            Tool::Flag if attached => Some(flag_start + 2),
            Tool::Flag if flag == b"-p" => next(),
            Tool::Redis if flag == b"-a" => next(),
            Tool::Named(flags) if flags.contains(&flag) => {
                if line.get(j) == Some(&b'=') {
                    Some(j + 1)
                } else {
                    next()
                }
            }
            Tool::Curl if flag == b"-u" || flag == b"--user" => {
                let k = skip_blank(line, if line.get(j) == Some(&b'=') { j + 1 } else { j });
                (k > j || line.get(j) == Some(&b'=')).then_some(k)
            }
            _ => None,
        };
        if let Some(vs) = value_start {
            let quote = line.get(vs).copied().filter(|&q| q == b'"' || q == b'\'');
            let vs = vs + usize::from(quote.is_some());
            let mut ve = vs;
            // A quoted value runs to its closing quote (a passphrase of
            // several words).
            while ve < line.len()
                && (quote.is_some() || !is_blank(line[ve]))
                && Some(line[ve]) != quote
            {
                ve += 1;
            }
            let mut ps = vs;
            if tool == Tool::Curl {
                // `user:password`
                ps = line[vs..ve]
                    .iter()
                    .position(|&c| c == b':')
                    .map(|p| vs + p + 1)?;
            }
            let v = &line[ps..ve];
            // `-p 27017`: a port.
            let port = tool == Tool::Flag && v.len() <= 5 && v.iter().all(u8::is_ascii_digit);
            let shaped = v.len() >= 4 && (!plain_word(v) || v.len() >= 6) && !port;
            if shaped && !common_rejects(v, false) {
                return Some((name_end + ps, name_end + ve));
            }
            return None;
        }
        i = j;
    }
    None
}

/// A `.pgpass` line, `host:port:database:user:password`; the hit is
/// `:port:` (a usual PostgreSQL port, or `*`). The password runs to the
/// end of the line.
pub(crate) fn pgpass(text: &str, s: usize, e: usize, skip: &mut usize) -> Option<(usize, usize)> {
    let b = text.as_bytes();
    let field = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'_' | b'*');
    // The host field starts the line.
    let mut hs = s;
    while hs > 0 && s - hs < 256 && field(b[hs - 1]) {
        hs -= 1;
    }
    if hs == s || (hs > 0 && !matches!(b[hs - 1], b'\n' | b' ' | b'\t' | b'`')) {
        return None;
    }
    // Database and user, then the password to the end of the line.
    let mut i = e;
    for _ in 0..2 {
        let fs = i;
        while i < b.len() && i - fs < 128 && field(b[i]) {
            i += 1;
        }
        if i == fs || b.get(i) != Some(&b':') {
            return None;
        }
        i += 1;
    }
    let ps = i;
    while i < b.len() && i - ps <= 256 && !matches!(b[i], b'\n' | b'\r' | b' ' | b'\t' | b'`') {
        i += 1;
    }
    *skip = i;
    let v = &b[ps..i];
    (v.len() >= 4 && !common_rejects(v, false)).then_some((ps, i))
}

fn is_key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-')
}

fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

const MAX_KEY: usize = 80;
const MAX_VALUE: usize = 1024;
/// Past [`MAX_VALUE`], an unquoted value after `=` or `:` is still read up
/// to this length (and redacted whole).
const MAX_LONG_VALUE: usize = 64 << 10;

fn assignment(
    text: &str,
    s: usize,
    e: usize,
    skip: &mut usize,
    want: Class,
) -> Option<(usize, usize)> {
    let b = text.as_bytes();
    let n = b.len();
    let mut ks = s;
    while ks > s.saturating_sub(MAX_KEY) && is_key_byte(b[ks - 1]) {
        ks -= 1;
    }
    let mut ke = e;
    while ke < n && ke < e + MAX_KEY && is_key_byte(b[ke]) {
        ke += 1;
    }
    *skip = ke;
    // `$db_password = '...'` (PHP, Perl, PowerShell), `@password = "..."`
    // (Ruby), `$ENV{DB_PASSWORD} = '...'` (Perl): a variable with its
    // sigil, given a quoted value.
    let sigil_value = if ks > 0 && matches!(b[ks - 1], b'$' | b'@') {
        quoted_assignment(b, ke)
    } else if ks >= 5 && &b[ks - 5..ks] == b"$ENV{" && b.get(ke) == Some(&b'}') {
        quoted_assignment(b, ke + 1)
    } else {
        None
    };
    // `${DB_PASSWORD}`, `$PWD`, `%API_KEY%`: a reference, not a key.
    // `AWS::SecretsManager::Secret`: a type path, not a key.
    if sigil_value.is_none()
        && (ks > 0 && matches!(b[ks - 1], b'$' | b'{' | b'%' | b'@')
            || (ks > 1 && &b[ks - 2..ks] == b"::"))
    {
        return None;
    }
    let mut key_start = ks;
    let mut cli = false;
    while key_start < ke && b[key_start] == b'-' {
        key_start += 1;
        cli = true;
    }
    let mut key_end = ke;
    while key_end > key_start && matches!(b[key_end - 1], b'.' | b'-') {
        key_end -= 1;
    }
    if key_start >= key_end {
        return None;
    }
    let key = &b[key_start..key_end];
    let xml = ks > 0 && b[ks - 1] == b'<';
    let bearer = key.eq_ignore_ascii_case(b"bearer");
    let named = sigil_value
        .or_else(|| named_value(b, ks, ke))
        .or_else(|| flag_named_value(b, ks, ke));
    let (op, mut vs) = match named {
        Some(vs) => (Op::Assign, vs),
        None => match operator(b, key_end, cli, xml, bearer)? {
            // `ENV POSTGRES_PASSWORD value`: a Dockerfile's older form.
            (Op::Bare, vs) if dockerfile_env(b, ks) => (Op::Assign, vs),
            op => op,
        },
    };
    // `Authorization: Bearer <token>`: the scheme is not the secret.
    if want == Class::Secret && op == Op::Assign {
        vs = skip_scheme(b, vs);
    }
    let (vs, ve, quoted) = match value(b, vs, op) {
        Ok(v) => v,
        Err(read) => {
            // Past a value too long to be one: skip the keywords inside it.
            *skip = (*skip).max(read);
            return None;
        }
    };
    if op == Op::Xml && !closes(b, ve, key) {
        return None;
    }
    // `https://x-access-token:<token>@github.com/...`: a URL's user
    // before its password; the password ends at the `@`.
    let ve = if ks >= 3 && &b[ks - 3..ks] == b"://" {
        b[vs..ve]
            .iter()
            .position(|&c| c == b'@')
            .map_or(ve, |p| vs + p)
    } else {
        ve
    };
    // Keywords inside a long value are not keys: skip them (keeps the work
    // linear on text like `password=password=...`). A short value may
    // itself name a key (`key="ApiKey" value="..."`), and re-reading it
    // costs little.
    // (Not a value read from the next line, which may be no value of
    // this key: its keywords are read in their turn.)
    if ve - vs > 64 && !b[key_end..vs].contains(&b'\n') {
        *skip = (*skip).max(ve);
    }
    let v = &b[vs..ve];
    if !may_be_secret(v, op, want) || memvault_session_label(key, v) {
        return None;
    }
    let (class, tier) = classify(key)?;
    // `primary key: ...`, `S3 object key ...`, `cache key: ...`: the words
    // of `primary_key`, written apart.
    if key.eq_ignore_ascii_case(b"key")
        && word_before(b, ks).is_some_and(|w| KEY_NOT_SECRET.has(&w))
    {
        return None;
    }
    // `the Datadog API key is ...`: a qualifier before a bare `key` in prose.
    let tier = if tier == Tier::Strict && qualified_in_prose(b, ks) {
        Tier::Normal
    } else {
        tier
    };
    if class != want || names_itself(v, key) {
        return None;
    }
    // `Server=db;User Id=app;Password=...;` (ADO.NET, ODBC): a
    // connection string's fields are config values.
    let in_conn_string =
        op == Op::Assign && ks > 0 && b[ks - 1] == b';' && b.get(ve) == Some(&b';');
    // `password hunter2!` (a `.netrc` line) reads like prose; `pass it on`
    // does not count.
    let op = match op {
        Op::Bare if class == Class::Password => {
            if !(key.eq_ignore_ascii_case(b"password") || key.eq_ignore_ascii_case(b"passwd")) {
                return None;
            }
            Op::Prose
        }
        // `crypto_key: Base64-encoded string of a key`: an unquoted value
        // with more words after it on its line is a description.
        Op::Assign if !quoted && !in_conn_string && !ends_line(b, ve) => Op::Prose,
        op => op,
    };
    // Heroku's (and a few others') API keys are bare UUIDs: a UUID after
    // such a vendor's key name is its key.
    // So is a UUID assigned to a key that names a secret outright
    // (`NPM_TOKEN=`, `api_key:`, `client_secret =`); after a bare `key` or
    // an unknown qualifier (`request_id_key`) it is an id.
    if class == Class::Secret
        && is_uuid(v)
        && (uuid_vendor(b, ks, key) || (tier == Tier::Normal && op == Op::Assign))
    {
        return Some((vs, ve));
    }
    let ok = match class {
        Class::Password => {
            let config = in_conn_string || (op == Op::Assign && config_line(b, ks, ve, quoted));
            password_shape(v, op, quoted, config)
        }
        Class::Secret => secret_shape(v, op, tier, quoted),
    };
    ok.then_some((vs, ve))
}

/// `password = password`, `self.passwd = passwd`: the value repeats the
/// key or its last word (a variable passed along).
fn names_itself(v: &[u8], key: &[u8]) -> bool {
    let last = key
        .rsplit(|&c| matches!(c, b'_' | b'.' | b'-'))
        .next()
        .unwrap_or(key);
    v.eq_ignore_ascii_case(key) || v.eq_ignore_ascii_case(last)
}

/// The weakest shape any key could accept, tested before the key is
/// looked at (most keyword hits in prose stop here).
fn may_be_secret(v: &[u8], op: Op, want: Class) -> bool {
    let loose = matches!(op, Op::Assign | Op::Xml);
    match want {
        Class::Password => {
            v.len() >= 4 && (loose || op == Op::Space || (v.len() >= 6 && !plain_word(v)))
        }
        Class::Secret => {
            v.len() >= 8
                && (loose || op == Op::Space || (v.len() >= 16 && v.iter().any(u8::is_ascii_digit)))
        }
    }
}

// ---------------------------------------------------------------- key

/// Splits an identifier into lowercase words at `_ . -` and camelCase
/// boundaries (`APIKey` -> `api`, `key`).
fn words(key: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for (i, &c) in key.iter().enumerate() {
        if !c.is_ascii_alphanumeric() {
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            continue;
        }
        if c.is_ascii_uppercase() && !cur.is_empty() {
            let prev = key[i - 1];
            let next_lower = key.get(i + 1).is_some_and(u8::is_ascii_lowercase);
            if prev.is_ascii_lowercase()
                || prev.is_ascii_digit()
                || (prev.is_ascii_uppercase() && next_lower)
            {
                out.push(std::mem::take(&mut cur));
            }
        }
        cur.push(c.to_ascii_lowercase() as char);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

static PASSWORD_WORDS: Words = Words::new(
    "pass passcode passphrase passwd password pwd pword pw psk \
     passwort kennwort wachtwoord passord salasana heslo haslo parola sifre senha contrasena passe",
);
const PASSWORD_SUFFIXES: &[&str] = &["password", "passwd", "passphrase"];
static SECRET_WORDS: Words = Words::new(
    "accesskey apikey authorization bearer credential credentials privatekey secret secretkey \
     secrets token",
);
const SECRET_SUFFIXES: &[&str] = &[
    "secret",
    "token",
    "apikey",
    "accesskey",
    "secretkey",
    "privatekey",
];

/// Words before `key` that make it a secret key.
static KEY_QUALIFIERS: Words = Words::new(
    "access account admin aes api app application auth backend bot client consumer cookie crypto \
     deploy dev developer encrypt encryption hmac integration jwt licence license live master \
     merchant org organization partner personal private prod production project rest root secret \
     server service session shared sign signing storage subscription user vault webhook wifi wlan \
     wpa write x",
);

/// Words before `key` that make it something else (a database key, a
/// public key, a dictionary key).
static KEY_NOT_SECRET: Words = Words::new(
    "bar bucket cache cluster column composite cursor cut dedup dedupe dict dictionary entry first \
     foo foreign gpg group hash host hot i18n idempotency index item json known kv label last lookup \
     map next node object page partition pgp prev previous primary pub public publishable range \
     redis registry routing row s3 shard short sign site sitekey sort ssh toml translation turn \
     unique yaml",
);

/// Words that make a `token` key something other than a credential.
static TOKEN_NOT_SECRET: Words = Words::new(
    "bos cancel cancellation cls completion completions continuation correlation count css cursor \
     design eos idempotency input lexer mask max min next num output pad page pagination parser \
     prompt sep special sync tokens total trace tracing unk",
);

/// A key whose last word is one of these describes a secret, it is not one.
static STOP_LAST: Words = Words::new(
    "age algo algorithm arn audience button bytes changed check checksum claims class client cmd \
     column command complexity component count desc description digest dir directory disable \
     disabled display dto enable enabled encoding endpoint env error expiration expire expires \
     expiry factory field fields file files flow form format generator get handler hash hashed \
     header help helper hint hints host id ids input invalid issuer key keys kind label len length \
     lifetime limit list location login logout manager max message method min modal mode model name \
     names page param parameter params path pattern placeholder policies policy prefix prompt props \
     provider ref reference regex request required reset response rotate rotation rule rules salt \
     schema scope scopes screen sent service set signup size source spec state status storage store \
     strength struct suffix table test tests text timeout ttl type types ui uri url usage used util \
     utils valid validation validator var variable version view at on by date time timestamp updated \
     created email mail phone user username login owner contact address filename filepath \
     dirname pathname stores config configuration settings options opts encryption scheme \
     hashing stdin",
);

/// A set of words, written as one space-separated string and sorted for
/// lookup on first use.
struct Words {
    text: &'static str,
    index: OnceLock<WordIndex>,
}

/// The words sorted, and which (length, first byte) pairs occur: most
/// lookups are of words not in the set and stop at that filter.
struct WordIndex {
    sorted: Vec<&'static str>,
    /// Bit `first byte % 64` of entry `min(length, 31)`.
    starts: [u64; 32],
}

impl Words {
    const fn new(text: &'static str) -> Words {
        Words {
            text,
            index: OnceLock::new(),
        }
    }

    fn has(&self, w: &str) -> bool {
        let index = self.index.get_or_init(|| {
            let mut sorted: Vec<&str> = self.text.split_whitespace().collect();
            sorted.sort_unstable();
            sorted.dedup();
            let mut starts = [0u64; 32];
            for s in &sorted {
                starts[s.len().min(31)] |= 1 << (s.as_bytes()[0] % 64);
            }
            WordIndex { sorted, starts }
        });
        let Some(&first) = w.as_bytes().first() else {
            return false;
        };
        index.starts[w.len().min(31)] & (1 << (first % 64)) != 0
            && index.sorted.binary_search(&w).is_ok()
    }

    fn any(&self, ws: &[String]) -> bool {
        ws.iter().any(|w| self.has(w))
    }
}

fn classify(key: &[u8]) -> Option<(Class, Tier)> {
    let ws = words(key);
    let last = ws.last()?;
    let is_password = ws
        .iter()
        .any(|w| PASSWORD_WORDS.has(w) || PASSWORD_SUFFIXES.iter().any(|s| w.ends_with(s)));
    if is_password {
        if STOP_LAST.has(last) && !PASSWORD_WORDS.has(last) {
            return None;
        }
        return Some((Class::Password, Tier::Normal));
    }
    if ws.iter().any(|w| {
        matches!(
            w.as_str(),
            "public" | "pub" | "publishable" | "pubkey" | "sitekey"
        )
    }) {
        return None;
    }
    let secret_word = ws
        .iter()
        .any(|w| SECRET_WORDS.has(w) || SECRET_SUFFIXES.iter().any(|s| w.ends_with(s)));
    let key_at = ws.iter().rposition(|w| w == "key");
    // `sessionid`, `session_id`, `PHPSESSID`: a session id is a credential.
    let session = ws
        .iter()
        .any(|w| w.starts_with("session") || w.ends_with("sessid") || w.ends_with("sessionid"));
    if session
        && (ws.len() == 1 || matches!(last.as_str(), "id" | "key" | "token" | "secret" | "cookie"))
    {
        return Some((Class::Secret, Tier::Normal));
    }
    if ws.iter().any(|w| w == "token" || w.ends_with("token")) && TOKEN_NOT_SECRET.any(&ws) {
        return None;
    }
    // The last word decides what the key names: `secret_key` is a key,
    // `secret_name` a name.
    let last_is_key = last == "key";
    if STOP_LAST.has(last) && !last_is_key {
        return None;
    }
    if ws.len() == 1 && (last == "bearer") {
        return Some((Class::Secret, Tier::Bearer));
    }
    if secret_word {
        return Some((Class::Secret, Tier::Normal));
    }
    let i = key_at?;
    if i + 1 != ws.len() {
        return None;
    }
    if i == 0 {
        return Some((Class::Secret, Tier::Strict));
    }
    let before = &ws[..i];
    if KEY_NOT_SECRET.any(before) {
        return None;
    }
    if KEY_QUALIFIERS.any(before) {
        Some((Class::Secret, Tier::Normal))
    } else {
        Some((Class::Secret, Tier::Strict))
    }
}

// ---------------------------------------------------------------- operator and value

fn skip_blank(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && is_blank(b[i]) {
        i += 1;
    }
    i
}

/// After a variable's name at `i`: ` = ` and a quoted value (where the
/// value starts), or None.
fn quoted_assignment(b: &[u8], i: usize) -> Option<usize> {
    let j = skip_blank(b, i);
    if b.get(j) != Some(&b'=') || matches!(b.get(j + 1), Some(b'=' | b'~' | b'>')) {
        return None;
    }
    let v = skip_blank(b, j + 1);
    matches!(b.get(v), Some(b'"' | b'\'')).then_some(v)
}

/// At `i`, after a name's `:`: a type (`&str`, `&'static str`, `String`,
/// `Final[str]`, `Option<String>`) then ` = ` and a quoted value: where
/// the value starts.
fn typed_value(b: &[u8], i: usize) -> Option<usize> {
    let mut k = i;
    while k < b.len()
        && k - i < 48
        && (b[k].is_ascii_alphanumeric()
            || matches!(
                b[k],
                b'_' | b'&' | b'\'' | b'[' | b']' | b'<' | b'>' | b'.' | b'?' | b':'
            )
            || (b[k] == b' ' && b.get(k + 1) != Some(&b'=')))
    {
        k += 1;
    }
    let ty = &b[i..k];
    // A type names itself: a capital, a reference, brackets, or one of
    // the lower-case names of string types.
    let typed = ty
        .first()
        .is_some_and(|c| c.is_ascii_uppercase() || *c == b'&')
        || ty.contains(&b'[')
        || ty.contains(&b'<')
        || [&b"str"[..], b"string", b"bytes", b"char"].contains(&ty);
    if !typed || k == i || b.get(k) != Some(&b' ') {
        return None;
    }
    quoted_assignment(b, k)
}

/// `key:` with nothing after it on its line but a YAML block marker
/// (`|`, `|-`, `>`, `>-`, ...) at `v`: the first word of the next line,
/// if that line is indented deeper than the key's (where it starts).
fn next_line_value(b: &[u8], key_end: usize, v: usize) -> Option<usize> {
    let mut k = v;
    if matches!(b.get(k), Some(b'|' | b'>')) {
        k += 1;
        if matches!(b.get(k), Some(b'-' | b'+')) {
            k += 1;
        }
        k = skip_blank(b, k);
    }
    if b.get(k) == Some(&b'\r') {
        k += 1;
    }
    if b.get(k) != Some(&b'\n') {
        return None;
    }
    let line_start = b[..key_end]
        .iter()
        .rposition(|&c| c == b'\n')
        .map_or(0, |p| p + 1);
    let indent = skip_blank(b, line_start) - line_start;
    let next = k + 1;
    let first = skip_blank(b, next);
    (first - next > indent && first < b.len() && !matches!(b[first], b'\n' | b'\r'))
        .then_some(first)
}

/// `--name /prod/db/password --value VALUE` (`aws ssm put-parameter`
/// and the like): the key `[ks, ke)` ends the `--name` argument (a path's
/// last part), and the secret is the `--value` argument after it.
fn flag_named_value(b: &[u8], ks: usize, ke: usize) -> Option<usize> {
    let mut i = ks;
    while i > 0 && ks - i < 200 && !is_blank(b[i - 1]) && b[i - 1] != b'\n' {
        i -= 1;
    }
    if i < 7 || &b[i - 7..i] != b"--name " {
        return None;
    }
    let mut j = ke;
    if matches!(b.get(j), Some(b'"' | b'\'')) {
        j += 1;
    }
    j = skip_blank(b, j);
    if !b[j..].starts_with(b"--value") {
        return None;
    }
    j += 7;
    match b.get(j) {
        Some(b'=') => Some(j + 1),
        Some(c) if is_blank(*c) => Some(skip_blank(b, j)),
        _ => None,
    }
}

/// `ENV NAME value` at the start of a line (a Dockerfile's older form of
/// `ENV NAME=value`), the name starting at `ks`.
fn dockerfile_env(b: &[u8], ks: usize) -> bool {
    ks >= 4
        && &b[ks - 4..ks] == b"ENV "
        && b[..ks - 4]
            .iter()
            .rev()
            .take_while(|&&c| c != b'\n')
            .all(|&c| is_blank(c))
}

fn word_at(b: &[u8], i: usize) -> &[u8] {
    let mut j = i;
    while j < b.len()
        && j - i < 40
        && (b[j].is_ascii_alphanumeric() || matches!(b[j], b'_' | b'.' | b'@' | b'-'))
    {
        j += 1;
    }
    &b[i..j]
}

/// Vendors whose API keys are bare UUIDs.
static UUID_VENDOR_NAMES: Needles =
    Needles::new(&["heroku", "hubspot", "snyk", "squarespace", "sendbird"]);

/// The key, or the 40 bytes of its line before it, names a vendor of [`UUID_VENDOR_NAMES`].
fn uuid_vendor(b: &[u8], ks: usize, key: &[u8]) -> bool {
    let mut ls = ks;
    while ls > 0 && ks - ls < 40 && b[ls - 1] != b'\n' {
        ls -= 1;
    }
    UUID_VENDOR_NAMES.in_ci(key) || UUID_VENDOR_NAMES.in_ci(&b[ls..ks])
}

/// The word just before a bare `key` (one blank between) qualifies it:
/// `API key`, `app key`, `access key`.
fn qualified_in_prose(b: &[u8], ks: usize) -> bool {
    word_before(b, ks).is_some_and(|w| KEY_QUALIFIERS.has(&w))
}

/// The word just before `ks` (one blank between), lowercased.
fn word_before(b: &[u8], ks: usize) -> Option<String> {
    if ks < 2 || !is_blank(b[ks - 1]) {
        return None;
    }
    let end = ks - 1;
    let mut st = end;
    while st > 0 && end - st < 20 && b[st - 1].is_ascii_alphanumeric() {
        st -= 1;
    }
    let w = std::str::from_utf8(&b[st..end]).ok()?;
    (st < end).then(|| w.to_ascii_lowercase())
}

fn prose_verb(w: &[u8]) -> bool {
    // English, then the same verb in German, French, Spanish, the
    // Scandinavian languages, Polish and Czech ("das Passwort ist ...").
    [
        &b"is"[..],
        b"was",
        b"are",
        b"IS",
        b"Is",
        b"ist",
        b"est",
        b"es",
        b"er",
        b"jest",
        b"je",
    ]
    .contains(&w)
}

/// Small words that start a phrase, not a value ("the password to the
/// server is ...").
fn determiner(w: &[u8]) -> bool {
    [
        &b"the"[..],
        b"a",
        b"an",
        b"my",
        b"our",
        b"your",
        b"his",
        b"her",
        b"its",
        b"their",
        b"this",
        b"that",
        b"these",
        b"those",
        b"all",
        b"any",
        b"every",
        b"each",
    ]
    .iter()
    .any(|d| d.eq_ignore_ascii_case(w))
}

/// Reads the operator after a key; returns it and where the value starts.
fn operator(b: &[u8], key_end: usize, cli: bool, xml: bool, bearer: bool) -> Option<(Op, usize)> {
    let n = b.len();
    let mut i = key_end;
    if b.get(i).is_some_and(|q| matches!(q, b'"' | b'\'' | b'`')) {
        i += 1;
        // `define('DB_PASSWORD', '...')`, `setenv("API_KEY", "...")`: a
        // quoted name, a comma, then a quoted value (a bare one after the
        // comma is a variable: not taken).
        let k = skip_blank(b, i);
        if b.get(k) == Some(&b',') {
            let v = skip_blank(b, k + 1);
            if matches!(b.get(v), Some(b'"' | b'\'')) {
                return Some((Op::Assign, v));
            }
        }
        // `os.environ["API_KEY"] = "..."`, `$_ENV['DB_PASSWORD'] = '...'`,
        // `config[:api_key] = ...`: a subscript's close before the operator.
        if b.get(i) == Some(&b']') {
            i += 1;
        }
    }
    if xml && i < n && b[i] == b'>' {
        return Some((Op::Xml, i + 1));
    }
    // `char password[] = "..."`, `char api_key[41] = "..."` (C): an
    // array's size before a quoted value.
    if !xml
        && b.get(i) == Some(&b'[')
        && let Some(close) = b[i..].iter().take(8).position(|&c| c == b']')
        && b[i + 1..i + close].iter().all(u8::is_ascii_digit)
    {
        return quoted_assignment(b, i + close + 1).map(|v| (Op::Assign, v));
    }
    // Markdown emphasis: `**Password**: value`, `**Password:** value`.
    let stars = |at: usize| {
        b[at.min(n)..]
            .iter()
            .take(2)
            .take_while(|&&c| c == b'*')
            .count()
    };
    let emphasis = stars(i);
    i += emphasis;
    // A short note in parentheses before the operator: `Password (prod):`.
    let p = skip_blank(b, i);
    if b.get(p) == Some(&b'(')
        && let Some(close) = b[p..].iter().take(40).position(|&c| c == b')')
        && !b[p..p + close].contains(&b'\n')
    {
        let k = skip_blank(b, p + close + 1);
        if matches!(b.get(k), Some(b':' | b'=')) {
            i = p + close + 1;
        }
    }
    let after_key = i;
    let j = skip_blank(b, i);
    // `PASSWORD ?= value`, `PASSWORD += value` (make, shell)
    if matches!(b.get(j), Some(b'?' | b'+')) && b.get(j + 1) == Some(&b'=') {
        let k = skip_blank(b, j + 2);
        return (k > j + 2 || b.get(k).is_some_and(|c| !is_blank(*c))).then_some((Op::Assign, k));
    }
    // `password -> value`
    if b.get(j) == Some(&b'-') && b.get(j + 1) == Some(&b'>') {
        let k = skip_blank(b, j + 2);
        return (k > j + 2).then_some((Op::Assign, k));
    }
    // R's `password <- "value"` and `<<-`: a quoted value only (a bare
    // one is a variable or a call).
    if b.get(j) == Some(&b'<') {
        let arrow = if b.get(j + 1) == Some(&b'<') {
            j + 1
        } else {
            j
        };
        if b.get(arrow + 1) == Some(&b'-') {
            let v = skip_blank(b, arrow + 2);
            return matches!(b.get(v), Some(b'"' | b'\'')).then_some((Op::Assign, v));
        }
    }
    // A fullwidth colon or equals sign (`密码：…`, `password：…`), as
    // CJK text writes them: as `:` and `=`.
    if b[j.min(n)..].starts_with("\u{ff1a}".as_bytes())
        || b[j.min(n)..].starts_with("\u{ff1d}".as_bytes())
    {
        // An ASCII value only: after it, text in the language's own
        // script is prose (`password：贴在路由器背面`).
        let v = skip_blank(b, j + 3);
        return b
            .get(v)
            .is_some_and(u8::is_ascii)
            .then_some((Op::Assign, v));
    }
    if j < n {
        match b[j] {
            b':' => {
                if b.get(j + 1) == Some(&b':') || b.get(j + 1) == Some(&b'/') {
                    return None;
                }
                let mut k = if b.get(j + 1) == Some(&b'=') {
                    j + 2
                } else {
                    j + 1
                };
                if emphasis == 0 {
                    k += stars(k);
                }
                let v = skip_blank(b, k);
                // `API_KEY: &str = "..."`, `dbPassword: string = "..."`,
                // `DB_PASSWORD: Final[str] = "..."`: a type, then the value.
                if let Some(v) = typed_value(b, v) {
                    return Some((Op::Assign, v));
                }
                // `password: |` (a YAML block), `password:` then the value
                // on the next, deeper line (YAML, pretty-printed JSON).
                if let Some(v) = next_line_value(b, key_end, v) {
                    return Some((Op::Assign, v));
                }
                return Some((Op::Assign, v));
            }
            b'=' => {
                let mut k = j + 1;
                if b.get(k) == Some(&b'>') {
                    k += 1;
                } else {
                    while b.get(k) == Some(&b'=') && k < j + 3 {
                        k += 1;
                    }
                }
                return Some((Op::Assign, skip_blank(b, k)));
            }
            _ => {}
        }
    }
    if j == after_key || j >= n {
        return None;
    }
    // A space, then a word: `--password value`, `Bearer value`, prose.
    let w = word_at(b, j);
    if prose_verb(w) {
        let mut k = skip_blank(b, j + w.len());
        // `is now ...`, `is still ...`
        let filler = word_at(b, k);
        if [&b"now"[..], b"still", b"currently", b"temporarily", b"just"].contains(&filler) {
            let k2 = skip_blank(b, k + filler.len());
            if k2 > k + filler.len() {
                k = k2;
            }
        }
        return (k > j + w.len()).then_some((Op::Prose, k));
    }
    // `password changed to ...`, `password set to ...`
    if [&b"changed"[..], b"set", b"reset", b"updated"].contains(&w) {
        let k = skip_blank(b, j + w.len());
        if word_at(b, k) == b"to" {
            let k2 = skip_blank(b, k + 2);
            return (k2 > k + 2).then_some((Op::Prose, k2));
        }
    }
    // `password for the staging db is ...`, `API key for prod: ...`
    if [&b"for"[..], b"of", b"on", b"to", b"in", b"at"].contains(&w) {
        let mut k = skip_blank(b, j + w.len());
        // `changed the password to Orchid#77lake`: a value right after
        // `to` (the value's own checks judge it).
        let first = word_at(b, k);
        if w == b"to" && !first.is_empty() && !determiner(first) && k > j + w.len() {
            let next = skip_blank(b, k + first.len());
            if !prose_verb(word_at(b, next)) {
                return Some((Op::Prose, k));
            }
        }
        for _ in 0..3 {
            let w2 = word_at(b, k);
            if w2.is_empty() {
                break;
            }
            let after = k + w2.len();
            if b.get(after) == Some(&b':') {
                return Some((Op::Prose, skip_blank(b, after + 1)));
            }
            let k2 = skip_blank(b, after);
            let w3 = word_at(b, k2);
            if prose_verb(w3) {
                let k3 = skip_blank(b, k2 + w3.len());
                return (k3 > k2 + w3.len()).then_some((Op::Prose, k3));
            }
            k = k2;
        }
        return None;
    }
    if cli || bearer {
        return Some((Op::Space, j));
    }
    Some((Op::Bare, j))
}

/// `name: DB_PASSWORD` then `value: ...` (a Kubernetes env entry), or
/// `<add key="ApiKey" value="..."/>` (.NET settings): the key `[ks, ke)`
/// is the value of a `name`/`key` field, and the secret is in the
/// `value` field after it. Returns where that value starts.
fn named_value(b: &[u8], ks: usize, ke: usize) -> Option<usize> {
    let mut i = ks;
    if i > 0 && matches!(b[i - 1], b'"' | b'\'') {
        i -= 1;
    }
    while i > 0 && is_blank(b[i - 1]) {
        i -= 1;
    }
    if i == 0 || !matches!(b[i - 1], b':' | b'=') {
        return None;
    }
    i -= 1;
    while i > 0 && is_blank(b[i - 1]) {
        i -= 1;
    }
    // `"name": "DB_PASSWORD"`: the field's closing quote.
    if i > 0 && matches!(b[i - 1], b'"' | b'\'') {
        i -= 1;
    }
    let field_end = i;
    while i > 0 && field_end - i < 16 && b[i - 1].is_ascii_alphabetic() {
        i -= 1;
    }
    let field = &b[i..field_end];
    // `name`, `key`, and names ending so (`ParameterKey`, `OptionName`).
    let ends_ci = |w: &[u8], tail: &[u8]| {
        w.len() >= tail.len() && w[w.len() - tail.len()..].eq_ignore_ascii_case(tail)
    };
    let named = ends_ci(field, b"name") || ends_ci(field, b"key");
    if !named || (i > 0 && b[i - 1].is_ascii_alphanumeric()) {
        return None;
    }
    let mut j = ke;
    if j < b.len() && matches!(b[j], b'"' | b'\'') {
        j += 1;
    }
    j = skip_blank(b, j);
    if b.get(j) == Some(&b',') {
        j = skip_blank(b, j + 1);
    }
    if b.get(j) == Some(&b'\r') {
        j += 1;
    }
    if b.get(j) == Some(&b'\n') {
        j = skip_blank(b, j + 1);
    }
    // `"value": ...`: the field's opening quote.
    if matches!(b.get(j), Some(b'"' | b'\'')) {
        j += 1;
    }
    // `value`, or a name ending so (`ParameterValue`) after a named key.
    let mut w = j;
    while w < b.len() && w - j < 16 && b[w].is_ascii_alphabetic() {
        w += 1;
    }
    if !ends_ci(&b[j..w], b"value") {
        return None;
    }
    j = w;
    if j < b.len() && matches!(b[j], b'"' | b'\'') {
        j += 1;
    }
    j = skip_blank(b, j);
    matches!(b.get(j), Some(b':' | b'=')).then(|| skip_blank(b, j + 1))
}

/// Only blanks, a comment, or closing punctuation follow the value on its line.
fn ends_line(b: &[u8], ve: usize) -> bool {
    let mut k = ve;
    while k < b.len() && (is_blank(b[k]) || matches!(b[k], b',' | b';' | b'}' | b']' | b')')) {
        k += 1;
    }
    k >= b.len()
        || matches!(b[k], b'\n' | b'\r' | b'#')
        || b[k..].starts_with(b"//")
        || b[k..].starts_with(b"\\n")
}

/// `</key>` right after an XML value.
fn closes(b: &[u8], ve: usize, key: &[u8]) -> bool {
    let rest = &b[ve..];
    rest.len() > key.len() + 2
        && rest.starts_with(b"</")
        && rest[2..2 + key.len()].eq_ignore_ascii_case(key)
}

fn skip_scheme(b: &[u8], i: usize) -> usize {
    let w = word_at(b, i);
    let scheme = [
        &b"Bearer"[..],
        b"bearer",
        b"BEARER",
        b"Basic",
        b"basic",
        b"Token",
        b"token",
        b"Bot",
        b"Digest",
        b"AWS4-HMAC-SHA256",
        b"SSWS",
        b"OAuth",
        b"Splunk",
        b"GenieKey",
        b"Klaviyo-API-Key",
        b"Api-Key",
        b"ApiKey",
        b"Key",
        b"key",
    ];
    if scheme.contains(&w) && b.get(i + w.len()) == Some(&b' ') {
        skip_blank(b, i + w.len())
    } else {
        i
    }
}

/// Reads a value: quoted (same line), up to `<` after an XML tag, or a
/// bare word. Returns its span without quotes and whether it was quoted,
/// or, when there is none, how far it read.
fn value(b: &[u8], i: usize, op: Op) -> Result<(usize, usize, bool), usize> {
    let n = b.len();
    if i >= n {
        return Err(i);
    }
    let q = b[i];
    // A TOML or Python triple-quoted string on one line, or opened at
    // the end of its line and closed after one line of value.
    if matches!(q, b'"' | b'\'') && b.get(i + 1) == Some(&q) && b.get(i + 2) == Some(&q) {
        let mut vs = i + 3;
        if b.get(vs) == Some(&b'\n') {
            vs += 1;
        } else if b.get(vs) == Some(&b'\r') && b.get(vs + 1) == Some(&b'\n') {
            vs += 2;
        }
        let rest = &b[vs..n.min(vs + MAX_VALUE + 2)];
        let close = rest.windows(3).position(|w| w == [q, q, q]).ok_or(i)?;
        let mut ve = vs + close;
        while ve > vs && matches!(b[ve - 1], b'\n' | b'\r') {
            ve -= 1;
        }
        if ve == vs || b[vs..ve].contains(&b'\n') {
            return Err(i);
        }
        return Ok((vs, ve, true));
    }
    if matches!(q, b'"' | b'\'' | b'`') {
        let mut k = i + 1;
        while k < n && k - i <= MAX_VALUE {
            match b[k] {
                b'\\' => k += 2,
                b'\n' | b'\r' => return Err(i),
                c if c == q => return Ok((i + 1, k, true)),
                _ => k += 1,
            }
        }
        return Err(k);
    }
    if op == Op::Xml {
        let mut k = i;
        while k < n && k - i <= MAX_VALUE && b[k] != b'<' && b[k] != b'\n' {
            k += 1;
        }
        if k >= n || b[k] != b'<' {
            return Err(k);
        }
        let mut ve = k;
        while ve > i && b[ve - 1].is_ascii_whitespace() {
            ve -= 1;
        }
        return if ve > i { Ok((i, ve, true)) } else { Err(i) };
    }
    let mut k = i;
    while k < n
        && k - i <= MAX_VALUE
        && !b[k].is_ascii_whitespace()
        && !matches!(b[k], b'"' | b'\'' | b'`')
        && !(matches!(b[k], b'<' | b'>' | b';') && ends_at_mark(b, k))
        && !(b[k] == b'&' && ends_at_ampersand(b, k))
    {
        k += 1;
    }
    if k - i > MAX_VALUE {
        // A value longer than any a key takes in practice: still one value
        // (a key blob, a wrapped credential), read to its end (bounded)
        // and redacted whole rather than left in clear.
        while k < n && k - i <= MAX_LONG_VALUE && !b[k].is_ascii_whitespace() {
            k += 1;
        }
        return if k - i <= MAX_LONG_VALUE && op == Op::Assign {
            Ok((i, k, false))
        } else {
            Err(k)
        };
    }
    loop {
        // A closing bracket is punctuation only when the value did not open it.
        let closer = |c: u8, open: u8| c == b[k - 1] && !b[i..k].contains(&open);
        let unbalanced = k > i && (closer(b')', b'(') || closer(b']', b'[') || closer(b'}', b'{'));
        // Separators are dropped; `.`, `!` and `?` may end a password and
        // go with it (a sentence's full stop is redacted with it).
        if k > i && (matches!(b[k - 1], b',' | b';' | b':') || unbalanced) {
            k -= 1;
        } else if k > i + 1 && b[k - 2] == b'\\' && matches!(b[k - 1], b'n' | b't' | b'r') {
            // A `\n` escape at the end of a value inside a string literal.
            k -= 2;
        } else {
            break;
        }
    }
    if k > i { Ok((i, k, false)) } else { Err(i) }
}

/// `<` and `>` end a bare value; a `;` ends it when it ends the line or
/// the text, or starts the next field (`;Database=app`, `; export X=1`);
/// inside a password (`L1smg67;4cLT3g`) it does not.
fn ends_at_mark(b: &[u8], k: usize) -> bool {
    let Some(&next) = b.get(k + 1) else {
        return true;
    };
    if next.is_ascii_whitespace() {
        return true;
    }
    match b[k] {
        // A value holding either reads as a placeholder (`<your-key>`):
        // it ends there, and what comes before is judged alone.
        b'<' | b'>' => true,
        _ => {
            // `;` then a field name and `=` (a space allowed in the name:
            // `User Id=`).
            let mut j = k + 1;
            while j < b.len() && j - k <= 40 && (is_key_byte(b[j]) || b[j] == b' ') {
                j += 1;
            }
            j > k + 1 && b.get(j) == Some(&b'=') || next == b';'
        }
    }
}

/// An `&` ends a bare value when it starts the next query parameter
/// (`&user=...`), a shell operator (`&&`, a trailing `&`), or an entity
/// (`&amp;`); inside a password (`p@ss&word`) it does not.
fn ends_at_ampersand(b: &[u8], k: usize) -> bool {
    let mut j = k + 1;
    if j >= b.len() || b[j].is_ascii_whitespace() || b[j] == b'&' {
        return true;
    }
    while j < b.len()
        && j - k <= 32
        && (b[j].is_ascii_alphanumeric() || matches!(b[j], b'_' | b'-' | b'.'))
    {
        j += 1;
    }
    j > k + 1 && matches!(b.get(j), Some(b'=' | b';'))
}

/// The key starts its line (after indentation and `export`, `set`, `- `,
/// a quote or `{`) and the value ends it (up to `,` or a `#` comment):
/// a config file line, where a plain word is a real value.
fn config_line(b: &[u8], ks: usize, ve: usize, quoted: bool) -> bool {
    // The line start, looked for at most 16 bytes back.
    let mut ls = ks;
    while ls > 0 && b[ls - 1] != b'\n' {
        if ks - ls >= 16 {
            return false;
        }
        ls -= 1;
    }
    let prefix: Vec<u8> = b[ls..ks]
        .iter()
        .copied()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    let prefix_ok = matches!(
        prefix.as_slice(),
        b"" | b"-"
            | b"\""
            | b"'"
            | b"{"
            | b"{\""
            | b"-\""
            | b"export"
            | b"set"
            | b"ENV"
            | b"$env:"
            | b"const"
            | b"let"
            | b"var"
    );
    if !prefix_ok {
        return false;
    }
    let mut k = ve + usize::from(quoted);
    while k < b.len() && is_blank(b[k]) {
        k += 1;
    }
    k >= b.len() || matches!(b[k], b'\n' | b'\r' | b',' | b'#' | b';' | b'}')
}

// ---------------------------------------------------------------- value shape

static STOP_VALUES: Words = Words::new(
    "admin123 any bool boolean bytes changeit changeme default empty encrypted env environment \
     expired false hidden incorrect int integer internal invalid key masked missing n/a nil no none \
     null number object off omitted on option<string> optional pass passwd password plaintext \
     prompt prompted ask interactive keychain keyring stdin rotated reset changed disabled locked \
     pending enabled active inactive generated random auto unchanged same configured provided \
     inherited blank deprecated vault 1password bitwarden vaultwarden keepass keepassx keepassxc \
     lastpass dashlane keeper nordpass enpass roboform passbolt \
     private protected public redacted required required. revoked secret secrets secretstr \
     secretstring sensitive set str str? string string? tbd text token true undefined unknown unset \
     valid value values varchar wrong yes",
);

static REFERENCES: Needles = Needles::new(REFERENCE_MARKS);

const REFERENCE_MARKS: &[&str] = &[
    "${",
    "{{",
    "}}",
    "%(",
    "process.env",
    "os.environ",
    "getenv",
    "env(",
    "env[",
    "env.",
    "vault:",
    "ref+",
    "!ref",
    "arn:aws",
    "keyring",
    "@microsoft.keyvault",
    "secretkeyref",
    "valuefrom",
    "secrets.",
    "config.",
    "settings.",
    "{}",
    "{0}",
    "self.",
    "this.",
    "::",
    "=>",
    "->",
];

/// `$VAR`, `${VAR}`, `%VAR%`, `{{ secrets.X }}`, `<your-key>`,
/// `[REDACTED:...]`, `!vault`, `os.environ[...]` and the like.
fn is_reference(v: &[u8]) -> bool {
    // `!vault`, `!!binary`, `&anchor`, `*alias`, `@variable`, `*.example.com`:
    // a tag, anchor or name after the sign. After it, a generated string
    // (`!L1smg67^4cLT3g`, `&kt4t2mDs4LNVXBb`) is a password that starts
    // with punctuation.
    let named = |rest: &[u8]| {
        let rest = rest.strip_prefix(b"!").unwrap_or(rest);
        rest.split(|&c| matches!(c, b'.' | b'-' | b':' | b'/'))
            .all(|p| p.is_empty() || code_part(p))
    };
    // `{secret}`, `(none)`, `[REDACTED]`, `<key>`, `%VAR%`: closed again
    // later; `{whGcTZc)1UW-b5f` is a password that starts with a brace.
    let closed = |close: u8| v[1..].contains(&close);
    let sign = match v[0] {
        b'$' | b'\\' => true,
        b'%' => closed(b'%'),
        b'{' => closed(b'}'),
        b'<' => closed(b'>'),
        b'[' => closed(b']'),
        b'(' => closed(b')'),
        b'@' | b'&' | b'*' | b'!' => named(&v[1..]),
        _ => false,
    };
    // `env:VAR`, `file:/path`, `fd:3`: where OpenSSL and others read a
    // password from.
    let source = [&b"env:"[..], b"file:", b"fd:"]
        .iter()
        .any(|p| v.len() > p.len() && v[..p.len()].eq_ignore_ascii_case(p))
        // `pass:$VAR`, `pass:...`: OpenSSL's literal form around a
        // reference or a placeholder.
        || v.strip_prefix(b"pass:").is_some_and(|r| {
            r.first() == Some(&b'$') || is_placeholder(r) || r.iter().all(|&c| c == b'.')
        });
    sign || source || REFERENCES.in_ci(v) || format_directive(v)
}

/// `%s` or `%d` as a format directive: at the end, or before punctuation.
fn format_directive(v: &[u8]) -> bool {
    v.windows(2).enumerate().any(|(i, w)| {
        w[0] == b'%'
            && matches!(w[1], b's' | b'd')
            && v.get(i + 2).is_none_or(|c| !c.is_ascii_alphanumeric())
    })
}

fn is_stop_value(v: &[u8]) -> bool {
    v.len() <= 16 && std::str::from_utf8(v).is_ok_and(|v| STOP_VALUES.has(&v.to_ascii_lowercase()))
}

fn is_ident(part: &[u8]) -> bool {
    !part.is_empty()
        && (part[0].is_ascii_alphabetic() || part[0] == b'_')
        && part.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'_')
}

/// An identifier as people name things: words, with digits only at the
/// end (`self`, `db_config`, `item2`), not mixed in as in a generated
/// `Xk9mQ2` or `vL8Zr4Tq`.
fn code_part(part: &[u8]) -> bool {
    let stem = part
        .iter()
        .rposition(|c| !c.is_ascii_digit())
        .map_or(0, |i| i + 1);
    is_ident(part) && !part[..stem].iter().any(u8::is_ascii_digit)
}

/// `self.password`, `settings.API_KEY`, `foo(bar)`, `/etc/secret`.
/// `literal`: the value is a quoted string or a whole config line's value,
/// where brackets that do not pair are part of it, not a fragment of code.
fn is_code_or_path(v: &[u8], quoted: bool, literal: bool) -> bool {
    let dotted = v.contains(&b'.') && v.split(|&c| c == b'.').all(code_part);
    let call = !quoted
        && v.iter()
            .position(|&c| c == b'(')
            .is_some_and(|p| p > 0 && is_ident_path(&v[..p]));
    let path_start = v.starts_with(b"/")
        || v.starts_with(b"~/")
        || v.starts_with(b"./")
        || v.starts_with(b"../");
    let path = path_start
        && v.iter().filter(|&&c| c == b'/').count() >= 2
        && v.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'/' | b'.' | b'_' | b'-' | b'~'))
        && v.iter().filter(|c| c.is_ascii_uppercase()).count() * 5 < v.len();
    let windows_path = v.len() > 3 && v[0].is_ascii_alphabetic() && v[1] == b':' && v[2] == b'\\';
    // `Optional[str]`, `tokens[0]`, `parenthesized!(x)`, `a+len(b)`
    // In a literal, only when the value ends with the bracket (a config
    // line's `tokens[0]`, not a password with a `(` in it).
    let index = !quoted
        && (!literal || matches!(v.last(), Some(b')' | b']')))
        && v.iter().enumerate().any(|(i, &c)| {
            matches!(c, b'(' | b'[')
                && i >= 2
                && v[i - 2..i]
                    .iter()
                    .all(|&p| p.is_ascii_alphanumeric() || p == b'_' || p == b'!')
        });
    // `key=value` pairs (base64 padding sits only at the end): a name
    // before the first `=`.
    let pairs = v
        .iter()
        .rposition(|&c| c != b'=')
        .is_some_and(|last| v[..last].contains(&b'='))
        && v.split(|&c| c == b'=')
            .next()
            .is_some_and(|name| name.split(|&c| c == b'.' || c == b'-').all(code_part));
    // `projects/my-project/secrets/db`, `zones/us-central1-a`
    let resource_path = v.contains(&b'/')
        && v.iter().all(|&c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'/' | b'-' | b'_' | b'.')
        });
    // `ALL_CAPS_CONSTANT`, `snake_case_variable`
    // A name with `_` in one case: unquoted, `snake_case` or
    // `ALL_CAPS` is a variable; quoted, only `ALL_CAPS_CONSTANT` is a name.
    let lower = v.iter().any(u8::is_ascii_lowercase);
    let upper = v.iter().any(u8::is_ascii_uppercase);
    let digit = v.iter().any(u8::is_ascii_digit);
    let snake = v
        .windows(3)
        .any(|w| w[1] == b'_' && w[0].is_ascii_alphanumeric() && w[2].is_ascii_alphanumeric());
    let identifier = snake
        && is_ident(v)
        && if quoted {
            !lower && !digit
        } else {
            !(lower && upper)
        };
    // `foo)[0]`, `f(x`: a fragment of code or prose.
    let count = |c: u8| v.iter().filter(|&&x| x == c).count();
    let unbalanced = !literal && (count(b'(') != count(b')') || count(b'[') != count(b']'));
    // `server.pem`, `id_rsa.pub`: a file holding the secret, not the secret.
    let file = [
        ".pem", ".key", ".crt", ".cer", ".der", ".p12", ".pfx", ".json", ".txt", ".yaml", ".yml",
        ".env", ".pub", ".csr", ".jks",
    ]
    .iter()
    .any(|ext| {
        v.len() > ext.len() && v[v.len() - ext.len()..].eq_ignore_ascii_case(ext.as_bytes())
    });
    dotted
        || unbalanced
        || file
        || call
        || path
        || windows_path
        || index
        || pairs
        || resource_path
        || identifier
        || contains_ci(v, b"://")
}

fn is_ident_path(v: &[u8]) -> bool {
    v.split(|&c| c == b'.' || c == b':')
        .filter(|p| !p.is_empty())
        .all(is_ident)
}

/// Letters only (`hunter`, `Sunshine`).
fn plain_word(v: &[u8]) -> bool {
    v.iter().all(u8::is_ascii_alphabetic)
}

/// `SafeString`, `challengePassword`: a type or field name.
/// Its words are words: at least two letters each after the first, three
/// on average (`hNgVpqCzGdWmPyag` is random letters, not a name).
fn camel_case(v: &[u8]) -> bool {
    let humps = v
        .windows(2)
        .filter(|w| w[0].is_ascii_lowercase() && w[1].is_ascii_uppercase())
        .count();
    let mut words = Vec::new();
    let mut start = 0;
    for i in 1..v.len() {
        if v[i - 1].is_ascii_lowercase() && v[i].is_ascii_uppercase() {
            words.push(i - start);
            start = i;
        }
    }
    words.push(v.len() - start);
    humps >= 1
        && v.iter().filter(|c| c.is_ascii_uppercase()).count() <= humps + 1
        && words.iter().skip(1).all(|&n| n >= 2)
        && v.len() >= 3 * words.len()
}

/// Words joined by `_`, `-` or `.` with no digit (`access_token`, `MY-APP`).
fn identifier_words(v: &[u8]) -> bool {
    v.iter()
        .all(|&c| c.is_ascii_alphabetic() || matches!(c, b'_' | b'-' | b'.'))
}

/// Cheapest tests first: this runs on every value that has the shape.
/// Dates, times, versions and addresses: digits and `-:./TZ+,` only.
fn is_date_or_number(v: &[u8]) -> bool {
    // `0x1F`, `0xdeadbeef`: a number; 64 hex digits after `0x` are a key.
    let hex_literal = v.len() > 2
        && v.len() <= 2 + 16
        && (v.starts_with(b"0x") || v.starts_with(b"0X"))
        && is_hex(&v[2..]);
    hex_literal
        || v.iter()
            .all(|c| c.is_ascii_digit() || b"-:./TZ+,".contains(c))
            && v.iter().any(|c| b"-:./".contains(c))
}

/// `name@host.tld`
fn is_email(v: &[u8]) -> bool {
    let Some(at) = v.iter().position(|&c| c == b'@') else {
        return false;
    };
    let (user, host) = (&v[..at], &v[at + 1..]);
    let dot = host.iter().rposition(|&c| c == b'.');
    !user.is_empty()
        && dot.is_some_and(|d| {
            d > 0 && host.len() - d > 2 && host[d + 1..].iter().all(u8::is_ascii_alphabetic)
        })
        && host
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'.' || c == b'-')
}

fn common_rejects(v: &[u8], quoted: bool) -> bool {
    rejects(v, quoted, quoted)
}

/// [`common_rejects`]; `literal`: see [`is_code_or_path`].
fn rejects(v: &[u8], quoted: bool, literal: bool) -> bool {
    v.is_empty()
        // Stripe's publishable keys are public by design.
        || v.starts_with(b"pk_live_")
        || v.starts_with(b"pk_test_")
        || test_name(v)
        || is_date_or_number(v)
        || is_uuid(v)
        || is_email(v)
        || is_reference(v)
        || is_stop_value(v)
        || is_code_or_path(v, quoted, literal)
        || is_placeholder(v)
}

/// Words that mark a quoted value with spaces as a description, not a
/// passphrase.
static PROSE_WORDS: Words = Words::new(
    "a an and at be by characters chars enter for from here in is least must not of or password \
     please required should the to use user user's with your",
);

/// A quoted passphrase such as `"correct horse battery staple"`: two to
/// eight words, none of them the small words of a sentence.
fn passphrase(v: &[u8]) -> bool {
    let Ok(v) = std::str::from_utf8(v) else {
        return false;
    };
    let words: Vec<String> = v.split(' ').map(str::to_ascii_lowercase).collect();
    (2..=8).contains(&words.len())
        && v.len() >= 12
        && words.iter().all(|w| !w.is_empty() && !PROSE_WORDS.has(w))
}

/// Words between `as` and `password` in "use ... as the password".
static AS_THE: Words = Words::new(
    "the a my your our new root admin db database wifi wi-fi user account login default",
);

/// "Use X as the password", "set X as my new password": the value comes
/// before the keyword. The hit is `pass`; the words before it are read
/// backwards (at most three between `as` and the keyword, 64 bytes of
/// value).
pub(crate) fn use_as_password(
    text: &str,
    s: usize,
    e: usize,
    _skip: &mut usize,
) -> Option<(usize, usize)> {
    let b = text.as_bytes();
    if s == 0 || b[s - 1] != b' ' {
        return None;
    }
    let kw_end = s + b[s..]
        .iter()
        .take(12)
        .take_while(|c| c.is_ascii_alphabetic())
        .count();
    let kw = b[s..kw_end].to_ascii_lowercase();
    if !matches!(
        kw.as_slice(),
        b"pass" | b"password" | b"passphrase" | b"passcode"
    ) || kw_end < e
    {
        return None;
    }
    // The word before `[s, end)`, with the blank before `end` skipped.
    let word_before = |end: usize| -> Option<(usize, usize)> {
        let we = end
            .checked_sub(1)
            .filter(|&i| b[i] == b' ' || b[i] == b'\t')?;
        let mut ws = we;
        while ws > 0 && we - ws < 64 && !b[ws - 1].is_ascii_whitespace() {
            ws -= 1;
        }
        (ws < we).then_some((ws, we))
    };
    let mut at = s;
    let mut as_at = None;
    for _ in 0..4 {
        let (ws, we) = word_before(at)?;
        let w = &b[ws..we];
        if w == b"as" {
            as_at = Some(ws);
            break;
        }
        let lower = std::str::from_utf8(w).ok()?.to_ascii_lowercase();
        if !AS_THE.has(&lower) {
            return None;
        }
        at = ws;
    }
    let (vs, ve) = word_before(as_at?)?;
    let (us, ue) = word_before(vs)?;
    let verb = b[us..ue].to_ascii_lowercase();
    if !matches!(
        verb.as_slice(),
        b"use" | b"set" | b"try" | b"enter" | b"type"
    ) {
        return None;
    }
    let v = &b[vs..ve];
    (v.len() >= 4 && password_shape(v, Op::Prose, false, false)).then_some((vs, ve))
}

/// A test's name as test runners print it (`--- PASS: TestLogin2`,
/// `PASS: test-suite-v2`, `TestAPI/GET_users`).
fn test_name(v: &[u8]) -> bool {
    (v.starts_with(b"Test") || v.starts_with(b"test"))
        && v.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'/' | b'.'))
}

/// A command line's password argument: four or more characters, not a
/// flag, a reference, a path, a number or a placeholder.
pub(crate) fn command_value(v: &[u8]) -> bool {
    // `NEWPASS`, `PASSWORD`: a template's capitals.
    let capitals = v.iter().all(u8::is_ascii_uppercase);
    v.len() >= 4 && v[0] != b'-' && !capitals && !common_rejects(v, false)
}

/// A password written in a sentence or a note after a word that names it
/// (`pass X`, `login jane / X`, `mot de passe : X`): a chosen password's
/// shape (six or more characters with a digit, or mixed case and a
/// symbol), or three or more words joined by `-` or `.` (`duty.comic.split`).
pub(crate) fn prose_password(v: &[u8]) -> bool {
    if !(6..=128).contains(&v.len()) {
        return false;
    }
    let joined = {
        let parts: Vec<&[u8]> = v.split(|&c| c == b'-' || c == b'.').collect();
        parts.len() >= 3
            && parts
                .iter()
                .all(|p| p.len() >= 2 && p.iter().all(u8::is_ascii_alphanumeric))
            && parts
                .iter()
                .filter(|p| p.iter().all(u8::is_ascii_lowercase))
                .count()
                >= 3
    };
    (password_shape(v, Op::Prose, false, false) || joined) && !rejects(v, false, false)
}

/// A password where only a weak word names it (`pass X`, `wifi NAME /
/// X`, `clave: X`): eight or more characters with lower case, upper case
/// and digits, or letters and a symbol other than `- _ . /`, or three or
/// more lower-case words joined by `-` or `.`; not a name in camelCase
/// with a number (`customerId2`). Technical names (`ESP32-S3`, `wlp2s0`,
/// `us-east-1`, `WPA2-PSK`) are not.
pub(crate) fn strong_password(v: &[u8]) -> bool {
    if !(8..=128).contains(&v.len())
        || v.contains(&b'/')
        || v.contains(&b'\\')
        || rejects(v, false, false)
    {
        return false;
    }
    let c = Classes::of(v);
    let symbol = v
        .iter()
        .any(|b| b.is_ascii_punctuation() && !matches!(b, b'-' | b'_' | b'.' | b'/' | b'\\'));
    let parts: Vec<&[u8]> = v.split(|&b| b == b'-' || b == b'.').collect();
    let joined = parts.len() >= 3
        && parts
            .iter()
            .filter(|p| p.len() >= 2 && p.iter().all(u8::is_ascii_lowercase))
            .count()
            >= 3;
    let stem = v
        .iter()
        .rposition(|b| !b.is_ascii_digit())
        .map_or(0, |i| i + 1);
    let named = stem < v.len() && camel_case(&v[..stem]);
    ((c.lower && c.upper && c.digit) || (symbol && c.letter()) || joined) && !named
}

fn password_shape(v: &[u8], op: Op, quoted: bool, config: bool) -> bool {
    if v.len() < 4 {
        return false;
    }
    if v.contains(&b' ') {
        return quoted && config && passphrase(v) && !rejects(v, quoted, true);
    }
    let c = Classes::of(v);
    let shaped = match op {
        Op::Bare => false, // see `assignment`
        Op::Prose => {
            v.len() >= 6 && (c.digit || (c.upper && c.lower && c.other)) && !identifier_words(v)
        }
        Op::Assign | Op::Xml | Op::Space => {
            if plain_word(v) {
                let flag_word = op == Op::Space && v.len() >= 8 && c.upper && c.lower;
                (quoted || config || flag_word) && v.len() >= 5 && !camel_case(v)
            } else {
                v.len() >= 5 && !(identifier_words(v) && !quoted && !config)
            }
        }
    };
    shaped && !rejects(v, quoted, quoted || config)
}

fn secret_shape(v: &[u8], op: Op, tier: Tier, quoted: bool) -> bool {
    if v.len() < 8 || v.contains(&b' ') {
        return false;
    }
    // `kerberos-5p-read-only`, `a,b,c`: names and lists.
    if joined_words(v) || (!quoted && v.contains(&b',')) {
        return false;
    }
    let c = Classes::of(v);
    let strict = tier == Tier::Strict
        || matches!(op, Op::Prose | Op::Bare)
        || (op == Op::Space && tier != Tier::Bearer);
    let shaped = if strict {
        v.len() >= 16
            && c.letter()
            && (c.digit || (c.upper && c.lower && v.len() >= 20))
            && !is_uuid(v)
            && !(tier == Tier::Strict && is_hex(v) && matches!(v.len(), 40 | 64))
            && entropy(v) >= 3.2
            && !reads_like_words(v)
    } else if tier == Tier::Bearer {
        v.len() >= 12 && !plain_word(v) && (c.digit || c.other) && entropy(v) >= 3.0
    } else if v.iter().all(u8::is_ascii_digit) {
        v.len() >= 10
    } else if identifier_words(v) {
        plain_word(v)
            && v.len() >= 20
            && c.upper
            && c.lower
            && entropy(v) >= 3.5
            && !reads_like_words(v)
    } else if [&b"sha1"[..], b"sha256", b"sha512", b"md5"]
        .iter()
        .any(|p| v.starts_with(p))
    {
        false
    } else {
        let h = entropy(v);
        h >= 2.5 && ((c.letter() && c.digit) || (v.len() >= 16 && h >= 3.0)) && !reads_like_words(v)
    };
    // `MYTOKEN2`, `api_key_here`: a value naming what it stands for.
    static NAMES: Needles = Needles::new(&[
        "token", "secret", "apikey", "api_key", "api-key", "password",
    ]);
    let names_a_secret = NAMES.in_ci(v);
    shaped && !names_a_secret && !common_rejects(v, quoted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_words() {
        assert_eq!(words(b"dbPassword"), ["db", "password"]);
        assert_eq!(words(b"APIKey"), ["api", "key"]);
        assert_eq!(
            words(b"AWS_SECRET_ACCESS_KEY"),
            ["aws", "secret", "access", "key"]
        );
        assert_eq!(words(b"x-api-key"), ["x", "api", "key"]);
        assert_eq!(words(b"OAuth2Token"), ["o", "auth2", "token"]);
    }

    #[test]
    fn classifies_keys() {
        let c = |k: &str| classify(k.as_bytes()).map(|(c, _)| c);
        assert_eq!(c("password"), Some(Class::Password));
        assert_eq!(c("PGPASSWORD"), Some(Class::Password));
        assert_eq!(c("DB_PASS"), Some(Class::Password));
        assert_eq!(c("api_key"), Some(Class::Secret));
        assert_eq!(c("clientSecret"), Some(Class::Secret));
        assert_eq!(c("GITHUB_TOKEN"), Some(Class::Secret));
        assert_eq!(c("passport"), None);
        assert_eq!(c("bypass"), None);
        assert_eq!(c("password_hint"), None);
        assert_eq!(c("public_key"), None);
        assert_eq!(c("primary_key"), None);
        assert_eq!(c("max_tokens"), None);
        assert_eq!(c("next_page_token"), None);
        assert_eq!(c("secret_name"), None);
        assert_eq!(c("keyboard"), None);
        assert_eq!(c("monkey"), None);
    }
}
