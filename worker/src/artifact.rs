//! Executables kept outside the task row: fetched from `file://`, `http(s)://` or Postgres
//! (`pg:<sha256>`, table `sked.artifacts`), checked against the task's SHA-256, cached by
//! hash so each worker fetches an artifact once, and copied into each attempt's directory.
//!
//! The URL is the task's and the worker reads it with its own rights, so (see
//! `docs/runtime.md`, "Artifacts"): `file://` reads only beneath the directories the operator
//! allows, a download is bounded in size and time and stops when the attempt is stopped, a
//! refused hash never shows the content's own hash, the cache is private to the worker's
//! user and bounded in size, and a task runs its own read-only copy, never the cache's file.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// The worker's flags for artifacts (part of its flags).
#[derive(Debug, Clone, clap::Args)]
pub struct ArtifactArgs {
    /// A directory `file://` artifacts may be read from, with everything beneath it;
    /// repeatable, or comma-separated. Without one, every `file://` artifact is refused.
    #[arg(
        long = "artifact-dir",
        env = "SKED_ARTIFACT_DIRS",
        value_delimiter = ','
    )]
    pub artifact_dirs: Vec<PathBuf>,
    /// Size of the artifact cache in MB: past it the least recently used artifacts go.
    #[arg(long, env = "SKED_ARTIFACT_CACHE_MB", default_value_t = 1024)]
    pub artifact_cache_mb: u64,
    /// Largest artifact the worker fetches, in MB.
    #[arg(long, env = "SKED_ARTIFACT_MAX_MB", default_value_t = 512)]
    pub artifact_max_mb: u64,
    /// Time an artifact's download may take, connection included, in seconds.
    #[arg(
        long,
        env = "SKED_ARTIFACT_TIMEOUT_SECS",
        allow_negative_numbers = true,
        default_value_t = 300.0
    )]
    pub artifact_timeout_secs: f64,
}

impl Default for ArtifactArgs {
    fn default() -> ArtifactArgs {
        ArtifactArgs {
            artifact_dirs: vec![],
            artifact_cache_mb: 1024,
            artifact_max_mb: 512,
            artifact_timeout_secs: 300.0,
        }
    }
}

/// Validated artifact settings.
#[derive(Debug, Clone)]
pub struct ArtifactSettings {
    /// The directories `file://` artifacts may come from, resolved (no symlinks, no `..`).
    pub dirs: Vec<PathBuf>,
    /// Bytes the cache may hold.
    pub cache_bytes: u64,
    /// Bytes one artifact may have.
    pub max_bytes: u64,
    /// Time one download may take, connection included.
    pub timeout: Duration,
    /// Time the connection of a download may take.
    pub connect_timeout: Duration,
}

impl ArtifactArgs {
    /// Validates the flags; each `--artifact-dir` must be an existing directory.
    pub fn into_settings(self) -> Result<ArtifactSettings, String> {
        let mut dirs = Vec::new();
        for dir in self
            .artifact_dirs
            .into_iter()
            .filter(|d| !d.as_os_str().is_empty())
        {
            if !dir.is_absolute() {
                return Err(format!(
                    "--artifact-dir {}: the directory must be an absolute path",
                    dir.display()
                ));
            }
            let real = std::fs::canonicalize(&dir)
                .map_err(|e| format!("--artifact-dir {}: {e}", dir.display()))?;
            if !real.is_dir() {
                return Err(format!("--artifact-dir {}: not a directory", dir.display()));
            }
            dirs.push(real);
        }
        let mb = |value: u64, flag: &str| match value {
            1..=1_048_576 => Ok(value << 20),
            _ => Err(format!(
                "--{flag} must be between 1 and 1048576 MB, got {value}"
            )),
        };
        let timeout = self.artifact_timeout_secs;
        if !timeout.is_finite() || !(0.1..=86_400.0).contains(&timeout) {
            return Err(format!(
                "--artifact-timeout-secs must be a number of seconds between 0.1 and 86400, got {timeout}"
            ));
        }
        let timeout = Duration::from_secs_f64(timeout);
        Ok(ArtifactSettings {
            dirs,
            cache_bytes: mb(self.artifact_cache_mb, "artifact-cache-mb")?,
            max_bytes: mb(self.artifact_max_mb, "artifact-max-mb")?,
            timeout,
            connect_timeout: timeout.min(Duration::from_secs(10)),
        })
    }
}

