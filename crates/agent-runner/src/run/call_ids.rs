//! Tool call ids the run can key on.

use std::collections::HashSet;

use agentloop_model::ToolCall;

/// Gives each call of turn `turn` an id no earlier call of the run had. Providers may send
/// none, or repeat one (some servers number the calls of every answer from 0), while the id
/// keys the call's result in the transcript and the messages it sends: a repeat would make the
/// second a duplicate that is dropped, and its call would go without a result.
pub(super) fn make_unique(turn: u32, calls: &mut [ToolCall], used: &mut HashSet<String>) {
    for (i, call) in calls.iter_mut().enumerate() {
        if call.id.is_empty() || used.contains(&call.id) {
            let mut id = format!("call_{turn}_{i}");
            // The provider may have used this very spelling too.
            while used.contains(&id) {
                id.push('_');
            }
            call.id = id;
        }
        used.insert(call.id.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.to_owned(),
            name: "send_message".to_owned(),
            arguments: serde_json::json!({}),
        }
    }

    #[test]
    fn empty_and_repeated_ids_are_replaced_and_the_rest_kept() {
        let mut used = HashSet::new();
        let mut first = vec![call("call_0"), call(""), call("call_0"), call("a")];
        make_unique(1, &mut first, &mut used);
        let ids: Vec<_> = first.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["call_0", "call_1_1", "call_1_2", "a"]);
        // The next answer numbers its calls from 0 again.
        let mut second = vec![call("call_0"), call("call_1_1")];
        make_unique(2, &mut second, &mut used);
        let ids: Vec<_> = second.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["call_2_0", "call_2_1"]);
        assert_eq!(used.len(), 6, "every id of the run is its own");
    }
}
