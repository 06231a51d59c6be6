//! Who may reach the gateway from a browser, and who the client is behind a proxy.
//!
//! A browser on the gateway's host is a loopback client, so without these checks any web page
//! it opens could drive a token-less gateway: by a cross-site WebSocket (checked: `Origin`), by
//! DNS rebinding a name of its own to 127.0.0.1 (checked: `Host`), or by a "simple" `text/plain`
//! POST (checked: `Content-Type`, in the `/v1` handler). Every check compares headers only.

use std::net::{IpAddr, SocketAddr};

use axum::{
    Json,
    extract::Request,
    http::{HeaderMap, HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use serde_json::json;

use crate::{GatewayError, config::GatewaySettings};

/// Why a request is refused before any handler sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `Host` names neither this gateway nor an allowed host.
    ForeignHost,
    /// `Origin` is a page of another site.
    ForeignOrigin,
    /// A `/v1` POST whose body is not declared JSON.
    NotJson,
    /// Too many WebSockets are waiting for `connect`.
    TooManyUnauthenticated,
    /// The client address holds its share of WebSockets.
    TooManyFromClient,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (status, code, message) = match self {
            Self::ForeignHost => (
                StatusCode::FORBIDDEN,
                "forbidden_host",
                "the Host header names no host of this gateway (see gateway.allowed_hosts)",
            ),
            Self::ForeignOrigin => (
                StatusCode::FORBIDDEN,
                "forbidden_origin",
                "pages of this origin may not use the gateway (see gateway.allowed_origins)",
            ),
            Self::NotJson => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "the body must be sent as Content-Type: application/json",
            ),
            Self::TooManyUnauthenticated => (
                StatusCode::SERVICE_UNAVAILABLE,
                "too_many_unauthenticated",
                "too many connections are waiting for connect; retry later",
            ),
            Self::TooManyFromClient => (
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_connections",
                "this address has too many open connections (gateway.max_connections_per_client)",
            ),
        };
        let body =
            json!({"error": {"message": message, "type": "invalid_request_error", "code": code}});
        (status, Json(body)).into_response()
    }
}

/// An IP network: an address and the number of leading bits that must match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cidr {
    addr: IpAddr,
    bits: u8,
}

impl Cidr {
    fn parse(text: &str) -> Result<Self, &'static str> {
        let (addr, bits) = match text.split_once('/') {
            Some((addr, bits)) => (addr, Some(bits)),
            None => (text, None),
        };
        let addr: IpAddr = addr.trim().parse().map_err(|_| "not an IP address")?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            Some(bits) => bits.trim().parse::<u8>().map_err(|_| "bad prefix length")?,
            None => max,
        };
        if bits > max {
            return Err("prefix length too long for the address");
        }
        Ok(Self { addr, bits })
    }

    fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => prefix_eq(
                u128::from(net.to_bits()),
                u128::from(ip.to_bits()),
                self.bits,
                32,
            ),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_eq(net.to_bits(), ip.to_bits(), self.bits, 128)
            }
            _ => false,
        }
    }
}

fn prefix_eq(a: u128, b: u128, bits: u8, width: u32) -> bool {
    let shift = width - u32::from(bits);
    shift >= width || (a >> shift) == (b >> shift)
}

/// An IPv4 peer on a dual-stack socket shows up as `::ffff:a.b.c.d`; it is the IPv4 client.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 @ IpAddr::V4(_) => v4,
    }
}

/// The header checks, set up once from `[gateway]` and the bound address.
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    any_host: bool,
    /// Lower-case `name` (any port) or `name:port` entries.
    hosts: Vec<String>,
    any_origin: bool,
    /// Lower-case origins without a trailing slash.
    origins: Vec<String>,
    proxies: Vec<Cidr>,
}

