//! `memvault serve` when several processes serve one vault.
//!
//! Each `serve` process answers its own client: one JSON request line in,
//! one `tool_result` line out (see [`crate::protocol`]). The first one on a
//! vault becomes the *leader*: it holds `memvault/serve.lock` and listens
//! on `memvault/serve.sock` (mode 0600, in the vault's own directory). The
//! others are *followers*: they hand each request of their client to the
//! leader over that socket and relay its reply. The leader runs the
//! requests of all its clients in batches, with one `fdatasync` of the log
//! per batch (group commit), and no process loads objects another wrote.
//!
//! What holds:
//! - a reply leaves the leader only after the log records of its batch are
//!   synced;
//! - before anything else, the leader and a follower each prove they hold
//!   the vault's keys (HMAC over both sides' random nonces under
//!   [`VaultKeys::serve_key`]); a peer that cannot is dropped, and a
//!   follower that cannot reach a genuine leader runs requests itself;
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

use std::collections::{HashMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use zeroize::Zeroizing;

use crate::crypto::{random_bytes, serve_tag, serve_tag_ok};
use crate::memory::{Memory, Store, ToolResult};
use crate::protocol::{self, Line, Reply};
use crate::vault::{Attribution, Vault};

const SOCKET: &str = "memvault/serve.sock";
const LEAD_LOCK: &str = "memvault/serve.lock";
/// Requests run together under one sync, at most.
const MAX_BATCH: usize = 64;
const BYE: &str = r#"{"memvault":"bye"}"#;
const BYE_ACK: &str = r#"{"memvault":"bye_ack"}"#;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a leader that is leaving waits for its followers' last
/// requests before it exits anyway.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a process that runs requests itself looks for a leader.
const RETRY_EVERY: Duration = Duration::from_secs(1);
/// A handshake line or a request header, at most.
const SMALL_LINE: usize = 1024;
/// A reply line a follower accepts, at most (view output is bounded far
/// below this).
const MAX_REPLY: usize = 256 << 20;

const UNKNOWN_OUTCOME: &str = "Error: the memvault serve process that was running this command for the vault stopped before it answered, so the command may or may not have been applied. View the file to check before you repeat it.";

enum Event {
    Own(Line),
    OwnEof,
    Peer(u64, Attribution, Line),
    PeerJoined(u64, UnixStream),
    PeerGone(u64),
}

enum Target {
    Own,
    Peer(u64),
}

/// Serve the process's own client (stdin/stdout) until its input ends.
pub(crate) fn run(vault: &mut Vault, memory: &Memory, max_line: usize) -> io::Result<()> {
    let (tx, rx) = mpsc::channel();
    let (ack, ack_rx) = mpsc::channel();
    spawn_stdin(tx.clone(), ack_rx, max_line);
    let own = vault.attribution().clone();
    let mut rt = Runtime {
        vault,
        memory,
        own,
        max_line,
        tx,
        ack,
        mode: Mode::Local,
        pending_own: VecDeque::new(),
        last_try: Instant::now(),
        peers: HashMap::new(),
        own_eof: false,
        leaving: None,
        test_pause: std::env::var("MEMVAULT_TEST_LEADER_PAUSE_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map(Duration::from_millis),
    };
    rt.mode = rt.elect(true);
    rt.main_loop(&rx);
    rt.vault.set_attribution(rt.own.clone());
    Ok(())
}

/// Read the client's lines, each only once the one before is answered
/// (`ack`), as a pipe's reader would: a client that streams requests is
/// held back by the pipe, not buffered here.
fn spawn_stdin(tx: Sender<Event>, ack: Receiver<()>, max_line: usize) {
    std::thread::spawn(move || {
        let stdin = io::stdin();
        let mut input = stdin.lock();
        loop {
            match protocol::read_bounded(&mut input, max_line) {
                Ok(Line::Eof) | Err(_) => {
                    let _ = tx.send(Event::OwnEof);
                    return;
                }
                Ok(line) => {
                    if tx.send(Event::Own(line)).is_err() || ack.recv().is_err() {
                        return;
                    }
                }
            }
        }
    });
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
    stop: Arc<AtomicBool>,
}

struct Runtime<'a> {
    vault: &'a mut Vault,
    memory: &'a Memory,
    own: Attribution,
    max_line: usize,
    tx: Sender<Event>,
    /// Lets the stdin reader read the next line (see [`spawn_stdin`]).
    ack: Sender<()>,
    mode: Mode,
    /// This process's own requests waiting for the one before them to be
    /// answered: its client has at most one request running at a time,
    /// so a crash lands at most one request it was not answered for.
    pending_own: VecDeque<Event>,
    last_try: Instant,
    peers: HashMap<u64, UnixStream>,
    own_eof: bool,
    /// When this leader started leaving.
    leaving: Option<Instant>,
    /// `MEMVAULT_TEST_LEADER_PAUSE_MS`: a leader waits this long after
    /// running a follower's request, before its sync and reply. It exists
    /// only so tests can kill a leader with a request in flight.
    test_pause: Option<Duration>,
}

impl Runtime<'_> {
    fn main_loop(&mut self, rx: &Receiver<Event>) {
        loop {
            let ev = match self.leaving {
                Some(since) => {
                    if self.peers.is_empty() {
                        return;
                    }
                    let left = LEAVE_TIMEOUT.saturating_sub(since.elapsed());
                    match rx.recv_timeout(left) {
                        Ok(ev) => ev,
                        Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return,
                    }
                }
                None => match self.pending_own.pop_front() {
                    Some(ev) => ev,
                    None => match rx.recv() {
                        Ok(ev) => ev,
                        Err(_) => return,
                    },
                },
            };
            if matches!(self.mode, Mode::Leader(_)) {
                self.lead_batch(ev, rx);
                if self.own_eof && self.leaving.is_none() {
                    self.start_leaving();
                }
                continue;
            }
            match ev {
                Event::Own(line) => {
                    self.one(line);
                    let _ = self.ack.send(());
                    if self.own_eof {
                        // Its client is gone (the reply could not be written).
                        return;
                    }
                }
                Event::OwnEof => return,
                // Only a leader has peers; a stale event is ignored.
                Event::Peer(..) | Event::PeerJoined(..) | Event::PeerGone(_) => {}
            }
        }
    }

    /// Write a reply to this process's own client, before anything else
    /// of its runs. A client that is gone ends serving.
    fn send_own(&mut self, reply: &str) {
        let stdout = io::stdout();
        let mut out = stdout.lock();
        if out.write_all(reply.as_bytes()).is_err() || out.flush().is_err() {
            self.own_eof = true;
        }
    }

    /// The reply to one line, run here with `who`'s attribution (`None`
    /// for a blank line, which gets no reply).
    fn reply(&mut self, who: &Attribution, line: Line) -> Option<String> {
        let reply = match line {
            Line::Eof => return None,
            Line::TooLong(n) => protocol::too_long_reply(n, self.max_line),
            Line::Ok(bytes) => {
                if bytes.iter().all(u8::is_ascii_whitespace) {
                    return None;
                }
                self.vault.set_attribution(who.clone());
                protocol::handle_line(self.memory, &mut *self.vault, &bytes)
            }
        };
        Some(reply.to_line() + "\n")
    }

    /// One request of this process's own client, as a follower or here.
    fn one(&mut self, line: Line) {
        self.one_try(line, true);
    }

    /// `retry`: a request the leader never got may go to the next one
    /// (once; after that it runs here).
    fn one_try(&mut self, line: Line, retry: bool) {
        if matches!(self.mode, Mode::Local) && self.last_try.elapsed() > RETRY_EVERY {
            self.mode = self.elect(false);
        }
        let own = self.own.clone();
        let bytes = match line {
            Line::Ok(b) if !b.iter().all(u8::is_ascii_whitespace) => b,
            // Too long or blank: answered here, nothing to run.
            other => {
                if let Some(r) = self.reply(&own, other) {
                    self.send_own(&r);
                }
                return;
            }
        };
        match std::mem::replace(&mut self.mode, Mode::Local) {
            Mode::Leader(l) => {
                // Promoted while the line waited.
                self.mode = Mode::Leader(l);
                let (_tx, rx) = mpsc::channel();
                self.lead_batch(Event::Own(Line::Ok(bytes)), &rx);
            }
            Mode::Local => {
                if let Some(r) = self.reply(&own, Line::Ok(bytes)) {
                    self.send_own(&r);
                    self.vault.after_reply();
                }
            }
            Mode::Follower(mut f) => match f.call(&own, &bytes) {
                Ok(reply) => {
                    self.mode = Mode::Follower(f);
                    self.send_own(&reply);
                }
                Err(Sent::No) => {
                    drop(f);
                    if retry {
                        self.mode = self.elect(true);
                    }
                    self.one_try(Line::Ok(bytes), false);
                }
                Err(Sent::Unknown) => {
                    drop(f);
                    let r = Reply {
                        tool_use_id: request_id(&bytes),
                        result: ToolResult::error(UNKNOWN_OUTCOME),
                    };
                    self.send_own(&(r.to_line() + "\n"));
                    self.mode = self.elect(true);
                }
            },
        }
    }

    /// Lead: run `first` and whatever else is waiting (up to
    /// [`MAX_BATCH`] requests), sync once, then send every reply.
    fn lead_batch(&mut self, first: Event, rx: &Receiver<Event>) {
        let is_own = |ev: &Event| matches!(ev, Event::Own(_) | Event::OwnEof);
        let mut has_own = is_own(&first);
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                // One own request per batch (see `pending_own`); followers
                // have one in flight each anyway.
                Ok(ev) if is_own(&ev) && (has_own || !self.pending_own.is_empty()) => {
                    self.pending_own.push_back(ev);
                }
                Ok(ev) => {
                    has_own |= is_own(&ev);
                    batch.push(ev);
                }
                Err(_) => break,
            }
        }
        let mut replies: Vec<(Target, String)> = Vec::new();
        let mut gone = Vec::new();
        let mut owns = 0;
        self.vault.defer_sync(true);
        for ev in batch {
            match ev {
                Event::Own(line) => {
                    owns += 1;
                    let own = self.own.clone();
                    if let Some(r) = self.reply(&own, line) {
                        replies.push((Target::Own, r));
                    }
                }
                Event::OwnEof => self.own_eof = true,
                Event::Peer(id, who, line) => {
                    let r = self.reply(&who, line).unwrap_or_else(|| {
                        protocol::handle_line(self.memory, &mut *self.vault, b"").to_line() + "\n"
                    });
                    replies.push((Target::Peer(id), r));
                    if let Some(pause) = self.test_pause {
                        std::thread::sleep(pause);
                    }
                }
                Event::PeerJoined(id, mut w) => {
                    if self.leaving.is_some() {
                        let _ = w.write_all(format!("{BYE}\n").as_bytes());
                    }
                    self.peers.insert(id, w);
                }
                Event::PeerGone(id) => gone.push(id),
            }
        }
        self.vault.set_attribution(self.own.clone());
        let synced = self.vault.sync_deferred();
        self.vault.defer_sync(false);
        if let Err(e) = synced {
            // Nothing in this batch is acknowledged: every reply says so.
            for (_, r) in &mut replies {
                let id = serde_json::from_str::<Value>(r)
                    .ok()
                    .and_then(|v| v["tool_use_id"].as_str().map(str::to_string));
                *r = Reply {
                    tool_use_id: id,
                    result: ToolResult::error(format!("Error: {e}")),
                }
                .to_line()
                    + "\n";
            }
        }
        for (target, r) in replies {
            match target {
                Target::Own => {
                    self.send_own(&r);
                }
                Target::Peer(id) => {
                    if let Some(w) = self.peers.get_mut(&id) {
                        let _ = w.write_all(r.as_bytes());
                    }
                }
            }
        }
        for id in gone {
            self.peers.remove(&id);
        }
        for _ in 0..owns {
            let _ = self.ack.send(());
        }
        self.vault.after_reply();
    }

    /// Stop leading: no new followers, release the lead, tell each
    /// follower. Their last requests are still answered (see `main_loop`).
    fn start_leaving(&mut self) {
        self.leaving = Some(Instant::now());
        if let Mode::Leader(l) = &mut self.mode {
            l.stop.store(true, Ordering::SeqCst);
            // Wake the acceptor so it sees `stop`, then take the name away.
            let _ = UnixStream::connect(&l.socket);
            let _ = fs::remove_file(&l.socket);
            l.lock = None;
        }
        for w in self.peers.values_mut() {
            let _ = w.write_all(format!("{BYE}\n").as_bytes());
        }
    }

    /// Lead if nobody does, else follow the leader, else run requests here.
    /// `wait`: give a leader that is starting a moment to listen.
    fn elect(&mut self, wait: bool) -> Mode {
        self.last_try = Instant::now();
        let dir = self.vault.dir().to_path_buf();
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(LEAD_LOCK));
        if let Ok(lock) = lock
            && lock.try_lock().is_ok()
        {
            return match self.listen(&dir) {
                Ok((socket, stop)) => Mode::Leader(Leader {
                    lock: Some(lock),
                    socket,
                    stop,
                }),
                Err(_) => Mode::Local,
            };
        }
        let key = self.vault.keys().serve_key();
        let tries = if wait { 50 } else { 1 };
        for i in 0..tries {
            match Follower::connect(&dir.join(SOCKET), &key) {
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

    fn listen(&mut self, dir: &Path) -> io::Result<(PathBuf, Arc<AtomicBool>)> {
        let socket = dir.join(SOCKET);
        // Left by a leader that died: we hold the lead lock now.
        let _ = fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket)?;
        fs::set_permissions(&socket, fs::Permissions::from_mode(0o600))?;
        let stop = Arc::new(AtomicBool::new(false));
        let key = Arc::new(self.vault.keys().serve_key());
        let tx = self.tx.clone();
        let max_line = self.max_line;
        let stop_flag = stop.clone();
        std::thread::spawn(move || {
            for (id, conn) in (0u64..).zip(listener.incoming()) {
                if stop_flag.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (tx, key) = (tx.clone(), key.clone());
                std::thread::spawn(move || serve_peer(conn, id, &key, &tx, max_line));
            }
        });
        Ok((socket, stop))
    }
}

