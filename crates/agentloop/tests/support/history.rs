//! A history checker for fault tests: what the clients saw (each accepted message, each reply
//! as stored by a capture stream) and what Postgres holds, checked against the guarantees:
//! every accepted message answered exactly once, a session's replies in its acceptance order,
//! no two runs of a session overlapping, each input once in the transcript.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

/// One reply as a capture stream stored it.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The tag of the message it answers (the fake model echoes it).
    pub tag: String,
    /// When the stream stored it.
    pub at: SystemTime,
}

/// What the clients saw: accepted messages per session in acceptance order, and the replies in
/// the order the capture stream stored them.
#[derive(Debug, Default)]
pub struct History {
    /// Session key → tags in the order the server acknowledged them.
    pub accepted: BTreeMap<String, Vec<String>>,
    /// Replies in stream order.
    pub replies: Vec<Reply>,
}

/// What a check found; empty lists mean the guarantees held.
#[derive(Debug, Default)]
pub struct Findings {
    /// Accepted messages with no reply.
    pub lost: Vec<String>,
    /// Accepted messages answered more than once, with the count.
    pub duplicated: Vec<(String, usize)>,
    /// Replies to messages nobody sent.
    pub unexpected: Vec<String>,
    /// Sessions whose replies came out of acceptance order: (session, expected, seen).
    pub out_of_order: Vec<(String, Vec<String>, Vec<String>)>,
    /// The longest time between two consecutive replies.
    pub longest_pause: Duration,
}

impl Findings {
    /// Whether every guarantee held.
    pub fn ok(&self) -> bool {
        self.lost.is_empty()
            && self.duplicated.is_empty()
            && self.unexpected.is_empty()
            && self.out_of_order.is_empty()
    }
}

impl History {
    /// Checks the replies against the accepted messages.
    pub fn check(&self) -> Findings {
        let mut findings = Findings::default();
        let mut session_of: HashMap<&str, &str> = HashMap::new();
        for (session, tags) in &self.accepted {
            for tag in tags {
                session_of.insert(tag, session);
            }
        }
        let mut counts: HashMap<&str, usize> = HashMap::new();
        let mut seen: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for reply in &self.replies {
            let Some(session) = session_of.get(reply.tag.as_str()) else {
                findings.unexpected.push(reply.tag.clone());
                continue;
            };
            let count = counts.entry(reply.tag.as_str()).or_default();
            *count += 1;
            if *count == 1 {
                seen.entry(session).or_default().push(reply.tag.clone());
            }
        }
        for (session, tags) in &self.accepted {
            for tag in tags {
                match counts.get(tag.as_str()).copied().unwrap_or(0) {
                    0 => findings.lost.push(tag.clone()),
                    1 => {}
                    n => findings.duplicated.push((tag.clone(), n)),
                }
            }
            let answered: Vec<String> = tags
                .iter()
                .filter(|t| counts.contains_key(t.as_str()))
                .cloned()
                .collect();
            let order = seen.get(session.as_str()).cloned().unwrap_or_default();
            if order != answered {
                findings
                    .out_of_order
                    .push((session.clone(), answered, order));
            }
        }
        findings.longest_pause = self
            .replies
            .windows(2)
            .filter_map(|w| w[1].at.duration_since(w[0].at).ok())
            .max()
            .unwrap_or_default();
        findings
    }
}

/// Checks Postgres: no two runs of one session overlapped in time, and every tag appears in
/// exactly one user entry of the transcript. Returns what broke, empty when nothing did.
pub async fn check_tables(db: &sqlx::PgPool, tags: &[String]) -> Vec<String> {
    let mut broken = Vec::new();
    let runs: Vec<(String, String, f64, Option<f64>)> = sqlx::query_as(
        "SELECT id::text, session_id::text, extract(epoch FROM started_at)::float8, \
                extract(epoch FROM finished_at)::float8 \
         FROM runs ORDER BY session_id, started_at",
    )
    .fetch_all(db)
    .await
    .unwrap_or_default();
    let mut last_end: HashMap<&str, f64> = HashMap::new();
    for (id, session, started, finished) in &runs {
        if let Some(previous) = last_end.get(session.as_str())
            && previous > started
        {
            broken.push(format!(
                "run {id} of session {session} overlapped the one before"
            ));
        }
        last_end.insert(session, finished.unwrap_or(f64::MAX));
    }
    let users: Vec<(String,)> =
        sqlx::query_as("SELECT content FROM transcript_entries WHERE role = 'user'")
            .fetch_all(db)
            .await
            .unwrap_or_default();
    let mut in_transcript: HashMap<&str, usize> = HashMap::new();
    for (content,) in &users {
        if let Some(tag) = content.split_whitespace().next() {
            *in_transcript.entry(tag).or_default() += 1;
        }
    }
    for tag in tags {
        let n = in_transcript.get(tag.as_str()).copied().unwrap_or(0);
        if n != 1 {
            broken.push(format!("{tag} is in the transcript {n} times"));
        }
    }
    broken
}

#[test]
fn the_checker_finds_lost_duplicated_and_reordered_replies() {
    let at = SystemTime::UNIX_EPOCH;
    let reply = |tag: &str| Reply {
        tag: tag.to_owned(),
        at,
    };
    let history = History {
        accepted: BTreeMap::from([
            ("a".to_owned(), vec!["a1".to_owned(), "a2".to_owned()]),
            ("b".to_owned(), vec!["b1".to_owned(), "b2".to_owned()]),
        ]),
        replies: vec![
            reply("a2"),
            reply("a1"),
            reply("b1"),
            reply("b1"),
            reply("x"),
        ],
    };
    let findings = history.check();
    assert_eq!(findings.lost, ["b2"]);
    assert_eq!(findings.duplicated, [("b1".to_owned(), 2)]);
    assert_eq!(findings.unexpected, ["x"]);
    assert_eq!(findings.out_of_order.len(), 1, "{findings:?}");
    assert!(!findings.ok());
}
