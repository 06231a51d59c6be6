//! Resident memory and CPU time of processes, read from `/proc` (Linux only).

use std::collections::BTreeMap;

/// One reading of a process.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcSample {
    /// `VmRSS` in KiB.
    pub rss_kib: u64,
}

/// Reads `/proc/<pid>/status`; `None` when the process is gone.
pub fn sample(pid: u32) -> Option<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    Some(ProcSample { rss_kib })
}

/// `utime + stime` of a process in clock ticks.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields are counted after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field 14 (utime) and 15 (stime) of proc(5); `rest` starts at field 3.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The parent pid of a process.
pub fn parent_pid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Clock ticks per second (`getconf CLK_TCK`, 100 on every common Linux).
pub fn clock_ticks_per_sec() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t| t > 0)
        .unwrap_or(100)
}

/// The machine's CPU time in clock ticks, summed over its CPUs (the first line of `/proc/stat`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MachineTicks {
    /// Time the CPUs ran anything: user, nice, system, irq and softirq.
    pub busy: u64,
    /// Time the hypervisor gave this machine's virtual CPUs to someone else while they had work.
    pub steal: u64,
    /// All the time accounted, idle and iowait included.
    pub total: u64,
}

impl MachineTicks {
    /// Reads `/proc/stat`; `None` when it cannot be read or parsed.
    pub fn take() -> Option<Self> {
        Self::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// Parses the aggregate `cpu` line of a `/proc/stat` text.
    pub fn parse(stat: &str) -> Option<Self> {
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let fields: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        // proc(5): user nice system idle iowait irq softirq steal [guest guest_nice]; guest
        // time is already counted in user and nice, so it is left out of the total.
        let field = |i: usize| fields.get(i).copied().unwrap_or(0);
        if fields.len() < 4 {
            return None;
        }
        Some(Self {
            busy: field(0) + field(1) + field(2) + field(5) + field(6),
            steal: field(7),
            total: (0..8).map(field).sum(),
        })
    }

    /// Ticks accounted between `before` and `self`.
    pub fn since(&self, before: &Self) -> Self {
        Self {
            busy: self.busy.saturating_sub(before.busy),
            steal: self.steal.saturating_sub(before.steal),
            total: self.total.saturating_sub(before.total),
        }
    }
}

/// CPU ticks of a set of processes, grouped by a display name.
#[derive(Debug, Clone, Default)]
pub struct CpuSnapshot {
    /// pid -> (group, ticks)
    pub by_pid: BTreeMap<u32, (String, u64)>,
}

impl CpuSnapshot {
    /// Reads the ticks of every `(pid, group)` given.
    pub fn take(pids: &[(u32, String)]) -> Self {
        let mut by_pid = BTreeMap::new();
        for (pid, group) in pids {
            if let Some(ticks) = cpu_ticks(*pid) {
                by_pid.insert(*pid, (group.clone(), ticks));
            }
        }
        Self { by_pid }
    }

    /// Ticks spent per group between `before` and `self`. A pid that appeared since `before`
    /// counts from zero (a new Postgres backend); one that vanished is lost (rare, approximate).
    pub fn delta_since(&self, before: &CpuSnapshot) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for (pid, (group, ticks)) in &self.by_pid {
            let start = before.by_pid.get(pid).map_or(0, |(_, t)| *t);
            *out.entry(group.clone()).or_insert(0) += ticks.saturating_sub(start);
        }
        out
    }
}

/// Machine description for the results: cores, CPU model, memory.
pub fn machine() -> (usize, String, String) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let mem = std::process::Command::new("free")
        .arg("-h")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Mem:"))
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        })
        .unwrap_or_else(|| "unknown".to_owned());
    (cores, model, mem)
}

/// `root` and every process below it (children, grandchildren, ...), from `/proc/*/stat`.
pub fn process_tree(root: u32) -> Vec<u32> {
    let mut parent_of: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // Field 4 (ppid) is the second field after the command name's last ')'.
            let ppid = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
                .and_then(|p| p.parse().ok());
            if let Some(ppid) = ppid {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(
            parent_of
                .iter()
                .filter(|(_, ppid)| *ppid == parent)
                .map(|(pid, _)| *pid),
        );
        i += 1;
    }
    tree
}

