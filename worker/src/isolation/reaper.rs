//! Every process an attempt starts, tracked while the attempt runs and killed when it ends,
//! and what a killed worker left behind, killed by the next worker on the host.
//!
//! One thread per worker samples `/proc` every [`INTERVAL`] while an attempt that has run for
//! an interval remains (so every process is seen within an interval of its start; an attempt
//! that ends sooner is looked at when it ends) and keeps, per attempt, the set of its
//! processes as `(pid, start time)`: its leader, every process that
//! descends from a member (by parent pid), and members seen before that are still alive with
//! the same start time (a process that `setsid`s or whose parent exits stays a member). A
//! process is named by its pid and its start time (`/proc/<pid>/stat`, field 22), so a pid
//! the kernel reuses is never taken for the process it once named.
//!
//! A worker run by its binaries is a child subreaper (`PR_SET_CHILD_SUBREAPER`): a process
//! whose parent exits is re-parented to the worker instead of init, whatever it does (double
//! fork, `setsid`, a cleared environment, another directory). Each task leader starts its own
//! session, so a child of the worker that is not in the worker's session, is not a leader and
//! runs as the user of some attempt is an adopted orphan of a task: it belongs to the one
//! attempt of that user that was running when it started; while several could own it, it is
//! kept pending, and once none of them runs it is killed. The worker reaps the orphans it
//! adopted. A worker embedded in another program (tests, [`super::IsolationArgs`]'s
//! `Default`) is no subreaper, since it would adopt its host's orphans too.
//!
//! When an attempt ends (its leader exited or was stopped), [`Tracked::kill_all`] samples
//! once more and sends SIGKILL to every member still alive, again until none is left. A
//! subreaper first takes a quick look instead: when no member but the leader is alive and the
//! worker's main thread, which adopts every orphan, has no child the worker has not placed,
//! nothing of the attempt can be alive, and the pass over `/proc` is saved (most attempts end
//! so).
//!
//! The members of running attempts and the pending orphans are written to the worker's
//! record file (`<work dir>/tasks/<worker id>.procs`, mode 0600, in the directory tasks cannot
//! write) whenever they change. When a worker is killed, the next worker started with the
//! same work dir finds its unlocked lock (see [`super::workdir`]) and [`kill_recorded`] kills
//! every recorded process still alive with its recorded start time, and their descendants.
//! What a task started and escaped within one sampling interval before the worker was killed
//! (a process re-parented to init before any sample saw it) is not in the record: that is the
//! window of this mechanism.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::Duration;

/// How often the processes of running attempts are sampled.
pub const INTERVAL: Duration = Duration::from_millis(100);
/// The start time of a leader no sample has seen yet: earlier than every process, so that an
/// orphan may be this attempt's until the leader is sampled.
const UNSAMPLED: u64 = 0;

/// How often an ending attempt's remaining processes are looked for and killed again.
const KILL_RETRY: Duration = Duration::from_millis(10);

/// Most rounds of killing one set of processes (a process may fork while it is killed).
const KILL_ROUNDS: usize = 200;

/// Whether a worker of this process already is the subreaper: rule of one per process, so
/// that two workers never both claim the same adopted orphan.
static SUBREAPER_TAKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The fields of one `/proc/<pid>/stat` line that tracking and the memory watchdog use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub pid: i32,
    /// The state letter: `Z` (zombie) and `X` (dead) are not alive.
    pub state: u8,
    pub ppid: i32,
    pub pgrp: i32,
    pub session: i32,
    /// The resident set, in pages.
    pub rss_pages: u64,
    /// When the process started, in clock ticks after boot.
    pub start: u64,
}

impl Stat {
    /// Parses a `/proc/<pid>/stat` line.
    pub fn parse(line: &str) -> Option<Stat> {
        Stat::parse_bytes(line.as_bytes())
    }

