//! The capacity a worker advertises (CPU millicores and memory MB) and the part of it its
//! running attempts hold.
//!
//! Detected at start unless configured: CPU is the processors this process may run on
//! (`available_parallelism`: its affinity mask), lowered to a cgroup's CPU quota when one is
//! set (cgroup v2 `cpu.max` of the process's group or any ancestor, or v1
//! `cpu.cfs_quota_us / cpu.cfs_period_us`), in millicores, so 1.5 CPUs of quota is 1500.
//! Memory is `MemTotal` of `/proc/meminfo`, lowered to a cgroup's memory limit when one is set
//! (v2 `memory.max`, v1 `memory.limit_in_bytes`), in MB. A value that cannot be read is not
//! advertised (`None`): the worker then claims by slots and labels in that dimension.

use std::path::{Path, PathBuf};

/// What a worker offers to the tasks it claims; `None` in a dimension means "unbounded".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capacity {
    pub cpu_millis: Option<u32>,
    pub memory_mb: Option<u32>,
}

/// The largest value of either dimension (it fits the schema's `integer`).
pub const MAX_CAPACITY: u32 = 1_000_000_000;

/// The capacity of this machine as this process sees it.
pub fn detect() -> Capacity {
    detect_in(Path::new("/"))
}

/// [`detect`] with `/proc` and `/sys` looked up under `root` (tests give a fake tree).
pub fn detect_in(root: &Path) -> Capacity {
    let groups = cgroup_dirs(root);
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get() as u64 * 1000)
        .ok();
    let quota = groups.iter().filter_map(|g| cpu_quota_millis(g)).min();
    let cpu_millis = match (cpus, quota) {
        (Some(c), Some(q)) => Some(c.min(q)),
        (c, q) => c.or(q),
    };
    let total = mem_total_mb(root);
    let limit = groups.iter().filter_map(|g| memory_limit_mb(g)).min();
    let memory_mb = match (total, limit) {
        (Some(t), Some(l)) => Some(t.min(l)),
        (t, l) => t.or(l),
    };
    let clamp = |v: u64| v.clamp(1, MAX_CAPACITY as u64) as u32;
    Capacity {
        cpu_millis: cpu_millis.map(clamp),
        memory_mb: memory_mb.map(clamp),
    }
}

/// The cgroup directories that bound this process: for cgroup v2 its own group and every
/// ancestor up to the root; for v1 the `cpu` and `memory` hierarchies' groups and their
/// ancestors.
fn cgroup_dirs(root: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string(root.join("proc/self/cgroup")) else {
        return Vec::new();
    };
    let base = root.join("sys/fs/cgroup");
    let mut dirs = Vec::new();
    for line in text.lines() {
        // hierarchy-id:controllers:path
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let mounts: Vec<PathBuf> = if controllers.is_empty() {
            vec![base.clone()]
        } else {
            controllers
                .split(',')
                .filter(|c| matches!(*c, "cpu" | "memory"))
                .map(|_| base.join(controllers))
                .collect()
        };
        for mount in mounts {
            let mut dir = mount.join(path.trim_start_matches('/'));
            loop {
                if dir.is_dir() && !dirs.contains(&dir) {
                    dirs.push(dir.clone());
                }
                if dir == mount || !dir.pop() {
                    break;
                }
            }
        }
    }
    dirs
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

/// The CPU quota of one cgroup in millicores, if it sets one.
fn cpu_quota_millis(dir: &Path) -> Option<u64> {
    if let Some(max) = read(&dir.join("cpu.max")) {
        // "max 100000" (no quota) or "<quota> <period>" in microseconds.
        let mut parts = max.split_whitespace();
        let quota: u64 = parts.next()?.parse().ok()?;
        let period: u64 = parts.next().unwrap_or("100000").parse().ok()?;
        return (period > 0).then(|| (quota * 1000).div_ceil(period));
    }
    let quota: i64 = read(&dir.join("cpu.cfs_quota_us"))?.parse().ok()?;
    let period: i64 = read(&dir.join("cpu.cfs_period_us"))?.parse().ok()?;
    (quota > 0 && period > 0).then(|| (quota as u64 * 1000).div_ceil(period as u64))
}

/// The memory limit of one cgroup in MB, if it sets one.
fn memory_limit_mb(dir: &Path) -> Option<u64> {
    let bytes: u64 = read(&dir.join("memory.max"))
        .or_else(|| read(&dir.join("memory.limit_in_bytes")))?
        .parse()
        .ok()?;
    // cgroup v1 writes "no limit" as a huge number rounded to the page size.
    (bytes < 1 << 60).then_some(bytes / (1024 * 1024))
}

fn mem_total_mb(root: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(root.join("proc/meminfo")).ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024)
}