/// Why an artifact is not in the attempt's directory.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// The attempt was stopped (cancelled, the worker shutting down, the lease lost) while
    /// its artifact was fetched.
    #[error("stopped while fetching the artifact")]
    Stopped,
    /// The artifact cannot be had: the attempt fails with this message.
    #[error("{0}")]
    Failed(String),
}

fn failed(message: String) -> ArtifactError {
    ArtifactError::Failed(message)
}

/// The name of the attempt's copy of its artifact, in its working directory.
pub const COPY_NAME: &str = "sked_artifact";

/// The artifact cache of one worker and the clients that fill it.
pub struct Artifacts {
    pool: PgPool,
    http: reqwest::Client,
    /// `<work dir>/artifacts`: mode 0700, owned by the worker's user.
    cache: PathBuf,
    settings: ArtifactSettings,
}

impl Artifacts {
    /// The largest artifact this worker fetches or stores (`--artifact-max-mb`), in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.settings.max_bytes
    }

    /// Prepares the cache directory (private to the worker's user; a symlink or a directory
    /// of another user is refused) and evicts it down to its size.
    pub fn start(
        pool: PgPool,
        work_dir: &Path,
        settings: ArtifactSettings,
    ) -> Result<Artifacts, String> {
        let cache = work_dir.join("artifacts");
        prepare_cache(&cache, settings.timeout)
            .map_err(|e| format!("preparing the artifact cache {}: {e}", cache.display()))?;
        // The whole download's limit is kept by `download`, which then names the flag.
        let http = reqwest::Client::builder()
            .connect_timeout(settings.connect_timeout)
            .build()
            .map_err(|e| format!("setting up the artifacts' HTTP client: {e}"))?;
        evict(&cache, settings.cache_bytes);
        Ok(Artifacts {
            pool,
            http,
            cache,
            settings,
        })
    }

    /// Puts a read-only copy (mode 0500, owned by `owner` when given) of the artifact into
    /// the attempt's directory `dir` and answers its path. The artifact comes from the cache
    /// when it is there and still has its hash, else it is fetched, checked and cached first;
    /// the fetch ends when `stop` is cancelled.
    pub async fn install(
        &self,
        url: &str,
        sha256: &str,
        dir: &Path,
        owner: Option<(u32, u32)>,
        stop: &CancellationToken,
    ) -> Result<PathBuf, ArtifactError> {
        if !is_sha256(sha256) {
            return Err(failed(format!(
                "artifact_sha256 {sha256:?} is not a SHA-256"
            )));
        }
        let dest = dir.join(COPY_NAME);
        let cached = self.cache.join(sha256);
        let copy_error = |e: std::io::Error| {
            failed(format!(
                "copying artifact {url} into the task's directory: {e}"
            ))
        };
        match open_private(&cached) {
            Ok(file) => {
                // Its time of last use orders the eviction.
                let _ = file.set_modified(SystemTime::now());
                if copy_to_task(file, sha256, &dest, owner)
                    .await
                    .map_err(copy_error)?
                {
                    return Ok(dest);
                }
                tracing::warn!(
                    sha256,
                    "a cached artifact no longer has its hash: fetching it again"
                );
                let _ = std::fs::remove_file(&cached);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(failed(format!(
                    "reading the cached artifact {}: {e}",
                    cached.display()
                )));
            }
        }
        let fetched = self.fetch(url, sha256, &cached, stop).await?;
        if !copy_to_task(fetched, sha256, &dest, owner)
            .await
            .map_err(copy_error)?
        {
            return Err(failed(format!(
                "artifact {url} changed in the cache while it was copied"
            )));
        }
        let (cache, cap) = (self.cache.clone(), self.settings.cache_bytes);
        let _ = tokio::task::spawn_blocking(move || evict(&cache, cap)).await;
        Ok(dest)
    }

    /// Fetches the artifact into the cache as `cached` and answers the cached file, open.
    async fn fetch(
        &self,
        url: &str,
        sha256: &str,
        cached: &Path,
        stop: &CancellationToken,
    ) -> Result<File, ArtifactError> {
        let mut download = Download::create(&self.cache, url, self.settings.max_bytes)?;
        if let Some(path) = url.strip_prefix("file://") {
            let source = self.open_file(url, path)?;
            download = tokio::task::spawn_blocking(move || {
                download.copy_from(source)?;
                Ok::<_, ArtifactError>(download)
            })
            .await
            .map_err(|e| failed(format!("reading artifact {url}: {e}")))??;
        } else if let Some(sha) = url.strip_prefix("pg:") {
            let bytes = tokio::select! {
                loaded = sked_db::worker::artifact(&self.pool, sha) => loaded
                    .map_err(|e| failed(format!("loading artifact {url}: {e}")))?
                    .ok_or_else(|| failed(format!("artifact {url} is not in sked.artifacts")))?,
                _ = stop.cancelled() => return Err(ArtifactError::Stopped),
            };
            download.write(&bytes)?;
        } else if url.starts_with("http://") || url.starts_with("https://") {
            self.download(url, &mut download, stop).await?;
        } else {
            return Err(failed(format!(
                "artifact URL {url:?} has an unsupported scheme"
            )));
        }
        download.finish(sha256, cached)
    }

    /// Streams an HTTP(S) body into `download`, within the timeout, until `stop`.
    async fn download(
        &self,
        url: &str,
        download: &mut Download,
        stop: &CancellationToken,
    ) -> Result<(), ArtifactError> {
        let timed_out = || {
            failed(format!(
                "artifact {url} was not downloaded within the limit of {} s \
                 (--artifact-timeout-secs)",
                self.settings.timeout.as_secs_f64()
            ))
        };
        let http_error = |e: reqwest::Error| {
            if e.is_connect() && e.is_timeout() {
                failed(format!(
                    "artifact {url}: no connection within {} s",
                    self.settings.connect_timeout.as_secs_f64()
                ))
            } else {
                failed(format!("downloading artifact {url}: {e}"))
            }
        };
        let body = async {
            let mut response = self
                .http
                .get(url)
                .send()
                .await
                .and_then(|r| r.error_for_status())
                .map_err(http_error)?;
            if response.content_length().unwrap_or(0) > download.max {
                return Err(download.too_large());
            }
            while let Some(chunk) = response.chunk().await.map_err(http_error)? {
                download.write(&chunk)?;
            }
            Ok(())
        };
        tokio::select! {
            done = tokio::time::timeout(self.settings.timeout, body) => {
                done.unwrap_or_else(|_| Err(timed_out()))
            }
            _ = stop.cancelled() => Err(ArtifactError::Stopped),
        }
    }

    /// Opens a `file://` artifact: only a regular file whose resolved path lies beneath an
    /// allowed directory, opened beneath that directory without following any symlink (so
    /// nothing swapped in after the resolution escapes it) and without blocking.
    fn open_file(&self, url: &str, path: &str) -> Result<File, ArtifactError> {
        let refuse = |why: &str| failed(format!("artifact {url} refused: {why}"));
        let not_beneath = || {
            refuse(
                "the file is not beneath a directory this worker allows file:// artifacts \
                 from (--artifact-dir)",
            )
        };
        if self.settings.dirs.is_empty() {
            return Err(refuse(
                "this worker allows no directory to read file:// artifacts from; its \
                 operator allows one with --artifact-dir",
            ));
        }
        let path = Path::new(path);
        let real = match std::fs::canonicalize(path) {
            Ok(real) => real,
            // Whether a path outside the allowed directories exists is not told.
            Err(e) if self.lexically_allowed(path) => {
                return Err(failed(format!("reading artifact {url}: {e}")));
            }
            Err(_) => return Err(not_beneath()),
        };
        let (base, beneath) = self
            .settings
            .dirs
            .iter()
            .find_map(|dir| {
                let rest = real.strip_prefix(dir).ok()?;
                (!rest.as_os_str().is_empty()).then_some((dir, rest))
            })
            .ok_or_else(not_beneath)?;
        let file = open_beneath(base, beneath).map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP | libc::EXDEV) => not_beneath(),
            _ => failed(format!("reading artifact {url}: {e}")),
        })?;
        let meta = file
            .metadata()
            .map_err(|e| failed(format!("reading artifact {url}: {e}")))?;
        if !meta.is_file() {
            return Err(refuse("it is not a regular file"));
        }
        if meta.len() > self.settings.max_bytes {
            return Err(too_large(url, self.settings.max_bytes));
        }
        Ok(file)
    }

    /// True when `path`, as written, names something beneath an allowed directory.
    fn lexically_allowed(&self, path: &Path) -> bool {
        let plain = path
            .components()
            .all(|c| !matches!(c, Component::ParentDir | Component::CurDir));
        plain && self.settings.dirs.iter().any(|d| path.starts_with(d))
    }
}

