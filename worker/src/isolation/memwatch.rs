//! The memory watchdog of the rlimit mode: one thread that, while attempts with a memory
//! limit run, samples the resident memory of each one's process group every 100 ms (one pass
//! over `/proc` for all of them) and tells an attempt when its group is over its limit, so
//! the attempt kills the group and records why.
//!
//! Resident memory is `/proc/<pid>/stat`'s RSS summed over the processes whose process group
//! is the attempt's: pages shared between them (a forked parent's libraries, say) count once
//! per process, and a process that leaves the group (`setsid`) is no longer counted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How often the watched groups are sampled.
pub const INTERVAL: Duration = Duration::from_millis(100);

#[derive(Debug, Default)]
struct Shared {
    /// Process group id -> what it may use and whom to tell.
    groups: Mutex<HashMap<i32, Entry>>,
}

#[derive(Debug)]
struct Entry {
    limit_bytes: u64,
    over: CancellationToken,
    peak_bytes: Arc<std::sync::atomic::AtomicU64>,
}

/// The handle attempts register with; the thread ends when the last handle is dropped.
#[derive(Debug, Clone)]
pub struct MemWatch {
    shared: Arc<Shared>,
}

impl MemWatch {
    /// Starts the sampling thread.
    pub fn start() -> MemWatch {
        let shared = Arc::new(Shared::default());
        let weak = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("sked-memwatch".into())
            .spawn(move || sample_loop(weak))
            .expect("starting the memory watchdog thread");
        MemWatch { shared }
    }

    /// Watches the process group `pgid` against `limit_bytes` until the returned guard is
    /// dropped.
    pub fn watch(&self, pgid: i32, limit_bytes: u64) -> Watched {
        let over = CancellationToken::new();
        let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
        self.shared.groups.lock().expect("memwatch").insert(
            pgid,
            Entry {
                limit_bytes,
                over: over.clone(),
                peak_bytes: peak.clone(),
            },
        );
        Watched {
            shared: self.shared.clone(),
            pgid,
            over,
            peak,
        }
    }
}

/// One watched group.
#[derive(Debug)]
pub struct Watched {
    shared: Arc<Shared>,
    pgid: i32,
    over: CancellationToken,
    peak: Arc<std::sync::atomic::AtomicU64>,
}

impl Watched {
    /// Resolves once a sample found the group over its limit.
    pub async fn over_limit(&self) {
        self.over.cancelled().await
    }

    pub fn is_over_limit(&self) -> bool {
        self.over.is_cancelled()
    }

    /// The largest resident memory sampled, in bytes.
    pub fn peak_bytes(&self) -> u64 {
        self.peak.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if let Ok(mut groups) = self.shared.groups.lock() {
            groups.remove(&self.pgid);
        }
    }
}

fn sample_loop(shared: Weak<Shared>) {
    // SAFETY: sysconf has no preconditions.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    loop {
        std::thread::sleep(INTERVAL);
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let wanted: Vec<i32> = {
            let groups = shared.groups.lock().expect("memwatch");
            if groups.is_empty() {
                continue;
            }
            groups.keys().copied().collect()
        };
        let used = resident_by_group(&wanted, page);
        let groups = shared.groups.lock().expect("memwatch");
        for (pgid, bytes) in used {
            if let Some(entry) = groups.get(&pgid) {
                entry
                    .peak_bytes
                    .fetch_max(bytes, std::sync::atomic::Ordering::Relaxed);
                if bytes > entry.limit_bytes {
                    entry.over.cancel();
                }
            }
        }
    }
}

/// Resident bytes of each of `groups`, in one pass over `/proc`.
pub fn resident_by_group(groups: &[i32], page: u64) -> HashMap<i32, u64> {
    let mut used: HashMap<i32, u64> = groups.iter().map(|g| (*g, 0)).collect();
    for stat in super::reaper::scan() {
        if let Some(total) = used.get_mut(&stat.pgrp) {
            *total += stat.rss_pages * page;
        }
    }
    used
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_group_has_resident_memory() {
        // SAFETY: getpgrp has no preconditions.
        let own = unsafe { libc::getpgrp() };
        let used = resident_by_group(&[own, -7], 4096);
        assert!(
            used[&own] > 1 << 20,
            "this test process uses more than 1 MB: {used:?}"
        );
        assert_eq!(used[&-7], 0);
    }
}
