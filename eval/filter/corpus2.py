#!/usr/bin/env python3
"""Corpus 2 (session 29): secrets the filter was known or likely to miss (command lines, base64
credentials, network device configs, prefixless vendor keys, cookies, recovery codes, TOTP seeds,
seed phrases, passwords in prose in four languages, punctuation), each in up to 13 contexts, and
look-alikes. Built whole at import; `C` is the list of entries (seeded: the same every run).
`bip39_english.txt` is the BIP-0039 English word list (bitcoin/bips, BSD-2-Clause)."""
import json, uuid, base64, hashlib, html, string, os
from lib import *
R.seed(2929)
C = []
def add(cat, sub, ctx, text, secrets, keep=(), note=""):
    C.append({"id": f"{cat}/{sub.replace('/', '∕')}/{ctx}/{len(C)}", "cat": cat, "sub": sub, "family": f"{cat}/{sub}", "ctx": ctx, "text": text,
              "secrets": secrets if isinstance(secrets, list) else [secrets], "benign": False,
              "keep": list(keep), "note": note})
def benign(sub, ctx, text, note=""):
    C.append({"id": f"fp/{sub.replace('/', '∕')}/{ctx}/{len(C)}", "cat": "fp", "sub": sub, "family": f"fp/{sub}", "ctx": ctx, "text": text,
              "secrets": [], "benign": True, "keep": [], "note": note})
U = lambda: str(uuid.UUID(int=R.getrandbits(128), version=4))
WORDS = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "bip39_english.txt")).read().split()
SYM = "!#%*_-.+~^"
def pw(kind=None):
    k = kind or R.choice(["rand", "rand", "human", "phrase", "short", "rand"])
    if k == "rand":   return rs(R.randint(11, 15)) + R.choice(SYM) + str(R.randint(1, 99))
    if k == "human":  return R.choice(WORDS).capitalize() + R.choice(WORDS) + str(R.randint(1990, 2026)) + R.choice("!#*")
    if k == "phrase": return "-".join(R.choice(WORDS) for _ in range(3)) + "-" + str(R.randint(10, 99))
    if k == "short":  return rs(8)
    if k == "bang":   return rs(R.randint(10, 13)) + R.choice(["!", "!!", ".", "!."])
    raise ValueError(k)
def b64(s): return base64.b64encode(s.encode()).decode()
def camel(k):
    p = k.lower().replace("-", "_").split("_"); return p[0] + "".join(x.capitalize() for x in p[1:])
J = json.dumps

# ---------------------------------------------------------------- contexts
def cmd_ctx(cmd):
    """a shell command line in 13 contexts"""
    return {
        "sh": cmd + " && echo done",
        "sh-prompt": "$ " + cmd,
        "prose": f"To fix the replica I ran `{cmd}` and it worked.",
        "md-table": f"| prod | `{cmd}` | ok |",
        "yaml": f"steps:\n  - name: setup\n    run: |\n      {cmd}\n",
        "json": J({"cmd": cmd}),
        "dockerfile": "RUN " + cmd,
        "py": f"subprocess.run({J(cmd)}, shell=True, check=True)",
        "js": f"execSync({J(cmd)});",
        "go": f"exec.Command(\"sh\", \"-c\", {J(cmd)}).Run()",
        "log": f"2026-11-03T09:14:22Z INFO runner: exec {cmd}",
        "html": f"<pre><code>{html.escape(cmd, quote=False)}</code></pre>",
        "comment": f"# last used: {cmd}",
    }
def line_ctx(line):
    """a one-line note in 12 contexts"""
    return {
        "prose": line,
        "md-bullet": f"- {line}",
        "md-table": f"| home | {line} | 2026-10 |",
        "yaml": f"note: {line}",
        "json": J({"note": line}, ensure_ascii=False),
        "py": f"# {line}",
        "js": f"const note = {J(line, ensure_ascii=False)};",
        "go": f"// {line}",
        "log": f"2026-11-03 09:14:22 INFO memory: user said {line}",
        "html": f"<p>{html.escape(line, quote=False)}</p>",
        "comment": f"<!-- {line} -->",
        "chat": f"User: {line}\nAssistant: Noted.",
    }
def kv_ctx(label, key, val):
    """a labelled value in 12 contexts (key names as vendors spell them)"""
    K = key.upper().replace("-", "_").replace(".", "_")
    return {
        "prose": f"The {label} is {val}, rotated last week.",
        "md-table": f"| {label} | {val} | prod |",
        "yaml": f"{key}: {val}",
        "json": J({key: val}),
        "sh": f"export {K}={val}",
        "env": f"{K}={val}",
        "py": f'{key.replace("-","_")} = "{val}"',
        "js": f'const {camel(key)} = "{val}";',
        "go": f'{camel(key)} := "{val}"',
        "log": f"2026-11-03 09:14:22 DEBUG loaded config {key}={val}",
        "html": f"<tr><td>{label}</td><td>{val}</td></tr>",
        "comment": f"// {label}: {val}",
    }

