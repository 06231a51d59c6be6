//! How log lines are written: `text` for a person, `json` for a collector.

use std::fmt;

/// The log line format (`[telemetry] log_format`); any other value is refused when the
/// configuration is loaded, not replaced by a default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "String")]
pub enum LogFormat {
    /// Human-readable lines on stderr, coloured at a terminal.
    #[default]
    Text,
    /// One JSON object per line, with the current span.
    Json,
}

impl LogFormat {
    /// Every format, by the name the configuration gives it.
    const NAMES: [(&'static str, Self); 2] = [("text", Self::Text), ("json", Self::Json)];
}

/// A log format that is none of the known ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid log format `{0}`: expected `text` or `json`")]
pub struct UnknownLogFormat(String);

impl std::str::FromStr for LogFormat {
    type Err = UnknownLogFormat;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::NAMES
            .iter()
            .find(|(known, _)| known.eq_ignore_ascii_case(name.trim()))
            .map(|(_, format)| *format)
            .ok_or_else(|| UnknownLogFormat(name.to_owned()))
    }
}

impl TryFrom<String> for LogFormat {
    type Error = UnknownLogFormat;

    fn try_from(name: String) -> Result<Self, Self::Error> {
        name.parse()
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = Self::NAMES
            .iter()
            .find(|(_, format)| format == self)
            .map_or("text", |(name, _)| name);
        f.write_str(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_json_are_read_in_any_case_and_anything_else_is_refused() {
        assert_eq!("text".parse(), Ok(LogFormat::Text));
        assert_eq!("JSON".parse(), Ok(LogFormat::Json));
        assert_eq!(LogFormat::default(), LogFormat::Text);
        assert_eq!(LogFormat::Json.to_string(), "json");
        let err = "jsn".parse::<LogFormat>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid log format `jsn`: expected `text` or `json`"
        );
        assert_eq!(
            "".parse::<LogFormat>(),
            Err(UnknownLogFormat(String::new()))
        );
    }
}
