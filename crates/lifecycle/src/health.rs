//! Liveness, readiness and metrics of one process, rendered by the admin endpoints. Metrics are
//! `prometheus-client`'s: counters, gauges and histograms, with labels where a family needs
//! them, encoded in the OpenMetrics text format, plus the process's own CPU, memory and file
//! descriptors (`process.rs`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::metrics::counter::Counter as PromCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Label pairs of a metric family (`[("agent", "main"), ("outcome", "completed")]`).
pub type Labels = Vec<(&'static str, String)>;

/// A family of counters, one per label set.
pub type CounterFamily = Family<Labels, PromCounter>;

/// A family of histograms, one per label set.
pub type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// A family of gauges, one per label set.
pub type GaugeFamily = Family<Labels, Gauge>;

/// Health of a process: readiness per component and its metrics. Cheap to clone.
#[derive(Clone)]
pub struct Health {
    inner: Arc<Inner>,
}

struct Inner {
    components: Mutex<Vec<(String, Arc<AtomicBool>)>>,
    registry: Mutex<Registry>,
    /// Metrics by name, so a second registration of a name returns the first.
    counters: Mutex<Vec<(String, Counter)>>,
    families: Mutex<Vec<(String, CounterFamily)>>,
    histograms: Mutex<Vec<(String, HistogramFamily)>>,
    gauges: Mutex<Vec<(String, Gauge)>>,
    gauge_families: Mutex<Vec<(String, GaugeFamily)>>,
    ready: Gauge,
}

impl Default for Health {
    fn default() -> Self {
        let mut registry = Registry::default();
        let ready = Gauge::default();
        registry.register(
            "agentloop_ready",
            "Whether every component of this process is ready",
            ready.clone(),
        );
        registry.register_collector(Box::new(crate::process::ProcessCollector));
        Self {
            inner: Arc::new(Inner {
                components: Mutex::default(),
                registry: Mutex::new(registry),
                counters: Mutex::default(),
                families: Mutex::default(),
                histograms: Mutex::default(),
                gauges: Mutex::default(),
                gauge_families: Mutex::default(),
                ready,
            }),
        }
    }
}

/// A component's readiness switch; the process is ready when every component is.
#[derive(Clone)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks the component ready or not ready.
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Relaxed);
    }
}

/// A monotonically increasing counter without labels.
#[derive(Clone, Debug, Default)]
pub struct Counter(PromCounter);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.0.inc();
    }

    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.inc_by(n);
    }

    /// Returns the current value.
    pub fn get(&self) -> u64 {
        self.0.get()
    }
}

/// The name a counter is registered under: OpenMetrics adds `_total` to a counter's samples.
fn counter_name(name: &str) -> &str {
    name.strip_suffix("_total").unwrap_or(name)
}

/// Help text without the final full stop, which the encoder adds.
fn help_text(help: &str) -> &str {
    help.strip_suffix('.').unwrap_or(help)
}

/// Returns the metric registered under `name` in `list`, or registers `make()`'s.
fn once<M: Clone>(
    list: &Mutex<Vec<(String, M)>>,
    registry: &Mutex<Registry>,
    name: &str,
    make: impl FnOnce() -> M,
    register: impl FnOnce(&mut Registry, M),
) -> M {
    let mut list = list.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, metric)) = list.iter().find(|(n, _)| n == name) {
        return metric.clone();
    }
    let metric = make();
    register(
        &mut registry.lock().unwrap_or_else(PoisonError::into_inner),
        metric.clone(),
    );
    list.push((name.to_owned(), metric.clone()));
    metric
}

impl Health {
    /// Returns a new health registry with the process metrics.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a component, initially not ready.
    pub fn component(&self, name: &str) -> Readiness {
        let flag = Arc::new(AtomicBool::new(false));
        self.inner
            .components
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((name.to_owned(), flag.clone()));
        Readiness(flag)
    }

    /// Registers (or returns the existing) counter; `name` ends in `_total`.
    pub fn counter(&self, name: &str, help: &str) -> Counter {
        once(
            &self.inner.counters,
            &self.inner.registry,
            name,
            Counter::default,
            |registry, counter: Counter| {
                registry.register(counter_name(name), help_text(help), counter.0);
            },
        )
    }