fn is_sha256(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

fn too_large(url: &str, max: u64) -> ArtifactError {
    failed(format!(
        "artifact {url} is larger than the limit of {max} bytes (--artifact-max-mb)"
    ))
}

/// An artifact being fetched: a temporary file in the cache (mode 0600), its hash and size so
/// far; removed when dropped unless it was stored.
struct Download {
    file: File,
    path: PathBuf,
    url: String,
    hasher: Sha256,
    len: u64,
    max: u64,
    stored: bool,
}

impl Download {
    fn create(cache: &Path, url: &str, max: u64) -> Result<Download, ArtifactError> {
        let path = cache.join(format!(".{}.tmp", uuid::Uuid::new_v4().simple()));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| failed(format!("caching artifact {url}: {e}")))?;
        Ok(Download {
            file,
            path,
            url: url.to_owned(),
            hasher: Sha256::new(),
            len: 0,
            max,
            stored: false,
        })
    }

    fn too_large(&self) -> ArtifactError {
        too_large(&self.url, self.max)
    }

    /// Appends bytes, refusing the artifact as soon as it passes the size cap.
    fn write(&mut self, bytes: &[u8]) -> Result<(), ArtifactError> {
        self.len += bytes.len() as u64;
        if self.len > self.max {
            return Err(self.too_large());
        }
        self.hasher.update(bytes);
        self.file
            .write_all(bytes)
            .map_err(|e| failed(format!("caching artifact {}: {e}", self.url)))
    }

    /// Copies a file, up to the size cap.
    fn copy_from(&mut self, mut source: File) -> Result<(), ArtifactError> {
        let mut buf = vec![0; 64 << 10];
        loop {
            let n = source
                .read(&mut buf)
                .map_err(|e| failed(format!("reading artifact {}: {e}", self.url)))?;
            if n == 0 {
                return Ok(());
            }
            self.write(&buf[..n])?;
        }
    }

    /// Checks the hash (a mismatch says which hash was expected, never the content's) and
    /// stores the file as `dest`; answers it, open at its start.
    fn finish(mut self, sha256: &str, dest: &Path) -> Result<File, ArtifactError> {
        let actual = hex::encode(std::mem::take(&mut self.hasher).finalize());
        if actual != sha256 {
            return Err(failed(format!(
                "artifact {} refused: its content differs from the SHA-256 the task expects, \
                 {sha256}",
                self.url
            )));
        }
        let cache_error = |e: std::io::Error| failed(format!("caching artifact {}: {e}", self.url));
        let mut file = self.file.try_clone().map_err(cache_error)?;
        std::fs::rename(&self.path, dest).map_err(cache_error)?;
        self.stored = true;
        file.seek(SeekFrom::Start(0)).map_err(cache_error)?;
        Ok(file)
    }
}

