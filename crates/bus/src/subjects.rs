//! Subject and stream names, all under one prefix.

/// The streams agentloop uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    /// Inbound messages from channels.
    Inbound,
    /// Run commands for session owners.
    Runs,
    /// Replies for delivery.
    Outbound,
    /// Run events, kept a while for replay.
    Events,
    /// Dead letters.
    Dlq,
}

impl StreamKind {
    /// Every stream, in setup order.
    pub const ALL: [StreamKind; 5] = [
        StreamKind::Inbound,
        StreamKind::Runs,
        StreamKind::Outbound,
        StreamKind::Events,
        StreamKind::Dlq,
    ];

    fn suffix(self) -> &'static str {
        match self {
            StreamKind::Inbound => "INBOUND",
            StreamKind::Runs => "RUNS",
            StreamKind::Outbound => "OUTBOUND",
            StreamKind::Events => "EVENTS",
            StreamKind::Dlq => "DLQ",
        }
    }
}

/// Returns the stream name for a prefix: `AGENTLOOP_INBOUND` for `agentloop`.
pub fn stream_name(prefix: &str, kind: StreamKind) -> String {
    let mut name: String = prefix
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    name.push('_');
    name.push_str(kind.suffix());
    name
}

/// Subject names of one stack.
#[derive(Debug, Clone)]
pub struct Subjects {
    prefix: String,
}

impl Subjects {
    /// Returns the subjects under `prefix`.
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.trim_end_matches('.').to_owned(),
        }
    }

    /// Returns the prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `<prefix>.inbound.<channel>`
    pub fn inbound(&self, channel: &str) -> String {
        format!("{}.inbound.{}", self.prefix, token(channel))
    }

    /// `<prefix>.run.<session_id>`
    pub fn run(&self, session_id: &str) -> String {
        format!("{}.run.{}", self.prefix, session_id)
    }

    /// `<prefix>.outbound.<channel>`
    pub fn outbound(&self, channel: &str) -> String {
        format!("{}.outbound.{}", self.prefix, token(channel))
    }

    /// `<prefix>.events.<session_id>.<run_id>`
    pub fn events(&self, session_id: &str, run_id: &str) -> String {
        format!("{}.events.{}.{}", self.prefix, session_id, run_id)
    }

    /// `<prefix>.events.<session_id>.*`: every run of a session.
    pub fn session_events(&self, session_id: &str) -> String {
        format!("{}.events.{}.*", self.prefix, session_id)
    }

    /// `<prefix>.events.>`: every run of every session.
    pub fn all_events(&self) -> String {
        format!("{}.events.>", self.prefix)
    }

    /// `<prefix>.events._approvals`: every approval request and answer of every run, for
    /// operators (`approvals.subscribe`); inside the EVENTS stream, outside any session's.
    pub fn approvals(&self) -> String {
        format!("{}.events._approvals", self.prefix)
    }

    /// `<prefix>.control.<session_id>`
    pub fn control(&self, session_id: &str) -> String {
        format!("{}.control.{}", self.prefix, session_id)
    }

    /// `<prefix>.ask`
    pub fn ask(&self) -> String {
        format!("{}.ask", self.prefix)
    }

    /// `<prefix>.deliver.<channel>.<session_id>`: where the `cli`/`nats` channels put replies.
    pub fn deliver(&self, channel: &str, session_id: &str) -> String {
        format!("{}.deliver.{}.{}", self.prefix, token(channel), session_id)
    }

    /// `<prefix>.inbox.<channel>`: every message in and out of the channel, for inbox views.
    pub fn inbox(&self, channel: &str) -> String {
        format!("{}.inbox.{}", self.prefix, token(channel))
    }

    /// `<prefix>.inbox.>`: the inbox of every channel.
    pub fn inbox_all(&self) -> String {
        format!("{}.inbox.>", self.prefix)
    }

    /// `<prefix>.tool.<name>`: calls of a remote tool (request/reply, queue group per tool).
    pub fn tool(&self, name: &str) -> String {
        format!("{}.tool.{}", self.prefix, name)
    }

    /// `<prefix>.tool._discover`: runners ask every tool server to announce its tools.
    pub fn tool_discover(&self) -> String {
        format!("{}.tool._discover", self.prefix)
    }

    /// `<prefix>.tool._announce`: tool servers announce their tools here.
    pub fn tool_announce(&self) -> String {
        format!("{}.tool._announce", self.prefix)
    }

    /// `<prefix>.reply.<id>`: a private subject for one request/reply caller.
    pub fn reply(&self, id: &str) -> String {
        format!("{}.reply.{}", self.prefix, id)
    }

    /// `<prefix>.dlq.<original subject>`
    pub fn dlq(&self, original: &str) -> String {
        format!("{}.dlq.{}", self.prefix, original)
    }

    /// Returns the channel token of an inbound subject (its last token).
    pub fn channel_of<'a>(&self, subject: &'a str) -> &'a str {
        subject.rsplit('.').next().unwrap_or(subject)
    }

    /// Returns the subject filter a stream captures.
    pub fn stream_subjects(&self, kind: StreamKind) -> String {
        let middle = match kind {
            StreamKind::Inbound => "inbound",
            StreamKind::Runs => "run",
            StreamKind::Outbound => "outbound",
            StreamKind::Events => "events",
            StreamKind::Dlq => "dlq",
        };
        format!("{}.{}.>", self.prefix, middle)
    }
}

/// Makes a client-chosen string safe as one subject token.
fn token(raw: &str) -> String {
    let cleaned: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if cleaned.is_empty() {
        "default".to_owned()
    } else {
        cleaned
    }
}

/// The channel as a metric label: the channels agentloop knows by name, every other name as
/// `other`, so a client publishing on made-up subjects cannot grow the metrics without bound.
pub fn channel_label(channel: &str) -> &'static str {
    const KNOWN: [&str; 10] = [
        "cli", "nats", "webchat", "http", "gateway", "telegram", "slack", "webhook", "system",
        "cron",
    ];
    KNOWN
        .into_iter()
        .find(|known| *known == channel)
        .unwrap_or("other")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_channels_share_one_label() {
        assert_eq!(channel_label("telegram"), "telegram");
        assert_eq!(channel_label("x-1234"), "other");
    }

    #[test]
    fn stream_names_carry_the_prefix() {
        assert_eq!(
            stream_name("agentloop", StreamKind::Inbound),
            "AGENTLOOP_INBOUND"
        );
        assert_eq!(stream_name("t-1.x", StreamKind::Dlq), "T_1_X_DLQ");
    }

    #[test]
    fn client_strings_cannot_break_subjects() {
        let s = Subjects::new("agentloop");
        assert_eq!(s.outbound("we.b *>"), "agentloop.outbound.we_b___");
        assert_eq!(s.outbound(""), "agentloop.outbound.default");
        assert_eq!(s.channel_of("agentloop.inbound.cli"), "cli");
        assert_eq!(
            s.dlq("agentloop.inbound.cli"),
            "agentloop.dlq.agentloop.inbound.cli"
        );
    }
}
