# syntax=docker/dockerfile:1.7
#
# One image for every agentloop service. The service is chosen by the command:
#   docker run --rm agentloop:local router        (gateway|router|runner|memory|delivery|all)
#   docker run --rm --entrypoint agentloop-fake-model agentloop:local --listen 0.0.0.0:18181
#
# Build: docker build -t agentloop:local .
# Keep RUST_VERSION equal to the channel in rust-toolchain.toml.

ARG RUST_VERSION=1.95.0
ARG DEBIAN_RELEASE=bookworm

# ---------------------------------------------------------------------------
# Builder: release build of both binaries, with the cargo registry and the
# target directory kept in BuildKit cache mounts between builds.
# ---------------------------------------------------------------------------
FROM rust:${RUST_VERSION}-slim-${DEBIAN_RELEASE} AS builder
ARG RUST_VERSION
# Use the image's toolchain as is: rust-toolchain.toml would otherwise make
# rustup download its extra components (rustfmt, clippy) during the build.
ENV RUSTUP_TOOLCHAIN=${RUST_VERSION} \
    CARGO_INCREMENTAL=0 \
    CARGO_TERM_COLOR=never
WORKDIR /src
COPY . .
RUN --mount=type=cache,id=agentloop-cargo-registry,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,id=agentloop-cargo-git,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,id=agentloop-target,target=/src/target,sharing=locked \
    cargo build --release --locked -p agentloop -p agentloop-fake-model \
 && install -D -m 0755 target/release/agentloop /out/agentloop \
 && install -D -m 0755 target/release/agentloop-fake-model /out/agentloop-fake-model

# ---------------------------------------------------------------------------
# Runtime: Debian slim with CA certificates (TLS to model providers, NATS and
# Postgres) and curl for container healthchecks; runs as an unprivileged user.
# ---------------------------------------------------------------------------
FROM debian:${DEBIAN_RELEASE}-slim AS runtime

# Versions are not pinned: Debian security updates replace the old ones.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 agentloop \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin agentloop

COPY --from=builder /out/agentloop /out/agentloop-fake-model /usr/local/bin/

LABEL org.opencontainers.image.title="agentloop" \
      org.opencontainers.image.description="Distributed runtime for AI-assistant conversations (gateway, router, runner, memory, delivery)" \
      org.opencontainers.image.licenses="Apache-2.0"

# Containers listen on all interfaces; the binary's own defaults are loopback.
# Per-service admin ports are set by docker-compose.yml / deploy/.
ENV RUST_LOG=info \
    AGENTLOOP_GATEWAY__LISTEN=0.0.0.0:8080 \
    AGENTLOOP_MEMORY__LISTEN=0.0.0.0:50051 \
    FAKE_MODEL_LISTEN=0.0.0.0:18181

# 8080 gateway HTTP/WebSocket, 9090 admin (/healthz /readyz /metrics),
# 50051 memory gRPC, 18181 fake model server.
EXPOSE 8080 9090 50051 18181

USER 10001:10001
WORKDIR /tmp
STOPSIGNAL SIGTERM
ENTRYPOINT ["agentloop"]
CMD ["--help"]
