//! Gateway settings: `[bus]`, `[memory]` (url), `[models]` (allowlist), `[gateway]` and
//! `[channels]` (webhooks).

use agentloop_bus::BusConfig;
use serde::Deserialize as _;
use serde::de::{self, Visitor};

use crate::principal::TokenGrant;

/// Everything the gateway reads from the merged configuration.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default)]
pub struct GatewayConfig {
    /// NATS connection and stream layout.
    pub bus: BusConfig,
    /// Where the memory service is.
    pub memory: agentloop_lifecycle::MemoryEndpoint,
    /// The models sessions may be switched to.
    pub models: ModelPolicy,
    /// Gateway-only settings.
    pub gateway: GatewaySettings,
    /// Chat apps whose webhooks the gateway takes in (`[channels.<name>]`).
    pub channels: agentloop_channels::ChannelsConfig,
}

agentloop_lifecycle::config_schema!(GatewayConfig);

/// The part of `[models]` the gateway checks `sessions.patch` against.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default)]
pub struct ModelPolicy {
    /// The global default `provider/model`, always allowed.
    pub default_model: String,
    /// When not empty, the only models a session may use. Empty: admins may use any model,
    /// other principals only the default one.
    #[serde(deserialize_with = "agentloop_lifecycle::list_or_commas")]
    pub allowlist: Vec<String>,
    /// Prices per million tokens by `provider/model`, for the cost `sessions.usage` reports.
    pub prices: std::collections::BTreeMap<String, Price>,
}

impl Default for ModelPolicy {
    fn default() -> Self {
        Self {
            // The router resolves a session without a model to this one, so a non-admin
            // choosing it must be allowed here too.
            default_model: agentloop_lifecycle::DEFAULT_MODEL.to_owned(),
            allowlist: Vec::new(),
            prices: std::collections::BTreeMap::new(),
        }
    }
}

/// What a model costs (`[models.prices."provider/model"]`), in any one currency.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Deserialize)]
#[serde(default)]
pub struct Price {
    /// Per million input tokens.
    pub input_per_million: f64,
    /// Per million output tokens.
    pub output_per_million: f64,
}

impl Price {
    /// The cost of `input` and `output` tokens.
    pub fn cost(self, input: u64, output: u64) -> f64 {
        // Token counts stay far below 2^52, where f64 is exact.
        #[allow(clippy::cast_precision_loss)]
        let (input, output) = (input as f64, output as f64);
        (input * self.input_per_million + output * self.output_per_million) / 1_000_000.0
    }
}

impl ModelPolicy {
    /// Returns whether an admin may switch a session to `model`.
    pub fn allows(&self, model: &str) -> bool {
        self.allowlist.is_empty() || self.listed(model)
    }

    /// Returns whether a principal without admin scope may switch a session to `model`: only
    /// the default model and the listed ones, since every other model is the operator's
    /// decision (and bill).
    pub fn listed(&self, model: &str) -> bool {
        model == self.default_model || self.allowlist.iter().any(|m| m == model)
    }
}