# ================================================================ 1. command lines
def cmds():
    L = []
    def c(sub, tmpl, val=None, kind=None):
        v = val or pw(kind); L.append((sub, tmpl.replace("{V}", v), v))
    tok = lambda: rs(R.choice([32, 36, 40]), ALNUM)
    for i in range(2):
        c("gh-secret-body", "gh secret set DEPLOY_TOKEN --body {V}", tok())
        c("gh-secret-body-q", 'gh secret set SLACK_WEBHOOK_SECRET --body "{V}"', tok())
        c("gh-secret-b", "gh secret set API_KEY -b{V} --repo acme/web", tok())
        c("gh-secret-body-eq", "gh secret set DB_PASSWORD --body={V} --env production")
        c("net-use", "net use \\\\fs01\\share {V} /user:CORP\\jane")
        c("net-use-drive", "net use Z: \\\\nas.local\\backup /user:admin {V} /persistent:yes")
        c("smbclient-pct", "smbclient //fs01/share -U jane%{V}")
        c("smbclient-pct-dom", "smbclient -L //10.0.0.4 -U 'CORP\\svc_backup%{V}'")
        c("smbclient-password", "smbclient //fs01/share --user=jane --password={V}")
        c("htpasswd-b", "htpasswd -b /etc/nginx/.htpasswd admin {V}")
        c("htpasswd-bc", "htpasswd -bc .htpasswd deploy {V}")
        c("htpasswd-nb", "htpasswd -nbB jane {V}")
        c("chpasswd", "echo 'root:{V}' | chpasswd")
        c("chpasswd-sudo", 'echo "deploy:{V}" | sudo chpasswd')
        c("chpasswd-herestring", "chpasswd <<< 'ubuntu:{V}'")
        c("mysql-p", "mysql -u root -p{V} -h db01 app")
        c("mysql-p-q", "mysql -uroot -p'{V}' app < dump.sql")
        c("mysql-password", "mysql --user=app --password={V} --host=db01")
        c("mysqladmin-p", "mysqladmin -u root -p{V} status")
        c("pgpassword", "PGPASSWORD={V} psql -h db01 -U app app")
        c("pgpassword-export", "export PGPASSWORD='{V}'; pg_dump -h db01 app > app.sql")
        c("curl-u", "curl -u admin:{V} https://jenkins.example.com/api/json")
        c("curl-user-q", 'curl --user "deploy:{V}" -X POST https://nexus.example.com/upload')
        c("curl-bearer", 'curl -H "Authorization: Bearer {V}" https://api.example.com/v1/me', tok())
        c("curl-bearer-hex", "curl -sH 'Authorization: Bearer {V}' https://api.internal/status", rs(40, HEX))
        c("curl-xapikey", 'curl -H "X-API-Key: {V}" https://api.example.com/items', tok())
        c("sshpass", "sshpass -p '{V}' ssh root@10.0.0.5")
        c("sshpass-nq", "sshpass -p{V} scp backup.tgz root@10.0.0.5:/srv")
        c("redis-cli-a", "redis-cli -h cache01 -a {V} ping")
        c("redis-cli-pass", "redis-cli -h cache01 --pass {V} info")
        c("redis-cli-url", "redis-cli -u redis://:{V}@cache01:6379/0 ping")
        c("mongosh-srv", 'mongosh "mongodb+srv://admin:{V}@cluster0.ab1cd.mongodb.net/app"')
        c("mongosh-p", "mongosh --host db01 -u admin -p {V} --authenticationDatabase admin")
        c("mongodump-uri", "mongodump --uri=mongodb://backup:{V}@db01:27017/app")
        c("openssl-passin", "openssl rsa -in server.key -out plain.key -passin pass:{V}")
        c("openssl-passout", "openssl pkcs12 -export -in c.pem -inkey k.pem -out c.p12 -passout pass:{V}")
        c("openssl-enc-k", "openssl enc -aes-256-cbc -salt -in db.sql -out db.sql.enc -k {V}")
        c("git-clone-userpass", "git clone https://jane:{V}@git.example.com/acme/infra.git")
        c("git-clone-token", "git clone https://oauth2:{V}@gitlab.example.com/acme/infra.git", rs(20, B64U))
        c("git-remote-token", "git remote set-url origin https://x-access-token:{V}@github.com/acme/web.git", rs(40, HEX))
        c("kubectl-literal-pw", "kubectl create secret generic db --from-literal=password={V}")
        c("kubectl-literal-apikey", "kubectl create secret generic stripe --from-literal=api-key={V} -n prod", tok())
        c("kubectl-literal-upper", "kubectl -n app create secret generic app-env --from-literal=DB_PASS={V}")
        c("docker-e", "docker run -d -e POSTGRES_PASSWORD={V} -p 5432:5432 postgres:16")
        c("docker-e-q", 'docker run --rm -e "MYSQL_ROOT_PASSWORD={V}" mysql:8')
        c("docker-env-apikey", "docker run --env API_KEY={V} ghcr.io/acme/worker:latest", tok())
        c("az-login", "az login -u jane@corp.example.com -p {V}")
        c("az-sp", "az login --service-principal -u 3f0c1d2e-1111-4a4a-9b9b-123456789abc -p {V} --tenant corp.example.com", rs(40, ALNUM + "_-."))
        c("az-vm-admin", "az vm create -g rg1 -n vm1 --image Ubuntu2204 --admin-username azureuser --admin-password {V}")
        c("az-sql-admin", "az sql server create -g rg1 -n sql1 -l westeurope -u sqladmin -p {V}")
        c("aws-configure", "aws configure set aws_secret_access_key {V}", rs(40, B64))
        c("aws-configure-profile", "aws configure set aws_secret_access_key {V} --profile prod", rs(40, B64))
        c("vault-kv-pw", "vault kv put secret/db password={V}")
        c("vault-kv-apikey", "vault kv put secret/stripe api_key={V} env=prod", tok())
        c("vault-write-userpass", "vault write auth/userpass/users/jane password={V} policies=dev")
        c("heroku-config", "heroku config:set SESSION_SECRET={V} -a acme-web", tok())
        c("fly-secrets", "fly secrets set DATABASE_PASSWORD={V}")
        c("npm-config-authtoken", "npm config set //npm.example.com/:_authToken {V}", U())
        c("gh-auth-token", "echo {V} | gh auth login --with-token", rs(40, HEX))
        c("lftp-u", "lftp -u backup,{V} sftp://files.example.com")
        c("wget-http-password", "wget --http-user=jane --http-password={V} https://files.example.com/a.tgz")
        c("ssh-keygen-N", "ssh-keygen -t ed25519 -N '{V}' -f ~/.ssh/deploy")
        c("psexec", "psexec \\\\srv01 -u CORP\\admin -p {V} cmd.exe")
        c("ps-securestring", '$pw = ConvertTo-SecureString "{V}" -AsPlainText -Force')
        c("ps-pscredential", "$c = New-Object PSCredential('CORP\\svc', (ConvertTo-SecureString '{V}' -AsPlainText -Force))")
        c("rabbitmqctl", "rabbitmqctl change_password admin {V}")
        c("useradd-p", "useradd -m -p $(openssl passwd -1 '{V}') deploy")
        c("nmcli-wifi", "nmcli dev wifi connect HomeNet password {V}")
    return L
for sub, cmd, v in cmds():
    for ctx, text in cmd_ctx(cmd).items():
        keep = ["&& echo done"] if ctx == "sh" else []
        add("cmd", sub, ctx, text, v, keep)

