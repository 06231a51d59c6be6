//! `agentloop dlq` against a real nats-server: an operator lists the dead letters, reads one,
//! fixes it in an editor and sends it again on its original subject, then purges the rest.

use std::process::Command;

use agentloop_bus::{Bus, BusConfig, HEADER_RETRY_OF, StreamKind, stream_name};

fn dlq(url: &str, prefix: &str, args: &[&str], editor: Option<&str>) -> (bool, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_agentloop"));
    command
        .arg("dlq")
        .args(args)
        .env("NATS_URL", url)
        .env("AGENTLOOP_BUS__PREFIX", prefix)
        .env_remove("AGENTLOOP_CONFIG");
    if let Some(editor) = editor {
        command.env("EDITOR", editor);
    }
    let output = command.output().expect("run agentloop dlq");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

async fn cli(url: &str, prefix: &str, args: &[&str], editor: Option<&str>) -> (bool, String) {
    let (url, prefix) = (url.to_owned(), prefix.to_owned());
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let editor = editor.map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        dlq(&url, &prefix, &args, editor.as_deref())
    })
    .await
    .expect("the CLI task ran")
}

#[tokio::test]
async fn dead_letters_are_listed_shown_fixed_and_retried_on_their_subject_then_purged() {
    // Arrange: two dead letters, an empty message from a NATS client and a reply nobody took
    let nats = agentloop_testkit::NatsServer::start().unwrap();
    let prefix = "dlqcli";
    let config = BusConfig {
        url: nats.url().to_owned(),
        prefix: prefix.to_owned(),
        ..Default::default()
    };
    let bus = Bus::connect(&config, "test").await.unwrap();
    let inbound = format!("{prefix}.inbound.cli");
    bus.dead_letter(
        "router",
        &inbound,
        None,
        br#"{"sessionKey":"s1","text":""}"#.to_vec().into(),
        "invalid inbound message: text is required",
    )
    .await
    .unwrap();
    bus.dead_letter(
        "delivery",
        &format!("{prefix}.outbound.telegram"),
        None,
        b"\x0a\x01x".to_vec().into(),
        "a telegram reply without a chat",
    )
    .await
    .unwrap();
    let url = nats.url().to_owned();

    // Act + Assert: list
    let (ok, listed) = cli(&url, prefix, &["list"], None).await;
    assert!(ok, "{listed}");
    assert!(listed.contains("2 dead letters"), "{listed}");
    assert!(
        listed.contains(&format!(
            "\trouter\t{inbound}\tinvalid inbound message: text is required"
        )),
        "{listed}"
    );
    assert!(
        listed.contains("\tdelivery\tdlqcli.outbound.telegram\ta telegram reply without a chat"),
        "{listed}"
    );
    let first: u64 = listed
        .lines()
        .find(|l| l.contains("\trouter\t"))
        .and_then(|l| l.split('\t').next())
        .unwrap()
        .parse()
        .unwrap();

    // show: the reason and the message as JSON
    let (ok, shown) = cli(&url, prefix, &["show", &first.to_string()], None).await;
    assert!(ok, "{shown}");
    assert!(shown.contains("service:  router"), "{shown}");
    assert!(shown.contains("\"sessionKey\": \"s1\""), "{shown}");

    // retry --edit: the fixed message goes back on its subject, linked to the dead letter
    let editor = r#"sed -i 's/"text": ""/"text": "fixed by an operator"/'"#;
    let (ok, retried) = cli(
        &url,
        prefix,
        &["retry", &first.to_string(), "--edit"],
        Some(editor),
    )
    .await;
    assert!(ok, "{retried}");
    assert!(
        retried.contains(&format!("published again on {inbound}")),
        "{retried}"
    );
    let stream = bus
        .jetstream()
        .get_stream(stream_name(prefix, StreamKind::Inbound))
        .await
        .unwrap();
    let again = stream
        .get_last_raw_message_by_subject(&inbound)
        .await
        .unwrap();
    let payload: serde_json::Value = serde_json::from_slice(&again.payload).unwrap();
    assert_eq!(payload["text"], "fixed by an operator");
    assert_eq!(
        again
            .headers
            .get(HEADER_RETRY_OF)
            .map(|v| v.as_str().to_owned()),
        Some(first.to_string())
    );
    let (_, after) = cli(&url, prefix, &["list"], None).await;
    assert!(after.contains("1 dead letters"), "{after}");
    let (ok, missing) = cli(&url, prefix, &["retry", &first.to_string()], None).await;
    assert!(
        !ok && missing.contains(&format!("no dead letter {first}")),
        "{missing}"
    );

    // purge asks for --yes, then empties the DLQ
    let (ok, refused) = cli(&url, prefix, &["purge"], None).await;
    assert!(!ok && refused.contains("--yes"), "{refused}");
    let (ok, purged) = cli(&url, prefix, &["purge", "--yes"], None).await;
    assert!(ok && purged.contains("purged 1 dead letters"), "{purged}");
    let (_, empty) = cli(&url, prefix, &["list"], None).await;
    assert!(empty.contains("0 dead letters"), "{empty}");
}
