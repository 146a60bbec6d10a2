//! A private PostgreSQL cluster for `sked dev`, made from the PostgreSQL server binaries
//! installed on this machine: found ([`PgBinaries::find`]), initialised on first use, started on
//! a loopback port ([`Cluster::start`]) and stopped with `pg_ctl stop -m fast` ([`Cluster::stop`]).
//!
//! The cluster's data directory holds, besides PostgreSQL's own files:
//! - `postgres.log`, the server log (`pg_ctl -l`);
//! - `sked.conf`, included from `postgresql.conf`: loopback-only listening, the port and the
//!   unix socket directory (the data directory itself);
//! - `sked-port`, the port of the last start, so the next start uses the same one.
//!
//! PostgreSQL refuses to run as root. When sked runs as root, every PostgreSQL command runs as
//! the owner of an existing data directory, or else as the `postgres` user, and the data
//! directory is created owned by that user. When that user cannot reach the requested directory
//! (a project under `/root`, say), the cluster lives under the system temp directory instead, in
//! a folder named after a hash of the requested path, and [`Cluster::notes`] says so.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;

use sqlx::{ConnectOptions, Connection};
use tokio::process::Command;

/// The port a new cluster prefers; another free port is taken when it is busy.
pub const DEFAULT_PORT: u16 = 54329;

/// Folders searched for the server binaries after `PATH`, in this order. A `*` matches any
/// version; higher versions come first.
const WELL_KNOWN: &[&str] = &[
    "/usr/lib/postgresql/*/bin",
    "/usr/local/opt/postgresql*/bin",
    "/opt/homebrew/opt/postgresql*/bin",
    "/opt/homebrew/bin",
    "/usr/local/pgsql/bin",
];

const TOOLS: [&str; 3] = ["initdb", "pg_ctl", "postgres"];

#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error(
        "no PostgreSQL server binaries (initdb, pg_ctl, postgres) found on PATH or in {searched}.\n\
         Install them (Debian/Ubuntu: `apt-get install postgresql`; macOS: `brew install postgresql@16`), \
         or set DATABASE_URL to use an existing PostgreSQL server"
    )]
    NotInstalled { searched: String },
    #[error("{0} does not hold the PostgreSQL server binaries (initdb, pg_ctl, postgres)")]
    NotInDir(PathBuf),
    #[error(
        "PostgreSQL refuses to run as root and there is no `postgres` user to run it as: \
         create one (`useradd --system postgres`), run sked as a normal user, or set DATABASE_URL"
    )]
    NoUnprivilegedUser,
    #[error(
        "the PostgreSQL data directory {0} belongs to root, and PostgreSQL refuses to run as root: \
         remove it or chown it to an unprivileged user"
    )]
    OwnedByRoot(PathBuf),
    #[error("`{command}` failed ({status}){}", indent(output))]
    Command {
        command: String,
        status: String,
        output: String,
    },
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    #[error("{context}")]
    Sql {
        context: String,
        #[source]
        source: sqlx::Error,
    },
}

fn indent(output: &str) -> String {
    let text = output.trim();
    if text.is_empty() {
        return String::new();
    }
    let lines: String = text.lines().map(|l| format!("\n    {l}")).collect();
    format!(":{lines}")
}

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> PgError {
    let context = context.into();
    move |source| PgError::Io { context, source }
}

/// A folder holding `initdb`, `pg_ctl` and `postgres`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgBinaries {
    pub dir: PathBuf,
}

impl PgBinaries {
    /// Looks on `path_var` (the value of `PATH`) first, then in the usual install folders.
    pub fn find(path_var: Option<&OsStr>) -> Result<PgBinaries, PgError> {
        let mut candidates: Vec<PathBuf> = path_var
            .map(|p| std::env::split_paths(p).collect())
            .unwrap_or_default();
        for pattern in WELL_KNOWN {
            candidates.extend(expand(pattern));
        }
        candidates
            .into_iter()
            .find(|dir| holds_tools(dir))
            .map(|dir| PgBinaries { dir })
            .ok_or_else(|| PgError::NotInstalled {
                searched: WELL_KNOWN.join(", "),
            })
    }

