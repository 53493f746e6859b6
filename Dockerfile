# mcp-firewall container image.
#   docker build -t mcp-firewall .
#   docker run -p 8443:8443 -p 9090:9090 -v $PWD/config:/etc/mcp-firewall:ro \
#     -v $PWD/policies:/etc/mcp-firewall/policies:ro mcp-firewall
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY bench/Cargo.toml bench/Cargo.toml
COPY src src
COPY benches benches
COPY bench/src bench/src
COPY config config
COPY policies policies
RUN cargo build --release --locked -p mcp-firewall

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home /var/lib/mcp-firewall mcp-firewall \
    && mkdir -p /var/lib/mcp-firewall/spool && chown -R mcp-firewall /var/lib/mcp-firewall
COPY --from=build /src/target/release/mcp-firewall /usr/local/bin/mcp-firewall
COPY config/example.toml /etc/mcp-firewall/config.toml
COPY policies /etc/mcp-firewall/policies
USER mcp-firewall
EXPOSE 8443 9090
ENTRYPOINT ["/usr/local/bin/mcp-firewall"]
CMD ["serve", "--config", "/etc/mcp-firewall/config.toml"]
