//! Main session keys: the session a client gets when it names none, and who may use one.
//! Pure rules, with no state, so the request path and the handshake share them.

/// The last part of an agent's main session key.
pub(crate) const MAIN_KEY: &str = "main";

/// The main session of `agent` for a caller acting for `principal`, the default when a client
/// names no session: OpenClaw's `agent:<agent>:main` for a caller acting for nobody, and
/// `agent:<agent>:main:<principal>` for one that does. Keys are shared by every caller, and a
/// session belongs to whoever used its key first: one main key for all would be taken by the
/// first principal, and an admin's messages would then land in that principal's session.
pub(crate) fn main_session_key(agent: &str, principal: Option<&str>) -> String {
    match principal {
        None => format!("agent:{agent}:{MAIN_KEY}"),
        Some(principal) => format!("agent:{agent}:{MAIN_KEY}:{principal}"),
    }
}

/// Whether a caller may send to `key`: a main session key ([`main_session_key`]) is only for
/// the principal it belongs to, so no principal can take another's before its first use.
/// Admins may send to every session.
pub(crate) fn may_send_to(key: &str, principal: Option<&str>, admin: bool) -> bool {
    if admin {
        return true;
    }
    let Some((_agent, rest)) = key
        .strip_prefix("agent:")
        .and_then(|rest| rest.split_once(':'))
    else {
        return true;
    };
    match rest.strip_prefix(MAIN_KEY) {
        Some("") => principal.is_none(),
        Some(tail) => match tail.strip_prefix(':') {
            Some(owner) => principal == Some(owner),
            None => true,
        },
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agents_main_session_key_is_openclaws() {
        assert_eq!(main_session_key("main", None), "agent:main:main");
        assert_eq!(main_session_key("ops", None), "agent:ops:main");
        assert_eq!(
            main_session_key("main", Some("alice")),
            "agent:main:main:alice"
        );
    }

    #[test]
    fn a_main_session_key_is_only_for_its_principal_unless_admin() {
        let alice = Some("alice");
        assert!(may_send_to("agent:main:main:alice", alice, false));
        assert!(!may_send_to("agent:main:main:bob", alice, false));
        assert!(!may_send_to("agent:ops:main", alice, false));
        assert!(may_send_to("agent:main:main", None, false));
        assert!(may_send_to("agent:main:main:bob", alice, true));
        // Other keys are anyone's to use first.
        for key in [
            "agent:main:mainly",
            "agent:main:telegram:default:dm:1",
            "cli:alice",
            "agent:main",
        ] {
            assert!(may_send_to(key, alice, false), "{key}");
        }
    }
}
