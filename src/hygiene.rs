//! Process hygiene while a vault is unlocked: no core dumps.
//!
//! Owns: the only libc calls of memvault. [`disable_core_dumps`] sets
//! `RLIMIT_CORE` to 0 (soft and hard) and, on Linux, `PR_SET_DUMPABLE` to 0,
//! which also stops other processes of the same user from attaching with
//! ptrace or reading `/proc/<pid>/mem`. [`widen_pipe`] is the one
//! call here that is about speed, not hygiene: a larger pipe buffer for
//! `memvault redact`'s output. [`kill_group`] ends a git command that ran
//! past `--remote-timeout` with everything it started.
//!
//! Promises: called before any secret is read, a crash of the process
//! writes no core file holding keys or plaintext.
//!
//! Does not protect: swap (memory is not locked), a debugger run by root,
//! or a kernel `core_pattern` that pipes to a handler ignoring the limit
//! (`PR_SET_DUMPABLE` 0 covers that case on Linux).

use std::io;

/// Start `cmd`'s child as the leader of a new session (setsid(2) between
/// fork and exec): it has no controlling terminal, so nothing it runs
/// can stop on one or prompt there, and its process group's id is its
/// pid, so [`kill_group`] ends it with everything it started.
pub fn in_new_session(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec, where
    // only async-signal-safe calls are allowed: setsid(2) is one, and the
    // closure touches no memory shared with the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Whether the child `pid` has exited, without reaping it (waitid(2)
/// with `WNOWAIT`): until it is reaped, neither its pid nor its process
/// group's id can be reused, so [`kill_group`] can still name them.
pub fn has_exited(pid: u32) -> io::Result<bool> {
    // SAFETY: siginfo_t is plain data, for which all zeros is a valid
    // value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid(2) writes only into `info`, which lives across the
    // call; the flags make it return at once and leave the child as is.
    let r = unsafe {
        libc::waitid(
            libc::P_PID,
            libc::id_t::from(pid),
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: with WNOHANG, waitid zeroes si_pid when the child has not
    // exited, and sets it when it has; reading it is reading plain data.
    Ok(unsafe { info.si_pid() } != 0)
}

/// SIGKILL every process of the process group `group` (a child started
/// by [`in_new_session`], whose pid is its group's id). Errors are
/// ignored: the group may be gone already.
pub fn kill_group(group: u32) {
    let Ok(group) = libc::pid_t::try_from(group) else {
        return;
    };
    if group <= 1 {
        return;
    }
    // SAFETY: kill(2) takes plain integers and touches no memory of ours;
    // a negative pid names the process group, never this process's own
    // (the group is a child's, made by `in_new_session`).
    unsafe {
        libc::kill(-group, libc::SIGKILL);
    }
}

/// Turn core dumps off for this process (and its children, which inherit
/// the limit). Safe to call more than once.
pub fn disable_core_dumps() -> io::Result<()> {
    #[cfg(unix)]
    {
        let zero = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `setrlimit` reads the `rlimit` struct we pass by pointer,
        // which lives for the whole call; it has no other memory effects.
        if unsafe { libc::setrlimit(libc::RLIMIT_CORE, &zero) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `prctl(PR_SET_DUMPABLE, 0)` takes integer arguments only
        // (the unused ones as 0) and changes a flag of this process.
        if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Bytes asked for a pipe's buffer: what an unprivileged
/// process may set by default on Linux (`/proc/sys/fs/pipe-max-size`).
#[cfg(target_os = "linux")]
const PIPE_SIZE: libc::c_int = 1 << 20;

/// When `fd` is a pipe, asks the kernel for a 1 MiB buffer instead of
/// the default 64 KiB, so that a process streaming megabytes through it
/// wakes its reader about sixteen times less often. Returns whether the
/// pipe now has that size; does nothing when `fd` is not a pipe or the
/// system refuses.
#[cfg(unix)]
pub fn widen_pipe(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: `fcntl(fd, F_SETPIPE_SZ, n)` takes integer arguments
        // only (a descriptor borrowed for the call, so open) and changes
        // the buffer size of the pipe behind it; on a descriptor that is
        // not a pipe it fails with EBADF and changes nothing.
        (unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_SIZE) }) >= PIPE_SIZE
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = fd;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHILD: &str = "MEMVAULT_HYGIENE_CHILD";

    #[cfg(target_os = "linux")]
    #[test]
    fn a_pipe_is_widened_and_a_file_left_alone() {
        use std::os::fd::{AsFd, AsRawFd};
        let (_r, w) = std::io::pipe().unwrap();
        // SAFETY: integer arguments only, on a pipe this test owns.
        let size = || unsafe { libc::fcntl(w.as_raw_fd(), libc::F_GETPIPE_SZ) };
        assert!(size() < PIPE_SIZE, "default pipe size {}", size());
        assert!(widen_pipe(w.as_fd()));
        assert_eq!(size(), PIPE_SIZE);
        let file = tempfile::tempfile().unwrap();
        assert!(!widen_pipe(file.as_fd()));
    }

    /// Runs in a child process (see below): the test binary itself keeps
    /// its core-dump setting.
    #[test]
    fn core_dumps_off_in_child() {
        if std::env::var_os(CHILD).is_none() {
            return;
        }
        disable_core_dumps().unwrap();
        let mut lim = libc::rlimit {
            rlim_cur: 1,
            rlim_max: 1,
        };
        // SAFETY: `getrlimit` writes into the struct we own.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_CORE, &mut lim) }, 0);
        assert_eq!((lim.rlim_cur, lim.rlim_max), (0, 0));
        #[cfg(target_os = "linux")]
        {
            // SAFETY: integer arguments only; returns the flag.
            assert_eq!(unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) }, 0);
        }
        // Twice is fine.
        disable_core_dumps().unwrap();
    }

    #[test]
    fn core_dumps_are_disabled() {
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "hygiene::tests::core_dumps_off_in_child",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("1 passed"), "{text}");
    }

    #[test]
    fn secret_types_wipe_on_drop() {
        use crate::crypto::{DataKey, FileKey, KeyFileKey, Passphrase};
        use zeroize::{Zeroize, ZeroizeOnDrop};
        fn wipes<T: ZeroizeOnDrop + Zeroize>() {}
        wipes::<DataKey>();
        wipes::<FileKey>();
        wipes::<KeyFileKey>();
        wipes::<Passphrase>();
        // Zeroize, which drop runs, clears the bytes of each.
        let mut key = KeyFileKey::from_bytes(&[0x5a; 32]).unwrap();
        key.zeroize();
        assert_eq!(key.expose_secret(), &[0u8; 32]);
        let mut pass = Passphrase::new("hunter2".to_owned());
        pass.zeroize();
        assert_eq!(pass.expose_secret(), "");
    }
}
