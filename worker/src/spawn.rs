//! Starting a task's process without copying the worker: `clone(CLONE_VM | CLONE_VFORK)`.
//!
//! A `fork` of the worker copies the page tables of its whole address space, makes every page
//! its threads write until the child's `execve` a copy-on-write fault, and the `execve` then
//! unmaps the copy: most of what starting a short process costs the worker. A child made with
//! `CLONE_VM | CLONE_VFORK` runs on the worker's memory, on a stack of its own, while the
//! thread that made it waits until the child has called `execve` or exited (what
//! `posix_spawn` does; its fixed set of actions cannot start a session, join a cgroup, set
//! rlimits, change the user and ask for the parent-death signal, which the child does here,
//! in the order `process.rs` explains).
//!
//! The child only makes system calls on memory prepared before the clone: no allocation, no
//! lock, nothing a thread of the worker could hold; it changes its user with the raw system
//! calls, as libc's wrappers would signal the worker's threads. Its stack is a mapping of its
//! own below a guard page. All signals are blocked in the calling
//! thread across the clone; the child sets every handled signal back to its default (its
//! handler table is its own) and unblocks them just before `execve`, so no handler of the
//! worker ever runs on the child's stack. A failure before `execve` is written to memory the
//! parent reads once the child is gone, and the child exits with 127.
//!
//! The program is found as `execvp` would, along the `PATH` of the task's environment
//! (`/bin:/usr/bin` when it has none), trying each candidate with `execve` in the child, so the
//! permissions that decide are those of the task's user; a candidate that is not an
//! executable format (`ENOEXEC`) runs with `/bin/sh`.

use std::collections::BTreeMap;
use std::ffi::{CString, c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

use crate::isolation::limits::ChildLimits;

/// A process started by [`spawn`]. Dropped before it was waited for, it is killed (SIGKILL)
/// and reaped in the background.
pub struct Child {
    pid: i32,
    pidfd: AsyncFd<OwnedFd>,
    status: Option<ExitStatus>,
    pub stdin: Option<pipe::Sender>,
    pub stdout: Option<pipe::Receiver>,
    pub stderr: Option<pipe::Receiver>,
}

impl Child {
    /// The process id, until it has been waited for.
    pub fn id(&self) -> Option<u32> {
        self.status.is_none().then_some(self.pid as u32)
    }

    /// Waits for the process to exit and reaps it; the same status again after that.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        loop {
            if let Some(status) = self.try_reap()? {
                return Ok(status);
            }
            // The pidfd is readable once the process has exited.
            let mut ready = self.pidfd.readable().await?;
            ready.clear_ready();
        }
    }

    fn try_reap(&mut self) -> std::io::Result<Option<ExitStatus>> {
        let mut status: c_int = 0;
        // SAFETY: waitpid on our own child's pid with WNOHANG; `status` is a valid out pointer.
        let reaped = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
        if reaped < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if reaped == 0 {
            return Ok(None);
        }
        let status = ExitStatus::from_raw(status);
        self.status = Some(status);
        Ok(Some(status))
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        let pid = self.pid;
        // SAFETY: our own unreaped child: the pid cannot have been reused.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let reap = move || {
            let mut status: c_int = 0;
            // SAFETY: waits for our own child, which was just killed.
            unsafe { libc::waitpid(pid, &mut status, 0) };
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn_blocking(reap);
            }
            Err(_) => reap(),
        }
    }
}

/// Everything the child reads, made before the clone.
struct ChildArgs<'a> {
    stdin: c_int,
    stdout: c_int,
    stderr: c_int,
    dir: CString,
    /// Paths to `execve`, in `PATH` order.
    candidates: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    /// `/bin/sh`, a slot for the candidate, then argv[1..]: for `ENOEXEC`.
    sh_argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    limits: &'a ChildLimits,
    user: Option<(u32, u32)>,
    /// The errno of the step that failed, written by the child.
    error: c_int,
}

const SH: &std::ffi::CStr = c"/bin/sh";

