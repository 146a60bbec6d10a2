//! Task working directories: `<work dir>/tasks/<worker id>/<task id>-<attempt>`, one per
//! attempt, owned by the user the task runs as (mode 0700), and removed when the attempt
//! ends, whatever the ending: the [`TaskDir`] guard removes it when dropped.
//!
//! Each worker holds an exclusive `flock` on `<work dir>/tasks/<worker id>.lock` while it
//! runs, and records its tasks' processes in `<work dir>/tasks/<worker id>.procs` (see
//! [`super::reaper`]). At start a worker kills the recorded processes and removes the
//! directories of workers whose lock nobody holds, so what a killed worker left behind goes
//! at the next start of any worker sharing the work dir, while the processes and directories
//! of running workers are left alone.
//!
//! The work dir itself must be private to the worker's user: a directory (not a symbolic
//! link) that this user owns and nobody else may write in. A worker creates it so (mode
//! 0711: others may pass through to their own task directory, not list or write) and refuses
//! one that is not, so a directory planted by another user of the host, or a link to a place
//! of its choice, never receives the worker's files.

use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use super::users::User;

/// This worker's directory of task directories, and its lock.
#[derive(Debug)]
pub struct WorkDirs {
    root: PathBuf,
    lock_path: PathBuf,
    _lock: File,
}

impl WorkDirs {
    /// Creates `<work_dir>/tasks/<worker>`, takes its lock and removes the task directories
    /// of workers that are gone.
    pub fn start(work_dir: &Path, worker: uuid::Uuid) -> std::io::Result<WorkDirs> {
        ensure_private(work_dir)?;
        let tasks = work_dir.join("tasks");
        std::fs::create_dir_all(&tasks)?;
        // Users the tasks run as pass through to their own directory; they cannot list
        // others'.
        std::fs::set_permissions(&tasks, std::fs::Permissions::from_mode(0o711))?;
        let lock_path = tasks.join(format!("{worker}.lock"));
        let lock = File::create(&lock_path)?;
        if !try_lock(&lock) {
            return Err(std::io::Error::other(format!(
                "{} is locked by another process",
                lock_path.display()
            )));
        }
        let root = tasks.join(worker.to_string());
        std::fs::create_dir_all(&root)?;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o711))?;
        let (removed, killed) = sweep(&tasks, &lock_path);
        if removed > 0 || killed > 0 {
            tracing::info!(
                removed,
                killed,
                "killed the task processes and removed the task directories of workers that are gone"
            );
        }
        Ok(WorkDirs {
            root,
            lock_path,
            _lock: lock,
        })
    }

    /// Where the working directory of an attempt is (while the attempt runs).
    pub fn path_of(&self, task: uuid::Uuid, attempt: i32) -> PathBuf {
        self.root.join(format!("{task}-{attempt}"))
    }

    /// Creates the working directory of one attempt, owned by `owner` when given.
    pub fn create(
        &self,
        task: uuid::Uuid,
        attempt: i32,
        owner: Option<&User>,
    ) -> std::io::Result<TaskDir> {
        let path = self.path_of(task, attempt);
        // A leftover of an attempt of the same number (a crash mid-way) goes first.
        if path.exists() {
            remove_all(&path)?;
        }
        std::fs::create_dir(&path)?;
        let dir = TaskDir { path };
        std::fs::set_permissions(&dir.path, std::fs::Permissions::from_mode(0o700))?;
        if let Some(user) = owner {
            chown(&dir.path, user)?;
        }
        Ok(dir)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file this worker records its tasks' processes in, for the next worker to kill
    /// should this one be killed.
    pub fn processes_file(&self) -> PathBuf {
        self.lock_path.with_extension(PROCESSES)
    }
}

/// The extension of a worker's record of its tasks' processes, beside its lock.
const PROCESSES: &str = "procs";

impl Drop for WorkDirs {
    fn drop(&mut self) {
        let _ = remove_all(&self.root);
        let _ = std::fs::remove_file(&self.lock_path);
    }
}

/// One attempt's working directory, removed when dropped.
#[derive(Debug)]
pub struct TaskDir {
    path: PathBuf,
}

impl TaskDir {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes a file for the task into the directory, owned by `owner` when given.
    pub fn write(
        &self,
        name: &str,
        bytes: &[u8],
        owner: Option<&User>,
    ) -> std::io::Result<PathBuf> {
        let path = self.path.join(name);
        std::fs::write(&path, bytes)?;
        if let Some(user) = owner {
            chown(&path, user)?;
        }
        Ok(path)
    }
}

impl Drop for TaskDir {
    fn drop(&mut self) {
        if let Err(e) = remove_all(&self.path) {
            tracing::warn!(error = %e, dir = %self.path.display(), "could not remove the task's working directory");
        }
    }
}