/// The machine's speed at one moment: what [`cpu_yardstick`] and [`loopback_round_trip`] took.
#[derive(Debug, Clone, Copy, Default)]
pub struct Yardsticks {
    /// The integer loop, best of five.
    pub integer_loop: std::time::Duration,
    /// The loopback round trip, median (`None` when the socket could not be made).
    pub round_trip: Option<std::time::Duration>,
}

impl Yardsticks {
    /// Measures both now (about a second).
    pub fn measure() -> Self {
        Self {
            integer_loop: cpu_yardstick(),
            round_trip: loopback_round_trip().ok(),
        }
    }

    /// The round trip in µs with one decimal, "—" when it could not be measured.
    pub fn round_trip_micros(self) -> String {
        self.round_trip.map_or("—".to_owned(), |rt| {
            format!("{:.1}", rt.as_secs_f64() * 1e6)
        })
    }

    /// One sentence giving both yardsticks before and after a run.
    pub fn sentence(before: Self, after: Self) -> String {
        format!(
            "The machine's yardsticks before / after the run (lower is faster; figures of runs \
             whose yardsticks differ do not compare): a fixed single-threaded integer loop \
             {:.1} / {:.1} ms, a loopback TCP ping-pong {} / {} µs per round trip.",
            before.integer_loop.as_secs_f64() * 1000.0,
            after.integer_loop.as_secs_f64() * 1000.0,
            before.round_trip_micros(),
            after.round_trip_micros(),
        )
    }
}

/// Times a fixed single-threaded integer loop (best of five), a yardstick of the machine's CPU
/// speed at the time: results from different days compare only as far as their yardsticks do.
pub fn cpu_yardstick() -> std::time::Duration {
    (0..5)
        .map(|_| {
            let started = std::time::Instant::now();
            let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
            for i in 0..50_000_000_u64 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x = x.wrapping_add(i);
            }
            std::hint::black_box(x);
            started.elapsed()
        })
        .min()
        .unwrap_or_default()
}

/// Times a loopback TCP ping-pong between two threads (one byte each way, Nagle off; median
/// round trip of 20 000): the stack's hops are mostly such wakeups, so this yardstick shows how
/// fast the machine is at what the stack does most.
pub fn loopback_round_trip() -> std::io::Result<std::time::Duration> {
    use std::io::{Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut peer, _) = listener.accept()?;
        peer.set_nodelay(true)?;
        let mut byte = [0_u8; 1];
        while peer.read(&mut byte)? == 1 {
            peer.write_all(&byte)?;
        }
        Ok(())
    });
    let mut conn = std::net::TcpStream::connect(addr)?;
    conn.set_nodelay(true)?;
    let mut byte = [7_u8; 1];
    let mut times = Vec::with_capacity(20_000);
    for _ in 0..20_000 {
        let started = std::time::Instant::now();
        conn.write_all(&byte)?;
        conn.read_exact(&mut byte)?;
        times.push(started.elapsed());
    }
    drop(conn);
    let _ = echo.join();
    times.sort();
    Ok(times[times.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::MachineTicks;

    #[test]
    fn machine_ticks_sum_busy_fields_and_keep_steal_apart() {
        let stat = "cpu  100 5 20 1000 7 3 2 40 9 0\ncpu0 50 2 10 500 3 1 1 20 0 0\n";
        let ticks = MachineTicks::parse(stat).expect("an aggregate cpu line");
        assert_eq!(ticks.busy, 100 + 5 + 20 + 3 + 2);
        assert_eq!(ticks.steal, 40);
        assert_eq!(ticks.total, 100 + 5 + 20 + 1000 + 7 + 3 + 2 + 40);
        let later = MachineTicks::parse("cpu  110 5 25 1100 7 3 2 55 9 0\n").expect("parsed");
        assert_eq!(
            later.since(&ticks),
            MachineTicks {
                busy: 15,
                steal: 15,
                total: 130
            }
        );
        assert_eq!(MachineTicks::parse("intr 1 2 3\n"), None);
    }
}