/// Parses a capacity flag's value: a whole number from 1 to [`MAX_CAPACITY`].
pub fn parse_amount(value: &str, flag: &str, unit: &str) -> Result<u32, String> {
    let trimmed = value.trim();
    match trimmed.parse::<i128>() {
        Ok(n) if (1..=MAX_CAPACITY as i128).contains(&n) => Ok(n as u32),
        Ok(n) => Err(format!(
            "--{flag} must be between 1 and {MAX_CAPACITY} {unit}, got {n}"
        )),
        Err(_) => Err(format!(
            "--{flag} must be a whole number of {unit} (1 to {MAX_CAPACITY}), got {value:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> PathBuf {
        let root = std::env::temp_dir().join(format!("sked-capacity-{}", uuid::Uuid::new_v4()));
        for (path, content) in files {
            let p = root.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
        root
    }

    #[test]
    fn cgroup_v2_quota_and_memory_limit_lower_the_machine_totals() {
        let root = tree(&[
            ("proc/self/cgroup", "0::/job/task\n"),
            (
                "proc/meminfo",
                "MemTotal:       16384000 kB\nMemFree: 1 kB\n",
            ),
            ("sys/fs/cgroup/job/task/cpu.max", "max 100000\n"),
            ("sys/fs/cgroup/job/task/memory.max", "max\n"),
            // The parent's limits bound the child.
            ("sys/fs/cgroup/job/cpu.max", "150000 100000\n"),
            ("sys/fs/cgroup/job/memory.max", "536870912\n"),
        ]);
        let c = detect_in(&root);
        let cpus = std::thread::available_parallelism().unwrap().get() as u32 * 1000;
        assert_eq!(c.cpu_millis, Some(cpus.min(1500)), "1.5 CPUs of quota");
        assert_eq!(c.memory_mb, Some(512), "the parent group's 512 MB limit");
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn without_cgroup_limits_the_machine_is_the_capacity() {
        let root = tree(&[
            ("proc/self/cgroup", "0::/\n"),
            ("proc/meminfo", "MemTotal:       2048000 kB\n"),
            ("sys/fs/cgroup/cpu.max", "max 100000\n"),
        ]);
        let c = detect_in(&root);
        let cpus = std::thread::available_parallelism().unwrap().get() as u32 * 1000;
        assert_eq!(c.cpu_millis, Some(cpus));
        assert_eq!(c.memory_mb, Some(2000));
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn cgroup_v1_limits_are_read_and_no_limit_is_ignored() {
        let root = tree(&[
            ("proc/self/cgroup", "4:memory:/a\n3:cpu,cpuacct:/a\n"),
            ("proc/meminfo", "MemTotal:       1024000 kB\n"),
            ("sys/fs/cgroup/cpu,cpuacct/a/cpu.cfs_quota_us", "50000\n"),
            ("sys/fs/cgroup/cpu,cpuacct/a/cpu.cfs_period_us", "100000\n"),
            ("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n"),
            ("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n"),
            (
                "sys/fs/cgroup/memory/a/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
        ]);
        let c = detect_in(&root);
        assert_eq!(c.cpu_millis, Some(500), "half a CPU of quota");
        assert_eq!(c.memory_mb, Some(1000), "v1's 'no limit' leaves MemTotal");
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn amounts_are_whole_positive_numbers() {
        assert_eq!(parse_amount("1500", "cpu-millis", "millicores"), Ok(1500));
        for bad in ["0", "-5", "abc", "1.5", "", "99999999999"] {
            let err = parse_amount(bad, "cpu-millis", "millicores").unwrap_err();
            assert!(err.starts_with("--cpu-millis must be"), "{bad}: {err}");
        }
    }
}
