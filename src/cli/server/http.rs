//! The routes of `memvault server`, the bearer-token check in front of
//! them, and the limits every request meets.
//!
//! The tenant comes from the token and from nothing else: no path, query,
//! header or body field names a tenant. A token is looked up by its id and
//! its keyed hash compared in constant time; a bad token and a missing one
//! both get 401 (no difference says whether a tenant or token exists).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::pool::{NOT_DURABLE, Open, Pool, PoolError, Ran, Slot};
use super::registry::{Registry, Root, Scope, Stamp, stamp_of, token_id};
use crate::cli::{CliError, On, audit, expiry, history, new_session_id, redacted_label};
use crate::memory::ToolResult;
use crate::protocol::{self, ParseError, Reply, duplicate_key_message, parse_strict};
use crate::vault::{Attribution, Vault};

/// A token's lookup entry.
#[derive(Clone)]
struct TokenEntry {
    tenant: String,
    name: String,
    scopes: Vec<Scope>,
    hash: Vec<u8>,
}

/// The registry as the server last read it.
struct Loaded {
    reg: Arc<Registry>,
    stamp: Option<Stamp>,
    tokens: HashMap<String, TokenEntry>,
}

impl Loaded {
    fn new(reg: Registry, stamp: Option<Stamp>) -> Loaded {
        let mut tokens = HashMap::new();
        for (tid, t) in &reg.tenants {
            for (id, tok) in &t.tokens {
                if let Ok(hash) = data_encoding::HEXLOWER.decode(tok.hash.as_bytes()) {
                    tokens.insert(
                        id.clone(),
                        TokenEntry {
                            tenant: tid.clone(),
                            name: tok.name.clone(),
                            scopes: tok.scopes.clone(),
                            hash,
                        },
                    );
                }
            }
        }
        Loaded {
            reg: Arc::new(reg),
            stamp,
            tokens,
        }
    }
}

/// Limits and settings of the routes.
pub struct Limits {
    pub max_body: usize,
    /// What all requests together may hold of their bodies at once.
    pub max_bodies: usize,
    /// The largest answer of an audit route, in bytes (admin routes'
    /// answers are not capped).
    pub max_answer: usize,
    /// Requests a second per tenant (0: no limit).
    pub rate: u32,
    pub body_timeout: Duration,
}

/// What every request shares.
pub struct App {
    pub root: Root,
    loaded: RwLock<Loaded>,
    /// The registry could not be read (damage, or a generation older than
    /// one read before): every request is refused until it can.
    broken: AtomicBool,
    pub pool: Arc<Pool>,
    pub limits: Limits,
    /// The request body bytes all requests together may hold at once
    /// (see [`read_body`]).
    body_budget: Arc<tokio::sync::Semaphore>,
    /// When a broken registry was last tried.
    last_try: Mutex<Option<std::time::Instant>>,
    pub stopping: AtomicBool,
    /// The session of a token's requests that name none: one per token
    /// per server run.
    sessions: Mutex<HashMap<String, String>>,
    /// With `--sync`: how the last round of tenant syncs went (`/healthz`).
    sync_round: Mutex<Option<SyncRound>>,
}

/// One finished round of `server --sync`: counts only (`/healthz` answers
/// anyone: no tenant is named).
#[derive(Clone, Copy)]
struct SyncRound {
    finished_ms: u64,
    synced: usize,
    /// None: the registry could not be read, no vault was tried.
    failed: Option<usize>,
    /// Left for the next round: another process held them locked.
    busy: usize,
}

/// Who a request is, once its token checked out.
#[derive(Clone, Debug)]
pub struct Authed {
    pub tenant: String,
    /// The token's name: the principal of every change it makes.
    pub principal: String,
    token: String,
}

/// A `tools/call` the gate screened out (see `mcpwire`): the tool error
/// it is answered with.
#[derive(Clone, Debug)]
pub struct Refusal(pub String);

