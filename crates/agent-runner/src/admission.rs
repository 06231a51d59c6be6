//! The router's checks, made again on each run command: anyone who can publish on
//! `<prefix>.run.>` could otherwise hand the runner what the router would have refused.

use agentloop_bus::BusConfig;
use agentloop_proto::v1::RunCommand;

use crate::RunnerConfig;

/// Why a run command is refused at intake.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    /// The command fails the router's validation (size caps, queue mode, NUL bytes).
    #[error("run command refused: {0}")]
    Invalid(#[from] agentloop_proto::ValidationError),
    /// The model is neither the default nor in `[models] allowlist`.
    #[error("run command refused: model {0:?} is not in models.allowlist")]
    ModelNotAllowed(String),
    /// The reply subject is outside `<prefix>.reply.>` and `_INBOX.>`.
    #[error("run command refused: replySubject {0:?} is outside <prefix>.reply.> and _INBOX.>")]
    ReplySubject(String),
}

/// What a run command is checked against, taken from the runner's configuration.
pub(crate) struct Admission {
    bus: BusConfig,
    default_model: String,
    allowlist: Vec<String>,
}

impl Admission {
    pub(crate) fn new(config: &RunnerConfig) -> Self {
        Self {
            bus: config.bus.clone(),
            default_model: config.models.default_model.clone(),
            allowlist: config.model_allowlist.clone(),
        }
    }

    /// Returns why `command` must not run, if it must not.
    pub(crate) fn check(&self, command: &RunCommand) -> Result<(), Refusal> {
        // The router's caps and refusals (size, queue mode, NUL bytes) on the fields the
        // command carries, written once in the proto crate for both.
        agentloop_proto::validate_run_command(command)?;
        // The router names a model only from the allowlist, else the default (or none).
        let model = command.model.as_str();
        let allowed = model.is_empty()
            || model == self.default_model
            || self.allowlist.is_empty()
            || self.allowlist.iter().any(|m| m == model);
        if !allowed {
            return Err(Refusal::ModelNotAllowed(model.to_owned()));
        }
        if !command.reply_subject.is_empty()
            && !self.bus.allows_reply_subject(&command.reply_subject)
        {
            return Err(Refusal::ReplySubject(command.reply_subject.clone()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(allowlist: &[&str]) -> Admission {
        let mut config = RunnerConfig::default();
        config.models.default_model = "openai/default".to_owned();
        config.model_allowlist = allowlist.iter().map(|m| (*m).to_owned()).collect();
        Admission::new(&config)
    }

    fn command(text: &str, model: &str) -> RunCommand {
        RunCommand {
            session_id: "s1".to_owned(),
            session_key: "cli:a".to_owned(),
            channel: "cli".to_owned(),
            text: text.to_owned(),
            model: model.to_owned(),
            ..Default::default()
        }
    }

    #[test]
    fn what_the_router_would_pass_is_admitted() {
        let admission = admission(&["openai/a"]);
        for model in ["", "openai/default", "openai/a"] {
            admission.check(&command("hi", model)).unwrap();
        }
        let mut reply = command("hi", "");
        reply.reply_subject = "_INBOX.gw.1".to_owned();
        admission.check(&reply).unwrap();
    }

    #[test]
    fn what_the_router_would_refuse_is_refused() {
        let admission = admission(&["openai/a"]);
        assert!(matches!(
            admission.check(&command("hi", "anthropic/expensive")),
            Err(Refusal::ModelNotAllowed(_))
        ));
        assert!(matches!(
            admission.check(&command(&"x".repeat(300 * 1024), "")),
            Err(Refusal::Invalid(_))
        ));
        assert!(matches!(
            admission.check(&command("  ", "")),
            Err(Refusal::Invalid(_))
        ));
        let mut forged = command("hi", "");
        forged.reply_subject = "agentloop.inbound.cli".to_owned();
        assert!(matches!(
            admission.check(&forged),
            Err(Refusal::ReplySubject(_))
        ));
    }
}
