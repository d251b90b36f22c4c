//! The time memvault stamps on commits and access records, and that
//! expiry measures a file's age against: milliseconds since the Unix epoch.
//!
//! The system clock by default. A library user (or a unit test) injects
//! another with [`set`], for instance a [`ManualClock`] to expire files
//! without waiting 90 days; [`use_system`] goes back. The clock is one per
//! process, as the system's is: every vault handle in the process reads it.
//!
//! A build with the `test-hooks` cargo feature (tests only; off by default,
//! so never a shipped binary) also reads `MEMVAULT_TEST_NOW_MS`, once: a
//! clock set by [`set`] still wins. Without the feature nothing here reads
//! the environment.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// A source of the time.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system's clock (0 if it reads before 1970).
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }
}

/// A clock that says what it was last set to.
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock standing at `ms`.
    pub fn new(ms: u64) -> ManualClock {
        ManualClock(AtomicU64::new(ms))
    }

    /// Set it to `ms` (it may go back).
    pub fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }

    /// Move it `ms` forward.
    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

static INJECTED: RwLock<Option<Arc<dyn Clock>>> = RwLock::new(None);

/// Read the time from `clock`, from now on, in this whole process.
pub fn set(clock: Arc<dyn Clock>) {
    *INJECTED.write().unwrap_or_else(|e| e.into_inner()) = Some(clock);
}

/// Go back to the system clock (or, in a `test-hooks` build, to
/// `MEMVAULT_TEST_NOW_MS` when it is set).
pub fn use_system() {
    *INJECTED.write().unwrap_or_else(|e| e.into_inner()) = None;
}

/// The time now, by the clock in use.
pub fn now_ms() -> u64 {
    if let Some(clock) = INJECTED.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
        return clock.now_ms();
    }
    #[cfg(feature = "test-hooks")]
    if let Some(ms) = env_clock() {
        return ms;
    }
    SystemClock.now_ms()
}

/// `MEMVAULT_TEST_NOW_MS`, read once (`test-hooks` builds only).
#[cfg(feature = "test-hooks")]
fn env_clock() -> Option<u64> {
    static ENV: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *ENV.get_or_init(|| {
        std::env::var("MEMVAULT_TEST_NOW_MS")
            .ok()
            .and_then(|v| v.parse().ok())
    })
}

#[cfg(test)]
mod tests {
    //! The clock is one per process, so tests that set it (or the
    //! environment) run in a child process: this test binary again, with
    //! one `#[ignore]`d test selected, which does nothing when run alone.

    use super::*;
    use std::process::Command;

    /// Run the ignored test `name` of this module in a child process with
    /// `env` set, and say whether it passed.
    fn in_child(name: &str, env: &[(&str, &str)]) -> bool {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "--test-threads=1"])
            // This module's test path within the crate's test binary.
            .arg(format!(
                "{}::{name}",
                module_path!().trim_start_matches("memvault::")
            ))
            .envs(env.iter().copied())
            .env("MEMVAULT_CLOCK_CHILD", "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("1 passed") || stdout.contains("1 failed"),
            "{stdout}"
        );
        out.status.success()
    }

    fn is_child() -> bool {
        std::env::var_os("MEMVAULT_CLOCK_CHILD").is_some()
    }

    fn near_system_time(ms: u64) -> bool {
        SystemClock.now_ms().abs_diff(ms) < 60_000
    }

    #[test]
    #[ignore = "run by set_clock_is_read_by_now_ms_until_use_system"]
    fn child_set_and_use_system() {
        if !is_child() {
            return;
        }
        let clock = Arc::new(ManualClock::new(1_000));
        set(clock.clone());
        assert_eq!(now_ms(), 1_000);
        clock.advance(500);
        assert_eq!(now_ms(), 1_500);
        clock.set(7);
        assert_eq!(now_ms(), 7);
        use_system();
        assert!(near_system_time(now_ms()));
    }

    #[test]
    fn set_clock_is_read_by_now_ms_until_use_system() {
        assert!(in_child("child_set_and_use_system", &[]));
    }

    #[test]
    #[ignore = "run by the memvault_test_now_ms tests"]
    fn child_env_clock() {
        if !is_child() {
            return;
        }
        // The environment holds MEMVAULT_TEST_NOW_MS=5: a test-hooks build
        // reads it (an injected clock still wins), a default one never does.
        if cfg!(feature = "test-hooks") {
            assert_eq!(now_ms(), 5);
            set(Arc::new(ManualClock::new(9)));
            assert_eq!(now_ms(), 9);
        } else {
            assert!(near_system_time(now_ms()));
        }
    }

    #[cfg(not(feature = "test-hooks"))]
    #[test]
    fn memvault_test_now_ms_is_ignored_without_test_hooks() {
        assert!(in_child(
            "child_env_clock",
            &[("MEMVAULT_TEST_NOW_MS", "5")]
        ));
    }

    #[cfg(feature = "test-hooks")]
    #[test]
    fn memvault_test_now_ms_is_read_with_test_hooks() {
        assert!(in_child(
            "child_env_clock",
            &[("MEMVAULT_TEST_NOW_MS", "5")]
        ));
    }

    #[test]
    fn manual_clock_goes_where_it_is_set() {
        let c = ManualClock::new(10);
        c.advance(5);
        assert_eq!(c.now_ms(), 15);
        c.set(3);
        assert_eq!(c.now_ms(), 3);
    }
}