/// `[gateway]`
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default)]
pub struct GatewaySettings {
    /// HTTP address for clients and `/healthz`, `/readyz`, `/metrics`.
    pub listen: String,
    /// How long an `agentloop.ask` caller waits for the final reply.
    pub ask_timeout_ms: u64,
    /// Queue group shared by gateway replicas answering `agentloop.ask`.
    pub ask_queue_group: String,
    /// Tokens accepted by `/ws` `connect` and `Authorization: Bearer`, each standing for a
    /// principal with scopes (`[[gateway.tokens]] token, principal, scopes`); a plain string
    /// (`tokens = ["a"]`, or comma-separated `AGENTLOOP_GATEWAY__TOKENS=a,b`) is an admin.
    /// Empty means only loopback clients are served, as admins.
    #[serde(deserialize_with = "grants")]
    pub tokens: Vec<TokenGrant>,
    /// How long a client waits for a run's end when it names no timeout.
    pub run_timeout_ms: u64,
    /// How long a repeated idempotency key returns the first answer.
    pub dispatch_ttl_ms: u64,
    /// Largest WebSocket frame (and HTTP body) accepted, in bytes.
    pub max_frame_bytes: usize,
    /// Requests per second one WebSocket connection may make, on average.
    pub rate_limit_per_sec: u32,
    /// Requests one WebSocket connection may make in a burst.
    pub rate_limit_burst: u32,
    /// Agents listed by `GET /v1/models` (`main` is `agentloop`, others `agentloop/<id>`).
    #[serde(deserialize_with = "agentloop_lifecycle::list_or_commas")]
    pub agents: Vec<String>,
    /// Origins (`https://chat.example.com`) whose pages may use the gateway besides its own
    /// (an `Origin` equal to `http(s)://<Host>`); `*` allows any. A request without `Origin`
    /// (not a browser) is not checked.
    #[serde(deserialize_with = "agentloop_lifecycle::list_or_commas")]
    pub allowed_origins: Vec<String>,
    /// Host names (`chat.example.com`, or `name:port` for one port) the gateway answers to,
    /// besides `localhost`, IP addresses and the host of `listen`; `*` allows any. A foreign
    /// `Host` is how DNS rebinding reaches a loopback gateway, so it gets 403.
    #[serde(deserialize_with = "agentloop_lifecycle::list_or_commas")]
    pub allowed_hosts: Vec<String>,
    /// Addresses or CIDR blocks of reverse proxies whose `X-Forwarded-For` names the client;
    /// from any other peer that header is ignored.
    #[serde(deserialize_with = "agentloop_lifecycle::list_or_commas")]
    pub trusted_proxies: Vec<String>,
    /// How long a WebSocket may stay open without completing `connect`.
    pub connect_timeout_ms: u64,
    /// WebSockets open at once that have not completed `connect`, over all clients.
    pub max_unauthenticated: usize,
    /// WebSockets open at once from one client address.
    pub max_connections_per_client: usize,
    /// Requests one WebSocket may have open at once; a subscription (`sessions.subscribe`,
    /// `inbox.subscribe`, `approvals.subscribe`) counts until the socket closes. One more is
    /// answered `RATE_LIMITED`.
    pub max_requests_in_flight: usize,
    /// `/v1/chat/completions` requests one client address may have open at once (a stream
    /// counts until its last event); one more is answered 429.
    pub max_http_in_flight_per_client: usize,
    /// Failed authentications one client address may make before it is throttled (each
    /// further failure doubles its wait, up to five minutes).
    pub auth_failures_allowed: u32,
    /// The longest run timeout (`timeout`, `timeoutMs`) or `agent.wait` a client may ask for;
    /// longer ones are cut to it.
    pub max_timeout_ms: u64,
    /// How often a connected WebSocket gets a `tick` event (announced in hello-ok as
    /// `policy.tickIntervalMs`): OpenClaw clients close a connection that stays silent for two
    /// intervals, and proxies drop idle ones.
    pub tick_interval_ms: u64,
    /// Allows the development token `agentloop-dev-token`, which is refused at startup
    /// otherwise. (`CHANGE_ME` is refused always, as any value holding it, by the loader.)
    pub dev_mode: bool,
}

impl Default for GatewaySettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".to_owned(),
            ask_timeout_ms: 120_000,
            ask_queue_group: "agentloop-gateway".to_owned(),
            tokens: Vec::new(),
            run_timeout_ms: 600_000,
            dispatch_ttl_ms: 24 * 3600 * 1000,
            max_frame_bytes: 512 * 1024,
            rate_limit_per_sec: 20,
            rate_limit_burst: 40,
            agents: vec!["main".to_owned()],
            tick_interval_ms: 30_000,
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            trusted_proxies: Vec::new(),
            connect_timeout_ms: 10_000,
            max_unauthenticated: 256,
            max_connections_per_client: 100,
            max_requests_in_flight: 64,
            max_http_in_flight_per_client: 256,
            auth_failures_allowed: 5,
            max_timeout_ms: 3_600_000,
            dev_mode: false,
        }
    }
}