/// An error outside the memory tool: plain JSON with an HTTP status.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    /// A 405's `Allow` header: the methods the route takes.
    allow: Option<&'static str>,
    /// A 429 over the rate (the bucket refills within a second), not over
    /// the quota (which waiting does not change): `Retry-After: 1`.
    retry_soon: bool,
    /// Answered before the request's body was read whole: the connection
    /// closes after it (`Connection: close`, so the client knows).
    closing: bool,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            allow: None,
            retry_soon: false,
            closing: false,
        }
    }

    /// A 429 for a tenant over its request rate.
    fn over_rate(message: String) -> ApiError {
        ApiError {
            retry_soon: true,
            ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, message)
        }
    }

    /// A 405 for a route that takes `allow` (e.g. "GET, POST").
    fn method_not_allowed(allow: &'static str) -> ApiError {
        ApiError {
            allow: Some(allow),
            ..ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("this route takes {allow} only"),
            )
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            json!({"error": self.message}).to_string(),
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"memvault\""),
            );
        }
        if self.retry_soon {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if let Some(allow) = self.allow {
            resp.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        if self.closing {
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

/// `early`'s value with the body, still unread; or its error, answered
/// after the body is drained (see [`before_body`]).
async fn admitted<T>(
    app: &App,
    headers: &HeaderMap,
    body: Body,
    early: Result<T, ApiError>,
) -> Result<(T, Body), ApiError> {
    match early {
        Ok(v) => Ok((v, body)),
        Err(e) => Err(before_body(app, headers, body, e).await),
    }
}

/// `e`, answered before the request's body was read: the body is read
/// and dropped first (up to the body limit, within the body timeout), so
/// the connection stays open for the client's next request (hyper closes
/// a connection whose request body was left unread, without a word, and a
/// client that reuses it finds it gone). A body that is larger, or does
/// not arrive in time, is left, and the answer says `Connection: close`.
async fn before_body(app: &App, headers: &HeaderMap, body: Body, mut e: ApiError) -> ApiError {
    let max = app.limits.max_body as u64;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .map(|v| v.to_str().ok().and_then(|s| s.parse::<u64>().ok()));
    // A client that waits for `100 Continue` before it sends its body is
    // not asked for it (reading the body would send that 100): the
    // answer comes at once, and the connection closes.
    let waits = headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let drained = match declared {
        _ if waits => false,
        Some(Some(0)) => true,
        Some(Some(n)) if n > max => false,
        Some(None) => false,
        _ => {
            let drain = async {
                let mut body = body;
                let mut seen = 0u64;
                while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
                    let Ok(frame) = frame else { return false };
                    if let Ok(data) = frame.into_data() {
                        seen += data.len() as u64;
                        if seen > max {
                            return false;
                        }
                    }
                }
                true
            };
            tokio::time::timeout(app.limits.body_timeout, drain)
                .await
                .unwrap_or(false)
        }
    };
    e.closing = !drained;
    e
}

fn json_response(status: StatusCode, value: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

fn unauthorized() -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "a valid bearer token is required: send `Authorization: Bearer TOKEN` with a token from `memvault tenant add` or `memvault tenant token`",
    )
}

impl App {
    pub fn new(root: Root, pool: Pool, limits: Limits) -> Result<App, CliError> {
        let stamp = stamp_of(&root.registry_path());
        let reg = root.load()?;
        Ok(App {
            root,
            loaded: RwLock::new(Loaded::new(reg, stamp)),
            broken: AtomicBool::new(false),
            pool: Arc::new(pool),
            last_try: Mutex::new(None),
            body_budget: Arc::new(tokio::sync::Semaphore::new(
                limits.max_bodies.min(tokio::sync::Semaphore::MAX_PERMITS),
            )),
            limits,
            stopping: AtomicBool::new(false),
            sessions: Mutex::new(HashMap::new()),
            sync_round: Mutex::new(None),
        })
    }

    /// How many tenants the registry holds.
    pub fn tenant_count(&self) -> usize {
        self.loaded
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .reg
            .tenants
            .len()
    }

    /// Read the registry again if its file changed (a `tenant` command
    /// ran); with `force`, whatever its file's stamp says (the sweeper,
    /// every few seconds: a change the stamp missed is seen by the
    /// generation). While it cannot be read, tried at most once a second.
    pub fn refresh(&self, force: bool) {
        let stamp = stamp_of(&self.root.registry_path());
        let current = self.loaded.read().unwrap_or_else(|p| p.into_inner()).stamp;
        let broken = self.broken.load(Ordering::SeqCst);
        if stamp == current && !broken && !force {
            return;
        }
        if broken {
            let mut last = self.last_try.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
                return;
            }
            *last = Some(std::time::Instant::now());
        }
        let mut loaded = self.loaded.write().unwrap_or_else(|p| p.into_inner());
        if loaded.stamp == stamp && !self.broken.load(Ordering::SeqCst) && !force {
            return;
        }
        match self.root.load() {
            Ok(reg)
                if reg.generation > loaded.reg.generation
                    || (reg.generation == loaded.reg.generation
                        && self.broken.load(Ordering::SeqCst)) =>
            {
                let gone: Vec<String> = loaded
                    .reg
                    .tenants
                    .keys()
                    .filter(|id| !reg.tenants.contains_key(*id))
                    .cloned()
                    .collect();
                *loaded = Loaded::new(reg, stamp);
                if self.broken.swap(false, Ordering::SeqCst) {
                    eprintln!("memvault: the tenant registry reads again; serving requests");
                }
                drop(loaded);
                // Closing a vault checkpoints it: not on a runtime worker.
                let pool = self.pool.clone();
                let forget = move || {
                    for id in gone {
                        pool.forget(&id);
                    }
                };
                match tokio::runtime::Handle::try_current() {
                    Ok(rt) => drop(rt.spawn_blocking(forget)),
                    Err(_) => forget(),
                }
            }
            Ok(reg) if reg.generation == loaded.reg.generation => {
                loaded.stamp = stamp;
            }
            Ok(_) => {
                if !self.broken.swap(true, Ordering::SeqCst) {
                    eprintln!(
                        "memvault: the tenant registry was replaced by an older one; refusing every request until it is put right"
                    );
                }
            }
            Err(_) => {
                // Fixed words: the error's text can name a path.
                if !self.broken.swap(true, Ordering::SeqCst) {
                    eprintln!(
                        "memvault: the tenant registry cannot be read or does not authenticate; refusing every request until it reads and authenticates again (tried each second)"
                    );
                }
            }
        }
    }

    /// Whether tenant `id` is in the registry.
    pub fn has_tenant(&self, id: &str) -> bool {
        self.loaded
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .reg
            .tenants
            .contains_key(id)
    }

    /// Check the request's bearer token and that it has `scope`.
    /// A round of `server --sync` finished: `synced` vaults synced,
    /// `failed` failed (None: none could be tried), `busy` left for the
    /// next round (locked by another process).
    pub fn note_sync_round(&self, synced: usize, failed: Option<usize>, busy: usize) {
        *self.sync_round.lock().unwrap_or_else(|p| p.into_inner()) = Some(SyncRound {
            finished_ms: crate::vault::now_ms(),
            synced,
            failed,
            busy,
        });
    }

    /// The caller of a new request: refused while shutting down (a request
    /// admitted before finishes; see [`App::still_authorized`]).
    pub fn authenticate(&self, headers: &HeaderMap, scope: Scope) -> Result<Authed, ApiError> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server is shutting down",
            ));
        }
        self.identify(headers, scope)
    }

    /// The token's tenant and scope check, shutting down or not.
    fn identify(&self, headers: &HeaderMap, scope: Scope) -> Result<Authed, ApiError> {
        let mut values = headers.get_all(header::AUTHORIZATION).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return Err(unauthorized());
        };
        let value = value.to_str().map_err(|_| unauthorized())?;
        let (scheme, token) = value.split_once(' ').ok_or_else(unauthorized)?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(unauthorized());
        }
        let id = token_id(token).ok_or_else(unauthorized)?;
        self.refresh(false);
        if self.broken.load(Ordering::SeqCst) {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server's tenant registry cannot be read; the operator must repair it",
            ));
        }
        let entry = self
            .loaded
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .tokens
            .get(id)
            .cloned();
        // A token id that is not there costs the same hash as one that is.
        let hash = entry.as_ref().map_or(&[0u8; 32][..], |e| &e.hash[..]);
        let matches = self.root.keys().token_matches(token.as_bytes(), hash);
        let entry = match entry {
            Some(e) if matches => e,
            _ => return Err(unauthorized()),
        };
        let allowed = entry.scopes.contains(&scope)
            || (scope == Scope::Audit && entry.scopes.contains(&Scope::Admin));
        if !allowed {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!("this token does not have the `{}` scope", scope.name()),
            ));
        }
        Ok(Authed {
            tenant: entry.tenant,
            principal: entry.name,
            token: id.to_owned(),
        })
    }

    /// `who`, checked again once its request's body has arrived: a token
    /// revoked or rotated (or its tenant removed) while the body was on
    /// its way no longer acts, as one presented after the change does not.
    pub fn still_authorized(
        &self,
        headers: &HeaderMap,
        scope: Scope,
        who: &Authed,
    ) -> Result<(), ApiError> {
        // Not refused for a shutdown begun since it was admitted: a
        // request in flight (its body still arriving) finishes.
        let now = self.identify(headers, scope)?;
        if now.tenant != who.tenant || now.token != who.token || !self.has_tenant(&who.tenant) {
            return Err(unauthorized());
        }
        Ok(())
    }

    /// Whether `who`'s token is still in the registry for its tenant, as
    /// the registry reads now (no second hash: its id was matched).
    pub fn token_live(&self, who: &Authed) -> bool {
        self.refresh(false);
        let live = self
            .loaded
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .tokens
            .get(&who.token)
            .is_some_and(|e| e.tenant == who.tenant);
        live && !self.broken.load(Ordering::SeqCst) && self.has_tenant(&who.tenant)
    }

    /// The slot of an authenticated tenant, after its rate check.
    pub fn slot(&self, who: &Authed) -> Result<Arc<Slot>, ApiError> {
        let (key, quota) = {
            let loaded = self.loaded.read().unwrap_or_else(|p| p.into_inner());
            loaded
                .reg
                .tenants
                .get(&who.tenant)
                .map(|t| (t.key.clone(), t.quota))
                .ok_or_else(unauthorized)?
        };
        let slot = self.pool.slot(
            &who.tenant,
            self.root.tenant_dir(&who.tenant),
            &key,
            self.limits.rate,
        );
        // As the registry says now: a quota changed under a running server
        // holds from its next request.
        slot.set_quota(quota);
        // Removed meanwhile (the refresh that saw it go may have forgotten
        // its slot just before this one was made): refused.
        if !self.has_tenant(&who.tenant) {
            self.pool.forget(&who.tenant);
            return Err(unauthorized());
        }
        if !slot.admit(self.limits.rate) {
            return Err(ApiError::over_rate(format!(
                "over this tenant's rate of {} request{} a second; retry shortly",
                self.limits.rate,
                if self.limits.rate == 1 { "" } else { "s" }
            )));
        }
        Ok(slot)
    }

    /// The session and actor labels of a request: its `Memvault-Session`
    /// and `Memvault-Actor` headers, else the token's session of this run
    /// and `actor` (`agent` for the memory tool, `operator` for the admin
    /// routes, as the command line's `revert`, `restore`, `expire` and
    /// `purge` say).
    /// A caller of the memory tool (`/v1/memory`, `/mcp`): its token with
    /// the `memory` scope, its attribution, and its tenant's vault slot.
    fn tool_caller(
        &self,
        headers: &HeaderMap,
    ) -> Result<(Authed, Attribution, Arc<Slot>), ApiError> {
        let who = self.authenticate(headers, Scope::Memory)?;
        let attribution = self.attribution(headers, &who, "agent")?;
        let slot = self.slot(&who)?;
        Ok((who, attribution, slot))
    }

    pub fn attribution(
        &self,
        headers: &HeaderMap,
        who: &Authed,
        actor: &str,
    ) -> Result<Attribution, ApiError> {
        let label = |name: &str| -> Result<Option<String>, ApiError> {
            let mut values = headers.get_all(name).iter();
            let Some(v) = values.next() else {
                return Ok(None);
            };
            let bad = || {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "the {name} header is given once, as 1 to 128 printable ASCII characters with no space at either end and no two spaces in a row"
                    ),
                )
            };
            if values.next().is_some() {
                return Err(bad());
            }
            let s = v.to_str().map_err(|_| bad())?;
            if s.is_empty() || !crate::memory::path::is_new_label(s) {
                return Err(bad());
            }
            // Redacted without a warning: a client must not be able to
            // fill the server's log, one line per request.
            let (red, _) = redacted_label(s)
                .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.message))?;
            Ok(Some(red))
        };
        let session = match label("memvault-session")? {
            Some(s) => s,
            // An admin route's change is one operator action, as on the
            // command line: a session of its own (sharing the token's
            // session would bundle every purge, expiry and revert of a
            // server run into one, and `revert --session` would undo them
            // all).
            None if actor == "operator" => new_session_id(),
            None => self
                .sessions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(who.token.clone())
                .or_insert_with(new_session_id)
                .clone(),
        };
        let actor = label("memvault-actor")?.unwrap_or_else(|| actor.into());
        if crate::memory::path::is_reserved_label(Some(&session), &actor) {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                crate::cli::RESERVED_RULE,
            ));
        }
        Ok(Attribution { session, actor })
    }
}

