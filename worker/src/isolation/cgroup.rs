//! Task limits with cgroup v2: one child cgroup per attempt under a cgroup delegated to the
//! worker, with `memory.max` (and `memory.swap.max = 0`, `memory.oom.group = 1`) and
//! `cpu.max`; the kernel's OOM kills show in the child's `memory.events` (`oom_kill`), and
//! the child is emptied (`cgroup.kill`) and removed when the attempt ends.
//!
//! The delegated cgroup (`--cgroup DIR`, else the worker's own cgroup) must list `memory`
//! and `cpu` in its `cgroup.controllers` and be writable. cgroup v2 lets only leaves hold
//! processes once controllers are enabled for children ("no internal processes"), so when
//! the worker's process is the only one in it, the worker first moves itself into a leaf
//! named `worker`; a cgroup that holds other processes cannot be used. A process joins its
//! task's cgroup itself, between fork and exec, by writing `0` to its `cgroup.procs`, so
//! nothing it starts ever runs outside the limits.

use std::ffi::CString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The period of `cpu.max`, in microseconds.
const CPU_PERIOD_US: u64 = 100_000;
/// The smallest quota the kernel accepts, in microseconds.
const CPU_MIN_QUOTA_US: u64 = 1_000;
/// The prefix of the names of task cgroups.
const TASK_PREFIX: &str = "task-";

/// A cgroup v2 directory this worker may create task cgroups in.
#[derive(Debug, Clone)]
pub struct Delegated {
    dir: PathBuf,
}

/// Where the worker's own cgroup v2 is: the unified hierarchy's mount point (from
/// `mountinfo`) joined with the path in `/proc/self/cgroup` ("0::/path").
pub fn own_cgroup() -> Result<PathBuf, String> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("reading /proc/self/cgroup: {e}"))?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("reading /proc/self/mountinfo: {e}"))?;
    own_cgroup_from(&cgroup, &mountinfo)
}

