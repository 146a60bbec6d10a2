//! Limits and isolation of tasks (see `docs/runtime.md`, "Limits and isolation"): memory and
//! CPU limits ([`limits`]: cgroup v2, else rlimits and a memory watchdog), the cap on output,
//! the user a task runs as ([`users`]), its own working directory removed afterwards
//! ([`workdir`]), a clean environment with an allow-list, and an optional sandbox wrapper
//! ([`sandbox`]), and every process a task starts killed when its attempt ends or, after a
//! crash, by the next worker ([`reaper`]). The flags are parsed here, once, into a validated [`Isolation`]; the
//! worker turns it into a [`Runtime`] at start.

pub mod cgroup;
pub mod limits;
pub mod memwatch;
pub mod reaper;
pub mod sandbox;
pub mod users;
pub mod workdir;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use limits::{LimitsMode, TaskLimits};

/// The cap on a task's stdout and stderr bytes when neither the task nor
/// `--max-output-bytes` sets one: 16 MiB.
pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 16 << 20;

/// The PATH a task gets when its own env does not set one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The flags of limits and isolation (part of the worker's flags).
#[derive(Debug, Clone, clap::Args)]
pub struct IsolationArgs {
    /// How tasks' memory and CPU limits are enforced: auto (cgroup v2 when the worker can
    /// use it, else rlimit), cgroup, rlimit (memory only) or off.
    #[arg(long, env = "SKED_LIMITS", value_enum, default_value_t = LimitsMode::Auto)]
    pub limits: LimitsMode,
    /// The cgroup v2 directory delegated to the worker for its tasks' cgroups (default: the
    /// worker's own cgroup).
    #[arg(long, env = "SKED_CGROUP")]
    pub cgroup: Option<PathBuf>,
    /// Memory limit in MB of tasks that request none (default: none).
    #[arg(long, env = "SKED_TASK_MEMORY_MB")]
    pub task_memory_mb: Option<u32>,
    /// CPU limit in millicores of tasks that request none (default: none).
    #[arg(long, env = "SKED_TASK_CPU_MILLIS")]
    pub task_cpu_millis: Option<u32>,
    /// Cap on the bytes of stdout and stderr together of a task that sets none; past it the
    /// task is stopped and fails. 0: no cap.
    #[arg(long, env = "SKED_MAX_OUTPUT_BYTES", default_value_t = DEFAULT_MAX_OUTPUT_BYTES)]
    pub max_output_bytes: u64,
    /// User (name or uid) to run tasks as when the task names none. A worker running as root
    /// runs them as `nobody` by default; any other worker runs them as itself.
    #[arg(long, env = "SKED_RUN_AS")]
    pub run_as: Option<String>,
    /// Let a worker running as root run tasks as root (when a task or --run-as asks).
    #[arg(long, env = "SKED_ALLOW_ROOT_TASKS")]
    pub allow_root_tasks: bool,
    /// Users a task's `run_as` may name besides the default, comma-separated (names or uids;
    /// `*` for any user but root). A task naming another user fails.
    #[arg(long, env = "SKED_RUN_AS_ALLOW", value_delimiter = ',')]
    pub run_as_allow: Vec<String>,
    /// Variables of the worker's own environment passed to every task, comma-separated
    /// (tasks otherwise get only PATH, HOME, their own env and SKED_* variables).
    #[arg(long, env = "SKED_ENV_ALLOW", value_delimiter = ',')]
    pub env_allow: Vec<String>,
    /// Command prefixed to every task's argv, `{dir}` standing for its working directory, e.g.
    /// 'bwrap --die-with-parent --unshare-all --ro-bind / / --bind {dir} {dir} --dev /dev
    /// --proc /proc --'.
    #[arg(long, env = "SKED_SANDBOX")]
    pub sandbox: Option<String>,
    /// Make the worker's process a child subreaper, so that every orphaned process of its
    /// tasks (double-forked, setsid'd) is re-parented to it and killed with its attempt. A
    /// program embedding a worker sets false: the worker would adopt its other orphans too.
    #[arg(long, env = "SKED_SUBREAPER", default_value_t = true, action = clap::ArgAction::Set)]
    pub subreaper: bool,
}

impl Default for IsolationArgs {
    fn default() -> IsolationArgs {
        IsolationArgs {
            limits: LimitsMode::Auto,
            cgroup: None,
            task_memory_mb: None,
            task_cpu_millis: None,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            run_as: None,
            allow_root_tasks: false,
            run_as_allow: vec![],
            env_allow: vec![],
            sandbox: None,
            // The default configuration is for tests and embedding: no subreaper.
            subreaper: false,
        }
    }
}

/// Validated limits and isolation settings.
#[derive(Debug, Clone)]
pub struct Isolation {
    pub limits: LimitsMode,
    pub cgroup: Option<PathBuf>,
    /// Limits of tasks that request none.
    pub default_limits: TaskLimits,
    /// Cap on stdout and stderr bytes of tasks that set none (`None`: no cap).
    pub max_output_bytes: Option<u64>,
    pub users: users::Users,
    /// The variables of `--env-allow`, with their values in the worker's environment (those
    /// it does not have are left out).
    pub env_pass: BTreeMap<String, String>,
    pub sandbox: Option<sandbox::Sandbox>,
    /// Whether the worker makes its process a child subreaper (see [`reaper`]).
    pub subreaper: bool,
}

/// Largest memory and CPU limits, as the schema allows for requests.
const MAX_MEMORY_MB: u32 = 16_777_216;
const MAX_CPU_MILLIS: u32 = 1_000_000;

