//! The machine description of the report (CPU model, cores, kernel, the filesystem of the
//! temporary directory, the compiler) and the peak resident set size of this process.

use std::path::Path;

use serde_json::{Value, json};

/// The compiler that built this binary (recorded by the build script).
pub const RUSTC_VERSION: &str = env!("DEERMEM_BENCH_RUSTC_VERSION");

/// `VmHWM` of this process in KiB (its peak RSS), from `/proc/self/status`.
pub fn peak_rss_kb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_status_kb(&status, "VmHWM:")
}

/// Bytes this process has had read from the storage device so far (`read_bytes` of
/// `/proc/self/io`: page-cache misses, not reads the cache answered).
pub fn disk_read_bytes() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    parse_status_kb(&io, "read_bytes:")
}

/// CPU time (user + system) this process has used so far, from `/proc/self/stat`, in the
/// kernel's fixed `USER_HZ` ticks of 10 ms.
pub fn process_cpu_time() -> Option<std::time::Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_stat_cpu(&stat)
}

/// CPU time (user + system) of every thread of this process so far, with the clock's own
/// resolution (`CLOCK_PROCESS_CPUTIME_ID`): for phases too short for [`process_cpu_time`]'s
/// 10 ms ticks.
pub fn process_cpu_time_precise() -> std::time::Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    std::time::Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

/// `utime + stime` of a `/proc/<pid>/stat` line (fields 14 and 15; the command name in
/// parentheses may hold spaces, so fields are counted after its closing parenthesis).
fn parse_stat_cpu(stat: &str) -> Option<std::time::Duration> {
    /// `USER_HZ`: the unit of the tick counts the kernel exports, 100 on Linux.
    const TICKS_PER_SEC: u64 = 100;
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    // After the command: state (3) ... utime (14), stime (15).
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(std::time::Duration::from_millis(
        (utime + stime) * 1000 / TICKS_PER_SEC,
    ))
}

fn parse_status_kb(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The mount (device, type) holding `path`: the longest mount point that prefixes it.
fn filesystem_of(path: &Path, mounts: &str) -> Option<(String, String, String)> {
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut best: Option<(usize, (String, String, String))> = None;
    for line in mounts.lines() {
        let mut parts = line.split_whitespace();
        let (Some(dev), Some(point), Some(kind)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let point = point.replace("\\040", " ");
        if canonical.starts_with(&point) {
            let len = point.len();
            if best.as_ref().is_none_or(|(l, _)| len >= *l) {
                best = Some((len, (dev.to_owned(), point.clone(), kind.to_owned())));
            }
        }
    }
    best.map(|(_, m)| m)
}

/// The machine section of the report; `tmp` is the directory the workloads write to.
pub fn describe(tmp: &Path) -> Value {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| std::env::consts::OS.to_owned());
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let fs = filesystem_of(tmp, &mounts);
    let mem_kb = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| parse_status_kb(&t, "MemTotal:"));
    json!({
        "cpu": cpu_model(),
        "cores": cores,
        "memory_kb": mem_kb,
        "kernel": kernel,
        "os": std::env::consts::OS,
        "arch": std::env::consts::ARCH,
        "tmp_dir": tmp.display().to_string(),
        "tmp_filesystem": fs.as_ref().map(|(_, _, kind)| kind.clone()),
        "tmp_device": fs.as_ref().map(|(dev, _, _)| dev.clone()),
        "tmp_mount": fs.as_ref().map(|(_, point, _)| point.clone()),
        "rustc": RUSTC_VERSION,
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_values_are_parsed() {
        let status = "Name:\tx\nVmPeak:\t  2000 kB\nVmHWM:\t  1234 kB\n";
        assert_eq!(parse_status_kb(status, "VmHWM:"), Some(1234));
        assert_eq!(parse_status_kb(status, "VmRSS:"), None);
        let io = "rchar: 6976\nwchar: 0\nread_bytes: 8192\nwrite_bytes: 0\n";
        assert_eq!(parse_status_kb(io, "read_bytes:"), Some(8192));
    }

    #[test]
    fn stat_cpu_times_are_summed() {
        let stat = "42 (a (weird) name) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0";
        assert_eq!(
            parse_stat_cpu(stat),
            Some(std::time::Duration::from_millis(3000))
        );
        assert_eq!(parse_stat_cpu("42 (x) S 1"), None);
        assert!(process_cpu_time().is_some());
    }

    #[test]
    fn longest_mount_point_wins() {
        let mounts = "/dev/vda / ext4 rw 0 0\ntmpfs /tmp tmpfs rw 0 0\n";
        let (dev, point, kind) = filesystem_of(Path::new("/tmp/x/y"), mounts).unwrap();
        assert_eq!(
            (dev.as_str(), point.as_str(), kind.as_str()),
            ("tmpfs", "/tmp", "tmpfs")
        );
        let (_, point, kind) = filesystem_of(Path::new("/work/x"), mounts).unwrap();
        assert_eq!((point.as_str(), kind.as_str()), ("/", "ext4"));
    }

    #[test]
    fn this_process_has_a_peak_rss() {
        assert!(peak_rss_kb().is_some_and(|kb| kb > 0));
    }
}
