//! The retrieval bench's embeddings model: the all-MiniLM-L6-v2 server of `bench/embed/` as a
//! child process, called as the runner calls any OpenAI-compatible `/v1/embeddings`
//! (`ModelClient::embed`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::io::{AsyncBufReadExt as _, BufReader};

use agentloop_model::{ModelClient, ModelRef, ModelsConfig};

/// The model as `memory.embeddings_model` would name it.
pub const MODEL: &str = "openai/all-MiniLM-L6-v2";
/// Texts per embeddings request.
const CHUNK: usize = 64;

/// A running embeddings server; dropping it kills the process.
pub struct EmbedServer {
    _child: tokio::process::Child,
    models: ModelClient,
    model: ModelRef,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

impl EmbedServer {
    /// Starts `bench/embed/server.py` with the repository's `.venv` and waits for its address.
    ///
    /// # Errors
    /// When the venv lacks the server's packages, or the server does not come up in a minute.
    pub async fn start() -> anyhow::Result<Self> {
        let root = repo_root();
        let python = root.join(".venv/bin/python");
        if !python.exists() {
            bail!(
                "{} is missing: run `bash bench/embed/setup.sh` (./scripts/bench.sh --retrieval does)",
                python.display()
            );
        }
        let mut child = tokio::process::Command::new(&python)
            .arg(root.join("bench/embed/server.py"))
            .args(["--port", "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("failed to start bench/embed/server.py")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let url = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await? {
                if let Some(url) = line.strip_prefix("listening on ") {
                    return Ok(url.trim().to_owned());
                }
            }
            bail!("bench/embed/server.py exited before it listened (did `bash bench/embed/setup.sh` run?)")
        })
        .await
        .context("bench/embed/server.py did not listen within 60 s")??;
        let models = ModelClient::new(&ModelsConfig {
            default_model: MODEL.to_owned(),
            openai_base_url: url,
            request_timeout_ms: 120_000,
            ..ModelsConfig::default()
        })?;
        Ok(Self {
            _child: child,
            models,
            model: ModelRef::parse(MODEL)?,
        })
    }

    /// The vectors of `texts`, in order, [`CHUNK`] per request.
    ///
    /// # Errors
    /// When a request fails.
    pub async fn embed(&self, texts: &[&str]) -> anyhow::Result<Vec<Vec<f32>>> {
        let mut out = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(CHUNK) {
            out.extend(self.models.embed(&self.model, chunk).await?);
        }
        Ok(out)
    }
}

/// `values` as memory stores a vector: normalized, packed little-endian float32.
pub fn packed(values: &[f32]) -> Vec<u8> {
    let norm = values
        .iter()
        .map(|v| v * v)
        .sum::<f32>()
        .sqrt()
        .max(f32::MIN_POSITIVE);
    values
        .iter()
        .flat_map(|v| (v / norm).to_le_bytes())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vector_is_packed_normalized_in_little_endian() {
        let bytes = packed(&[3.0, 4.0]);
        assert_eq!(bytes.len(), 8);
        assert_eq!(f32::from_le_bytes(bytes[0..4].try_into().unwrap()), 0.6);
        assert_eq!(f32::from_le_bytes(bytes[4..8].try_into().unwrap()), 0.8);
    }
}
