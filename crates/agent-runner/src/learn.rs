//! Auto-learn: after a completed run its exchange is queued in memory (`learn_jobs`, durable),
//! and a worker on every runner leases jobs one at a time, asks `memory.learn_model` for durable
//! facts about the user as JSON, and stores each, updating a memory that says nearly the same
//! thing instead of adding a second. A runner that dies mid-job leaves it to the next claim once
//! its lease runs out; storing the same fact twice keeps one (memories are unique by text).

use std::sync::Arc;
use std::time::Duration;

use agentloop_model::{ChatMessage, ChatRequest};
use agentloop_proto::v1::{FinishLearnJobRequest, LearnJob, MemoryScope};

use crate::learner::Learner;
use crate::memory::MinScore;
use crate::replica::Replica;

/// Attempts before a failing job is given up.
const MAX_ATTEMPTS: u32 = 3;
/// How often an idle worker looks for jobs queued by other replicas.
const IDLE_POLL: Duration = Duration::from_secs(2);
/// A stored memory matching a new fact at least this well is that fact's older version,
/// updated rather than kept beside it.
const SAME_FACT_SCORE: MinScore = MinScore {
    text: 0.25,
    hybrid: 0.6,
};
/// Facts kept from one exchange.
const MAX_FACTS: usize = 10;
/// The longest fact stored.
const MAX_FACT_CHARS: usize = 300;

const LEARN_PROMPT: &str = "You extract durable facts about the user from a conversation: \
preferences, names, relationships, places, plans, possessions, things that will still be true \
next week. Leave out small talk, questions, and anything about the assistant. Write each fact as \
one short sentence about the user. Answer only with JSON: {\"facts\": [\"...\"]}, an empty list \
when there is nothing worth remembering.";

/// Queues a completed run's exchange, in the background (the reply does not wait for it).
pub(crate) fn queue(replica: &Arc<Replica>, job: LearnJob) {
    let Some(learner) = replica.learner.clone() else {
        return;
    };
    let memory = replica.memory.clone();
    replica.tracker.spawn(async move {
        match memory.enqueue_learn_job(job).await {
            Ok(_) => learner.queued.notify_one(),
            Err(err) => tracing::warn!(error = %err, "exchange not queued for learning"),
        }
    });
}

/// Works learn jobs until the runner stops.
pub(crate) async fn work(replica: Arc<Replica>, learner: Arc<Learner>) {
    loop {
        let claimed = tokio::select! {
            () = replica.stopping.cancelled() => return,
            claimed = replica.memory.claim_learn_job(&replica.owner_id, learner.lease_ms) => claimed,
        };
        let job = match claimed {
            Ok(Some(job)) => job,
            Ok(None) => {
                tokio::select! {
                    () = replica.stopping.cancelled() => return,
                    () = learner.queued.notified() => {}
                    () = tokio::time::sleep(IDLE_POLL) => {}
                }
                continue;
            }
            Err(err) => {
                tracing::debug!(error = %err, "learn jobs unavailable");
                tokio::select! {
                    () = replica.stopping.cancelled() => return,
                    () = tokio::time::sleep(IDLE_POLL) => {}
                }
                continue;
            }
        };
        // A job cut by shutdown is left leased: the next claim after its lease takes it.
        let outcome = tokio::select! {
            () = replica.abandon.cancelled() => return,
            outcome = learn(&replica, &learner, &job) => outcome,
        };
        let (ok, error) = match outcome {
            Ok(stored) => {
                tracing::info!(run_id = %job.run_id, facts = stored, "learned from a run");
                (true, String::new())
            }
            Err(error) => {
                tracing::warn!(run_id = %job.run_id, attempt = job.attempts, error = %error, "learning failed");
                (false, error)
            }
        };
        let finished = replica
            .memory
            .finish_learn_job(FinishLearnJobRequest {
                id: job.id.clone(),
                owner: replica.owner_id.clone(),
                ok,
                error,
                max_attempts: MAX_ATTEMPTS,
            })
            .await;
        if let Err(err) = finished {
            tracing::warn!(error = %err, "learn job not closed; it is retried after its lease");
        }
    }
}

