# Multi-stage build: compile in the Rust image, run in a slim Debian image as a non-root user.
# The dependencies are built in a layer of their own (cargo-chef: a recipe made from
# Cargo.toml/Cargo.lock and the targets' layout), so a change to kvroute's source rebuilds
# kvroute alone, not its dependencies, as long as Cargo.lock is unchanged.
FROM rust:1-bookworm AS chef
RUN apt-get update && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/*
RUN cargo install --locked cargo-chef@0.1.78
WORKDIR /src

FROM chef AS planner
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY crates ./crates
COPY benches ./benches
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS build
COPY --from=planner /src/recipe.json recipe.json
# The dependency layer: rebuilt only when the recipe (the manifests and lock file) changes.
RUN cargo chef cook --release --locked --bin kvroute --recipe-path recipe.json
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY crates ./crates
COPY benches ./benches
COPY config ./config
# The commit shown by `--version` and `kvroute_build_info` (e.g. `--build-arg
# KVROUTE_COMMIT=$(git rev-parse HEAD)`): .dockerignore leaves .git out of the context, so
# build.rs cannot ask git here. Declared after the dependency layer, which it must not bust.
ARG KVROUTE_COMMIT=unknown
ENV KVROUTE_COMMIT=${KVROUTE_COMMIT}
RUN cargo build --release --locked --bin kvroute

FROM debian:bookworm-slim
ARG KVROUTE_COMMIT=unknown
LABEL org.opencontainers.image.title="kvroute" \
      org.opencontainers.image.description="A KV-cache-aware router for LLM serving" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.revision="${KVROUTE_COMMIT}"
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates libstdc++6 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home kvroute
COPY --from=build /src/target/release/kvroute /usr/local/bin/kvroute
COPY config/kvroute.example.toml /etc/kvroute/kvroute.example.toml
USER 10001
EXPOSE 8080
# The image alone starts a router with no workers (add them with --worker flags, the admin API,
# or a config file: mount it and set KVROUTE_CONFIG=/etc/kvroute/kvroute.toml).
ENV KVROUTE_LISTEN=0.0.0.0:8080
ENTRYPOINT ["/usr/local/bin/kvroute"]
CMD ["serve"]
