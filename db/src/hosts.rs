//! Database URLs that name several hosts, as libpq reads them
//! (`postgres://user@h1:5432,h2:5433,h3/db?target_session_attrs=read-write`), and pools that
//! follow the writable member of such a cluster when it moves.
//!
//! sked decides nothing here: whatever manages the cluster (Patroni, say) chooses the primary;
//! a pool only finds it, as libpq does. A pool of a multi-host URL connects to one member at a
//! time. With `target_session_attrs=read-write` (or `primary`) each new connection first asks
//! the member `select pg_is_in_recovery()` and is refused when it is a standby, so the pool
//! never hands out a connection to one. A follower task keeps one connection of its own to the
//! member the pool uses and asks it the same question every [`CHECK_EVERY`]; when that fails
//! it asks every member at once (each within
//! [`PROBE_TIMEOUT`]), again with a growing pause while none is acceptable, and points the
//! pool's future connections at the first acceptable one (`Pool::set_connect_options`).
//! Connections already open stay where they are: those to a crashed or demoted member break
//! and are dropped by the pool (it pings an idle connection before handing it out).
//!
//! A URL with one host is read exactly as before (sqlx's parser); only a
//! `target_session_attrs` parameter is taken out of it, and `read-write` then checks each
//! new connection too.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection};
use tokio::time::Instant;

use crate::{DbError, Result};

/// How often the follower asks the member in use whether it still takes the pool's sessions.
pub const CHECK_EVERY: Duration = Duration::from_millis(500);
/// How long a probe of one member may take (connecting and asking).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest pause between two rounds of probes while no member is acceptable.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// The members a database URL names, and which of them a session accepts.
#[derive(Debug, Clone)]
pub struct Members {
    /// The options of the URL with its first host; the others differ in host and port only.
    template: PgConnectOptions,
    /// Every host and port, in the URL's order (one entry for a single-host URL).
    hosts: Vec<(String, u16)>,
    read_write: bool,
}

impl Members {
    /// Reads a `postgres://` URL with one or several comma-separated `host[:port]` (IPv6 in
    /// brackets) and an optional `target_session_attrs` of `any`, `read-write` or `primary`.
    pub fn parse(url: &str) -> Result<Members> {
        let invalid = |why: String| DbError::Config(format!("invalid database URL: {why}"));
        let (rest_start, scheme) = ["postgres://", "postgresql://"]
            .iter()
            .find_map(|s| {
                url.get(..s.len())
                    .filter(|p| p.eq_ignore_ascii_case(s))
                    .map(|_| (s.len(), &url[..s.len()]))
            })
            .unwrap_or((0, ""));
        let rest = &url[rest_start..];
        let authority_end = if scheme.is_empty() {
            0
        } else {
            rest.find(['/', '?', '#']).unwrap_or(rest.len())
        };
        let (authority, tail) = rest.split_at(authority_end);
        let (userinfo, hostlist) = match authority.rfind('@') {
            Some(at) => authority.split_at(at + 1),
            None => ("", authority),
        };
        let (tail, read_write) = take_session_attrs(tail).map_err(invalid)?;

        let mut listed = Vec::new();
        if hostlist.contains(',') {
            for member in hostlist.split(',') {
                listed.push(split_host_port(member).map_err(invalid)?);
            }
        }
        let first = listed
            .first()
            .map(|(h, p): &(String, Option<u16>)| match p {
                Some(p) => format!("{}:{p}", bracket(h)),
                None => bracket(h),
            })
            .unwrap_or_else(|| hostlist.to_owned());
        let single = format!("{scheme}{userinfo}{first}{tail}");
        let template = PgConnectOptions::from_str(&single).map_err(|e| invalid(e.to_string()))?;
        let hosts = if listed.is_empty() {
            vec![(template.get_host().to_owned(), template.get_port())]
        } else {
            // A host without a port gets the port libpq would give it (PGPORT or 5432).
            let default_port = PgConnectOptions::new_without_pgpass().get_port();
            listed
                .into_iter()
                .map(|(h, p)| (h, p.unwrap_or(default_port)))
                .collect()
        };
        Ok(Members {
            template,
            hosts,
            read_write,
        })
    }

