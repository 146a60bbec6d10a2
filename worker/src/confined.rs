//! Reads a file a task left in its working directory without letting the task point the
//! worker anywhere else: the task's output (`$SKED_OUTPUT`) and its `output_path`.
//!
//! The worker usually runs as root and the task as another user, so whatever the task leaves
//! at such a path is hostile. A path is opened beneath the directory only: it must be
//! relative without a `..` component, and no component may be a symlink (Linux `openat2`
//! with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`; where the kernel
//! has no `openat2`, one component at a time with `O_NOFOLLOW`). The open never blocks
//! (`O_NONBLOCK`: a FIFO opens at once), the file must be a regular file owned by the
//! directory's owner (the task's user: a hard link to another user's file is refused), and
//! at most `cap + 1` bytes are ever read, so a file past the cap costs `cap` bytes of memory.

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// Why a file a task left was not read. Its text completes a sentence that names the file,
/// as in "the task's output ($SKED_OUTPUT) is not a regular file …".
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// Nothing is at the path.
    #[error("does not exist")]
    Missing,
    /// The path is absolute, has a `..` component, is empty or holds a NUL byte.
    #[error(
        "is not a relative path beneath the task's directory (an absolute path or a `..` \
         component is refused)"
    )]
    Escapes,
    /// A component is a symlink, or the file is not a regular file.
    #[error("is not a regular file beneath its directory (a symlink, FIFO or device is refused)")]
    NotRegular,
    /// The file belongs to another user than the directory's: a hard link the task made.
    #[error("belongs to another user (uid {0}) than the task and is refused")]
    OtherOwner(u32),
    /// The file has more than the cap.
    #[error("is larger than the limit of {0} bytes")]
    TooLarge(u64),
    /// Reading failed for another reason.
    #[error("cannot be read: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads the regular file at `path` beneath `dir`, at most `cap` bytes. Blocking, but never
/// on the task: call it from a blocking thread for files of any size.
pub fn read_beneath(dir: &Path, path: &Path, cap: u64) -> Result<Vec<u8>, Refused> {
    if !is_beneath(path) {
        return Err(Refused::Escapes);
    }
    // The directory is the worker's own path (its parents are the worker's and not writable
    // by the task); it is opened without following a symlink all the same.
    let dir = rustix::fs::open(
        dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(refusal)?;
    let owner = rustix::fs::fstat(&dir).map_err(refusal)?.st_uid;
    let fd = match open_beneath(&dir, path) {
        Err(Errno::NOSYS | Errno::PERM | Errno::TOOBIG) => walk_beneath(&dir, path),
        other => other,
    }
    .map_err(refusal)?;
    read_capped(std::fs::File::from(fd), owner, cap)
}

/// True for a path that stays beneath the directory it is joined to: relative, not empty,
/// without `..` components or NUL bytes. The schema holds `output_path` to the same rule
/// (`tasks_output_path_must_be_relative_beneath_the_task_directory`).
pub fn is_beneath(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    !path.as_os_str().is_empty()
        && !path.as_os_str().as_bytes().contains(&0)
        && path.components().all(|c| match c {
            Component::Normal(_) | Component::CurDir => true,
            Component::RootDir | Component::ParentDir | Component::Prefix(_) => false,
        })
}

/// The flags of the last open: read only, never blocking, never a controlling terminal.
fn file_flags() -> OFlags {
    OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC | OFlags::NOFOLLOW
}

/// One `openat2` call: the kernel refuses any symlink and any escape from `dir`.
fn open_beneath(dir: &OwnedFd, path: &Path) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat2(
        dir,
        path,
        file_flags(),
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
}

/// The same without `openat2`: each directory component opened from the previous one with
/// `O_NOFOLLOW | O_DIRECTORY`, the last with `O_NOFOLLOW`. A symlink anywhere fails with
/// `ELOOP` (or `ENOTDIR`); `..` never reaches here ([`is_beneath`]).
fn walk_beneath(dir: &OwnedFd, path: &Path) -> rustix::io::Result<OwnedFd> {
    let names: Vec<_> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name),
            _ => None,
        })
        .collect();
    let Some((last, parents)) = names.split_last() else {
        return Err(Errno::ISDIR); // "." alone: the directory itself
    };
    // Not `O_PATH`: with `O_NOFOLLOW` it would open a symlink itself instead of failing.
    let mut opened: Option<OwnedFd> = None;
    for name in parents {
        let base = opened.as_ref().map_or(dir.as_fd(), |fd| fd.as_fd());
        opened = Some(rustix::fs::openat(
            base,
            *name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?);
    }
    let base = opened.as_ref().map_or(dir.as_fd(), |fd| fd.as_fd());
    rustix::fs::openat(base, *last, file_flags(), Mode::empty())
}

