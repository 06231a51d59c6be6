//! What the router does with the scanner's findings that is not I/O: the metadata that tells
//! the runner to wrap a flagged message, and the `security` event that reports a decision.

use std::collections::HashMap;

use agentloop_proto::AuditSource;
use agentloop_proto::EventStream;
use agentloop_proto::{
    EventPhase,
    v1::{AuditRecord, SystemEvent},
};
use agentloop_scanner::Scan;

/// Records in a run command's metadata what the scanner found, for the runner to wrap the
/// message as untrusted.
pub(crate) fn mark(metadata: &mut HashMap<String, String>, scan: &Scan) {
    metadata.insert(
        agentloop_proto::META_SECURITY_LEVEL.to_owned(),
        scan.level.as_str().to_owned(),
    );
    if let Some(top) = scan.top() {
        metadata.insert(
            agentloop_proto::META_SECURITY_FAMILY.to_owned(),
            top.family.as_str().to_owned(),
        );
        metadata.insert(
            agentloop_proto::META_SECURITY_RULE.to_owned(),
            top.rule.clone(),
        );
    }
}

/// The audit record of the scanner's decision on an inbound message (one per run id).
pub(crate) fn scan_record(
    scan: &Scan,
    decision: &str,
    session_id: &str,
    run_id: &str,
) -> AuditRecord {
    let top = scan.top();
    AuditRecord {
        source: AuditSource::Scanner.as_str().to_owned(),
        decision: decision.to_owned(),
        level: scan.level.as_str().to_owned(),
        subject: "inbound message".to_owned(),
        session_id: session_id.to_owned(),
        run_id: run_id.to_owned(),
        actor: top.map_or(String::new(), |h| h.rule.clone()),
        reason: top.map_or(String::new(), |h| h.family.as_str().to_owned()),
        dedupe_key: format!("scanner:{run_id}"),
        ..Default::default()
    }
}

/// The `security` event of a scanned inbound message, on its run's subject.
pub(crate) fn security_event(
    session_id: &str,
    session_key: &str,
    run_id: &str,
    phase: EventPhase,
    scan: &Scan,
) -> SystemEvent {
    SystemEvent {
        run_id: run_id.to_owned(),
        session_id: session_id.to_owned(),
        session_key: session_key.to_owned(),
        // Before the run's own events (numbered from 1 by the runner).
        seq: 0,
        stream: EventStream::Security.as_str().to_owned(),
        phase: phase.as_str().to_owned(),
        data: scan.event_data("inbound"),
        ts: Some(agentloop_proto::now()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_names_the_level_family_and_rule_and_its_event_comes_before_the_run() {
        let scan = Scan {
            level: agentloop_scanner::ThreatLevel::Medium,
            hits: vec![agentloop_scanner::Hit {
                rule: "persona.amoral.en".into(),
                family: agentloop_scanner::Family::PersonaHijack,
                level: agentloop_scanner::ThreatLevel::Medium,
            }],
        };
        let mut metadata = HashMap::new();
        mark(&mut metadata, &scan);
        assert_eq!(metadata[agentloop_proto::META_SECURITY_LEVEL], "medium");
        assert_eq!(
            metadata[agentloop_proto::META_SECURITY_FAMILY],
            "persona_hijack"
        );
        assert_eq!(
            metadata[agentloop_proto::META_SECURITY_RULE],
            "persona.amoral.en"
        );
        let event = security_event("s", "k", "r", EventPhase::Flagged, &scan);
        assert_eq!(
            (event.stream.as_str(), event.phase.as_str(), event.seq),
            ("security", "flagged", 0)
        );
        assert!(!event.ends_run());
    }
}