    /// Changes the options every member's connections share (application name, say).
    pub fn map_options(mut self, f: impl FnOnce(PgConnectOptions) -> PgConnectOptions) -> Self {
        self.template = f(self.template);
        self
    }

    /// The hosts and ports, in the URL's order.
    pub fn hosts(&self) -> &[(String, u16)] {
        &self.hosts
    }

    /// Whether sessions must be writable (`target_session_attrs=read-write` or `primary`).
    pub fn read_write(&self) -> bool {
        self.read_write
    }

    /// The connect options of one member.
    pub fn options(&self, member: usize) -> PgConnectOptions {
        if self.hosts.len() == 1 {
            return self.template.clone();
        }
        let (host, port) = &self.hosts[member];
        self.template.clone().host(host).port(*port)
    }

    /// A connection to the first member (in the URL's order) that accepts the session,
    /// asking them again with a growing pause until `within` has passed.
    /// A URL with one host connects once, as before, without a time limit of its own.
    pub async fn connect(&self, within: Duration) -> Result<PgConnection> {
        if self.hosts.len() == 1 {
            let mut conn = self.options(0).connect().await?;
            if !accepts(&mut conn, self.read_write).await? {
                let _ = conn.close().await;
                return Err(DbError::Config(
                    "the database is read-only (in recovery) and the URL asks for \
                     target_session_attrs=read-write"
                        .into(),
                ));
            }
            return Ok(conn);
        }
        Ok(self.find(within).await?.1)
    }