/// The leader's side of one follower: handshake, then its requests into
/// the leader's queue until it acknowledges the leader's leaving or goes.
fn serve_peer(conn: UnixStream, id: u64, key: &[u8; 32], tx: &Sender<Event>, max_line: usize) {
    let Ok(read_half) = conn.try_clone() else {
        return;
    };
    let mut r = BufReader::new(read_half);
    let mut w = conn;
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
    let Ok(writer) = w.try_clone() else { return };
    if tx.send(Event::PeerJoined(id, writer)).is_err() {
        return;
    }
    while let Ok(header) = read_frame(&mut r, SMALL_LINE) {
        if header == BYE_ACK.as_bytes() {
            break;
        }
        let Some(who) = attribution(&header) else {
            break;
        };
        let line = match read_line(&mut r, max_line) {
            Ok((bytes, _)) => Line::Ok(bytes),
            // Over the limit: the rest of the line was read and dropped.
            Err(Frame::TooLong(n)) => Line::TooLong(n),
            Err(Frame::Io(_)) => break,
        };
        if tx.send(Event::Peer(id, who, line)).is_err() {
            return;
        }
    }
    let _ = tx.send(Event::PeerGone(id));
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
    fn connect(socket: &Path, key: &Zeroizing<[u8; 32]>) -> io::Result<Follower> {
        let mut s = UnixStream::connect(socket)?;
        s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
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

/// Why a frame was not read.
enum Frame {
    /// The line was over the limit (its length); it was read and dropped.
    TooLong(usize),
    Io(io::Error),
}

/// One `\n`-terminated line of at most `max` bytes, without the newline,
/// and its length. A line cut short by the end of the stream is an error,
/// never a line; a longer line is read to its end and refused.
fn read_line(r: &mut impl BufRead, max: usize) -> Result<(Vec<u8>, usize), Frame> {
    let mut buf = Vec::new();
    let mut total = 0usize;
    let mut too_long = false;
    loop {
        let chunk = r.fill_buf().map_err(Frame::Io)?;
        if chunk.is_empty() {
            return Err(Frame::Io(io::ErrorKind::UnexpectedEof.into()));
        }
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        total += take;
        if !too_long {
            if buf.len() + take > max {
                too_long = true;
                buf = Vec::new();
            } else {
                buf.extend_from_slice(&chunk[..take]);
            }
        }
        r.consume(if done { take + 1 } else { take });
        if done {
            return if too_long {
                Err(Frame::TooLong(total))
            } else {
                Ok((buf, total))
            };
        }
    }
}

/// [`read_line`] for the handshake and control lines.
fn read_frame(r: &mut impl BufRead, max: usize) -> io::Result<Vec<u8>> {
    match read_line(r, max) {
        Ok((line, _)) => Ok(line),
        Err(Frame::TooLong(_)) => Err(io::ErrorKind::InvalidData.into()),
        Err(Frame::Io(e)) => Err(e),
    }
}

/// A request header from a follower: the attribution to run under.
fn attribution(header: &[u8]) -> Option<Attribution> {
    let v: Value = serde_json::from_slice(header).ok()?;
    let field = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty() && s.len() <= 128 && !s.chars().any(char::is_control))
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

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

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
