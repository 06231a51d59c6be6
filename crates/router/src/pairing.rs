//! Who may write on a chat app's direct messages (`[channels.<name>] dm_policy`): the gate in
//! front of routing, and the pairing code an unknown sender gets instead of an answer.

use agentloop_channels::{Access, DmPolicy};
use agentloop_proto::SenderAccess;
use agentloop_proto::v1::{CheckSenderRequest, InboundMessage};

/// Letters and digits a person reads back without confusing them (no 0/O, no 1/I).
const CODE_ALPHABET: &[u8; 32] = b"ABCDEFGHJKLMNPQRSTUVWXYZ23456789";
/// Characters of a pairing code.
const CODE_LEN: usize = 8;
/// How long a pairing code lives.
pub(crate) const CODE_TTL_MS: u64 = 3_600_000;
/// Live codes per channel; past it unknown senders are ignored until one expires or is approved.
pub(crate) const MAX_PENDING: u32 = 3;

/// What to do with a message before it is routed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Route it.
    Pass,
    /// Ask memory whether the sender is paired (and issue a code when it pairs).
    Ask(CheckSenderRequest),
    /// Drop it without an answer (recorded in the audit), for this reason.
    Refuse(&'static str),
}

/// The gate for `inbound` under its channel's `access` (`None`: not a chat app). Only direct
/// messages are gated; groups are answered as before (group policies are not built yet).
pub(crate) fn gate(access: Option<Access<'_>>, inbound: &InboundMessage) -> Gate {
    let Some(access) = access else {
        return Gate::Pass;
    };
    if inbound
        .metadata
        .contains_key(agentloop_channels::meta::GROUP)
    {
        return Gate::Pass;
    }
    if access.admits(&inbound.sender_id) {
        return Gate::Pass;
    }
    match access.policy {
        DmPolicy::Open => Gate::Pass,
        DmPolicy::Disabled => Gate::Refuse("direct messages are disabled on this channel"),
        DmPolicy::Allowlist | DmPolicy::Pairing => {
            if inbound.sender_id.is_empty() {
                return Gate::Refuse("a direct message without a sender");
            }
            let pairs = access.policy == DmPolicy::Pairing;
            Gate::Ask(CheckSenderRequest {
                channel: inbound.channel.clone(),
                sender_id: inbound.sender_id.clone(),
                may_pair: pairs,
                code: if pairs { new_code() } else { String::new() },
                max_pending: MAX_PENDING,
                code_ttl_ms: CODE_TTL_MS,
            })
        }
    }
}

/// What the sender is told for memory's answer: `None` passes the message on, `Some(None)`
/// drops it silently, `Some(Some(text))` answers with `text` and nothing else.
pub(crate) fn answer(outcome: SenderAccess, code: &str) -> Option<Option<String>> {
    match outcome {
        SenderAccess::Allowed => None,
        SenderAccess::Pending => Some(Some(format!(
            "I don't know you yet, so I can't answer. Your pairing code is {code}. \
             Ask the assistant's operator to approve it (agentloop pairing approve {code}); \
             it expires in an hour."
        ))),
        SenderAccess::Full | SenderAccess::Refused => Some(None),
    }
}

/// A fresh random pairing code.
pub(crate) fn new_code() -> String {
    // 32 letters: each 5-bit slice of the random bytes picks one without bias.
    uuid::Uuid::new_v4()
        .as_bytes()
        .iter()
        .take(CODE_LEN)
        .map(|b| char::from(CODE_ALPHABET[usize::from(b & 31)]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn direct(sender: &str) -> InboundMessage {
        InboundMessage {
            channel: "telegram".into(),
            sender_id: sender.into(),
            ..Default::default()
        }
    }

    #[test]
    fn codes_are_eight_readable_characters() {
        for _ in 0..200 {
            let code = new_code();
            assert_eq!(code.len(), CODE_LEN);
            assert!(
                code.chars()
                    .all(|c| !"01OI".contains(c) && c.is_ascii_alphanumeric()),
                "{code}"
            );
        }
        assert_ne!(new_code(), new_code());
    }

    #[test]
    fn each_policy_gates_unknown_direct_senders_and_lets_groups_and_other_channels_through() {
        let allow = vec!["7".to_owned()];
        let access = |policy| {
            Some(Access {
                policy,
                allow_from: &allow,
            })
        };
        assert_eq!(gate(None, &direct("x")), Gate::Pass);
        assert_eq!(gate(access(DmPolicy::Open), &direct("x")), Gate::Pass);
        assert_eq!(gate(access(DmPolicy::Pairing), &direct("7")), Gate::Pass);
        assert!(matches!(
            gate(access(DmPolicy::Disabled), &direct("7")),
            Gate::Refuse(_)
        ));
        let Gate::Ask(ask) = gate(access(DmPolicy::Pairing), &direct("x")) else {
            panic!("pairing asks memory");
        };
        assert!(ask.may_pair && ask.code.len() == CODE_LEN);
        assert_eq!((ask.max_pending, ask.code_ttl_ms), (3, 3_600_000));
        let Gate::Ask(ask) = gate(access(DmPolicy::Allowlist), &direct("x")) else {
            panic!("an allowlist asks memory for paired senders");
        };
        assert!(!ask.may_pair && ask.code.is_empty());
        let mut group = direct("x");
        group
            .metadata
            .insert(agentloop_channels::meta::GROUP.into(), "true".into());
        assert_eq!(gate(access(DmPolicy::Disabled), &group), Gate::Pass);
    }

    #[test]
    fn only_a_pending_sender_is_answered_and_only_with_its_code() {
        assert_eq!(answer(SenderAccess::Allowed, ""), None);
        let told = answer(SenderAccess::Pending, "ABCD2345").flatten().unwrap();
        assert!(told.contains("ABCD2345") && told.contains("approve"));
        assert_eq!(answer(SenderAccess::Full, ""), Some(None));
        assert_eq!(answer(SenderAccess::Refused, ""), Some(None));
    }
}
