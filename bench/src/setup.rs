//! What a run measures: the stack mode (`--mode separate|all`) and the inbound encoding
//! (`--inbound proto|json`), and how the summary and report name them.

use anyhow::bail;

use agentloop_proto::Encoding;

/// How the services under test run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StackMode {
    /// Each of the five services in a process of its own (`agentloop memory`, `router`, ...).
    #[default]
    Separate,
    /// All five in one `agentloop all` process.
    All,
}

impl StackMode {
    /// Parses `separate` or `all`.
    ///
    /// # Errors
    /// For any other name.
    pub fn parse(name: &str) -> anyhow::Result<Self> {
        match name {
            "separate" => Ok(Self::Separate),
            "all" => Ok(Self::All),
            other => bail!("--mode is separate or all, not {other:?}"),
        }
    }

    /// The name `--mode` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Separate => "separate",
            Self::All => "all",
        }
    }
}

/// The stack mode and inbound encoding a run measured, for its summary and report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setup {
    /// `--mode`.
    pub mode: StackMode,
    /// `--inbound`: the encoding of the InboundMessages the load client publishes.
    pub inbound: Encoding,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            mode: StackMode::Separate,
            inbound: Encoding::Proto,
        }
    }
}

impl Setup {
    /// One line for the soak's summary: `mode: ..., inbound: ...`.
    pub fn line(self) -> String {
        let processes = match self.mode {
            StackMode::Separate => "five service processes",
            StackMode::All => "one `agentloop all` process",
        };
        format!(
            "mode: {} ({processes}), inbound: {} (Content-Type: {})",
            self.mode.name(),
            self.inbound.name(),
            self.inbound.content_type()
        )
    }

    /// The command-line flags that select this setup (empty for the defaults).
    pub fn flags(self) -> String {
        let mut flags = String::new();
        if self.mode != StackMode::Separate {
            flags.push_str(&format!(" --mode {}", self.mode.name()));
        }
        if self.inbound != Encoding::Proto {
            flags.push_str(&format!(" --inbound {}", self.inbound.name()));
        }
        flags
    }

    /// How the services run, in words.
    pub fn processes(self) -> &'static str {
        match self.mode {
            StackMode::Separate => "each in a process of its own (`--mode separate`)",
            StackMode::All => {
                "all five in one `agentloop all` process, whose gateway address serves health, \
                 readiness and metrics for all of them (`--mode all`)"
            }
        }
    }

    /// The process whose resident memory stands for the runner's: the runner's own, or the
    /// whole `agentloop all` process (an upper bound).
    pub fn runner_process(self) -> &'static str {
        match self.mode {
            StackMode::Separate => "runner",
            StackMode::All => "`agentloop all` process (runner and the other services)",
        }
    }

    /// The name of the process in the RSS readings that [`Self::runner_process`] describes.
    pub fn runner_rss_name(self) -> &'static str {
        match self.mode {
            StackMode::Separate => "runner",
            StackMode::All => crate::stack::ALL_PROCESS,
        }
    }

    /// The load client's inbound encoding, in words.
    pub fn inbound_words(self) -> String {
        let what = match self.inbound {
            Encoding::Proto => "protobuf",
            Encoding::Json => "proto3 JSON (as one publishes with the NATS CLI)",
        };
        format!(
            "{what} InboundMessages (`--inbound {}`, `Content-Type: {}`)",
            self.inbound.name(),
            self.inbound.content_type()
        )
    }

    /// The report's opening paragraph: how it was produced and what it measured.
    pub fn report_intro(self, quick: bool) -> String {
        format!(
            "Produced by `./scripts/bench.sh{}{}` (the `agentloop-bench` binary). Services: {}, from \
             `target/release`, against a private nats-server (JetStream, file store in a temp dir, `GOMAXPROCS={}`), \
             a fresh Postgres database and the fake model answering at once (`echo: <text>`, streamed in word chunks). \
             The load client publishes {} on `agentloop.inbound.cli` through JetStream \
             and waits for the JSON reply on `agentloop.deliver.cli.<session>`; sessions send in turn (closed loop).\n",
            if quick { " --quick" } else { "" },
            self.flags(),
            self.processes(),
            std::env::var("BENCH_NATS_GOMAXPROCS").unwrap_or_else(|_| "1".to_owned()),
            self.inbound_words()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_name_only_what_differs_from_the_defaults() {
        assert_eq!(Setup::default().flags(), "");
        let all_json = Setup {
            mode: StackMode::parse("all").unwrap_or_default(),
            inbound: Encoding::Json,
        };
        assert_eq!(all_json.flags(), " --mode all --inbound json");
        assert!(all_json.line().contains("application/json"));
        assert!(StackMode::parse("both").is_err());
    }
}
