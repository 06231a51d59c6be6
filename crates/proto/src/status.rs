//! What a SessionService status says about calling again.

use tonic::Code;

/// Whether a call that failed with `code` may succeed if made again later: memory unreachable,
/// starting, overloaded or failing inside. A refusal of the request itself (invalid, unknown,
/// not allowed, a lost lease) will not pass by waiting.
pub fn may_pass(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Internal
            | Code::Unknown
            | Code::ResourceExhausted
            | Code::Aborted
            | Code::Cancelled
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_memory_passes_and_a_refused_request_does_not() {
        for code in [Code::Unavailable, Code::DeadlineExceeded, Code::Internal] {
            assert!(may_pass(code), "{code:?}");
        }
        for code in [
            Code::InvalidArgument,
            Code::NotFound,
            Code::FailedPrecondition,
            Code::PermissionDenied,
            Code::Unauthenticated,
            Code::OutOfRange,
        ] {
            assert!(!may_pass(code), "{code:?}");
        }
    }
}