    /// Registers (or returns the existing) family of labelled counters; `name` ends in `_total`.
    pub fn counter_family(&self, name: &str, help: &str) -> CounterFamily {
        once(
            &self.inner.families,
            &self.inner.registry,
            name,
            CounterFamily::default,
            |registry, family| registry.register(counter_name(name), help_text(help), family),
        )
    }

    /// Registers (or returns the existing) family of labelled histograms of seconds, with
    /// buckets from 1 ms doubling to about 33 s.
    pub fn histogram_family(&self, name: &str, help: &str) -> HistogramFamily {
        fn seconds() -> Histogram {
            Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.001, 2.0, 16,
            ))
        }
        self.histograms_of(name, help, seconds)
    }

    /// Registers (or returns the existing) family of labelled histograms of counts (a batch's
    /// size), with buckets 1, 2, 4, … 1024.
    pub fn size_histogram_family(&self, name: &str, help: &str) -> HistogramFamily {
        fn sizes() -> Histogram {
            Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                1.0, 2.0, 11,
            ))
        }
        self.histograms_of(name, help, sizes)
    }

    /// Registers (or returns the existing) family of histograms each made by `make`.
    fn histograms_of(&self, name: &str, help: &str, make: fn() -> Histogram) -> HistogramFamily {
        once(
            &self.inner.histograms,
            &self.inner.registry,
            name,
            || HistogramFamily::new_with_constructor(make),
            |registry, family| registry.register(name, help_text(help), family),
        )
    }

    /// Registers (or returns the existing) family of labelled gauges.
    pub fn gauge_family(&self, name: &str, help: &str) -> GaugeFamily {
        once(
            &self.inner.gauge_families,
            &self.inner.registry,
            name,
            GaugeFamily::default,
            |registry, family| registry.register(name, help_text(help), family),
        )
    }

    /// Registers (or returns the existing) gauge.
    pub fn gauge(&self, name: &str, help: &str) -> Gauge {
        once(
            &self.inner.gauges,
            &self.inner.registry,
            name,
            Gauge::default,
            |registry, gauge| registry.register(name, help_text(help), gauge),
        )
    }

    /// Returns whether every registered component is ready, with the names of those that are not.
    pub fn readiness(&self) -> (bool, Vec<String>) {
        let components = self
            .inner
            .components
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let waiting: Vec<String> = components
            .iter()
            .filter(|(_, flag)| !flag.load(Ordering::Relaxed))
            .map(|(name, _)| name.clone())
            .collect();
        (waiting.is_empty() && !components.is_empty(), waiting)
    }

    /// Renders every metric in the OpenMetrics text format.
    pub fn render_metrics(&self) -> String {
        let (ready, _) = self.readiness();
        self.inner.ready.set(i64::from(ready));
        let mut out = String::new();
        let registry = self
            .inner
            .registry
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Err(err) = prometheus_client::encoding::text::encode(&mut out, &registry) {
            tracing::error!(error = %err, "metrics could not be encoded");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_component_is() {
        let health = Health::new();
        assert!(!health.readiness().0, "no component means not ready");
        let a = health.component("a");
        let b = health.component("b");
        a.set(true);
        assert_eq!(health.readiness(), (false, vec!["b".to_owned()]));
        b.set(true);
        assert!(health.readiness().0);
        assert!(health.render_metrics().contains("agentloop_ready 1\n"));
    }

    #[test]
    fn counters_families_and_histograms_render_in_the_openmetrics_format() {
        let health = Health::new();
        let c = health.counter("agentloop_x_total", "Things.");
        c.inc();
        health.counter("agentloop_x_total", "Things.").inc();
        let runs = health.counter_family("agentloop_runs_total", "Runs.");
        runs.get_or_create(&vec![("outcome", "completed".to_owned())])
            .inc();
        let took = health.histogram_family("agentloop_run_duration_seconds", "Run time.");
        took.get_or_create(&vec![("agent", "main".to_owned())])
            .observe(0.003);
        let text = health.render_metrics();
        assert!(text.contains("agentloop_x_total 2\n"), "{text}");
        assert!(text.contains("# TYPE agentloop_x counter"), "{text}");
        assert!(
            text.contains("agentloop_runs_total{outcome=\"completed\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("agentloop_run_duration_seconds_bucket{le=\"0.004\",agent=\"main\"} 1")
                || text.contains(
                    "agentloop_run_duration_seconds_bucket{agent=\"main\",le=\"0.004\"} 1"
                ),
            "{text}"
        );
        assert!(text.contains("process_resident_memory_bytes "), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
