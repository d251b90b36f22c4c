"""Corpus 1 (session 28): about 230 formats of fake secrets, from gitleaks' published
rules and vendors' format documents, each in up to 50 contexts, and look-alikes.
Built whole at import; `C` is the list of entries (seeded: the same every run)."""
import json, uuid, base64, urllib.parse
from lib import *
R.seed(2828)
C = []   # corpus entries
def add(family, ctx, text, secrets, note=""):
    C.append({"id": f"{family}/{ctx}/{len(C)}", "family": family, "context": ctx, "text": text,
              "secrets": secrets if isinstance(secrets, list) else [secrets], "benign": False, "note": note})
def benign(family, text, note=""):
    C.append({"id": f"benign:{family}/{len(C)}", "family": family, "context": "benign", "text": text, "secrets": [], "benign": True, "note": note})
U = lambda: str(uuid.UUID(int=R.getrandbits(128), version=4))
# ---------- prefixed vendor tokens: (family, label, ENVNAME, value, bare_ok) ----------
T = []
CORE={}
def t(fam, label, env, val, bare=True, core=None):
    T.append((fam, label, env, val, bare))
    if core: CORE[fam]=core(val)
t("aws-access-key-id","AWS access key","AWS_ACCESS_KEY_ID","AKIA"+rs(16,B32))
t("aws-access-key-id-asia","AWS temp key","AWS_ACCESS_KEY_ID","ASIA"+rs(16,B32))
t("aws-secret-access-key","AWS secret key","AWS_SECRET_ACCESS_KEY",rs(40,B64), bare=False)
t("aws-session-token","AWS session token","AWS_SESSION_TOKEN","IQoJb3JpZ2luX2VjE"+rs(300,B64)+"==", bare=False)
t("aws-bedrock","Bedrock key","AWS_BEARER_TOKEN_BEDROCK","ABSKQmVkcm9ja0FQSUtleS"+rs(110,B64)+"=")
t("google-api-key","Google API key","GOOGLE_API_KEY","AIza"+rs(35,B64U))
t("google-oauth-secret","Google client secret","GOOGLE_CLIENT_SECRET","GOCSPX-"+rs(28,B64U))
t("google-oauth-access","Google access token","GOOGLE_ACCESS_TOKEN","ya29.a0"+rs(150,B64U))
t("google-refresh-token","Google refresh token","GOOGLE_REFRESH_TOKEN","1//0g"+rs(98,B64U))
t("azure-ad-client-secret","Azure client secret","AZURE_CLIENT_SECRET",rs(3,ALNUM)+"8Q~"+rs(34,ALNUM+"_-.~"))
t("azure-devops-pat","Azure DevOps PAT","AZURE_DEVOPS_PAT",rs(52,string.ascii_lowercase+"234567"), bare=False)
t("azure-devops-pat-new","Azure DevOps PAT","AZURE_DEVOPS_EXT_PAT",rs(76,ALNUM)+"AZDO"+rs(4,ALNUM))
t("azure-openai-key","Azure OpenAI key","AZURE_OPENAI_API_KEY",rs(32,HEX), bare=False)
t("azure-cosmos-key","Cosmos DB key","COSMOS_KEY",rs(86,B64)+"==", bare=False)
t("azure-function-key","Azure function key","AZURE_FUNCTION_KEY",rs(54,B64U)+"==", bare=False)
t("azure-acr-password","ACR password","ACR_PASSWORD",rs(42,ALNUM)+"+ACR"+rs(6,ALNUM), bare=False)
t("alibaba-key-id","Alibaba AccessKey","ALIBABA_CLOUD_ACCESS_KEY_ID","LTAI"+rs(20,ALNUM))
t("alibaba-secret","Alibaba secret","ALIBABA_CLOUD_ACCESS_KEY_SECRET",rs(30,ALNUM), bare=False)
t("tencent-secret-id","Tencent SecretId","TENCENTCLOUD_SECRET_ID","AKID"+rs(32,ALNUM))
t("digitalocean","DO token","DIGITALOCEAN_TOKEN","dop_v1_"+rs(64,HEX))
t("linode","Linode token","LINODE_TOKEN",rs(64,HEX), bare=False)
t("hetzner","Hetzner token","HCLOUD_TOKEN",rs(64,ALNUM), bare=False)
t("vultr","Vultr key","VULTR_API_KEY",rs(36,string.ascii_uppercase+string.digits), bare=False)
t("scaleway-secret","Scaleway secret key","SCW_SECRET_KEY",U(), bare=False)
t("cloudflare-api-token","Cloudflare API token","CLOUDFLARE_API_TOKEN",rs(40,B64U.replace('-','')), bare=False)
t("cloudflare-global-key","Cloudflare global key","CLOUDFLARE_API_KEY",rs(37,HEX), bare=False)
t("cloudflare-tunnel-token","cloudflared tunnel token","TUNNEL_TOKEN",base64.b64encode(json.dumps({"a":rs(32,HEX),"t":U(),"s":base64.b64encode(R.randbytes(32)).decode()}).encode()).decode())
t("tailscale-authkey","Tailscale auth key","TS_AUTHKEY","tskey-auth-k"+rs(16,ALNUM)+"CNTRL-"+rs(33,ALNUM))
t("tailscale-api","Tailscale API key","TAILSCALE_API_KEY","tskey-api-k"+rs(16,ALNUM)+"CNTRL-"+rs(33,ALNUM))
t("ngrok-authtoken","ngrok authtoken","NGROK_AUTHTOKEN","2"+rs(26,ALNUM)+"_"+rs(21,ALNUM), bare=False)
t("hashicorp-vault-legacy","Vault token","VAULT_TOKEN","s."+rs(24,ALNUM), bare=False)
t("hashicorp-vault","Vault token","VAULT_TOKEN","hvs.CAESI"+rs(86,B64U))
t("terraform","TFC token","TFE_TOKEN",rs(14,ALNUM)+".atlasv1."+rs(67,ALNUM))
t("pulumi","Pulumi token","PULUMI_ACCESS_TOKEN","pul-"+rs(40,HEX))
t("doppler","Doppler token","DOPPLER_TOKEN","dp.st.prd."+rs(43,ALNUM))
t("onepassword-sa","1Password SA token","OP_SERVICE_ACCOUNT_TOKEN","ops_eyJzaWduSW5BZGRyZXNzIjoi"+rs(300,B64))
t("infisical","Infisical token","INFISICAL_TOKEN","st."+U()+"."+rs(32,HEX)+"."+rs(32,HEX))
t("github-pat","GitHub token","GITHUB_TOKEN",gh("ghp_"))
t("github-oauth","GitHub OAuth token","GH_TOKEN",gh("gho_"))
t("github-app","GitHub app token","GITHUB_TOKEN",gh("ghs_"))
t("github-fine","GitHub PAT","GITHUB_PAT","github_pat_11"+rs(20,ALNUM)+"_"+rs(59,ALNUM))
t("gitlab-pat","GitLab token","GITLAB_TOKEN","glpat-"+rs(20,B64U))
t("gitlab-pat-routable","GitLab token","GITLAB_TOKEN","glpat-"+rs(36,B64U)+".01."+rs(9,LOWALNUM))
t("gitlab-runner-reg","runner registration token","REGISTRATION_TOKEN","GR1348941"+rs(20,B64U))
t("gitlab-runner","runner token","CI_RUNNER_TOKEN","glrt-"+rs(20,B64U))
t("gitlab-deploy","deploy token","GITLAB_DEPLOY_TOKEN","gldt-"+rs(20,B64U))
t("gitlab-session-cookie","gitlab cookie","GITLAB_SESSION",rs(32,LOWALNUM), bare=False)
t("bitbucket-app-password","Bitbucket app password","BITBUCKET_APP_PASSWORD","ATBB"+rs(32,ALNUM)+rs(8,HEX.upper()))
t("atlassian","Jira API token","JIRA_API_TOKEN","ATATT3xFfGF0"+rs(180,B64U)+"="+rs(8,HEX.upper()))
t("npm","npm token","NPM_TOKEN","npm_"+rs(36,ALNUM))
t("pypi","PyPI token","TWINE_PASSWORD","pypi-AgEIcHlwaS5vcmc"+rs(150,B64U))
t("dockerhub","Docker Hub token","DOCKERHUB_TOKEN","dckr_pat_"+rs(27,B64U))
t("rubygems","RubyGems key","GEM_HOST_API_KEY","rubygems_"+rs(48,HEX))
t("nuget","NuGet key","NUGET_API_KEY","oy2"+rs(43,LOWALNUM))
t("crates-io","crates.io token","CARGO_REGISTRY_TOKEN","cio"+rs(32,ALNUM))
t("jfrog","Artifactory key","ARTIFACTORY_API_KEY","AKCp8"+rs(68,ALNUM))
t("circleci","CircleCI token","CIRCLECI_TOKEN","CCIPAT_"+rs(22,ALNUM)+"_"+rs(40,HEX))
t("buildkite","Buildkite token","BUILDKITE_API_TOKEN","bkua_"+rs(40,HEX))
t("sonar","SonarQube token","SONAR_TOKEN","squ_"+rs(40,HEX))
t("snyk","Snyk token","SNYK_TOKEN",U(), bare=False)
t("codecov","Codecov token","CODECOV_TOKEN",U(), bare=False)
t("jenkins-api","Jenkins API token","JENKINS_API_TOKEN","11"+rs(32,HEX), bare=False)
t("octopus","Octopus API key","OCTOPUS_API_KEY","API-"+rs(26,string.ascii_uppercase+string.digits))
t("harness","Harness PAT","HARNESS_API_KEY","pat."+rs(22,B64U)+"."+rs(24,ALNUM)+"."+rs(20,ALNUM))
t("slack-bot","Slack bot token","SLACK_BOT_TOKEN",f"xoxb-{R.randint(10**11,10**12)}-{R.randint(10**12,10**13)}-{rs(24)}")
t("slack-user","Slack user token","SLACK_USER_TOKEN",f"xoxp-{R.randint(10**11,10**12)}-{R.randint(10**11,10**12)}-{R.randint(10**12,10**13)}-{rs(32,HEX)}")
t("slack-app","Slack app token","SLACK_APP_TOKEN",f"xapp-1-A{rs(10,string.ascii_uppercase+string.digits)}-{R.randint(10**12,10**13)}-{rs(64,HEX)}")
t("slack-refresh","Slack refresh","SLACK_REFRESH_TOKEN",f"xoxe-1-{rs(140,ALNUM)}")
t("slack-webhook","Slack webhook","SLACK_WEBHOOK_URL",f"https://hooks.slack.com/services/T{rs(8,string.ascii_uppercase+string.digits)}/B{rs(10,string.ascii_uppercase+string.digits)}/{rs(24)}", core=lambda v: v.rsplit('/',1)[1])
t("slack-workflow-webhook","Slack workflow webhook","SLACK_WEBHOOK_URL",f"https://hooks.slack.com/triggers/T{rs(8,string.ascii_uppercase+string.digits)}/{R.randint(10**12,10**13)}/{rs(32,HEX)}", core=lambda v: v.rsplit('/',1)[1])
t("discord-webhook","Discord webhook","DISCORD_WEBHOOK",f"https://discord.com/api/webhooks/{R.randint(10**17,10**18)}/{rs(68,B64U)}", core=lambda v: v.rsplit('/',1)[1])
t("discord-webhook-ptb","Discord webhook","DISCORD_WEBHOOK",f"https://ptb.discordapp.com/api/webhooks/{R.randint(10**17,10**18)}/{rs(68,B64U)}", core=lambda v: v.rsplit('/',1)[1])
_did=str(R.randint(10**17,10**18)); 
t("discord-bot","Discord bot token","DISCORD_TOKEN",base64.b64encode(_did.encode()).decode().rstrip('=')+"."+rs(6,B64U)+"."+rs(38,B64U), bare=False)
t("teams-webhook","Teams webhook","TEAMS_WEBHOOK_URL",f"https://contoso.webhook.office.com/webhookb2/{U()}@{U()}/IncomingWebhook/{rs(32,HEX)}/{U()}/V2{rs(43,B64U)}", core=lambda v: v.rsplit('/',1)[1])
t("teams-workflow-webhook","Teams workflow URL","TEAMS_WEBHOOK_URL",f"https://prod-{R.randint(10,99)}.westeurope.logic.azure.com:443/workflows/{rs(32,HEX)}/triggers/manual/paths/invoke?api-version=2016-06-01&sp=%2Ftriggers%2Fmanual%2Frun&sv=1.0&sig={rs(43,B64U)}", core=lambda v: v.rsplit('sig=',1)[1])
t("google-chat-webhook","Google Chat webhook","GCHAT_WEBHOOK",f"https://chat.googleapis.com/v1/spaces/AAAA{rs(7,B64U)}/messages?key=AIzaSyDdI0hCZtE6vySjMm-WEfRq3CPzqKqqsHI&token={rs(43,B64U)}%3D", core=lambda v: v.rsplit('token=',1)[1])
t("mattermost-webhook","Mattermost webhook","MATTERMOST_WEBHOOK",f"https://chat.example.org/hooks/{rs(26,LOWALNUM)}", core=lambda v: v.rsplit('/',1)[1])
t("zapier-webhook","Zapier hook","ZAPIER_HOOK",f"https://hooks.zapier.com/hooks/catch/{R.randint(10**6,10**7)}/{rs(6,LOWALNUM)}/", core=lambda v: v.split('/catch/')[1])
t("telegram","Telegram bot token","TELEGRAM_BOT_TOKEN",f"{R.randint(10**9,7*10**9)}:AA{rs(33,B64U)}")
t("stripe-sk","Stripe key","STRIPE_SECRET_KEY","sk_live_51"+rs(97,ALNUM))
t("stripe-rk","Stripe restricted key","STRIPE_KEY","rk_live_51"+rs(97,ALNUM))
t("stripe-whsec","Stripe webhook secret","STRIPE_WEBHOOK_SECRET","whsec_"+rs(32,ALNUM))
t("twilio-key","Twilio API key","TWILIO_API_KEY","SK"+rs(32,HEX), bare=False)
t("twilio-auth","Twilio auth token","TWILIO_AUTH_TOKEN",rs(32,HEX), bare=False)
t("sendgrid","SendGrid key","SENDGRID_API_KEY","SG."+rs(22,B64U)+"."+rs(43,B64U))
t("mailgun","Mailgun key","MAILGUN_API_KEY","key-"+rs(32,HEX))
t("mailgun-new","Mailgun key","MAILGUN_API_KEY",rs(32,HEX)+"-"+rs(8,HEX)+"-"+rs(8,HEX), bare=False)
t("mailchimp","Mailchimp key","MAILCHIMP_API_KEY",rs(32,HEX)+"-us21")
t("mandrill","Mandrill key","MANDRILL_API_KEY","md-"+rs(22,B64U))
t("postmark","Postmark token","POSTMARK_SERVER_TOKEN",U(), bare=False)
t("resend","Resend key","RESEND_API_KEY","re_"+rs(8,ALNUM)+"_"+rs(24,ALNUM))
t("brevo","Brevo key","BREVO_API_KEY","xkeysib-"+rs(64,HEX)+"-"+rs(16,ALNUM))
t("sparkpost","SparkPost key","SPARKPOST_API_KEY",rs(40,HEX), bare=False)
t("openai-proj","OpenAI key","OPENAI_API_KEY","sk-proj-"+rs(74,B64U)+"T3BlbkFJ"+rs(74,B64U))
t("openai-svc","OpenAI key","OPENAI_API_KEY","sk-svcacct-"+rs(74,B64U)+"T3BlbkFJ"+rs(74,B64U))
t("openai-legacy","OpenAI key","OPENAI_API_KEY","sk-"+rs(20)+"T3BlbkFJ"+rs(20))
t("anthropic","Anthropic key","ANTHROPIC_API_KEY","sk-ant-api03-"+rs(93,B64U)+"AA")
t("anthropic-oauth","Claude OAuth token","CLAUDE_CODE_OAUTH_TOKEN","sk-ant-oat01-"+rs(93,B64U)+"AA")
t("anthropic-admin","Anthropic admin key","ANTHROPIC_ADMIN_KEY","sk-ant-admin01-"+rs(93,B64U)+"AA")
t("huggingface","HF token","HF_TOKEN","hf_"+rs(34,ALNUM))
t("cohere","Cohere key","COHERE_API_KEY",rs(40,ALNUM), bare=False)
t("mistral","Mistral key","MISTRAL_API_KEY",rs(32,ALNUM), bare=False)
t("deepseek","DeepSeek key","DEEPSEEK_API_KEY","sk-"+rs(32,HEX))
t("groq","Groq key","GROQ_API_KEY","gsk_"+rs(52,ALNUM))
t("xai","xAI key","XAI_API_KEY","xai-"+rs(80,ALNUM))
t("perplexity","Perplexity key","PPLX_API_KEY","pplx-"+rs(48,ALNUM))
t("replicate","Replicate token","REPLICATE_API_TOKEN","r8_"+rs(37,ALNUM))
t("together","Together key","TOGETHER_API_KEY","tgp_v1_"+rs(43,B64U))
t("fireworks","Fireworks key","FIREWORKS_API_KEY","fw_"+rs(24,ALNUM))
t("pinecone","Pinecone key","PINECONE_API_KEY","pcsk_"+rs(5,ALNUM)+"_"+rs(64,ALNUM))
t("openrouter","OpenRouter key","OPENROUTER_API_KEY","sk-or-v1-"+rs(64,HEX))
t("langsmith","LangSmith key","LANGSMITH_API_KEY","lsv2_pt_"+rs(32,HEX)+"_"+rs(10,HEX))
t("nvidia","NVIDIA key","NVIDIA_API_KEY","nvapi-"+rs(64,B64U))
t("elevenlabs","ElevenLabs key","ELEVENLABS_API_KEY","sk_"+rs(48,HEX))
t("wandb","W&B key","WANDB_API_KEY",rs(40,HEX), bare=False)
t("assemblyai","AssemblyAI key","ASSEMBLYAI_API_KEY",rs(32,HEX), bare=False)
t("deepgram","Deepgram key","DEEPGRAM_API_KEY",rs(40,HEX), bare=False)
t("stability","Stability key","STABILITY_API_KEY","sk-"+rs(48,ALNUM))
t("runpod","RunPod key","RUNPOD_API_KEY","rpa_"+rs(40,string.ascii_uppercase+string.digits))
t("modal-secret","Modal token secret","MODAL_TOKEN_SECRET","as-"+rs(22,ALNUM), bare=False)
t("gemini-key","Gemini key","GEMINI_API_KEY","AIzaSy"+rs(33,B64U))
t("kaggle","Kaggle key","KAGGLE_KEY",rs(32,HEX), bare=False)
t("heroku","Heroku key","HEROKU_API_KEY","HRKU-AA"+rs(58,B64U))
t("heroku-legacy","Heroku key","HEROKU_API_KEY",U(), bare=False)
t("vercel","Vercel token","VERCEL_TOKEN","vcp_"+rs(56,ALNUM))
t("vercel-legacy","Vercel token","VERCEL_TOKEN",rs(24,ALNUM), bare=False)
t("netlify","Netlify token","NETLIFY_AUTH_TOKEN","nfp_"+rs(36,ALNUM))
t("render","Render key","RENDER_API_KEY","rnd_"+rs(28,ALNUM))
t("flyio","Fly token","FLY_API_TOKEN","fo1_"+rs(43,B64U))
t("supabase-sbp","Supabase token","SUPABASE_ACCESS_TOKEN","sbp_"+rs(40,HEX))
t("supabase-service-role","Supabase service role","SUPABASE_SERVICE_ROLE_KEY",jwt({"iss":"supabase","ref":rs(20,string.ascii_lowercase),"role":"service_role","iat":1700000000,"exp":2015576000}))
t("neon","Neon API key","NEON_API_KEY","napi_"+rs(64,LOWALNUM))
t("planetscale","PlanetScale password","DATABASE_PASSWORD","pscale_pw_"+rs(43,B64U))
t("databricks","Databricks token","DATABRICKS_TOKEN","dapi"+rs(32,HEX)+"-2")
t("fcm-server-key","FCM server key","FCM_SERVER_KEY","AAAA"+rs(7,B64U)+":APA91b"+rs(134,B64U))
t("datadog-api","Datadog API key","DD_API_KEY",rs(32,HEX), bare=False)
t("datadog-app","Datadog app key","DD_APP_KEY",rs(40,HEX), bare=False)
t("sentry-token","Sentry token","SENTRY_AUTH_TOKEN","sntrys_"+base64.b64encode(json.dumps({"iat":1716200000.1,"url":"https://sentry.io","region_url":"https://us.sentry.io","org":"acme"}).encode()).decode().rstrip("=")+"_"+rs(43,B64))
t("newrelic","New Relic key","NEW_RELIC_API_KEY","NRAK-"+rs(27,string.ascii_uppercase+string.digits))
t("newrelic-license","New Relic license","NEW_RELIC_LICENSE_KEY",rs(36,HEX)+"NRAL")
t("grafana-sa","Grafana token","GRAFANA_TOKEN","glsa_"+rs(32,ALNUM)+"_"+rs(8,HEX))
t("honeycomb","Honeycomb key","HONEYCOMB_API_KEY","hcaik_01"+rs(56,LOWALNUM))
t("pagerduty","PagerDuty token","PAGERDUTY_TOKEN","u+"+rs(18,B64U), bare=False)
t("launchdarkly","LaunchDarkly key","LAUNCHDARKLY_SDK_KEY","sdk-"+U())
t("launchdarkly-api","LaunchDarkly API key","LD_API_KEY","api-"+U())
t("dynatrace","Dynatrace token","DT_API_TOKEN","dt0c01."+rs(24,string.ascii_uppercase+string.digits)+"."+rs(64,string.ascii_uppercase+string.digits))
t("okta","Okta token","OKTA_API_TOKEN","00"+rs(40,B64U), bare=False)
t("auth0-secret","Auth0 client secret","AUTH0_CLIENT_SECRET",rs(64,B64U), bare=False)
t("shopify","Shopify token","SHOPIFY_ACCESS_TOKEN","shpat_"+rs(32,HEX))
t("square","Square token","SQUARE_ACCESS_TOKEN","EAAA"+rs(60,B64U))
t("paypal-secret","PayPal secret","PAYPAL_CLIENT_SECRET","E"+rs(79,B64U), bare=False)
t("razorpay","Razorpay secret","RAZORPAY_KEY_SECRET",rs(24,ALNUM), bare=False)
t("paystack","Paystack key","PAYSTACK_SECRET_KEY","sk_live_"+rs(40,HEX))
t("mollie","Mollie key","MOLLIE_API_KEY","live_"+rs(30,ALNUM))
t("plaid","Plaid secret","PLAID_SECRET",rs(30,HEX), bare=False)
t("plaid-access","Plaid access token","PLAID_ACCESS_TOKEN","access-production-"+U())
t("adyen","Adyen key","ADYEN_API_KEY","AQE"+rs(2,ALNUM)+"hmfxK"+rs(90,B64)+"==-"+rs(43,B64)+"=-"+rs(16,ALNUM))
t("coinbase","Coinbase secret","COINBASE_API_SECRET",rs(64,B64U), bare=False)
t("algolia","Algolia admin key","ALGOLIA_ADMIN_KEY",rs(32,HEX), bare=False)
t("mapbox","Mapbox secret token","MAPBOX_SECRET_TOKEN","sk.eyJ1Ijoi"+rs(40,B64U)+"."+rs(22,B64U))
t("twitter-bearer","Twitter bearer","TWITTER_BEARER_TOKEN","A"*22+rs(20,ALNUM)+"%2B"+rs(20,ALNUM)+"%3D"+rs(50,ALNUM))
t("facebook","Facebook token","FB_ACCESS_TOKEN","EAAG"+rs(180,ALNUM))
t("dropbox","Dropbox token","DROPBOX_TOKEN","sl.u."+rs(136,B64U))
t("figma","Figma token","FIGMA_TOKEN","figd_"+rs(40,B64U))
t("clickup","ClickUp token","CLICKUP_API_KEY",f"pk_{R.randint(10**7,10**8)}_{rs(32,string.ascii_uppercase+string.digits)}")
t("trello-token","Trello token","TRELLO_TOKEN","ATTA"+rs(64,HEX)+rs(8,HEX.upper()))
t("hubspot-pat","HubSpot token","HUBSPOT_ACCESS_TOKEN","pat-na1-"+U())
t("notion","Notion token","NOTION_TOKEN","ntn_"+rs(11,string.digits)+rs(35,ALNUM))
t("airtable","Airtable PAT","AIRTABLE_TOKEN","pat"+rs(14,ALNUM)+"."+rs(64,HEX))
t("linear","Linear key","LINEAR_API_KEY","lin_api_"+rs(40,ALNUM))
t("asana","Asana PAT","ASANA_TOKEN","2/"+str(R.randint(10**15,10**16))+"/"+str(R.randint(10**15,10**16))+":"+rs(32,HEX))
t("postman","Postman key","POSTMAN_API_KEY","PMAK-"+rs(24,HEX)+"-"+rs(34,HEX))
t("typeform","Typeform token","TYPEFORM_TOKEN","tfp_"+rs(44,B64U)+"_"+rs(14,B64U))
t("contentful","Contentful PAT","CONTENTFUL_TOKEN","CFPAT-"+rs(43,B64U))
t("sanity","Sanity token","SANITY_API_TOKEN","sk"+rs(180,ALNUM), bare=False)
t("salesforce-session","Salesforce session id","SF_ACCESS_TOKEN","00D"+rs(12,ALNUM)+"!"+rs(96,B64U.replace('-','')+"."))
t("zendesk","Zendesk token","ZENDESK_API_TOKEN",rs(40,ALNUM), bare=False)
t("intercom","Intercom token","INTERCOM_TOKEN","dG9rOj"+rs(54,B64)+"=")
t("segment","Segment write key","SEGMENT_WRITE_KEY",rs(32,ALNUM), bare=False)
t("pusher-secret","Pusher secret","PUSHER_APP_SECRET",rs(20,HEX), bare=False)
t("ably","Ably key","ABLY_API_KEY",rs(6,B64U)+"."+rs(6,B64U)+":"+rs(43,B64U), bare=False)
t("cloudinary-url","Cloudinary URL","CLOUDINARY_URL",f"cloudinary://{R.randint(10**14,10**15)}:{rs(27,B64U)}@dx{rs(6,LOWALNUM)}", core=lambda v: v.split(':')[2].split('@')[0])
t("age","age key","AGE_SECRET_KEY",age_key())
t("eth-privkey","ETH private key","PRIVATE_KEY","0x"+rs(64,HEX), bare=False)
t("xprv","BIP32 xprv","XPRV","xprv9s21ZrQH143K"+rs(95,"123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"))
t("btc-wif","Bitcoin WIF","BTC_PRIVKEY","K"+rs(51,"123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"), bare=False)
t("django-secret","Django SECRET_KEY","SECRET_KEY","django-insecure-"+rs(50,string.ascii_lowercase+string.digits+"!@#$%^&*(-_=+)"))
t("laravel-appkey","Laravel APP_KEY","APP_KEY","base64:"+base64.b64encode(R.randbytes(32)).decode(), bare=False)
t("rails-skb","Rails secret_key_base","SECRET_KEY_BASE",rs(128,HEX), bare=False)
t("jwt","JWT","ACCESS_TOKEN",jwt())
t("jwt-rs256","JWT","ID_TOKEN",b64url(b'{"alg":"RS256","kid":"a1b2c3","typ":"JWT"}')+"."+b64url(json.dumps({"iss":"https://accounts.google.com","sub":"1098","email":"jane@example.com","exp":1716300000}).encode())+"."+b64url(R.randbytes(256)))
t("wireguard","WireGuard private key","WG_PRIVATE_KEY",base64.b64encode(R.randbytes(32)).decode(), bare=False)
t("sidekiq","Sidekiq Enterprise creds","BUNDLE_ENTERPRISE__CONTRIBSYS__COM",rs(8,HEX)+":"+rs(8,HEX), bare=False, core=lambda v: v)
t("maxmind","MaxMind license","MAXMIND_LICENSE_KEY",rs(6,ALNUM)+"_"+rs(29,ALNUM)+"_mmk")
t("clickhouse","ClickHouse key","CLICKHOUSE_KEY_SECRET","4b1d"+rs(38,ALNUM))
t("settlemint","SettleMint PAT","SETTLEMINT_TOKEN","sm_pat_"+rs(16,ALNUM))
t("frameio","Frame.io token","FRAMEIO_TOKEN","fio-u-"+rs(64,B64U))
t("shippo","Shippo token","SHIPPO_TOKEN","shippo_live_"+rs(40,HEX))
t("flutterwave","Flutterwave key","FLW_SECRET_KEY","FLWSECK-"+rs(32,HEX)+"-X")
t("easypost","EasyPost key","EASYPOST_API_KEY","EZAK"+rs(54,ALNUM))
t("lob","Lob key","LOB_API_KEY","live_"+rs(35,HEX))
t("gocardless","GoCardless token","GOCARDLESS_TOKEN","live_"+rs(40,B64U))
t("beamer","Beamer key","BEAMER_API_KEY","b_"+rs(44,B64U))
t("dnkey","Defined Networking key","DN_API_KEY","dnkey-"+rs(26,string.ascii_uppercase+string.digits)+"-"+rs(52,string.ascii_uppercase+string.digits))
t("yandex-iam","Yandex IAM token","YC_TOKEN","t1."+rs(80,B64U)+"."+rs(86,B64U))
t("okta-ssws","Okta SSWS","OKTA_TOKEN","00"+rs(40,B64U), bare=False)
t("expo","Expo token","EXPO_TOKEN",rs(40,B64U), bare=False)
t("convex-deploy","Convex deploy key","CONVEX_DEPLOY_KEY","prod:"+rs(8,string.ascii_lowercase)+"-"+rs(8,string.ascii_lowercase)+"-123|eyJ2MiI6I"+rs(80,B64U)+"=", core=lambda v: v.split('|')[1])
t("upstash-redis","Upstash token","UPSTASH_REDIS_REST_TOKEN","A"+rs(3,ALNUM)+"ASQgN"+rs(60,B64U)+"=", bare=False)
t("turso","Turso token","TURSO_AUTH_TOKEN",jwt({"a":"rw","iat":1716000000,"id":U()}))
t("github-oauth-client-secret","GitHub OAuth client secret","GITHUB_CLIENT_SECRET",rs(40,HEX), bare=False)
t("firebase-token","Firebase CI token","FIREBASE_TOKEN","1//0"+rs(99,B64U))
t("fastly","Fastly token","FASTLY_API_TOKEN",rs(32,B64U), bare=False)
t("mongodb-atlas-private","Atlas private key","MONGODB_ATLAS_PRIVATE_KEY",U(), bare=False)
t("ibm-cloud","IBM Cloud API key","IBMCLOUD_API_KEY",rs(44,B64U), bare=False)
t("rapidapi","RapidAPI key","X_RAPIDAPI_KEY",rs(50,B64U), bare=False)
t("discord-client-secret","Discord client secret","DISCORD_CLIENT_SECRET",rs(32,B64U), bare=False)
t("twitch","Twitch secret","TWITCH_CLIENT_SECRET",rs(30,LOWALNUM), bare=False)
t("spotify","Spotify client secret","SPOTIFY_CLIENT_SECRET",rs(32,HEX), bare=False)
t("mux","Mux secret","MUX_TOKEN_SECRET",rs(75,B64), bare=False)

