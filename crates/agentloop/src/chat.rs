//! `agentloop chat SESSION`: an interactive chat through the gateway; each reply streams in.

use std::io::Write as _;

use anyhow::{Context as _, bail};

use crate::send::{GatewayClient, positional};

/// Runs `agentloop chat SESSION` until end of input.
pub(crate) async fn run(args: &[String]) -> anyhow::Result<()> {
    let positional = positional(args);
    let [session] = positional.as_slice() else {
        bail!("usage: agentloop chat SESSION [--url URL] [--token TOKEN]");
    };
    let client = GatewayClient::from_args(args)?;
    eprintln!("chatting in session {session:?}; end with Ctrl-D");
    loop {
        eprint!("> ");
        // Reading a terminal blocks; it gets a blocking thread so the runtime stays free.
        let (read, line) = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).map(|n| (n, line))
        })
        .await
        .context("stdin reader panicked")??;
        if read == 0 {
            return Ok(());
        }
        if line.trim().is_empty() {
            continue;
        }
        let streamed = client
            .ask(session, &line, |delta| {
                print!("{delta}");
                let _ = std::io::stdout().flush();
            })
            .await;
        match streamed {
            Ok(_) => println!(),
            Err(err) => eprintln!("error: {err:#}"),
        }
    }
}
