//! The process's own resources as Prometheus reads them everywhere (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_open_fds`, `process_max_fds`), read from `/proc`
//! at each scrape. Elsewhere than Linux they are left out.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Reads `/proc/self` when scraped.
#[derive(Debug)]
pub(crate) struct ProcessCollector;

/// Clock ticks per second of `/proc/<pid>/stat` times (100 on every Linux build in use).
const TICKS_PER_SECOND: f64 = 100.0;
/// Page size for `statm` (4 KiB on the platforms agentloop ships for).
const PAGE_BYTES: u64 = 4096;

/// CPU seconds (user + system) from `/proc/self/stat`'s text.
pub(crate) fn cpu_seconds(stat: &str) -> Option<f64> {
    // The command name in parentheses may hold spaces: fields are counted after it.
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / TICKS_PER_SECOND)
}

/// Resident bytes from `/proc/self/statm`'s text.
pub(crate) fn resident_bytes(statm: &str) -> Option<u64> {
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * PAGE_BYTES)
}

/// The soft limit of open files from `/proc/self/limits`'s text.
pub(crate) fn max_fds(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if let Some(cpu) = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .as_deref()
            .and_then(cpu_seconds)
        {
            let counter = ConstCounter::new(cpu);
            let metric = encoder.encode_descriptor(
                "process_cpu_seconds",
                "CPU time used by the process, user and system, in seconds",
                None,
                counter.metric_type(),
            )?;
            counter.encode(metric)?;
        }
        if let Some(rss) = std::fs::read_to_string("/proc/self/statm")
            .ok()
            .as_deref()
            .and_then(resident_bytes)
        {
            let gauge = ConstGauge::new(i64::try_from(rss).unwrap_or(i64::MAX));
            let metric = encoder.encode_descriptor(
                "process_resident_memory_bytes",
                "Resident memory of the process, in bytes",
                None,
                gauge.metric_type(),
            )?;
            gauge.encode(metric)?;
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            let gauge = ConstGauge::new(i64::try_from(fds.count()).unwrap_or(i64::MAX));
            let metric = encoder.encode_descriptor(
                "process_open_fds",
                "File descriptors the process holds open",
                None,
                gauge.metric_type(),
            )?;
            gauge.encode(metric)?;
        }
        if let Some(max) = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .as_deref()
            .and_then(max_fds)
        {
            let gauge = ConstGauge::new(i64::try_from(max).unwrap_or(i64::MAX));
            let metric = encoder.encode_descriptor(
                "process_max_fds",
                "The most file descriptors the process may open",
                None,
                gauge.metric_type(),
            )?;
            gauge.encode(metric)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_are_read_as_the_kernel_writes_them() {
        let stat =
            "4242 (agent loop) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 1 2 3";
        assert_eq!(cpu_seconds(stat), Some(3.0));
        assert_eq!(resident_bytes("5000 1024 300 1 0 900 0"), Some(1024 * 4096));
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 524288               files\n";
        assert_eq!(max_fds(limits), Some(1024));
    }
}