    /// Parses a `/proc/<pid>/stat` line as the kernel writes it. The command name (field 2)
    /// is any bytes a task chose (the first 15 of the name of the file it runs), in
    /// parentheses, spaces and parentheses included: it is skipped as bytes, and the fields
    /// are counted after its last `)`. A name that is not UTF-8 never hides a process.
    pub fn parse_bytes(line: &[u8]) -> Option<Stat> {
        let open = line.iter().position(|b| *b == b'(')?;
        let close = line.iter().rposition(|b| *b == b')')?;
        let pid = std::str::from_utf8(&line[..open])
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let mut f = std::str::from_utf8(line.get(close + 1..)?)
            .ok()?
            .split_whitespace();
        // Fields 3 (state), 4 (ppid), 5 (pgrp), 6 (session), ..., 22 (start), 24 (rss).
        let state = *f.next()?.as_bytes().first()?;
        let ppid = f.next()?.parse().ok()?;
        let pgrp = f.next()?.parse().ok()?;
        let session = f.next()?.parse().ok()?;
        let start = f.nth(15)?.parse().ok()?;
        let rss_pages = f.nth(1)?.parse().ok()?;
        Some(Stat {
            pid,
            state,
            ppid,
            pgrp,
            session,
            rss_pages,
            start,
        })
    }

    pub fn alive(&self) -> bool {
        !matches!(self.state, b'Z' | b'X')
    }
}

/// Reads `/proc/<pid>/stat` and parses it, in one `read` (the kernel writes the line whole),
/// as bytes.
fn read_stat(pid: &str) -> Option<Stat> {
    use std::io::Read;
    let mut file = std::fs::File::open(format!("/proc/{pid}/stat")).ok()?;
    let mut buf = [0u8; 2048];
    let n = file.read(&mut buf).ok()?;
    if n < buf.len() {
        return Stat::parse_bytes(&buf[..n]);
    }
    // Longer than any line known: read the rest.
    let mut all = buf.to_vec();
    file.read_to_end(&mut all).ok()?;
    Stat::parse_bytes(&all)
}

/// Every process of the host, in one pass over `/proc`.
pub fn scan() -> Vec<Stat> {
    let Ok(proc) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    proc.flatten()
        .filter_map(|entry| {
            let name = entry.file_name();
            let pid = name
                .to_str()
                .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))?;
            read_stat(pid)
        })
        .collect()
}

/// The real uid of a process (`/proc/<pid>/status`), which a process not running as root
/// cannot change. Read as bytes: the `Name:` line holds whatever name the process chose.
fn uid_of(pid: i32) -> Option<u32> {
    let status = std::fs::read(format!("/proc/{pid}/status")).ok()?;
    let line = status
        .split(|b| *b == b'\n')
        .find_map(|l| l.strip_prefix(b"Uid:"))?;
    std::str::from_utf8(line)
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The processes of `procs` that descend from `roots` (the roots included when present), by
/// parent pid.
fn descendants(procs: &[Stat], roots: impl IntoIterator<Item = i32>) -> HashSet<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for p in procs {
        children.entry(p.ppid).or_default().push(p.pid);
    }
    let mut seen = HashSet::new();
    let mut todo: Vec<i32> = roots.into_iter().collect();
    while let Some(pid) = todo.pop() {
        if seen.insert(pid)
            && let Some(kids) = children.get(&pid)
        {
            todo.extend(kids.iter().copied());
        }
    }
    seen
}

/// Sends SIGKILL to the process `pid` only while it is still the one that started at
/// `start`: the pid is pinned with a pidfd, then its start time checked. Answers whether it
/// was signalled.
pub fn kill_exact(pid: i32, start: u64) -> bool {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    if fd < 0 {
        return false;
    }
    let same = read_stat(&pid.to_string()).is_some_and(|s| s.start == start);
    // SAFETY: `fd` is the pidfd opened above; a null siginfo is allowed; close takes it back.
    let signalled = same
        && unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd,
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        } == 0;
    unsafe { libc::close(fd) };
    signalled
}

