//! A Patroni cluster on this machine for the failover tests: one etcd member and three
//! PostgreSQL members, each with its Patroni, on free ports under a temporary directory.
//! Everything is killed and removed when the value is dropped, also when a test panics.
//!
//! PostgreSQL and Patroni refuse to run as root: when the test runs as root they run as the
//! `postgres` system user, in directories it owns.

use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;
use uuid::Uuid;

use crate::support::{free_port, process_alive};

/// Patroni's timing (`bootstrap.dcs`), small so a failover takes seconds: the leader key
/// lives `TTL` seconds, the HA loop runs every `LOOP_WAIT`, and a DCS or PostgreSQL call
/// is retried for `RETRY_TIMEOUT`. `primary_start_timeout: 0` fails over at once when the
/// primary's PostgreSQL crashes instead of restarting it in place.
pub const TTL: u32 = 10;
pub const LOOP_WAIT: u32 = 1;
pub const RETRY_TIMEOUT: u32 = 5;

/// The members' names.
const NAMES: [&str; 3] = ["m0", "m1", "m2"];

pub struct Member {
    pub name: &'static str,
    pub pg_port: u16,
    pub api_port: u16,
    pub data_dir: PathBuf,
    patroni: Option<Child>,
}

pub struct Cluster {
    pub root: PathBuf,
    pub members: Vec<Member>,
    /// The database superuser (the system user PostgreSQL runs as).
    pub superuser: String,
    etcd: Option<Child>,
    http: reqwest::Client,
}

/// The uid, gid and name servers run as: `postgres` when this process is root, else itself.
fn server_user() -> Result<(Option<(u32, u32)>, String), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        let name = std::env::var("USER")
            .ok()
            .filter(|u| !u.is_empty())
            .or_else(|| {
                let out = Command::new("id").arg("-un").output().ok()?;
                Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
            })
            .ok_or("cannot tell this user's name")?;
        return Ok((None, name));
    }
    let name = std::ffi::CString::new("postgres").unwrap();
    // SAFETY: getpwnam reads a static record; it is copied out at once, in a test that
    // calls no other getpw* function at the same time.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return Err("running as root and there is no `postgres` system user".into());
    }
    // SAFETY: pw is a valid record returned just above.
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    Ok((Some((uid, gid)), "postgres".into()))
}

fn chown(path: &Path, owner: Option<(u32, u32)>) {
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(path, Some(uid), Some(gid)).expect("chown to postgres");
    }
}

/// Patroni's configuration of one member.
fn patroni_yaml(
    member: &Member,
    dir: &Path,
    etcd_port: u16,
    bin_dir: &Path,
    superuser: &str,
    synchronous: bool,
) -> String {
    format!(
        "scope: sked-failover
name: {name}
log:
  level: INFO
restapi:
  listen: 127.0.0.1:{api}
  connect_address: 127.0.0.1:{api}
etcd3:
  hosts: 127.0.0.1:{etcd_port}
bootstrap:
  dcs:
    ttl: {TTL}
    loop_wait: {LOOP_WAIT}
    retry_timeout: {RETRY_TIMEOUT}
    primary_start_timeout: 0
    synchronous_mode: {synchronous}
    maximum_lag_on_failover: 1048576
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_log_hints: 'on'
        hot_standby: 'on'
        max_wal_senders: 10
        max_replication_slots: 10
        max_connections: 100
  initdb:
    - encoding: UTF8
    - auth: trust
postgresql:
  listen: 127.0.0.1:{pg}
  connect_address: 127.0.0.1:{pg}
  data_dir: {data}
  bin_dir: {bin}
  pgpass: {dir}/pgpass
  authentication:
    superuser:
      username: {superuser}
    replication:
      username: {superuser}
    rewind:
      username: {superuser}
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
  parameters:
    unix_socket_directories: '{dir}'
    shared_buffers: 32MB
",
        name = member.name,
        api = member.api_port,
        pg = member.pg_port,
        data = member.data_dir.display(),
        bin = bin_dir.display(),
        dir = dir.display(),
    )
}