impl IsolationArgs {
    /// Validates the flags. Reads the worker's environment for `--env-allow` and for the
    /// PATH that finds the sandbox's program: this runs at the edge, once.
    pub fn into_config(self) -> Result<Isolation, String> {
        let range = |v: Option<u32>, flag: &str, max: u32| match v {
            Some(n) if n == 0 || n > max => {
                Err(format!("--{flag} must be between 1 and {max}, got {n}"))
            }
            v => Ok(v),
        };
        let default_limits = TaskLimits {
            memory_mb: range(self.task_memory_mb, "task-memory-mb", MAX_MEMORY_MB)?,
            cpu_millis: range(self.task_cpu_millis, "task-cpu-millis", MAX_CPU_MILLIS)?,
        };
        let mut env_pass = BTreeMap::new();
        for name in self
            .env_allow
            .iter()
            .map(|n| n.trim())
            .filter(|n| !n.is_empty())
        {
            if name.contains('=') || name.contains('\0') {
                return Err(format!("--env-allow: {name:?} is not a variable name"));
            }
            match std::env::var(name) {
                Ok(value) => {
                    env_pass.insert(name.to_owned(), value);
                }
                Err(std::env::VarError::NotPresent) => {}
                Err(std::env::VarError::NotUnicode(_)) => {
                    return Err(format!("--env-allow: the value of {name} is not UTF-8"));
                }
            }
        }
        let search_path = std::env::var("PATH").unwrap_or_else(|_| DEFAULT_PATH.into());
        let sandbox = self
            .sandbox
            .as_deref()
            .map(|t| sandbox::Sandbox::parse(t, &search_path))
            .transpose()?;
        Ok(Isolation {
            limits: self.limits,
            cgroup: self.cgroup,
            default_limits,
            max_output_bytes: (self.max_output_bytes > 0).then_some(self.max_output_bytes),
            users: users::Users::for_this_process(
                self.run_as,
                self.allow_root_tasks,
                self.run_as_allow,
            )?,
            env_pass,
            sandbox,
            subreaper: self.subreaper,
        })
    }
}

/// What the worker set up at start: the limits' mechanism and the task directories.
#[derive(Debug)]
pub struct Runtime {
    pub settings: Isolation,
    pub limiter: limits::Limiter,
    /// Declared before `dirs`, so it is dropped first: its last kill runs before the
    /// worker's lock is released.
    pub reaper: reaper::Reaper,
    pub dirs: workdir::WorkDirs,
}

impl Runtime {
    /// Chooses the limits' mechanism and prepares the task directories under `work_dir`,
    /// logging what is enforced and why.
    pub fn start(
        settings: Isolation,
        work_dir: &Path,
        worker: uuid::Uuid,
    ) -> Result<Runtime, String> {
        let (limiter, says) = limits::Limiter::start(settings.limits, settings.cgroup.as_deref())?;
        tracing::info!(mode = limiter.mode(), "task limits: {says}");
        let dirs = workdir::WorkDirs::start(work_dir, worker)
            .map_err(|e| format!("preparing task directories in {}: {e}", work_dir.display()))?;
        if settings.users.worker_is_root() {
            let who = settings
                .users
                .for_task(None)?
                .map(|u| u.name)
                .unwrap_or_default();
            tracing::info!(default_user = %who, "tasks run as {who} unless they name a user");
            if let Some(dir) = untraversable_ancestor(dirs.root()) {
                tracing::warn!(dir = %dir.display(),
                    "other users cannot pass through this directory: tasks that run as another user cannot enter their working directories");
            }
        }
        if let Some(sandbox) = &settings.sandbox {
            tracing::info!(program = %sandbox.program().display(), "tasks run through the sandbox wrapper");
        }
        let reaper = reaper::Reaper::start(dirs.processes_file(), settings.subreaper)
            .map_err(|e| format!("starting to track the tasks' processes: {e}"))?;
        tracing::info!(
            subreaper = reaper.adopts(),
            "tasks' processes are tracked and killed when their attempt ends"
        );
        Ok(Runtime {
            settings,
            limiter,
            reaper,
            dirs,
        })
    }

    /// A task's limits: its requests, else the worker's defaults.
    pub fn limits_of(&self, memory_mb: Option<i32>, cpu_millis: Option<i32>) -> TaskLimits {
        let positive = |v: Option<i32>| v.and_then(|n| u32::try_from(n).ok()).filter(|n| *n > 0);
        TaskLimits {
            memory_mb: positive(memory_mb).or(self.settings.default_limits.memory_mb),
            cpu_millis: positive(cpu_millis).or(self.settings.default_limits.cpu_millis),
        }
    }

    /// A task's cap on output: its own, else the worker's. A service's process gets only its
    /// own (counted per run of the process): a service that logs steadily would otherwise be
    /// stopped and restarted every few MiB.
    pub fn max_output_of(&self, max_output_bytes: Option<i64>, service: bool) -> Option<u64> {
        let own = max_output_bytes
            .and_then(|n| u64::try_from(n).ok())
            .filter(|n| *n > 0);
        if service {
            own
        } else {
            own.or(self.settings.max_output_bytes)
        }
    }

    /// The environment a task starts from: PATH and HOME (its working directory), then the
    /// allow-listed variables of the worker; the task's own env and the SKED_* variables go
    /// on top.
    pub fn base_env(&self, dir: &Path) -> BTreeMap<String, String> {
        let mut env = BTreeMap::from([
            ("PATH".to_owned(), DEFAULT_PATH.to_owned()),
            ("HOME".to_owned(), dir.to_string_lossy().into_owned()),
        ]);
        env.extend(self.settings.env_pass.clone());
        env
    }
}

/// The first directory from `/` to `path` that others may not pass through (no `o+x`).
fn untraversable_ancestor(path: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    path.ancestors()
        .skip(1)
        .filter(|p| !p.as_os_str().is_empty())
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o001 == 0))
        .map(Path::to_owned)
}