    /// The binaries in `dir`, which must hold all of them.
    pub fn at(dir: PathBuf) -> Result<PgBinaries, PgError> {
        if holds_tools(&dir) {
            Ok(PgBinaries { dir })
        } else {
            Err(PgError::NotInDir(dir))
        }
    }

    fn tool(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

fn holds_tools(dir: &Path) -> bool {
    TOOLS.iter().all(|t| dir.join(t).is_file())
}

/// Expands one `*` in the next-to-last component of `pattern` (`/a/b*/bin`), newest version
/// first.
fn expand(pattern: &str) -> Vec<PathBuf> {
    let path = Path::new(pattern);
    let (Some(parent), Some(leaf)) = (path.parent(), path.file_name()) else {
        return vec![];
    };
    let Some(name) = parent.file_name().and_then(|n| n.to_str()) else {
        return vec![];
    };
    let Some((prefix, _)) = name.split_once('*') else {
        return vec![path.to_path_buf()];
    };
    let Some(root) = parent.parent() else {
        return vec![];
    };
    let Ok(entries) = std::fs::read_dir(root) else {
        return vec![];
    };
    let mut found: Vec<(Vec<u64>, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let rest = name.strip_prefix(prefix)?;
            Some((version_key(rest), e.path().join(leaf)))
        })
        .collect();
    found.sort_by(|a, b| b.0.cmp(&a.0));
    found.into_iter().map(|(_, p)| p).collect()
}

/// The numbers in a version-like string (`@16`, `15`, `14.2`), for sorting.
fn version_key(s: &str) -> Vec<u64> {
    s.split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty())
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The unprivileged user PostgreSQL commands run as when sked runs as root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RunAs {
    uid: u32,
    gid: u32,
}

fn postgres_user() -> Option<RunAs> {
    let name = CString::new("postgres").ok()?;
    // SAFETY: getpwnam returns null or a pointer to a static record, read at once.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return None;
    }
    // SAFETY: `pw` is non-null and points to a valid passwd record.
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    Some(RunAs { uid, gid })
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// FNV-1a: a stable hash of the requested path, naming the fallback directory.
fn path_hash(path: &Path) -> u64 {
    path.as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// A running private cluster.
#[derive(Debug)]
pub struct Cluster {
    bins: PgBinaries,
    run_as: Option<RunAs>,
    /// The data directory actually used.
    pub data_dir: PathBuf,
    pub port: u16,
    /// True when this start ran `initdb`.
    pub created: bool,
    /// True when the cluster was already running (from an earlier start) and is reused.
    pub reused: bool,
    /// Things the user should know, such as a relocated data directory.
    pub notes: Vec<String>,
}

impl Cluster {
    /// Initialises the cluster in `requested_dir` when it does not exist yet, and starts it
    /// unless it is already running.
    pub async fn start(bins: &PgBinaries, requested_dir: &Path) -> Result<Cluster, PgError> {
        let requested = std::path::absolute(requested_dir)
            .map_err(io_err(format!("resolving {}", requested_dir.display())))?;
        let mut notes = Vec::new();
        let (data_dir, run_as) = if is_root() {
            let parent = requested.parent().unwrap_or(Path::new("/")).to_path_buf();
            std::fs::create_dir_all(&parent)
                .map_err(io_err(format!("creating {}", parent.display())))?;
            let user = cluster_user(&requested)?;
            if can_reach(&parent, user).await {
                (requested, Some(user))
            } else {
                let fallback = std::env::temp_dir()
                    .join(format!("sked-dev-{:016x}", path_hash(&requested)))
                    .join("postgres");
                notes.push(format!(
                    "PostgreSQL cannot run as root, and its user cannot reach {}; \
                     the private cluster lives in {} instead",
                    requested.display(),
                    fallback.display()
                ));
                std::fs::create_dir_all(fallback.parent().expect("has a parent"))
                    .map_err(io_err(format!("creating {}", fallback.display())))?;
                let user = cluster_user(&fallback)?;
                (fallback, Some(user))
            }
        } else {
            (requested, None)
        };
        let mut cluster = Cluster {
            bins: bins.clone(),
            run_as,
            data_dir,
            port: 0,
            created: false,
            reused: false,
            notes,
        };
        if !cluster.data_dir.join("PG_VERSION").exists() {
            cluster.init().await?;
        }
        if let Some(port) = cluster.running_port().await {
            cluster.port = port;
            cluster.reused = true;
            return Ok(cluster);
        }
        cluster.port = cluster.choose_port();
        cluster.write_file("sked-port", &format!("{}\n", cluster.port))?;
        let socket_dir = cluster.data_dir.to_string_lossy().replace('\'', "''");
        // A unix socket path is limited to about 100 bytes; beyond that the cluster listens
        // on TCP only (sked connects over TCP anyway).
        let socket_dir = if socket_dir.len() > 90 {
            String::new()
        } else {
            socket_dir
        };
        cluster.write_file(
            "sked.conf",
            &format!(
                "# Written by `sked dev` on every start.\n\
                 listen_addresses = '127.0.0.1'\n\
                 port = {}\n\
                 unix_socket_directories = '{socket_dir}'\n",
                cluster.port
            ),
        )?;
        let log = cluster.data_dir.join("postgres.log");
        let out = cluster
            .pg_command("pg_ctl")
            .arg("start")
            .arg("-w")
            .args(["-t", "60"])
            .arg("-D")
            .arg(&cluster.data_dir)
            .arg("-l")
            .arg(&log)
            .output()
            .await
            .map_err(io_err("running pg_ctl start"))?;
        if !out.status.success() {
            let tail = log_tail(&log, 15);
            return Err(command_failed("pg_ctl start", &out, &tail));
        }
        Ok(cluster)
    }

    async fn init(&mut self) -> Result<(), PgError> {
        let dir = &self.data_dir;
        std::fs::create_dir_all(dir).map_err(io_err(format!("creating {}", dir.display())))?;
        if let Some(user) = self.run_as {
            std::os::unix::fs::chown(dir, Some(user.uid), Some(user.gid)).map_err(io_err(
                format!("handing {} to the postgres user", dir.display()),
            ))?;
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io_err(format!("setting the mode of {}", dir.display())))?;
        let out = self
            .pg_command("initdb")
            .arg("-D")
            .arg(dir)
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-locale",
            ])
            .output()
            .await
            .map_err(io_err("running initdb"))?;
        if !out.status.success() {
            return Err(command_failed("initdb", &out, ""));
        }
        let conf = dir.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf)
            .map_err(io_err(format!("reading {}", conf.display())))?;
        text.push_str("\n# Settings of `sked dev` (port, listen address, socket directory).\ninclude_if_exists = 'sked.conf'\n");
        std::fs::write(&conf, text).map_err(io_err(format!("writing {}", conf.display())))?;
        self.created = true;
        Ok(())
    }

    /// The port of the cluster when it is running (from `postmaster.pid`).
    async fn running_port(&self) -> Option<u16> {
        let status = self
            .pg_command("pg_ctl")
            .arg("status")
            .arg("-D")
            .arg(&self.data_dir)
            .output()
            .await
            .ok()?;
        if !status.status.success() {
            return None;
        }
        let pid = std::fs::read_to_string(self.data_dir.join("postmaster.pid")).ok()?;
        pid.lines().nth(3)?.trim().parse().ok()
    }

    /// The port of the previous start when it is free, else [`DEFAULT_PORT`], else any free one.
    fn choose_port(&self) -> u16 {
        let saved = std::fs::read_to_string(self.data_dir.join("sked-port"))
            .ok()
            .and_then(|s| s.trim().parse::<u16>().ok());
        let free = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
        saved
            .into_iter()
            .chain([DEFAULT_PORT])
            .find(|p| free(*p))
            .or_else(|| {
                std::net::TcpListener::bind(("127.0.0.1", 0))
                    .and_then(|l| l.local_addr())
                    .map(|a| a.port())
                    .ok()
            })
            .unwrap_or(DEFAULT_PORT)
    }

    fn write_file(&self, name: &str, contents: &str) -> Result<(), PgError> {
        let path = self.data_dir.join(name);
        std::fs::write(&path, contents).map_err(io_err(format!("writing {}", path.display())))?;
        if let Some(user) = self.run_as {
            std::os::unix::fs::chown(&path, Some(user.uid), Some(user.gid)).map_err(io_err(
                format!("handing {} to the postgres user", path.display()),
            ))?;
        }
        Ok(())
    }

    /// A command of the PostgreSQL binaries, run as the cluster's user from `/` (the current
    /// directory may be out of that user's reach).
    fn pg_command(&self, tool: &str) -> Command {
        let mut cmd = Command::new(self.bins.tool(tool));
        cmd.current_dir("/")
            .stdin(std::process::Stdio::null())
            .env_remove("PGDATA")
            .env("LC_MESSAGES", "C");
        if let Some(user) = self.run_as {
            cmd.uid(user.uid).gid(user.gid);
        }
        cmd
    }

    /// A URL of database `db` of this cluster, as the `postgres` superuser over TCP.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates database `name` unless it exists.
    pub async fn ensure_database(&self, name: &str) -> Result<(), PgError> {
        let sql_err = |context: &str| {
            let context = context.to_owned();
            move |source| PgError::Sql { context, source }
        };
        let options: sqlx::postgres::PgConnectOptions = self
            .url("postgres")
            .parse()
            .map_err(sql_err("parsing the cluster URL"))?;
        let mut conn = options
            .connect()
            .await
            .map_err(sql_err("connecting to the private cluster"))?;
        let exists: bool =
            sqlx::query_scalar("select exists (select 1 from pg_database where datname = $1)")
                .bind(name)
                .fetch_one(&mut conn)
                .await
                .map_err(sql_err("looking for the sked database"))?;
        if !exists {
            let ident = name.replace('"', "\"\"");
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("create database \"{ident}\"")))
                .execute(&mut conn)
                .await
                .map_err(sql_err("creating the sked database"))?;
        }
        conn.close().await.ok();
        Ok(())
    }

    /// Stops the cluster (`pg_ctl stop -m fast`): open sessions are disconnected and the data
    /// is flushed.
    pub async fn stop(&self) -> Result<(), PgError> {
        let out = self
            .pg_command("pg_ctl")
            .arg("stop")
            .args(["-m", "fast", "-w", "-t", "60"])
            .arg("-D")
            .arg(&self.data_dir)
            .output()
            .await
            .map_err(io_err("running pg_ctl stop"))?;
        if !out.status.success() {
            return Err(command_failed("pg_ctl stop", &out, ""));
        }
        Ok(())
    }

    /// True when `pg_ctl status` reports the cluster running.
    pub async fn is_running(&self) -> bool {
        self.running_port().await.is_some()
    }
}

