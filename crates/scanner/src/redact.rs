//! Secrets found in text the assistant handles (tool results, model output) are replaced by
//! `[REDACTED:<kind>]` before the text is stored, sent or emitted: API keys of the common
//! providers, bearer tokens, JWTs, private keys, passwords in URLs and `password=`-style
//! assignments.

use std::borrow::Cow;
use std::sync::LazyLock;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder};
use regex::Regex;

/// One kind of secret: its name in the marker and its pattern. When the pattern has a group
/// named `secret`, only that part is replaced (the key name or URL around it stays readable).
struct Kind {
    name: &'static str,
    pattern: Regex,
}

/// Words one of which occurs in any text holding a secret: a text without them is left alone
/// without running a pattern.
const HINTS: [&str; 22] = [
    "sk-",
    "sk_live_",
    "rk_live_",
    "akia",
    "asia",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "xox",
    "aiza",
    "eyj",
    "bearer",
    "private key",
    "://",
    "password",
    "passwd",
    "secret",
    "token",
    "api",
];

static PREFILTER: LazyLock<AhoCorasick> = LazyLock::new(|| {
    AhoCorasickBuilder::new()
        .ascii_case_insensitive(true)
        .build(HINTS)
        .expect("the hints are plain words")
});

static KINDS: LazyLock<Vec<Kind>> = LazyLock::new(|| {
    [
        ("private_key", r"-----BEGIN (?:[A-Z]+ )*PRIVATE KEY-----[\s\S]*?-----END (?:[A-Z]+ )*PRIVATE KEY-----"),
        ("anthropic_key", r"\bsk-ant-[A-Za-z0-9_-]{20,}"),
        ("openai_key", r"\bsk-(?:proj-|svcacct-)?[A-Za-z0-9_-]{20,}"),
        ("stripe_key", r"\b(?:sk|rk)_live_[A-Za-z0-9]{16,}"),
        ("aws_access_key", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
        ("github_token", r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})"),
        ("slack_token", r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
        ("google_api_key", r"\bAIza[0-9A-Za-z_-]{35}"),
        ("jwt", r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
        ("bearer_token", r"(?i)\bbearer\s+(?P<secret>[A-Za-z0-9._~+/-]{16,}=*)"),
        ("url_password", r"(?i)\b[a-z][a-z0-9+.-]*://[^/\s:@]+:(?P<secret>[^@\s/]+)@"),
        (
            "password",
            r#"(?i)\b(?:password|passwd|pwd|secret|api[_-]?key|access[_-]?token|auth[_-]?token|client[_-]?secret)\b["']?\s*[:=]\s*["']?(?P<secret>[^\s"',;]{6,})"#,
        ),
    ]
    .into_iter()
    .map(|(name, pattern)| Kind {
        name,
        pattern: Regex::new(pattern).expect("the built-in secret patterns compile"),
    })
    .collect()
});

/// `text` with every secret found replaced; borrowed when there is none.
pub fn redact(text: &str) -> Cow<'_, str> {
    if !PREFILTER.is_match(text) {
        return Cow::Borrowed(text);
    }
    let mut out = Cow::Borrowed(text);
    for kind in KINDS.iter() {
        if !kind.pattern.is_match(&out) {
            continue;
        }
        let marker = format!("[REDACTED:{}]", kind.name);
        let replaced = kind
            .pattern
            .replace_all(&out, |caps: &regex::Captures<'_>| {
                match caps.name("secret") {
                    Some(secret) => {
                        let whole = caps.get(0).map_or("", |m| m.as_str());
                        let start = secret.start() - caps.get(0).map_or(0, |m| m.start());
                        format!(
                            "{}{marker}{}",
                            &whole[..start],
                            &whole[start + secret.len()..]
                        )
                    }
                    None => marker.clone(),
                }
            })
            .into_owned();
        out = Cow::Owned(replaced);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_tokens_and_passwords_are_redacted_and_the_rest_kept() {
        let text = "openai sk-proj-abcdefghijklmnopqrstuvwx12 and aws AKIAIOSFODNN7EXAMPLE, \
                    gh ghp_abcdefghijklmnopqrstuvwxyz0123456789 \
                    Authorization: Bearer abcdef0123456789abcdef \
                    db postgres://app:hunter2secret@db.internal:5432/prod \
                    config password = \"correct-horse-battery\"";
        let redacted = redact(text);
        for secret in [
            "sk-proj-abcdefghijklmnopqrstuvwx12",
            "AKIAIOSFODNN7EXAMPLE",
            "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
            "abcdef0123456789abcdef",
            "hunter2secret",
            "correct-horse-battery",
        ] {
            assert!(!redacted.contains(secret), "{secret} left in {redacted}");
        }
        assert!(redacted.contains("[REDACTED:openai_key]"));
        assert!(
            redacted.contains("postgres://app:[REDACTED:url_password]@db.internal"),
            "{redacted}"
        );
        assert!(
            redacted.contains("Bearer [REDACTED:bearer_token]"),
            "{redacted}"
        );
        assert!(
            redacted.contains("password = \"[REDACTED:password]\""),
            "{redacted}"
        );
    }

    #[test]
    fn a_private_key_block_goes_whole_and_ordinary_text_is_untouched() {
        let key = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----";
        assert_eq!(
            redact(&format!("here: {key} done")),
            "here: [REDACTED:private_key] done"
        );
        let plain = "The password policy says twelve characters; see https://example.com/docs.";
        assert_eq!(redact(plain), plain);
        assert_eq!(redact("nothing secret here"), "nothing secret here");
    }
}