/// The pids of the children of this process's main thread (`own_pid`), or `None` when the
/// kernel does not list them (`/proc/<pid>/task/<tid>/children` needs `CONFIG_PROC_CHILDREN`).
///
/// A child subreaper adopts an orphan into its first live thread (Linux's `find_new_reaper`
/// walks the subreaper's threads in order of creation), which is its main thread while the
/// process runs: every adopted orphan is a child of the main thread. The children of the
/// other threads are the leaders those threads forked, being spawned or already placed, and
/// are not read: reading every thread's list at every attempt's end cost W4 more than it
/// found.
fn main_thread_children(own_pid: i32) -> Option<Vec<i32>> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{own_pid}/children")).ok()?;
    Some(
        text.split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
            .collect(),
    )
}

/// Reaps `pid` if it is a zombie child of this process; never waits.
fn reap(pid: i32) {
    let mut status = 0;
    // SAFETY: waitpid on one pid with WNOHANG only collects that child, if it has exited.
    unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
}

/// Kills the processes listed in a dead worker's record file (`pid start` per line) that are
/// still alive with that start time, and every process descending from them, until none is
/// left; then removes the file. Answers how many processes were killed.
pub fn kill_recorded(record: &Path) -> usize {
    let Ok(text) = std::fs::read_to_string(record) else {
        return 0;
    };
    let recorded: HashSet<(i32, u64)> = text
        .lines()
        .filter_map(|l| {
            let (pid, start) = l.split_once(' ')?;
            Some((pid.parse().ok()?, start.trim().parse().ok()?))
        })
        .collect();
    let mut killed = 0;
    // Processes forked while these are killed descend from them, and are killed next round.
    let mut known = recorded;
    for _ in 0..KILL_ROUNDS {
        let procs = scan();
        let roots: Vec<i32> = procs
            .iter()
            .filter(|p| p.alive() && known.contains(&(p.pid, p.start)))
            .map(|p| p.pid)
            .collect();
        let family = descendants(&procs, roots);
        let alive: Vec<&Stat> = procs
            .iter()
            .filter(|p| p.alive() && family.contains(&p.pid))
            .collect();
        if alive.is_empty() {
            break;
        }
        for p in alive {
            known.insert((p.pid, p.start));
            if kill_exact(p.pid, p.start) {
                killed += 1;
            }
        }
        std::thread::sleep(KILL_RETRY);
    }
    let _ = std::fs::remove_file(record);
    killed
}

/// The tracker of one worker's attempts: a handle to its sampling thread, which stops (after
/// killing whatever it still tracks) when this is dropped.
#[derive(Debug)]
pub struct Reaper {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Wakes the thread: an attempt registered or ended, or the worker is stopping.
    wake: Condvar,
    /// Held for reading while a leader is spawned and registered, for writing while the
    /// thread looks for adopted orphans: a leader is never taken for an orphan.
    gate: RwLock<()>,
    record: PathBuf,
    own_pid: i32,
    own_session: i32,
    /// Whether this worker is the subreaper of its process.
    adopts: bool,
}

#[derive(Debug, Default)]
struct State {
    attempts: HashMap<u64, Attempt>,
    next_key: u64,
    /// The uids attempts ran as: only processes of these users are taken for orphans.
    uids: HashSet<u32>,
    /// Adopted orphans that more than one running attempt could own.
    pending: HashSet<(i32, u64)>,
    /// What the record file holds now.
    recorded: Vec<(i32, u64)>,
    stop: bool,
}

#[derive(Debug)]
struct Attempt {
    /// When its leader was spawned.
    spawned: std::time::Instant,
    leader: i32,
    /// When the leader started ([`UNSAMPLED`] until the first sample sees it).
    leader_start: u64,
    uid: u32,
    members: HashSet<(i32, u64)>,
    /// Set when the attempt ended: told once no member is left alive.
    ending: Option<tokio::sync::oneshot::Sender<usize>>,
    killed: usize,
    /// Samples since the attempt ended.
    rounds: usize,
}