/// Starts `argv` in `dir` with exactly `env`, stdin from a pipe when `stdin` (else
/// `/dev/null`), stdout and stderr to pipes. `Ok(None)` when this kernel cannot make such a
/// child (no `CLONE_PIDFD`) or a seccomp filter refuses it: the caller starts it another way.
pub fn spawn(
    argv: &[String],
    env: &BTreeMap<String, String>,
    dir: &Path,
    stdin: bool,
    limits: &ChildLimits,
    user: Option<(u32, u32)>,
) -> std::io::Result<Option<Child>> {
    let cstring = |s: &[u8]| {
        CString::new(s).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a NUL byte in the command",
            )
        })
    };
    let program = argv
        .first()
        .ok_or_else(|| std::io::Error::other("empty command"))?;
    let args: Vec<CString> = argv
        .iter()
        .map(|a| cstring(a.as_bytes()))
        .collect::<Result<_, _>>()?;
    let vars: Vec<CString> = env
        .iter()
        .map(|(k, v)| cstring(format!("{k}={v}").as_bytes()))
        .collect::<Result<_, _>>()?;
    let candidates: Vec<CString> = if program.contains('/') {
        vec![cstring(program.as_bytes())?]
    } else {
        env.get("PATH")
            .map_or("/bin:/usr/bin", String::as_str)
            .split(':')
            .map(|d| {
                let d = if d.is_empty() { "." } else { d };
                cstring(format!("{}/{program}", d.trim_end_matches('/')).as_bytes())
            })
            .collect::<Result<_, _>>()?
    };
    let dir = cstring(dir.as_os_str().as_encoded_bytes())?;

    let (stdin_child, stdin_parent) = if stdin {
        let (r, w) = pipe_pair()?;
        (r, Some(w))
    } else {
        (open_dev_null()?, None)
    };
    let (stdout_parent, stdout_child) = pipe_pair()?;
    let (stderr_parent, stderr_child) = pipe_pair()?;

    let mut argv_ptrs: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut sh_argv: Vec<*const libc::c_char> = vec![SH.as_ptr(), std::ptr::null()];
    sh_argv.extend(args.iter().skip(1).map(|a| a.as_ptr()));
    sh_argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = vars.iter().map(|v| v.as_ptr()).collect();
    envp.push(std::ptr::null());

    let mut child_args = ChildArgs {
        stdin: stdin_child.as_raw_fd(),
        stdout: stdout_child.as_raw_fd(),
        stderr: stderr_child.as_raw_fd(),
        dir,
        candidates,
        argv: argv_ptrs,
        sh_argv,
        envp,
        limits,
        user,
        error: 0,
    };

    let stack = Stack::new()?;
    let top = stack.top();
    let mut pidfd: c_int = -1;
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: every pointer handed to the child stays valid until clone returns, which with
    // CLONE_VFORK is after the child's execve or exit; the child only makes system calls.
    let pid = unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            child_main,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
            (&mut child_args as *mut ChildArgs).cast(),
            &mut pidfd as *mut c_int,
        );
        let error = std::io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid < 0 {
            return match error.raw_os_error() {
                // No CLONE_PIDFD (before Linux 5.2), or a seccomp filter refusing these flags.
                Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::EPERM) => Ok(None),
                _ => Err(error),
            };
        }
        pid
    };
    drop(stack);
    // SAFETY: clone with CLONE_PIDFD stored a new descriptor of the child there.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    drop((stdin_child, stdout_child, stderr_child));
    if child_args.error != 0 {
        let mut status: c_int = 0;
        // SAFETY: the child failed before execve and has exited; this reaps it.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        return Err(std::io::Error::from_raw_os_error(child_args.error));
    }
    Ok(Some(Child {
        pid,
        // SAFETY: an OwnedFd stays open and is the same descriptor until the AsyncFd drops.
        pidfd: unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) }
            .map_err(std::io::Error::from)?,
        status: None,
        stdin: stdin_parent.map(pipe::Sender::from_owned_fd).transpose()?,
        stdout: Some(pipe::Receiver::from_owned_fd(stdout_parent)?),
        stderr: Some(pipe::Receiver::from_owned_fd(stderr_parent)?),
    }))
}

/// The child's stack: its frames are small (no allocation, a few system calls), and a page
/// below it faults rather than letting an overflow write into the worker's memory.
struct Stack {
    base: *mut c_void,
}

