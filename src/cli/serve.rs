//! `memvault serve` when several processes serve one vault.
//!
//! Each `serve` process answers its own client: one JSON request line in,
//! one `tool_result` line out (see [`crate::protocol`]). The first one on a
//! vault becomes the *leader*: it holds `memvault/serve.lock` and listens
//! on `memvault/serve.sock` (mode 0600, in the vault's own directory). The
//! others are *followers*: they hand each request of their client to the
//! leader over that socket and relay its reply. In the leader, one thread
//! per client (its own stdin, and each follower's connection) runs that
//! client's requests one at a time on the one open vault; a request's log
//! record is made durable by one `fdatasync` that covers every record
//! written before it, so while one thread syncs, the others go on and the
//! next sync covers them all (group commit). No process loads objects
//! another wrote.
//!
//! What holds:
//! - a reply is written only after the log record of its request is
//!   synced; each client has one request running at a time, so a crash
//!   lands at most one request its client was not answered for;
//! - before anything else, the leader and a follower each prove they hold
//!   the vault's keys (HMAC over both sides' random nonces under
//!   [`VaultKeys::serve_key`](crate::crypto::VaultKeys::serve_key)); a
//!   peer that cannot is dropped, and a follower that cannot reach a
//!   genuine leader runs requests itself;
//! - a request is run only if its frame arrived whole (newline included),
//!   so a follower that could not send one may run it elsewhere;
//! - when the leader's own client is done, it stops taking followers,
//!   releases the lead, tells each follower it is leaving, answers every
//!   request a follower sent before acknowledging that, and exits; the
//!   followers then lead or follow anew;
//! - a leader that dies (SIGKILL) leaves a follower's request in flight
//!   with an unknown outcome: the follower answers it with an error saying
//!   so and carries on;
//! - a process that cannot lead or follow runs requests itself under the
//!   writer lock, as every mutation does anyway: the writer lock and the
//!   log, not this module, keep concurrent writers correct.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::Scope;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use zeroize::Zeroizing;

use crate::crypto::{random_bytes, serve_tag, serve_tag_ok};
use crate::memory::{Memory, Store, ToolResult};
use crate::protocol::{self, Line, Reply};
use crate::vault::{Attribution, Vault, fsx, fsync};

/// A reply longer than this may not fit what a pipe or socket takes
/// without its reader: `after_reply` (a due checkpoint) runs before it is
/// written, so a client that is slow to read does not hold it up.
const LARGE_REPLY: usize = 16 << 10;

const SOCKET: &str = "memvault/serve.sock";
const LEAD_LOCK: &str = "memvault/serve.lock";
const BYE: &str = r#"{"memvault":"bye"}"#;
const BYE_ACK: &str = r#"{"memvault":"bye_ack"}"#;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a follower gives `serve.sock` to connect and prove it is the
/// leader: a genuine leader answers in microseconds, and a socket that
/// does not (a listener that never answers, planted or hung) must not
/// stall this process's client; it then runs requests itself.
const FOLLOW_TIMEOUT: Duration = Duration::from_millis(300);
/// Each election that finds no leader to follow doubles the wait before
/// the next one, up to this.
const RETRY_MAX: Duration = Duration::from_secs(64);
/// How long a leader that is leaving waits for its followers' last
/// requests before it hangs up on them.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a process that runs requests itself looks for a leader.
const RETRY_EVERY: Duration = Duration::from_secs(1);
/// A handshake line or a request header, at most.
const SMALL_LINE: usize = 1024;
/// A reply line a follower accepts, at most (view output is bounded far
/// below this).
const MAX_REPLY: usize = 256 << 20;

const UNKNOWN_OUTCOME: &str = "Error: the memvault serve process that was running this command for the vault stopped before it answered, so the command may or may not have been applied. View the file to check before you repeat it.";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A follower's connection, shared by the thread that answers it and the
/// leader's leaving notice.
type PeerConn = Arc<Mutex<UnixStream>>;

/// The leader's followers, and whether it is leaving.
type Peers = (HashMap<u64, PeerConn>, bool);

/// Turns at the vault, in the order requests arrive: `std`'s mutex is not
/// fair, and a client that streams its requests took the vault again and
/// again as soon as it let go, so four streaming clients were served
/// nearly one after the other (four together made a quarter of what one
/// alone makes).
#[derive(Default)]
struct Turns {
    at: Mutex<Queue>,
}

/// The tickets of [`Turns`]: the next to hand out, the one served, and
/// the threads waiting for theirs (in ticket order).
#[derive(Default)]
struct Queue {
    next: u64,
    serving: u64,
    waiting: std::collections::VecDeque<(u64, std::thread::Thread)>,
}

