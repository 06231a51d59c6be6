//! One TOML file for every service, each key overridable by `AGENTLOOP_<SECTION>__<KEY>` (each
//! further `__` one level deeper: `AGENTLOOP_CHANNELS__TELEGRAM__BOT_TOKEN`).
//!
//! Each service deserializes the whole merged document into its own config type and takes the
//! sections it needs, so one file configures a whole stack. A name that no config type of the
//! program reads is refused (`config_check`), and so is a value that does not fit, and a value
//! still holding the placeholder the shipped manifests carry.

use serde::de::DeserializeOwned;
use toml::{Table, Value};

use crate::config_check::{UnknownNames, display, unknown_names};
use crate::config_env::{ALIASES, Variable, classify};
use crate::config_schema::{Schema, Segment};

/// What `deploy/base` and the examples ship in place of secrets; a process started with it
/// would run against a database or provider with a guessable credential, or fail much later.
const PLACEHOLDER: &str = "CHANGE_ME";

/// The model a session uses when neither it, its agent nor `models.default_model` names one,
/// as `provider/model`. One literal for every service: a gateway and a router disagreeing on
/// it refuse the real default to non-admins.
pub const DEFAULT_MODEL: &str = "openai/gpt-4o-mini";

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("failed to read config file {path}")]
    Read {
        /// The path given.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The config file is not valid TOML.
    #[error("config file {path} is not valid TOML")]
    Parse {
        /// The path given.
        path: String,
        /// The parser's complaint.
        #[source]
        source: toml::de::Error,
    },
    /// The merged configuration does not fit the service's settings.
    #[error("invalid configuration (file and AGENTLOOP_* environment merged)")]
    Invalid(#[source] toml::de::Error),
    /// Keys or `AGENTLOOP_*` variables that no part of the program reads: a typo, most likely.
    #[error("{0}")]
    Unknown(UnknownNames),
    /// Values that still hold the placeholder `CHANGE_ME`.
    #[error(
        "the placeholder CHANGE_ME is still in {}: replace it with the real value",
        .keys.join(", ")
    )]
    Placeholder {
        /// Each key holding it, as a dotted path with the variable that set it, if one did;
        /// never the value, which is a secret more often than not.
        keys: Vec<String>,
    },
}

/// Splits comma-separated text into its trimmed, non-empty items.
pub fn split_commas(text: &str) -> impl Iterator<Item = &str> {
    text.split(',').map(str::trim).filter(|t| !t.is_empty())
}

/// Reads a TOML list, or a comma-separated string (environment variables are strings); for
/// `#[serde(deserialize_with = "agentloop_lifecycle::list_or_commas")]`.
///
/// # Errors
/// When the value is neither a list of strings nor a string.
pub fn list_or_commas<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum ListOrCommas {
        List(Vec<String>),
        Commas(String),
    }
    Ok(match serde::Deserialize::deserialize(d)? {
        ListOrCommas::List(list) => list,
        ListOrCommas::Commas(text) => split_commas(&text).map(str::to_owned).collect(),
    })
}

/// The part of `[memory]` that clients of the memory service read.
#[derive(Clone, serde::Deserialize)]
#[serde(default)]
pub struct MemoryEndpoint {
    /// gRPC URL of the memory service.
    pub url: String,
    /// Shared secret the memory service asks for (`memory.secret`); empty sends none.
    pub secret: String,
    /// PEM CA that memory's certificate must chain to; set, calls go over TLS and `url` must be
    /// `https://`. Empty means plaintext.
    pub tls_ca_file: String,
    /// Name memory's certificate must carry, when not the host of `url`; empty checks the host.
    pub tls_domain: String,
    /// Memories recalled into the context of a run's first model turn (`0`: none).
    pub recall_k: u32,
    /// Recalled memories score at least this (0..1, full-text rank) when search is full text.
    pub recall_min_score: f64,
    /// Recalled memories score at least this (0..1) when search is hybrid.
    pub recall_min_hybrid_score: f64,
    /// `openai/model` of an OpenAI-compatible `/v1/embeddings` (at `models.openai_base_url`);
    /// set, memories are stored with their vectors and searched by vector and text together.
    /// Empty: full-text search alone.
    pub embeddings_model: String,
    /// `provider/model` asked after each completed run for durable facts to remember; empty
    /// turns auto-learn off (only the memory tools write).
    pub learn_model: String,
    /// How long a runner holds a learn job it claimed before another runner may take it over.
    pub learn_lease_ms: u32,
}

