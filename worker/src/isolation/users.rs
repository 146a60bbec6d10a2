//! Who a task runs as: the user named by the task (`run_as`), else the worker's default
//! (`--run-as`), looked up in the user database, and the rules that keep a root worker from
//! running tasks as root (see `docs/runtime.md`, "Limits and isolation").
//!
//! - A worker running as root switches every task to a user: the task's `run_as`, else
//!   `--run-as`, else `nobody`. Root itself (uid 0) only with `--allow-root-tasks`. A task
//!   may name a user other than the worker's default only when `--run-as-allow` lists it (or
//!   is `*`): whoever can submit a task must not pick any account of the machine, such as
//!   the database's.
//! - A worker running as another user runs tasks as itself. A task (or `--run-as`) naming any
//!   other user cannot be honoured: the attempt fails with an error saying so (the worker
//!   refuses `--run-as` of another user at start).

use std::ffi::{CStr, CString};

/// The user a task's processes run as: uid, primary gid, and the name for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

/// The user a root worker runs tasks as when neither the task nor `--run-as` names one.
pub const ROOT_WORKER_DEFAULT: &str = "nobody";

/// Looks a user up by name, or by a numeric uid. A uid without an entry in the user database
/// is allowed and runs with the group of the same number.
pub fn lookup(spec: &str) -> Result<User, String> {
    if !spec.is_empty() && spec.bytes().all(|b| b.is_ascii_digit()) {
        let uid: u32 = spec
            .parse()
            .map_err(|_| format!("user id {spec} is out of range"))?;
        return Ok(by_uid(uid)?.unwrap_or(User {
            name: spec.to_owned(),
            uid,
            gid: uid,
        }));
    }
    by_name(spec)?.ok_or_else(|| format!("there is no user {spec:?} on this worker's machine"))
}

fn by_name(name: &str) -> Result<Option<User>, String> {
    let cname = CString::new(name).map_err(|_| format!("{name:?} is not a user name"))?;
    query(|pwd, buf, len, result| {
        // SAFETY: every pointer is valid for the call; `buf` has `len` bytes.
        unsafe { libc::getpwnam_r(cname.as_ptr(), pwd, buf, len, result) }
    })
    .map_err(|e| format!("looking up user {name:?}: {e}"))
}

fn by_uid(uid: u32) -> Result<Option<User>, String> {
    query(|pwd, buf, len, result| {
        // SAFETY: every pointer is valid for the call; `buf` has `len` bytes.
        unsafe { libc::getpwuid_r(uid, pwd, buf, len, result) }
    })
    .map_err(|e| format!("looking up user id {uid}: {e}"))
}

/// Runs a `getpw*_r` call with a buffer that grows while the entry does not fit.
fn query(
    call: impl Fn(*mut libc::passwd, *mut libc::c_char, usize, *mut *mut libc::passwd) -> i32,
) -> std::io::Result<Option<User>> {
    let mut len = 1024;
    loop {
        let mut buf = vec![0 as libc::c_char; len];
        // SAFETY: passwd is plain old data; all-zero is a valid value to be overwritten.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        match call(&mut pwd, buf.as_mut_ptr(), len, &mut result) {
            0 if result.is_null() => return Ok(None),
            0 => {
                // SAFETY: on success pw_name points to a NUL-terminated string in `buf`.
                let name = unsafe { CStr::from_ptr(pwd.pw_name) }
                    .to_string_lossy()
                    .into_owned();
                return Ok(Some(User {
                    name,
                    uid: pwd.pw_uid,
                    gid: pwd.pw_gid,
                }));
            }
            libc::ERANGE if len < 1 << 20 => len *= 4,
            // "Not found" is reported as one of these by some name services.
            libc::ENOENT | libc::ESRCH | libc::EBADF | libc::EPERM => return Ok(None),
            e => return Err(std::io::Error::from_raw_os_error(e)),
        }
    }
}

/// The rules of who tasks run as on this worker, fixed at start.
#[derive(Debug, Clone)]
pub struct Users {
    /// The worker's effective uid.
    worker_uid: u32,
    /// `--run-as` as given (looked up per attempt, so it follows the user database).
    default: Option<String>,
    allow_root: bool,
    /// `--run-as-allow`: the users a task may name besides the default; `*` for any.
    allowed: Vec<String>,
}