impl Turns {
    /// Wait for this caller's turn, which lasts as long as the guard.
    /// Only the thread whose turn comes is woken (waking every waiter
    /// for each turn cost each of them a switch for nothing).
    fn enter(&self) -> Turn<'_> {
        let mut at = lock(&self.at);
        let ticket = at.next;
        at.next += 1;
        if at.serving != ticket {
            at.waiting.push_back((ticket, std::thread::current()));
            while at.serving != ticket {
                drop(at);
                std::thread::park();
                at = lock(&self.at);
            }
            at.waiting.retain(|(t, _)| *t != ticket);
        }
        Turn(self)
    }
}

/// A caller's turn at the vault; the next begins when it is dropped (also
/// on a panic, so no thread waits for ever).
struct Turn<'a>(&'a Turns);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut at = lock(&self.0.at);
        at.serving += 1;
        let serving = at.serving;
        if let Some((_, thread)) = at.waiting.iter().find(|(t, _)| *t == serving) {
            thread.unpark();
        }
    }
}

/// What every thread of a serving process shares.
struct Shared<'v> {
    vault: Mutex<&'v mut Vault>,
    /// Who runs a request on `vault` next.
    turns: Turns,
    memory: &'v Memory,
    /// The memory tool for settings another process set since `memory`
    /// was made.
    live: super::LiveMemory,
    max_line: usize,
    /// Log records this process appended (numbered from 1).
    appended: AtomicU64,
    /// Whether a request left work for [`Shared::after_reply`]
    /// ([`Vault::end_request`]).
    chores: AtomicBool,
    /// The highest record number known durable; held while syncing.
    synced: Mutex<u64>,
    /// The log file, to sync without holding the vault.
    log: File,
    key: Zeroizing<[u8; 32]>,
    dir: PathBuf,
    /// Each follower's connection (for replies and the leaving notice),
    /// and whether this leader is leaving.
    peers: Mutex<Peers>,
    /// `MEMVAULT_TEST_LEADER_PAUSE_MS`: a leader waits this long after
    /// running a follower's request, before its sync and reply (saying so
    /// on stderr first). Only in `test-hooks` builds, so tests can kill a
    /// leader with a request in flight.
    #[cfg(feature = "test-hooks")]
    test_pause: Option<Duration>,
    /// `MEMVAULT_TEST_AFTER_REPLY_PAUSE_MS`: this process waits this long
    /// after each reply to its own client, before `after_reply` (a due
    /// checkpoint). Only in `test-hooks` builds.
    #[cfg(feature = "test-hooks")]
    test_after_reply_pause: Option<Duration>,
}

