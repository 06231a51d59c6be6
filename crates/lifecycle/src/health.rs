//! Liveness, readiness and counters of one process, rendered by the admin endpoints.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Health of a process: readiness per component and Prometheus counters. Cheap to clone.
#[derive(Clone, Default)]
pub struct Health {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    components: Mutex<Vec<(String, Arc<AtomicBool>)>>,
    counters: Mutex<Vec<(String, String, Arc<AtomicU64>)>>,
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

/// A monotonically increasing counter.
#[derive(Clone, Debug, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.add(1);
    }

    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// Returns the current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Health {
    /// Returns a new, empty health registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a component, initially not ready.
    pub fn component(&self, name: &str) -> Readiness {
        let flag = Arc::new(AtomicBool::new(false));
        if let Ok(mut components) = self.inner.components.lock() {
            components.push((name.to_owned(), flag.clone()));
        }
        Readiness(flag)
    }

    /// Registers (or returns the existing) counter with a Prometheus name and help text.
    pub fn counter(&self, name: &str, help: &str) -> Counter {
        let Ok(mut counters) = self.inner.counters.lock() else {
            return Counter(Arc::new(AtomicU64::new(0)));
        };
        if let Some((_, _, value)) = counters.iter().find(|(n, _, _)| n == name) {
            return Counter(value.clone());
        }
        let value = Arc::new(AtomicU64::new(0));
        counters.push((name.to_owned(), help.to_owned(), value.clone()));
        Counter(value)
    }

    /// Returns whether every registered component is ready, with the names of those that are not.
    pub fn readiness(&self) -> (bool, Vec<String>) {
        let Ok(components) = self.inner.components.lock() else {
            return (false, vec!["poisoned".to_owned()]);
        };
        let waiting: Vec<String> = components
            .iter()
            .filter(|(_, flag)| !flag.load(Ordering::Relaxed))
            .map(|(name, _)| name.clone())
            .collect();
        (waiting.is_empty() && !components.is_empty(), waiting)
    }

    /// Renders the counters in the Prometheus text format.
    pub fn render_metrics(&self) -> String {
        let mut out = String::new();
        let (ready, _) = self.readiness();
        out.push_str("# HELP agentloop_ready Whether every component of this process is ready.\n");
        out.push_str("# TYPE agentloop_ready gauge\n");
        out.push_str(&format!("agentloop_ready {}\n", u8::from(ready)));
        if let Ok(counters) = self.inner.counters.lock() {
            for (name, help, value) in counters.iter() {
                out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
                out.push_str(&format!("{name} {}\n", value.load(Ordering::Relaxed)));
            }
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
    }

    #[test]
    fn counters_render_in_prometheus_format() {
        let health = Health::new();
        let c = health.counter("agentloop_x_total", "Things.");
        c.inc();
        health.counter("agentloop_x_total", "Things.").inc();
        let text = health.render_metrics();
        assert!(text.contains("agentloop_x_total 2\n"), "{text}");
        assert!(text.contains("# TYPE agentloop_x_total counter"));
    }
}