impl Drop for Download {
    fn drop(&mut self) {
        if !self.stored {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Opens a file of the worker's own (the cache) for reading, not following a symlink.
fn open_private(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
}

/// Copies `source` to `dest` (which must not exist yet) while hashing it; answers false, and
/// leaves no `dest`, when the content does not have the hash. The copy is mode 0500 and
/// owned by `owner` when given.
async fn copy_to_task(
    source: File,
    sha256: &str,
    dest: &Path,
    owner: Option<(u32, u32)>,
) -> std::io::Result<bool> {
    let (sha256, dest) = (sha256.to_owned(), dest.to_owned());
    tokio::task::spawn_blocking(move || {
        let mut source = source;
        let mut out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o500)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&dest)?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0; 64 << 10];
        loop {
            let n = source.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])?;
        }
        if hex::encode(hasher.finalize()) != sha256 {
            drop(out);
            std::fs::remove_file(&dest)?;
            return Ok(false);
        }
        out.set_permissions(std::fs::Permissions::from_mode(0o500))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&out, Some(uid), Some(gid))?;
        }
        Ok(true)
    })
    .await
    .map_err(std::io::Error::other)?
}

/// Opens `beneath` (relative, without symlinks) inside the directory `base` with `openat2`:
/// never above `base`, never through a symlink, never blocking, read-only.
fn open_beneath(base: &Path, beneath: &Path) -> std::io::Result<File> {
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(base)?;
    let name = CString::new(beneath.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `open_how` is plain data; all-zero is its "nothing requested" value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: the descriptor, the NUL-terminated name and `how` outlive the call, and the
    // size passed is `how`'s.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            name.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOSYS) {
            return Err(std::io::Error::other(
                "file:// artifacts need openat2 (Linux 5.6 or later)",
            ));
        }
        return Err(e);
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd as i32) })
}