impl<'v> Shared<'v> {
    /// Share `vault` among the threads of a serving process (its syncs
    /// deferred to [`Shared::make_durable`] until the caller undoes it).
    fn new(vault: &'v mut Vault, memory: &'v Memory, max_line: usize) -> io::Result<Shared<'v>> {
        let key = vault.keys().serve_key();
        let dir = vault.dir().to_path_buf();
        let log = vault.log_sync_handle()?;
        vault.defer_sync(true);
        let live = super::LiveMemory::new(vault.config());
        Ok(Shared {
            vault: Mutex::new(vault),
            turns: Turns::default(),
            memory,
            live,
            max_line,
            appended: AtomicU64::new(0),
            chores: AtomicBool::new(false),
            synced: Mutex::new(0),
            log,
            key,
            dir,
            peers: Mutex::new((HashMap::new(), false)),
            #[cfg(feature = "test-hooks")]
            test_pause: std::env::var("MEMVAULT_TEST_LEADER_PAUSE_MS")
                .ok()
                .and_then(|v| v.parse().ok())
                .map(Duration::from_millis),
            #[cfg(feature = "test-hooks")]
            test_after_reply_pause: std::env::var("MEMVAULT_TEST_AFTER_REPLY_PAUSE_MS")
                .ok()
                .and_then(|v| v.parse().ok())
                .map(Duration::from_millis),
        })
    }

    /// Run one request line as `who` and make it durable; `None` for a
    /// blank line (no reply).
    fn execute(&self, who: &Attribution, line: Line) -> Option<String> {
        let turn = self.turns.enter();
        let ran = self.run(who, line);
        drop(turn);
        let (mut reply, seq) = ran?;
        if seq > 0
            && let Err(e) = self.make_durable(seq)
        {
            reply.result = ToolResult::error(format!(
                "Error: the change was written but could not be made durable ({e}); check the disk"
            ));
        }
        Some(reply.to_line() + "\n")
    }

    /// Run one request on the vault (in the caller's turn): its reply and
    /// the number of its log record (0: it wrote none).
    fn run(&self, who: &Attribution, line: Line) -> Option<(protocol::Reply, u64)> {
        {
            let mut vault = lock(&self.vault);
            let reply = match line {
                Line::Eof => return None,
                Line::TooLong(n, head) => protocol::too_long_reply(n, self.max_line, &head),
                Line::Ok(bytes) => {
                    if bytes.iter().all(u8::is_ascii_whitespace) {
                        return None;
                    }
                    vault.set_attribution(who.clone());
                    match self.live.now(&mut vault) {
                        Ok(None) => protocol::handle_line(self.memory, &mut **vault, &bytes),
                        Ok(Some(live)) => protocol::handle_line(&live, &mut **vault, &bytes),
                        Err(text) => protocol::Reply {
                            tool_use_id: None,
                            result: ToolResult::error(text),
                        },
                    }
                }
            };
            // Numbered while the vault is held, after the record's write.
            let seq = if vault.take_pending_sync() {
                self.appended.fetch_add(1, Ordering::SeqCst) + 1
            } else {
                0
            };
            if vault.end_request() {
                self.chores.store(true, Ordering::SeqCst);
            }
            Some((reply, seq))
        }
    }

    /// Group commit: sync the log unless a sync that started after record
    /// `seq` was written has already finished; one sync covers every
    /// record written before it began.
    fn make_durable(&self, seq: u64) -> io::Result<()> {
        let mut synced = lock(&self.synced);
        if *synced >= seq {
            return Ok(());
        }
        let covered = self.appended.load(Ordering::SeqCst);
        fsync::sync_data(&self.log)?;
        *synced = covered;
        Ok(())
    }

    /// Run a checkpoint the last request made due (see `Vault::after_reply`).
    fn after_reply(&self) {
        // Whichever thread finds the work does it, for every request
        // that left some.
        if self.chores.swap(false, Ordering::SeqCst) {
            lock(&self.vault).after_reply();
        }
    }
}

/// Serve the process's own client (stdin/stdout) until its input ends.
pub(crate) fn run(vault: &mut Vault, memory: &Memory, max_line: usize) -> io::Result<()> {
    let own = vault.attribution().clone();
    let shared = Shared::new(&mut *vault, memory, max_line)?;
    let result = std::thread::scope(|s| {
        let mut node = Node {
            shared: &shared,
            scope: s,
            own,
            mode: Mode::Local,
            last_try: Instant::now(),
            retry_every: RETRY_EVERY,
        };
        node.mode = node.elect(true);
        let result = node.serve_own();
        node.leave();
        result
    });
    drop(shared);
    vault.defer_sync(false);
    result
}

enum Mode {
    /// Run requests in this process, under the writer lock.
    Local,
    Follower(Follower),
    Leader(Leader),
}

struct Leader {
    /// Holds `serve.lock` while this process leads.
    lock: Option<File>,
    socket: PathBuf,
    /// The socket file's (device, inode), to tell it from one put in its
    /// place.
    socket_id: (u64, u64),
    stop: Arc<AtomicBool>,
    /// Ends the loop that takes followers' connections (`None`), whatever
    /// became of the socket's name.
    wake: mpsc::Sender<Option<UnixStream>>,
}

/// This process's own client, and the lead or follow it takes.
struct Node<'s, 'v, 'e> {
    shared: &'s Shared<'v>,
    scope: &'s Scope<'s, 'e>,
    own: Attribution,
    mode: Mode,
    last_try: Instant,
    /// How long to run requests here before looking for a leader again.
    retry_every: Duration,
}