impl Default for MemoryEndpoint {
    fn default() -> Self {
        Self {
            url: "http://127.0.0.1:50051".to_owned(),
            secret: String::new(),
            tls_ca_file: String::new(),
            tls_domain: String::new(),
            recall_k: 5,
            recall_min_score: 0.01,
            recall_min_hybrid_score: 0.3,
            embeddings_model: String::new(),
            learn_model: String::new(),
            learn_lease_ms: 60_000,
        }
    }
}

impl MemoryEndpoint {
    /// Returns the channel to the memory service these settings describe: its URL, secret and
    /// TLS, with traces propagated.
    ///
    /// # Errors
    /// [`MemoryEndpointError`] when a setting cannot be used.
    pub fn channel(&self) -> Result<agentloop_telemetry::TracedChannel, MemoryEndpointError> {
        agentloop_telemetry::traced_channel_tls(
            &self.url,
            &self.secret,
            agentloop_telemetry::ChannelTls {
                ca_file: &self.tls_ca_file,
                domain: &self.tls_domain,
            },
        )
        .map_err(|source| MemoryEndpointError {
            url: self.url.clone(),
            source,
        })
    }
}

/// `[memory] url` is not a valid URI, or its TLS settings cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("cannot reach memory at {url}")]
pub struct MemoryEndpointError {
    /// The URL configured.
    pub url: String,
    /// What is wrong with the settings.
    #[source]
    pub source: agentloop_telemetry::ChannelError,
}

impl std::fmt::Debug for MemoryEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryEndpoint")
            .field("url", &self.url)
            .field(
                "secret",
                &if self.secret.is_empty() {
                    ""
                } else {
                    "<redacted>"
                },
            )
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_domain", &self.tls_domain)
            .finish()
    }
}

/// Returns the path given by `--config PATH` (or `--config=PATH`) on the command line, if any.
pub fn config_path_from_args() -> Option<String> {
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--config" {
            return args.next();
        }
        if let Some(path) = arg.strip_prefix("--config=") {
            return Some(path.to_owned());
        }
    }
    None
}

/// Loads `T` from `--config`, else `$AGENTLOOP_CONFIG`, else defaults, then the environment.
///
/// # Errors
/// A [`ConfigError`] as [`load_config_from`] returns it.
pub fn load_config<T: DeserializeOwned>() -> Result<T, ConfigError> {
    let path = config_path_from_args().or_else(|| std::env::var("AGENTLOOP_CONFIG").ok());
    load_config_from(path.as_deref(), std::env::vars())
}

/// Loads `T` from an optional TOML file overlaid with the given environment variables.
///
/// # Errors
/// A [`ConfigError`] when the file is unreadable, names a key or variable that no config type
/// of the program reads ([`ConfigError::Unknown`]), a merged value holds the placeholder
/// `CHANGE_ME` ([`ConfigError::Placeholder`]), or the merged values don't fit `T`.
pub fn load_config_from<T: DeserializeOwned>(
    path: Option<&str>,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<T, ConfigError> {
    let mut table = match path {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_owned(),
                source,
            })?;
            text.parse::<Table>().map_err(|source| ConfigError::Parse {
                path: path.to_owned(),
                source,
            })?
        }
        None => Table::new(),
    };
    let env: Vec<(String, String)> = env.into_iter().collect();
    let schemas: Vec<Schema> = Schema::registered()
        .copied()
        .chain([Schema::of::<T>()])
        .collect();
    let unknown = unknown_names(&table, env.iter().map(|(name, _)| name.as_str()), &schemas);
    if !unknown.is_empty() {
        return Err(ConfigError::Unknown(UnknownNames(unknown)));
    }
    for (name, section, key) in ALIASES {
        if let Some((_, value)) = env.iter().find(|(k, _)| k == name) {
            set(&mut table, &[section, key], Value::String(value.clone()));
        }
    }
    for (name, value) in &env {
        if let Variable::Key(path) = classify(name) {
            set(&mut table, &path, parse_env_value(value));
        }
    }
    let mut placeholders = Vec::new();
    table_placeholders(&table, &mut Vec::new(), &mut placeholders);
    if !placeholders.is_empty() {
        let keys = placeholders
            .iter()
            .map(|path| match set_by(path, &env) {
                Some(variable) => format!("`{}` (set by {variable})", display(path)),
                None => format!("`{}`", display(path)),
            })
            .collect();
        return Err(ConfigError::Placeholder { keys });
    }
    T::deserialize(Value::Table(table)).map_err(ConfigError::Invalid)
}

