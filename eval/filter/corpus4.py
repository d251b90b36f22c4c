#!/usr/bin/env python3
"""Corpus 4 (session 32's attack): fake secrets and look-alikes written to measure the
filter on text it had not seen (59 vendor formats without a rule then, webhooks, passwords
named in 20 languages, cards, IBANs, encodings, split and obfuscated secrets). Some of its
misses were then fixed, so it now measures regressions too.
Entries have eval/filter's shape (id, family, text, secrets, benign, note) plus optional
"strip": a regex removed from the output before judging (for split/obfuscated secrets).
Run: python3 corpus4.py > corpus4.jsonl   (seeded: same output every run)."""
import random, string, base64, hashlib, json, zlib, uuid, sys, codecs, urllib.parse

R = random.Random(32032)
C = []
AL = string.ascii_letters + string.digits
UP = string.ascii_uppercase + string.digits
LO = string.ascii_lowercase + string.digits
HEX = "0123456789abcdef"
B64 = AL + "+/"
B64U = AL + "-_"
def rs(n, a=AL): return "".join(R.choice(a) for _ in range(n))
def U(): return str(uuid.UUID(int=R.getrandbits(128), version=4))
def b64(b): return base64.b64encode(b if isinstance(b, bytes) else b.encode()).decode()
def b64u(b): return base64.urlsafe_b64encode(b if isinstance(b, bytes) else b.encode()).decode().rstrip("=")

def add(family, ctx, text, secrets, note="", strip=None):
    e = {"id": f"{family}/{ctx}/{len(C)}", "family": family, "ctx": ctx, "text": text,
         "secrets": secrets if isinstance(secrets, list) else [secrets], "benign": False, "note": note}
    if strip: e["strip"] = strip
    C.append(e)
def benign(sub, ctx, text, note=""):
    C.append({"id": f"fp/{sub}/{ctx}/{len(C)}", "family": f"fp/{sub}", "ctx": ctx, "text": text,
              "secrets": [], "benign": True, "note": note})

# ------------------------------------------------------------------ checksums
B62 = string.digits + string.ascii_uppercase + string.ascii_lowercase
def base62(n, w):
    s = ""
    while n: n, r = divmod(n, 62); s = B62[r] + s
    return s.rjust(w, "0")
def gh(prefix):  # GitHub/npm style: 30 random + 6 base62 crc32
    body = rs(30); return prefix + body + base62(zlib.crc32(body.encode()), 6)
def luhn_complete(p, n):
    d = p + "".join(R.choice(string.digits) for _ in range(n - len(p) - 1))
    s = 0
    for i, ch in enumerate(reversed(d)):
        x = int(ch)
        if i % 2 == 0: x *= 2; x = x - 9 if x > 9 else x
        s += x
    return d + str((10 - s % 10) % 10)
def iban(cc, bban_len, alpha=False):
    bban = "".join(R.choice(UP if alpha and i < 4 else string.digits) for i in range(bban_len))
    num = "".join(str(int(c, 36)) for c in bban + cc + "00")
    return cc + f"{98 - int(num) % 97:02d}" + bban
B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
def b58check(payload):
    chk = hashlib.sha256(hashlib.sha256(payload).digest()).digest()[:4]
    n = int.from_bytes(payload + chk, "big"); s = ""
    while n: n, r = divmod(n, 58); s = B58[r] + s
    return "1" * (len(payload) - len(payload.lstrip(b"\0"))) + s
def wif(): return b58check(b"\x80" + R.randbytes(32) + b"\x01")
BECH = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"
def bech32(hrp, data8):
    acc = bits = 0; d5 = []
    for b in data8:
        acc = (acc << 8) | b; bits += 8
        while bits >= 5: bits -= 5; d5.append((acc >> bits) & 31)
    if bits: d5.append((acc << (5 - bits)) & 31)
    def polymod(v):
        g = [0x3b6a57b2, 0x26508e6d, 0x1ea119fa, 0x3d4233dd, 0x2a1462b3]; c = 1
        for x in v:
            b = c >> 25; c = (c & 0x1ffffff) << 5 ^ x
            for i in range(5): c ^= g[i] if (b >> i) & 1 else 0
        return c
    hx = [ord(x) >> 5 for x in hrp] + [0] + [ord(x) & 31 for x in hrp]
    pm = polymod(hx + d5 + [0] * 6) ^ 1
    return hrp + "1" + "".join(BECH[x] for x in d5 + [(pm >> 5 * (5 - i)) & 31 for i in range(6)])
def ssn():
    a = R.choice([x for x in range(1, 900) if x != 666]); return f"{a:03d}-{R.randint(1,99):02d}-{R.randint(1,9999):04d}"
SYM = "!#%*_-.+~^$@&"
def pw():
    k = R.choice(["rand", "rand", "human", "sym"])
    if k == "rand": return rs(R.randint(12, 16)) + R.choice(SYM) + str(R.randint(10, 99))
    if k == "human": return R.choice(["Falcon", "Maple", "Orbit", "Tundra", "Quartz"]) + rs(4, string.ascii_lowercase) + str(R.randint(1990, 2026)) + R.choice("!#*")
    return rs(6) + R.choice(SYM) + rs(6) + R.choice(SYM) + rs(3)
def jwt(payload=None):
    h = b64u(json.dumps({"alg": "HS256", "typ": "JWT"}))
    p = b64u(json.dumps(payload or {"sub": U(), "iat": R.randint(1.7e9, 1.8e9), "role": "service"}))
    return f"{h}.{p}.{b64u(R.randbytes(32))}"
def pem_body(nbytes):
    s = b64(R.randbytes(nbytes)); return [s[i:i + 64] for i in range(0, len(s), 64)]

# ------------------------------------------------------------------ contexts for a bare token
def token_contexts(vendor, var, v):
    slug = vendor.lower().replace(" ", "-")
    return {
        "env": f"{var}={v}",
        "yaml": f"{slug}:\n  enabled: true\n  api_key: \"{v}\"\n",
        "prose": f"Note to self: the {vendor} credential we use in staging is {v} (rotate it in March).",
        "table": f"| service | value |\n|---|---|\n| {vendor} | {v} |",
        "log": f"2025-03-14T10:22:31Z INFO client init vendor={slug} cred={v} region=eu-west-1",
        "curl": f"curl -s https://api.{slug}.example/v1/ping -H 'X-Custom-Auth: {v}'",
        "json": json.dumps({"provider": vendor, "value": v}),
        "csv": f"name,kind,value\n{slug},api,{v}",
        "mdcode": f"Use `{v}` when calling {vendor} from the worker.",
        "de": f"Der {vendor}-Zugang für Produktion lautet {v}, bitte nicht teilen.",
        "ja": f"{vendor} のトークンは {v} です。",
        "toml": f"[{slug}]\nkey = \"{v}\"\n",
    }
def vendor(fam, vendorname, var, gen, ctxs=None, n=1, note=""):
    for ctx, t in token_contexts(vendorname, var, None).items():
        if ctxs and ctx not in ctxs: continue
        for _ in range(n):
            v = gen(); add(f"vendor/{fam}", ctx, token_contexts(vendorname, var, v)[ctx], v, note)

