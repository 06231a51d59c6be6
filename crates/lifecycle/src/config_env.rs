//! Which environment variables are configuration: `AGENTLOOP_<SECTION>__<KEY>` (each further
//! `__` one level deeper), a few conventional names of other ecosystems, and the `AGENTLOOP_*`
//! names that are not config.

/// Conventional variables of other ecosystems, mapped onto config keys. `AGENTLOOP_*__*` wins.
pub(crate) const ALIASES: &[(&str, &str, &str)] = &[
    ("NATS_URL", "bus", "url"),
    ("DATABASE_URL", "memory", "database_url"),
    ("AGENTLOOP_MODEL", "models", "default_model"),
    ("OPENAI_BASE_URL", "models", "openai_base_url"),
    ("OPENAI_API_KEY", "models", "openai_api_key"),
    ("ANTHROPIC_BASE_URL", "models", "anthropic_base_url"),
    ("ANTHROPIC_API_KEY", "models", "anthropic_api_key"),
];

/// `AGENTLOOP_*` names that are not config keys, so never refused: the config file's path and
/// the settings the binary reads itself (`crates/agentloop`), and the knobs of
/// `docker-compose.yml`, which a shell that starts compose also hands to a local binary.
const NOT_CONFIG: &[&str] = &[
    "AGENTLOOP_CONFIG",
    "AGENTLOOP_WORKER_THREADS",
    "AGENTLOOP_GATEWAY_URL",
    "AGENTLOOP_TOKEN",
    "AGENTLOOP_OPERATOR",
    "AGENTLOOP_IMAGE",
    "AGENTLOOP_NATS_PORT",
    "AGENTLOOP_GATEWAY_PORT",
    "AGENTLOOP_GATEWAY_TOKENS",
    "AGENTLOOP_GATEWAY_DEV_MODE",
];

const PREFIX: &str = "AGENTLOOP_";
const SEPARATOR: &str = "__";

/// What one environment variable is to the configuration.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Variable {
    /// `AGENTLOOP_<SECTION>__<KEY>[__<KEY>...]`: sets the key at this path, each segment
    /// lowercased (`AGENTLOOP_CHANNELS__TELEGRAM__BOT_TOKEN` is `channels.telegram.bot_token`).
    Key(Vec<String>),
    /// An `AGENTLOOP_*` name that is none of the known ones.
    Unknown,
    /// Not configuration, or read as an alias.
    Other,
}

/// Classifies the variable `name`.
pub(crate) fn classify(name: &str) -> Variable {
    let Some(rest) = name.strip_prefix(PREFIX) else {
        return Variable::Other;
    };
    if rest.contains(SEPARATOR) {
        let path: Vec<String> = rest.split(SEPARATOR).map(str::to_ascii_lowercase).collect();
        // `AGENTLOOP_RUNNER____X` or a trailing `__` names no key: a typo, not a table's key "".
        if path.iter().any(String::is_empty) {
            return Variable::Unknown;
        }
        return Variable::Key(path);
    }
    // nats-server reads each service user's password from its own variable
    // (`deploy/base/nats/agentloop-auth.conf`).
    let nats_password = rest
        .strip_prefix("NATS_")
        .is_some_and(|user| user.ends_with("_PASSWORD"));
    if nats_password || not_config().any(|known| known == name) {
        Variable::Other
    } else {
        Variable::Unknown
    }
}

/// Returns the variable that sets the key at `path` (section first).
pub(crate) fn variable_name<S: AsRef<str>>(path: &[S]) -> String {
    let segments: Vec<String> = path
        .iter()
        .map(|segment| segment.as_ref().to_ascii_uppercase())
        .collect();
    format!("{PREFIX}{}", segments.join(SEPARATOR))
}

/// Returns the `AGENTLOOP_*` names that are valid without being `<SECTION>__<KEY>`.
pub(crate) fn not_config() -> impl Iterator<Item = &'static str> {
    let aliases = ALIASES.iter().map(|(name, _, _)| *name);
    NOT_CONFIG
        .iter()
        .copied()
        .chain(aliases.filter(|name| name.starts_with(PREFIX)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn section_keys_known_names_and_the_rest_are_told_apart() {
        assert_eq!(
            classify("AGENTLOOP_RUNNER__MAX_TURNS"),
            Variable::Key(vec!["runner".to_owned(), "max_turns".to_owned()])
        );
        for other in [
            "AGENTLOOP_CONFIG",
            "AGENTLOOP_MODEL",
            "AGENTLOOP_WORKER_THREADS",
            "AGENTLOOP_NATS_ROUTER_PASSWORD",
            "NATS_URL",
            "HOME",
        ] {
            assert_eq!(classify(other), Variable::Other, "{other}");
        }
        for unknown in [
            "AGENTLOOP_CONFG",
            "AGENTLOOP_RUNNER_MAX_TURNS",
            "AGENTLOOP_NATS_",
        ] {
            assert_eq!(classify(unknown), Variable::Unknown, "{unknown}");
        }
        assert_eq!(
            variable_name(&["runner", "max_turns"]),
            "AGENTLOOP_RUNNER__MAX_TURNS"
        );
    }

    #[test]
    fn each_double_underscore_is_one_level_deeper_and_an_empty_level_is_unknown() {
        assert_eq!(
            classify("AGENTLOOP_CHANNELS__TELEGRAM__BOT_TOKEN"),
            Variable::Key(vec![
                "channels".to_owned(),
                "telegram".to_owned(),
                "bot_token".to_owned()
            ])
        );
        assert_eq!(
            classify("AGENTLOOP_AGENTS__MAIN__MODEL"),
            Variable::Key(vec![
                "agents".to_owned(),
                "main".to_owned(),
                "model".to_owned()
            ])
        );
        for unknown in [
            "AGENTLOOP_RUNNER____X",
            "AGENTLOOP_RUNNER__X__",
            "AGENTLOOP_RUNNER__",
            "AGENTLOOP___X",
        ] {
            assert_eq!(classify(unknown), Variable::Unknown, "{unknown}");
        }
        assert_eq!(
            variable_name(&["channels", "telegram", "bot_token"]),
            "AGENTLOOP_CHANNELS__TELEGRAM__BOT_TOKEN"
        );
    }
}