impl Stack {
    const SIZE: usize = 64 * 1024;
    const GUARD: usize = 4096;

    fn new() -> std::io::Result<Stack> {
        // SAFETY: a new private anonymous mapping; its lowest page is made inaccessible.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                Self::GUARD + Self::SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            );
            if base == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error());
            }
            let stack = Stack { base };
            if libc::mprotect(base, Self::GUARD, libc::PROT_NONE) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(stack)
        }
    }

    /// The stack grows down from its end (16-byte aligned: the mapping is page-aligned).
    fn top(&self) -> *mut c_void {
        self.base.wrapping_byte_add(Self::GUARD + Self::SIZE)
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping made by `new`, no longer used once the child has exec'd or exited.
        unsafe { libc::munmap(self.base, Self::GUARD + Self::SIZE) };
    }
}

/// (read end, write end), both close-on-exec.
fn pipe_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: `fds` is a valid array of two descriptors for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 made these two descriptors, now owned here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn open_dev_null() -> std::io::Result<OwnedFd> {
    Ok(std::fs::File::open("/dev/null")?.into())
}

/// The child: system calls only, on memory the parent prepared (see the module's note).
extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the parent's ChildArgs, alive until this child execs or exits.
    let a = unsafe { &mut *(arg as *mut ChildArgs<'_>) };
    // SAFETY: system calls on valid descriptors, paths and arrays prepared by the parent.
    unsafe {
        let fail = |a: &mut ChildArgs| -> c_int {
            a.error = *libc::__errno_location();
            if a.error == 0 {
                a.error = libc::EINVAL;
            }
            libc::_exit(127)
        };
        // Every signal the worker handles goes back to its default; ignored ones stay ignored
        // (as across execve), but SIGPIPE, which the worker ignores, is the default for tasks.
        for sig in 1..=libc::SIGRTMAX() {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                continue;
            }
            if old.sa_sigaction != libc::SIG_DFL
                && (old.sa_sigaction != libc::SIG_IGN || sig == libc::SIGPIPE)
            {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
        for (from, to) in [(a.stdin, 0), (a.stdout, 1), (a.stderr, 2)] {
            // dup2 onto itself keeps close-on-exec: clear it instead.
            let done = if from == to {
                libc::fcntl(to, libc::F_SETFD, 0)
            } else {
                libc::dup2(from, to)
            };
            if done < 0 {
                return fail(a);
            }
        }
        if libc::chdir(a.dir.as_ptr()) != 0 {
            return fail(a);
        }
        // Its own session, and so its own process group (pgid = pid).
        if libc::setsid() == -1 {
            return fail(a);
        }
        if let Err(e) = a.limits.apply_in_child() {
            *libc::__errno_location() = e.raw_os_error().unwrap_or(libc::EINVAL);
            return fail(a);
        }
        // The system calls themselves, not libc's wrappers: those change the credentials of
        // every thread of the process by signalling them, and this child shares the worker's
        // memory, where libc's list of threads is the worker's. A raw call changes this
        // process alone, which is the whole child (it is not a thread of the worker).
        if let Some((uid, gid)) = a.user
            && (libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) == -1
                || libc::syscall(libc::SYS_setgid, gid) == -1
                || libc::syscall(libc::SYS_setuid, uid) == -1)
        {
            return fail(a);
        }
        // If the worker dies (kill -9), its children die with it instead of running on
        // unsupervised while another worker starts the task again.
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
            return fail(a);
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        // As execvp: the first candidate that runs; a permission refused is reported rather
        // than a later "not found".
        let mut error = libc::ENOENT;
        for candidate in &a.candidates {
            libc::execve(candidate.as_ptr(), a.argv.as_ptr(), a.envp.as_ptr());
            let e = *libc::__errno_location();
            match e {
                libc::ENOEXEC => {
                    a.sh_argv[1] = candidate.as_ptr();
                    libc::execve(SH.as_ptr(), a.sh_argv.as_ptr(), a.envp.as_ptr());
                    error = *libc::__errno_location();
                    break;
                }
                libc::EACCES => error = libc::EACCES,
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
                other => {
                    error = other;
                    break;
                }
            }
        }
        *libc::__errno_location() = error;
        fail(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// A new directory under the temporary directory, removed when dropped.
    struct TempDir(std::path::PathBuf);

    impl TempDir {
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tempdir() -> TempDir {
        let path = std::env::temp_dir().join(format!("sked-spawn-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir(&path).unwrap();
        TempDir(path)
    }

    async fn run_as(
        argv: &[&str],
        env: &[(&str, &str)],
        dir: &Path,
        user: Option<(u32, u32)>,
    ) -> std::io::Result<(ExitStatus, String)> {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let env: BTreeMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut child = spawn(&argv, &env, dir, false, &ChildLimits::default(), user)?
            .expect("this kernel has CLONE_PIDFD");
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .await?;
        Ok((child.wait().await?, out))
    }

    async fn run(
        argv: &[&str],
        env: &[(&str, &str)],
        dir: &Path,
    ) -> std::io::Result<(ExitStatus, String)> {
        run_as(argv, env, dir, None).await
    }

    #[tokio::test]
    async fn a_program_is_found_on_the_tasks_path_and_runs_in_its_directory_with_its_env() {
        let dir = tempdir();
        let (status, out) = run(
            &["sh", "-c", "echo \"$GREETING\"; pwd"],
            &[
                ("PATH", "/nonexistent:/usr/bin:/bin"),
                ("GREETING", "hello"),
            ],
            dir.path(),
        )
        .await
        .unwrap();
        assert!(status.success(), "{status:?}");
        let canonical = dir.path().canonicalize().unwrap();
        assert_eq!(out, format!("hello\n{}\n", canonical.display()));
    }

    #[tokio::test]
    async fn a_missing_program_is_an_error_and_leaves_no_child() {
        let dir = tempdir();
        let err = run(
            &["no-such-program-here"],
            &[("PATH", "/usr/bin:/bin")],
            dir.path(),
        )
        .await
        .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{err}");
        let err = run(&["/nonexistent/prog"], &[], dir.path())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{err}");
        let err = run(&["true"], &[], Path::new("/nonexistent-dir"))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{err}");
    }

    #[tokio::test]
    async fn a_script_without_an_interpreter_line_runs_with_sh() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempdir();
        let script = dir.path().join("script");
        std::fs::write(&script, "echo \"from a script: $1\"\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let (status, out) = run(&["./script", "arg"], &[], dir.path()).await.unwrap();
        assert!(status.success(), "{status:?}");
        assert_eq!(out, "from a script: arg\n");
    }

    #[tokio::test]
    async fn the_child_starts_with_no_signal_blocked_sigpipe_by_default_and_in_its_own_session() {
        let dir = tempdir();
        let (status, out) = run(
            &[
                "sh",
                "-c",
                "grep -E '^Sig(Blk|Ign)' /proc/self/status; cut -d' ' -f6 /proc/$$/stat; echo $$",
            ],
            &[("PATH", "/usr/bin:/bin")],
            dir.path(),
        )
        .await
        .unwrap();
        assert!(status.success(), "{status:?}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "SigBlk:\t0000000000000000", "{out}");
        let ignored = u64::from_str_radix(lines[1].trim_start_matches("SigIgn:\t"), 16).unwrap();
        assert_eq!(
            ignored & (1 << (libc::SIGPIPE - 1)),
            0,
            "SIGPIPE, which the worker ignores, is not ignored by the task: {out}"
        );
        assert_eq!(lines[2], lines[3], "the shell leads its session: {out}");
    }

    #[tokio::test]
    async fn a_child_switched_to_another_user_has_its_uid_gid_and_no_other_group() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: switching users needs root");
            return;
        }
        let dir = tempdir();
        let (status, out) = run_as(
            &["sh", "-c", "id -u; id -g; id -G"],
            &[("PATH", "/usr/bin:/bin")],
            dir.path(),
            Some((65534, 65534)),
        )
        .await
        .unwrap();
        assert!(status.success());
        assert_eq!(out, "65534\n65534\n65534\n");
        // The worker itself keeps its own user.
        // SAFETY: getuid has no preconditions.
        assert_eq!(unsafe { libc::getuid() }, 0);
    }
}