/// Checks the opened file (regular, the directory owner's) and reads at most `cap` bytes.
fn read_capped(file: std::fs::File, owner: u32, cap: u64) -> Result<Vec<u8>, Refused> {
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(Refused::NotRegular);
    }
    if meta.uid() != owner {
        return Err(Refused::OtherOwner(meta.uid()));
    }
    if meta.len() > cap {
        return Err(Refused::TooLarge(cap));
    }
    // The size may still change while the task's processes live on: the read stops at
    // cap + 1 bytes whatever the size said.
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(cap.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(Refused::TooLarge(cap));
    }
    Ok(bytes)
}

/// The refusal an `open` error stands for.
fn refusal(errno: Errno) -> Refused {
    match errno {
        Errno::NOENT => Refused::Missing,
        // A symlink (ELOOP; ENOTDIR for one in place of a directory under O_DIRECTORY), an
        // escape (EXDEV), a socket (ENXIO), a directory (EISDIR).
        Errno::LOOP | Errno::XDEV | Errno::NOTDIR | Errno::NXIO | Errno::ISDIR => {
            Refused::NotRegular
        }
        other => Refused::Io(other.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn temp() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "sked-confined-test-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir(&dir).unwrap();
        dir
    }

    /// Both ways of opening: `openat2`, and the walk used where the kernel lacks it.
    fn open_both(dir: &Path, path: &str, cap: u64) -> [Result<Vec<u8>, Refused>; 2] {
        let base = rustix::fs::open(
            dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        let owner = std::fs::metadata(dir).unwrap().uid();
        let read = |fd: rustix::io::Result<OwnedFd>| {
            fd.map_err(refusal)
                .and_then(|fd| read_capped(std::fs::File::from(fd), owner, cap))
        };
        [
            read(open_beneath(&base, Path::new(path))),
            read(walk_beneath(&base, Path::new(path))),
        ]
    }

    #[test]
    fn a_regular_file_beneath_the_directory_is_read_up_to_the_cap() {
        let dir = temp();
        std::fs::create_dir(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/out.json"), b"{\"a\": 1}").unwrap();
        for result in open_both(&dir, "sub/out.json", 8) {
            assert_eq!(
                result.unwrap(),
                b"{\"a\": 1}",
                "a file of exactly the cap is read"
            );
        }
        for result in open_both(&dir, "./sub/out.json", 7) {
            assert!(
                matches!(result, Err(Refused::TooLarge(7))),
                "a file past the cap is refused"
            );
        }
        for result in open_both(&dir, "sub/none", 7) {
            assert!(matches!(result, Err(Refused::Missing)), "{result:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn symlinks_fifos_and_devices_are_refused_whichever_way_the_path_is_opened() {
        let dir = temp();
        let outside = temp();
        std::fs::write(outside.join("secret.json"), b"{\"secret\": 1}").unwrap();
        symlink(outside.join("secret.json"), dir.join("link")).unwrap();
        symlink(&outside, dir.join("linked_dir")).unwrap();
        symlink("/dev/zero", dir.join("zero")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            dir.join("fifo"),
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        for path in ["link", "linked_dir/secret.json", "zero", "fifo", "."] {
            for result in open_both(&dir, path, 1 << 20) {
                assert!(
                    matches!(result, Err(Refused::NotRegular)),
                    "{path}: only a regular file beneath the directory is read: {result:?}"
                );
            }
        }
        for path in ["/etc/passwd", "../x", "a/../../x", ""] {
            assert!(
                matches!(
                    read_beneath(&dir, Path::new(path), 1 << 20),
                    Err(Refused::Escapes)
                ),
                "{path:?}: an absolute or escaping path is refused before any open"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(&outside).unwrap();
    }

    #[test]
    fn a_file_of_another_user_than_the_directorys_is_refused() {
        // A file of another user in the directory, as a hard link the task made to it would
        // be. Only root may hand a file to another user: elsewhere there is nothing to test.
        let dir = temp();
        std::fs::write(dir.join("theirs.json"), b"{}").unwrap();
        if std::os::unix::fs::chown(dir.join("theirs.json"), Some(65534), None).is_ok() {
            for result in open_both(&dir, "theirs.json", 1 << 20) {
                assert!(
                    matches!(result, Err(Refused::OtherOwner(65534))),
                    "only the task's own files are read: {result:?}"
                );
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
