//! The memory port's shared secret: when `memory.secret` is set, every call must carry
//! `authorization: Bearer <secret>`, so reaching the port is not enough to read transcripts.

use std::sync::Arc;

/// Refuses calls without the shared secret; lets every call through when none is configured.
#[derive(Clone)]
pub(crate) struct RequireSecret {
    expected: Option<Arc<[u8]>>,
}

impl RequireSecret {
    pub(crate) fn new(secret: &str) -> Self {
        Self {
            expected: (!secret.is_empty())
                .then(|| Arc::from(format!("Bearer {secret}").into_bytes())),
        }
    }
}

impl tonic::service::Interceptor for RequireSecret {
    fn call(&mut self, request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let Some(expected) = &self.expected else {
            return Ok(request);
        };
        let given = request
            .metadata()
            .get("authorization")
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        if same(given, expected) {
            Ok(request)
        } else {
            Err(tonic::Status::unauthenticated(
                "memory asks for its shared secret (memory.secret)",
            ))
        }
    }
}

/// Compares in time that depends on the length only, so the secret cannot be guessed byte by
/// byte from how fast a refusal comes.
fn same(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0_u8, |diff, (a, b)| diff | (a ^ b))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor as _;

    fn call_with(check: &mut RequireSecret, header: Option<&str>) -> bool {
        let mut request = tonic::Request::new(());
        if let Some(value) = header {
            request
                .metadata_mut()
                .insert("authorization", value.parse().expect("ascii"));
        }
        check.call(request).is_ok()
    }

    #[test]
    fn only_the_configured_secret_passes() {
        let mut check = RequireSecret::new("s3cret");
        assert!(call_with(&mut check, Some("Bearer s3cret")));
        assert!(!call_with(&mut check, Some("Bearer s3cres")));
        assert!(!call_with(&mut check, Some("Bearer s3cret2")));
        assert!(!call_with(&mut check, None));
    }

    #[test]
    fn without_a_secret_every_call_passes() {
        let mut check = RequireSecret::new("");
        assert!(call_with(&mut check, None));
    }
}