/// A memory request with a body up to this runs on the connection's
/// thread when its vault is free (larger ones: a blocking thread).
pub const INLINE_BODY: usize = 16 << 10;

/// A body over the limit is still read (and dropped) up to this size, so
/// that a client that sends it whole before reading the answer (as the
/// SDK adapters do) gets the 413, not a connection closed under it.
const DRAIN_MAX: u64 = 64 << 20;

/// Read a request body of at most `max` bytes within the body timeout.
/// A request's body, and its share of the server's body budget
/// (`--max-bodies`, given back when the request is done with it): past the
/// budget a request is answered 503 at once rather than held, so that a
/// tenant sending many large bodies slowly does not grow the server's
/// memory without bound (60 bodies of 4 MiB held 288 MiB; a thousand
/// connections could have held 4 GiB).
pub struct HeldBody {
    pub bytes: Bytes,
    _held: Option<tokio::sync::OwnedSemaphorePermit>,
    /// The tenant's count of held body bytes, and this body's part in it.
    tenant: (Arc<Slot>, usize),
}

impl Drop for HeldBody {
    fn drop(&mut self) {
        self.tenant
            .0
            .body_bytes
            .fetch_sub(self.tenant.1, Ordering::SeqCst);
    }
}

impl std::ops::Deref for HeldBody {
    type Target = Bytes;
    fn deref(&self) -> &Bytes {
        &self.bytes
    }
}