impl Reaper {
    /// Starts tracking for a worker whose record file is `record`. With `subreaper`, makes
    /// this process a child subreaper, unless another worker of the process already is.
    pub fn start(record: PathBuf, subreaper: bool) -> std::io::Result<Reaper> {
        let adopts =
            subreaper && !SUBREAPER_TAKEN.swap(true, std::sync::atomic::Ordering::SeqCst) && {
                // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes a plain integer.
                if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) } != 0 {
                    SUBREAPER_TAKEN.store(false, std::sync::atomic::Ordering::SeqCst);
                    return Err(std::io::Error::last_os_error());
                }
                true
            };
        // SAFETY: getpid and getsid(0) have no preconditions.
        let (own_pid, own_session) = unsafe { (libc::getpid(), libc::getsid(0)) };
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            gate: RwLock::new(()),
            record,
            own_pid,
            own_session,
            adopts,
        });
        let thread = std::thread::Builder::new()
            .name("sked-reaper".into())
            .spawn({
                let shared = shared.clone();
                move || shared.run()
            })?;
        Ok(Reaper {
            shared,
            thread: Some(thread),
        })
    }

    /// Whether this worker adopts orphans (it is its process's child subreaper).
    pub fn adopts(&self) -> bool {
        self.shared.adopts
    }

    /// Spawns an attempt's leader with `spawn` and tracks it (with `uid`, the user it runs
    /// as) until the returned guard's [`Tracked::kill_all`] or drop.
    pub fn spawn<T>(
        &self,
        uid: u32,
        spawn: impl FnOnce() -> std::io::Result<T>,
        pid_of: impl FnOnce(&T) -> Option<u32>,
    ) -> std::io::Result<(T, Tracked)> {
        let _gate = self.shared.gate.read().expect("reaper gate");
        let spawned = spawn()?;
        let leader = pid_of(&spawned).map_or(0, |p| p as i32);
        // The leader's start time is read by the next sample, not here: reading `/proc` of a
        // process in the middle of its exec costs every spawn more than the whole sample.
        let leader_start = UNSAMPLED;
        let mut state = self.shared.state.lock().expect("reaper state");
        // The first attempt wakes the idle thread, to sample it once it has run for an
        // interval.
        let first = state.attempts.is_empty();
        let key = state.next_key;
        state.next_key += 1;
        state.uids.insert(uid);
        state.attempts.insert(
            key,
            Attempt {
                spawned: std::time::Instant::now(),
                leader,
                leader_start,
                uid,
                members: HashSet::from([(leader, leader_start)]),
                ending: None,
                killed: 0,
                rounds: 0,
            },
        );
        drop(state);
        if first {
            self.shared.wake.notify_one();
        }
        Ok((
            spawned,
            Tracked {
                shared: self.shared.clone(),
                key,
                done: false,
            },
        ))
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.shared.state.lock().expect("reaper state").stop = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        // Whatever is still recorded (orphans of attempts that all ended, say) goes with the
        // worker.
        kill_recorded(&self.shared.record);
        if self.shared.adopts {
            // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes a plain integer.
            unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 0) };
            SUBREAPER_TAKEN.store(false, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// One tracked attempt.
#[derive(Debug)]
pub struct Tracked {
    shared: Arc<Shared>,
    key: u64,
    done: bool,
}

impl Tracked {
    /// After the attempt's leader exited: kills every process of the attempt still alive,
    /// again until none is left, and stops tracking it. Answers how many were killed.
    pub async fn kill_all(mut self) -> usize {
        self.done = true;
        if self.shared.ended_clean(self.key) {
            return 0;
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        {
            let mut state = self.shared.state.lock().expect("reaper state");
            match state.attempts.get_mut(&self.key) {
                Some(attempt) => attempt.ending = Some(tx),
                None => return 0,
            }
        }
        self.shared.wake.notify_one();
        rx.await.unwrap_or(0)
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if !self.done {
            // Not ended by `kill_all` (the attempt's future was dropped): the thread kills
            // what is left and forgets it.
            if let Ok(mut state) = self.shared.state.lock()
                && let Some(attempt) = state.attempts.get_mut(&self.key)
            {
                let (tx, _) = tokio::sync::oneshot::channel();
                attempt.ending = Some(tx);
            }
            self.shared.wake.notify_one();
        }
    }
}

impl Shared {
    /// The quick look at an ended attempt, without a pass over `/proc`, for a subreaper: when
    /// no member but the (reaped) leader is alive and the worker has adopted no child it has
    /// not placed (zombies aside), nothing of the attempt can be alive (whatever descended
    /// from a dead member was re-parented to the worker's main thread), and it stops being
    /// tracked. Answers false when a full sample must decide.
    fn ended_clean(&self, key: u64) -> bool {
        if !self.adopts {
            return false;
        }
        let Some(children) = main_thread_children(self.own_pid) else {
            return false;
        };
        let mut state = self.state.lock().expect("reaper state");
        let Some(attempt) = state.attempts.get(&key) else {
            return true;
        };
        let alive = |pid: i32, start: u64| {
            read_stat(&pid.to_string()).is_some_and(|s| s.alive() && s.start == start)
        };
        if attempt
            .members
            .iter()
            .any(|(pid, start)| *pid != attempt.leader && alive(*pid, *start))
        {
            return false;
        }
        let placed: HashSet<i32> = state
            .attempts
            .iter()
            .filter(|(k, _)| **k != key)
            .flat_map(|(_, a)| a.members.iter().map(|(pid, _)| *pid).chain([a.leader]))
            .collect();
        let unplaced = children.into_iter().any(|pid| {
            !placed.contains(&pid)
                && read_stat(&pid.to_string())
                    .is_some_and(|s| s.alive() && s.session != self.own_session)
        });
        if unplaced {
            return false;
        }
        state.attempts.remove(&key);
        true
    }

    fn run(&self) {
        let mut state = self.state.lock().expect("reaper state");
        let mut last_pass = std::time::Instant::now();
        loop {
            if state.stop {
                return;
            }
            if state.attempts.is_empty() && state.pending.is_empty() {
                state = self.wake.wait(state).expect("reaper state");
                continue;
            }
            let ending = state.attempts.values().any(|a| a.ending.is_some());
            if !ending {
                // A pass is due an interval after the last one, and once an attempt has run
                // for an interval (at once while orphans are pending): every process is seen
                // within an interval of its start, as with a pass every interval, and
                // attempts that end sooner (most) cost no pass while they run.
                let oldest = state.attempts.values().map(|a| a.spawned).min();
                let since = match oldest {
                    Some(oldest) if state.pending.is_empty() => oldest.max(last_pass),
                    _ => last_pass,
                };
                let due = since + INTERVAL;
                let now = std::time::Instant::now();
                if now < due {
                    state = self
                        .wake
                        .wait_timeout(state, due - now)
                        .expect("reaper state")
                        .0;
                    continue;
                }
            }
            drop(state);
            last_pass = std::time::Instant::now();
            // After a kill, look again shortly: the killed are gone, or forked meanwhile.
            if self.sample() {
                std::thread::sleep(KILL_RETRY);
            }
            state = self.state.lock().expect("reaper state");
        }
    }

    /// One pass: updates every attempt's members, places adopted orphans, kills the
    /// processes of ended attempts and unowned orphans, reaps adopted zombies and rewrites
    /// the record when it changed. Answers whether to look again shortly: it sent a SIGKILL,
    /// or an ended attempt still has processes alive.
    fn sample(&self) -> bool {
        let procs = scan();
        let _gate = self.gate.write().expect("reaper gate");
        let mut state = self.state.lock().expect("reaper state");
        let by_pid: HashMap<i32, &Stat> = procs.iter().map(|p| (p.pid, p)).collect();
        let is = |pid: i32, start: u64| by_pid.get(&pid).is_some_and(|p| p.start == start);

        // Members still alive, and everything descending from them.
        let mut member_of: HashMap<i32, u64> = HashMap::new();
        let mut leader_count: HashMap<i32, usize> = HashMap::new();
        for attempt in state.attempts.values() {
            *leader_count.entry(attempt.leader).or_default() += 1;
        }
        for (key, attempt) in state.attempts.iter_mut() {
            if attempt.leader_start == UNSAMPLED {
                // A leader not sampled yet is the worker's child of that pid: a child is not
                // reaped before its attempt ends, so its pid names no other process, unless
                // another attempt's leader took it over after this one's was reaped.
                let seen = by_pid.get(&attempt.leader).filter(|p| {
                    p.ppid == self.own_pid && leader_count.get(&attempt.leader) == Some(&1)
                });
                attempt.members.remove(&(attempt.leader, UNSAMPLED));
                if let Some(p) = seen {
                    attempt.leader_start = p.start;
                    attempt.members.insert((attempt.leader, p.start));
                }
            }
            let roots: Vec<i32> = attempt
                .members
                .iter()
                .filter(|(pid, start)| is(*pid, *start))
                .map(|(pid, _)| *pid)
                .collect();
            attempt.members = descendants(&procs, roots)
                .into_iter()
                .filter_map(|pid| by_pid.get(&pid).map(|p| (pid, p.start)))
                .collect();
            for (pid, _) in &attempt.members {
                member_of.insert(*pid, *key);
            }
        }

        // Children of the worker that it did not start: orphans of tasks.
        let mut unowned: Vec<i32> = Vec::new();
        let mut pending: HashSet<(i32, u64)> = HashSet::new();
        if self.adopts {
            let leaders: HashSet<i32> = state.attempts.values().map(|a| a.leader).collect();
            for p in &procs {
                if p.ppid != self.own_pid
                    || p.session == self.own_session
                    || leaders.contains(&p.pid)
                    || member_of.contains_key(&p.pid)
                {
                    continue;
                }
                let Some(uid) = uid_of(p.pid).filter(|u| state.uids.contains(u)) else {
                    continue;
                };
                let owners: Vec<u64> = state
                    .attempts
                    .iter()
                    .filter(|(_, a)| a.uid == uid && a.leader_start <= p.start)
                    .map(|(k, _)| *k)
                    .collect();
                let family = descendants(&procs, [p.pid]);
                match owners.as_slice() {
                    [] => unowned.extend(family),
                    [owner] => {
                        let attempt = state.attempts.get_mut(owner).expect("owner");
                        for pid in family {
                            if let Some(q) = by_pid.get(&pid) {
                                attempt.members.insert((pid, q.start));
                            }
                        }
                    }
                    _ => pending.extend(
                        family
                            .into_iter()
                            .filter_map(|pid| by_pid.get(&pid).map(|q| (pid, q.start))),
                    ),
                }
            }
        }
        state.pending = pending;

        // Kill what ended attempts left, and orphans no running attempt owns.
        let mut again = false;
        for pid in unowned {
            if let Some(p) = by_pid.get(&pid).filter(|p| p.alive()) {
                again |= kill_exact(p.pid, p.start);
            }
        }
        let mut finished: Vec<u64> = Vec::new();
        for (key, attempt) in state.attempts.iter_mut() {
            if attempt.ending.is_none() {
                continue;
            }
            let alive: Vec<&Stat> = attempt
                .members
                .iter()
                .filter_map(|(pid, _)| by_pid.get(pid).copied())
                .filter(|p| p.alive() && p.pid != attempt.leader)
                .collect();
            attempt.rounds += 1;
            if alive.is_empty() {
                finished.push(*key);
            } else if attempt.rounds > KILL_ROUNDS {
                // A process stuck in the kernel (uninterruptible sleep) outlives SIGKILL for a
                // while: the attempt's result does not wait for it.
                tracing::warn!(
                    alive = alive.len(),
                    "processes of an ended attempt survive SIGKILL; no longer waiting for them"
                );
                finished.push(*key);
                continue;
            } else {
                again = true;
            }
            for p in alive {
                if kill_exact(p.pid, p.start) {
                    attempt.killed += 1;
                    again = true;
                }
            }
        }
        for key in finished {
            if let Some(mut attempt) = state.attempts.remove(&key)
                && let Some(tx) = attempt.ending.take()
            {
                let _ = tx.send(attempt.killed);
            }
        }

        // Zombies the worker adopted: every child it did not start itself.
        if self.adopts {
            let leaders: HashSet<i32> = state.attempts.values().map(|a| a.leader).collect();
            for p in &procs {
                if p.ppid == self.own_pid
                    && !p.alive()
                    && p.session != self.own_session
                    && !leaders.contains(&p.pid)
                {
                    reap(p.pid);
                }
            }
        }

        let mut record: Vec<(i32, u64)> = state
            .attempts
            .values()
            .flat_map(|a| a.members.iter().copied())
            .chain(state.pending.iter().copied())
            .filter(|(pid, _)| by_pid.get(pid).is_some_and(|p| p.alive()))
            .collect();
        record.sort_unstable();
        record.dedup();
        if record != state.recorded {
            match write_record(&self.record, &record) {
                Ok(()) => state.recorded = record,
                Err(e) => tracing::warn!(error = %e, file = %self.record.display(),
                    "could not record the tasks' processes"),
            }
        }
        again
    }
}

/// Replaces the record file with `procs`, one `pid start` per line (written aside, then
/// renamed, so a reader never sees half of it).
fn write_record(path: &Path, procs: &[(i32, u64)]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("procs.tmp");
    let mut text = String::with_capacity(procs.len() * 24);
    for (pid, start) in procs {
        text.push_str(&format!("{pid} {start}\n"));
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(text.as_bytes())?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_give_the_fields_tracking_needs() {
        let line = "4242 (a (weird) name) S 1 4240 4239 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 \
                    300 12345678 777 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(
            Stat::parse(line),
            Some(Stat {
                pid: 4242,
                state: b'S',
                ppid: 1,
                pgrp: 4240,
                session: 4239,
                rss_pages: 777,
                start: 300,
            })
        );
        assert_eq!(Stat::parse("garbage"), None);
        let named = b"4243 (\xff\xfe) x) S 1 4240 4239 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 \
                      301 12345678 778 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(
            Stat::parse_bytes(named).map(|s| (s.pid, s.start, s.rss_pages)),
            Some((4243, 301, 778)),
            "a name that is not UTF-8 hides no process"
        );
    }

    #[test]
    fn a_recorded_process_and_its_descendants_are_killed_and_a_reused_pid_is_not() {
        let dir = std::env::temp_dir().join(format!("sked-reaper-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut parent = std::process::Command::new("sh")
            .args(["-c", "sleep 60 & echo $!; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(parent.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let child: i32 = line.trim().parse().unwrap();
        let pid = parent.id() as i32;
        let start = read_stat(&pid.to_string()).unwrap().start;
        let record = dir.join("w.procs");
        // The same pid with another start time names another process: left alone.
        write_record(&record, &[(pid, start + 1)]).unwrap();
        assert_eq!(kill_recorded(&record), 0, "a reused pid is not killed");
        assert!(parent.try_wait().unwrap().is_none());
        write_record(&record, &[(pid, start)]).unwrap();
        assert_eq!(
            kill_recorded(&record),
            2,
            "the process and its child are killed"
        );
        assert!(parent.wait().is_ok());
        assert!(!record.exists(), "the record is removed once used");
        let gone = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            read_stat(&child.to_string()).is_none_or(|s| !s.alive())
        });
        assert!(gone, "the descendant of a recorded process is killed");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