/// The user to run PostgreSQL as (sked runs as root): the owner of an initialised data
/// directory, else the `postgres` user.
fn cluster_user(dir: &Path) -> Result<RunAs, PgError> {
    if let Ok(meta) = std::fs::metadata(dir.join("PG_VERSION")) {
        if meta.uid() == 0 {
            return Err(PgError::OwnedByRoot(dir.to_path_buf()));
        }
        return Ok(RunAs {
            uid: meta.uid(),
            gid: meta.gid(),
        });
    }
    postgres_user().ok_or(PgError::NoUnprivilegedUser)
}

/// True when `user` can enter `dir` (every folder on the way must be searchable).
async fn can_reach(dir: &Path, user: RunAs) -> bool {
    Command::new("/bin/sh")
        .args(["-c", "cd -- \"$1\"", "sh"])
        .arg(dir)
        .current_dir("/")
        .uid(user.uid)
        .gid(user.gid)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await
        .is_ok_and(|s| s.success())
}

fn command_failed(command: &str, out: &Output, log_tail: &str) -> PgError {
    let mut output = String::from_utf8_lossy(&out.stdout).into_owned();
    output.push_str(&String::from_utf8_lossy(&out.stderr));
    if !log_tail.is_empty() {
        output.push_str("\nlast lines of the server log:\n");
        output.push_str(log_tail);
    }
    PgError::Command {
        command: command.to_owned(),
        status: out.status.to_string(),
        output,
    }
}

fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_numerically() {
        assert!(version_key("16") > version_key("9"));
        assert!(version_key("@16") > version_key("@15"));
        assert_eq!(version_key(""), Vec::<u64>::new());
    }

    #[test]
    fn path_hash_is_stable() {
        assert_eq!(path_hash(Path::new("")), 0xcbf2_9ce4_8422_2325);
        assert_ne!(path_hash(Path::new("/a")), path_hash(Path::new("/b")));
    }
}
