//! The one lock type of the vault.

use std::fs::File;

/// A `flock` held while the guard lives: the one lock type of the vault,
/// for the writer lock (`memvault/lock`: exclusive for a mutation, a
/// checkpoint or a recovery; shared for access-log appends, which may run
/// beside each other but not beside the sweeper's compaction) and the
/// history index's lock. Limitations: `flock` is advisory; it orders
/// memvault processes, not other programs writing the vault directory
/// (what they change is judged by the MACs and the log's checks).
#[must_use = "the lock is released when the guard is dropped"]
pub(crate) struct FileLock(File);

impl FileLock {
    /// Wait for the lock on `file` (`memvault/lock`), exclusively.
    pub fn exclusive(file: &File) -> std::io::Result<FileLock> {
        let file = file.try_clone()?;
        file.lock()?;
        Ok(FileLock(file))
    }

    /// Wait for the lock on `file`, shared with other shared holders.
    pub fn shared(file: &File) -> std::io::Result<FileLock> {
        let file = file.try_clone()?;
        file.lock_shared()?;
        Ok(FileLock(file))
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}