impl Users {
    /// Validates `--run-as` and `--allow-root-tasks` for a worker running as `worker_uid`.
    pub fn new(worker_uid: u32, run_as: Option<String>, allow_root: bool) -> Result<Users, String> {
        let users = Users {
            worker_uid,
            default: run_as.filter(|u| !u.trim().is_empty()),
            allow_root,
            allowed: Vec::new(),
        };
        if let Some(name) = &users.default {
            let user = lookup(name).map_err(|e| format!("--run-as: {e}"))?;
            users.check(&user).map_err(|e| format!("--run-as: {e}"))?;
        } else if worker_uid == 0 {
            lookup(ROOT_WORKER_DEFAULT).map_err(|e| {
                format!(
                    "a worker running as root runs tasks as {ROOT_WORKER_DEFAULT:?} unless \
                     --run-as names another user, and {e}"
                )
            })?;
        }
        Ok(users)
    }

    /// Lets tasks name these users (`--run-as-allow`: names or uids, `*` for any user) besides
    /// the worker's default. Names must exist; root still needs `--allow-root-tasks`.
    pub fn allowing(mut self, users: Vec<String>) -> Result<Users, String> {
        let users: Vec<String> = users
            .into_iter()
            .map(|u| u.trim().to_owned())
            .filter(|u| !u.is_empty())
            .collect();
        for name in users.iter().filter(|u| *u != "*") {
            lookup(name).map_err(|e| format!("--run-as-allow: {e}"))?;
        }
        self.allowed = users;
        Ok(self)
    }

    /// The users of a worker running as the current effective user.
    pub fn for_this_process(
        run_as: Option<String>,
        allow_root: bool,
        allowed: Vec<String>,
    ) -> Result<Users, String> {
        // SAFETY: geteuid has no preconditions.
        Users::new(unsafe { libc::geteuid() }, run_as, allow_root)?.allowing(allowed)
    }

    pub fn worker_is_root(&self) -> bool {
        self.worker_uid == 0
    }

    /// Whom a task naming `run_as` (or nobody) runs as: `Ok(Some(user))` to switch to,
    /// `Ok(None)` to run as the worker itself, or why it cannot run here.
    pub fn for_task(&self, run_as: Option<&str>) -> Result<Option<User>, String> {
        let wanted = run_as.or(self.default.as_deref());
        let name = match wanted {
            Some(name) => name,
            None if self.worker_uid == 0 => ROOT_WORKER_DEFAULT,
            None => return Ok(None),
        };
        let user = lookup(name).map_err(|e| format!("cannot run as user {name:?}: {e}"))?;
        self.check(&user)
            .map_err(|e| format!("cannot run as user {name:?}: {e}"))?;
        if let Some(asked) = run_as
            && self.worker_uid == 0
        {
            self.check_allowed(asked, &user)
                .map_err(|e| format!("cannot run as user {name:?}: {e}"))?;
        }
        Ok((self.worker_uid == 0).then_some(user))
    }

    /// Whether a task of a root worker may name `user` (looked up from `asked`): the worker's
    /// default user always; root when `--allow-root-tasks`; others when `--run-as-allow` has
    /// them or `*`.
    fn check_allowed(&self, asked: &str, user: &User) -> Result<(), String> {
        let default = self.default.as_deref().unwrap_or(ROOT_WORKER_DEFAULT);
        let is_default = lookup(default).is_ok_and(|d| d.uid == user.uid);
        let listed = self.allowed.iter().any(|a| {
            a == "*" || a == asked || lookup(a).is_ok_and(|allowed| allowed.uid == user.uid)
        });
        if is_default || (user.uid == 0 && self.allow_root) || listed {
            return Ok(());
        }
        Err(format!(
            "this worker lets tasks run as its default user {default:?}{} only; start it with \
             --run-as-allow naming the user to let tasks choose it",
            if self.allowed.is_empty() {
                String::new()
            } else {
                format!(" and {}", self.allowed.join(", "))
            }
        ))
    }