    /// The first member that accepts the session and a connection to it, as [`Self::connect`].
    async fn find(&self, within: Duration) -> Result<(usize, PgConnection)> {
        let deadline = Instant::now() + within;
        let mut backoff = Duration::from_millis(50);
        loop {
            let last_error = match self.probe_all().await {
                Ok(found) => return Ok(found),
                Err(e) => e,
            };
            if Instant::now() + backoff >= deadline {
                return Err(last_error);
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Asks every member at once; the first acceptable one in the URL's order.
    async fn probe_all(&self) -> Result<(usize, PgConnection)> {
        if self.hosts.len() == 1 {
            return probe(self.options(0), self.read_write)
                .await
                .map(|c| (0, c));
        }
        let mut probes = tokio::task::JoinSet::new();
        for member in 0..self.hosts.len() {
            let options = self.options(member);
            let read_write = self.read_write;
            probes.spawn(async move { (member, probe(options, read_write).await) });
        }
        let mut found: Vec<(usize, PgConnection)> = Vec::new();
        let mut errors = Vec::new();
        while let Some(joined) = probes.join_next().await {
            match joined {
                Ok((member, Ok(conn))) => found.push((member, conn)),
                Ok((member, Err(e))) => {
                    let (host, port) = &self.hosts[member];
                    errors.push(format!("{host}:{port}: {e}"));
                }
                Err(e) => errors.push(e.to_string()),
            }
        }
        found.sort_by_key(|(member, _)| *member);
        let mut found = found.into_iter();
        match found.next() {
            Some(first) => {
                for (_, other) in found {
                    let _ = other.close().await;
                }
                Ok(first)
            }
            None => Err(DbError::Config(format!(
                "no member of the database URL accepts a{} session: {}",
                if self.read_write { " read-write" } else { "" },
                errors.join("; ")
            ))),
        }
    }

    /// A pool over the members: its connections go to the first acceptable member and, with
    /// several hosts, follow the acceptable member when it moves (see the module's
    /// documentation). With [`Self::read_write`], `options` must check each new connection
    /// with [`refuse_standby`] (in its `after_connect`, before anything else it runs).
    pub async fn pool(self, options: PgPoolOptions) -> Result<PgPool> {
        if self.hosts.len() == 1 {
            return Ok(options.connect_with(self.options(0)).await?);
        }
        let (first, sentinel) = self.find(options.get_acquire_timeout()).await?;
        let pool = options.connect_with(self.options(first)).await?;
        tokio::spawn(follow(pool.clone(), self, first, sentinel));
        Ok(pool)
    }
}

/// Fails on a member in recovery (a standby): the `after_connect` check of a pool whose URL
/// asks for `target_session_attrs=read-write`, so that the pool never hands out a connection
/// to a standby. The pool then tries again, meanwhile pointed at the new primary by its
/// follower.
pub async fn refuse_standby(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    if writable(conn).await? {
        Ok(())
    } else {
        Err(sqlx::Error::Configuration(
            "the database member is read-only (in recovery) and the database URL asks for \
             target_session_attrs=read-write"
                .into(),
        ))
    }
}

/// Keeps the pool's connect options on an acceptable member until the pool is closed.
async fn follow(pool: PgPool, members: Members, mut current: usize, sentinel: PgConnection) {
    let mut sentinel = Some(sentinel);
    loop {
        if pool.is_closed() {
            break;
        }
        let healthy = match sentinel.as_mut() {
            Some(conn) => matches!(
                tokio::time::timeout(PROBE_TIMEOUT, accepts(conn, members.read_write)).await,
                Ok(Ok(true))
            ),
            None => false,
        };
        if healthy {
            tokio::time::sleep(CHECK_EVERY).await;
            continue;
        }
        if let Some(conn) = sentinel.take() {
            let _ = conn.close_hard().await;
        }
        let (host, port) = &members.hosts[current];
        tracing::warn!(
            member = %format!("{host}:{port}"),
            "the database member in use no longer answers as required: looking for another"
        );
        let started = Instant::now();
        let mut backoff = Duration::from_millis(50);
        while sentinel.is_none() && !pool.is_closed() {
            match members.probe_all().await {
                Ok((member, conn)) => {
                    if member != current {
                        pool.set_connect_options(members.options(member));
                        current = member;
                    }
                    let (host, port) = &members.hosts[member];
                    tracing::info!(
                        member = %format!("{host}:{port}"),
                        after_ms = started.elapsed().as_millis() as u64,
                        "the pool's new connections go to this database member"
                    );
                    sentinel = Some(conn);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "no database member is acceptable yet");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }
    if let Some(conn) = sentinel {
        let _ = conn.close().await;
    }
}

/// A connection to the member of `options` if it accepts the session.
async fn probe(options: PgConnectOptions, read_write: bool) -> Result<PgConnection> {
    let attempt = async {
        let mut conn = options.connect().await?;
        if accepts(&mut conn, read_write).await? {
            Ok(conn)
        } else {
            let _ = conn.close().await;
            Err(DbError::Config("read-only (in recovery)".into()))
        }
    };
    match tokio::time::timeout(PROBE_TIMEOUT, attempt).await {
        Ok(result) => result,
        Err(_) => Err(DbError::Config(format!(
            "no answer within {PROBE_TIMEOUT:?}"
        ))),
    }
}

/// Whether the member of `conn` accepts a session that must (or need not) be writable.
pub async fn accepts(conn: &mut PgConnection, read_write: bool) -> Result<bool, sqlx::Error> {
    if read_write {
        writable(conn).await
    } else {
        conn.ping().await.map(|_| true)
    }
}

async fn writable(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    let in_recovery: bool = sqlx::query_scalar("select pg_is_in_recovery()")
        .fetch_one(&mut *conn)
        .await?;
    Ok(!in_recovery)
}

/// Takes `target_session_attrs` out of the URL's path-and-query: the rest, and whether
/// sessions must be writable.
fn take_session_attrs(tail: &str) -> std::result::Result<(String, bool), String> {
    let (path, query) = match tail.split_once('?') {
        Some((path, query)) => (path, query),
        None => return Ok((tail.to_owned(), false)),
    };
    let mut read_write = false;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("target_session_attrs", value)) => match value {
                "any" => read_write = false,
                "read-write" | "primary" => read_write = true,
                other => {
                    return Err(format!(
                        "target_session_attrs={other} is not supported (any, read-write or \
                         primary)"
                    ));
                }
            },
            _ => kept.push(pair),
        }
    }
    let kept: Vec<&str> = kept.into_iter().filter(|p| !p.is_empty()).collect();
    if kept.is_empty() {
        Ok((path.to_owned(), read_write))
    } else {
        Ok((format!("{path}?{}", kept.join("&")), read_write))
    }
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`.
fn split_host_port(member: &str) -> std::result::Result<(String, Option<u16>), String> {
    let (host, port) = if let Some(v6) = member.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("unclosed '[' in the host {member:?}"))?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("unexpected {p:?} after the host {host:?}"))?,
            ),
        };
        (host, port)
    } else {
        match member.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (member, None),
        }
    };
    if host.is_empty() {
        return Err(format!("an empty host in the host list ({member:?})"));
    }
    let port = match port {
        Some(p) => Some(
            p.parse::<u16>()
                .map_err(|_| format!("invalid port {p:?} of the host {host:?}"))?,
        ),
        None => None,
    };
    Ok((host.to_owned(), port))
}

fn bracket(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_host_reads_as_sqlx_does() {
        let url = "postgres://sked:pw@db.example:6543/jobs?sslmode=disable&application_name=x";
        let m = Members::parse(url).unwrap();
        let plain = PgConnectOptions::from_str(url).unwrap();
        assert_eq!(m.hosts(), &[("db.example".to_owned(), 6543)]);
        assert!(!m.read_write());
        let o = m.options(0);
        assert_eq!(o.get_host(), plain.get_host());
        assert_eq!(o.get_port(), plain.get_port());
        assert_eq!(o.get_username(), "sked");
        assert_eq!(o.get_database(), Some("jobs"));
        assert_eq!(o.get_application_name(), Some("x"));
    }

    #[test]
    fn one_host_with_target_session_attrs() {
        let m = Members::parse("postgres://u@h:1/d?target_session_attrs=read-write").unwrap();
        assert!(m.read_write());
        assert_eq!(m.hosts(), &[("h".to_owned(), 1)]);
        assert_eq!(m.options(0).get_database(), Some("d"));
    }

    #[test]
    fn several_hosts_ports_and_defaults() {
        let m = Members::parse(
            "postgresql://u:secret@h1:5433,h2,[::1]:7000,[fe80::2]/db?target_session_attrs=read-write&sslmode=disable",
        )
        .unwrap();
        let default_port = PgConnectOptions::new_without_pgpass().get_port();
        assert_eq!(
            m.hosts(),
            &[
                ("h1".to_owned(), 5433),
                ("h2".to_owned(), default_port),
                ("::1".to_owned(), 7000),
                ("fe80::2".to_owned(), default_port),
            ]
        );
        assert!(m.read_write());
        for (i, (host, port)) in m.hosts().iter().enumerate() {
            let o = m.options(i);
            assert_eq!(o.get_host(), host);
            assert_eq!(o.get_port(), *port);
            assert_eq!(o.get_username(), "u");
            assert_eq!(o.get_database(), Some("db"));
        }
    }

    #[test]
    fn any_and_primary() {
        let any = Members::parse("postgres://a:1,b:2/d?target_session_attrs=any").unwrap();
        assert!(!any.read_write());
        let primary = Members::parse("postgres://a:1,b:2?target_session_attrs=primary").unwrap();
        assert!(primary.read_write());
        assert_eq!(primary.hosts().len(), 2);
        let none = Members::parse("postgres://a:1,b:2/d").unwrap();
        assert!(!none.read_write());
    }

    #[test]
    fn map_options_applies_to_every_member() {
        let m = Members::parse("postgres://u@a:1,b:2/d")
            .unwrap()
            .map_options(|o| o.application_name("sked-test"));
        assert_eq!(m.options(0).get_application_name(), Some("sked-test"));
        assert_eq!(m.options(1).get_application_name(), Some("sked-test"));
        assert_eq!(m.options(1).get_host(), "b");
    }

    #[test]
    fn rejects_what_it_cannot_honour() {
        for url in [
            "postgres://a:1,b:x/d",
            "postgres://a:1,,b:2/d",
            "postgres://a:1,[::1/d",
            "postgres://a:1,b:2/d?target_session_attrs=standby",
            "postgres://a/d?target_session_attrs=prefer-standby",
        ] {
            let e = Members::parse(url).expect_err(url);
            assert!(
                e.to_string().starts_with("invalid database URL"),
                "{url}: {e}"
            );
        }
    }

    #[test]
    fn keeps_other_parameters() {
        assert_eq!(
            take_session_attrs("/d?sslmode=disable&target_session_attrs=read-write&x=1").unwrap(),
            ("/d?sslmode=disable&x=1".to_owned(), true)
        );
        assert_eq!(
            take_session_attrs("/d?target_session_attrs=any").unwrap(),
            ("/d".to_owned(), false)
        );
        assert_eq!(take_session_attrs("/d").unwrap(), ("/d".to_owned(), false));
    }
}