ALL = None
vendor("azure-devops-pat-new", "Azure DevOps", "AZDO_PAT", lambda: rs(52) + "JQQJ99" + rs(18) + "AZDO" + rs(4))
vendor("azure-devops-pat-legacy", "Azure DevOps", "AZURE_DEVOPS_EXT_PAT", lambda: rs(52, "abcdefghijklmnopqrstuvwxyz234567"))
vendor("azure-storage-key-bare", "Azure Storage", "AZURE_STORAGE_KEY", lambda: b64(R.randbytes(64)))
vendor("azure-cosmos-key", "Cosmos DB", "COSMOS_KEY", lambda: rs(76, B64) + "ACDb" + rs(6) + "==")
vendor("azure-functions-key", "Azure Functions", "FUNC_KEY", lambda: rs(44, B64U) + "AzFu" + rs(6) + "==")
vendor("azure-apim-key", "APIM", "OCP_APIM_SUBSCRIPTION_KEY", lambda: rs(32, HEX))
vendor("gcp-hmac-access-id", "GCS HMAC", "GCS_HMAC_ACCESS_ID", lambda: "GOOG1E" + rs(55, UP))
vendor("ibm-cloud-api-key", "IBM Cloud", "IBMCLOUD_API_KEY", lambda: rs(44, B64U))
vendor("backblaze-app-key", "Backblaze B2", "B2_APPLICATION_KEY", lambda: "K005" + rs(27))
vendor("linode-token", "Linode", "LINODE_TOKEN", lambda: rs(64, HEX))
vendor("hetzner-token", "Hetzner", "HCLOUD_TOKEN", lambda: rs(64))
vendor("vultr-key", "Vultr", "VULTR_API_KEY", lambda: rs(36, string.ascii_uppercase + string.digits))
vendor("scaleway-secret", "Scaleway", "SCW_SECRET_KEY", U)
vendor("cloudflare-api-token", "Cloudflare", "CLOUDFLARE_API_TOKEN", lambda: rs(40, B64U))
vendor("cloudflare-global-key", "Cloudflare", "CF_API_KEY", lambda: rs(37, HEX))
vendor("fastly-token", "Fastly", "FASTLY_API_TOKEN", lambda: rs(32, B64U))
vendor("okta-token", "Okta", "OKTA_API_TOKEN", lambda: "00" + rs(40, B64U))
vendor("launchdarkly-key", "LaunchDarkly", "LD_API_KEY", lambda: "api-" + U())
vendor("launchdarkly-sdk", "LaunchDarkly", "LD_SDK_KEY", lambda: "sdk-" + U())
vendor("algolia-admin", "Algolia", "ALGOLIA_ADMIN_KEY", lambda: rs(32, HEX))
vendor("pagerduty", "PagerDuty", "PAGERDUTY_TOKEN", lambda: "u+" + rs(18, B64U))
vendor("telnyx", "Telnyx", "TELNYX_API_KEY", lambda: "KEY01" + rs(24, UP) + "_" + rs(22))
vendor("mistral", "Mistral", "MISTRAL_API_KEY", lambda: rs(32))
vendor("cohere", "Cohere", "CO_API_KEY", lambda: rs(40))
vendor("deepseek", "DeepSeek", "DEEPSEEK_API_KEY", lambda: "sk-" + rs(32, HEX))
vendor("stability", "Stability AI", "STABILITY_API_KEY", lambda: "sk-" + rs(48))
vendor("deepl", "DeepL", "DEEPL_AUTH_KEY", lambda: U() + ":fx")
vendor("lob", "Lob", "LOB_API_KEY", lambda: "live_" + rs(35, HEX))
vendor("gocardless", "GoCardless", "GC_ACCESS_TOKEN", lambda: "live_" + rs(40, B64U))
vendor("flutterwave", "Flutterwave", "FLW_SECRET_KEY", lambda: "FLWSECK-" + rs(32, HEX) + "-X")
vendor("defined-networking", "Defined Networking", "DN_API_KEY", lambda: "dnkey-" + rs(26, UP) + "-" + rs(52, UP))
vendor("maxmind", "MaxMind", "MAXMIND_LICENSE_KEY", lambda: rs(6) + "_" + rs(29) + "_mmk")
vendor("gitea", "Gitea", "GITEA_TOKEN", lambda: rs(40, HEX))
vendor("docker-swarm", "Docker Swarm", "SWARM_TOKEN", lambda: "SWMTKN-1-" + rs(50, LO) + "-" + rs(25, LO))
vendor("k8s-bootstrap", "kubeadm", "KUBEADM_TOKEN", lambda: rs(6, LO) + "." + rs(16, LO))
vendor("twitch", "Twitch", "TWITCH_CLIENT_SECRET", lambda: rs(30, LO))
vendor("pusher-secret", "Pusher", "PUSHER_APP_SECRET", lambda: rs(20, HEX))
vendor("ably", "Ably", "ABLY_API_KEY", lambda: rs(6) + "." + rs(6) + ":" + rs(43, B64U))
vendor("rails-secret-key-base", "Rails", "SECRET_KEY_BASE", lambda: rs(128, HEX))
vendor("laravel-app-key", "Laravel", "APP_KEY", lambda: "base64:" + b64(R.randbytes(32)))
vendor("wireguard", "WireGuard", "WG_PRIVATE_KEY", lambda: b64(R.randbytes(32)))
vendor("vault-unseal", "Vault", "VAULT_UNSEAL_KEY_1", lambda: b64(R.randbytes(32)))
vendor("github-oauth-secret", "GitHub OAuth app", "GITHUB_CLIENT_SECRET", lambda: rs(40, HEX))
vendor("auth0-client-secret", "Auth0", "AUTH0_CLIENT_SECRET", lambda: rs(64, B64U))
vendor("keycloak-client-secret", "Keycloak", "KC_CLIENT_SECRET", lambda: rs(32))
vendor("rapidapi", "RapidAPI", "RAPIDAPI_KEY", lambda: rs(50))
vendor("huawei-sk", "Huawei Cloud", "HUAWEICLOUD_SDK_SK", lambda: rs(40))
vendor("tencent-secret-key", "Tencent Cloud", "TENCENTCLOUD_SECRET_KEY", lambda: rs(32))
vendor("do-spaces-key", "DO Spaces", "SPACES_KEY", lambda: "DO00" + rs(16, UP))
vendor("nostr-nsec", "Nostr", "NOSTR_NSEC", lambda: bech32("nsec", R.randbytes(32)))
vendor("bitcoin-wif", "Bitcoin wallet", "BTC_WIF", wif)
vendor("eth-private-key", "Ethereum wallet", "ETH_PRIVATE_KEY", lambda: "0x" + rs(64, HEX))
vendor("paseto-v4-local", "PASETO", "SESSION_TOKEN", lambda: "v4.local." + b64u(R.randbytes(90)))
vendor("paseto-v2-public", "PASETO", "PASETO_TOKEN", lambda: "v2.public." + b64u(R.randbytes(120)) + "." + b64u('{"kid":"k1"}'))
vendor("fernet", "Fernet", "FERNET_TOKEN", lambda: "gAAAAAB" + b64u(R.randbytes(100)) + "==")
vendor("fernet-key", "Fernet", "FERNET_KEY", lambda: base64.urlsafe_b64encode(R.randbytes(32)).decode())
vendor("macaroon", "macaroon", "MACAROON", lambda: b64u(b"0021location https://auth.example\n0030identifier " + R.randbytes(40) + b"\n002fsignature " + R.randbytes(32)))
vendor("jwe", "JWE", "ID_TOKEN", lambda: b64u('{"alg":"RSA-OAEP","enc":"A256GCM"}') + "." + b64u(R.randbytes(256)) + "." + b64u(R.randbytes(12)) + "." + b64u(R.randbytes(80)) + "." + b64u(R.randbytes(16)))
vendor("sidekiq", "Sidekiq Enterprise", "BUNDLE_ENTERPRISE__CONTRIBSYS__COM", lambda: rs(8, HEX) + ":" + rs(8, HEX))
# formats in the rule list, as control (prefix known)
vendor("ctl-github-pat", "GitHub", "GH_TOKEN", lambda: gh("ghp_"))
vendor("ctl-npm", "npm", "NPM_TOKEN", lambda: gh("npm_"))
vendor("ctl-stripe", "Stripe", "STRIPE_KEY", lambda: "sk_live_" + rs(99))
vendor("ctl-anthropic", "Anthropic", "ANTHROPIC_API_KEY", lambda: "sk-ant-api03-" + rs(93, B64U) + "AA")
vendor("ctl-jwt", "Auth", "ACCESS_TOKEN", jwt)