    /// Whether this worker may run tasks as `user`.
    fn check(&self, user: &User) -> Result<(), String> {
        if self.worker_uid == 0 {
            if user.uid == 0 && !self.allow_root {
                return Err("this worker runs as root and runs tasks as root only when \
                            started with --allow-root-tasks"
                    .to_owned());
            }
            Ok(())
        } else if user.uid == self.worker_uid {
            Ok(())
        } else {
            Err(format!(
                "this worker runs as uid {} (not root) and can run tasks only as itself; \
                 run the task on a worker started as root or as that user",
                self.worker_uid
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_uids_are_looked_up() {
        let root = lookup("root").expect("root exists");
        assert_eq!((root.uid, root.gid), (0, 0));
        assert_eq!(lookup("0").unwrap().name, "root");
        let unknown = lookup("4000000000").expect("a uid without an entry is allowed");
        assert_eq!((unknown.uid, unknown.gid), (4_000_000_000, 4_000_000_000));
        let err = lookup("no-such-user-here").unwrap_err();
        assert!(err.contains("there is no user"), "{err}");
    }

    #[test]
    fn a_root_worker_runs_tasks_as_nobody_unless_told_otherwise() {
        let users = Users::new(0, None, false).unwrap();
        let nobody = users.for_task(None).unwrap().expect("a user to switch to");
        assert_eq!(nobody.name, "nobody");
        let err = users.for_task(Some("root")).unwrap_err();
        assert!(err.contains("--allow-root-tasks"), "{err}");
        let err = users.for_task(Some("0")).unwrap_err();
        assert!(err.contains("--allow-root-tasks"), "{err}");

        let allowed = Users::new(0, None, true).unwrap();
        assert_eq!(allowed.for_task(Some("root")).unwrap().unwrap().uid, 0);
        assert_eq!(
            allowed.for_task(None).unwrap().unwrap().name,
            "nobody",
            "--allow-root-tasks permits root, it does not make root the default"
        );
        let as_root = Users::new(0, Some("root".into()), true).unwrap();
        assert_eq!(as_root.for_task(None).unwrap().unwrap().uid, 0);
        let err = Users::new(0, Some("root".into()), false).unwrap_err();
        assert!(err.starts_with("--run-as:"), "{err}");
    }

    #[test]
    fn a_task_names_another_user_only_when_the_worker_allows_it() {
        let users = Users::new(0, None, false).unwrap();
        assert_eq!(
            users.for_task(Some("nobody")).unwrap().unwrap().name,
            "nobody"
        );
        let err = users.for_task(Some("daemon")).unwrap_err();
        assert!(err.contains("--run-as-allow"), "{err}");

        let users = Users::new(0, Some("daemon".into()), false)
            .unwrap()
            .allowing(vec!["nobody".into(), "2".into()])
            .unwrap();
        assert_eq!(
            users.for_task(Some("daemon")).unwrap().unwrap().name,
            "daemon"
        );
        assert_eq!(
            users.for_task(Some("nobody")).unwrap().unwrap().name,
            "nobody"
        );
        assert_eq!(users.for_task(Some("2")).unwrap().unwrap().uid, 2);
        let err = users.for_task(Some("sys")).unwrap_err();
        assert!(err.contains("\"daemon\" and nobody, 2 only"), "{err}");

        let any = Users::new(0, None, false)
            .unwrap()
            .allowing(vec!["*".into()])
            .unwrap();
        assert_eq!(any.for_task(Some("bin")).unwrap().unwrap().name, "bin");
        let err = any.for_task(Some("root")).unwrap_err();
        assert!(
            err.contains("--allow-root-tasks"),
            "* does not let in root: {err}"
        );

        let err = Users::new(0, None, false)
            .unwrap()
            .allowing(vec!["no-such-user-here".into()])
            .unwrap_err();
        assert!(err.starts_with("--run-as-allow:"), "{err}");
    }

    #[test]
    fn a_non_root_worker_runs_tasks_only_as_itself() {
        let users = Users::new(65534, None, false).unwrap();
        assert_eq!(users.for_task(None).unwrap(), None, "no switch");
        assert_eq!(
            users.for_task(Some("nobody")).unwrap(),
            None,
            "naming itself is fine"
        );
        let err = users.for_task(Some("root")).unwrap_err();
        assert!(
            err.contains("not root") && err.contains("only as itself"),
            "{err}"
        );
        let err = Users::new(65534, Some("root".into()), false).unwrap_err();
        assert!(err.contains("only as itself"), "{err}");
    }
}
