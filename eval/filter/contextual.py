import json, base64, urllib.parse, uuid, hashlib
from lib import *
def pw(n=14):
    a = string.ascii_letters+string.digits
    s = rs(n-3, a) + R.choice("!#%*") + str(R.randint(10,99))
    return s
def build(add, benign):
    # ---------- passwords in contexts ----------
    P = []
    def p(ctx, tmpl, val=None, note=""):
        v = val or pw()
        P.append((ctx, tmpl.replace("{V}", v), v, note))
    p("env","DB_PASSWORD={V}")
    p("env-quoted",'POSTGRES_PASSWORD="{V}"')
    p("yaml","database:\n  host: db.internal\n  username: app\n  password: {V}\n")
    p("yaml-quoted","  password: '{V}'")
    p("json",'{"user":"app","password":"{V}"}')
    p("toml",'[db]\npassword = "{V}"')
    p("ini","[client]\nuser=root\npassword={V}\n")
    p("properties","spring.datasource.password={V}")
    p("compose-list","    environment:\n      - MYSQL_ROOT_PASSWORD={V}\n")
    p("k8s-data-b64","apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\ntype: Opaque\ndata:\n  password: {V}\n", base64.b64encode(pw().encode()).decode())
    p("k8s-data-b64-named","kind: Secret\ndata:\n  DB_PASS: {V}\n", base64.b64encode(pw().encode()).decode())
    p("xml-maven","<server>\n  <id>nexus</id>\n  <username>deploy</username>\n  <password>{V}</password>\n</server>")
    p("nuget",'<add key="ClearTextPassword" value="{V}" />')
    p("tomcat-users",'<user username="admin" password="{V}" roles="manager-gui"/>')
    p("wp-config","define( 'DB_PASSWORD', '{V}' );")
    p("django-settings","DATABASES = {'default': {'ENGINE': 'django.db.backends.postgresql', 'NAME': 'app', 'USER': 'app', 'PASSWORD': '{V}'}}")
    p("php-var",'$db_pass = "{V}";')
    p("java",'String password = "{V}";')
    p("csharp",'var cred = new NetworkCredential("svc", "{V}");')
    p("go-struct",'cfg := Config{User: "app", Password: "{V}"}')
    p("pgpass","db.internal:5432:app:app:{V}")
    p("netrc","machine api.example.com login jane password {V}")
    p("htpasswd-plain-note","admin:{V}  # plaintext, hash it later")
    p("terraform",'admin_password = "{V}"')
    p("ansible","ansible_become_pass: {V}")
    p("ansible-ssh","web1 ansible_host=10.0.0.5 ansible_user=root ansible_ssh_pass={V}")
    p("hostapd","wpa_passphrase={V}")
    p("wpa",'network={\n  ssid="Home"\n  psk="{V}"\n}')
    p("nmconnection","[wifi-security]\nkey-mgmt=wpa-psk\npsk={V}")
    p("redis-conf","requirepass {V}")
    p("redis-masterauth","masterauth {V}")
    p("cisco","username admin privilege 15 password 0 {V}")
    p("cisco-secret","enable secret 0 {V}")
    p("snmp","snmp-server community {V} RW")
    p("sql-alter","ALTER USER app WITH PASSWORD '{V}';")
    p("sql-create-mysql","CREATE USER 'app'@'%' IDENTIFIED BY '{V}';")
    p("sql-mssql","CREATE LOGIN app WITH PASSWORD = '{V}';")
    p("mongo-createuser",'db.createUser({user: "app", pwd: "{V}", roles: ["readWrite"]})')
    p("rabbitmqctl","rabbitmqctl add_user admin {V}")
    p("chpasswd","echo 'root:{V}' | chpasswd")
    p("sudo-S","echo '{V}' | sudo -S apt update")
    p("docker-login-stdin","echo \"{V}\" | docker login -u jane --password-stdin")
    p("docker-login-p","docker login -u jane -p {V} registry.example.com")
    p("sshpass","sshpass -p '{V}' ssh root@10.0.0.5")
    p("sshpass-noquote","sshpass -p {V} scp file root@host:")
    p("mysql-p","mysql -u root -p{V} -h db")
    p("mysql-p-quoted","mysql -uroot -p'{V}' app < dump.sql")
    p("mysql-password","mysqldump --password={V} app > app.sql")
    p("pgpassword","PGPASSWORD={V} psql -h db -U app")
    p("curl-u","curl -u admin:{V} https://jenkins.example.com/api/json")
    p("curl-user","curl --user 'deploy:{V}' -X POST https://x.example.com")
    p("wget","wget --user=jane --password={V} https://files.example.com/a.tgz")
    p("smbclient","smbclient //fs/share -U 'CORP\\jane%{V}'")
    p("net-use","net use Z: \\\\fs01\\share {V} /user:CORP\\jane")
    p("mount-cifs","mount -t cifs //fs/share /mnt -o username=jane,password={V}")
    p("openssl-pass","openssl pkcs12 -export -in c.pem -out c.p12 -passout pass:{V}")
    p("openssl-passin","openssl rsa -in k.pem -passin pass:{V}")
    p("keytool","keytool -importkeystore -srcstorepass {V} -deststorepass {V}")
    p("zip-P","zip -P {V} secrets.zip notes.txt")
    p("7z-p","7z a -p{V} archive.7z dir/")
    p("gpg-passphrase","gpg --batch --passphrase {V} -d vault.gpg")
    p("ldapsearch","ldapsearch -x -D 'cn=admin,dc=example,dc=com' -w {V} -b dc=example,dc=com")
    p("ipmitool","ipmitool -I lanplus -H 10.0.0.9 -U ADMIN -P {V} power status")
    p("xfreerdp","xfreerdp /v:10.0.0.7 /u:Administrator /p:{V}")
    p("sqlcmd","sqlcmd -S db01 -U sa -P '{V}' -Q 'select 1'")
    p("mongosh","mongosh --host db -u admin -p {V}")
    p("redis-cli","redis-cli -h cache -a {V} ping")
    p("kubectl-literal","kubectl create secret generic db --from-literal=password={V}")
    p("helm-set","helm install app ./chart --set postgresql.auth.password={V}")
    p("az-login","az login -u jane@corp.com -p {V}")
    p("htpasswd-b","htpasswd -b /etc/nginx/.htpasswd admin {V}")
    p("powershell-securestring",'$pw = ConvertTo-SecureString "{V}" -AsPlainText -Force')
    p("runas-psexec","psexec \\\\srv -u CORP\\admin -p {V} cmd")
    p("expect-send",'expect "password:"\nsend "{V}\\r"')
    p("git-credentials","https://jane:{V}@github.com")
    p("sentence-is","The admin password is {V}")
    p("sentence-login","Log in to the router with admin / {V}")
    p("sentence-creds","creds for staging: deploy:{V}")
    p("sentence-wifi","wifi password for the office is {V}")
    p("sentence-pw-abbrev","pw: {V}")
    p("sentence-passphrase","SSH key passphrase: {V}")
    p("sentence-pin","The SIM PIN is 4827 and the PUK is 83920174", "83920174")
    p("md-table-pwcol","| host | user | password |\n|---|---|---|\n| db01 | root | {V} |", note="known: md password column")
    p("md-table-row","| Password | {V} |")
    p("md-bold","**Password:** {V}")
    p("md-list","- root password: `{V}`")
    p("user-pass-slash","Credentials: root/{V}")
    p("jdbc-query","jdbc:postgresql://db:5432/app?user=app&password={V}")
    p("jdbc-sqlserver","jdbc:sqlserver://db:1433;databaseName=app;user=sa;password={V};")
    p("adonet","Server=tcp:db.database.windows.net,1433;Initial Catalog=app;User ID=sa;Password={V};Encrypt=True;")
    p("odbc","Driver={ODBC Driver 18};Server=db;UID=sa;PWD={V};")
    p("oracle-ezconnect","sqlplus system/{V}@//db:1521/ORCLPDB1")
    p("go-mysql-dsn",'dsn := "app:{V}@tcp(db:3306)/app?parseTime=true"')
    p("psql-kv",'psql "host=db port=5432 dbname=app user=app password={V} sslmode=require"')
    p("kafka-jaas",'sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="app" password="{V}";')
    p("smtp-env","SMTP_PASS={V}")
    p("email-app-password","Gmail app password: {V}", " ".join(rs(4,string.ascii_lowercase) for _ in range(4)))
    p("env-secret-word","JWT_SECRET={V}", rs(24,ALNUM))
    p("env-session-secret","SESSION_SECRET={V}", rs(32,HEX))
    p("env-encryption-key","ENCRYPTION_KEY={V}", base64.b64encode(R.randbytes(32)).decode())
    p("env-signing-key","WEBHOOK_SIGNING_KEY={V}", rs(40,ALNUM))
    p("env-client-secret","OAUTH_CLIENT_SECRET={V}", rs(40,B64U))
    p("env-private-key-hex","SIGNER_PRIVATE_KEY={V}", rs(64,HEX))
    p("flask-secret","app.secret_key = b'{V}'", "".join("\\x%02x"%b for b in R.randbytes(16)))
    p("env-api-key-lower","api_key = \"{V}\"", rs(32,ALNUM))
    p("env-apikey-camel","apiKey: '{V}'", rs(32,ALNUM))
    p("env-x-api-key","X-API-Key: {V}", rs(32,HEX))
    p("header-api-key","api-key: {V}", rs(32,HEX))
    p("header-ocp","Ocp-Apim-Subscription-Key: {V}", rs(32,HEX))
    p("header-private-token","curl --header \"PRIVATE-TOKEN: {V}\" https://gitlab.example.com/api/v4/projects", rs(20,B64U))
    p("header-x-auth-token","X-Auth-Token: {V}", rs(40,HEX))
    p("header-token","Authorization: Token {V}", rs(40,HEX))
    p("header-splunk","Authorization: Splunk {V}", str(uuid.UUID(int=R.getrandbits(128),version=4)))
    p("header-apikey-elastic","Authorization: ApiKey {V}", base64.b64encode(f"{rs(20,B64U)}:{rs(22,B64U)}".encode()).decode())
    p("header-basic","Authorization: Basic {V}", base64.b64encode(f"admin:{pw()}".encode()).decode())
    p("header-proxy","Proxy-Authorization: Basic {V}", base64.b64encode(f"jane:{pw()}".encode()).decode())
    p("header-bearer-opaque","Authorization: Bearer {V}", rs(43,B64U))
    p("header-cookie","Cookie: sessionid={V}; csrftoken=abc", rs(32,LOWALNUM))
    p("header-set-cookie","Set-Cookie: session={V}; Path=/; HttpOnly; Secure", rs(60,B64U)+"."+rs(27,B64U))
    p("cookie-gitlab","_gitlab_session={V}", rs(32,HEX))
    p("cookie-rails","_myapp_session={V}", rs(120,B64)+"--"+rs(40,HEX))
    p("cookie-connectsid","connect.sid=s%3A{V}", rs(32,B64U)+"."+rs(43,B64))
    p("cookie-jsessionid","JSESSIONID={V}", rs(32,HEX.upper()))
    p("cookie-phpsessid","PHPSESSID={V}", rs(26,LOWALNUM))
    p("cookie-chrome-devtools","document.cookie = \"auth_token={V}\"", rs(40,HEX))
    p("url-access-token","https://graph.facebook.com/me?access_token={V}", rs(40,ALNUM))
    p("url-apikey","https://api.openweathermap.org/data/2.5/weather?q=Paris&appid={V}", rs(32,HEX))
    p("url-api_key","https://api.example.com/v2/search?api_key={V}&q=cats", rs(32,ALNUM))
    p("url-s3-presigned","https://bucket.s3.amazonaws.com/f.pdf?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=ASIAXYZ%2F20240501%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20240501T000000Z&X-Amz-Expires=3600&X-Amz-Security-Token={V}&X-Amz-Signature=" + rs(64,HEX), "IQoJb3JpZ2luX2VjE" + urllib.parse.quote(rs(200,B64),safe=''))
    p("url-gcs-signed","https://storage.googleapis.com/b/o?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential=sa%40p.iam.gserviceaccount.com%2F20240501%2Fauto%2Fstorage%2Fgoog4_request&X-Goog-Date=20240501T000000Z&X-Goog-Expires=900&X-Goog-SignedHeaders=host&X-Goog-Signature={V}", rs(512,HEX))
    p("url-sas-blob","https://acct.blob.core.windows.net/c/f.txt?sp=r&st=2024-05-01T00:00:00Z&se=2024-05-02T00:00:00Z&spr=https&sv=2022-11-02&sr=b&sig={V}", urllib.parse.quote(rs(43,B64)+"=",safe=''))
    p("url-basic-https","https://admin:{V}@grafana.example.com/api/dashboards")
    p("url-postgres","postgres://app:{V}@db.internal:5432/app")
    p("url-postgres-sqlalchemy","postgresql+psycopg2://app:{V}@db/app")
    p("url-mysql","mysql://root:{V}@127.0.0.1:3306/app")
    p("url-mongo-srv","mongodb+srv://admin:{V}@cluster0.ab1cd.mongodb.net/?retryWrites=true")
    p("url-mongo-encoded","mongodb://admin:{V}@db:27017", urllib.parse.quote(pw()+"@#",safe=''))
    p("url-redis-nouser","redis://:{V}@cache:6379/0")
    p("url-rediss-default","rediss://default:{V}@us1-x.upstash.io:6379")
    p("url-amqp","amqp://guest:{V}@rabbit:5672/")
    p("url-smtp","smtp://jane%40corp.com:{V}@smtp.gmail.com:587")
    p("url-ftp","ftp://ftpuser:{V}@files.example.com/pub")
    p("url-ldap","ldaps://cn=admin,dc=corp:{V}@ldap.corp:636")
    p("url-elastic","https://elastic:{V}@es.example.com:9200")
    p("url-git-token","git clone https://oauth2:{V}@gitlab.example.com/group/repo.git", rs(20,B64U))
    p("url-pip-index","pip install --index-url https://__token__:{V}@pypi.corp.com/simple pkg")
    p("url-in-prose-nokey","the DB is at postgres://app:{V}@10.0.0.3/app for now")
    p("url-split-host","DATABASE_URL=postgresql://app:{V}@/app?host=/cloudsql/proj:region:inst")
    p("npmrc-authToken","//registry.npmjs.org/:_authToken={V}", U:=str(uuid.UUID(int=R.getrandbits(128),version=4)))
    p("npmrc-auth","_auth={V}", base64.b64encode(f"jane:{pw()}".encode()).decode())
    p("npmrc-password","//npm.corp.com/:_password={V}", base64.b64encode(pw().encode()).decode())
    p("yarnrc","npmAuthToken: \"{V}\"", str(uuid.UUID(int=R.getrandbits(128),version=4)))
    p("docker-config-auth",'{"auths":{"https://index.docker.io/v1/":{"auth":"{V}"}}}', base64.b64encode(f"jane:{pw()}".encode()).decode())
    p("pypirc","[pypi]\nusername = __token__\npassword = {V}", "pypi-AgEIcHlwaS5vcmc"+rs(120,B64U))
    p("composer-auth",'{"http-basic":{"repo.packagist.com":{"username":"token","password":"{V}"}}}', rs(40,HEX))
    p("gradle-props","mavenPassword={V}")
    p("kubeconfig-token","users:\n- name: admin\n  user:\n    token: {V}", rs(6,LOWALNUM)+"."+rs(16,LOWALNUM))
    p("kubeconfig-client-key","users:\n- name: admin\n  user:\n    client-certificate-data: LS0tLS1CRUdJTi\n    client-key-data: {V}", base64.b64encode(pem("RSA PRIVATE KEY",900).encode()).decode())
    p("aws-credentials-file","[default]\naws_access_key_id = AKIA"+rs(16,B32)+"\naws_secret_access_key = {V}", rs(40,B64))
    p("aws-cli-configure","aws configure set aws_secret_access_key {V}", rs(40,B64))
    p("aws-secret-in-prose","AWS secret: {V}", rs(40,B64))
    p("aws-secret-table","| AccessKeyId | SecretAccessKey |\n|---|---|\n| AKIA"+rs(16,B32)+" | {V} |", rs(40,B64))
    p("aws-json-cli",'{"AccessKey": {"UserName": "ci", "AccessKeyId": "AKIA'+rs(16,B32)+'", "Status": "Active", "SecretAccessKey": "{V}"}}', rs(40,B64))
    p("gcp-sa-json", json.dumps({"type":"service_account","project_id":"proj","private_key_id":rs(40,HEX),"private_key":"{V}","client_email":"sa@proj.iam.gserviceaccount.com"}), pem("PRIVATE KEY",1200).replace("\n","\\n")+"\\n")
    p("totp-uri","otpauth://totp/ACME:jane?secret={V}&issuer=ACME", rs(32,B32))
    p("totp-prose","2FA seed: {V}", " ".join(rs(4,B32.lower()) for _ in range(8)))
    p("recovery-codes","GitHub recovery codes:\n{V}\n", "\n".join(f"{rs(5,HEX)}-{rs(5,HEX)}" for _ in range(4)))
    p("seed-phrase","wallet seed: {V}", "abandon ability able about above absent absorb abstract absurd abuse access accident", note="known: seed phrase")
    p("eth-privkey-prose","metamask private key 0x{V}", rs(64,HEX))
    p("solana-keypair","[{V}]", ",".join(str(R.randint(0,255)) for _ in range(64)))
    p("ssh-pass-prose","ssh root@10.0.0.5 (pass: {V})")
    p("vnc","VNC password set to {V}")
    p("bitlocker","BitLocker recovery key: {V}", "-".join(f"{R.randint(0,720895)//11*11:06d}" for _ in range(8)))
    p("windows-product-key","Windows key: {V}", "-".join(rs(5,"BCDFGHJKMPQRTVWXY2346789") for _ in range(5)))
    p("wifi-qr","WIFI:T:WPA;S:Office;P:{V};;")
    p("pgp-passphrase-env","GPG_PASSPHRASE={V}")
    p("ansible-vault-pass","echo '{V}' > ~/.vault_pass.txt")
    p("restic","RESTIC_PASSWORD={V}")
    p("borg","BORG_PASSPHRASE='{V}'")
    p("keepass-master","KeePass master password: {V}")
    p("rclone","[remote]\ntype = sftp\nhost = nas\nuser = jane\npass = {V}", rs(40,B64U))
    p("s3cmd","[default]\naccess_key = AKIA"+rs(16,B32)+"\nsecret_key = {V}", rs(40,B64))
    p("minio","MINIO_ROOT_PASSWORD={V}")
    p("grafana-ini","[security]\nadmin_password = {V}")
    p("jenkins-casc","jenkins:\n  securityRealm:\n    local:\n      users:\n        - id: admin\n          password: {V}")
    p("dotnet-usersecrets",'dotnet user-secrets set "Smtp:Password" "{V}"')
    p("python-kwargs","conn = psycopg2.connect(host='db', user='app', password='{V}')")
    p("python-kwargs-passwd","pymysql.connect(host='db', user='root', passwd='{V}', db='app')")
    p("js-object","const pool = new Pool({ user: 'app', password: '{V}', host: 'db' })")
    p("ruby-hash","ActiveRecord::Base.establish_connection(adapter: 'postgresql', password: '{V}')")
    p("shell-read","read -s PASS <<< '{V}'")
    p("cli-flag-pass","openvpn --auth-user-pass <(printf 'jane\\n{V}\\n')")
    p("ssh-askpass","SSHPASS={V} sshpass -e ssh host")
    p("rsync-password","RSYNC_PASSWORD={V} rsync -av rsync://backup@nas/share .")
    p("vault-write","vault kv put secret/db password={V}")
    p("aws-ssm","aws ssm put-parameter --name /db/pass --value '{V}' --type SecureString")
    p("tf-var","terraform apply -var 'db_password={V}'")
    p("sops-plain","db_password: {V} #ENC not yet")
    p("json-escaped-env", json.dumps({"content":"DB_PASSWORD={V}\nPORT=1\n"}))
    p("crlf-env","DB_PASS={V}\r\nDB_USER=app\r\n")
    p("tabs-ini","password\t=\t{V}")
    p("passwd-uppercase","PASSWORD: {V}")
    p("pass-key","pass: {V}")
    p("pwd-key","pwd={V}")
    p("passcode","passcode: {V}", str(R.randint(10**7,10**8)))
    p("password-hash-bcrypt","admin:{V}", "$2y$10$"+rs(53,ALNUM+"./"))
    p("shadow","root:{V}:19000:0:99999:7:::", "$6$"+rs(16,ALNUM)+"$"+rs(86,ALNUM+"./"))
    p("ntlm","Administrator:500:aad3b435b51404eeaad3b435b51404ee:{V}:::", rs(32,HEX))
    p("mysql-native-hash","'root'@'localhost' authentication_string='{V}'", "*"+rs(40,HEX.upper()))
    for ctx,text,v,note in P:
        add("password", ctx, text, [v], note)
    # ---------- private keys ----------
    for label in ["RSA PRIVATE KEY","EC PRIVATE KEY","DSA PRIVATE KEY","PRIVATE KEY","ENCRYPTED PRIVATE KEY","OPENSSH PRIVATE KEY","PGP PRIVATE KEY BLOCK","SSH2 ENCRYPTED PRIVATE KEY","OpenVPN Static key V1"]:
        body = pem(label, 400) if label!="OpenVPN Static key V1" else "-----BEGIN OpenVPN Static key V1-----\n"+"\n".join(rs(32,HEX) for _ in range(16))+"\n-----END OpenVPN Static key V1-----"
        if label=="PGP PRIVATE KEY BLOCK": body = body.replace("-----\n","-----\n\n",1)
        mid = body.split("\n")[3]
        add("private-key:"+label,"alone",body,[mid])
        add("private-key:"+label,"crlf",body.replace("\n","\r\n"),[mid])
        add("private-key:"+label,"json-escaped",json.dumps({"key":body}),[mid])
        add("private-key:"+label,"yaml-block","tls:\n  key: |\n    "+body.replace("\n","\n    ")+"\n",[mid])
        add("private-key:"+label,"md-codeblock","Here is the deploy key:\n```\n"+body+"\n```\n",[mid])
        add("private-key:"+label,"one-line",body.replace("\n"," "),[mid])
        add("private-key:"+label,"no-footer","\n".join(body.split("\n")[:-1]),[mid], note="truncated paste")
        add("private-key:"+label,"no-header","\n".join(body.split("\n")[1:]),[mid], note="known: body without BEGIN line")
        add("private-key:"+label,"b64",base64.b64encode(body.encode()).decode(),[base64.b64encode(body.encode()).decode()[40:80]])
        add("private-key:"+label,"quoted-prefix","> "+body.replace("\n","\n> "),[mid])
        add("private-key:"+label,"commented","# "+body.replace("\n","\n# "),[mid])
        add("private-key:"+label,"env-escaped",'PRIVATE_KEY="'+body.replace("\n","\\n")+'"',[mid])
    putty = "PuTTY-User-Key-File-3: ssh-rsa\nEncryption: none\nComment: rsa-key-20240501\nPublic-Lines: 6\n" + "\n".join(rs(64,B64) for _ in range(6)) + "\nKey-Derivation: Argon2id\nPrivate-Lines: 14\n" + "\n".join(rs(64,B64) for _ in range(14)) + "\nPrivate-MAC: " + rs(64,HEX)
    add("private-key:putty","alone",putty,[putty.split("\n")[12]])
    wg = base64.b64encode(R.randbytes(32)).decode()
    add("wireguard","wg-conf","[Interface]\nPrivateKey = "+wg+"\nAddress = 10.8.0.2/24\n",[wg])
    wg2 = base64.b64encode(R.randbytes(32)).decode()
    add("wireguard","wg-prose","my wg private key: "+wg2,[wg2])
    # ---------- cards / PII ----------
    cards = {"visa":luhn_complete("4",16),"mc":luhn_complete("5"+str(R.randint(1,5)),16),"mc2":luhn_complete("2221",16),"amex":luhn_complete("37",15),"discover":luhn_complete("6011",16),"jcb":luhn_complete("3530",16),"diners":luhn_complete("36",14),"unionpay":luhn_complete("62",19),"maestro":luhn_complete("6759",19), "visa13": luhn_complete("4",13)}
    for k,c in cards.items():
        g4 = " ".join(c[i:i+4] for i in range(0,len(c),4))
        amex = f"{c[:4]} {c[4:10]} {c[10:]}" if len(c)==15 else g4
        add("card:"+k,"bare",c,[c])
        add("card:"+k,"grouped-space",f"card {amex} exp 04/27 cvv 123",[c[-8:-4] if False else c], note="")
        add("card:"+k,"dashed","-".join(c[i:i+4] for i in range(0,len(c),4)),[c])
        add("card:"+k,"prose",f"Paid with my card {g4}, exp 09/28.",[c])
        add("card:"+k,"json",json.dumps({"card_number":c,"exp":"09/28"}),[c])
        add("card:"+k,"dotted",".".join(c[i:i+4] for i in range(0,len(c),4)),[c])
    ssn = f"{R.randint(100,665)}-{R.randint(10,99)}-{R.randint(1000,9999)}"
    add("ssn","dashed",f"SSN {ssn}",[ssn]); add("ssn","bare-keyword",f"SSN: {ssn.replace('-','')}",[ssn.replace('-','')])
    add("ssn","prose",f"my social security number is {ssn.replace('-',' ')}",[ssn.replace('-',' ')])
    for cc,bb in [("DE","370400440532013"+str(R.randint(100,999))),("GB","NWBK601613"+str(R.randint(10**7,10**8))),("FR","20041010050500013M02606")]:
        ib = iban(cc,bb)
        add("iban","compact",f"IBAN {ib}",[ib]); add("iban","grouped"," ".join(ib[i:i+4] for i in range(0,len(ib),4)),[" ".join(ib[i:i+4] for i in range(0,len(ib),4))])
        add("iban","prose-lower",f"send it to {ib.lower()}",[ib.lower()])
    # ---------- benign ----------
    Uu = lambda: str(uuid.UUID(int=R.getrandbits(128),version=4))
    B = [
     ("uuid", f"request id {Uu()} failed"), ("uuid-json", json.dumps({"id":Uu(),"tenant_id":Uu(),"client_id":Uu()})),
     ("git-sha", f"commit {rs(40,HEX)}\nMerge: {rs(7,HEX)} {rs(7,HEX)}"), ("git-short", f"fixed in {rs(12,HEX)} and {rs(7,HEX)}"),
     ("sha256", f"sha256sum: {rs(64,HEX)}  release.tar.gz"), ("docker-digest", f"image: nginx@sha256:{rs(64,HEX)}"),
     ("npm-integrity", f'"integrity": "sha512-{base64.b64encode(R.randbytes(64)).decode()}"'),
     ("yarn-lock", f'  resolved "https://registry.yarnpkg.com/left-pad/-/left-pad-1.3.0.tgz#{rs(40,HEX)}"\n  integrity sha1-{base64.b64encode(R.randbytes(20)).decode()}'),
     ("go-sum", f"golang.org/x/text v0.3.7 h1:{base64.b64encode(R.randbytes(32)).decode()}"),
     ("cargo-lock", f'checksum = "{rs(64,HEX)}"'),
     ("pnpm-lock", f"    resolution: {{integrity: sha512-{base64.b64encode(R.randbytes(64)).decode()}}}"),
     ("poetry-lock", f'{{file = "requests-2.31.0-py3-none-any.whl", hash = "sha256:{rs(64,HEX)}"}}'),
     ("data-uri", "![logo](data:image/png;base64,"+base64.b64encode(R.randbytes(300)).decode()+")"),
     ("ssh-pub", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI"+rs(43,B64)+" jane@laptop"),
     ("ssh-pub-rsa", "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABgQ"+rs(500,B64)+" jane@laptop"),
     ("cert", pem("CERTIFICATE",500)), ("pubkey", pem("PUBLIC KEY",270)), ("pgp-pub", pem("PGP PUBLIC KEY BLOCK",400)),
     ("ssh-fp", f"SHA256:{rs(43,B64)} (ED25519)"), ("pgp-fp", " ".join(rs(4,HEX.upper()) for _ in range(10))),
     ("long-ident", "AbstractSingletonProxyFactoryBeanDefinitionRegistryPostProcessorConfigurationHelper"),
     ("snake-ident", "get_user_authentication_token_refresh_handler_for_password_reset_flow_v2"),
     ("prose-secrets", "Rotate the API key every 90 days and never commit the password to git; tokens expire after an hour."),
     ("prose-password-policy", "The password must be at least 12 characters and include a symbol."),
     ("placeholder-1", "OPENAI_API_KEY=your-api-key-here"), ("placeholder-2", 'api_key = "<YOUR_API_KEY>"'),
     ("placeholder-3", "export GITHUB_TOKEN=ghp_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"), ("placeholder-4", "password: ${DB_PASSWORD}"),
     ("placeholder-5", "token: {{ secrets.GITHUB_TOKEN }}"), ("placeholder-6", "const key = process.env.STRIPE_SECRET_KEY;"),
     ("placeholder-7", 'api_key = os.environ["OPENAI_API_KEY"]'), ("placeholder-8", "password: '********'"),
     ("placeholder-9", "DB_PASSWORD=changeme  # replace in prod"), ("placeholder-10", "Authorization: Bearer <token>"),
     ("placeholder-11", "Authorization: Bearer $TOKEN"), ("placeholder-12", "SECRET_KEY=replace-me-with-a-long-random-string"),
     ("placeholder-13", "sk-ant-api03-..."), ("placeholder-14", "AWS_SECRET_ACCESS_KEY=<your secret key>"),
     ("placeholder-15", "password = getpass.getpass()"), ("placeholder-16", "PASSWORD=$(cat /run/secrets/db_password)"),
     ("placeholder-17", "password: !vault |\n  $ANSIBLE_VAULT;1.1;AES256"), ("placeholder-18", "api_key: null"),
     ("placeholder-19", "export OPENAI_API_KEY=sk-proj-XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"), ("placeholder-20","STRIPE_KEY=sk_test_YOUR_KEY_HERE"),
     ("example-aws", "AKIAIOSFODNN7EXAMPLE / wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
     ("k8s-secretref", "env:\n- name: DB_PASSWORD\n  valueFrom:\n    secretKeyRef:\n      name: db-secret\n      key: password"),
     ("k8s-secretname", "tls:\n- hosts: [a.example.com]\n  secretName: a-example-com-tls"),
     ("sshd", "PasswordAuthentication no\nPermitRootLogin prohibit-password"), ("pam", "password  required  pam_unix.so sha512 shadow"),
     ("max-tokens", "max_tokens: 4096\ntemperature: 0.2\ntoken_limit=128000"), ("token-count", "Used 15234 tokens (input_tokens=12000, output_tokens=3234)"),
     ("password-len", "password_min_length: 12\npassword_expiry_days: 90"), ("grant-type", "grant_type=password&scope=openid"),
     ("token-type", '{"token_type":"Bearer","expires_in":3599}'), ("keyfile", "ssl_certificate_key /etc/nginx/ssl/server.key;"),
     ("ethereum-address", "send to 0x"+rs(40,HEX)), ("tx-hash", "tx 0x"+rs(64,HEX)+" confirmed"),
     ("btc-address", "bc1q"+rs(38,"qpzry9x8gf2tvdw0s3jn54khce6mua7l")), ("arn", "arn:aws:iam::123456789012:role/deploy"),
     ("aws-request-id", "RequestId: "+Uu()), ("google-client-id", "client_id: 123456789012-"+rs(32,LOWALNUM)+".apps.googleusercontent.com"),
     ("stripe-pk", "pk_live_51"+rs(97,ALNUM)), ("sentry-dsn-public", "Sentry.init({ dsn: 'https://"+rs(32,HEX)+"@o123456.ingest.sentry.io/1234567' })"),
     ("imei", "IMEI: 490154203237518"), ("order-number", "Order #4532015112830366 shipped"), ("tracking", "UPS 1Z999AA10123456784"),
     ("phone", "Call +1 (415) 555-0132 or +44 20 7946 0958"), ("ports", "ports: 8080 8443 9090 9443 3000 5432"),
     ("timestamps", "ts=1716200000123 next=1716200060123"), ("ipv6", "fe80::1ff:fe23:4567:890a"), ("mac", "00:1A:2B:3C:4D:5E"),
     ("css", "color: #a1b2c3; background: #ffeedd;"), ("semver", "requires node >=18.17.0 <21"),
     ("jwt-docs-example", "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"),
     ("jwt-header-only", "header eyJhbGciOiJSUzI1NiJ9 decoded"), ("base64-text", "aGVsbG8gd29ybGQgdGhpcyBpcyBqdXN0IGEgdGVzdCBzdHJpbmcgb2Yg dGV4dA=="),
     ("k8s-configmap", "kind: ConfigMap\ndata:\n  LOG_LEVEL: debug\n  FEATURE_FLAGS: YWxwaGEsYmV0YQ=="),
     ("password-reset-url", "https://example.com/reset?next=/account&lang=en"), ("url-user-only", "ssh://git@github.com/org/repo.git"),
     ("url-port", "http://localhost:8080/api"), ("url-at-user", "https://github.com/@jane"),
     ("email-url", "mailto:jane@example.com"), ("npm-scope", "npm i @babel/core@7.24.0"),
     ("docs-postgres", "postgres://user:password@localhost:5432/mydb", ),
     ("docs-redis", "redis://localhost:6379/0"), ("word-password", "I forgot my password again, reset it via the portal."),
     ("password-question", "What is the password policy for service accounts?"), ("token-talk","The token is stored in the keychain; see docs."),
     ("secret-of", "The secret of good code is readability."), ("pw-var", "pw = prompt_password()"),
     ("slack-channel", "channel C0123ABCD45, user U02ABCDE12"), ("discord-snowflake", "user id 80351110224678912"),
     ("twilio-sid", "Account SID AC"+rs(32,HEX)), ("azure-ids", "subscription_id = \""+Uu()+"\"\ntenant_id = \""+Uu()+"\""),
     ("hash-prose", "md5 of the file is "+rs(32,HEX)), ("sri", '<script src="x.js" integrity="sha384-'+base64.b64encode(R.randbytes(48)).decode()+'" crossorigin="anonymous">'),
     ("webpack-hash", "main."+rs(20,HEX)+".js vendor."+rs(8,HEX)+".chunk.js"), ("nonce", "<script nonce=\"r4nd0m\">"),
     ("password-field-html", '<input type="password" name="password" autocomplete="current-password">'),
     ("password-label", "Password: (leave empty to keep the current one)"), ("passwords-list", "passwords, passphrases, PINs and tokens are all secrets"),
     ("license-key-talk", "license key: see 1Password entry 'JetBrains'"), ("kid", '"kid": "'+rs(40,HEX)+'"'),
     ("oauth-state", "state=af0ifjsldkj&code_challenge_method=S256"), ("s3-etag", 'ETag: "'+rs(32,HEX)+'"'),
     ("iso-dates", "from 2024-05-01 to 2024-06-30, 4111 items"), ("luhn-ids", "ids: 79927398713 12345678903 4532015112830366"),
     ("git-lfs", "version https://git-lfs.github.com/spec/v1\noid sha256:"+rs(64,HEX)+"\nsize 123456"),
     ("password-true", "password: true\nsecret: false"), ("apikey-ref", "api_key: !Ref ApiKeyParam"),
     ("aws-secret-ref", "aws_secret_access_key = {{ aws_secret }}"), ("pw-env-ref", "password=%DB_PASSWORD%"),
     ("pw-none", "password: None"), ("pw-empty", 'password: ""'), ("pw-file", "password_file: /etc/app/db.pass"),
     ("secret-manager-path", "secret: projects/my-proj/secrets/db-pass/versions/latest"),
     ("vault-path", "token_path = \"secret/data/app/token\""), ("gh-actions-ref", "password: ${{ secrets.REGISTRY_PASSWORD }}"),
     ("dotnet-placeholder", '"ConnectionStrings": {"Db": "Server=.;Database=app;Trusted_Connection=True;"}'),
     ("python-hash", "hashlib.sha256(password.encode()).hexdigest()"), ("api-key-header-name", "send the key in the X-API-Key header"),
     ("rfc-example", "Authorization: Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="),
     ("random-word-salad", "Xylophone Quarterback Jubilant Vortex 42"),
    ]
    for fam,text in B: benign(fam,text)

def build_probes(add, benign):
    import uuid
    U = lambda: str(uuid.UUID(int=R.getrandbits(128), version=4))
    # private keys behind a line prefix (comment/quote/diff/listing)
    body = pem("OPENSSH PRIVATE KEY", 300); mid = body.split("\n")[2]
    lines = body.split("\n")
    for name, pre in [("hash-comment","# "),("md-blockquote","> "),("slash-comment","// "),("c-block-comment"," * "),("semicolon","; "),("sql-comment","-- "),("diff-removed","-"),("table-pipe","| ")]:
        add("private-key:prefixed", name, pre + body.replace("\n","\n"+pre), [mid])
    add("private-key:prefixed","numbered-listing","\n".join(f"{i+1:3d} | {l}" for i,l in enumerate(lines)),[mid])
    add("private-key:prefixed","python-concat","KEY = (\n" + "\n".join(f'    "{l}\\n"' for l in lines) + "\n)",[mid])
    add("private-key:prefixed","double-escaped-json",'"private_key": "' + "\\\\n".join(lines) + '"',[mid])
    add("private-key:prefixed","xml-entity","<key>" + "&#10;".join(lines) + "</key>",[mid])
    # Authorization schemes
    for sch,v in [("SSWS","00"+rs(40,B64U)),("OAuth",rs(40,ALNUM)),("Splunk",U()),("GenieKey",U()),("Klaviyo-API-Key","pk_"+rs(34,HEX)),("key=","AAAA"+rs(7,B64U)+":APA91b"+rs(134,B64U))]:
        add("auth-header-scheme", sch, f"Authorization: {sch}{'' if sch.endswith('=') else ' '}{v}", [v])
    v = rs(40,ALNUM); add("auth-header-scheme","X-JFrog-Art-Api",f"X-JFrog-Art-Api: {v}",[v])
    # lists of keys under one key name
    a,b = rs(32,HEX), rs(32,HEX)
    add("key-list","comma",f"API_KEYS={a},{b}",[a,b]); add("key-list","semicolon",f"OPENAI_KEYS={a};{b}",[a,b])
    add("key-list","yaml-list",f"api_keys:\n  - {a}\n  - {b}\n",[a,b])
    add("key-list","json-array",json.dumps({"api_keys":[a,b]}),[a,b])
    # unquoted value that looks like word_... after a key name
    for v in ["live_"+rs(35,HEX), "napi_"+rs(64,LOWALNUM), "bkua_"+rs(40,HEX), "abc_"+rs(32,LOWALNUM), "ATTA"+rs(64,HEX)+rs(8,HEX.upper()), "rpa_"+rs(40,string.ascii_uppercase+string.digits)]:
        add("generic-unquoted-prefixed","env",f"API_KEY={v}",[v]); add("generic-unquoted-prefixed","yaml",f"api_key: {v}",[v])
    # Django/any secret with punctuation
    v = "django-insecure-"+rs(50,string.ascii_lowercase+string.digits+"!@#$%^&*(-_=+)")
    add("django-secret-key","settings.py",f"SECRET_KEY = '{v}'",[v]); add("django-secret-key","env",f"DJANGO_SECRET_KEY={v}",[v])
    # *_PAT names
    v = rs(52,string.ascii_lowercase+"234567")
    add("pat-keyname","AZURE_DEVOPS_PAT",f"AZURE_DEVOPS_PAT={v}",[v]); add("pat-keyname","GITHUB_PAT-generic",f"GITHUB_PAT={v}",[v])
    add("pat-keyname","az-devops-login",f"echo {v} | az devops login --organization https://dev.azure.com/acme",[v])
    # telegram in its canonical URL
    tok = f"{R.randint(10**9,7*10**9)}:AA{rs(33,B64U)}"
    add("telegram-url","api-url",f"https://api.telegram.org/bot{tok}/sendMessage?chat_id=12345",[tok])
    add("telegram-url","curl",f"curl -s https://api.telegram.org/bot{tok}/getUpdates",[tok])
    # passwords in URLs with raw '@' and '/'
    add("url-password-raw-at","slash", "postgres://app:p@ss/w0rd@db:5432/app", ["p@ss/w0rd"])
    add("url-password-raw-at","hash", "mongodb://admin:Sup3r#Secret@db:27017/admin", ["Sup3r#Secret"])
    add("url-password-raw-at","question", "redis://default:Wx9?kL2mQ8@cache:6379", ["Wx9?kL2mQ8"])
    # passwords with spaces / trailing punctuation / single-quoted
    add("password-spaces","yaml-unquoted","password: correct horse battery staple",["correct horse battery staple"])
    add("password-spaces","yaml-single-quoted","password: 'Pa55 w0rd here'",["Pa55 w0rd here"])
    add("password-trailing-punct","amp","password: Rx9kL2mQ8vN5&&",["Rx9kL2mQ8vN5&&"])
    add("password-trailing-punct","paren","DB_PASSWORD=Rx9kL2mQ8vN5)",["Rx9kL2mQ8vN5)"])
    add("password-trailing-punct","backslash",'password = "Rx9kL2mQ8vN5\\"',["Rx9kL2mQ8vN5\\"])
    # bare vendor tokens with real published prefixes (no key name)
    bare = {
     "google-refresh-token":"1//0g"+rs(98,B64U), "fcm-server-key":"AAAA"+rs(7,B64U)+":APA91b"+rs(134,B64U),
     "tailscale-authkey":"tskey-auth-k"+rs(16,ALNUM)+"CNTRL-"+rs(33,ALNUM), "tailscale-api":"tskey-api-k"+rs(16,ALNUM)+"CNTRL-"+rs(33,ALNUM),
     "nuget":"oy2"+rs(43,LOWALNUM), "crates-io":"cio"+rs(32,ALNUM), "circleci":"CCIPAT_"+rs(22,ALNUM)+"_"+rs(40,HEX),
     "bitbucket-app-password":"ATBB"+rs(32,ALNUM)+rs(8,HEX.upper()), "trello":"ATTA"+rs(64,HEX)+rs(8,HEX.upper()),
     "figma":"figd_"+rs(40,B64U), "hubspot":"pat-na1-"+U(), "launchdarkly-sdk":"sdk-"+U(), "clickup":f"pk_{R.randint(10**7,10**8)}_{rs(32,string.ascii_uppercase+string.digits)}",
     "gitlab-runner-registration":"GR1348941"+rs(20,B64U), "plaid-access":"access-production-"+U(), "octopus":"API-"+rs(26,string.ascii_uppercase+string.digits),
     "maxmind":rs(6,ALNUM)+"_"+rs(29,ALNUM)+"_mmk", "clickhouse":"4b1d"+rs(38,ALNUM), "harness":"pat."+rs(22,B64U)+"."+rs(24,ALNUM)+"."+rs(20,ALNUM),
     "mandrill":"md-"+rs(22,B64U), "buildkite":"bkua_"+rs(40,HEX), "newrelic-license":rs(36,HEX)+"NRAL",
     "xprv":"xprv9s21ZrQH143K"+rs(95,"123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"),
     "salesforce-session":"00D"+rs(12,ALNUM)+"!"+rs(96,ALNUM+"._"), "azure-devops-pat-2024":rs(76,ALNUM)+"AZDO"+rs(4,ALNUM),
     "resend":"re_"+rs(8,ALNUM)+"_"+rs(24,ALNUM), "render":"rnd_"+rs(28,ALNUM), "neon":"napi_"+rs(64,LOWALNUM), "honeycomb":"hcaik_01"+rs(56,LOWALNUM),
    }
    for k,v in bare.items():
        add("bare-vendor:"+k,"alone",v,[v]); add("bare-vendor:"+k,"prose",f"here's the one for CI: {v}",[v])
    ov = "-----BEGIN OpenVPN Static key V1-----\n"+"\n".join(rs(32,HEX) for _ in range(16))+"\n-----END OpenVPN Static key V1-----"
    add("openvpn-static-key","tls-auth","<tls-auth>\n"+ov+"\n</tls-auth>",[ov.split("\n")[3]])
    # k8s Secret data: base64 of prefixed tokens under a non-secret-sounding key name
    for k,v in [("AWS_ACCESS_KEY_ID","AKIA"+rs(16,B32)),("SLACK_WEBHOOK_URL",f"https://hooks.slack.com/services/T{rs(8,string.ascii_uppercase+string.digits)}/B{rs(10,string.ascii_uppercase+string.digits)}/{rs(24)}"),("GITHUB_APP_ID_AND_TOKEN",gh("ghs_"))]:
        e = base64.b64encode(v.encode()).decode()
        add("k8s-secret-b64-token", k, f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: app\ntype: Opaque\ndata:\n  {k}: {e}\n", [e])
    # URL-encoded JSON body carrying a token
    t = gh("ghp_"); add("urlencoded-json","form-body","payload=" + urllib.parse.quote(json.dumps({"token": t})), [t])
    a = "sk-ant-api03-"+rs(93,B64U)+"AA"; add("urlencoded-json","query","https://x.example/cb?state=" + urllib.parse.quote(json.dumps({"key": a}), safe=''), [a])
    # FP probes (benign)
    for fam,text in [("passphrase-prompt","passphrase: prompt"),("recaptcha-site-key","recaptcha_site_key: 6Lc"+rs(37,B64U)),("md5-of-word","The hash of 'password' is 5f4dcc3b5aa765d61d8327deb882cf99 (md5)."),("idempotency-uuid","token: "+U()+"  # idempotency key")]:
        benign(fam, text)