fn own_cgroup_from(cgroup: &str, mountinfo: &str) -> Result<PathBuf, String> {
    let path = cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or("the process is in no cgroup v2 hierarchy (no \"0::\" line in /proc/self/cgroup)")?;
    // mountinfo: id parent major:minor root mount-point options... - fstype source options
    let (root, mount) = mountinfo
        .lines()
        .find_map(|l| {
            let (fields, tail) = l.split_once(" - ")?;
            if tail.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            let mut f = fields.split_whitespace().skip(3);
            Some((unescape(f.next()?), unescape(f.next()?)))
        })
        .ok_or("no cgroup v2 file system is mounted")?;
    let relative = Path::new(path).strip_prefix(&root).map_err(|_| {
        format!("the worker's cgroup {path} is outside the mounted cgroup v2 tree {root}")
    })?;
    if relative.as_os_str().is_empty() {
        return Ok(PathBuf::from(mount));
    }
    Ok(Path::new(&mount).join(relative))
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(field: &str) -> String {
    let mut out = Vec::with_capacity(field.len());
    let bytes = field.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && let Ok(v) = u8::from_str_radix(&field[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Delegated {
    /// Takes `dir` for task cgroups, as the process `own_pid`: checks the controllers and
    /// that it may write there, moves the worker into a leaf when it is the cgroup's only
    /// process, enables `memory` and `cpu` for children, and removes empty task cgroups
    /// that a worker which died left behind. Says why when the cgroup cannot be used.
    pub fn take(dir: &Path, own_pid: u32) -> Result<Delegated, String> {
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name)).map_err(|e| {
                format!(
                    "{} is not a usable cgroup v2 directory ({name}: {e})",
                    dir.display()
                )
            })
        };
        let controllers = read("cgroup.controllers")?;
        let missing: Vec<&str> = ["memory", "cpu"]
            .into_iter()
            .filter(|c| !controllers.split_whitespace().any(|have| have == *c))
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "{} lacks the {} controller{} (it offers: {}); on a host that mounts cgroup v1 \
                 too, they are usually bound to v1",
                dir.display(),
                missing.join(" and "),
                if missing.len() > 1 { "s" } else { "" },
                if controllers.trim().is_empty() {
                    "none"
                } else {
                    controllers.trim()
                },
            ));
        }
        if !writable(&dir.join("cgroup.subtree_control")) || !writable(dir) {
            return Err(format!(
                "{} is not writable by this worker: delegate it (for example systemd's \
                 Delegate=yes) or name another with --cgroup",
                dir.display()
            ));
        }
        let procs: Vec<u32> = read("cgroup.procs")?
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if !procs.is_empty() {
            if procs != [own_pid] {
                let others: Vec<String> = procs
                    .iter()
                    .filter(|p| **p != own_pid)
                    .take(5)
                    .map(u32::to_string)
                    .collect();
                return Err(format!(
                    "{} holds other processes too (pids {}…), so the worker cannot give it \
                     child cgroups: start the worker in a cgroup of its own, or name an empty \
                     delegated one with --cgroup",
                    dir.display(),
                    others.join(", ")
                ));
            }
            let leaf = dir.join("worker");
            mkdir(&leaf).map_err(|e| format!("creating {}: {e}", leaf.display()))?;
            write_file(&leaf.join("cgroup.procs"), own_pid.to_string().as_bytes())
                .map_err(|e| format!("moving the worker into {}: {e}", leaf.display()))?;
        }
        let enabled = read("cgroup.subtree_control")?;
        let wanted: Vec<String> = ["memory", "cpu"]
            .into_iter()
            .filter(|c| !enabled.split_whitespace().any(|have| have == *c))
            .map(|c| format!("+{c}"))
            .collect();
        if !wanted.is_empty() {
            write_file(
                &dir.join("cgroup.subtree_control"),
                wanted.join(" ").as_bytes(),
            )
            .map_err(|e| {
                format!(
                    "enabling the memory and cpu controllers in {}: {e}",
                    dir.display()
                )
            })?;
        }
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().starts_with(TASK_PREFIX) {
                    // Succeeds only for an empty cgroup: a live one (another worker's) stays.
                    let _ = std::fs::remove_dir(entry.path());
                }
            }
        }
        Ok(Delegated {
            dir: dir.to_owned(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Creates the cgroup of one attempt with its limits (`None`: unlimited).
    pub fn create(
        &self,
        name: &str,
        memory_bytes: Option<u64>,
        cpu_millis: Option<u32>,
    ) -> std::io::Result<TaskCgroup> {
        let path = self.dir.join(format!("{TASK_PREFIX}{name}"));
        mkdir(&path)?;
        let cgroup = TaskCgroup {
            procs: CString::new(path.join("cgroup.procs").as_os_str().as_encoded_bytes())
                .map_err(std::io::Error::other)?,
            path,
        };
        let configured = (|| {
            if let Some(bytes) = memory_bytes {
                write_file(
                    &cgroup.path.join("memory.max"),
                    bytes.to_string().as_bytes(),
                )?;
                // Swap would let the task past its limit; absent when the kernel has no swap
                // accounting.
                let swap = cgroup.path.join("memory.swap.max");
                if swap.exists() {
                    write_file(&swap, b"0")?;
                }
                // An OOM kill takes the whole attempt, not one of its processes.
                write_file(&cgroup.path.join("memory.oom.group"), b"1")?;
            }
            if let Some(millis) = cpu_millis {
                write_file(&cgroup.path.join("cpu.max"), cpu_max(millis).as_bytes())?;
            }
            Ok(())
        })();
        if let Err(e) = configured {
            let _ = std::fs::remove_dir(&cgroup.path);
            return Err(e);
        }
        Ok(cgroup)
    }
}

/// `cpu.max` for a limit of `millis` millicores: that share of every 100 ms period (at least
/// the kernel's smallest quota, 1 ms).
pub fn cpu_max(millis: u32) -> String {
    let quota = (u64::from(millis) * CPU_PERIOD_US / 1000).max(CPU_MIN_QUOTA_US);
    format!("{quota} {CPU_PERIOD_US}")
}

/// The cgroup of one attempt.
#[derive(Debug)]
pub struct TaskCgroup {
    path: PathBuf,
    /// `<path>/cgroup.procs`, ready for the child to open between fork and exec.
    procs: CString,
}

impl TaskCgroup {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path the child writes `0` to, to join the cgroup.
    pub fn procs_file(&self) -> &CString {
        &self.procs
    }

    /// How many processes of the cgroup the kernel's OOM killer has killed.
    pub fn oom_kills(&self) -> u64 {
        std::fs::read_to_string(self.path.join("memory.events"))
            .map(|text| oom_kills_in(&text))
            .unwrap_or(0)
    }

    /// Kills whatever still runs in the cgroup (processes that left the task's process
    /// group included) and removes it; gives up after a few seconds with an error.
    pub async fn remove(self) -> std::io::Result<()> {
        let kill = self.path.join("cgroup.kill");
        let mut delay = Duration::from_millis(5);
        for _ in 0..12 {
            match std::fs::remove_dir(&self.path) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(_) => {}
            }
            // `cgroup.kill` (Linux 5.14) kills every process at once; older kernels get
            // SIGKILL sent to each listed process.
            if write_file(&kill, b"1").is_err() {
                for pid in std::fs::read_to_string(self.path.join("cgroup.procs"))
                    .unwrap_or_default()
                    .split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok())
                {
                    // SAFETY: kill has no memory-safety preconditions.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                    }
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(500));
        }
        std::fs::remove_dir(&self.path)
    }
}

fn oom_kills_in(events: &str) -> u64 {
    events
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// The child's half of joining a cgroup: opens `procs` and writes "0" (the writer itself).
/// Runs between fork and exec, so it only makes system calls.
pub fn join_in_child(procs: &CString) -> std::io::Result<()> {
    // SAFETY: `procs` is a valid NUL-terminated path; open, write and close are
    // async-signal-safe and touch no memory of the parent.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let written = libc::write(fd, b"0".as_ptr().cast(), 1);
        let error = std::io::Error::last_os_error();
        libc::close(fd);
        if written != 1 {
            return Err(error);
        }
    }
    Ok(())
}

fn writable(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated path.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

fn mkdir(path: &Path) -> std::io::Result<()> {
    match std::fs::create_dir(path) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

/// Writes a cgroup interface file: one `write` of the whole value, without truncating or
/// creating (cgroup files exist; a plain file stands in for one in tests).
fn write_file(path: &Path, value: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .or_else(|e| {
            // A stand-in directory in tests has no interface files until written.
            if e.kind() == std::io::ErrorKind::NotFound && !is_cgroup2(path) {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(path)
            } else {
                Err(e)
            }
        })?;
    file.write_all(value)
}

/// Whether `path`'s directory is on a cgroup v2 file system.
fn is_cgroup2(path: &Path) -> bool {
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    let Some(dir) = path.parent() else {
        return false;
    };
    let Ok(c) = CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs is plain data; `c` is a valid path.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == CGROUP2_SUPER_MAGIC
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A temporary directory standing in for a cgroup v2 directory.
    struct FakeCgroup(PathBuf);

    impl FakeCgroup {
        fn new(controllers: &str, procs: &str) -> FakeCgroup {
            let dir = std::env::temp_dir().join(format!(
                "sked-cgroup-test-{}",
                uuid::Uuid::new_v4().simple()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cgroup.controllers"), controllers).unwrap();
            std::fs::write(dir.join("cgroup.subtree_control"), "").unwrap();
            std::fs::write(dir.join("cgroup.procs"), procs).unwrap();
            FakeCgroup(dir)
        }

        fn read(&self, name: &str) -> String {
            std::fs::read_to_string(self.0.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
        }
    }

    impl Drop for FakeCgroup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn the_own_cgroup_is_found_under_the_cgroup2_mount() {
        let mountinfo = "\
24 1 0:22 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
35 24 0:30 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
        assert_eq!(
            own_cgroup_from("4:memory:/x\n0::/system.slice/sked.service\n", mountinfo).unwrap(),
            Path::new("/sys/fs/cgroup/unified/system.slice/sked.service")
        );
        // In a cgroup namespace whose root is mounted: the path is relative to that root.
        let ns = "40 1 0:30 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            own_cgroup_from("0::/kubepods/pod1/c1\n", ns).unwrap(),
            Path::new("/sys/fs/cgroup/c1")
        );
        let spaced = "40 1 0:30 / /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            own_cgroup_from("0::/a\n", spaced).unwrap(),
            Path::new("/mnt/cg two/a")
        );
        assert_eq!(
            own_cgroup_from("0::/\n", mountinfo).unwrap(),
            Path::new("/sys/fs/cgroup/unified"),
            "the root of the hierarchy is its mount point"
        );
        assert!(own_cgroup_from("1:cpu:/\n", mountinfo).is_err(), "v1 only");
        assert!(own_cgroup_from("0::/\n", "24 1 0:22 / /x rw - cgroup cgroup rw\n").is_err());
    }

    #[test]
    fn an_empty_delegated_cgroup_gets_the_controllers_enabled_for_children() {
        let cg = FakeCgroup::new("cpuset cpu io memory pids\n", "");
        let d = Delegated::take(&cg.0, 4242).expect("usable");
        assert_eq!(cg.read("cgroup.subtree_control"), "+memory +cpu");
        assert!(!cg.0.join("worker").exists(), "nobody to move");

        let t = d.create("abc-1", Some(64 << 20), Some(500)).unwrap();
        assert_eq!(t.path(), cg.0.join("task-abc-1"));
        let read = |f: &str| std::fs::read_to_string(t.path().join(f)).unwrap();
        assert_eq!(read("memory.max"), "67108864");
        assert_eq!(read("memory.oom.group"), "1");
        assert_eq!(read("cpu.max"), "50000 100000");
        assert_eq!(
            t.procs_file().to_str().unwrap(),
            cg.0.join("task-abc-1/cgroup.procs").to_str().unwrap()
        );
        std::fs::write(
            t.path().join("memory.events"),
            "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 1\n",
        )
        .unwrap();
        assert_eq!(t.oom_kills(), 1);

        let unlimited = d.create("abc-2", None, None).unwrap();
        assert!(
            !unlimited.path().join("memory.max").exists(),
            "no limit, no write"
        );
        assert!(!unlimited.path().join("cpu.max").exists());
        assert_eq!(unlimited.oom_kills(), 0, "no memory.events: no kills");
    }

    #[test]
    fn a_worker_alone_in_its_cgroup_moves_itself_into_a_leaf() {
        let cg = FakeCgroup::new("memory cpu", "4242\n");
        Delegated::take(&cg.0, 4242).expect("usable");
        assert_eq!(cg.read("worker/cgroup.procs"), "4242");
        assert_eq!(cg.read("cgroup.subtree_control"), "+memory +cpu");
    }

    #[test]
    fn controllers_already_enabled_are_not_written_again() {
        let cg = FakeCgroup::new("memory cpu", "");
        std::fs::write(cg.0.join("cgroup.subtree_control"), "cpu memory\n").unwrap();
        Delegated::take(&cg.0, 1).unwrap();
        assert_eq!(cg.read("cgroup.subtree_control"), "cpu memory\n");
    }

    #[test]
    fn unusable_cgroups_are_refused_with_the_reason() {
        let shared = FakeCgroup::new("memory cpu", "4242\n17\n");
        let err = Delegated::take(&shared.0, 4242).unwrap_err();
        assert!(
            err.contains("holds other processes") && err.contains("17"),
            "{err}"
        );
        assert_eq!(shared.read("cgroup.subtree_control"), "", "nothing changed");

        let bare = FakeCgroup::new("hugetlb\n", "");
        let err = Delegated::take(&bare.0, 4242).unwrap_err();
        assert!(
            err.contains("lacks the memory and cpu controllers") && err.contains("hugetlb"),
            "{err}"
        );

        let no_cpu = FakeCgroup::new("memory pids", "");
        let err = Delegated::take(&no_cpu.0, 4242).unwrap_err();
        assert!(err.contains("lacks the cpu controller ("), "{err}");

        let err = Delegated::take(Path::new("/nonexistent/cg"), 1).unwrap_err();
        assert!(err.contains("not a usable cgroup v2 directory"), "{err}");
    }

    #[test]
    fn cpu_limits_become_a_quota_per_100_ms() {
        assert_eq!(cpu_max(1000), "100000 100000");
        assert_eq!(cpu_max(250), "25000 100000");
        assert_eq!(cpu_max(2500), "250000 100000");
        assert_eq!(cpu_max(1), "1000 100000", "the kernel's smallest quota");
    }

    /// On a real cgroup v2 file system (when this process may write one): a process joins
    /// its cgroup before exec, and removing the cgroup kills what still runs in it. Limits
    /// are not set here, so any writable cgroup v2 directory will do.
    #[tokio::test]
    async fn a_real_task_cgroup_is_joined_before_exec_and_emptied_on_removal() {
        let Some(dir) = writable_cgroup2() else {
            eprintln!("no writable cgroup v2 directory here: this test does not run");
            return;
        };
        let d = Delegated { dir: dir.clone() };
        let name = format!("unit-{}", uuid::Uuid::new_v4().simple());
        let cg = d.create(&name, None, None).expect("creating a task cgroup");
        let procs = cg.procs_file().clone();
        let mut cmd = std::process::Command::new("sh");
        // The shell's child leaves the process group: only the cgroup still holds it.
        cmd.args(["-c", "setsid sleep 60 & echo $!; wait"])
            .stdout(std::process::Stdio::piped());
        // SAFETY: join_in_child only makes system calls.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(move || join_in_child(&procs));
        }
        let mut child = cmd.spawn().expect("spawning into the cgroup");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let grandchild: i32 = line.trim().parse().unwrap();
        let membership = std::fs::read_to_string(format!("/proc/{grandchild}/cgroup")).unwrap();
        assert!(
            membership
                .lines()
                .any(|l| l.starts_with("0::") && l.ends_with(&format!("task-{name}"))),
            "the process and its children run in the task's cgroup: {membership}"
        );
        let path = cg.path().to_owned();
        cg.remove().await.expect("removing the task cgroup");
        assert!(!path.exists(), "the cgroup is removed");
        let _ = child.wait();
        let gone = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            std::fs::read_to_string(format!("/proc/{grandchild}/stat"))
                .map_or(true, |s| s.contains(") Z "))
        });
        assert!(
            gone,
            "a process that left the task's process group is killed with the cgroup"
        );
    }

    fn writable_cgroup2() -> Option<PathBuf> {
        let own = own_cgroup().ok()?;
        (writable(&own) && own.join("cgroup.procs").exists()).then_some(own)
    }
}