impl std::ops::DerefMut for HeldBody {
    fn deref_mut(&mut self) -> &mut Bytes {
        &mut self.bytes
    }
}

pub async fn read_body(
    app: &App,
    headers: &HeaderMap,
    body: Body,
    slot: &Arc<Slot>,
) -> Result<HeldBody, ApiError> {
    let max = app.limits.max_body;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than this server's limit of {max} bytes"),
        )
    };
    let declared = match headers.get(header::CONTENT_LENGTH) {
        None => None,
        Some(len) => match len.to_str().ok().and_then(|s| s.parse::<u64>().ok()) {
            // Past what is drained, or unreadable: answered at once (the
            // connection then closes).
            Some(n) if n <= DRAIN_MAX.max(max as u64) => Some(n),
            _ => return Err(too_large()),
        },
    };
    let over = declared.is_some_and(|n| n > max as u64);
    let busy = || ApiError {
        retry_soon: true,
        closing: true,
        ..ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server holds as many request bodies as it takes at once; try again in a moment",
        )
    };
    // One tenant holds at most a quarter of the budget, so that its
    // clients alone cannot leave the others none.
    let tenant_share = app.limits.max_bodies / 4;
    let read = async {
        let mut body = body;
        // As declared, when it is: no spare capacity held beyond it.
        let mut kept = Vec::with_capacity(declared.filter(|_| !over).unwrap_or(0) as usize);
        let mut held: Option<tokio::sync::OwnedSemaphorePermit> = None;
        // Counted in the tenant's share as it is kept; given back on drop.
        let mut counted = HeldBody {
            bytes: Bytes::new(),
            _held: None,
            tenant: (slot.clone(), 0),
        };
        let mut seen = 0u64;
        while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
            let Ok(frame) = frame else {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "the request body could not be read",
                ));
            };
            if let Ok(data) = frame.into_data() {
                seen += data.len() as u64;
                if seen > DRAIN_MAX.max(max as u64) {
                    return Err(too_large());
                }
                if !over && seen <= max as u64 {
                    // Never waited for: requests each holding part of the
                    // budget and waiting for more would wait on each other.
                    let share = u32::try_from(data.len()).map_err(|_| too_large())?;
                    let before = slot.body_bytes.fetch_add(data.len(), Ordering::SeqCst);
                    counted.tenant.1 += data.len();
                    if before + data.len() > tenant_share {
                        return Err(busy());
                    }
                    let permit = app
                        .body_budget
                        .clone()
                        .try_acquire_many_owned(share)
                        .map_err(|_| busy())?;
                    match &mut held {
                        Some(h) => h.merge(permit),
                        None => held = Some(permit),
                    }
                    kept.extend_from_slice(&data);
                }
            }
        }
        if over || seen > max as u64 {
            Err(too_large())
        } else {
            // A body of no declared length grew by doubling.
            kept.shrink_to_fit();
            counted.bytes = Bytes::from(kept);
            counted._held = held;
            Ok(counted)
        }
    };
    match tokio::time::timeout(app.limits.body_timeout, read).await {
        // The rest of the body is left: the connection closes after this.
        Err(_) => Err(ApiError {
            closing: true,
            ..ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "the request body did not arrive in time",
            )
        }),
        Ok(result) => result,
    }
}

/// The body of `/v1/memory`: one JSON object (a `tool_use` block or a
/// command object), each key once. Anything else is malformed: 400.
fn parse_body(bytes: &[u8]) -> Result<Value, ApiError> {
    const SEND: &str = "send one JSON object: a tool_use block or a command object such as {\"command\":\"view\",\"path\":\"/memories\"}";
    let v = parse_json(bytes, SEND)?;
    if !v.is_object() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the request body is not a JSON object; {SEND}"),
        ));
    }
    Ok(v)
}

/// The body of an audit or admin route: the subcommand's options.
fn parse_options(bytes: &[u8]) -> Result<Value, ApiError> {
    parse_json(
        bytes,
        "send one JSON object of the subcommand's options, such as {\"limit\":20}, or no body",
    )
}

/// A 400 for a body that gives `key` twice (the tool's own sentence,
/// without its "Error: ").
fn duplicate_key(key: &str) -> ApiError {
    let m = duplicate_key_message(key);
    let m = m.strip_prefix("Error: ").unwrap_or(&m);
    ApiError::new(StatusCode::BAD_REQUEST, m.to_string())
}

