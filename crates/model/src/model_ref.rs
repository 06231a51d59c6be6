//! `provider/model` references.

use std::fmt;
use std::str::FromStr;

use crate::ModelError;

/// A model provider wire protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    /// Any OpenAI-compatible Chat Completions server (OpenAI, vLLM, llama.cpp, Ollama).
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
}

impl Provider {
    /// Returns the provider's name as written in a model reference.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A model reference, `provider/model`; the model keeps any further slashes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ModelRef {
    /// Which protocol and endpoint to use.
    pub provider: Provider,
    /// The model name sent to the provider, e.g. `gpt-4o-mini` or `meta/llama-3`.
    pub model: String,
}

impl ModelRef {
    /// Parses `provider/model`.
    ///
    /// # Errors
    /// `ModelError::InvalidModelRef` without a provider, with an unknown one or an empty model.
    pub fn parse(input: &str) -> Result<Self, ModelError> {
        let invalid = |reason: String| ModelError::InvalidModelRef {
            input: input.to_owned(),
            reason,
        };
        let (provider, model) = input.trim().split_once('/').ok_or_else(|| {
            invalid("expected provider/model, e.g. openai/gpt-4o-mini".to_owned())
        })?;
        let provider = match provider {
            "openai" => Provider::OpenAi,
            "anthropic" => Provider::Anthropic,
            other => {
                return Err(invalid(format!(
                    "unknown provider {other:?}, expected openai or anthropic"
                )));
            }
        };
        if model.is_empty() {
            return Err(invalid("empty model name".to_owned()));
        }
        Ok(Self {
            provider,
            model: model.to_owned(),
        })
    }
}

impl FromStr for ModelRef {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for ModelRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.provider, self.model)
    }
}

impl serde::Serialize for ModelRef {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for ModelRef {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_refs_keep_slashes_after_the_provider() {
        let r = ModelRef::parse("openai/meta/llama-3").unwrap();
        assert_eq!(r.provider, Provider::OpenAi);
        assert_eq!(r.model, "meta/llama-3");
        assert_eq!(r.to_string(), "openai/meta/llama-3");
        assert_eq!(
            ModelRef::parse("anthropic/claude-sonnet-4-5")
                .unwrap()
                .provider,
            Provider::Anthropic
        );
    }

    #[test]
    fn bad_model_refs_are_rejected_with_a_reason() {
        let no_provider = ModelRef::parse("gpt-4o").unwrap_err().to_string();
        assert!(
            no_provider.contains("expected provider/model"),
            "{no_provider}"
        );
        let unknown = ModelRef::parse("mistral/large").unwrap_err().to_string();
        assert!(
            unknown.contains("unknown provider \"mistral\""),
            "{unknown}"
        );
        assert!(ModelRef::parse("openai/").is_err());
    }
}