# ================================================================ 2. base64 credential blobs
def blobs():
    L = []   # (sub, native_text, secret, label, key)
    for i in range(3):
        u = R.choice(["jane", "deploy", "ci-bot", "admin"]); p = pw()
        a = b64(f"{u}:{p}")
        L.append(("npmrc-_auth", f"registry=https://npm.example.com/\n_auth={a}\nalways-auth=true\n", a, "npm _auth", "_auth"))
        L.append(("npmrc-scoped-_auth", f"@acme:registry=https://npm.example.com/\n//npm.example.com/:_auth=\"{a}\"\n", a, "npm _auth", "_auth"))
        t = U()
        L.append(("npmrc-_authToken-uuid", f"//registry.npmjs.org/:_authToken={t}\n", t, "npm auth token", "_authToken"))
        t2 = rs(64, B64U)
        L.append(("npmrc-_authToken-artifactory", f"//acme.jfrog.io/artifactory/api/npm/npm/:_authToken={t2}\n", t2, "npm auth token", "_authToken"))
        L.append(("yarnrc-npmAuthIdent", f"npmRegistryServer: \"https://npm.example.com\"\nnpmAuthIdent: \"{u}:{p}\"\n", p, "yarn auth ident", "npmAuthIdent"))
        L.append(("yarnrc-npmAuthToken", f"npmScopes:\n  acme:\n    npmAuthToken: {t2}\n", t2, "yarn token", "npmAuthToken"))
        a2 = b64(f"{u}:{pw()}")
        L.append(("docker-config-auth", J({"auths": {"registry.example.com": {"auth": a2}}}, indent=2), a2, "docker registry auth", "auth"))
        a3 = b64(f"{u}:{pw()}")
        L.append(("docker-config-auth-email", J({"auths": {"https://index.docker.io/v1/": {"auth": a3, "email": "jane@example.com"}}}), a3, "docker auth", "auth"))
        dcj = b64(J({"auths": {"ghcr.io": {"username": u, "password": rs(40, HEX), "auth": b64(u + ':' + rs(40, HEX))}}}))
        L.append(("k8s-dockerconfigjson", f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: regcred\ntype: kubernetes.io/dockerconfigjson\ndata:\n  .dockerconfigjson: {dcj}\n", dcj, "dockerconfigjson", ".dockerconfigjson"))
        k1 = b64(pw()); k2 = b64(rs(32))
        L.append(("k8s-data", f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: app\ntype: Opaque\ndata:\n  username: {b64('app')}\n  password: {k1}\n  api-token: {k2}\n", [k1, k2], "k8s secret data", "password"))
        k3 = b64(pw())
        L.append(("k8s-data-oddkey", f"kind: Secret\ndata:\n  DATABASE_URL_PASS: {k3}\n  smtp: {b64('smtp.example.com')}\n", k3, "k8s secret data", "DATABASE_URL_PASS"))
        k4 = b64(f"postgres://app:{pw()}@db01:5432/app")
        L.append(("k8s-data-url", f"kind: Secret\ndata:\n  DATABASE_URL: {k4}\n", k4, "k8s secret data", "DATABASE_URL"))
        ba = b64(f"{u}:{pw()}")
        L.append(("http-basic-header", f"GET /api/v1/builds HTTP/1.1\nHost: ci.example.com\nAuthorization: Basic {ba}\n", ba, "basic auth", "Authorization"))
        ba2 = b64(f"{u}:{pw()}")
        L.append(("http-basic-curl", f"curl -H 'Authorization: Basic {ba2}' https://ci.example.com/api", ba2, "basic auth", "Authorization"))
        ba3 = b64(f"{u}:{pw()}")
        L.append(("http-basic-py", f"headers = {{\"Authorization\": \"Basic {ba3}\"}}", ba3, "basic auth", "Authorization"))
        ba4 = b64(f"{u}:{pw()}")
        L.append(("git-extraheader", f"git -c http.extraHeader=\"Authorization: Basic {ba4}\" clone https://git.example.com/acme/x.git", ba4, "git extraheader", "extraheader"))
        ba5 = b64(f"{u}:{pw()}")
        L.append(("basic-lowercase", f"authorization: basic {ba5}", ba5, "basic auth", "authorization"))
        pp = pw()
        L.append(("pypirc-password", f"[distutils]\nindex-servers = private\n\n[private]\nrepository = https://pypi.example.com/simple/\nusername = {u}\npassword = {pp}\n", pp, "pypi password", "password"))
        np_ = pw()
        L.append(("netrc-multiline", f"machine nexus.example.com\n  login {u}\n  password {np_}\n", np_, "netrc", "password"))
        np2 = pw()
        L.append(("netrc-default", f"default login anonymous password {np2}\n", np2, "netrc", "password"))
        cp = pw()
        L.append(("composer-auth", J({"http-basic": {"repo.example.com": {"username": u, "password": cp}}}, indent=2), cp, "composer auth", "password"))
        gc = rs(40, HEX)
        L.append(("git-credentials", f"https://{u}:{gc}@git.example.com\n", gc, "git credentials", "credentials"))
        mv = pw()
        L.append(("maven-settings", f"<servers>\n  <server>\n    <id>nexus</id>\n    <username>{u}</username>\n    <password>{mv}</password>\n  </server>\n</servers>", mv, "maven", "password"))
        gp = pw()
        L.append(("gradle-properties", f"nexusUsername={u}\nnexusPassword={gp}\n", gp, "gradle", "nexusPassword"))
        pc = rs(40, HEX)
        L.append(("pip-conf-url", f"[global]\nindex-url = https://{u}:{pc}@pypi.example.com/simple\n", pc, "pip index", "index-url"))
    return L
for sub, native, sec, label, key in blobs():
    secs = sec if isinstance(sec, list) else [sec]
    add("b64", sub, "native", native, secs)
    if sub.startswith(("k8s", "docker-config", "npmrc-_auth", "http-basic", "basic")) and len(secs) == 1:
        v = secs[0]
        for ctx, text in {
            "prose": f"The {label} value is {v} if you need to recreate it.",
            "md-table": f"| {label} | `{v}` |",
            "log": f"2026-11-03 09:14:22 DEBUG {key}={v}",
            "comment": f"# {label}: {v}",
            "json": J({key: v}),
        }.items():
            add("b64", sub, ctx, text, v)

# ================================================================ 3. network config
J9 = "QzF3n6/9CAtpu0OB1IREhcSyrleKvMW8LXx7N-dVbwsY2g4oaJZGUDjiHkq.mPf5T"
CRYPT = "./" + string.digits + string.ascii_uppercase + string.ascii_lowercase
def type7(pwd):
    xl = "dsfd;kfoA,.iyewrkldJKDHSUBsgvca69834ncxv9873254k;fg87"
    s = R.randint(0, 15); out = "%02d" % s
    for i, ch in enumerate(pwd): out += "%02X" % (ord(ch) ^ ord(xl[(s + i) % len(xl)]))
    return out
def net():
    L = []
    for i in range(3):
        h5 = f"$1${rs(4, CRYPT)}${rs(22, CRYPT)}"
        L.append(("cisco-enable-secret-5", f"enable secret 5 {h5}", h5))
        h9 = f"$9${rs(14, CRYPT)}${rs(43, CRYPT)}"
        L.append(("cisco-enable-secret-9", f"enable secret 9 {h9}", h9))
        h8 = f"$8${rs(14, CRYPT)}${rs(43, CRYPT)}"
        L.append(("cisco-username-secret-8", f"username admin privilege 15 secret 8 {h8}", h8))
        p = pw("rand"); L.append(("cisco-username-password-0", f"username netops privilege 15 password 0 {p}", p))
        p = pw("rand"); L.append(("cisco-enable-password", f"enable password {p}", p))
        t7 = type7(pw("rand")); L.append(("cisco-password-7", f"username backup password 7 {t7}", t7))
        t7 = type7(pw("rand")); L.append(("cisco-tacacs-key-7", f"tacacs-server host 10.1.1.5 key 7 {t7}", t7))
        p = pw("short"); L.append(("cisco-snmp-community", f"snmp-server community {p} RO 10", p))
        p = pw("short"); L.append(("cisco-snmp-community-rw", f"snmp-server community {p} RW", p))
        a, b = pw("rand"), pw("rand"); L.append(("cisco-snmp-v3", f"snmp-server user monitor NMS v3 auth sha {a} priv aes 128 {b}", [a, b]))
        p = pw("rand"); L.append(("cisco-isakmp-key", f"crypto isakmp key {p} address 203.0.113.7", p))
        p = pw("rand"); L.append(("cisco-radius-key", f"radius-server key {p}", p))
        p = pw("short"); L.append(("cisco-ospf-md5", f" ip ospf message-digest-key 1 md5 {p}", p))
        p = pw("rand"); L.append(("cisco-line-password", f"line vty 0 4\n password {p}\n login", p))
        p = pw("rand"); L.append(("cisco-wlc-psk", f"config wlan security wpa akm psk set-key ascii {p} 3", p))
        j = "$9$" + rs(R.randint(18, 40), J9)
        L.append(("juniper-9-auth-key", f"set protocols ospf area 0 interface ge-0/0/0 authentication md5 1 key \"{j}\"", j))
        j = "$9$" + rs(R.randint(18, 40), J9)
        L.append(("juniper-9-secret", f"system {{\n    radius-server 10.0.0.9 secret \"{j}\"; ## SECRET-DATA\n}}", j))
        j = "$9$" + rs(R.randint(18, 40), J9)
        L.append(("juniper-9-psk", f"set security ike policy ike-pol pre-shared-key ascii-text \"{j}\"", j))
        h6 = f"$6${rs(16, CRYPT)}${rs(86, CRYPT)}"
        L.append(("juniper-encrypted-password", f"set system login user admin authentication encrypted-password \"{h6}\"", h6))
        p = pw("rand"); L.append(("wpa-psk-quoted", f"network={{\n    ssid=\"HomeNet\"\n    psk=\"{p}\"\n}}", p))
        x = rs(64, HEX); L.append(("wpa-psk-hex", f"network={{\n    ssid=\"HomeNet\"\n    psk={x}\n}}", x))
        p = pw("rand"); L.append(("hostapd", f"interface=wlan0\nssid=Office\nwpa=2\nwpa_passphrase={p}\n", p))
        p = pw("rand"); L.append(("wifi-qr", f"WIFI:T:WPA;S:HomeNet;P:{p};;", p))
        p = pw("rand"); L.append(("mikrotik-wifi", f"/interface wireless security-profiles set default wpa2-pre-shared-key={p}", p))
        p = pw("rand"); L.append(("mikrotik-user", f"/user add name=ops group=full password={p}", p))
        p = pw("rand"); L.append(("ipsec-secrets", f"203.0.113.7 198.51.100.2 : PSK \"{p}\"", p))
        k = base64.b64encode(R.randbytes(32)).decode()
        L.append(("wg-privatekey", f"[Interface]\nAddress = 10.8.0.2/24\nPrivateKey = {k}\nDNS = 1.1.1.1\n", k))
        k = base64.b64encode(R.randbytes(32)).decode()
        L.append(("wg-presharedkey", f"[Peer]\nPublicKey = {base64.b64encode(R.randbytes(32)).decode()}\nPresharedKey = {k}\nEndpoint = vpn.example.com:51820\n", k))
        k = base64.b64encode(R.randbytes(32)).decode()
        L.append(("wg-set", f"wg set wg0 private-key <(echo {k})", k))
        k = base64.b64encode(R.randbytes(32)).decode()
        L.append(("wg-yaml", f"wireguard:\n  private_key: {k}\n  peer: vpn.example.com\n", k))
        k = base64.b64encode(R.randbytes(32)).decode()
        L.append(("wg-prose", f"wg private key for the laptop: {k}", k))
    return L
for sub, text, sec in net():
    secs = sec if isinstance(sec, list) else [sec]
    add("net", sub, "native", text, secs)
    # a config line quoted in notes
    if "\n" not in text.strip():
        add("net", sub, "md-code", f"Router config (core-sw1):\n```\n{text}\n```", secs)
        add("net", sub, "prose", f"On core-sw1 I set `{text.strip()}` yesterday.", secs)
        add("net", sub, "md-table", f"| core-sw1 | `{text.strip()}` |", secs)
        add("net", sub, "log", f"Nov  3 09:14:22 core-sw1 %PARSER-5-CFGLOG_LOGGEDCMD: User:admin  logged command:{text.strip()}", secs)

# ================================================================ 4. prefixless keys, cookies, codes, TOTP, seeds
VEND = [  # (sub, vendor label, env key, header, generator)
    ("aws-secret", "AWS secret access key", "aws_secret_access_key", None, lambda: rs(40, B64)),
    ("datadog-api", "Datadog API key", "DD_API_KEY", "DD-API-KEY", lambda: rs(32, HEX)),
    ("datadog-app", "Datadog application key", "DD_APP_KEY", "DD-APPLICATION-KEY", lambda: rs(40, HEX)),
    ("twilio-auth", "Twilio auth token", "TWILIO_AUTH_TOKEN", None, lambda: rs(32, HEX)),
    ("algolia-admin", "Algolia admin API key", "ALGOLIA_ADMIN_KEY", "X-Algolia-API-Key", lambda: rs(32, HEX)),
    ("heroku-api", "Heroku API key", "HEROKU_API_KEY", None, U),
    ("cloudflare-global", "Cloudflare global API key", "CF_API_KEY", "X-Auth-Key", lambda: rs(37, HEX)),
    ("azure-storage", "Azure storage account key", "AZURE_STORAGE_KEY", None, lambda: base64.b64encode(R.randbytes(64)).decode()),
    ("okta-api", "Okta API token", "OKTA_API_TOKEN", None, lambda: "00" + rs(40, B64U)),
    ("sentry-legacy", "Sentry auth token", "SENTRY_AUTH_TOKEN", None, lambda: rs(64, HEX)),
    ("jira-legacy", "Jira API token", "JIRA_API_TOKEN", None, lambda: rs(24, ALNUM)),
    ("generic-apikey", "API key", "API_KEY", "X-API-Key", lambda: rs(32, ALNUM)),
]
for sub, label, key, hdr, g in VEND:
    for i in range(2):
        v = g()
        akia = "AKIA" + rs(16, B32)
        ctxs = {
            "sentence-is": f"The {label} is {v}.",
            "sentence-secret-is": f"the secret is {v}",
            "sentence-use": f"use {v} for {label.split()[0]} (prod)",
            "sentence-paren": f"Rotated the {label.split()[0]} key today ({v}).",
            "md-table": f"| {label.split()[0]} | prod | {v} |",
            "md-table-hdr": f"| service | key | env |\n|---|---|---|\n| {label.split()[0]} | {v} | prod |",
            "csv": f"service,key\n{label.split()[0].lower()},{v}",
            "k8s-env-list": f"env:\n  - name: {key.upper()}\n    value: \"{v}\"",
            "ecs-json": J({"name": key.upper(), "value": v}),
            "gh-secret": f"gh secret set {key.upper()} --body {v}",
            "log": f"2026-11-03 09:14:22 INFO {label.split()[0].lower()} client init key={v[:4]}... full={v}",
            "html": f"<p>{label}: <code>{v}</code></p>",
            "comment": f"# {label.split()[0].lower()}: {v}",
            "kv-env": f"{key.upper()}={v}",
        }
        if hdr: ctxs["header"] = f"curl -H \"{hdr}: {v}\" https://api.example.com/"
        if sub == "aws-secret":
            ctxs["md-table-pair"] = f"| prod | {akia} | {v} |"
            ctxs["console-csv"] = f"Access key ID,Secret access key\n{akia},{v}"
            ctxs["two-lines"] = f"Access key: {akia}\nSecret: {v}"
            ctxs["prose-pair"] = f"IAM user ci-deployer: {akia} / {v}"
        for ctx, text in ctxs.items():
            add("prefixless", sub, ctx, text, v)

def cookie_vals():
    return [
        ("sessionid", lambda: rs(32, LOWALNUM)),
        ("connect.sid", lambda: "s%3A" + rs(32, B64U) + "." + rs(43, B64U)),
        ("JSESSIONID", lambda: rs(32, "0123456789ABCDEF")),
        ("_acme_session", lambda: rs(180, B64) + "--" + rs(40, HEX)),
        ("laravel_session", lambda: "eyJpdiI6" + rs(200, B64U)),
        ("PHPSESSID", lambda: rs(26, "abcdefghijklmnopqrstuv0123456789")),
        ("ASP.NET_SessionId", lambda: rs(24, "abcdefghijklmnopqrstuvwxyz012345")),
        ("__Secure-next-auth.session-token", lambda: "eyJhbGciOiJkaXIiLCJlbmMiOiJBMjU2R0NNIn0.." + rs(22, B64U) + "." + rs(300, B64U) + "." + rs(22, B64U)),
        ("user_session", lambda: rs(48, B64U)),
        (".AspNetCore.Cookies", lambda: "CfDJ8" + rs(250, B64U)),
    ]
for name, g in cookie_vals():
    for i in range(2):
        v = g()
        csrf = rs(32, ALNUM)
        ctxs = {
            "cookie-header": f"Cookie: theme=dark; {name}={v}; csrftoken={csrf}",
            "cookie-header-first": f"Cookie: {name}={v}",
            "curl-b": f"curl -b '{name}={v}' https://app.example.com/admin",
            "curl-H": f"curl 'https://app.example.com/api/me' -H 'accept: application/json' -H 'cookie: {name}={v}'",
            "set-cookie": f"Set-Cookie: {name}={v}; Path=/; HttpOnly; Secure; SameSite=Lax",
            "http-dump": f"GET /dashboard HTTP/1.1\nHost: app.example.com\nUser-Agent: Mozilla/5.0\nCookie: {name}={v}\n",
            "py": f"requests.get(url, cookies={{{J(name)}: {J(v)}}})",
            "js": f"document.cookie = \"{name}={v}; path=/\";",
            "log": f"2026-11-03 09:14:22 DEBUG request cookies: {name}={v}",
            "har": J({"name": name, "value": v, "path": "/", "httpOnly": True}),
            "prose": f"My {name} cookie for the admin panel is {v} (valid until Friday).",
            "md-table": f"| app.example.com | {name} | {v} |",
            "yaml": f"cookies:\n  {name}: {v}\n",
        }
        for ctx, text in ctxs.items():
            add("cookie", name, ctx, text, v)

def codes(kind):
    if kind == "github": return [rs(5, HEX) + "-" + rs(5, HEX) for _ in range(16)]
    if kind == "google": return [f"{R.randint(0,9999):04d} {R.randint(0,9999):04d}" for _ in range(10)]
    if kind == "generic": return ["-".join(rs(4, string.ascii_uppercase + string.digits) for _ in range(3)) for _ in range(10)]
    if kind == "digits10": return [str(R.randint(10**9, 10**10 - 1)) for _ in range(8)]
for kind in ["github", "google", "generic", "digits10"]:
    for i in range(2):
        cs = codes(kind)
        ctxs = {
            "md-list": f"## {kind.capitalize()} recovery codes\n" + "\n".join(f"- {c}" for c in cs),
            "plain-lines": f"{kind} 2FA backup codes:\n" + "\n".join(cs),
            "inline": f"{kind} recovery codes: " + ", ".join(cs),
            "yaml": "recovery_codes:\n" + "\n".join(f"  - \"{c}\"" for c in cs),
            "json": J({"backup_codes": cs}),
            "md-table": "| # | code |\n|---|---|\n" + "\n".join(f"| {n+1} | {c} |" for n, c in enumerate(cs)),
            "txt-download": "\n".join(cs) + "\n",
        }
        for ctx, text in ctxs.items():
            add("codes", kind, ctx, text, cs)

def b32(n): return rs(n, B32)
for i in range(3):
    s = b32(32)
    ctxs = {
        "otpauth": f"otpauth://totp/GitHub:jane?secret={s}&issuer=GitHub",
        "otpauth-secret-last": f"otpauth://totp/AWS%20prod:root?issuer=AWS&algorithm=SHA1&digits=6&period=30&secret={s}",
        "otpauth-lower": f"otpauth://totp/Okta:jane@corp.example.com?secret={s.lower()}&issuer=Okta",
        "totp-label": f"TOTP secret: {s}",
        "2fa-key-prose": f"The 2FA setup key for the shared admin account is {s}",
        "spaced-lower": f"Google Authenticator key: " + " ".join(s.lower()[j:j+4] for j in range(0, 32, 4)),
        "oathtool": f"oathtool --totp -b {s}",
        "pyotp": f"totp = pyotp.TOTP(\"{s}\")",
        "yaml": f"mfa:\n  totp_seed: {s}\n",
        "env": f"MFA_SECRET={s}",
        "md-table": f"| AWS root | MFA seed | {s} |",
        "migration": f"otpauth-migration://offline?data={base64.b64encode(R.randbytes(60)).decode().replace('+','%2B').replace('/','%2F').replace('=','%3D')}",
    }
    for ctx, text in ctxs.items():
        sec = text.split("data=")[1] if ctx == "migration" else (s.lower() if ctx == "otpauth-lower" else (" ".join(s.lower()[j:j+4] for j in range(0, 32, 4)) if ctx == "spaced-lower" else s))
        add("totp", "seed", ctx, text, sec)

def bip39(nwords):
    ent_bits = nwords * 11 * 32 // 33
    ent = R.randbytes(ent_bits // 8)
    cs = bin(int.from_bytes(hashlib.sha256(ent).digest(), "big"))[2:].zfill(256)[: nwords * 11 - ent_bits]
    bits = bin(int.from_bytes(ent, "big"))[2:].zfill(ent_bits) + cs
    return [WORDS[int(bits[i:i+11], 2)] for i in range(0, len(bits), 11)]
for n in [12, 24]:
    for i in range(3):
        w = bip39(n); ph = " ".join(w)
        num = "\n".join(f"{k+1}. {x}" for k, x in enumerate(w))
        ctxs = {
            "bare": ph,
            "label": f"seed phrase: {ph}",
            "prose": f"My MetaMask recovery phrase is {ph} — keep offline.",
            "md-code": f"Ledger backup:\n```\n{ph}\n```",
            "json": J({"mnemonic": ph}),
            "env": f"MNEMONIC=\"{ph}\"",
            "js": f"const wallet = ethers.Wallet.fromPhrase(\"{ph}\");",
            "yaml": f"wallet:\n  seed: {ph}\n",
            "md-table": f"| hot wallet | {ph} |",
        }
        for ctx, text in ctxs.items():
            add("seed", f"bip39-{n}", ctx, text, ph)
        add("seed", f"bip39-{n}", "numbered", f"Recovery words:\n{num}", num)
        grid = "\n".join("  ".join(f"{k+j+1:2d} {w[k+j]:<9}" for j in range(4)).rstrip() for k in range(0, n, 4))
        add("seed", f"bip39-{n}", "grid", "Seed words:\n" + grid, grid)

# ================================================================ 5. passwords in prose (languages, punctuation)
PROSE = {
    "en": ["my password is {V}", "pw: {V}", "the wifi password is {V}", "passcode {V}", "passcode: {V}",
           "login jane / {V}", "creds: admin/{V}", "use {V} as the password", "{V} is the root password",
           "password for the NAS: {V}", "Jane's gmail password: {V}", "her password is {V}", "pass {V}",
           "admin password was changed to {V}", "new pw -> {V}", "sudo password: {V}",
           "remember: vpn pass {V}", "Wi-Fi: HomeNet / {V}", "the code for the door keypad app is {V}",
           "user told me their GitHub password is {V}, do not share"],
    "fr": ["mot de passe : {V}", "le mot de passe du wifi est {V}", "mdp : {V}", "MDP wifi = {V}",
           "mon mot de passe est {V}", "identifiant : jane / mot de passe : {V}", "code wifi : {V}"],
    "de": ["Passwort: {V}", "Das Passwort ist {V}", "Kennwort: {V}", "WLAN-Passwort: {V}", "WLAN-Schlüssel: {V}",
           "mein Passwort lautet {V}", "Zugangsdaten: jane / {V}"],
    "es": ["contraseña: {V}", "la contraseña es {V}", "clave: {V}", "la clave del wifi es {V}", "contrasena {V}",
           "mi contraseña es {V}", "usuario: admin, contraseña: {V}"],
}
for lang, tmpls in PROSE.items():
    for t in tmpls:
        for ctx, _ in line_ctx("x").items():
            v = pw()
            line = t.replace("{V}", v)
            add("prose", f"{lang}:{t.replace('{V}','V')}", ctx, line_ctx(line)[ctx], v)
# notes written the way an agent keeps them (tables, bold labels, user/pass pairs)
NOTES = [
    ("md-table-pw-column", "| host | user | password |\n|---|---|---|\n| db01 | root | {V} |"),
    ("md-table-kv", "| key | value |\n|---|---|\n| password | {V} |"),
    ("md-table-creds-column", "| Service | Login | Creds |\n|---|---|---|\n| NAS | admin | {V} |"),
    ("md-bold-label", "**Password**: {V}"),
    ("md-bold-pw", "**pw**: `{V}`"),
    ("md-list-pair", "* Login: admin\n* Pass: {V}"),
    ("bare-pair", "admin / {V}"),
    ("user-pass-inline", "user: admin pass: {V}"),
    ("creds-colon", "Credentials: admin:{V}"),
    ("ssh-paren", "SSH: root@10.0.0.5 (pw {V})"),
    ("host-slash", "root@10.0.0.5 / {V}"),
    ("router-login", "Router login is admin with {V}"),
    ("pin", "SIM PIN 4827, PUK {V}"),
    ("key-passphrase", "passphrase for ~/.ssh/id_ed25519: {V}"),
    ("vault-master", "Bitwarden master password -> {V}"),
]
for sub, t in NOTES:
    for i in range(4):
        v = str(R.randint(10**7, 10**8 - 1)) if sub == "pin" else pw()
        add("prose", f"note:{sub}", "native", t.replace("{V}", v), v)
# punctuation: the password ends in punctuation / is followed by sentence punctuation
PUNCT = [
    ("pw-bang-then-dot", "my password is {V}. Don't share it.", "bang", ". Don't share it."),
    ("pw-bang-then-space", "The wifi password is {V} (guest network).", "bang", " (guest network)."),
    ("pw-plain-then-dot", "The admin password is {V}. Change it monthly.", "rand", ". Change it monthly."),
    ("pw-plain-then-comma", "pw: {V}, user: admin", "rand", ", user: admin"),
    ("pw-in-quotes", "password is \"{V}\" (with the quotes removed)", "bang", "\" (with the quotes removed)"),
    ("pw-backtick", "password: `{V}`.", "bang", "`."),
    ("mysql-andand", "mysql -uroot -p{V} && ls -la", "bang", " && ls -la"),
    ("sshpass-andand", "sshpass -p {V} ssh root@h && echo ok", "bang", " && echo ok"),
    ("env-semicolon", "export DB_PASSWORD={V}; ./run.sh", "bang", "; ./run.sh"),
    ("env-andand", "DB_PASSWORD={V} && ./migrate", "rand", " && ./migrate"),
    ("fr-then-dot", "Le mot de passe est {V}. Merci !", "bang", ". Merci !"),
    ("de-then-dot", "Das Passwort ist {V}. Danke.", "bang", ". Danke."),
    ("es-then-dot", "La contraseña es {V}. Gracias.", "bang", ". Gracias."),
]
for sub, t, kind, after in PUNCT:
    for i in range(6):
        v = pw(kind)
        line = t.replace("{V}", v)
        for ctx in ["prose", "md-bullet", "json", "log", "chat"]:
            text = line_ctx(line)[ctx] if ctx != "prose" else line
            k = after.strip()
            add("punct", sub, ctx, text, v, keep=[k] if ctx != "json" else [], note=f"after={after!r}")

# ================================================================ 5b. password shapes in strong contexts
# the same value after keys the filter knows, to separate "context not recognised" from "value rejected"
def diceware(n=4, sep="-", cap=False, digit=False):
    w = [R.choice(WORDS) for _ in range(n)]
    if cap: w = [x.capitalize() for x in w]
    return sep.join(w) + (sep + str(R.randint(1, 9)) if digit else "")
SHAPES = {
    "diceware-4-hyphen": lambda: diceware(4),
    "diceware-3-hyphen-digit": lambda: diceware(3, digit=True),
    "diceware-cap-hyphen-digit": lambda: diceware(4, cap=True, digit=True),
    "diceware-dot": lambda: diceware(4, "."),
    "diceware-space": lambda: diceware(4, " "),
    "diceware-concat": lambda: diceware(3, "") + str(R.randint(10, 99)),
    "icloud-style": lambda: "-".join(rs(6, string.ascii_lowercase) for _ in range(3)),
    "google-app-password": lambda: " ".join(rs(4, string.ascii_lowercase) for _ in range(4)),
    "lower-12": lambda: rs(12, string.ascii_lowercase),
    "digits-8": lambda: str(R.randint(10**7, 10**8 - 1)),
    "rand-sym": lambda: pw("rand"),
    "human": lambda: pw("human"),
    "short-8": lambda: pw("short"),
    "with-your": lambda: rs(4) + "your" + rs(6),
    "with-sample": lambda: "Sample" + rs(6) + "!" + str(R.randint(1, 9)),
    "with-fake": lambda: rs(5) + "fake" + rs(5),
    "with-todo": lambda: "Todo" + str(R.randint(1990, 2026)) + "!",
    "with-replace": lambda: "replace" + rs(8),
    "with-insert": lambda: rs(3) + "Insert" + rs(5) + "#",
}
STRONG = {
    "env": "DB_PASSWORD={V}",
    "env-quoted": 'DB_PASSWORD="{V}"',
    "yaml": "password: {V}",
    "yaml-quoted": "password: '{V}'",
    "json": '{"user": "app", "password": "{V}"}',
    "prose-my": "my password is {V}",
    "prose-wifi": "the wifi password is {V}",
    "mysql-p": "mysql -u root -p'{V}' app",
    "sshpass": "sshpass -p '{V}' ssh root@10.0.0.5",
    "url": "postgres://app:{V}@db01:5432/app",
}
for shape, g in SHAPES.items():
    for i in range(3):
        v = g()
        for ctx, t in STRONG.items():
            if " " in v and ctx in ("env", "yaml", "url"): continue
            add("pwshape", shape, ctx, t.replace("{V}", v), v)
# TOTP seeds of 16 characters, some with no digit (about 3.6% of random 80-bit seeds)
for i in range(4):
    for s in (rs(16, B32), rs(16, string.ascii_uppercase), rs(32, string.ascii_uppercase)):
        for ctx, text in {"otpauth": f"otpauth://totp/Acme:jane?secret={s}&issuer=Acme",
                          "label": f"TOTP secret: {s}", "env": f"MFA_SECRET={s}"}.items():
            add("totp", "seed-" + ("letters-only" if s.isalpha() else "mixed") + f"-{len(s)}", ctx, text, s)

# gh secret set with values that no vendor rule knows (lengths other than the AWS secret's 40)
for name in ["DEPLOY_TOKEN", "NPM_TOKEN", "SLACK_WEBHOOK_URL_SECRET", "PROD_DB_PASS", "SENTRY_DSN"]:
    for flag in ["--body {V}", '--body "{V}"', "-b {V}", "--body={V}"]:
        for v in [rs(24), rs(32, HEX), rs(36), rs(64, HEX)]:
            cmd = f"gh secret set {name} " + flag.replace("{V}", v) + " --repo acme/web"
            add("cmd", "gh-secret-set-lengths", f"len{len(v)}", cmd, v)

# ================================================================ 6. look-alikes (must pass untouched)
def fp_kv(sub, key, val, label=None, ctxs=("yaml", "json", "env", "md-table", "prose", "py")):
    for ctx, text in kv_ctx(label or key.replace("_", " "), key, val).items():
        if ctx in ctxs: benign(sub, ctx, text)
for key, val in [("passphrase", "prompt"), ("password", "<redacted>"), ("password", "********"), ("password", "changeme"),
                 ("password", "[REDACTED]"), ("password", "REPLACE_ME"), ("password", "${DB_PASSWORD}"), ("password", "{{ vault_db_password }}"),
                 ("password", "null"), ("password", "xxxxxxxx"), ("password_min_length", "12"), ("token_count", "1234"),
                 ("max_tokens", "4096"), ("secret_santa", "true"), ("password_file", "/run/secrets/db_password"),
                 ("token_type", "bearer"), ("api_key", "your-api-key-here"), ("passwordless", "true"), ("password_expiry_days", "90"),
                 ("secret_name", "prod/db/credentials"), ("token_endpoint", "https://auth.example.com/oauth/token")]:
    fp_kv(f"placeholder:{key}={val}", key, val)
for i in range(3):
    benign("recaptcha-site-key", "html", f'<div class="g-recaptcha" data-sitekey="6Lc{rs(37, B64U)}"></div>')
    benign("recaptcha-site-key", "env", f"RECAPTCHA_SITE_KEY=6Le{rs(37, B64U)}")
    m = hashlib.md5(R.choice(WORDS).encode()).hexdigest()
    benign("hash-doc-md5", "prose", f"Never store passwords as MD5: the MD5 of the password 'password' is 5f4dcc3b5aa765d61d8327deb882cf99, and {m} is in every rainbow table.")
    benign("hash-doc-sha256", "prose", f"Password hashing demo: sha256(\"password\") = {hashlib.sha256(b'password').hexdigest()}")
    benign("hash-doc-sha1-table", "md-table", f"| algorithm | hash of the password `hunter2` |\n|---|---|\n| sha1 | {hashlib.sha1(b'hunter2').hexdigest()} |")
    u = U()
    benign("uuid-request-id", "prose", f"Each request carries a correlation token: {u} is the id we log for support tickets.")
    benign("uuid-request-id", "yaml", f"request:\n  id: {u}\n  trace_token: {U()}\n")
    benign("uuid-request-id", "log", f"2026-11-03 09:14:22 INFO request done token: {u} status=200 took=12ms")
    sha = rs(40, HEX)
    benign("git-sha", "prose", f"The fix landed in commit {sha} (see also {sha[:7]}).")
    benign("git-sha", "log", f"commit {sha}\nAuthor: Jane Roe <jane@example.com>\nDate:   Mon Nov 3 09:14:22 2026 +0000\n\n    fix token refresh\n")
    benign("git-sha", "md-table", f"| v1.4.2 | {sha} | fix password reset email |")
    benign("version", "prose", f"Upgraded to v{R.randint(1,9)}.{R.randint(0,40)}.{R.randint(0,20)}-rc.{R.randint(1,5)}+build.{rs(7, HEX)}; the token refresh bug is gone.")
    benign("docker-digest", "prose", f"Pinned image ghcr.io/acme/api@sha256:{rs(64, HEX)}")
    benign("sri", "html", f'<script src="https://cdn.example.com/lib.js" integrity="sha384-{base64.b64encode(R.randbytes(48)).decode()}" crossorigin="anonymous"></script>')
    benign("npm-integrity", "json", J({"version": "4.17.21", "resolved": "https://registry.npmjs.org/lodash/-/lodash-4.17.21.tgz", "integrity": "sha512-" + base64.b64encode(R.randbytes(64)).decode()}))
    benign("data-uri-png", "md", f"![logo](data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAA{base64.b64encode(R.randbytes(300)).decode()})")
    benign("data-uri-png", "html", f'<img src="data:image/png;base64,iVBORw0KGgo{base64.b64encode(R.randbytes(200)).decode()}" alt="token icon">')
    benign("ssh-ed25519-pub", "authorized_keys", f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{base64.b64encode(R.randbytes(32)).decode()[:43]} jane@laptop")
    benign("ssh-rsa-pub", "prose", f"Deploy key (public): ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ{base64.b64encode(R.randbytes(256)).decode()} deploy@ci")
    benign("public-key-pem", "pem", pem("PUBLIC KEY", 294))
    benign("certificate-pem", "pem", pem("CERTIFICATE", 900))
    benign("ssh-host-fingerprint", "prose", f"Host key fingerprint is SHA256:{base64.b64encode(R.randbytes(32)).decode().rstrip('=')}.")
    benign("pgp-fingerprint", "prose", f"My PGP key fingerprint: {' '.join(rs(4, '0123456789ABCDEF') for _ in range(10))}")
    benign("eth-address", "prose", f"Send the refund to 0x{rs(40, HEX)} (public address).")
    benign("stripe-pk-live", "js", f"const stripe = Stripe('pk_live_{rs(99, ALNUM)}');", note="publishable key: public by design")
    benign("stripe-pk-test", "env", f"STRIPE_PUBLISHABLE_KEY=pk_test_{rs(99, ALNUM)}", note="publishable key: public by design")
    benign("etag", "http", f'ETag: "{rs(32, HEX)}"')
    benign("csp-nonce", "html", f'<script nonce="{base64.b64encode(R.randbytes(16)).decode()}">init()</script>')
    benign("jwks-modulus", "json", J({"kty": "RSA", "kid": rs(8, HEX), "use": "sig", "e": "AQAB", "n": b64url(R.randbytes(256))}))
for i in range(3):
    u = U()
    benign("uuid-token-doc", "yaml", f"# every API response carries a request token for support\nresponse:\n  token: {u}\n  status: ok\n")
    benign("uuid-token-doc", "prose", f"Request ids look like token: {u} - quote it when you open a ticket.")
    benign("uuid-token-doc", "md-table", f"| field | example |\n|---|---|\n| request token | {u} |")
    benign("sha-next-to-password", "prose", f"bcrypt replaced the old SHA-1 password digests (e.g. {rs(40, HEX)}) in 2024.")
    benign("git-sha-prose-secret", "prose", f"Reverted {rs(40, HEX)} which leaked a secret into the logs.")
for ctx, text in [("prose", "The docs use AKIAIOSFODNN7EXAMPLE as the access key id."),
                  ("env", "AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE\nAWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
                  ("ini", "[default]\naws_access_key_id = AKIAIOSFODNN7EXAMPLE\naws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n"),
                  ("md-table", "| AKIAIOSFODNN7EXAMPLE | wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY |"),
                  ("prose-jwt-io", "The jwt.io example token is eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")]:
    benign("docs-example-key", ctx, text)
for ctx, text in [("prose", "Run `docker login -u jane --password-stdin < token.txt` instead of -p."),
                  ("prose", "Forgot password? The password reset link expires after 30 minutes."),
                  ("prose", "The password must be at least 12 characters and contain a digit."),
                  ("prose", "Set the password with `passwd jane` and enter it at the prompt."),
                  ("yaml", "auth:\n  password: \"{{ lookup('env', 'DB_PASSWORD') }}\"\n"),
                  ("py", "password = os.environ[\"DB_PASSWORD\"]"),
                  ("js", "const password = process.env.DB_PASSWORD;"),
                  ("go", "password := os.Getenv(\"DB_PASSWORD\")"),
                  ("sh", "mysql -u root -p app   # prompts for the password"),
                  ("sh", "read -s -p 'Password: ' PW && export PW"),
                  ("prose", "Secret rotation runs every 90 days; the token TTL is 3600 seconds."),
                  ("prose", "postgres://user:password@localhost:5432/app is the template in the docs."),
                  ("sh", "kubectl create secret generic db --from-file=password=./pw.txt"),
                  ("sh", "gh secret set DEPLOY_TOKEN < token.txt"),
                  ("sh", "openssl rsa -in k.pem -passin env:KEY_PASS -out plain.pem"),
                  ("sh", "openssl rsa -in k.pem -passin file:/run/secrets/keypass"),
                  ("sh", "curl -u \"$USER:$TOKEN\" https://api.example.com"),
                  ("sh", "docker run -e POSTGRES_PASSWORD -p 5432:5432 postgres:16"),
                  ("sh", "PGPASSWORD=$DB_PASS psql -h db01 -U app"),
                  ("yaml", "env:\n  - name: DB_PASSWORD\n    valueFrom:\n      secretKeyRef:\n        name: db\n        key: password\n"),
                  ("prose", "The BIP39 word list starts with abandon, ability, able, about, above, absent."),
                  ("prose", "Recovery codes are stored in 1Password under 'GitHub 2FA'."),
                  ("prose", "The Cisco command is `enable secret <password>`; never use `enable password`."),
                  ("prose", "WireGuard: put the output of `wg genkey` after PrivateKey = in wg0.conf."),
                  ("cookie", "Set-Cookie: theme=dark; Path=/; Max-Age=31536000"),
                  ("cookie", "Cookie: _ga=GA1.2.1234567890.1700000000; lang=en-US"),
                  ]:
    benign("doc-prose", ctx, text)