/// Strict JSON (a key given twice is refused), or a 400 that ends with
/// `send`, what the route takes.
fn parse_json(bytes: &[u8], send: &str) -> Result<Value, ApiError> {
    match parse_strict(bytes) {
        Ok(v) => Ok(v),
        Err(ParseError::DuplicateKey(key)) => Err(duplicate_key(&key)),
        Err(ParseError::Syntax(e)) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the request body is not valid JSON ({e}); {send}"),
        )),
    }
}

fn no_query(uri: &axum::http::Uri) -> Result<(), ApiError> {
    if uri.query().is_some() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "this route takes no query string: give arguments in the JSON body",
        ));
    }
    Ok(())
}

fn pool_error(e: PoolError) -> ApiError {
    match e {
        PoolError::Gone => unauthorized(),
        PoolError::Unavailable(m) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("this tenant's vault cannot be used: {m}"),
        ),
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|_| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the request failed unexpectedly; nothing acknowledged is lost",
        )
    })
}

/// Run `f` on a tenant's vault and make what it wrote durable. A request
/// on an open vault that no other request holds runs on this thread
/// (`inline`: a memory command, short), anything else on a blocking
/// thread; the sync, which waits on the disk, always on a blocking thread.
/// A checkpoint the request made due runs after, off its path.
pub async fn on_vault<T: Send + 'static>(
    app: &Arc<App>,
    slot: &Arc<Slot>,
    who: Attribution,
    authed: &Authed,
    inline: bool,
    f: impl FnOnce(&mut Open) -> T + Send + 'static,
) -> Result<Result<T, PoolError>, ApiError> {
    // One request of a tenant at the vault at a time; the others wait
    // here, holding no thread (a busy tenant cannot take the blocking
    // threads every tenant's syncs need).
    let turn = slot.gate.lock().await;
    // A token revoked or rotated (or its tenant removed) while this
    // request waited for its turn does not act.
    if !app.token_live(authed) {
        return Err(unauthorized());
    }
    let principal = authed.principal.clone();
    let ran = if inline {
        match slot.try_execute(&app.pool, &who, &principal, f) {
            Ok(ran) => ran,
            Err(f) => blocking_execute(app, slot, who, principal, f).await?,
        }
    } else {
        blocking_execute(app, slot, who, principal, f).await?
    };
    drop(turn);
    finish(slot, ran).await
}

async fn blocking_execute<T: Send + 'static>(
    app: &Arc<App>,
    slot: &Arc<Slot>,
    who: Attribution,
    principal: String,
    f: impl FnOnce(&mut Open) -> T + Send + 'static,
) -> Result<Result<Ran<T>, PoolError>, ApiError> {
    let (s, a) = (slot.clone(), app.clone());
    blocking(move || s.execute(&a.pool, &who, &principal, f)).await
}

async fn finish<T: Send + 'static>(
    slot: &Arc<Slot>,
    ran: Result<Ran<T>, PoolError>,
) -> Result<Result<T, PoolError>, ApiError> {
    let ran = match ran {
        Ok(r) => r,
        Err(e) => return Ok(Err(e)),
    };
    let done = if ran.needs_sync() {
        let s = slot.clone();
        blocking(move || s.durable(ran)).await?
    } else {
        slot.durable(ran)
    };
    Ok(done.map(|(out, due)| {
        if due {
            let s = slot.clone();
            tokio::task::spawn_blocking(move || s.after_reply());
        }
        out
    }))
}

async fn healthz(State(app): State<Arc<App>>) -> Response {
    if app.stopping.load(Ordering::SeqCst) {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down",
        )
        .into_response();
    }
    app.refresh(false);
    if app.broken.load(Ordering::SeqCst) {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server's tenant registry cannot be read; the operator must repair it",
        )
        .into_response();
    }
    let mut answer = json!({"status": "ok"});
    if let Some(round) = *app.sync_round.lock().unwrap_or_else(|p| p.into_inner()) {
        answer["sync"] = json!({
            "last_round": super::super::history::rfc3339(round.finished_ms),
            "synced": round.synced,
            "failed": round.failed,
            "busy": round.busy,
            "registry_unreadable": round.failed.is_none(),
        });
    }
    json_response(StatusCode::OK, &answer)
}

/// `POST /v1/memory`: one memory tool call; the reply is `serve`'s
/// `tool_result` JSON.
async fn memory(State(app): State<Arc<App>>, req: Request) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let early = no_query(&parts.uri).and_then(|()| app.tool_caller(&parts.headers));
    let ((who, attribution, slot), body) = admitted(&app, &parts.headers, body, early).await?;
    let bytes = read_body(&app, &parts.headers, body, &slot).await?;
    app.still_authorized(&parts.headers, Scope::Memory, &who)?;
    let value = parse_body(&bytes)?;
    let id = value.get("id").and_then(Value::as_str).map(str::to_owned);
    let inline = bytes.len() <= INLINE_BODY;
    let quota = slot.quota();
    let reply = on_vault(&app, &slot, attribution, &who, inline, move |open| {
        open.with_quota(quota, |open| {
            protocol::handle_value(&open.memory, &mut open.vault, &value)
        })
        .map_err(|why| why.to_string())
    })
    .await?;
    let reply = match reply {
        Ok(Ok(r)) => r,
        Ok(Err(why)) => return Err(ApiError::new(StatusCode::TOO_MANY_REQUESTS, why)),
        // Written to the log, not acknowledged: the tool's own error.
        Err(PoolError::Unavailable(m)) if m == NOT_DURABLE => Reply {
            tool_use_id: id,
            result: ToolResult::error(format!("Error: {m}")),
        },
        Err(e) => return Err(pool_error(e)),
    };
    Ok(json_response(StatusCode::OK, &reply.to_json()))
}