impl<'s, 'v: 's, 'e> Node<'s, 'v, 'e> {
    /// Answer this process's own client, one line at a time: the next line
    /// is read only once the one before is answered.
    fn serve_own(&mut self) -> io::Result<()> {
        let stdin = io::stdin();
        // Its own buffer (reads of 64 KiB pass by `Stdin`'s), to know
        // whether the next request is already read.
        let mut input = BufReader::with_capacity(64 << 10, stdin.lock());
        let stdout = io::stdout();
        let mut out = stdout.lock();
        loop {
            if input.buffer().is_empty() && self.alone() {
                spin_for_input(&stdin);
            }
            let line = match protocol::read_bounded(&mut input, self.shared.max_line)? {
                Line::Eof => return Ok(()),
                line => line,
            };
            let reply = self.one(line, true);
            // A large reply can block on a client that does not read it
            // yet: what `after_reply` does (a due checkpoint) goes first
            // then.
            let early = reply.as_ref().is_some_and(|r| r.len() > LARGE_REPLY);
            if early {
                self.shared.after_reply();
            }
            let sent = match reply {
                Some(reply) => out.write_all(reply.as_bytes()).and_then(|()| out.flush()),
                None => Ok(()),
            };
            #[cfg(feature = "test-hooks")]
            if let Some(pause) = self.shared.test_after_reply_pause {
                std::thread::sleep(pause);
            }
            // Even when the reply could not be written, and also as a
            // follower: a request that ran here after its leader went away
            // may have made a checkpoint due.
            if !early {
                self.shared.after_reply();
            }
            sent?;
        }
    }

    /// Whether this process serves its own client alone: no follower
    /// relays through it and it relays through no leader.
    fn alone(&self) -> bool {
        match self.mode {
            Mode::Follower(_) => false,
            Mode::Leader(_) => lock(&self.shared.peers).0.is_empty(),
            Mode::Local => true,
        }
    }

    /// The reply to one request of this process's own client, run here
    /// or by the leader. `retry`: a request the leader never got may go
    /// to the next one (once; after that it runs here).
    fn one(&mut self, line: Line, retry: bool) -> Option<String> {
        if matches!(self.mode, Mode::Local) && self.last_try.elapsed() > self.retry_every {
            self.mode = self.elect(false);
        }
        let bytes = match (&self.mode, line) {
            (Mode::Follower(_), Line::Ok(b)) if !b.iter().all(u8::is_ascii_whitespace) => b,
            // Leading or alone, or nothing to run: answered here.
            (_, line) => return self.shared.execute(&self.own, line),
        };
        let Mode::Follower(f) = &mut self.mode else {
            unreachable!("matched a follower above")
        };
        match f.call(&self.own, &bytes) {
            Ok(reply) => Some(reply),
            Err(Sent::No) => {
                self.mode = Mode::Local;
                if retry {
                    self.mode = self.elect(true);
                }
                self.one(Line::Ok(bytes), false)
            }
            Err(Sent::Unknown) => {
                self.mode = Mode::Local;
                self.mode = self.elect(true);
                let r = Reply {
                    tool_use_id: request_id(&bytes),
                    result: ToolResult::error(UNKNOWN_OUTCOME),
                };
                Some(r.to_line() + "\n")
            }
        }
    }

    /// Stop leading: no new followers, release the lead, tell each
    /// follower, answer what they sent before acknowledging, then hang up
    /// on any that have not gone after [`LEAVE_TIMEOUT`].
    fn leave(&mut self) {
        let Mode::Leader(l) = &mut self.mode else {
            return;
        };
        l.stop.store(true, Ordering::SeqCst);
        // Stop taking followers: this does not depend on the socket.
        let _ = l.wake.send(None);
        // If the name is still our socket's, wake the acceptor blocked on
        // it so it sees `stop`, and take the name away. One deleted or
        // replaced is left as it is (connecting to someone else's could
        // block); the acceptor then ends with the process.
        if socket_id(&l.socket).ok() == Some(l.socket_id) {
            let _ = UnixStream::connect(&l.socket);
            let _ = fs::remove_file(&l.socket);
        }
        l.lock = None;
        {
            let mut peers = lock(&self.shared.peers);
            peers.1 = true;
            for w in peers.0.values() {
                let _ = lock(w).write_all(format!("{BYE}\n").as_bytes());
            }
        }
        let deadline = Instant::now() + LEAVE_TIMEOUT;
        while !lock(&self.shared.peers).0.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        for w in lock(&self.shared.peers).0.values() {
            let _ = lock(w).shutdown(std::net::Shutdown::Both);
        }
    }

    /// Lead if nobody does, else follow the leader, else run requests here.
    /// `wait`: give a leader that is starting a moment to listen.
    fn elect(&mut self, wait: bool) -> Mode {
        let mode = self.try_elect(wait);
        self.last_try = Instant::now();
        self.retry_every = match mode {
            Mode::Local => (self.retry_every * 2).min(RETRY_MAX),
            _ => RETRY_EVERY,
        };
        mode
    }

    fn try_elect(&mut self, wait: bool) -> Mode {
        let dir = &self.shared.dir;
        let lead = fsx::open_rw(&dir.join(LEAD_LOCK));
        if let Ok(lead) = lead
            && lead.try_lock().is_ok()
        {
            return match self.listen() {
                Ok(mut l) => {
                    l.lock = Some(lead);
                    Mode::Leader(l)
                }
                Err(_) => Mode::Local,
            };
        }
        let tries = if wait { 50 } else { 1 };
        for i in 0..tries {
            match Follower::connect_within(&dir.join(SOCKET), &self.shared.key) {
                Ok(f) => return Mode::Follower(f),
                Err(e)
                    if i + 1 < tries
                        && matches!(
                            e.kind(),
                            io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                        ) =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(_) => break,
            }
        }
        Mode::Local
    }

    /// Listen on `serve.sock` (the caller holds the lead lock and puts it
    /// in the returned [`Leader`]).
    fn listen(&mut self) -> io::Result<Leader> {
        let socket = self.shared.dir.join(SOCKET);
        // Left by a leader that died: we hold the lead lock now.
        let _ = fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket)?;
        fs::set_permissions(&socket, fs::Permissions::from_mode(0o600))?;
        let socket_id = socket_id(&socket)?;
        // A new lead takes followers again.
        lock(&self.shared.peers).1 = false;
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = stop.clone();
        // The acceptor hands connections to a loop in the scope. It is not
        // in the scope itself: if the socket's name was deleted or
        // replaced, nothing can wake its `accept`, and the process must
        // still exit when its client is done.
        let (wake, conns) = mpsc::channel::<Option<UnixStream>>();
        let to_loop = wake.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop_flag.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                if to_loop.send(Some(conn)).is_err() {
                    return;
                }
            }
        });
        let (shared, scope) = (self.shared, self.scope);
        scope.spawn(move || {
            for (id, conn) in (0u64..).zip(conns.iter().map_while(|c| c)) {
                scope.spawn(move || serve_peer(shared, conn, id));
            }
        });
        Ok(Leader {
            lock: None,
            socket,
            socket_id,
            stop,
            wake,
        })
    }
}