# ------------------------------------------------------------------ webhooks (URL holds the secret)
hooks = [
    ("discordapp", lambda: (t := rs(68, B64U), f"https://discordapp.com/api/webhooks/{R.randint(10**17, 10**18)}/{t}")),
    ("discord-ptb", lambda: (t := rs(68, B64U), f"https://ptb.discord.com/api/v10/webhooks/{R.randint(10**17, 10**18)}/{t}")),
    ("teams-workflow", lambda: (t := rs(43, B64U), f"https://prod-27.westeurope.logic.azure.com:443/workflows/{rs(32, HEX)}/triggers/manual/paths/invoke?api-version=2016-06-01&sp=%2Ftriggers%2Fmanual%2Frun&sv=1.0&sig={t}")),
    ("google-chat", lambda: (t := rs(43, B64U), f"https://chat.googleapis.com/v1/spaces/AAAA{rs(7)}/messages?key=AIzaSy{rs(33, B64U)}&token={t}")),
    ("dingtalk", lambda: (t := rs(64, HEX), f"https://oapi.dingtalk.com/robot/send?access_token={t}")),
    ("feishu", lambda: (t := U(), f"https://open.feishu.cn/open-apis/bot/v2/hook/{t}")),
    ("wecom", lambda: (t := U(), f"https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key={t}")),
    ("ifttt", lambda: (t := rs(22, B64U), f"https://maker.ifttt.com/trigger/door_open/with/key/{t}")),
    ("rocketchat", lambda: (t := rs(48), f"https://chat.example.org/hooks/{rs(17)}/{t}")),
    ("webex", lambda: (t := b64u(R.randbytes(60)), f"https://webexapis.com/v1/webhooks/incoming/{t}")),
    ("make", lambda: (t := rs(32, LO), f"https://hook.eu1.make.com/{t}")),
    ("sentry-dsn-secret", lambda: (t := rs(32, HEX), f"https://{rs(32, HEX)}:{t}@o{R.randint(10000,99999)}.ingest.sentry.io/{R.randint(100000,999999)}")),
    ("slack-ctl", lambda: (t := rs(24), f"https://hooks.slack.com/services/T{rs(8, UP)}/B{rs(10, UP)}/{t}")),
]
for name, g in hooks:
    for ctx in ["env", "prose", "yaml", "shell", "table"]:
        t, url = g()
        txt = {"env": f"ALERT_WEBHOOK_URL={url}", "prose": f"Alerts go to {url} since the migration.",
               "yaml": f"notify:\n  url: {url}\n", "shell": f"curl -X POST -d '{{\"text\":\"deploy ok\"}}' '{url}'",
               "table": f"| channel | hook |\n|---|---|\n| #ops | {url} |"}[ctx]
        add(f"webhook/{name}", ctx, txt, t)