impl Cluster {
    /// Starts etcd and the three members and waits until one leads and the others stream
    /// from it (one of them as the synchronous standby when `synchronous`). `Err` says why
    /// it cannot run here (the test is then skipped).
    pub async fn start(
        patroni: &Path,
        etcd: &Path,
        bin_dir: &Path,
        synchronous: bool,
    ) -> Result<Cluster, String> {
        let (owner, superuser) = server_user()?;
        let root = std::env::temp_dir().join(format!("sked-failover-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&root).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();

        let etcd_client = free_port();
        let etcd_peer = free_port();
        let mut cluster = Cluster {
            root: root.clone(),
            members: NAMES
                .iter()
                .map(|name| Member {
                    name,
                    pg_port: free_port(),
                    api_port: free_port(),
                    data_dir: root.join(name).join("data"),
                    patroni: None,
                })
                .collect(),
            superuser: superuser.clone(),
            etcd: None,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(2))
                .build()
                .unwrap(),
        };

        let etcd_dir = root.join("etcd");
        let etcd_log = std::fs::File::create(root.join("etcd.log")).unwrap();
        let client_url = format!("http://127.0.0.1:{etcd_client}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer}");
        cluster.etcd = Some(
            Command::new(etcd)
                .args(["--name", "e0", "--data-dir"])
                .arg(&etcd_dir)
                .args(["--listen-client-urls", &client_url])
                .args(["--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &format!("e0={peer_url}")])
                .stdin(Stdio::null())
                .stdout(etcd_log.try_clone().unwrap())
                .stderr(etcd_log)
                .spawn()
                .map_err(|e| format!("starting etcd: {e}"))?,
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cluster
            .http
            .get(format!("{client_url}/health"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            assert!(
                Instant::now() < deadline,
                "etcd should answer at {client_url}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        for member in &mut cluster.members {
            let dir = root.join(member.name);
            std::fs::create_dir_all(&dir).unwrap();
            chown(&dir, owner);
            let yaml = patroni_yaml(member, &dir, etcd_client, bin_dir, &superuser, synchronous);
            let config = dir.join("patroni.yml");
            std::fs::File::create(&config)
                .and_then(|mut f| f.write_all(yaml.as_bytes()))
                .unwrap();
            chown(&config, owner);
            let log = std::fs::File::create(dir.join("patroni.log")).unwrap();
            chown(&dir.join("patroni.log"), owner);
            let mut cmd = Command::new(patroni);
            cmd.arg(&config)
                .current_dir(&dir)
                .env("HOME", &dir)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .process_group(0);
            if let Some((uid, gid)) = owner {
                cmd.uid(uid).gid(gid);
            }
            member.patroni = Some(cmd.spawn().map_err(|e| format!("starting patroni: {e}"))?);
        }
        cluster
            .wait_healthy(synchronous, Duration::from_secs(90))
            .await;
        Ok(cluster)
    }

    /// The database URL naming every member, libpq style, for sessions that must write.
    pub fn url(&self, db: &str) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.pg_port))
            .collect();
        format!(
            "postgres://{}@{}/{db}?target_session_attrs=read-write",
            self.superuser,
            hosts.join(",")
        )
    }

    /// The URL of one member only.
    pub fn member_url(&self, member: usize, db: &str) -> String {
        format!(
            "postgres://{}@127.0.0.1:{}/{db}",
            self.superuser, self.members[member].pg_port
        )
    }

    /// Patroni's view of the cluster (`GET /cluster`), from the first member that answers.
    pub async fn state(&self) -> Option<Value> {
        for m in &self.members {
            let url = format!("http://127.0.0.1:{}/cluster", m.api_port);
            if let Ok(r) = self.http.get(&url).send().await
                && let Ok(v) = r.json::<Value>().await
            {
                return Some(v);
            }
        }
        None
    }

    /// The member that leads and runs, if any.
    pub async fn leader(&self) -> Option<usize> {
        let state = self.state().await?;
        let name = state["members"].as_array()?.iter().find_map(|m| {
            (m["role"] == "leader" && m["state"] == "running").then(|| m["name"].clone())
        })?;
        self.members.iter().position(|m| name == m.name)
    }

    /// Waits until a leader runs and both other members stream from it on its timeline (one
    /// as the synchronous standby when `synchronous`); answers the leader.
    pub async fn wait_healthy(&self, synchronous: bool, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        let mut last = None;
        loop {
            if let Some(state) = self.state().await {
                let members = state["members"].as_array().cloned().unwrap_or_default();
                let leader = members
                    .iter()
                    .find(|m| m["role"] == "leader" && m["state"] == "running");
                let sync = members.iter().any(|m| m["role"] == "sync_standby");
                // Every other member runs on the leader's timeline and streams (has a lag).
                let streaming = leader.is_some_and(|l| {
                    members.iter().all(|m| {
                        m == l
                            || (m["state"] == "running"
                                && m["timeline"] == l["timeline"]
                                && m["lag"].is_u64())
                    })
                });
                if members.len() == self.members.len()
                    && streaming
                    && (sync || !synchronous)
                    && let Some(i) = self.leader().await
                {
                    return i;
                }
                last = Some(state);
            }
            assert!(
                Instant::now() < deadline,
                "the Patroni cluster should be healthy within {within:?}; last state: {last:?}; \
                 logs in {}",
                self.root.display()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The pid of a member's postmaster (`postmaster.pid`'s first line).
    pub fn postmaster(&self, member: usize) -> i32 {
        let pid_file = self.members[member].data_dir.join("postmaster.pid");
        let text = std::fs::read_to_string(&pid_file)
            .unwrap_or_else(|e| panic!("reading {}: {e}", pid_file.display()));
        text.lines().next().unwrap().trim().parse().unwrap()
    }

    /// Pids of live processes working in a directory under `dir` (PostgreSQL's processes
    /// work in their data directory).
    fn processes_under(dir: &Path) -> Vec<i32> {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return vec![];
        };
        entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd.starts_with(dir))
            })
            .filter(|pid| process_alive(*pid))
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(mut p) = m.patroni.take() {
                // The whole process group: Patroni and what it started in it (pg_basebackup,
                // pg_rewind); PostgreSQL runs in a session of its own, killed below.
                // SAFETY: kill has no memory preconditions; the group is Patroni's own.
                unsafe { libc::kill(-(p.id() as i32), libc::SIGKILL) };
                let _ = p.wait();
            }
        }
        for _ in 0..50 {
            let left = Self::processes_under(&self.root);
            if left.is_empty() {
                break;
            }
            for pid in left {
                // SAFETY: as above; the pid works in this cluster's directory.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(mut e) = self.etcd.take() {
            let _ = e.kill();
            let _ = e.wait();
        }
        if std::env::var_os("SKED_FAILOVER_KEEP").is_some() {
            eprintln!("kept {}", self.root.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}