/// Tokens that ship in the development setup; a gateway guarded by one of them is open to
/// anyone who read the README, so it refuses to start unless `dev_mode` is on. The manifests'
/// placeholder `CHANGE_ME` is not among them: the config loader refuses it in any key,
/// `gateway.tokens` included (`agentloop_lifecycle::ConfigError::Placeholder`).
pub const PLACEHOLDER_TOKENS: [&str; 1] = ["agentloop-dev-token"];

impl GatewaySettings {
    /// Returns a configured placeholder token, unless `dev_mode` allows them.
    pub fn placeholder_token(&self) -> Option<&str> {
        if self.dev_mode {
            return None;
        }
        self.tokens
            .iter()
            .map(|t| t.token.expose())
            .find(|t| PLACEHOLDER_TOKENS.contains(t))
    }

    /// Returns a token grant that cannot be served (and why): one without principal or
    /// scopes, or a secret given twice.
    pub(crate) fn token_problem(&self) -> Option<(String, &'static str)> {
        for (i, grant) in self.tokens.iter().enumerate() {
            let name = || grant.principal.clone().unwrap_or_else(|| format!("#{i}"));
            if let Some(problem) = grant.problem() {
                return Some((name(), problem));
            }
            if self.tokens[..i].iter().any(|g| g.token == grant.token) {
                return Some((name(), "the same token is configured twice"));
            }
        }
        None
    }
}

/// Reads `tokens`: a list of strings and/or tables, or comma-separated text (environment
/// variables are strings); a string is an admin token. Written as visitors rather than untagged
/// enums, so that a table with a misspelt field is refused with serde's own message naming it.
fn grants<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<TokenGrant>, D::Error> {
    d.deserialize_any(GrantsVisitor)
}

struct GrantsVisitor;

impl<'de> Visitor<'de> for GrantsVisitor {
    type Value = Vec<TokenGrant>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a list of tokens, or comma-separated tokens")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
        Ok(agentloop_lifecycle::split_commas(text)
            .map(TokenGrant::admin)
            .collect())
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut items: A) -> Result<Self::Value, A::Error> {
        let mut grants = Vec::new();
        while let Some(Grant(grant)) = items.next_element()? {
            grants.push(grant);
        }
        Ok(grants)
    }
}

/// One entry of `tokens`: a plain string (an admin) or a table.
struct Grant(TokenGrant);

impl<'de> serde::Deserialize<'de> for Grant {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(GrantVisitor).map(Grant)
    }
}

struct GrantVisitor;