# ------------------------------------------------------------------ cloud keys, unusual spellings
for i in range(3):
    kid = "AKIA" + rs(16, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"); sk = rs(40, B64)
    sess = "FwoGZXIvYXdzE" + rs(340, B64)
    asia = "ASIA" + rs(16, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")
    add("cloud/aws-csv", str(i), f"User name,Password,Access key ID,Secret access key,Console login link\nci-bot,,{kid},{sk},https://123456789012.signin.aws.amazon.com/console", [kid, sk])
    add("cloud/aws-sts-json", str(i), json.dumps({"Credentials": {"AccessKeyId": asia, "SecretAccessKey": sk, "SessionToken": sess, "Expiration": "2025-05-01T12:00:00Z"}}, indent=2), [asia, sk, sess])
    add("cloud/aws-java-props", str(i), f"aws.accessKeyId={kid}\naws.secretKey={sk}", [kid, sk])
    add("cloud/aws-s3cfg", str(i), f"[default]\naccess_key = {kid}\nsecret_key = {sk}\nhost_base = s3.amazonaws.com", [kid, sk])
    add("cloud/aws-prose", str(i), f"Bob's IAM user: key id {kid}, secret {sk} (created 2025-02-01).", [kid, sk])
    add("cloud/aws-secret-alone-prose", str(i), f"The AWS secret for the backup user is {sk}", [sk])
    add("cloud/aws-table", str(i), f"| env | access key | secret key |\n|---|---|---|\n| prod | {kid} | {sk} |", [kid, sk])
    add("cloud/aws-cli-configure", str(i), f"$ aws configure set aws_secret_access_key {sk} --profile prod", [sk])
    add("cloud/aws-session-token-env", str(i), f"export AWS_SESSION_TOKEN={sess}", [sess])
    add("cloud/aws-rclone", str(i), f"[s3remote]\ntype = s3\nprovider = AWS\naccess_key_id = {kid}\nsecret_access_key = {sk}", [kid, sk])
    add("cloud/aws-terraform", str(i), f'provider "aws" {{\n  region     = "us-east-1"\n  access_key = "{kid}"\n  secret_key = "{sk}"\n}}', [kid, sk])
    ali_id = "LTAI" + rs(20); ali_sk = rs(30)
    add("cloud/alibaba-pair-prose", str(i), f"Aliyun OSS: AccessKey ID {ali_id} / AccessKey Secret {ali_sk}", [ali_id, ali_sk])
    hk = rs(20, UP); hs = rs(40)
    add("cloud/huawei-ak-sk", str(i), f"华为云 AK: {hk}\nSK: {hs}", [hs])
    dsk = b64(R.randbytes(32)).rstrip("=")
    add("cloud/do-spaces-pair", str(i), f"spaces access key DO00{rs(16, UP)} secret {dsk}", [dsk])
    gsk = rs(40, B64)
    add("cloud/gcs-hmac-pair", str(i), f"GCS interop keys\naccess: GOOG1E{rs(55, UP)}\nsecret: {gsk}", [gsk])
    sa_lines = pem_body(1200)
    sa = json.dumps({"type": "service_account", "project_id": "acme-prod", "private_key_id": rs(40, HEX),
                     "private_key": "-----BEGIN PRIVATE KEY-----\n" + "\n".join(sa_lines) + "\n-----END PRIVATE KEY-----\n",
                     "client_email": "ci@acme-prod.iam.gserviceaccount.com"})
    add("cloud/gcp-sa-json", str(i), sa, [sa_lines[3], sa_lines[10]])
    azs = rs(3) + "8Q~" + rs(31, B64U + ".~")
    add("cloud/azure-secret-old32", str(i), f"AZURE_TENANT_ID={U()}\nAZURE_CLIENT_ID={U()}\nAZURE_CLIENT_SECRET={rs(32, AL + '-_.~')}".rsplit("=", 1)[0] + "=" + (old := rs(32, AL + '-_.~')), [old])
    add("cloud/azure-sp-json", str(i), json.dumps({"appId": U(), "displayName": "ci", "password": azs, "tenant": U()}), [azs])

# ------------------------------------------------------------------ private keys
def pem(kind, n): 
    body = pem_body(n); return f"-----BEGIN {kind}-----\n" + "\n".join(body) + f"\n-----END {kind}-----", body
for i in range(2):
    t, b = pem("EC PRIVATE KEY", 121); add("pkey/ec-yaml-indented", str(i), "tls:\n  key: |\n    " + t.replace("\n", "\n    ") + "\n  cert: cert.pem", [b[0], b[1]])
    t, b = pem("RSA PRIVATE KEY", 1190); add("pkey/rsa-crlf", str(i), t.replace("\n", "\r\n"), [b[2], b[8]])
    t, b = pem("PRIVATE KEY", 1190); add("pkey/one-line-spaces", str(i), "key: " + t.replace("\n", " "), [b[2], b[8]])
    t, b = pem("PRIVATE KEY", 1190); add("pkey/body-only", str(i), "Here is the body of the old signing key (header stripped):\n" + "\n".join(b), [b[2], b[8]])
    t, b = pem("ENCRYPTED PRIVATE KEY", 1250); add("pkey/pkcs8-encrypted", str(i), t, [b[2], b[8]])
    t, b = pem("DSA PRIVATE KEY", 440); add("pkey/dsa", str(i), t, [b[1], b[3]])
    t, b = pem("RSA PRIVATE KEY", 1190); add("pkey/truncated", str(i), "\n".join(t.split("\n")[:5]) + "\n... (truncated)", [b[1], b[3]])
    t, b = pem("PRIVATE KEY", 1190); add("pkey/kubeconfig-b64", str(i), f"users:\n- name: admin\n  user:\n    client-certificate-data: {b64(rs(300))}\n    client-key-data: {(kb := b64(t))}", [kb[100:180]])
    t, b = pem("PRIVATE KEY", 1190); add("pkey/k8s-secret-tls", str(i), f"apiVersion: v1\nkind: Secret\ntype: kubernetes.io/tls\ndata:\n  tls.crt: {b64(rs(400))}\n  tls.key: {(kb := b64(t))}", [kb[100:180]])
    body = "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW" + b64(R.randbytes(300))
    ob = [body[j:j + 70] for j in range(0, len(body), 70)]
    add("pkey/openssh-md-quote", str(i), "> -----BEGIN OPENSSH PRIVATE KEY-----\n> " + "\n> ".join(ob) + "\n> -----END OPENSSH PRIVATE KEY-----", [ob[1], ob[3]])
    pl = b64(R.randbytes(48))
    add("pkey/putty-v3", str(i), f"PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: deploy@ci\nPublic-Lines: 2\nAAAAC3NzaC1lZDI1NTE5AAAAI{b64(R.randbytes(24))}\n{b64(R.randbytes(12))}\nPrivate-Lines: 1\n{pl}\nPrivate-MAC: {rs(64, HEX)}", [pl])
    d = b64u(R.randbytes(32))
    add("pkey/jwk-okp", str(i), json.dumps({"kty": "OKP", "crv": "Ed25519", "x": b64u(R.randbytes(32)), "d": d, "kid": "sig-2025"}), [d])
    d = b64u(R.randbytes(256)); p = b64u(R.randbytes(128))
    add("pkey/jwk-rsa", str(i), json.dumps({"kty": "RSA", "n": b64u(R.randbytes(256)), "e": "AQAB", "d": d, "p": p, "q": b64u(R.randbytes(128))}), [d, p])
    ms = "RWRTY0Iy" + b64(R.randbytes(150))
    add("pkey/minisign", str(i), f"untrusted comment: minisign encrypted secret key\n{ms}", [ms])
    sol = json.dumps(list(R.randbytes(64)))
    add("pkey/solana-keypair", str(i), f"~/.config/solana/id.json:\n{sol}", [sol[1:120]])
    ts = b64(R.randbytes(64))
    add("pkey/tor-hs", str(i), f"hs_ed25519_secret_key (base64): {ts}", [ts])
    add("pkey/wireguard-conf", str(i), f"[Interface]\nPrivateKey = {(wk := b64(R.randbytes(32)))}\nAddress = 10.8.0.2/24", [wk])
    gb = pem_body(900)
    add("pkey/pgp-armor-nested", str(i), "```\n-----BEGIN PGP PRIVATE KEY BLOCK-----\nComment: backup\n\n" + "\n".join(gb) + "\n=" + rs(4, B64) + "\n-----END PGP PRIVATE KEY BLOCK-----\n```", [gb[1], gb[5]])

# ------------------------------------------------------------------ connection strings
def dbs(u, p, h):
    return {
        "jdbc-query": f"jdbc:postgresql://{h}:5432/app?user={u}&password={p}&ssl=true",
        "mssql-ado": f"Server=tcp:{h},1433;Initial Catalog=app;Persist Security Info=False;User ID={u};Password={p};Encrypt=True;",
        "oracle-ezconnect": f"sqlplus {u}/{p}@//{h}:1521/ORCLPDB1",
        "odbc": f"Driver={{ODBC Driver 18 for SQL Server}};Server={h};Database=app;Uid={u};Pwd={p};",
        "db2": f"DATABASE=BLUDB;HOSTNAME={h};PORT=50000;PROTOCOL=TCPIP;UID={u};PWD={p};",
        "go-mysql-dsn": f'dsn := "{u}:{p}@tcp({h}:3306)/app?parseTime=true"',
        "redis-nouser": f"REDIS_URL=rediss://:{p}@{h}:6380/0",
        "neo4j": f"NEO4J_URI=neo4j+s://{u}:{p}@{h}",
        "clickhouse": f"clickhouse://{u}:{p}@{h}:9440/default?secure=true",
        "snowflake": f"snowflake://{u}:{p}@xy12345.eu-central-1/analytics/public?warehouse=WH",
        "kafka-jaas": f'sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="{u}" password="{p}";',
        "nats": f"nats://{u}:{p}@{h}:4222",
        "mqtt": f"mosquitto_pub -h {h} -u {u} -P '{p}' -t alerts -m hi",
        "ldapsearch": f"ldapsearch -H ldaps://{h} -D 'cn={u},dc=corp,dc=example' -w '{p}' '(uid=jdoe)'",
        "prisma-sqlserver": f'DATABASE_URL="sqlserver://{h}:1433;database=app;user={u};password={p};encrypt=true"',
        "cqlsh": f"cqlsh {h} -u {u} -p '{p}'",
        "sqlcmd": f"sqlcmd -S {h} -U {u} -P '{p}' -d app",
        "mongosh-flag": f"mongosh 'mongodb+srv://{h}/app' --username {u} --password '{p}'",
        "influx": f"influx -host {h} -username {u} -password '{p}' -ssl",
        "smb-url": f"smb://{u}:{p}@{h}/share",
        "git-cred": f"https://{u}:{p}@git.example.com/team/repo.git",
        "pgpass-like-prose": f"Postgres on {h}: user {u}, pass {p}",
        "couchdb": f"curl -X PUT http://{u}:{p}@{h}:5984/newdb",
        "redis-cli-a": f"redis-cli -h {h} -p 6379 -a '{p}' --no-auth-warning ping",
        "mysqldump": f"mysqldump -h {h} -u{u} -p'{p}' app > app.sql",
        "firebird": f"isql-fb -user {u} -password '{p}' {h}:/db/app.fdb",
        "elastic-env": f"ELASTICSEARCH_HOSTS=https://{u}:{p}@{h}:9200",
        "spring-yaml": f"spring:\n  datasource:\n    url: jdbc:mysql://{h}:3306/app\n    username: {u}\n    password: {p}\n",
        "dotnet-json": json.dumps({"ConnectionStrings": {"Default": f"Host={h};Database=app;Username={u};Password={p}"}}),
    }
for i in range(3):
    for ctx, _ in dbs("x", "y", "z").items():
        p = pw().replace("'", "").replace(";", "").replace('"', "").replace("@", "").replace("/", "").replace("&", "").replace(":", "").replace("$", "")
        if ctx in ("jdbc-query",): p = p.replace("#", "").replace("%", "").replace("+", "")
        add(f"connstr/{ctx}", str(i), dbs(R.choice(["app", "svc_ro", "sa", "admin"]), p, R.choice(["db1.internal", "10.2.3.4", "pg.prod.example.net"]))[ctx], p)

# ------------------------------------------------------------------ passwords under many key names
keys_cfg = {
    "redis-requirepass": lambda p: f"# redis.conf\nrequirepass {p}\nmaxmemory 2gb",
    "redis-masterauth": lambda p: f"replicaof 10.0.0.5 6379\nmasterauth {p}",
    "slapd-rootpw": lambda p: f"rootdn \"cn=Manager,dc=example,dc=com\"\nrootpw {p}",
    "nslcd-bindpw": lambda p: f"binddn cn=reader,dc=example,dc=com\nbindpw {p}",
    "keepalived-auth_pass": lambda p: f"authentication {{\n    auth_type PASS\n    auth_pass {p}\n}}",
    "hostapd-wpa_passphrase": lambda p: f"ssid=Office5G\nwpa=2\nwpa_passphrase={p}",
    "wpa_supplicant-psk": lambda p: f'network={{\n    ssid="HomeNet"\n    psk="{p}"\n}}',
    "gradle-storePassword": lambda p: f"signingConfigs {{\n    release {{\n        storeFile file('release.jks')\n        storePassword '{p}'\n        keyAlias 'upload'\n    }}\n}}",
    "gradle-keyPassword": lambda p: f"android.injected.signing.key.password={p}",
    "spring-props": lambda p: f"spring.datasource.password={p}",
    "java-keystore-sysprop": lambda p: f"java -Djavax.net.ssl.keyStorePassword={p} -jar app.jar",
    "ansible-become": lambda p: f"[web]\nweb1 ansible_host=10.0.0.7 ansible_user=deploy ansible_become_pass={p}",
    "wp-config": lambda p: f"define( 'DB_PASSWORD', '{p}' );",
    "php-var": lambda p: f"$db_pass = '{p}';",
    "maven-settings": lambda p: f"<server>\n  <id>nexus</id>\n  <username>deploy</username>\n  <password>{p}</password>\n</server>",
    "nuget-config": lambda p: f'<add key="ClearTextPassword" value="{p}" />',
    "xml-attr": lambda p: f'<datasource user="app" pass="{p}" url="jdbc:h2:mem"/>',
    "docker-login": lambda p: f"docker login registry.example.com -u ci -p '{p}'",
    "helm-repo": lambda p: f"helm repo add internal https://charts.example.com --username ci --password '{p}'",
    "keycloak-env": lambda p: f"KC_DB_PASSWORD={p}",
    "grafana-env": lambda p: f"GF_SECURITY_ADMIN_PASSWORD={p}",
    "rabbitmq-env": lambda p: f"RABBITMQ_DEFAULT_PASS={p}",
    "smtp-yaml": lambda p: f"smtp:\n  host: smtp.example.com\n  user: alerts\n  pass: {p}\n",
    "pypirc": lambda p: f"[pypi]\nusername = __token__\n[testpypi]\nusername = bob\npassword = {p}",
    "ini-pwd": lambda p: f"[database]\nuid = app\npwd = {p}",
    "toml-passphrase": lambda p: f"[signing]\npassphrase = \"{p}\"",
    "json-camel": lambda p: json.dumps({"adminUser": "root", "adminPass": p}),
    "tfvars": lambda p: f'db_master_password = "{p}"',
    "k8s-stringData": lambda p: f"kind: Secret\nstringData:\n  DB_PASS: \"{p}\"",
    "vault-kv-put": lambda p: f"vault kv put secret/app db_password='{p}'",
    "htpasswd-cmd": lambda p: f"htpasswd -bc /etc/nginx/.htpasswd admin '{p}'",
    "expect-send": lambda p: f'expect "assword:"\nsend "{p}\\r"',
    "sshpass": lambda p: f"sshpass -p '{p}' ssh deploy@10.0.0.9",
    "curl-user": lambda p: f"curl -u 'admin:{p}' https://jenkins.example.com/api/json",
    "wget-password": lambda p: f"wget --user=ci --password='{p}' https://files.example.com/a.tgz",
    "rdp-prose": lambda p: f"RDP to 10.1.1.4 as Administrator, {p}",
    "cred-pair-slash": lambda p: f"jenkins admin / {p}",
    "env-secret-key": lambda p: f"FLASK_SECRET_KEY={p}",
    "nextauth": lambda p: f"NEXTAUTH_SECRET={p}",
    "powershell": lambda p: f"$cred = New-Object PSCredential('svc', (ConvertTo-SecureString '{p}' -AsPlainText -Force))",
    "python-kw": lambda p: f"conn = psycopg2.connect(host='db', user='app', password='{p}')",
    "js-object": lambda p: f"const cfg = {{ user: 'app', pwd: '{p}' }};",
}
for ctx, f in keys_cfg.items():
    for i in range(3):
        p = pw().replace("'", "").replace('"', "").replace("<", "").replace("&", "").replace("$", "")
        add(f"pwkey/{ctx}", str(i), f(p), p)

langs = {
    "it": "La password del router è {p}", "pt": "A senha do wifi é {p}", "pl": "Hasło do serwera: {p}",
    "ru": "Пароль от сервера: {p}", "uk": "Пароль — {p}", "zh": "数据库密码：{p}", "zh2": "服务器的密码是 {p}",
    "ja": "管理画面のパスワードは {p} です", "ko": "관리자 비밀번호: {p}", "tr": "Sunucu şifresi: {p}",
    "sv": "Lösenordet är {p}", "fi": "Salasana on {p}", "cs": "Heslo je {p}", "hu": "A jelszó: {p}",
    "el": "Ο κωδικός είναι {p}", "ar": "كلمة المرور هي {p}", "he": "הסיסמה היא {p}", "hi": "पासवर्ड है {p}",
    "vi": "Mật khẩu là {p}", "id": "Kata sandinya {p}", "nl": "Het wachtwoord is {p}", "no": "Passordet er {p}",
    "da": "Adgangskoden er {p}", "ro": "Parola este {p}", "es-accent": "Contraseña: {p}", "fr": "Le mot de passe est {p}",
    "de": "Das Kennwort lautet {p}", "en-login": "Login for the NAS: admin {p}", "en-creds": "creds admin {p} for grafana",
    "en-use": "use {p} to log into the staging admin panel", "en-changed": "I reset it; new one is {p}",
    "ru-key": "пароль_бд = {p}", "zh-yaml": "数据库:\n  密码: {p}\n", "ja-env": "パスワード={p}",
}
for ctx, t in langs.items():
    for i in range(3):
        p = pw(); add(f"pwlang/{ctx}", str(i), t.format(p=p), p)

# ------------------------------------------------------------------ HTTP headers
headers = {
    "x-api-key": "X-API-Key: {v}", "x-auth-token": "X-Auth-Token: {v}", "api-key": "api-key: {v}",
    "authorization-token": "Authorization: Token {v}", "authorization-bearer-opaque": "Authorization: Bearer {v}",
    "ocp-apim": "Ocp-Apim-Subscription-Key: {v}", "x-rapidapi-key": "X-RapidAPI-Key: {v}",
    "x-access-token": "x-access-token: {v}", "httpie": "http GET api.example.com/items Authorization:'Bearer {v}'",
    "python-headers": "requests.get(url, headers={{'X-Api-Token': '{v}'}})", "js-fetch": "fetch(url, {{ headers: {{ 'x-api-key': '{v}' }} }})",
    "wget-header": "wget --header='X-Token: {v}' https://api.example.com/export",
    "apikey-scheme": "Authorization: ApiKey {v}", "custom-scheme": "Authorization: MAC id=\"h480djs93hd8\", mac=\"{v}\"",
    "query-api_key": "GET https://api.example.com/v2/search?q=shoes&api_key={v}&page=2",
    "query-access_token": "https://graph.example.com/me?fields=id,name&access_token={v}",
    "query-sig": "https://cdn.example.com/f.zip?Expires=1735689600&Signature={v}&Key-Pair-Id=APKA{r}",
    "fragment-token": "https://app.example.com/callback#access_token={v}&token_type=Bearer&expires_in=3600",
    "cookie-custom": "Cookie: theme=dark; auth={v}; lang=en",
}
for ctx, t in headers.items():
    for i in range(3):
        v = rs(R.choice([32, 40, 48]), B64U if "sig" not in ctx else AL)
        add(f"header/{ctx}", str(i), t.format(v=v, r=rs(10, UP)), v)

# ------------------------------------------------------------------ payment / IDs
card_kinds = {"visa": ("4", 16), "mc2": ("2221", 16), "mc5": ("55", 16), "amex": ("37", 15), "discover": ("6011", 16),
              "jcb": ("3530", 16), "diners": ("36", 14), "unionpay": ("62", 19), "maestro": ("6759", 18)}
def card_fmt(n, how):
    if how == "plain": return n
    if how == "spaced": return " ".join(n[i:i + 4] for i in range(0, len(n), 4))
    if how == "dashed": return "-".join(n[i:i + 4] for i in range(0, len(n), 4))
    if how == "dots": return ".".join(n[i:i + 4] for i in range(0, len(n), 4))
    if how == "amex": return f"{n[:4]} {n[4:10]} {n[10:]}"
for kind, (p, ln) in card_kinds.items():
    for how in ["plain", "spaced", "dashed", "dots"] + (["amex"] if kind in ("amex", "diners") else []):
        for ctx in ["prose", "json", "table"]:
            n = luhn_complete(p, ln); s = card_fmt(n, how)
            txt = {"prose": f"Customer paid with {s} exp 09/27 cvc {R.randint(100,999)}",
                   "json": json.dumps({"pan": s, "exp": "0927"}), "table": f"| name | card |\n|---|---|\n| J. Doe | {s} |"}[ctx]
            add(f"card/{kind}-{how}", ctx, txt, [s, n] if how != "plain" else [n], strip=r"[ .\-]")
ibans = [("DE", 18), ("GB", 18, True), ("FR", 23), ("NL", 14, True), ("ES", 20), ("IT", 23, True), ("CH", 17),
         ("PL", 24), ("BE", 12), ("SE", 20), ("NO", 11), ("MT", 27, True), ("BR", 25), ("SA", 20), ("AE", 19), ("TR", 22)]
for spec in ibans:
    for ctx in ["compact-label", "grouped-prose", "lower", "nolabel", "json"]:
        ib = iban(spec[0], spec[1], len(spec) > 2 and spec[2]) if spec[0] not in ("GB", "NL", "IT", "MT") else None
        if ib is None:  # letters at the bank code start
            cc = spec[0]; bl = spec[1]
            bb = rs({"GB": 4, "NL": 4, "IT": 1, "MT": 4}[cc], string.ascii_uppercase) + "".join(R.choice(string.digits) for _ in range(bl - {"GB": 4, "NL": 4, "IT": 1, "MT": 4}[cc]))
            num = "".join(str(int(c, 36)) for c in bb + cc + "00"); ib = cc + f"{98 - int(num) % 97:02d}" + bb
        g = " ".join(ib[i:i + 4] for i in range(0, len(ib), 4))
        txt = {"compact-label": f"IBAN: {ib}", "grouped-prose": f"Please wire the refund to {g} (Acme GmbH).",
               "lower": f"iban {ib.lower()}", "nolabel": f"Bank details for the landlord\n{g}\nBIC: DEUTDEFF",
               "json": json.dumps({"account": ib, "holder": "Acme"})}[ctx]
        add(f"iban/{spec[0]}-{ctx}", ctx, txt, [ib, g, ib.lower()] if ctx != "lower" else [ib.lower()], strip=r" ")
for ctx, t in {"dashed-prose": "Her SSN is {s}.", "spaced": "social security number {sp}", "bare-label": "SSN {b}",
               "json": '{{"ssn": "{s}"}}', "table": "| name | ssn |\n|---|---|\n| Jane | {s} |", "es": "número de seguro social {s}"}.items():
    for i in range(4):
        s = ssn(); add(f"ssn/{ctx}", str(i), t.format(s=s, sp=s.replace("-", " "), b=s.replace("-", "")), [s.replace("-", "")], strip=r"[ \-]")

# ------------------------------------------------------------------ encodings of a known-prefix secret
for i in range(4):
    g = gh("ghp_"); st = "sk_live_" + rs(40); ak = "AKIA" + rs(16, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"); sk = rs(40, B64)
    add("encoded/base64-token", str(i), f"token (b64): {b64(g)}", b64(g), note="encoded form judged")
    add("encoded/base64-json-password", str(i), f"cfg={(x := b64(json.dumps({'user': 'app', 'password': pw()})))}", x)
    add("encoded/hex-token", str(i), f"GH_TOKEN_HEX={g.encode().hex()}", g.encode().hex())
    add("encoded/url-encoded", str(i), f"https://example.com/cb?t={(x := st.replace('_', '%5F'))}", x)
    add("encoded/json-unicode-escape", str(i), '{"token": "' + "".join(f"\\u{ord(c):04x}" for c in g[:4]) + g[4:] + '"}', g[4:])
    add("encoded/html-entity", str(i), "<p>token: " + "".join(f"&#{ord(c)};" for c in g[:4]) + g[4:] + "</p>", g[4:])
    add("encoded/reversed", str(i), f"reversed for safety: {g[::-1]}", g[::-1])
    add("encoded/rot13", str(i), f"rot13: {codecs.encode(st, 'rot13')}", codecs.encode(st, 'rot13'))
    add("encoded/double-b64", str(i), f"data: {b64(b64(st))}", b64(b64(st)))
    add("encoded/k8s-secret-aws", str(i), f"data:\n  AWS_ACCESS_KEY_ID: {b64(ak)}\n  AWS_SECRET_ACCESS_KEY: {b64(sk)}", [b64(ak), b64(sk)])
    add("encoded/quoted-printable", str(i), f"Content-Transfer-Encoding: quoted-printable\n\nYour key: {st[:30]}=\n{st[30:]}", st, strip="=\n")
    add("encoded/base64-env-value", str(i), f"DB_PASSWORD_B64={(x := b64(pw()))}", x)

# ------------------------------------------------------------------ split / obfuscated (strip applied before judging)
ZW = "\u200b"
for i in range(4):
    g = gh("ghp_"); st = "sk_live_" + rs(40); ant = "sk-ant-api03-" + rs(93, B64U) + "AA"; ak = "AKIA" + rs(16, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")
    add("split/zero-width", str(i), f"GH_TOKEN={g[:10] + ZW + g[10:20] + ZW + g[20:]}", g, strip="\u200b")
    add("split/zwj-prose", str(i), "the token is " + "\u200d".join(st), st, strip="\u200d")
    add("split/soft-hyphen", str(i), f"key: {st[:15]}\u00ad{st[15:]}", st, strip="\u00ad")
    add("split/homoglyph-prefix", str(i), "GH_TOKEN=" + "gh\u0440_" + g[4:], g[4:])
    add("split/fullwidth", str(i), "token： " + "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in st), st[8:], note="fullwidth form; judged by NFKC")
    C[-1]["nfkc"] = True
    add("split/spaced-groups", str(i), f"stripe key: {' '.join(st[j:j + 6] for j in range(0, len(st), 6))}", st, strip=" ")
    add("split/line-wrap", str(i), f"ANTHROPIC_API_KEY={ant[:60]}\n{ant[60:]}", ant, strip="\n")
    add("split/shell-continuation", str(i), f"export OPENAI_API_KEY=sk-proj-{(o := rs(60, B64U))[:30]}\\\n{o[30:]}", o, strip="\\\\\n")
    add("split/python-concat", str(i), f'TOKEN = ("{g[:20]}"\n         "{g[20:]}")', g, strip='"\n         "')
    add("split/js-concat", str(i), f"const key = '{st[:12]}' + '{st[12:]}';", st, strip="' \\+ '")
    add("split/yaml-folded", str(i), f"token: >-\n  {ant[:50]}\n  {ant[50:]}\n", ant, strip="\n  ")
    add("split/letter-spaced", str(i), "aws key: " + " ".join(ak), ak, strip=" ")
    add("split/two-lines-prose", str(i), f"first half {st[:20]}\nsecond half {st[20:]}", st, strip="\nsecond half ")
    add("split/dash-insert", str(i), f"AWS key id {ak[:4]}-{ak[4:12]}-{ak[12:]}", ak, strip="-")
    add("split/markdown-bold", str(i), f"**{g}**", g)
    add("split/guillemets", str(i), f"Clé : «{st}»", st)
    add("split/cjk-brackets", str(i), f"トークン「{g}」を使う", g)
    add("split/nbsp-sep", str(i), f"token:\u00a0{g}", g)
    add("split/html-tags", str(i), f"<td>{st[:16]}<wbr>{st[16:]}</td>", st, strip="<wbr>")

# ------------------------------------------------------------------ JWT variants
for i in range(4):
    j = jwt()
    add("jwt/url-fragment", str(i), f"https://app.example.com/#id_token={j}&state=xyz", j)
    add("jwt/cookie", str(i), f"Cookie: _ga=GA1.2.3; access_token={j}", j)
    add("jwt/standard-b64", str(i), "token " + j.replace("-", "+").replace("_", "/"), j.replace("-", "+").replace("_", "/"))
    add("jwt/wrapped", str(i), f"Bearer {j[:70]}\n{j[70:]}", j, strip="\n")
    add("jwt/quoted-json-escaped", str(i), json.dumps({"body": json.dumps({"jwt": j})}), j)
    add("jwt/prose", str(i), f"Supabase service role key for prod is {jwt({'iss': 'supabase', 'ref': rs(20, LO), 'role': 'service_role', 'iat': 1700000000, 'exp': 2000000000})}".replace("{", "{"), [])
    C[-1]["secrets"] = [C[-1]["text"].split()[-1]]

# ------------------------------------------------------------------ look-alikes (benign)
def bn(sub, gen, n, ctxs):
    for i in range(n):
        for cname, c in ctxs.items():
            benign(sub, f"{cname}{i}", c(gen()))
plain = {"note": lambda v: f"{v}", "ctx": lambda v: f"see {v} for details"}
bn("sha256", lambda: rs(64, HEX), 5, {"commit": lambda v: f"sha256 of the tarball: {v}", "lock": lambda v: f'"checksum": "{v}"'})
bn("sha1-git", lambda: rs(40, HEX), 5, {"log": lambda v: f"commit {v}\nAuthor: Jane <jane@example.com>", "rev": lambda v: f"pinned to rev {v} in flake.lock"})
bn("md5", lambda: rs(32, HEX), 4, {"etag": lambda v: f'ETag: "{v}"', "file": lambda v: f"MD5 ({R.choice(['a.iso','b.zip'])}) = {v}"})
bn("uuid", U, 5, {"req": lambda v: f"request_id={v} status=200", "json": lambda v: json.dumps({"id": v, "name": "widget"})})
bn("git-short", lambda: rs(7, HEX), 3, {"pr": lambda v: f"fixed in {v}, see PR #412"})
bn("version", lambda: f"{R.randint(0,20)}.{R.randint(0,40)}.{R.randint(0,99)}", 4, {"dep": lambda v: f"bumped tokio to {v}", "semver": lambda v: f"requires node >= {v}"})
bn("docker-digest", lambda: rs(64, HEX), 3, {"img": lambda v: f"image: ghcr.io/acme/api@sha256:{v}"})
bn("sri", lambda: b64(R.randbytes(64)), 3, {"npm": lambda v: f'"integrity": "sha512-{v}"'})
bn("go-sum", lambda: b64(R.randbytes(32)), 3, {"sum": lambda v: f"github.com/pkg/errors v0.9.1 h1:{v}"})
bn("nix-hash", lambda: b64(R.randbytes(32)), 3, {"nix": lambda v: f'hash = "sha256-{v}";'})
bn("img-b64", lambda: b64(b"\x89PNG\r\n\x1a\n" + R.randbytes(300)), 3, {"md": lambda v: f"![logo](data:image/png;base64,{v})"})
bn("ssh-pub", lambda: b64(b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00 " + R.randbytes(32)), 3, {"ak": lambda v: f"ssh-ed25519 {v} jane@laptop"})
bn("ssh-fp", lambda: b64(R.randbytes(32)).rstrip("="), 3, {"fp": lambda v: f"ED25519 key fingerprint is SHA256:{v}."})
bn("pubkey-pem", lambda: "\n".join(pem_body(294)), 2, {"pem": lambda v: f"-----BEGIN PUBLIC KEY-----\n{v}\n-----END PUBLIC KEY-----"})
bn("cert-pem", lambda: "\n".join(pem_body(900)), 2, {"pem": lambda v: f"-----BEGIN CERTIFICATE-----\n{v}\n-----END CERTIFICATE-----"})
bn("eth-address", lambda: "0x" + rs(40, HEX), 3, {"tx": lambda v: f"sent 0.1 ETH to {v}"})
bn("btc-address", lambda: b58check(b"\x00" + R.randbytes(20)), 3, {"pay": lambda v: f"donations: {v}"})
bn("ipfs-cid", lambda: "Qm" + rs(44, B58), 3, {"cid": lambda v: f"pinned as ipfs://{v}"})
bn("aws-arn", lambda: f"arn:aws:iam::{R.randint(10**11, 10**12-1)}:role/{rs(10, string.ascii_letters)}", 3, {"arn": lambda v: f"assume {v}"})
bn("snowflake-id", lambda: str(R.randint(10**17, 10**18)), 3, {"discord": lambda v: f"channel id {v}"})
bn("trace-id", lambda: rs(32, HEX), 3, {"otel": lambda v: f"traceparent: 00-{v}-{rs(16, HEX)}-01"})
bn("youtube", lambda: rs(11, B64U), 3, {"yt": lambda v: f"https://www.youtube.com/watch?v={v}"})
bn("gpg-fp", lambda: " ".join(rs(4, "0123456789ABCDEF") for _ in range(10)), 2, {"gpg": lambda v: f"Key fingerprint = {v}"})
bn("isbn-phone", lambda: "", 1, {"isbn": lambda v: "ISBN 978-0-306-40615-7", "phone": lambda v: "call +49 30 901820 or +1 (415) 555-0172",
                                 "order": lambda v: "order #1029384756 shipped", "tracking": lambda v: "UPS 1Z999AA10123456784"})
bn("base64-text", lambda: b64(R.choice(["hello world, this is a test", "The quick brown fox jumps", "meeting notes for Tuesday"])), 3, {"b": lambda v: f"echo {v} | base64 -d"})
pwprose = [
    "Reset your password via the self-service portal.", "Password must be at least 12 characters long.",
    "I forgot my password again, will ask IT tomorrow.", "password: <redacted>", "password: ${DB_PASSWORD}",
    "password = os.environ['DB_PASSWORD']", "password: ${{ secrets.DB_PASSWORD }}", "PASSWORD=", "password: null",
    "password_min_length: 12", '"password": "********"', "password: <your password here>", "token_type: bearer",
    "expires_in: 3600", 'token: "{{ vault_token }}"', "if password == confirm_password: save()",
    "def check_password(password: str) -> bool:", "password = getpass.getpass()", "api_key: YOUR_API_KEY",
    "Set OPENAI_API_KEY in your shell before running.", "the secret to good bread is patience",
    "Das Passwort muss mindestens 12 Zeichen lang sein.", "Le mot de passe a été réinitialisé hier.",
    "La contraseña caduca cada 90 días.", "パスワードを忘れた場合は管理者に連絡してください。", "密码长度至少为12位。",
    "Пароль должен содержать не менее 12 символов.", "Use a password manager such as Bitwarden or 1Password.",
    "password rotation policy: 90 days", "The token expired at 2025-01-01T00:00:00Z.", "AUTH_MODE=token",
    "Token-based auth is enabled for the API.", "key: value pairs are separated by colons in YAML",
    "secret_name: prod/db/credentials", "aws_secret_access_key is read from ~/.aws/credentials",
    "password_hash_algorithm: argon2id", "keyring backend: secretservice", "client_id: 0oa1b2c3d4e5f6g7h8i9",
    "Use --password-stdin instead of -p.", "sshpass is discouraged; use keys.", "The API key is stored in Vault at secret/data/app.",
    "| field | type |\n|---|---|\n| password | string |\n| token | string |", "session_timeout = 30m",
    "Remember: Jane prefers email, not phone.", "Set the max_connections to 200 for the pool.",
    "git config credential.helper store", "ssh-keygen -t ed25519 -C jane@example.com", "KEY_LENGTH=4096",
    "The IBAN field was left empty by the customer.", "card ending 4242 expired", "SSN field is optional",
    "version: 3.9.1-alpine", "color: #1e90ff", "build 2025.03.14-rc2", "ticket JIRA-4821 closed",
    "the password is correct", "password was rotated yesterday", "password changed successfully",
    "wifi password is on the fridge", "passwords: see the vault entry 'prod-db'", "mot de passe : voir le coffre",
    "Passwort: siehe KeePass", "contraseña: en el gestor", "token: see 1Password item 'CI token'",
]
for i, t in enumerate(pwprose): benign("prose", str(i), t)
for i in range(6):
    benign("placeholder-url", str(i), R.choice(["postgres://user:pass@localhost/db", "mysql://USER:PASSWORD@HOST:3306/DB",
                                               "redis://localhost:6379/0", "https://example.com/login?next=/home",
                                               "amqp://guest@localhost:5672/", "mongodb://localhost:27017/test"]) + f" # {i}")
for i in range(5):
    benign("code-ids", str(i), f"const STORAGE_KEY = 'app.settings.v{i}';\nconst EVENT = 'user_logged_in';")
    benign("numbers", str(i), f"ports: {R.randint(1000,9999)}, {R.randint(1000,9999)}; pid {R.randint(100,99999)}; {R.randint(10**9,10**10)} bytes")
    benign("dates", str(i), f"2025-0{R.randint(1,9)}-1{R.randint(0,9)}T1{R.randint(0,9)}:00:00Z deploy v{R.randint(1,9)}.{R.randint(0,9)}")

for i in range(8):
    benign("pod-names", str(i), f"kubectl logs api-{rs(10, LO)}-{rs(5, LO)} -n prod --since=1h")
    benign("lockfile", str(i), f'resolved "https://registry.npmjs.org/left-pad/-/left-pad-1.{i}.0.tgz#{rs(40, HEX)}"')
    benign("tf-ids", str(i), f"aws_instance.web: id=i-{rs(17, HEX)} sg=sg-{rs(17, HEX)} subnet=subnet-{rs(8, HEX)}")
    benign("s3-etag-multipart", str(i), f"uploaded part {i}: ETag {rs(32, HEX)}-{R.randint(2,40)}")

if __name__ == "__main__":
    out = sys.stdout
    for e in C: out.write(json.dumps(e, ensure_ascii=False) + "\n")