/// The leader's side of one follower: handshake, then its requests, run
/// and answered one at a time, until it acknowledges the leader's leaving
/// or goes.
fn serve_peer(shared: &Shared<'_>, conn: UnixStream, id: u64) {
    let Ok(read_half) = conn.try_clone() else {
        return;
    };
    let mut r = BufReader::new(read_half);
    let mut w = conn;
    let key: &[u8; 32] = &shared.key;
    let handshake = (|| -> io::Result<()> {
        w.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        let hello = read_frame(&mut r, SMALL_LINE)?;
        let nf = hex_field(&hello, "hello ", 32)?;
        let nl = random_bytes::<32>();
        let nonces = [&nf[..], &nl[..]].concat();
        let proof = serve_tag(key, b"leader", &nonces);
        w.write_all(format!("leader {} {}\n", hex(&nl), hex(&proof)).as_bytes())?;
        let answer = read_frame(&mut r, SMALL_LINE)?;
        let tag = hex_field(&answer, "follower ", 32)?;
        if !serve_tag_ok(key, b"follower", &nonces, &tag) {
            return Err(io::Error::other("a peer without the vault's keys"));
        }
        w.write_all(b"ok\n")?;
        w.set_read_timeout(None)
    })();
    if handshake.is_err() {
        return;
    }
    let w = Arc::new(Mutex::new(w));
    {
        let mut peers = lock(&shared.peers);
        if peers.1 {
            let _ = lock(&w).write_all(format!("{BYE}\n").as_bytes());
        }
        peers.0.insert(id, w.clone());
    }
    while let Ok(header) = read_frame(&mut r, SMALL_LINE) {
        if header == BYE_ACK.as_bytes() {
            break;
        }
        let Some(who) = attribution(&header) else {
            break;
        };
        // Over the limit: `TooLong`, the rest of the line read and dropped.
        let Ok(line) = read_line(&mut r, shared.max_line) else {
            break;
        };
        // A blank frame still gets an answer: a peer waits for one.
        let reply = shared
            .execute(&who, line)
            .unwrap_or_else(|| protocol::blank_reply().to_line() + "\n");
        #[cfg(feature = "test-hooks")]
        if let Some(pause) = shared.test_pause {
            eprintln!("memvault: test hook: leader pausing before its reply");
            std::thread::sleep(pause);
        }
        let early = reply.len() > LARGE_REPLY;
        if early {
            shared.after_reply();
        }
        let sent = lock(&w).write_all(reply.as_bytes());
        // Even when the follower has gone: a due checkpoint must not
        // wait for the next request.
        if !early {
            shared.after_reply();
        }
        if sent.is_err() {
            break;
        }
    }
    lock(&shared.peers).0.remove(&id);
}

/// Whether a request reached the leader.
enum Sent {
    /// It did not: it may run elsewhere.
    No,
    /// It may have run: the leader went without answering.
    Unknown,
}