/// Creates the cache directory private to the worker's user, or makes an existing one so;
/// removes downloads left unfinished for longer than a download may take.
fn prepare_cache(dir: &Path, stale: Duration) -> std::io::Result<()> {
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(std::io::Error::other(
            "it is not a directory (a symlink is refused)",
        ));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(std::io::Error::other(format!(
            "it belongs to uid {}, not to this worker's user (uid {me})",
            meta.uid()
        )));
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    for entry in std::fs::read_dir(dir)?.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let unfinished = name.starts_with('.') && name.ends_with(".tmp");
        let old = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age > stale);
        if unfinished && old {
            let _ = std::fs::remove_file(entry.path());
        } else if meta.is_file() && !unfinished {
            // Only the worker's user reads the cache.
            let _ = std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o600));
        }
    }
    Ok(())
}

/// Removes the least recently used artifacts (by modification time, set on every use) until
/// the cache holds at most `cap` bytes.
fn evict(dir: &Path, cap: u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut cached: Vec<(SystemTime, u64, PathBuf)> = entries
        .flatten()
        .filter(|e| is_sha256(&e.file_name().to_string_lossy()))
        .filter_map(|e| {
            let meta = e.metadata().ok().filter(|m| m.is_file())?;
            Some((meta.modified().ok()?, meta.len(), e.path()))
        })
        .collect();
    let mut total: u64 = cached.iter().map(|(_, len, _)| len).sum();
    cached.sort();
    for (_, len, path) in cached {
        if total <= cap {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            total -= len;
            tracing::info!(artifact = %path.display(), bytes = len, "evicted from the artifact cache");
        }
    }
}