/// Sets the key at `path` (never empty), creating the tables on the way; a value on the way
/// that is no table is replaced, since the variable names a key below it.
fn set<S: AsRef<str>>(table: &mut Table, path: &[S], value: Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut table = table;
    for parent in parents {
        let entry = table
            .entry(parent.as_ref().to_owned())
            .or_insert_with(|| Value::Table(Table::new()));
        if !entry.is_table() {
            *entry = Value::Table(Table::new());
        }
        let Value::Table(inner) = entry else {
            return;
        };
        table = inner;
    }
    table.insert(last.as_ref().to_owned(), value);
}

/// Collects the path of every string in `table` (at `path`) that holds [`PLACEHOLDER`], at
/// any depth and in lists too: a secret may sit in a list of tables (`[[models.profiles]]`).
fn table_placeholders(table: &Table, path: &mut Vec<Segment>, out: &mut Vec<Vec<Segment>>) {
    for (key, value) in table {
        path.push(Segment::Key(key.clone()));
        value_placeholders(value, path, out);
        path.pop();
    }
}

fn value_placeholders(value: &Value, path: &mut Vec<Segment>, out: &mut Vec<Vec<Segment>>) {
    match value {
        Value::String(text) if text.contains(PLACEHOLDER) => out.push(path.clone()),
        Value::Table(table) => table_placeholders(table, path, out),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push(Segment::Index(i));
                value_placeholders(item, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

/// Returns the variable among `env` whose value ended up at `path`: an `AGENTLOOP_*` one,
/// applied last, else an alias. None: the value is the file's.
fn set_by<'a>(path: &[Segment], env: &'a [(String, String)]) -> Option<&'a str> {
    let keys: Vec<&str> = path
        .iter()
        .map(|segment| match segment {
            Segment::Key(key) => Some(key.as_str()),
            // Variables set strings, never lists: a position comes from the file.
            Segment::Index(_) => None,
        })
        .collect::<Option<_>>()?;
    let variable = env
        .iter()
        .find(|(name, _)| matches!(classify(name), Variable::Key(p) if p == keys));
    let alias = || {
        ALIASES
            .iter()
            .filter(|(_, section, key)| keys == [*section, *key])
            .find_map(|(alias, _, _)| env.iter().find(|(name, _)| name == alias))
    };
    variable.or_else(alias).map(|(name, _)| name.as_str())
}

/// Environment values are strings; numbers and booleans are typed so numeric settings parse.
fn parse_env_value(raw: &str) -> Value {
    if let Ok(i) = raw.parse::<i64>() {
        return Value::Integer(i);
    }
    if let Ok(f) = raw.parse::<f64>()
        && raw.contains('.')
        && !raw.contains(':')
    {
        return Value::Float(f);
    }
    match raw {
        "true" => Value::Boolean(true),
        "false" => Value::Boolean(false),
        _ => Value::String(raw.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, Default)]
    #[serde(default)]
    struct Bus {
        url: String,
        prefix: String,
    }

    #[derive(Debug, serde::Deserialize, Default)]
    #[serde(default)]
    struct Runner {
        lease_ttl_ms: u64,
        hooks: Vec<Hook>,
    }

    #[derive(Debug, serde::Deserialize, Default)]
    struct Hook {
        #[allow(dead_code)]
        subject: String,
    }

    #[derive(Debug, serde::Deserialize, Default)]
    #[serde(default)]
    struct Telegram {
        bot_token: String,
        api_url: String,
    }

    #[derive(Debug, serde::Deserialize, Default)]
    #[serde(default)]
    struct Channels {
        telegram: Telegram,
    }

    #[derive(Debug, serde::Deserialize, Default)]
    #[serde(default)]
    struct Agent {
        model: String,
    }

    #[derive(Debug, serde::Deserialize, Default)]
    #[serde(default)]
    struct Cfg {
        bus: Bus,
        runner: Runner,
        channels: Channels,
        agents: std::collections::BTreeMap<String, Agent>,
    }

    fn write_file(name: &str, text: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("agentloop-cfg-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn environment_overrides_file_and_aliases() {
        let dir = std::env::temp_dir().join(format!("agentloop-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        std::fs::write(
            &path,
            "[bus]\nurl = \"nats://file:4222\"\nprefix = \"file\"\n",
        )
        .unwrap();
        let cfg: Cfg = load_config_from(
            path.to_str(),
            env(&[
                ("NATS_URL", "nats://alias:4222"),
                ("AGENTLOOP_BUS__PREFIX", "envprefix"),
                ("AGENTLOOP_RUNNER__LEASE_TTL_MS", "1500"),
            ]),
        )
        .unwrap();
        assert_eq!(cfg.bus.url, "nats://alias:4222");
        assert_eq!(cfg.bus.prefix, "envprefix");
        assert_eq!(cfg.runner.lease_ttl_ms, 1500);
        let cfg: Cfg = load_config_from(
            path.to_str(),
            env(&[
                ("AGENTLOOP_BUS__URL", "nats://explicit:1"),
                ("NATS_URL", "nats://alias:4222"),
            ]),
        )
        .unwrap();
        assert_eq!(cfg.bus.url, "nats://explicit:1");
    }

    #[test]
    fn a_wrongly_typed_value_is_a_clear_error() {
        let err = load_config_from::<Cfg>(None, env(&[("AGENTLOOP_RUNNER__LEASE_TTL_MS", "soon")]))
            .unwrap_err();
        assert!(matches!(err, ConfigError::Invalid(_)));
    }

    #[test]
    fn an_unknown_key_or_variable_is_refused_with_the_closest_valid_name() {
        let dir = std::env::temp_dir().join(format!("agentloop-cfg-typo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        std::fs::write(&path, "[runner]\nlease_ttl_m = 5\n").unwrap();
        let err = load_config_from::<Cfg>(path.to_str(), env(&[("AGENTLOOP_BUS__PREFX", "x")]))
            .unwrap_err();
        assert!(matches!(err, ConfigError::Unknown(_)), "{err:?}");
        assert_eq!(
            err.to_string(),
            "unknown key `runner.lease_ttl_m`; did you mean `runner.lease_ttl_ms`?\n\
             unknown environment variable `AGENTLOOP_BUS__PREFX`; did you mean `AGENTLOOP_BUS__PREFIX`?"
        );
        // `[telemetry]` is not `Cfg`'s, but another config type of the program reads it.
        std::fs::write(&path, "[telemetry]\nlog_level = \"debug\"\n").unwrap();
        load_config_from::<Cfg>(path.to_str(), env(&[("AGENTLOOP_CONFIG", "c.toml")])).unwrap();
    }

    #[test]
    fn each_double_underscore_of_a_variable_is_one_level_deeper() {
        let path = write_file("nested", "[channels.telegram]\napi_url = \"http://file\"\n");
        let cfg: Cfg = load_config_from(
            path.to_str(),
            env(&[
                ("AGENTLOOP_CHANNELS__TELEGRAM__BOT_TOKEN", "123:abc"),
                ("AGENTLOOP_AGENTS__MAIN__MODEL", "openai/x"),
                ("AGENTLOOP_RUNNER__LEASE_TTL_MS", "7"),
            ]),
        )
        .unwrap();
        assert_eq!(cfg.channels.telegram.bot_token, "123:abc");
        assert_eq!(cfg.channels.telegram.api_url, "http://file");
        assert_eq!(cfg.agents["main"].model, "openai/x");
        assert_eq!(cfg.runner.lease_ttl_ms, 7);
    }

    #[test]
    fn a_deeper_unknown_variable_is_refused_with_the_closest_valid_name() {
        let err = load_config_from::<Cfg>(
            None,
            env(&[
                ("AGENTLOOP_CHANNELS__TELEGRAM__BOT_TOKN", "x"),
                ("AGENTLOOP_AGENTS__MAIN__MODLE", "x"),
                ("AGENTLOOP_CHANNELS__TELEGRM__BOT_TOKEN", "x"),
                ("AGENTLOOP_RUNNER____LEASE_TTL_MS", "1"),
                ("AGENTLOOP_RUNNER__LEASE_TTL_MS__", "1"),
            ]),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown environment variable `AGENTLOOP_CHANNELS__TELEGRAM__BOT_TOKN`; did you mean `AGENTLOOP_CHANNELS__TELEGRAM__BOT_TOKEN`?\n\
             unknown environment variable `AGENTLOOP_AGENTS__MAIN__MODLE`; did you mean `AGENTLOOP_AGENTS__MAIN__MODEL`?\n\
             unknown environment variable `AGENTLOOP_CHANNELS__TELEGRM__BOT_TOKEN`; did you mean `AGENTLOOP_CHANNELS__TELEGRAM__BOT_TOKEN`?\n\
             unknown environment variable `AGENTLOOP_RUNNER____LEASE_TTL_MS`; did you mean `AGENTLOOP_RUNNER__LEASE_TTL_MS`?\n\
             unknown environment variable `AGENTLOOP_RUNNER__LEASE_TTL_MS__`; did you mean `AGENTLOOP_RUNNER__LEASE_TTL_MS`?"
        );
    }

    #[test]
    fn a_placeholder_anywhere_is_refused_by_its_key_without_its_value() {
        let path = write_file(
            "placeholder",
            "[bus]\nurl = \"nats://ok:4222\"\n[[runner.hooks]]\nsubject = \"hooks.CHANGE_ME\"\n",
        );
        let err = load_config_from::<Cfg>(
            path.to_str(),
            env(&[
                (
                    "DATABASE_URL",
                    "postgres://agentloop:CHANGE_ME@db/agentloop",
                ),
                ("AGENTLOOP_BUS__PREFIX", "CHANGE_ME"),
                ("AGENTLOOP_CHANNELS__TELEGRAM__BOT_TOKEN", "CHANGE_ME"),
            ]),
        )
        .unwrap_err();
        assert!(matches!(err, ConfigError::Placeholder { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "the placeholder CHANGE_ME is still in `bus.prefix` (set by AGENTLOOP_BUS__PREFIX), \
             `channels.telegram.bot_token` (set by AGENTLOOP_CHANNELS__TELEGRAM__BOT_TOKEN), \
             `memory.database_url` (set by DATABASE_URL), `runner.hooks[0].subject`: \
             replace it with the real value"
        );
        assert!(!format!("{err:?}").contains("postgres://"), "{err:?}");
        // A real value given by the environment replaces the file's placeholder.
        let path = write_file("placeholder-fixed", "[bus]\nprefix = \"CHANGE_ME\"\n");
        let cfg: Cfg =
            load_config_from(path.to_str(), env(&[("AGENTLOOP_BUS__PREFIX", "real")])).unwrap();
        assert_eq!(cfg.bus.prefix, "real");
    }

    #[test]
    fn a_missing_file_names_its_path() {
        let err =
            load_config_from::<Cfg>(Some("/nonexistent/agentloop.toml"), env(&[])).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/agentloop.toml"));
    }
}
