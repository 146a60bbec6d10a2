//! Executables kept outside the task row: fetched from `file://`, `http(s)://` or Postgres
//! (`pg:<sha256>`, table `sked.artifacts`), checked against the task's SHA-256, and cached
//! by hash so each worker fetches an artifact once.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use sqlx::PgPool;

/// Largest artifact a worker accepts.
pub const MAX_ARTIFACT_BYTES: usize = 512 * 1024 * 1024;

pub struct Artifacts {
    pool: PgPool,
    http: reqwest::Client,
    dir: PathBuf,
}

impl Artifacts {
    pub fn new(pool: PgPool, dir: PathBuf) -> Artifacts {
        Artifacts {
            pool,
            http: reqwest::Client::new(),
            dir,
        }
    }

    /// The path of the verified, executable artifact, fetching it when it is not cached.
    pub async fn get(&self, url: &str, sha256: &str) -> Result<PathBuf, String> {
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("artifact_sha256 {sha256:?} is not a SHA-256"));
        }
        let path = self.dir.join(sha256);
        if path.exists() {
            return Ok(path);
        }
        let bytes = self.fetch(url).await?;
        let actual = hex::encode(Sha256::digest(&bytes));
        if actual != sha256 {
            return Err(format!(
                "artifact {url} refused: its SHA-256 is {actual}, the task expects {sha256}"
            ));
        }
        store(&self.dir, &path, &bytes).map_err(|e| format!("caching artifact {url}: {e}"))?;
        Ok(path)
    }

    async fn fetch(&self, url: &str) -> Result<Vec<u8>, String> {
        if let Some(path) = url.strip_prefix("file://") {
            let data = tokio::fs::read(path)
                .await
                .map_err(|e| format!("reading artifact {url}: {e}"))?;
            return Ok(data);
        }
        if let Some(sha) = url.strip_prefix("pg:") {
            return sked_db::worker::artifact(&self.pool, sha)
                .await
                .map_err(|e| format!("loading artifact {url}: {e}"))?
                .ok_or_else(|| format!("artifact {url} is not in sked.artifacts"));
        }
        if url.starts_with("http://") || url.starts_with("https://") {
            let response = self
                .http
                .get(url)
                .send()
                .await
                .and_then(|r| r.error_for_status())
                .map_err(|e| format!("downloading artifact {url}: {e}"))?;
            if response.content_length().unwrap_or(0) as usize > MAX_ARTIFACT_BYTES {
                return Err(format!(
                    "artifact {url} is larger than {MAX_ARTIFACT_BYTES} bytes"
                ));
            }
            let bytes = response
                .bytes()
                .await
                .map_err(|e| format!("downloading artifact {url}: {e}"))?;
            if bytes.len() > MAX_ARTIFACT_BYTES {
                return Err(format!(
                    "artifact {url} is larger than {MAX_ARTIFACT_BYTES} bytes"
                ));
            }
            return Ok(bytes.to_vec());
        }
        Err(format!("artifact URL {url:?} has an unsupported scheme"))
    }
}

/// Writes to a temporary file and renames it into place, so a reader never sees half a file.
fn store(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{}.tmp", uuid::Uuid::new_v4().simple()));
    std::fs::write(&tmp, bytes)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&tmp, path)
}
