# fencegate: lock service, sidecar and CLI in one binary.
#
#   docker build -t fencegate .
#   docker run --rm -p 7401:7401 -v fg1:/var/lib/fencegate fencegate server --config /etc/fencegate/node1.yaml
#
# Build stage: the full Rust toolchain. The workspace (the client and test
# kit crates included) must be whole for cargo to resolve it.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
COPY src ./src
COPY bench ./bench
COPY config ./config
RUN cargo build --release --locked --bin fencegate

# Runtime stage: a slim Debian with CA certificates, no compiler, no shell
# tooling beyond what the healthcheck needs, running as a non-root user.
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/fencegate --create-home fencegate
COPY --from=build /src/target/release/fencegate /usr/local/bin/fencegate
COPY config /etc/fencegate
USER fencegate
WORKDIR /var/lib/fencegate
# Lock API (7401–7403 in the example configs), peer plane (7501–7503),
# sidecar, sidecar metrics.
EXPOSE 7401 7402 7403 7501 7502 7503 8080 9464
# Nodes answer /healthz on their API port; for a sidecar, override with its
# metrics port (HEALTHCHECK CMD curl -fsS http://127.0.0.1:9464/healthz).
HEALTHCHECK --interval=10s --timeout=2s --start-period=10s --retries=3 \
    CMD curl -fsS http://127.0.0.1:7401/healthz || exit 1
ENTRYPOINT ["fencegate"]
CMD ["--help"]
