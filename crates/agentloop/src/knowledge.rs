//! What the assistant is and knows, from the command line: `agentloop prompt` (the context the
//! model would receive), `agentloop agents list` and `agentloop memory list|forget|embed`.

use anyhow::{Context as _, bail};

use agentloop_agent_runner::{PreviewRequest, RunnerConfig};
use agentloop_proto::v1::session_service_client::SessionServiceClient;
use agentloop_proto::v1::{ForgetMemoriesRequest, ListMemoriesRequest, MemoryScope};

/// Flags that take a value.
const VALUED: [&str; 12] = [
    "--source",
    "--batch",
    "--config",
    "--message",
    "--sender",
    "--channel",
    "--agent",
    "--user",
    "--principal",
    "--limit",
    "--id",
    "--query",
];

/// The command line after the binary name: positional words and flag values.
pub(crate) struct Args {
    pub(crate) words: Vec<String>,
    flags: Vec<(String, String)>,
    pub(crate) json: bool,
}

impl Args {
    pub(crate) fn parse(args: &[String]) -> anyhow::Result<Self> {
        let mut out = Self {
            words: Vec::new(),
            flags: Vec::new(),
            json: false,
        };
        let mut iter = args.iter().skip(1);
        while let Some(arg) = iter.next() {
            if arg == "--json" {
                out.json = true;
            } else if VALUED.contains(&arg.as_str()) {
                let value = iter
                    .next()
                    .with_context(|| format!("{arg} needs a value"))?;
                out.flags.push((arg.clone(), value.clone()));
            } else if arg == "--edit" || arg == "--yes" {
                out.words.push(arg.clone());
            } else if arg.starts_with("--") {
                bail!("unknown flag {arg}");
            } else {
                out.words.push(arg.clone());
            }
        }
        Ok(out)
    }

    pub(crate) fn flag(&self, name: &str) -> Option<&str> {
        self.flags
            .iter()
            .rev()
            .find(|(flag, _)| flag == name)
            .map(|(_, value)| value.as_str())
    }
}

pub(crate) fn config() -> anyhow::Result<RunnerConfig> {
    agentloop_lifecycle::load_config().context("failed to load config")
}

