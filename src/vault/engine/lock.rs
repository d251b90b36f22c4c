//! The one lock type of the vault.

use std::fs::File;
use std::sync::Arc;

/// A `flock` held while the guard lives: the one lock type of the vault,
/// for the writer lock (`memvault/lock`: exclusive for a mutation, a
/// checkpoint or a recovery; shared for access-log appends, which may run
/// beside each other but not beside the sweeper's compaction) and the
/// history index's lock. Limitations: `flock` is advisory; it orders
/// memvault processes, not other programs writing the vault directory
/// (what they change is judged by the MACs and the log's checks).
#[must_use = "the lock is released when the guard is dropped"]
pub(crate) struct FileLock(Arc<File>);

impl FileLock {
    /// Wait for the lock on `file` (`memvault/lock`), exclusively.
    pub fn exclusive(file: &File) -> std::io::Result<FileLock> {
        FileLock::exclusive_on(&Arc::new(file.try_clone()?))
    }

    /// [`exclusive`](Self::exclusive) on a descriptor kept open, without a
    /// duplicate of it (two system calls fewer per request: a `flock`
    /// belongs to the open file, which a duplicate shares anyway).
    pub fn exclusive_on(file: &Arc<File>) -> std::io::Result<FileLock> {
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => said_while(|| file.lock())?,
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
        Ok(FileLock(Arc::clone(file)))
    }

    /// The lock on `file`, exclusively, if no one else holds it now
    /// (None: someone does).
    pub fn try_exclusive_on(file: &Arc<File>) -> std::io::Result<Option<FileLock>> {
        match file.try_lock() {
            Ok(()) => Ok(Some(FileLock(Arc::clone(file)))),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }

    /// Wait for the lock on `file`, shared with other shared holders.
    pub fn shared_on(file: &Arc<File>) -> std::io::Result<FileLock> {
        match file.try_lock_shared() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => said_while(|| file.lock_shared())?,
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
        Ok(FileLock(Arc::clone(file)))
    }
}

/// How long a wait for a lock goes unsaid.
const SAY_AFTER: std::time::Duration = std::time::Duration::from_secs(3);

/// Run `wait` (a blocking lock), saying on stderr, once, if it lasts past
/// [`SAY_AFTER`]: a process that holds the lock for long (a `gc`, a
/// stuck or stopped one) otherwise leaves this one silent, a view
/// included. Only when the lock was taken already: the common case costs
/// no thread.
fn said_while(wait: impl FnOnce() -> std::io::Result<()>) -> std::io::Result<()> {
    let (done, waiting) = std::sync::mpsc::channel::<()>();
    // Not joined: a caller that holds stderr locked (an embedding
    // program) would wait for the message that waits for it.
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = waiting.recv_timeout(SAY_AFTER) {
            eprintln!(
                "memvault: waiting for the vault's lock, which another memvault process holds (a long command such as `gc` or `expire`, or a process that is stuck or stopped); this goes on when it lets go"
            );
        }
    });
    let result = wait();
    drop(done);
    result
}

impl Drop for FileLock {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}
