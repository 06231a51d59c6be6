//! `sessions.usage`: token usage and cost of the caller's sessions, per session and per agent.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Value, json};

use agentloop_proto::v1::{GetUsageRequest, UsageRow};

use crate::RequestError;
use crate::config::Price;
use crate::params::{no_nul, parse};
use crate::principal::Principal;
use crate::state::AppState;

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct UsageParams {
    #[serde(default, alias = "agent_id")]
    agent_id: Option<String>,
    #[serde(default)]
    limit: Option<u32>,
}

/// Usage summed under one name (a session or an agent).
#[derive(Default)]
struct Total {
    agent_id: String,
    input: u64,
    output: u64,
    runs: u64,
    cost: f64,
    /// Runs of a model without a price: the cost leaves them out.
    unpriced_runs: u64,
}

impl Total {
    fn add(&mut self, row: &UsageRow, price: Option<&Price>) {
        self.agent_id.clone_from(&row.agent_id);
        self.input += row.input_tokens;
        self.output += row.output_tokens;
        self.runs += row.runs;
        match price {
            Some(price) => self.cost += price.cost(row.input_tokens, row.output_tokens),
            None => self.unpriced_runs += row.runs,
        }
    }

    fn json(&self, name_key: &str, name: &str) -> Value {
        json!({
            name_key: name, "agentId": self.agent_id, "inputTokens": self.input,
            "outputTokens": self.output, "runs": self.runs,
            "cost": (self.cost * 1e6).round() / 1e6, "unpricedRuns": self.unpriced_runs,
        })
    }
}

/// Sums usage rows per session and per agent, pricing each model's tokens.
fn summarize(rows: &[UsageRow], prices: &BTreeMap<String, Price>) -> Value {
    let mut sessions: BTreeMap<&str, Total> = BTreeMap::new();
    let mut agents: BTreeMap<&str, Total> = BTreeMap::new();
    for row in rows {
        let price = prices.get(&row.model);
        sessions
            .entry(&row.session_key)
            .or_default()
            .add(row, price);
        agents.entry(&row.agent_id).or_default().add(row, price);
    }
    json!({
        "sessions": sessions.iter().map(|(k, t)| t.json("key", k)).collect::<Vec<_>>(),
        "agents": agents.values().map(|t| t.json("agentId", &t.agent_id)).collect::<Vec<_>>(),
    })
}

/// `sessions.usage {agentId?, limit?}`
pub(crate) async fn sessions_usage(
    state: &AppState,
    who: &Principal,
    params: Value,
) -> Result<Value, RequestError> {
    let p: UsageParams = parse("sessions.usage", params)?;
    let agent_id = p.agent_id.unwrap_or_default();
    no_nul("agentId", &agent_id)?;
    let usage = state
        .sessions
        .clone()
        .get_usage(GetUsageRequest {
            caller: Some(who.caller()),
            agent_id,
            limit: p.limit.unwrap_or(100).clamp(1, 1000),
        })
        .await?
        .into_inner();
    Ok(summarize(&usage.rows, &state.config.models.prices))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, agent: &str, model: &str, input: u64, output: u64) -> UsageRow {
        UsageRow {
            session_key: key.into(),
            agent_id: agent.into(),
            model: model.into(),
            input_tokens: input,
            output_tokens: output,
            runs: 1,
        }
    }

    #[test]
    fn usage_is_summed_per_session_and_agent_and_priced_per_model() {
        let prices = BTreeMap::from([(
            "openai/a".to_owned(),
            Price {
                input_per_million: 2.0,
                output_per_million: 8.0,
            },
        )]);
        let rows = [
            row("s1", "main", "openai/a", 1_000_000, 500_000),
            row("s1", "main", "openai/unpriced", 10, 10),
            row("s2", "coder", "openai/a", 500_000, 0),
        ];

        let summary = summarize(&rows, &prices);

        let s1 = &summary["sessions"][0];
        assert_eq!(
            (s1["key"].as_str(), s1["inputTokens"].as_u64()),
            (Some("s1"), Some(1_000_010))
        );
        assert_eq!(s1["cost"], 6.0);
        assert_eq!(s1["unpricedRuns"], 1);
        let agents = summary["agents"].as_array().unwrap();
        assert_eq!(agents.len(), 2);
        assert_eq!(agents[0]["agentId"], "coder");
        assert_eq!(agents[0]["cost"], 1.0);
        assert_eq!(agents[1]["runs"], 2);
    }
}