struct Follower {
    /// The socket's write half, and whether the leader is leaving.
    w: Arc<Mutex<(UnixStream, bool)>>,
    replies: Receiver<Option<String>>,
    stream: UnixStream,
}

impl Follower {
    /// [`Follower::connect`] within [`FOLLOW_TIMEOUT`], connect included
    /// (a listener whose backlog is full blocks `connect` itself; the
    /// helper thread is then left to end with the process).
    fn connect_within(socket: &Path, key: &Zeroizing<[u8; 32]>) -> io::Result<Follower> {
        let (tx, rx) = mpsc::channel();
        let (socket, key) = (socket.to_path_buf(), key.clone());
        std::thread::spawn(move || {
            let _ = tx.send(Follower::connect(&socket, &key));
        });
        rx.recv_timeout(FOLLOW_TIMEOUT)
            .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into()))
    }

    fn connect(socket: &Path, key: &Zeroizing<[u8; 32]>) -> io::Result<Follower> {
        let mut s = UnixStream::connect(socket)?;
        s.set_read_timeout(Some(FOLLOW_TIMEOUT))?;
        s.set_write_timeout(Some(FOLLOW_TIMEOUT))?;
        let mut r = BufReader::new(s.try_clone()?);
        let nf = random_bytes::<32>();
        s.write_all(format!("hello {}\n", hex(&nf)).as_bytes())?;
        let line = read_frame(&mut r, SMALL_LINE)?;
        let rest = line
            .strip_prefix(b"leader ")
            .ok_or_else(|| io::Error::other("not a memvault leader"))?;
        let mut parts = rest.split(|&b| b == b' ');
        let nl = unhex(parts.next().unwrap_or_default(), 32)?;
        let tag = unhex(parts.next().unwrap_or_default(), 32)?;
        let nonces = [&nf[..], &nl[..]].concat();
        if !serve_tag_ok(key, b"leader", &nonces, &tag) {
            return Err(io::Error::other("a leader without the vault's keys"));
        }
        let proof = serve_tag(key, b"follower", &nonces);
        s.write_all(format!("follower {}\n", hex(&proof)).as_bytes())?;
        if read_frame(&mut r, SMALL_LINE)? != b"ok" {
            return Err(io::Error::other("the leader refused"));
        }
        s.set_read_timeout(None)?;
        s.set_write_timeout(None)?;
        let w = Arc::new(Mutex::new((s.try_clone()?, false)));
        let (tx, replies) = mpsc::channel();
        let w2 = w.clone();
        std::thread::spawn(move || {
            loop {
                match read_frame(&mut r, MAX_REPLY) {
                    Ok(line) if line == BYE.as_bytes() => {
                        let mut g = w2.lock().unwrap_or_else(|p| p.into_inner());
                        g.1 = true;
                        let _ = g.0.write_all(format!("{BYE_ACK}\n").as_bytes());
                    }
                    Ok(line) => {
                        let mut line = String::from_utf8_lossy(&line).into_owned();
                        line.push('\n');
                        if tx.send(Some(line)).is_err() {
                            return;
                        }
                    }
                    Err(_) => {
                        let _ = tx.send(None);
                        return;
                    }
                }
            }
        });
        Ok(Follower {
            w,
            replies,
            stream: s,
        })
    }

    /// Hand one request to the leader and wait for its reply.
    fn call(&mut self, who: &Attribution, line: &[u8]) -> Result<String, Sent> {
        if let Ok(None) = self.replies.try_recv() {
            // The leader is gone; nothing was sent.
            return Err(Sent::No);
        }
        {
            let mut g = self.w.lock().unwrap_or_else(|p| p.into_inner());
            if g.1 {
                return Err(Sent::No);
            }
            let header = json!({"session": who.session, "actor": who.actor}).to_string();
            let mut frame = Vec::with_capacity(header.len() + line.len() + 2);
            frame.extend_from_slice(header.as_bytes());
            frame.push(b'\n');
            frame.extend_from_slice(line);
            frame.push(b'\n');
            // A failed write never delivered the final newline, so the
            // leader does not run the request (see `read_frame`).
            if g.0.write_all(&frame).is_err() {
                return Err(Sent::No);
            }
        }
        match self.replies.recv() {
            Ok(Some(reply)) => Ok(reply),
            _ => Err(Sent::Unknown),
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// One `\n`-terminated line of at most `max` bytes, without the newline
/// ([`protocol::read_bounded`]; a longer line is read to its end and
/// reported). A line cut short by the end of the stream is an error,
/// never a line.
fn read_line(r: &mut dyn BufRead, max: usize) -> io::Result<Line> {
    match protocol::read_bounded_ended(r, max)? {
        (line @ (Line::Ok(_) | Line::TooLong(..)), true) => Ok(line),
        _ => Err(io::ErrorKind::UnexpectedEof.into()),
    }
}

/// [`read_line`] for the handshake, control and reply lines: one over the
/// limit is an error too.
fn read_frame(r: &mut dyn BufRead, max: usize) -> io::Result<Vec<u8>> {
    match read_line(r, max)? {
        Line::Ok(line) => Ok(line),
        _ => Err(io::ErrorKind::InvalidData.into()),
    }
}

/// A request header from a follower: the attribution to run under.
fn attribution(header: &[u8]) -> Option<Attribution> {
    let v: Value = protocol::parse_strict(header).ok()?;
    let field = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .filter(|s| crate::memory::path::is_plain_label(s))
            .map(str::to_string)
    };
    Some(Attribution {
        session: field("session")?,
        actor: field("actor")?,
    })
}

/// The `id` of a `tool_use` request line, for an error reply.
fn request_id(line: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(line).ok()?;
    (v.get("type")?.as_str()? == "tool_use")
        .then(|| v.get("id")?.as_str().map(str::to_string))
        .flatten()
}

/// A file's (device, inode), links not followed.
fn socket_id(path: &Path) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = fs::symlink_metadata(path)?;
    Ok((m.dev(), m.ino()))
}