/// Asks the learn model about one exchange and stores the facts; returns how many.
async fn learn(replica: &Replica, learner: &Learner, job: &LearnJob) -> Result<usize, String> {
    let scope = job.scope.clone().ok_or("job without scope")?;
    let request = ChatRequest {
        model: learner.model.clone(),
        system: Some(LEARN_PROMPT.to_owned()),
        messages: vec![ChatMessage::user(job.exchange.clone())],
        tools: Arc::default(),
        max_tokens: Some(512),
        thinking: None,
        credential: None,
    };
    let answer = replica
        .models
        .complete(&request)
        .await
        .map_err(|err| format!("learn model: {err}"))?;
    let facts = parse_facts(&answer.text)?;
    for fact in &facts {
        store_fact(replica, &scope, fact).await?;
    }
    Ok(facts.len())
}

/// Stores `fact`, updating the user's memory that matches it best when that one is close.
async fn store_fact(replica: &Replica, scope: &MemoryScope, fact: &str) -> Result<(), String> {
    let closest = replica
        .memory
        .search_memories(scope.clone(), fact, 1, SAME_FACT_SCORE)
        .await
        .map_err(|err| format!("memory: {err}"))?;
    let replace = closest.first().map(|m| m.id.as_str()).unwrap_or_default();
    replica
        .memory
        .store_memory(scope.clone(), fact, "learned", replace)
        .await
        .map_err(|err| format!("memory: {err}"))?;
    Ok(())
}

/// The facts in the learn model's answer: `{"facts": [...]}`, also inside a Markdown code fence.
fn parse_facts(answer: &str) -> Result<Vec<String>, String> {
    let start = answer
        .find('{')
        .ok_or("the learn model answered no JSON object")?;
    let end = answer
        .rfind('}')
        .ok_or("the learn model answered no JSON object")?;
    let value: serde_json::Value = serde_json::from_str(&answer[start..=end.max(start)])
        .map_err(|err| format!("the learn model's JSON is invalid: {err}"))?;
    let facts = value["facts"]
        .as_array()
        .ok_or("the learn model's JSON has no facts list")?;
    Ok(facts
        .iter()
        .filter_map(serde_json::Value::as_str)
        .map(|fact| fact.trim().replace('\n', " "))
        .filter(|fact| !fact.is_empty())
        .map(|fact| fact.chars().take(MAX_FACT_CHARS).collect())
        .take(MAX_FACTS)
        .collect())
}

/// The exchange a learn job carries: the user's messages, then the answer.
pub(crate) fn exchange(inputs: &[String], answer: &str) -> String {
    let mut text = String::new();
    for input in inputs {
        text.push_str("User: ");
        text.push_str(input);
        text.push('\n');
    }
    text.push_str("Assistant: ");
    text.push_str(answer);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_are_read_from_plain_or_fenced_json_and_capped() {
        let plain = parse_facts(r#"{"facts": ["Lives in Oslo", " ", 3, "Has a dog\nnamed Rex"]}"#);
        assert_eq!(plain.unwrap(), vec!["Lives in Oslo", "Has a dog named Rex"]);
        let fenced = parse_facts("```json\n{\"facts\": []}\n```").unwrap();
        assert!(fenced.is_empty());
        let many: Vec<String> = (0..20).map(|i| format!("fact {i}")).collect();
        let capped = parse_facts(&serde_json::json!({ "facts": many }).to_string()).unwrap();
        assert_eq!(capped.len(), MAX_FACTS);
        let long = parse_facts(&serde_json::json!({"facts": ["x".repeat(1000)]}).to_string());
        assert_eq!(long.unwrap()[0].len(), MAX_FACT_CHARS);
    }

    #[test]
    fn an_answer_without_the_facts_list_is_an_error() {
        assert!(parse_facts("I could not find any facts.").is_err());
        assert!(parse_facts(r#"{"fact": "x"}"#).is_err());
        assert!(parse_facts("{not json}").is_err());
    }

    #[test]
    fn the_exchange_names_who_said_what() {
        assert_eq!(
            exchange(&["hi".into(), "I moved to Oslo".into()], "Noted."),
            "User: hi\nUser: I moved to Oslo\nAssistant: Noted."
        );
    }
}
