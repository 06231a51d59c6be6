//! Replies (and chat-app pieces) a replica delivered lately, so a redelivery is absorbed.

use agentloop_proto::v1::OutboundMessage;

/// How many recently delivered replies a replica remembers to absorb redeliveries.
pub(crate) const RECENT_CAPACITY: usize = 10_000;

/// The key a final reply's delivery is remembered and stored under: one per run and outcome,
/// so a redelivered reply is absorbed while an error reply after a set-aside still goes out.
/// `None` for a reply that is not a run's final one.
pub(crate) fn delivery_key(outbound: &OutboundMessage) -> Option<String> {
    (outbound.r#final && !outbound.run_id.is_empty()).then(|| {
        agentloop_proto::run_msg_id(
            &outbound.run_id,
            agentloop_proto::RunMessage::Delivered(outbound.error.is_empty()),
        )
    })
}

/// A bounded set of keys, oldest forgotten first.
#[derive(Default)]
pub(crate) struct Recent {
    keys: std::collections::HashSet<String>,
    order: std::collections::VecDeque<String>,
}

impl Recent {
    pub(crate) fn contains(&self, key: &str) -> bool {
        self.keys.contains(key)
    }

    pub(crate) fn insert(&mut self, key: String) {
        if self.keys.insert(key.clone()) {
            self.order.push_back(key);
            if self.order.len() > RECENT_CAPACITY
                && let Some(oldest) = self.order.pop_front()
            {
                self.keys.remove(&oldest);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_deliveries_forget_the_oldest_beyond_capacity() {
        let mut recent = Recent::default();
        for i in 0..=RECENT_CAPACITY {
            recent.insert(i.to_string());
        }
        assert!(!recent.contains("0"));
        assert!(recent.contains("1"));
        assert!(recent.contains(&RECENT_CAPACITY.to_string()));
    }
}
