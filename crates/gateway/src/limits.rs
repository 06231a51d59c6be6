//! What one client may hold or try: WebSockets per address, `/v1` requests open per address,
//! WebSockets waiting for `connect` over all clients, and failed authentications per address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use std::time::Instant;

use crate::{RequestError, config::GatewaySettings, guard::Refusal};

/// The first throttled failure waits this long; each further one doubles it.
const FIRST_WAIT: Duration = Duration::from_secs(1);
/// The longest wait after failed authentications.
const LONGEST_WAIT: Duration = Duration::from_secs(300);
/// An address without a failure for this long starts afresh.
const FORGET_AFTER: Duration = Duration::from_secs(600);
/// Past this many remembered addresses, the forgotten ones are swept, at most once a
/// [`SWEEP_EVERY`]: a sweep walks every entry under the lock every authentication takes.
const SWEEP_ABOVE: usize = 4096;
/// The shortest time between two sweeps.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// The most addresses remembered: past it a new address's failures go uncounted, so failures
/// from ever new addresses cannot grow the table without bound.
const MAX_REMEMBERED: usize = 65_536;

/// The shared counters; cheap to clone.
#[derive(Clone)]
pub(crate) struct Limits {
    inner: Arc<Inner>,
}

struct Inner {
    unauthenticated_max: usize,
    failures_allowed: u32,
    /// WebSockets open, per address.
    sockets: PerAddress,
    /// `/v1` requests open, per address.
    http: PerAddress,
    unauthenticated: AtomicUsize,
    /// How many addresses have failures on record: the common case (none) skips the lock.
    failing: AtomicUsize,
    failures: Mutex<FailureTable>,
}

/// The failed authentications on record, by address.
#[derive(Default)]
struct FailureTable {
    by_ip: HashMap<IpAddr, Failures>,
    /// When forgotten addresses were last swept out.
    swept_at: Option<Instant>,
}

struct Failures {
    count: u32,
    last: Instant,
    blocked_until: Option<Instant>,
}

/// How many of something each address holds, up to a cap; an address holding none takes no
/// room.
struct PerAddress {
    max: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
}