def ctxs(fam,label,env,V,bare):
    el = env.lower()
    out = []
    kv = [
     ("env", f"{env}={V}"),
     ("export", f'export {env}="{V}"'),
     ("yaml", f"{el}: {V}"),
     ("yaml-nested", f"services:\n  api:\n    environment:\n      {env}: \"{V}\"\n"),
     ("compose-list", f"    environment:\n      - {env}={V}\n      - DEBUG=false\n"),
     ("json", json.dumps({el: V})),
     ("toml", f'[credentials]\n{el} = "{V}"'),
     ("prose-label", f"My {label} is {V} — keep it private."),
     ("prose-label-colon", f"{label}: {V}"),
     ("md-table-label", f"| Service | Value |\n|---|---|\n| {label} | `{V}` |"),
     ("code-py", f'os.environ["{env}"] = "{V}"'),
     ("code-js", f"const {el.replace('_','')} = '{V}';"),
     ("crlf", f"{env}={V}\r\nPORT=8080\r\n"),
     ("json-escaped", json.dumps({"content": f"# notes\n{env}={V}\nmore\n"})),
     ("docker-run", f"docker run -e {env}={V} myimage:latest"),
     ("gh-secret", f"gh secret set {env} --body \"{V}\""),
     ("k8s-stringdata", f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: app\nstringData:\n  {env}: {V}\n"),
     ("k8s-data-b64", f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: app\ndata:\n  {env}: {base64.b64encode(V.encode()).decode()}\n"),
     ("dotnet-json", json.dumps({"Api": {"Key": V}}, indent=2)),
     ("ini-lower", f"[default]\n{el.split('_')[-2] if el.count('_')>=1 else el}_{el.split('_')[-1]} = {V}\n"),
    ]
    for c,x in kv:
        out.append((c, x, [base64.b64encode(V.encode()).decode()] if c=="k8s-data-b64" else [CORE.get(fam,V)]))
    if bare:
        bb = [
         ("alone", V),
         ("prose-nokey", f"Use {V} for the staging deploy."),
         ("prose-sentence-end", f"The one that works is {V}."),
         ("md-table-nokey", f"| env | value |\n|---|---|\n| prod | {V} |"),
         ("backticks", f"Run with `{V}` set."),
         ("parens", f"(token: {V})"),
         ("quoted-single", f"'{V}'"),
         ("path", f"/home/dev/.cache/tokens/{V}.json"),
         ("filename-underscore", f"backup_{V}.txt"),
         ("after-dash", f"token-{V}"),
         ("after-underscore", f"key_{V}"),
         ("after-eq-nospace", f"--token={V}"),
         ("line-start", f"{V} <- new one\nold one revoked"),
         ("line-end", f"rotated today, new value below\n{V}"),
         ("url-query", f"https://api.example.com/v1/items?access_token={urllib.parse.quote(V, safe='')}&page=2"),
         ("url-encoded-json", "data=" + urllib.parse.quote(json.dumps({"k": V}))),
         ("bearer", f"Authorization: Bearer {V}"),
         ("curl-header", f'curl -sS -H "Authorization: Bearer {V}" https://api.example.com/me'),
         ("html-attr", f'<meta name="x" content="{V}">'),
         ("log", f"2024-05-01T12:00:00Z INFO request cred={V} status=200"),
         ("python-list", f"KEYS = ['{V}', 'other']"),
         ("angle", f"<{V}>"),
         ("tab-sep", f"prod\t{V}\tactive"),
         ("csv", f"name,value,owner\nprod,{V},ops"),
         ("heredoc", f"cat > .env <<EOF\n{V}\nEOF"),
         ("uppercase-context", f"NEW KEY:{V}"),
         ("nbsp", f"key:\u00a0{V}"),
         ("fullwidth-colon", f"密钥：{V}"),
         ("md-link", f"[link](https://x.example/?k={V})"),
         ("git-commit-msg", f"fix: rotate creds ({V})"),
        ]
        out += [(c,x,[CORE.get(fam,V) if c not in ('url-query','url-encoded-json') else (urllib.parse.quote(CORE.get(fam,V),safe='') if c=='url-query' else urllib.parse.quote(CORE.get(fam,V)))]) for c,x in bb]
    return out
for fam,label,env,V,bare in T:
    for c,x,s in ctxs(fam,label,env,V,bare):
        add(fam,c,x,s)
# split across lines (known miss category) for a few
for fam,label,env,V,bare in T[:200:20]:
    add(fam,"split-lines",f"{env}={V[:len(V)//2]}\n{V[len(V)//2:]}",[V],note="known: split across lines")
import contextual
contextual.build(add, benign); contextual.build_probes(add, benign)