impl Guard {
    /// Reads the settings; `listen` is the configured listen address.
    ///
    /// # Errors
    /// [`GatewayError::InvalidSetting`] for a `trusted_proxies` entry that is no address or CIDR.
    pub(crate) fn new(settings: &GatewaySettings) -> Result<Self, GatewayError> {
        let lower = |list: &[String]| -> Vec<String> {
            list.iter()
                .map(|s| s.trim().trim_end_matches('/').to_ascii_lowercase())
                .filter(|s| !s.is_empty())
                .collect()
        };
        let mut hosts = lower(&settings.allowed_hosts);
        // The name in `listen` (when it is one) is this gateway's own.
        if let Some((name, _)) = split_host(&settings.listen) {
            hosts.push(name.to_ascii_lowercase());
        }
        let origins = lower(&settings.allowed_origins);
        let proxies = settings
            .trusted_proxies
            .iter()
            .map(|p| {
                Cidr::parse(p).map_err(|reason| GatewayError::InvalidSetting {
                    key: "trusted_proxies",
                    value: p.clone(),
                    reason,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            any_host: hosts.iter().any(|h| h == "*"),
            hosts,
            any_origin: origins.iter().any(|o| o == "*"),
            origins,
            proxies,
        })
    }

    /// Returns whether a `Host` header names this gateway. IP addresses always do: DNS
    /// rebinding needs a name the attacker controls, and ports change behind port mappings.
    pub(crate) fn host_allowed(&self, host: &str) -> bool {
        if self.any_host {
            return true;
        }
        let Some((name, _)) = split_host(host) else {
            return false;
        };
        let name = name.strip_suffix('.').unwrap_or(name);
        if name.eq_ignore_ascii_case("localhost") || is_ip_literal(name) {
            return true;
        }
        self.hosts
            .iter()
            .any(|allowed| allowed.eq_ignore_ascii_case(name) || allowed.eq_ignore_ascii_case(host))
    }

    /// Returns whether a page of `origin` may call the gateway reached as `host`: its own
    /// pages (`http(s)://<host>`) and the configured origins may.
    pub(crate) fn origin_allowed(&self, origin: &str, host: Option<&str>) -> bool {
        if self.any_origin {
            return true;
        }
        let authority = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"));
        if let (Some(authority), Some(host)) = (authority, host)
            && authority.trim_end_matches('/').eq_ignore_ascii_case(host)
        {
            return true;
        }
        let origin = origin.trim_end_matches('/');
        self.origins.iter().any(|o| o.eq_ignore_ascii_case(origin))
    }

    /// Returns the client's address: the peer's, or, when the peer is a trusted proxy, the
    /// rightmost `X-Forwarded-For` hop that is not a trusted proxy itself. A trusted proxy that
    /// names no client yields the unspecified address, so it never passes as loopback.
    pub(crate) fn client_ip(&self, peer: SocketAddr, headers: &HeaderMap) -> IpAddr {
        let peer = canonical(peer.ip());
        if self.proxies.is_empty() || !self.trusted(peer) {
            return peer;
        }
        let mut hops = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .rev();
        let unknown = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
        let mut last_trusted = None;
        for hop in hops.by_ref() {
            let Ok(ip) = hop.trim().parse::<IpAddr>() else {
                return unknown;
            };
            let ip = canonical(ip);
            if !self.trusted(ip) {
                return ip;
            }
            last_trusted = Some(ip);
        }
        // Every hop is a proxy of ours: the leftmost one is where the request came from.
        last_trusted.unwrap_or(unknown)
    }

    fn trusted(&self, ip: IpAddr) -> bool {
        self.proxies.iter().any(|p| p.contains(ip))
    }
}

/// Splits `host[:port]` (or `[v6][:port]`); `None` when malformed.
fn split_host(text: &str) -> Option<(&str, Option<&str>)> {
    if let Some(rest) = text.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        return match after.strip_prefix(':') {
            Some(port) => Some((v6, Some(port))),
            None if after.is_empty() => Some((v6, None)),
            None => None,
        };
    }
    match text.rsplit_once(':') {
        // A bare IPv6 address has several colons and no brackets.
        Some((name, _)) if name.contains(':') => Some((text, None)),
        Some((name, port)) if !name.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            Some((name, Some(port)))
        }
        Some(_) => None,
        None if text.is_empty() => None,
        None => Some((text, None)),
    }
}

fn is_ip_literal(name: &str) -> bool {
    name.parse::<IpAddr>().is_ok()
}

/// Refuses requests with a foreign `Host`, and browser requests from a foreign `Origin`, before
/// any route runs (the admin routes included: their answers are no business of other sites).
pub(crate) async fn check_headers(
    guard: std::sync::Arc<Guard>,
    request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    // HTTP/2 names the host in the URI (`:authority`) instead of a header.
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    if let Some(host) = host
        && !guard.host_allowed(host)
    {
        return Refusal::ForeignHost.into_response();
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let allowed = origin
            .to_str()
            .is_ok_and(|origin| guard.origin_allowed(origin, host));
        if !allowed {
            return Refusal::ForeignOrigin.into_response();
        }
    }
    next.run(request).await
}