fn hex(bytes: &[u8]) -> String {
    data_encoding::HEXLOWER.encode(bytes)
}

fn unhex(text: &[u8], len: usize) -> io::Result<Vec<u8>> {
    data_encoding::HEXLOWER
        .decode(text)
        .ok()
        .filter(|b| b.len() == len)
        .ok_or_else(|| io::Error::other("a malformed handshake"))
}

fn hex_field(line: &[u8], prefix: &str, len: usize) -> io::Result<Vec<u8>> {
    let rest = line
        .strip_prefix(prefix.as_bytes())
        .ok_or_else(|| io::Error::other("a malformed handshake"))?;
    unhex(rest, len)
}

/// How long `serve` looks for its client's next request before it blocks
/// on its input (see [`spin_for_input`]).
const SPIN: Duration = Duration::from_micros(50);

/// Look for input for a moment, without blocking: a client that sends
/// its next request as soon as it has a reply (an agent's tool loop, a
/// script) finds this process running, where waking it from a blocking
/// read costs tens of microseconds of scheduler latency on each request.
/// An idle client costs this process [`SPIN`] of CPU per request.
fn spin_for_input(stdin: &io::Stdin) {
    let until = Instant::now() + SPIN;
    while !crate::vault::fsync::readable_now(stdin) && Instant::now() < until {
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    /// Turns go in the order they were asked for: a thread that asks again
    /// at once does not pass the ones already waiting (with `std`'s mutex
    /// alone, a client streaming its requests took turn after turn).
    #[test]
    fn a_thread_asking_again_waits_for_those_already_waiting() {
        let turns = Turns::default();
        let order = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            let first = turns.enter();
            for t in 1..=3u8 {
                let (turns, order) = (&turns, &order);
                s.spawn(move || {
                    let _turn = turns.enter();
                    lock(order).push(t);
                });
            }
            // The three wait for their turns.
            while lock(&turns.at).next < 4 {
                std::thread::yield_now();
            }
            assert!(lock(&order).is_empty(), "ran during another's turn");
            drop(first);
            let _again = turns.enter();
            lock(&order).push(0);
        });
        let order = order.into_inner().unwrap();
        assert_eq!(order.len(), 4);
        assert_eq!(order[3], 0, "asked again and went first: {order:?}");
    }

    /// An authenticated peer's requests run under its own attribution, and
    /// a blank frame gets an error answer and changes nothing (the peer
    /// waits for one answer per frame).
    #[test]
    fn a_peer_is_answered_every_frame_and_its_blank_frame_changes_nothing() {
        use crate::crypto::KeyFileKey;
        use crate::vault::{InitSecret, VaultConfig};
        let tmp = tempfile::tempdir().unwrap();
        let who = Attribution {
            session: "leader".into(),
            actor: "unit".into(),
        };
        let mut vault = Vault::init(
            &tmp.path().join("v"),
            InitSecret::KeyFile(KeyFileKey::generate()),
            VaultConfig::default(),
            who,
        )
        .unwrap();
        let memory = Memory::new(Default::default(), None);
        let before = vault.walk().unwrap().count();
        let key = vault.keys().serve_key();
        let shared = Shared::new(&mut vault, &memory, 1 << 20).unwrap();
        let (ours, theirs) = UnixStream::pair().unwrap();
        let replies = std::thread::scope(|s| {
            s.spawn(|| serve_peer(&shared, theirs, 1));
            let mut w = ours.try_clone().unwrap();
            let mut r = BufReader::new(ours);
            let nf = random_bytes::<32>();
            writeln!(w, "hello {}", hex(&nf)).unwrap();
            let line = read_frame(&mut r, SMALL_LINE).unwrap();
            let mut parts = line.strip_prefix(b"leader ").unwrap().split(|&b| b == b' ');
            let nl = unhex(parts.next().unwrap(), 32).unwrap();
            let proof = unhex(parts.next().unwrap(), 32).unwrap();
            let nonces = [&nf[..], &nl[..]].concat();
            assert!(serve_tag_ok(&key, b"leader", &nonces, &proof));
            let tag = serve_tag(&key, b"follower", &nonces);
            writeln!(w, "follower {}", hex(&tag)).unwrap();
            assert_eq!(read_frame(&mut r, SMALL_LINE).unwrap(), b"ok");
            let header = r#"{"session":"peer","actor":"unit"}"#;
            let mut replies = Vec::new();
            for request in [
                "   ",
                r#"{"command":"create","path":"/memories/a.md","file_text":"x"}"#,
            ] {
                writeln!(w, "{header}\n{request}").unwrap();
                replies.push(read_frame(&mut r, 1 << 20).unwrap());
            }
            writeln!(w, "{BYE_ACK}").unwrap();
            replies
        });
        drop(shared);
        let blank: serde_json::Value = serde_json::from_slice(&replies[0]).unwrap();
        assert_eq!(blank["is_error"], true, "{blank}");
        assert!(blank["content"].as_str().unwrap().contains("empty"));
        let created: serde_json::Value = serde_json::from_slice(&replies[1]).unwrap();
        assert_eq!(created["is_error"], false, "{created}");
        // One commit more: the create, under the peer's session.
        let history: Vec<_> = vault.walk().unwrap().map(Result::unwrap).collect();
        assert_eq!(history.len(), before + 1);
        assert_eq!(history[0].1.session, "peer");
    }

    #[test]
    fn a_frame_cut_short_is_never_a_line() {
        let mut r = &b"{\"command\":\"view\"}"[..];
        assert!(read_frame(&mut r, 100).is_err());
        let mut r = &b"abc\ndef"[..];
        assert_eq!(read_frame(&mut r, 100).unwrap(), b"abc");
        assert!(read_frame(&mut r, 100).is_err());
    }

    #[test]
    fn a_frame_over_the_limit_is_refused_and_skipped() {
        let mut r = &b"0123456789\nok\n"[..];
        let e = read_frame(&mut r, 4).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert_eq!(read_frame(&mut r, 4).unwrap(), b"ok");
    }

    #[test]
    fn headers_carry_a_valid_attribution_only() {
        let ok = attribution(br#"{"session":"s-1","actor":"agent"}"#).unwrap();
        assert_eq!((ok.session.as_str(), ok.actor.as_str()), ("s-1", "agent"));
        for bad in [
            &br#"{"session":"","actor":"a"}"#[..],
            br#"{"session":"s","actor":"a\nb"}"#,
            br#"{"session":"s"}"#,
            b"not json",
        ] {
            assert!(attribution(bad).is_none());
        }
        let long = format!(r#"{{"session":"{}","actor":"a"}}"#, "x".repeat(129));
        assert!(attribution(long.as_bytes()).is_none());
    }

    #[test]
    fn tags_prove_the_key_the_role_and_the_nonces() {
        let k = [7u8; 32];
        let t = serve_tag(&k, b"leader", b"nonces");
        assert!(serve_tag_ok(&k, b"leader", b"nonces", &t));
        assert!(!serve_tag_ok(&k, b"follower", b"nonces", &t));
        assert!(!serve_tag_ok(&k, b"leader", b"nonceS", &t));
        assert!(!serve_tag_ok(&[8u8; 32], b"leader", b"nonces", &t));
    }

    #[test]
    fn an_error_reply_keeps_the_tool_use_id() {
        let line = br#"{"type":"tool_use","id":"toolu_1","name":"memory","input":{}}"#;
        assert_eq!(request_id(line).as_deref(), Some("toolu_1"));
        assert_eq!(request_id(br#"{"command":"view"}"#), None);
    }

    #[test]
    fn a_long_line_without_a_newline_is_read_through_and_refused() {
        let data = vec![b'x'; 10_000];
        let mut r = BufReader::with_capacity(64, &data[..]);
        assert!(read_frame(&mut r, 100).is_err());
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
    }
}
