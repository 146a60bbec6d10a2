//! Memory and CPU limits of tasks, by one of three mechanisms chosen at start
//! (`--limits auto|cgroup|rlimit|off`; see `docs/runtime.md`, "Limits and isolation"):
//!
//! - `cgroup`: a cgroup v2 child per attempt ([`super::cgroup`]): memory enforced by the
//!   kernel for the whole attempt (OOM kill recorded from `memory.events`), CPU throttled to
//!   its millicores by `cpu.max`.
//! - `rlimit`: the memory watchdog ([`super::memwatch`]) kills the attempt's process group when
//!   its resident memory passes the limit; `RLIMIT_DATA` at twice the limit stops any one
//!   process from allocating far past it between two samples. CPU is not limited.
//! - `off`: requests are used for placement only.
//!
//! `auto` takes `cgroup` when the delegated cgroup is usable, else `rlimit`, and says why.

use std::ffi::CString;

use super::cgroup::{self, Delegated, TaskCgroup};
use super::memwatch::MemWatch;

/// How limits are enforced, as asked by `--limits`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LimitsMode {
    /// cgroup v2 when usable, else rlimit.
    Auto,
    /// cgroup v2; the worker does not start when it cannot use it.
    Cgroup,
    /// the memory watchdog and RLIMIT_DATA; CPU is not limited.
    Rlimit,
    /// no limits; requests count for placement only.
    Off,
}

/// `RLIMIT_DATA` is this many times the memory limit in the rlimit mode.
pub const DATA_LIMIT_FACTOR: u64 = 2;

/// The mechanism chosen at start.
#[derive(Debug, Clone)]
pub enum Limiter {
    Cgroup(Delegated),
    Rlimit(MemWatch),
    Off,
}

/// A task's limits: its requests, else the worker's defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskLimits {
    pub memory_mb: Option<u32>,
    pub cpu_millis: Option<u32>,
}

impl Limiter {
    /// Chooses the mechanism for `mode`; `cgroup_dir` is `--cgroup` (default: the worker's
    /// own cgroup). Answers the limiter and a sentence for the start-up log saying what is
    /// enforced and why; fails when `cgroup` was asked for and cannot be used.
    pub fn start(
        mode: LimitsMode,
        cgroup_dir: Option<&std::path::Path>,
    ) -> Result<(Limiter, String), String> {
        let rlimit = || Limiter::Rlimit(MemWatch::start());
        let rlimit_says = "memory: process group RSS sampled every 100 ms and killed over the \
                           limit, RLIMIT_DATA at twice the limit; CPU: not limited";
        match mode {
            LimitsMode::Off => Ok((
                Limiter::Off,
                "off (--limits off): memory and CPU requests count for placement only".into(),
            )),
            LimitsMode::Rlimit => {
                Ok((rlimit(), format!("rlimit (--limits rlimit): {rlimit_says}")))
            }
            LimitsMode::Cgroup | LimitsMode::Auto => {
                let taken = cgroup_dir
                    .map(|d| Ok(d.to_owned()))
                    .unwrap_or_else(cgroup::own_cgroup)
                    .and_then(|dir| Delegated::take(&dir, std::process::id()));
                match (taken, mode) {
                    (Ok(d), _) => {
                        let says = format!(
                            "cgroup v2 under {}: memory.max (OOM kills recorded), cpu.max",
                            d.dir().display()
                        );
                        Ok((Limiter::Cgroup(d), says))
                    }
                    (Err(why), LimitsMode::Cgroup) => {
                        Err(format!("--limits cgroup: cannot use cgroup v2: {why}"))
                    }
                    (Err(why), _) => Ok((
                        rlimit(),
                        format!("rlimit, because cgroup v2 is not usable ({why}); {rlimit_says}"),
                    )),
                }
            }
        }
    }

    pub fn mode(&self) -> &'static str {
        match self {
            Limiter::Cgroup(_) => "cgroup",
            Limiter::Rlimit(_) => "rlimit",
            Limiter::Off => "off",
        }
    }

    /// Prepares the limits of one attempt (`name` is unique per attempt).
    pub fn prepare(&self, name: &str, limits: TaskLimits) -> std::io::Result<Applied> {
        let memory_bytes = limits.memory_mb.map(|mb| u64::from(mb) << 20);
        Ok(match self {
            Limiter::Cgroup(d) => Applied {
                limits,
                cgroup: Some(d.create(name, memory_bytes, limits.cpu_millis)?),
                data_limit: None,
                watch: None,
            },
            Limiter::Rlimit(watch) => Applied {
                limits,
                cgroup: None,
                data_limit: memory_bytes.map(|b| b.saturating_mul(DATA_LIMIT_FACTOR)),
                watch: memory_bytes.map(|b| (watch.clone(), b)),
            },
            Limiter::Off => Applied {
                limits,
                cgroup: None,
                data_limit: None,
                watch: None,
            },
        })
    }
}

/// The limits of one attempt, from before its process starts until after it ended.
#[derive(Debug)]
pub struct Applied {
    pub limits: TaskLimits,
    cgroup: Option<TaskCgroup>,
    data_limit: Option<u64>,
    /// The watchdog and the limit in bytes (rlimit mode with a memory limit).
    watch: Option<(MemWatch, u64)>,
}

/// What the child does between fork and exec, as plain data: join a cgroup, set limits.
#[derive(Debug, Clone, Default)]
pub struct ChildLimits {
    cgroup_procs: Option<CString>,
    data_limit: Option<u64>,
}

impl ChildLimits {
    /// Runs in the child between fork and exec: system calls only.
    pub fn apply_in_child(&self) -> std::io::Result<()> {
        if let Some(procs) = &self.cgroup_procs {
            cgroup::join_in_child(procs)?;
        }
        if let Some(bytes) = self.data_limit {
            let limit = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            // SAFETY: setrlimit is async-signal-safe; `limit` is a valid rlimit.
            if unsafe { libc::setrlimit(libc::RLIMIT_DATA, &limit) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

impl Applied {
    pub fn child(&self) -> ChildLimits {
        ChildLimits {
            cgroup_procs: self.cgroup.as_ref().map(|c| c.procs_file().clone()),
            data_limit: self.data_limit,
        }
    }

    /// The watchdog and the limit in bytes to watch the attempt's group with, if any.
    pub fn watchdog(&self) -> Option<(&MemWatch, u64)> {
        self.watch.as_ref().map(|(w, b)| (w, *b))
    }

    /// After the attempt's process ended: whether the kernel killed it for memory (cgroup
    /// mode), and removing its cgroup (killing what is left in it).
    pub async fn finish(self) -> bool {
        let Some(cgroup) = self.cgroup else {
            return false;
        };
        let oom = cgroup.oom_kills() > 0;
        let path = cgroup.path().to_owned();
        if let Err(e) = cgroup.remove().await {
            tracing::warn!(error = %e, cgroup = %path.display(), "could not remove the task's cgroup");
        }
        oom
    }
}
