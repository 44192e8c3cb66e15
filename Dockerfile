# Multi-stage build: compile in the Rust image, run in a slim Debian image as a non-root user.
FROM rust:1-bookworm AS build
WORKDIR /src
RUN apt-get update && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/*
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
COPY config ./config
RUN cargo build --release --bin kvroute

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates libstdc++6 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home kvroute
COPY --from=build /src/target/release/kvroute /usr/local/bin/kvroute
COPY config/kvroute.example.toml /etc/kvroute/kvroute.example.toml
USER 10001
EXPOSE 8000
ENTRYPOINT ["/usr/local/bin/kvroute"]
CMD ["serve", "--listen", "0.0.0.0:8000", "--config", "/etc/kvroute/kvroute.toml"]