impl<'de> Visitor<'de> for GrantVisitor {
    type Value = TokenGrant;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a token, or a table of token, principal and scopes")
    }

    fn visit_str<E: de::Error>(self, token: &str) -> Result<Self::Value, E> {
        Ok(TokenGrant::admin(token))
    }

    fn visit_map<A: de::MapAccess<'de>>(self, table: A) -> Result<Self::Value, A::Error> {
        TokenGrant::deserialize(de::value::MapAccessDeserializer::new(table))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::principal::Scope;

    #[test]
    fn tokens_come_as_a_list_or_as_comma_separated_text_and_mean_admin() {
        let admins = [TokenGrant::admin("a"), TokenGrant::admin("b")];
        let listed: GatewaySettings = toml::from_str(r#"tokens = ["a", "b"]"#).unwrap();
        assert_eq!(listed.tokens, admins);
        let commas: GatewaySettings = toml::from_str(r#"tokens = "a, b,""#).unwrap();
        assert_eq!(commas.tokens, admins);
        assert_eq!(commas.agents, ["main"]);
    }

    #[test]
    fn token_tables_name_a_principal_and_its_scopes() {
        let settings: GatewaySettings = toml::from_str(
            r#"
            [[tokens]]
            token = "s1"
            principal = "alice"
            scopes = ["read", "write"]
            [[tokens]]
            token = "s2"
            principal = "ops"
            scopes = ["admin"]
            "#,
        )
        .unwrap();
        assert_eq!(settings.tokens[0].principal.as_deref(), Some("alice"));
        assert_eq!(settings.tokens[0].scopes, [Scope::Read, Scope::Write]);
        assert_eq!(settings.tokens[1].scopes, [Scope::Admin]);
        assert_eq!(settings.token_problem(), None);
        let unknown = toml::from_str::<GatewaySettings>(
            r#"tokens = [{token = "s", principal = "a", scopes = ["root"]}]"#,
        );
        assert!(unknown.is_err());
        let misspelt = toml::from_str::<GatewaySettings>(
            r#"tokens = [{token = "s", principl = "a", scopes = ["read"]}]"#,
        )
        .unwrap_err();
        assert!(
            misspelt.to_string().contains("unknown field `principl`"),
            "{misspelt}"
        );
        let twice: GatewaySettings =
            toml::from_str(r#"tokens = ["s", {token = "s", principal = "a", scopes = ["read"]}]"#)
                .unwrap();
        assert!(twice.token_problem().is_some());
    }

    fn load(env: &[(&str, &str)]) -> Result<GatewayConfig, agentloop_lifecycle::ConfigError> {
        let env = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
        agentloop_lifecycle::load_config_from(None, env)
    }

    #[test]
    fn placeholder_tokens_are_found_unless_dev_mode_is_on() {
        let mut settings: GatewaySettings =
            toml::from_str(r#"tokens = "real, agentloop-dev-token""#).unwrap();
        assert_eq!(settings.placeholder_token(), Some("agentloop-dev-token"));
        settings.dev_mode = true;
        assert_eq!(settings.placeholder_token(), None);
        settings = GatewaySettings::default();
        assert_eq!(settings.placeholder_token(), None);
    }

    #[test]
    fn the_token_change_me_is_refused_by_the_loader_even_in_dev_mode() {
        for dev_mode in ["false", "true"] {
            let err = load(&[
                ("AGENTLOOP_GATEWAY__TOKENS", "s3cret, CHANGE_ME"),
                ("AGENTLOOP_GATEWAY__DEV_MODE", dev_mode),
            ])
            .unwrap_err();
            assert!(
                matches!(err, agentloop_lifecycle::ConfigError::Placeholder { .. }),
                "{err:?}"
            );
            let message = err.to_string();
            assert!(message.contains("`gateway.tokens`"), "{message}");
            assert!(!message.contains("s3cret"), "{message}");
        }
    }

    #[test]
    fn list_settings_come_as_comma_separated_text_from_the_environment() {
        let config = load(&[
            ("AGENTLOOP_MODELS__ALLOWLIST", "openai/a, openai/b"),
            ("AGENTLOOP_GATEWAY__ALLOWED_ORIGINS", "https://a, https://b"),
        ])
        .unwrap();
        assert_eq!(config.models.allowlist, ["openai/a", "openai/b"]);
        assert_eq!(config.gateway.allowed_origins, ["https://a", "https://b"]);
    }

    #[test]
    fn a_non_admin_may_pick_the_default_model_when_none_is_configured() {
        let config = load(&[]).unwrap();
        assert_eq!(
            config.models.default_model,
            agentloop_lifecycle::DEFAULT_MODEL
        );
        assert!(config.models.listed(agentloop_lifecycle::DEFAULT_MODEL));
    }

    #[test]
    fn an_empty_allowlist_allows_admins_any_model_and_others_only_the_default() {
        let mut policy = ModelPolicy {
            default_model: "openai/a".into(),
            ..Default::default()
        };
        assert!(policy.allows("anthropic/b"));
        assert!(!policy.listed("anthropic/b"));
        assert!(policy.listed("openai/a"));
        policy.allowlist = vec!["openai/c".into()];
        assert!(policy.allows("openai/a"));
        assert!(policy.allows("openai/c"));
        assert!(!policy.allows("anthropic/b"));
        assert!(policy.listed("openai/c"));
    }
}
