# Multi-stage build: compile in the Rust image, run in a slim Debian image as a non-root user.
FROM rust:1-bookworm AS build
WORKDIR /src
RUN apt-get update && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/*
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY benches ./benches
COPY config ./config
# The commit shown by `--version` and `kvroute_build_info` (e.g. `--build-arg
# KVROUTE_COMMIT=$(git rev-parse HEAD)`): .dockerignore leaves .git out of the context, so
# build.rs cannot ask git here.
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
EXPOSE 8000
# The image alone starts a router with no workers (add them with --worker flags, the admin API,
# or a config file: mount it and set KVROUTE_CONFIG=/etc/kvroute/kvroute.toml).
ENV KVROUTE_LISTEN=0.0.0.0:8000
ENTRYPOINT ["/usr/local/bin/kvroute"]
CMD ["serve"]