/// Returns whether a request declares a JSON body (`application/json`, any parameters).
pub(crate) fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

/// The page's policy: its script and style are its own files, it talks only to its own
/// origin (the WebSocket included), and no other site may frame it.
const PAGE_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// Headers of the web chat page and its assets.
pub(crate) fn page_headers() -> [(header::HeaderName, HeaderValue); 4] {
    [
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(PAGE_CSP),
        ),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(f: impl FnOnce(&mut GatewaySettings)) -> Guard {
        let mut settings = GatewaySettings::default();
        f(&mut settings);
        Guard::new(&settings).unwrap()
    }

    #[test]
    fn hosts_are_ip_addresses_localhost_the_listen_name_or_listed() {
        let g = guard(|s| {
            s.listen = "gw.internal:8080".into();
            s.allowed_hosts = vec!["chat.example.com".into(), "api.example.com:443".into()];
        });
        for host in [
            "127.0.0.1:8080",
            "[::1]:9",
            "10.1.2.3",
            "localhost:8081",
            "LOCALHOST",
            "gw.internal:8080",
            "chat.example.com",
            "api.example.com:443",
        ] {
            assert!(g.host_allowed(host), "{host}");
        }
        for host in ["evil.example:8080", "api.example.com:80", "", "a:b:c:"] {
            assert!(!g.host_allowed(host), "{host}");
        }
        assert!(guard(|s| s.allowed_hosts = vec!["*".into()]).host_allowed("evil.example"));
    }

    #[test]
    fn origins_are_the_gateways_own_or_listed() {
        let g = guard(|s| s.allowed_origins = vec!["https://app.example.com/".into()]);
        assert!(g.origin_allowed("http://127.0.0.1:8080", Some("127.0.0.1:8080")));
        assert!(g.origin_allowed("https://LOCALHOST:8080", Some("localhost:8080")));
        assert!(g.origin_allowed("https://app.example.com", Some("127.0.0.1:8080")));
        assert!(!g.origin_allowed("http://evil.example", Some("127.0.0.1:8080")));
        assert!(!g.origin_allowed("http://127.0.0.1:9999", Some("127.0.0.1:8080")));
        assert!(!g.origin_allowed("null", Some("127.0.0.1:8080")));
        assert!(!g.origin_allowed("http://127.0.0.1:8080", None));
    }

    #[test]
    fn forwarded_for_counts_only_from_a_trusted_proxy() {
        let g = guard(|s| s.trusted_proxies = vec!["10.0.0.0/8".into(), "::1".into()]);
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-forwarded-for",
            "127.0.0.1, 203.0.113.7, 10.0.0.2".parse().unwrap(),
        );
        let proxy: SocketAddr = "10.0.0.1:5000".parse().unwrap();
        let stranger: SocketAddr = "192.0.2.1:5000".parse().unwrap();
        assert_eq!(
            g.client_ip(proxy, &headers),
            "203.0.113.7".parse::<IpAddr>().unwrap()
        );
        assert_eq!(g.client_ip(stranger, &headers), stranger.ip());
        headers.insert("x-forwarded-for", "garbage".parse().unwrap());
        assert!(!g.client_ip(proxy, &headers).is_loopback());
        headers.remove("x-forwarded-for");
        assert!(
            g.client_ip("[::1]:1".parse().unwrap(), &headers)
                .is_unspecified()
        );
        let mapped: SocketAddr = "[::ffff:10.0.0.1]:1".parse().unwrap();
        assert!(g.trusted(canonical(mapped.ip())));
    }

    #[test]
    fn bad_proxy_entries_are_refused_at_startup() {
        let mut settings = GatewaySettings {
            trusted_proxies: vec!["10.0.0.0/33".into()],
            ..Default::default()
        };
        assert!(Guard::new(&settings).is_err());
        settings.trusted_proxies = vec!["proxy.local".into()];
        assert!(Guard::new(&settings).is_err());
    }

    #[test]
    fn only_json_bodies_are_json() {
        let mut headers = HeaderMap::new();
        assert!(!is_json(&headers));
        headers.insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
        assert!(!is_json(&headers));
        headers.insert(
            header::CONTENT_TYPE,
            "Application/JSON; charset=utf-8".parse().unwrap(),
        );
        assert!(is_json(&headers));
    }
}