/// The audit (read) and admin (undo, erasure) routes: `POST /v1/OP` with
/// the subcommand's options as a JSON object (`GET` for none).
async fn v1(State(app): State<Arc<App>>, req: Request) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let early = (|| {
        // The route as sent (each is its own exact route: a path that only
        // percent-decodes to one, `/v1/%70urge`, is not one of them).
        let op = parts
            .uri
            .path()
            .strip_prefix("/v1/")
            .ok_or_else(not_found_error)?
            .to_string();
        let scope = route_scope(&op).ok_or_else(not_found_error)?;
        no_query(&parts.uri)?;
        let who = app.authenticate(&parts.headers, scope)?;
        let actor = match scope {
            Scope::Admin => "operator",
            _ => "agent",
        };
        let attribution = app.attribution(&parts.headers, &who, actor)?;
        let slot = app.slot(&who)?;
        Ok((op, scope, who, attribution, slot))
    })();
    let ((op, scope, who, attribution, slot), body) =
        admitted(&app, &parts.headers, body, early).await?;
    let bytes = read_body(&app, &parts.headers, body, &slot).await?;
    app.still_authorized(&parts.headers, scope, &who)?;
    let args = if bytes.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        parse_options(&bytes)?
    };
    if !args.is_object() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "the request body is a JSON object of the subcommand's options",
        ));
    }
    // Only audit answers are capped: an admin route's answer is written
    // after its change is made, and a refusal then would hide a change
    // that happened (an expiry's list of what it destroyed).
    let max_answer = match scope {
        Scope::Audit => app.limits.max_answer,
        _ => usize::MAX,
    };
    let out = on_vault(&app, &slot, attribution, &who, false, move |open| {
        run_subcommand(&op, args, &mut open.vault, max_answer)
    })
    .await?
    .map_err(pool_error)??;
    Ok(json_response(StatusCode::OK, &out))
}

fn args_of<T: serde::de::DeserializeOwned>(args: Value) -> Result<T, ApiError> {
    serde_json::from_value(args).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the options do not fit this route: {e}"),
        )
    })
}

fn cli_error(e: CliError) -> ApiError {
    let status = if e.code == 2 {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::UNPROCESSABLE_ENTITY
    };
    ApiError::new(status, e.message)
}

fn lines(out: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(out)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn text(out: Vec<u8>) -> String {
    String::from_utf8_lossy(&out).into_owned()
}

/// A subcommand's output, refused past `limit` bytes: an audit answer
/// (history writes change by change, so a whole history is never listed
/// whole in memory).
struct Capped {
    out: Vec<u8>,
    limit: usize,
    over: bool,
}

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len() + buf.len() > self.limit {
            self.over = true;
            return Err(std::io::Error::other(
                "the answer is over the server's limit",
            ));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl std::ops::Deref for Capped {
    type Target = Vec<u8>;
    fn deref(&self) -> &Vec<u8> {
        &self.out
    }
}

/// Run an audit or admin subcommand on an open vault; its answer as JSON,
/// at most `limit` bytes of output.
fn run_subcommand(
    op: &str,
    args: Value,
    vault: &mut Vault,
    limit: usize,
) -> Result<Value, ApiError> {
    let mut out = Capped {
        out: Vec::new(),
        limit,
        over: false,
    };
    let v = subcommand(op, args, vault, &mut out);
    match v {
        Err(_) if out.over => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "the answer is larger than this server's limit of {limit} bytes (--max-answer): ask for less (history: `limit`, `session` or `path`; diff: two nearby revisions; show: one file)"
            ),
        )),
        v => v,
    }
}

fn subcommand(
    op: &str,
    args: Value,
    vault: &mut Vault,
    out: &mut Capped,
) -> Result<Value, ApiError> {
    let v = match op {
        "history" => {
            let mut a: history::HistoryArgs = args_of(args)?;
            a.json = true;
            history::run(On::Open(vault), &a, out).map_err(cli_error)?;
            json!({"changes": lines(out)})
        }
        "sessions" => {
            let mut a: audit::SessionsArgs = args_of(args)?;
            a.json = true;
            audit::sessions(On::Open(vault), &a, out).map_err(cli_error)?;
            json!({"sessions": lines(out)})
        }
        "verify" => {
            let mut a: audit::VerifyArgs = args_of(args)?;
            a.json = true;
            audit::verify(On::Open(vault), &a, out).map_err(cli_error)?;
            lines(out).into_iter().next().unwrap_or(Value::Null)
        }
        "show" => {
            let a: audit::ShowArgs = args_of(args)?;
            // A path not there at that revision, or an erased version, is
            // a 422 as with `raw` (round 38c: it was a 200 whose body said
            // `"is_error": true`, which a client checking the status took
            // for success).
            audit::show(On::Open(vault), &a, out).map_err(cli_error)?;
            if a.raw {
                // Text as text; other bytes (an image) in base64, never
                // through a lossy conversion.
                match String::from_utf8(std::mem::take(&mut out.out)) {
                    Ok(t) => json!({"content": t}),
                    Err(e) => {
                        json!({"content_base64": data_encoding::BASE64.encode(e.as_bytes())})
                    }
                }
            } else {
                let mut t = text(std::mem::take(&mut out.out));
                if t.ends_with('\n') {
                    t.pop();
                }
                json!({"text": t, "is_error": false})
            }
        }
        "diff" => {
            let a: audit::DiffArgs = args_of(args)?;
            audit::diff(On::Open(vault), &a, out).map_err(cli_error)?;
            json!({"diff": text(std::mem::take(&mut out.out))})
        }
        "resume" => {
            let a: audit::ResumeArgs = args_of(args)?;
            audit::resume(On::Open(vault), &a, out).map_err(cli_error)?;
            json!({"briefing": text(std::mem::take(&mut out.out))})
        }
        "revert" => {
            let a: audit::RevertArgs = args_of(args)?;
            audit::revert(On::Open(vault), &a, out).map_err(cli_error)?;
            json!({"text": text(std::mem::take(&mut out.out))})
        }
        "restore" => {
            let a: audit::RestoreArgs = args_of(args)?;
            audit::restore(On::Open(vault), &a, out).map_err(cli_error)?;
            json!({"text": text(std::mem::take(&mut out.out))})
        }
        "expire" => {
            let mut a: expiry::ExpireArgs = args_of(args)?;
            a.json = true;
            expiry::expire(On::Open(vault), &a, out).map_err(cli_error)?;
            let mut all = lines(out);
            let mut summary = all.pop().unwrap_or_else(|| json!({}));
            summary["files"] = Value::Array(all);
            summary
        }
        "purge" => {
            let a: expiry::PurgeArgs = args_of(args)?;
            let code = expiry::purge(On::Open(vault), &a, out).map_err(cli_error)?;
            let said = text(std::mem::take(&mut out.out));
            // Committed, but its prune failed (a full disk): said in a
            // field, as `expire` says it, not only in the text.
            if code != 0 {
                json!({"text": said, "unfinished": true})
            } else {
                json!({"text": said})
            }
        }
        _ => return Err(not_found_error()),
    };
    Ok(v)
}

