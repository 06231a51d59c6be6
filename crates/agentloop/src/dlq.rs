//! `agentloop dlq list | show ID | retry ID [--edit] | purge --yes`: the dead letters an
//! operator reads, fixes and sends again. A retried message goes back on its original subject
//! with `Agentloop-Retry-Of: <id>` and leaves the DLQ once its stream has it.

use std::time::{Duration, SystemTime};

use anyhow::{Context as _, bail};
use serde_json::Value;

use agentloop_bus::{Bus, DeadLetter};
use agentloop_proto::v1::{InboundMessage, OutboundMessage, RunCommand};

use crate::knowledge::{Args, config};

const USAGE: &str =
    "usage: agentloop dlq list [--limit N] [--json] | show ID | retry ID [--edit] | purge --yes";

async fn bus() -> anyhow::Result<Bus> {
    let config = config()?;
    Bus::connect(&config.bus, "cli")
        .await
        .context("cannot reach NATS")
}

fn age(at: SystemTime) -> String {
    let secs = SystemTime::now()
        .duration_since(at)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m", secs / 60),
        3600..86_400 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

/// The payload as JSON a person reads and edits: as sent when it was JSON, else decoded as the
/// message its subject carries (`None` when it is neither).
fn readable(bus: &Bus, letter: &DeadLetter) -> Option<Value> {
    let content_type = letter
        .headers
        .get("Content-Type")
        .map(|v| v.as_str().to_owned());
    let ct = content_type.as_deref();
    let payload = letter.payload.as_ref();
    if let Ok(json) = serde_json::from_slice::<Value>(payload) {
        return Some(json);
    }
    let kind = letter
        .original_subject
        .strip_prefix(bus.subjects().prefix())
        .and_then(|rest| rest.strip_prefix('.'))
        .and_then(|rest| rest.split('.').next())
        .unwrap_or_default();
    match kind {
        "inbound" => agentloop_proto::decode::<InboundMessage>(ct, payload)
            .ok()
            .and_then(|(m, _)| serde_json::to_value(m).ok()),
        "run" => agentloop_proto::decode::<RunCommand>(ct, payload)
            .ok()
            .and_then(|(m, _)| serde_json::to_value(m).ok()),
        "outbound" => agentloop_proto::decode::<OutboundMessage>(ct, payload)
            .ok()
            .and_then(|(m, _)| serde_json::to_value(m).ok()),
        _ => None,
    }
}

fn id_of(args: &Args) -> anyhow::Result<u64> {
    args.words
        .get(2)
        .context(USAGE)?
        .parse()
        .context("a dead letter's ID is the number `agentloop dlq list` shows")
}

/// The edited JSON of `value`, through `$EDITOR` (vi without one).
fn edit(value: &Value) -> anyhow::Result<Vec<u8>> {
    let path = std::env::temp_dir().join(format!("agentloop-dlq-{}.json", std::process::id()));
    std::fs::write(&path, serde_json::to_string_pretty(value)?)?;
    let editor = std::env::var("EDITOR").unwrap_or_else(|_| "vi".to_owned());
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{editor} \"$1\""))
        .arg("sh")
        .arg(&path)
        .status()
        .with_context(|| format!("cannot run the editor {editor:?}"))?;
    let edited = std::fs::read(&path)?;
    let _ = std::fs::remove_file(&path);
    if !status.success() {
        bail!("the editor exited with {status}; nothing was retried");
    }
    serde_json::from_slice::<Value>(&edited)
        .context("the edited message is not JSON; nothing was retried")?;
    Ok(edited)
}

/// `agentloop dlq ...`
pub(crate) async fn run(args: &[String]) -> anyhow::Result<()> {
    let args = Args::parse(args)?;
    let action = args.words.get(1).map(String::as_str);
    let bus = bus().await?;
    match action {
        Some("list") => {
            let limit = match args.flag("--limit") {
                Some(n) => n.parse().context("--limit must be a number")?,
                None => 50,
            };
            let letters = bus.dead_letters(limit).await?;
            if args.json {
                let rows: Vec<Value> = letters
                    .iter()
                    .map(|l| serde_json::json!({"id": l.id, "age": age(l.at), "service": l.service, "subject": l.original_subject, "reason": l.reason}))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&rows)?);
                return Ok(());
            }
            println!("{} dead letters (newest first)", letters.len());
            for l in &letters {
                println!(
                    "{}\t{}\t{}\t{}\t{}",
                    l.id,
                    age(l.at),
                    l.service,
                    l.original_subject,
                    l.reason
                );
            }
        }
        Some("show") => {
            let id = id_of(&args)?;
            let letter = bus
                .dead_letter_by_id(id)
                .await?
                .with_context(|| format!("no dead letter {id}"))?;
            println!("id:       {}", letter.id);
            println!("age:      {}", age(letter.at));
            println!("service:  {}", letter.service);
            println!("subject:  {}", letter.original_subject);
            println!("reason:   {}", letter.reason);
            for (name, values) in letter.headers.iter() {
                for value in values {
                    println!("header:   {name}: {}", value.as_str());
                }
            }
            match readable(&bus, &letter) {
                Some(json) => println!("{}", serde_json::to_string_pretty(&json)?),
                None => println!(
                    "payload ({} bytes, not JSON): {}",
                    letter.payload.len(),
                    String::from_utf8_lossy(&letter.payload)
                ),
            }
        }
        Some("retry") => {
            let id = id_of(&args)?;
            let edited = if args.words.iter().any(|w| w == "--edit") {
                let letter = bus
                    .dead_letter_by_id(id)
                    .await?
                    .with_context(|| format!("no dead letter {id}"))?;
                let json = readable(&bus, &letter)
                    .context("this dead letter's payload cannot be shown as JSON to edit")?;
                Some(edit(&json)?)
            } else {
                None
            };
            let payload =
                edited.map(|bytes| (bytes.into(), agentloop_proto::Encoding::Json.content_type()));
            match bus.retry_dead_letter(id, payload).await? {
                Some(subject) => println!("dead letter {id} published again on {subject}"),
                None => bail!("no dead letter {id}"),
            }
        }
        Some("purge") => {
            if !args.words.iter().any(|w| w == "--yes") {
                bail!("agentloop dlq purge removes every dead letter for good: add --yes");
            }
            let purged = bus.purge_dead_letters().await?;
            println!("purged {purged} dead letters");
        }
        _ => bail!(USAGE),
    }
    Ok(())
}