/// Creates `dir` (mode 0711, its missing parents as usual) unless it exists, then refuses it
/// unless it is a directory, not a symbolic link, owned by this process's user, and not
/// writable by its group or others.
pub fn ensure_private(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o711).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let refuse = |why: String| {
        Err(std::io::Error::other(format!(
            "{} {why}: a work directory must be a directory of this worker's user that \
             nobody else may write in (remove it, or choose another with --work-dir)",
            dir.display()
        )))
    };
    let meta = std::fs::symlink_metadata(dir)?;
    if meta.file_type().is_symlink() {
        return refuse("is a symbolic link".to_owned());
    }
    if !meta.is_dir() {
        return refuse("is not a directory".to_owned());
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return refuse(format!(
            "is owned by uid {}, not by this worker's user (uid {me})",
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return refuse(format!(
            "is not private: others may write in it (mode {:o})",
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

fn chown(path: &Path, user: &User) -> std::io::Result<()> {
    std::os::unix::fs::chown(path, Some(user.uid), Some(user.gid))
}

fn try_lock(file: &File) -> bool {
    // SAFETY: flock on an open descriptor has no memory-safety preconditions.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// Kills the recorded processes and removes the directories of workers whose lock file is
/// not locked; answers how many directories were removed and how many processes killed.
fn sweep(tasks: &Path, own_lock: &Path) -> (usize, usize) {
    let Ok(entries) = std::fs::read_dir(tasks) else {
        return (0, 0);
    };
    let (mut removed, mut killed) = (0, 0);
    for entry in entries.flatten() {
        let path = entry.path();
        if path == own_lock || path.extension().is_none_or(|e| e != "lock") {
            continue;
        }
        let Ok(lock) = File::open(&path) else {
            continue;
        };
        if !try_lock(&lock) {
            continue; // a live worker's
        }
        killed += super::reaper::kill_recorded(&path.with_extension(PROCESSES));
        let dir = path.with_extension("");
        if remove_all(&dir).is_ok() {
            removed += 1;
        }
        let _ = std::fs::remove_file(&path);
    }
    (removed, killed)
}

/// Removes a directory tree, also when the task took away its own permissions from parts
/// of it (a directory it made read-only, say), which a worker not running as root needs.
fn remove_all(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            make_writable(path);
            match std::fs::remove_dir_all(path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                other => other,
            }
        }
    }
}

fn make_writable(path: &Path) {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return;
    };
    if meta.is_dir() {
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700));
        if let Ok(entries) = std::fs::read_dir(path) {
            for entry in entries.flatten() {
                make_writable(&entry.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp() -> PathBuf {
        std::env::temp_dir().join(format!(
            "sked-workdir-test-{}",
            uuid::Uuid::new_v4().simple()
        ))
    }

    #[test]
    fn task_dirs_are_private_and_removed_when_dropped() {
        let work = temp();
        let dirs = WorkDirs::start(&work, uuid::Uuid::new_v4()).unwrap();
        let task = uuid::Uuid::new_v4();
        let dir = dirs.create(task, 3, None).unwrap();
        let path = dir.path().to_owned();
        assert_eq!(path, dirs.root().join(format!("{task}-3")));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::fs::create_dir(path.join("sub")).unwrap();
        std::fs::write(path.join("sub/f"), "x").unwrap();
        std::fs::set_permissions(path.join("sub"), std::fs::Permissions::from_mode(0o500)).unwrap();
        drop(dir);
        assert!(
            !path.exists(),
            "the guard removes the directory, read-only parts too"
        );
        drop(dirs);
        let _ = std::fs::remove_dir_all(&work);
    }

    #[test]
    fn a_dead_workers_directories_are_swept_and_a_live_ones_kept() {
        let work = temp();
        let live = WorkDirs::start(&work, uuid::Uuid::new_v4()).unwrap();
        let live_task = live.create(uuid::Uuid::new_v4(), 1, None).unwrap();
        // A worker killed without cleaning up: its directory and an unlocked lock file.
        let dead = uuid::Uuid::new_v4();
        let dead_dir = work.join("tasks").join(dead.to_string()).join("t-1");
        std::fs::create_dir_all(&dead_dir).unwrap();
        std::fs::write(work.join("tasks").join(format!("{dead}.lock")), "").unwrap();

        let next = WorkDirs::start(&work, uuid::Uuid::new_v4()).unwrap();
        assert!(
            !dead_dir.parent().unwrap().exists(),
            "the dead worker's directories are gone"
        );
        assert!(!work.join("tasks").join(format!("{dead}.lock")).exists());
        assert!(
            live_task.path().exists(),
            "a running worker's task directory stays"
        );
        drop((live_task, live, next));
        let _ = std::fs::remove_dir_all(&work);
    }
}
