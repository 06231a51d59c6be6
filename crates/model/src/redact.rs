//! Keeping credentials out of sight: a [`Secret`] whose `Debug` prints no key, and
//! [`redact_secrets`], which masks what looks like a credential in free text (a provider's error
//! message, a URL) before it is logged.

use std::borrow::Cow;

/// What replaces a masked credential.
const MASK: &str = "***";

/// A credential (API key, password): its `Debug` never prints it, and it has no `Display`.
#[derive(Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Returns the credential itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Returns whether the credential is empty (unset in a config file).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(\"***\")")
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

/// Masks what looks like a credential in `text`: `sk-…` keys (OpenAI, Anthropic, masked or
/// not), `Bearer` tokens, `key=`/`token=`/`password=` parameters and the password of a URL's
/// user info. Borrows `text` unchanged when nothing matched.
pub fn redact_secrets(text: &str) -> Cow<'_, str> {
    let bytes = text.as_bytes();
    let mut out = String::new();
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        match secret_at(bytes, i) {
            Some(Found { kept, end }) => {
                // Every pattern starts and ends on ASCII bytes, so these are char boundaries.
                out.push_str(&text[copied..i + kept]);
                out.push_str(MASK);
                copied = end;
                i = end;
            }
            None => i += 1,
        }
    }
    if copied == 0 {
        return Cow::Borrowed(text);
    }
    out.push_str(&text[copied..]);
    Cow::Owned(out)
}

/// A credential found at some position: keep its first `kept` bytes (the `sk-` or `key=`),
/// mask up to `end`.
struct Found {
    kept: usize,
    end: usize,
}

/// Parameter names whose value is a credential, lowercase, longest first.
const SECRET_PARAMS: [&str; 8] = [
    "access_token=",
    "password=",
    "api_key=",
    "api-key=",
    "apikey=",
    "secret=",
    "token=",
    "key=",
];

/// Shortest run after `sk-` or `Bearer ` taken for a credential, so prose like "sk-learn" is
/// left alone.
const MIN_TOKEN: usize = 8;

fn secret_at(bytes: &[u8], i: usize) -> Option<Found> {
    let rest = &bytes[i..];
    let at_word_start = i == 0 || !is_word(bytes[i - 1]);
    if at_word_start && rest.starts_with(b"sk-") {
        let run = run_len(&rest[3..], is_key_char);
        return (run >= MIN_TOKEN).then_some(Found {
            kept: 3,
            end: i + 3 + run,
        });
    }
    if at_word_start && starts_with_ignore_case(rest, b"bearer ") {
        let run = run_len(&rest[7..], is_key_char);
        return (run >= MIN_TOKEN).then_some(Found {
            kept: 7,
            end: i + 7 + run,
        });
    }
    if at_word_start {
        for name in SECRET_PARAMS {
            if starts_with_ignore_case(rest, name.as_bytes()) {
                let run = run_len(&rest[name.len()..], |b| {
                    !b.is_ascii_whitespace() && !b"&\"',;)".contains(&b)
                });
                return (run > 0).then_some(Found {
                    kept: name.len(),
                    end: i + name.len() + run,
                });
            }
        }
    }
    if rest.starts_with(b"://") {
        // scheme://user:password@host: the password goes, the user stays for the reader.
        let authority = run_len(&rest[3..], |b| {
            b != b'/' && b != b'@' && !b.is_ascii_whitespace()
        });
        let after = 3 + authority;
        if rest.get(after) == Some(&b'@') {
            let colon = rest[3..after].iter().position(|&b| b == b':')?;
            let kept = 3 + colon + 1;
            return (kept < after).then_some(Found {
                kept,
                end: i + after,
            });
        }
    }
    None
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn is_key_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-_*.~+/=".contains(&b)
}

/// Length of the run of `pred` bytes at the start of `bytes`, without a trailing full stop
/// (the end of a sentence, not of the key).
fn run_len(bytes: &[u8], pred: impl Fn(u8) -> bool) -> usize {
    let run = bytes.iter().take_while(|&&b| pred(b)).count();
    run - bytes[..run]
        .iter()
        .rev()
        .take_while(|&&b| b == b'.')
        .count()
}

fn starts_with_ignore_case(bytes: &[u8], prefix: &[u8]) -> bool {
    bytes.len() >= prefix.len() && bytes[..prefix.len()].eq_ignore_ascii_case(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_keys_are_masked_whole_or_masked_already() {
        assert_eq!(
            redact_secrets("Incorrect API key provided: sk-proj-Zq81mK2vX4sLw9Tn5R. See docs."),
            "Incorrect API key provided: sk-***. See docs."
        );
        assert_eq!(
            redact_secrets("key sk-ant-api03-AbCdEfGh_123 refused"),
            "key sk-*** refused"
        );
        assert_eq!(
            redact_secrets("Incorrect API key provided: sk-proj-********************abcd"),
            "Incorrect API key provided: sk-***"
        );
    }

    #[test]
    fn bearer_tokens_and_key_parameters_are_masked() {
        assert_eq!(
            redact_secrets("authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload"),
            "authorization: Bearer ***"
        );
        assert_eq!(
            redact_secrets("GET /v1/models?key=AIzaSyA-123&alt=json"),
            "GET /v1/models?key=***&alt=json"
        );
        assert_eq!(redact_secrets("url?API_KEY=abc def"), "url?API_KEY=*** def");
    }

    #[test]
    fn url_passwords_are_masked_and_users_kept() {
        assert_eq!(
            redact_secrets("connecting to postgres://agent:hunter2@db:5432/agentloop"),
            "connecting to postgres://agent:***@db:5432/agentloop"
        );
        assert_eq!(
            redact_secrets("nats://user:pa55@127.0.0.1:4222 and http://host/path"),
            "nats://user:***@127.0.0.1:4222 and http://host/path"
        );
    }

    #[test]
    fn ordinary_text_is_borrowed_unchanged() {
        for text in [
            "the model is sk-learn based",
            "a monkey=banana? no: monkey is not key",
            "http://localhost:8080/v1",
            "naïve café — sk-",
            "",
        ] {
            assert!(
                matches!(redact_secrets(text), Cow::Borrowed(t) if t == text),
                "{text}"
            );
        }
    }

    #[test]
    fn a_secret_never_shows_in_debug() {
        let key = Secret::from("sk-proj-Zq81mK2vX4sLw9Tn5R");
        assert_eq!(format!("{key:?}"), "Secret(\"***\")");
        assert_eq!(key.expose(), "sk-proj-Zq81mK2vX4sLw9Tn5R");
    }
}