fn not_found_error() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no such route: see `memvault server --help` (POST /v1/memory, /v1/history, ..., /mcp, GET /healthz)",
    )
}

async fn not_found(app: Arc<App>, req: Request) -> ApiError {
    let (parts, body) = req.into_parts();
    before_body(&app, &parts.headers, body, not_found_error()).await
}

async fn method_not_allowed(app: Arc<App>, req: Request) -> ApiError {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path();
    let allow = match path.strip_prefix("/v1/").map(route_scope) {
        Some(Some(Scope::Audit)) => "GET, HEAD, POST",
        _ if path == "/healthz" => "GET, HEAD",
        _ => "POST",
    };
    before_body(
        &app,
        &parts.headers,
        body,
        ApiError::method_not_allowed(allow),
    )
    .await
}

/// The audit and admin routes under `/v1/`, and the scope each needs.
const ROUTES: [(&str, Scope); 10] = [
    ("history", Scope::Audit),
    ("show", Scope::Audit),
    ("diff", Scope::Audit),
    ("sessions", Scope::Audit),
    ("resume", Scope::Audit),
    ("verify", Scope::Audit),
    ("revert", Scope::Admin),
    ("restore", Scope::Admin),
    ("expire", Scope::Admin),
    ("purge", Scope::Admin),
];

fn route_scope(op: &str) -> Option<Scope> {
    ROUTES.iter().find(|(r, _)| *r == op).map(|&(_, s)| s)
}

/// `host` or `host:port`: a name of letters, digits, dots and hyphens, or
/// an IPv6 address in brackets; a port of 1 to 5 digits, 1 to 65535.
fn host_and_port(s: &str) -> bool {
    let (host_ok, port) = match s.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((ip, after)) if after.is_empty() || after.starts_with(':') => (
                ip.parse::<std::net::Ipv6Addr>().is_ok(),
                after.strip_prefix(':'),
            ),
            _ => return false,
        },
        None => {
            let (host, port) = match s.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (s, None),
            };
            let name = |b: u8| b.is_ascii_alphanumeric() || b == b'.' || b == b'-';
            (!host.is_empty() && host.bytes().all(name), port)
        }
    };
    host_ok
        && port.is_none_or(|p| {
            p.len() <= 5
                && p.bytes().all(|b| b.is_ascii_digit())
                && p.parse::<u16>().is_ok_and(|n| n > 0)
        })
}

/// An `Origin` as browsers send it: `http://` or `https://`, then a host
/// and port ([`host_and_port`]), nothing after.
fn is_origin(s: &str) -> bool {
    s.strip_prefix("http://")
        .or_else(|| s.strip_prefix("https://"))
        .is_some_and(host_and_port)
}