impl PerAddress {
    fn new(max: usize) -> Self {
        Self {
            max,
            held: Mutex::default(),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes one for `ip`; false when it holds its cap already.
    fn take(&self, ip: IpAddr) -> bool {
        let mut held = self.held();
        let count = held.entry(ip).or_insert(0);
        if *count >= self.max {
            if *count == 0 {
                held.remove(&ip);
            }
            return false;
        }
        *count += 1;
        true
    }

    fn give_back(&self, ip: IpAddr) {
        let mut held = self.held();
        if let Some(count) = held.get_mut(&ip) {
            *count -= 1;
            if *count == 0 {
                held.remove(&ip);
            }
        }
    }
}

/// A WebSocket of one client address; dropping it frees the place.
pub(crate) struct ClientSlot {
    limits: Limits,
    ip: IpAddr,
}

/// An open `/v1` request of one client address; dropping it frees the place.
pub(crate) struct HttpSlot {
    limits: Limits,
    ip: IpAddr,
}

/// A WebSocket that has not completed `connect`; dropping it frees the place.
pub(crate) struct PendingSlot {
    limits: Limits,
}

impl Limits {
    pub(crate) fn new(settings: &GatewaySettings) -> Self {
        Self {
            inner: Arc::new(Inner {
                sockets: PerAddress::new(settings.max_connections_per_client),
                http: PerAddress::new(settings.max_http_in_flight_per_client),
                unauthenticated_max: settings.max_unauthenticated,
                failures_allowed: settings.auth_failures_allowed,
                unauthenticated: AtomicUsize::new(0),
                failing: AtomicUsize::new(0),
                failures: Mutex::default(),
            }),
        }
    }

    /// Takes a place for a new WebSocket of `ip`, and one among those waiting for `connect`.
    ///
    /// # Errors
    /// The [`Refusal`] to answer the upgrade with.
    pub(crate) fn open(&self, ip: IpAddr) -> Result<(ClientSlot, PendingSlot), Refusal> {
        if !self.inner.sockets.take(ip) {
            return Err(Refusal::TooManyFromClient);
        }
        let client = ClientSlot {
            limits: self.clone(),
            ip,
        };
        let before = self.inner.unauthenticated.fetch_add(1, Ordering::AcqRel);
        let pending = PendingSlot {
            limits: self.clone(),
        };
        if before >= self.inner.unauthenticated_max {
            return Err(Refusal::TooManyUnauthenticated);
        }
        Ok((client, pending))
    }

    /// Takes a place for a `/v1` request of `ip`, held until the response is complete (a
    /// stream's last event).
    ///
    /// # Errors
    /// [`RequestError::TooManyInFlight`] when the address has all its requests open.
    pub(crate) fn http_request(&self, ip: IpAddr) -> Result<HttpSlot, RequestError> {
        if !self.inner.http.take(ip) {
            return Err(RequestError::TooManyInFlight {
                max: self.inner.http.max,
            });
        }
        Ok(HttpSlot {
            limits: self.clone(),
            ip,
        })
    }

    /// Refuses an address that is waiting out failed authentications.
    ///
    /// # Errors
    /// [`RequestError::AuthThrottled`] with the time left.
    pub(crate) fn check_auth(&self, ip: IpAddr) -> Result<(), RequestError> {
        self.check_auth_at(ip, Instant::now())
    }

    fn check_auth_at(&self, ip: IpAddr, now: Instant) -> Result<(), RequestError> {
        if self.inner.failing.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        let failures = self.failures();
        let Some(until) = failures.by_ip.get(&ip).and_then(|f| f.blocked_until) else {
            return Ok(());
        };
        if until > now {
            let left = until - now;
            return Err(RequestError::AuthThrottled {
                retry_after_ms: u64::try_from(left.as_millis()).unwrap_or(u64::MAX).max(1),
            });
        }
        Ok(())
    }

    /// Counts a failed authentication of `ip`; past the allowance, the next attempt waits.
    pub(crate) fn auth_failed(&self, ip: IpAddr) {
        self.auth_failed_at(ip, Instant::now());
    }

    fn auth_failed_at(&self, ip: IpAddr, now: Instant) {
        let mut table = self.failures();
        let due = table
            .swept_at
            .is_none_or(|at| now.saturating_duration_since(at) >= SWEEP_EVERY);
        if table.by_ip.len() > SWEEP_ABOVE && due {
            table
                .by_ip
                .retain(|_, f| now.saturating_duration_since(f.last) < FORGET_AFTER);
            table.swept_at = Some(now);
        }
        if table.by_ip.len() >= MAX_REMEMBERED && !table.by_ip.contains_key(&ip) {
            tracing::warn!(%ip, remembered = MAX_REMEMBERED, "failed authentication not counted: too many failing addresses on record");
            return;
        }
        let failures = &mut table.by_ip;
        let entry = failures.entry(ip).or_insert(Failures {
            count: 0,
            last: now,
            blocked_until: None,
        });
        if now.saturating_duration_since(entry.last) >= FORGET_AFTER {
            entry.count = 0;
        }
        entry.count = entry.count.saturating_add(1);
        entry.last = now;
        if let Some(over) = entry.count.checked_sub(self.inner.failures_allowed)
            && over > 0
        {
            let wait = FIRST_WAIT
                .saturating_mul(1u32 << (over - 1).min(16))
                .min(LONGEST_WAIT);
            entry.blocked_until = Some(now + wait);
        }
        self.inner.failing.store(failures.len(), Ordering::Release);
    }

    /// Forgets the failures of an address that authenticated.
    pub(crate) fn auth_succeeded(&self, ip: IpAddr) {
        if self.inner.failing.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut table = self.failures();
        table.by_ip.remove(&ip);
        self.inner
            .failing
            .store(table.by_ip.len(), Ordering::Release);
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, FailureTable> {
        self.inner
            .failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        self.limits.inner.sockets.give_back(self.ip);
    }
}

impl Drop for HttpSlot {
    fn drop(&mut self) {
        self.limits.inner.http.give_back(self.ip);
    }
}

impl Drop for PendingSlot {
    fn drop(&mut self) {
        self.limits
            .inner
            .unauthenticated
            .fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(f: impl FnOnce(&mut GatewaySettings)) -> Limits {
        let mut settings = GatewaySettings::default();
        f(&mut settings);
        Limits::new(&settings)
    }

    #[test]
    fn open_http_requests_are_capped_per_address_and_freed() {
        let limits = limits(|s| s.max_http_in_flight_per_client = 2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = limits.http_request(a).unwrap();
        let _second = limits.http_request(a).unwrap();
        assert!(matches!(
            limits.http_request(a),
            Err(RequestError::TooManyInFlight { max: 2 })
        ));
        assert!(
            limits.http_request(b).is_ok(),
            "another address has its own"
        );
        drop(first);
        assert!(limits.http_request(a).is_ok());
    }

    #[test]
    fn places_per_client_and_waiting_for_connect_are_capped_and_freed() {
        let limits = limits(|s| {
            s.max_connections_per_client = 2;
            s.max_unauthenticated = 3;
        });
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = limits.open(a).unwrap();
        let second = limits.open(a).unwrap();
        assert_eq!(limits.open(a).err(), Some(Refusal::TooManyFromClient));
        drop(first);
        let (third, pending) = limits.open(a).unwrap();
        drop(pending); // connected
        let _b1 = limits.open(b).unwrap();
        let _b2 = limits.open(b).unwrap();
        let c: IpAddr = "10.0.0.3".parse().unwrap();
        assert_eq!(limits.open(c).err(), Some(Refusal::TooManyUnauthenticated));
        drop((second, third));
        assert!(limits.open(c).is_ok());
    }

    #[test]
    fn failures_from_ever_new_addresses_stay_bounded_and_are_forgotten() {
        let limits = limits(|s| s.auth_failures_allowed = 0);
        let start = Instant::now();
        let nth = |i: usize| IpAddr::from(std::net::Ipv6Addr::from(i as u128 + 1));
        for i in 0..MAX_REMEMBERED {
            limits.auth_failed_at(nth(i), start);
        }
        // Full: a new address goes uncounted, one on record is still throttled.
        let newcomer = nth(MAX_REMEMBERED);
        limits.auth_failed_at(newcomer, start);
        assert!(limits.check_auth_at(newcomer, start).is_ok());
        assert!(limits.check_auth_at(nth(0), start).is_err());
        assert_eq!(limits.failures().by_ip.len(), MAX_REMEMBERED);
        // Once the others are forgotten, the next failure sweeps them out.
        let later = start + FORGET_AFTER;
        limits.auth_failed_at(newcomer, later);
        assert_eq!(limits.failures().by_ip.len(), 1);
        assert!(limits.check_auth_at(newcomer, later).is_err());
    }

    #[test]
    fn failed_authentications_past_the_allowance_wait_longer_each_time() {
        let limits = limits(|s| s.auth_failures_allowed = 2);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let start = Instant::now();
        limits.auth_failed_at(ip, start);
        limits.auth_failed_at(ip, start);
        assert!(limits.check_auth_at(ip, start).is_ok());
        limits.auth_failed_at(ip, start);
        let Err(RequestError::AuthThrottled { retry_after_ms }) = limits.check_auth_at(ip, start)
        else {
            panic!("not throttled");
        };
        assert_eq!(retry_after_ms, 1000);
        let later = start + FIRST_WAIT;
        assert!(limits.check_auth_at(ip, later).is_ok());
        limits.auth_failed_at(ip, later);
        let Err(RequestError::AuthThrottled { retry_after_ms }) = limits.check_auth_at(ip, later)
        else {
            panic!("not throttled");
        };
        assert_eq!(retry_after_ms, 2000);
        assert!(
            limits
                .check_auth_at("10.0.0.2".parse().unwrap(), later)
                .is_ok()
        );
        limits.auth_succeeded(ip);
        assert!(limits.check_auth_at(ip, later).is_ok());
    }
}