/// `agentloop prompt SESSION [--message TEXT] [--sender ID] [--channel NAME] [--json]`
pub(crate) async fn prompt(args: &[String]) -> anyhow::Result<()> {
    const USAGE: &str =
        "usage: agentloop prompt SESSION [--message TEXT] [--sender ID] [--channel NAME] [--json]";
    let args = Args::parse(args)?;
    let [_, session] = args.words.as_slice() else {
        bail!(USAGE);
    };
    let request = PreviewRequest {
        session_key: session.clone(),
        message: args.flag("--message").map(str::to_owned),
        sender_id: args.flag("--sender").unwrap_or_default().to_owned(),
        channel: args.flag("--channel").unwrap_or_default().to_owned(),
    };
    let preview = agentloop_agent_runner::preview(&config()?, &request).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&preview)?);
        return Ok(());
    }
    println!(
        "session {} (agent {}): about {} tokens\n",
        preview.session_id, preview.agent_id, preview.total_tokens
    );
    for part in &preview.parts {
        let cut = if part.truncated {
            ", cut to its cap"
        } else {
            ""
        };
        println!("── {} ({} tokens{cut}) ──", part.kind.name(), part.tokens);
        if !part.text.is_empty() {
            println!("{}\n", part.text);
        }
    }
    for message in &preview.messages {
        println!("{}", serde_json::to_string(message)?);
    }
    println!(
        "\ntools: {}",
        preview
            .tools
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

/// `agentloop agents list [--json]`
pub(crate) fn agents(args: &[String]) -> anyhow::Result<()> {
    let args = Args::parse(args)?;
    if args.words.get(1).map(String::as_str) != Some("list") {
        bail!("usage: agentloop agents list [--json]");
    }
    let config = config()?;
    let mut listed = Vec::new();
    // The default agent answers sessions of agents without a section of their own.
    if !config.agents.contains_key("main") {
        listed.push((
            "main".to_owned(),
            agentloop_agent_runner::AgentConfig::default(),
        ));
    }
    listed.extend(config.agents);
    listed.sort_by(|a, b| a.0.cmp(&b.0));
    if args.json {
        let rows: Vec<_> = listed
            .iter()
            .map(|(id, a)| {
                serde_json::json!({
                    "id": id, "model": a.model, "identity": a.identity, "memory": a.memory,
                    "contextFiles": a.context_files, "skillsDirs": a.skills_dirs,
                    "skills": a.skills, "toolsAllow": a.tools_allow, "toolsDeny": a.tools_deny,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    for (id, agent) in &listed {
        let model = if agent.model.is_empty() {
            "(default)"
        } else {
            agent.model.as_str()
        };
        let skills = if agent.skills.is_empty() {
            "all".to_owned()
        } else {
            agent.skills.join(",")
        };
        println!(
            "{id}\tmodel {model}\tmemory {:?}\tcontext files {}\tskills {skills}\ttools {}",
            agent.memory,
            agent.context_files.len(),
            agent.tools_allow.join(",")
        );
    }
    Ok(())
}

/// `agentloop memory list|forget (--user KEY | --principal NAME) [--agent ID] [--id ID] [--query TEXT] [--limit N] [--json]`
/// and `agentloop memory embed [--batch N]`
pub(crate) async fn memory(args: &[String]) -> anyhow::Result<()> {
    const USAGE: &str = "usage: agentloop memory list|forget (--user KEY | --principal NAME) [--agent ID] [--id ID | --query TEXT] [--limit N] [--json]\n       agentloop memory embed [--batch N]";
    let args = Args::parse(args)?;
    let action = args.words.get(1).map(String::as_str);
    if action == Some("embed") {
        let batch = match args.flag("--batch") {
            Some(n) => n.parse().context("--batch must be a number")?,
            None => 64,
        };
        let done = agentloop_agent_runner::backfill_embeddings(&config()?, batch, |done| {
            eprintln!("embedded {} memories", done.embedded);
        })
        .await?;
        println!(
            "embedded {} memories; {} changed while being embedded (run again to embed them)",
            done.embedded, done.changed
        );
        return Ok(());
    }
    let scope = MemoryScope {
        agent_id: args.flag("--agent").unwrap_or("main").to_owned(),
        principal: args.flag("--principal").unwrap_or_default().to_owned(),
        user_key: args.flag("--user").unwrap_or_default().to_owned(),
        ..Default::default()
    };
    if scope.principal.is_empty() && scope.user_key.is_empty() {
        bail!(USAGE);
    }
    let config = config()?;
    let mut grpc = SessionServiceClient::new(config.memory.channel()?);
    match action {
        Some("list") => {
            let limit = match args.flag("--limit") {
                Some(n) => n.parse().context("--limit must be a number")?,
                None => 100,
            };
            let listed = grpc
                .list_memories(ListMemoriesRequest {
                    scope: Some(scope),
                    limit,
                })
                .await
                .map_err(|s| anyhow::anyhow!("memory: {}", s.message()))?
                .into_inner();
            if args.json {
                let rows: Vec<_> = listed
                    .memories
                    .iter()
                    .map(|m| serde_json::json!({"id": m.id, "text": m.text, "source": m.source}))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                println!("{} memories of {}", listed.memories.len(), listed.user_key);
                for m in &listed.memories {
                    println!("{}\t{}\t{}", m.id, m.source, m.text);
                }
            }
        }
        Some("forget") => {
            let id = args.flag("--id").unwrap_or_default().to_owned();
            let query = args.flag("--query").unwrap_or_default().to_owned();
            if id.is_empty() == query.is_empty() {
                bail!("agentloop memory forget needs --id or --query (one of them)");
            }
            let forgotten = grpc
                .forget_memories(ForgetMemoriesRequest {
                    scope: Some(scope),
                    id,
                    query,
                    min_score: 0.0,
                })
                .await
                .map_err(|s| anyhow::anyhow!("memory: {}", s.message()))?
                .into_inner();
            println!("forgot {} memories", forgotten.ids.len());
            for id in forgotten.ids {
                println!("{id}");
            }
        }
        _ => bail!(USAGE),
    }
    Ok(())
}