/// In front of `/mcp`: the token (scope `memory`) and the rate, the body
/// read within the limits and checked for a repeated key; the checked
/// identity travels to the MCP handler in the request's extensions.
async fn mcp_gate(
    State(app): State<Arc<App>>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let (mut parts, body) = req.into_parts();
    // Whatever a client puts there, only this layer's value is read.
    parts.extensions.remove::<Authed>();
    parts.extensions.remove::<Refusal>();
    parts.extensions.remove::<Arc<Slot>>();
    parts.extensions.remove::<Attribution>();
    let early = (|| {
        // Stateless: no event stream to GET, no session to DELETE.
        if parts.method != Method::POST {
            return Err(ApiError::method_not_allowed("POST"));
        }
        // A second `Host` or `Origin` (RFC 9112: a request with two Hosts
        // is a 400) could be read by a proxy in front while the checks
        // here read the first.
        for (name, shown) in [(header::HOST, "Host"), (header::ORIGIN, "Origin")] {
            if parts.headers.get_all(&name).iter().count() > 1 {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("the request gives the {shown} header more than once"),
                ));
            }
        }
        // A `Host` with user info (`evil@localhost`) names no host of ours;
        // rmcp's own check would read the part after the `@`. Nor does one
        // that is not a host and port (`localhost:abc`), an `Origin` that
        // is not `scheme://host[:port]` (rmcp's check read only part of
        // it), or a request target that names its own host
        // (`POST http://evil.com/mcp`: the request is for that host).
        let forbidden = |what: &str| {
            ApiError::new(
                StatusCode::FORBIDDEN,
                format!("the {what} names no host this server answers for"),
            )
        };
        if parts.uri.authority().is_some() {
            return Err(forbidden("request target"));
        }
        if parts
            .headers
            .get(header::HOST)
            .is_some_and(|h| h.to_str().map_or(true, |h| !host_and_port(h)))
        {
            return Err(forbidden("Host header"));
        }
        if parts
            .headers
            .get(header::ORIGIN)
            .is_some_and(|o| o.to_str().map_or(true, |o| o != "null" && !is_origin(o)))
        {
            return Err(forbidden("Origin header"));
        }
        // `Accept: */*` takes the JSON answers `/mcp` gives (rmcp asks for
        // both JSON and an event stream by name, and refused it with 406).
        if parts.headers.get(header::ACCEPT).is_some_and(|a| {
            a.as_bytes()
                .split(|&b| b == b',')
                .any(|t| t.trim_ascii().starts_with(b"*/*"))
        }) {
            parts.headers.insert(
                header::ACCEPT,
                axum::http::HeaderValue::from_static("application/json, text/event-stream"),
            );
        }
        app.tool_caller(&parts.headers)
    })();
    let ((who, attribution, slot), body) = admitted(&app, &parts.headers, body, early).await?;
    // Held (its share of the body budget) until the response is made.
    let mut held = read_body(&app, &parts.headers, body, &slot).await?;
    let mut bytes = std::mem::take(&mut held.bytes);
    app.still_authorized(&parts.headers, Scope::Memory, &who)?;
    // A leading byte order mark is ignored, as `memvault mcp`, `serve` and
    // `/v1/memory` ignore it (rmcp's parser refused it with a 415).
    if bytes.starts_with(b"\xEF\xBB\xBF") {
        bytes = bytes.slice(3..);
        parts.headers.insert(
            axum::http::header::CONTENT_LENGTH,
            axum::http::HeaderValue::from(bytes.len()),
        );
    }
    // One JSON-RPC message, an object. A `tools/call` that `serve` would
    // refuse (a key given twice, arguments that are not an object) is the
    // tool's error, as `memvault mcp` answers it; anything else malformed
    // is a malformed request.
    const SEND: &str = "send one JSON-RPC message (a JSON object; batches are not taken)";
    match crate::cli::mcpwire::screen(&bytes) {
        crate::cli::mcpwire::Screened::Refuse { clean, message, .. } => {
            parts.extensions.insert(Refusal(message));
            parts.headers.insert(
                axum::http::header::CONTENT_LENGTH,
                axum::http::HeaderValue::from(clean.len()),
            );
            bytes = clean.into();
        }
        crate::cli::mcpwire::Screened::Unparsable(e) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("the request body is not valid JSON ({e}); {SEND}"),
            ));
        }
        crate::cli::mcpwire::Screened::Invalid { message, .. }
        | crate::cli::mcpwire::Screened::Drop(message) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("the request body is not a JSON-RPC 2.0 request ({message}); {SEND}"),
            ));
        }
        crate::cli::mcpwire::Screened::Pass => match parse_strict(&bytes) {
            Ok(v) if v.is_object() => {}
            Ok(_) => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("the request body is not a JSON object; {SEND}"),
                ));
            }
            Err(ParseError::Syntax(e)) => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("the request body is not valid JSON ({e}); {SEND}"),
                ));
            }
            Err(ParseError::DuplicateKey(key)) => return Err(duplicate_key(&key)),
        },
    }
    parts.extensions.insert(who);
    parts.extensions.insert(attribution);
    parts.extensions.insert(slot);
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    Ok(plain_errors_as_json(response).await)
}

/// An error the MCP layer answers in plain text (a `Host` or protocol
/// version it refuses) as every other error of the server is answered:
/// `{"error": "..."}`, with the same status. JSON answers pass as they are.
async fn plain_errors_as_json(response: Response) -> Response {
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json") || v.starts_with("text/event-stream"));
    if !(response.status().is_client_error() || response.status().is_server_error()) || is_json {
        return response;
    }
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 4 << 10)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body);
    let text = text.trim();
    let text = if text.is_empty() {
        status.canonical_reason().unwrap_or("error")
    } else {
        text
    };
    json_response(status, &json!({"error": text}))
}

/// The whole route table.
pub fn router(app: Arc<App>, mcp: axum::routing::MethodRouter<()>) -> Router {
    let mcp = Router::new()
        .route("/mcp", mcp)
        .layer(middleware::from_fn_with_state(app.clone(), mcp_gate));
    let mut routes = Router::new()
        .route("/healthz", get(healthz))
        .route("/v1/memory", post(memory));
    // Audit routes read (`GET` for no options); admin routes change the
    // vault (`POST` only). Any other method: 405 with `Allow`.
    for (op, scope) in ROUTES {
        let handler = match scope {
            Scope::Audit => get(v1).post(v1),
            _ => post(v1),
        };
        routes = routes.route(&format!("/v1/{op}"), handler);
    }
    let (on_404, on_405) = (app.clone(), app.clone());
    routes
        .with_state(app)
        .merge(mcp)
        .fallback(move |req: Request| not_found(on_404.clone(), req))
        .method_not_allowed_fallback(move |req: Request| method_not_allowed(on_405.clone(), req))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_origins_are_read_whole() {
        for ok in [
            "localhost",
            "127.0.0.1",
            "127.0.0.1:8700",
            "[::1]",
            "[::1]:8700",
            "memory.example.com:443",
        ] {
            assert!(host_and_port(ok), "{ok}");
            assert!(is_origin(&format!("http://{ok}")), "{ok}");
        }
        for bad in [
            "",
            "127.0.0.1:",
            "127.0.0.1:abc",
            "localhost:99999",
            "localhost:0",
            "localhost:18733.evil.com",
            "localhost:evil.com",
            "localhost:1/../@evil.com",
            "localhost:18733/.evil.com",
            "x@127.0.0.1",
            "[::1",
            "[::1]x",
            "[]",
            "local host",
        ] {
            assert!(!host_and_port(bad), "{bad}");
            assert!(!is_origin(&format!("http://{bad}")), "{bad}");
        }
        assert!(!is_origin("localhost:8700"));
        assert!(!is_origin("ftp://localhost"));
        assert!(!is_origin("http://localhost/"));
    }
}
