# fencegate: lock service, sidecar and CLI in one binary.
#
#   docker build -t fencegate:local .
#   docker compose -f deploy/compose/compose.yaml up     (a 3-node cluster,
#       the demo inventory API and a sidecar in front of it)
#
# Base images are pinned by exact version AND digest (the multi-platform
# index digest, so every architecture resolves). To bump one: pick the new
# tag, then `docker buildx imagetools inspect rust:<tag>` (or
# `docker pull rust:<tag>` and `docker inspect --format '{{index .RepoDigests 0}}'`),
# and replace both the tag and the sha256 below. The rust image should carry
# the compiler CI tests with (`rustc --version`).

# Build stage: the full Rust toolchain. The workspace (the client and test
# kit crates, and the bench sources Cargo.toml names) must be whole for
# cargo to resolve it.
FROM rust:1.95.0-slim-bookworm@sha256:d7482085ff5b415f84dba5647ae71606650bdef00db7aeb69f4b3d170c3e4082 AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
COPY src ./src
COPY bench ./bench
COPY config ./config
RUN cargo build --release --locked --bin fencegate \
    && install -d -o 10001 -g 10001 -m 0750 /out/var/lib/fencegate

# Runtime stage: Debian slim (the glibc the binary was built against), no
# package installed: no curl (the healthcheck is the binary's own), and no
# ca-certificates (https upstreams are verified against the Mozilla roots
# compiled into the binary; the lock service's CA comes from its config).
FROM debian:12.15-slim@sha256:abd67ffcfa541b485a3dff59865ab629aa048a6c613e639d36e7456b0b229241
COPY --from=build /src/target/release/fencegate /usr/local/bin/fencegate
COPY --from=build --chown=10001:10001 /out/var/lib/fencegate /var/lib/fencegate
COPY config /etc/fencegate
COPY deploy/compose/config /etc/fencegate/compose
# A numeric user (no passwd entry needed): Kubernetes' runAsNonRoot can
# check it without looking the name up.
USER 10001:10001
WORKDIR /var/lib/fencegate
# Lock API 7401, peer plane 7501 (one node per container), sidecar 8080,
# sidecar metrics 9464.
EXPOSE 7401 7501 8080 9464
# GET $FENCEGATE_HEALTH_URL (default http://127.0.0.1:7401/healthz, a
# node's). A sidecar container sets FENCEGATE_HEALTH_URL to its
# metrics_listen's /healthz; every role checks its own port.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["fencegate", "healthcheck"]
ENTRYPOINT ["fencegate"]
CMD ["--help"]
