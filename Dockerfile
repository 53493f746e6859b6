# mcp-firewall container image.
#   docker build -t mcp-firewall .
#   docker run -p 8080:8080 -p 9090:9090 mcp-firewall      # the demo, as shipped
#   docker compose up --build                               # firewall + sample upstream + ClickHouse
# In production run `serve --config /etc/mcp-firewall/config.toml` with your
# config and policies mounted (see deploy/kubernetes/).
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY bench/Cargo.toml bench/Cargo.toml
COPY demo/Cargo.toml demo/Cargo.toml
COPY demo/src demo/src
COPY src src
COPY benches benches
COPY bench/src bench/src
COPY config config
COPY policies policies
RUN cargo build --profile dist --locked -p mcp-firewall -p mcp-demo-upstream

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home /var/lib/mcp-firewall mcp-firewall \
    && mkdir -p /var/lib/mcp-firewall/spool /var/lib/mcp-firewall/approvals \
    && chown -R mcp-firewall /var/lib/mcp-firewall
COPY --from=build /src/target/dist/mcp-firewall /usr/local/bin/mcp-firewall
# The sample estate `demo` starts beside the firewall (and compose serves alone).
COPY --from=build /src/target/dist/mcp-demo-upstream /usr/local/bin/mcp-demo-upstream
COPY config/example.toml /etc/mcp-firewall/config.toml
COPY config/compose.toml /etc/mcp-firewall/compose.toml
COPY policies /etc/mcp-firewall/policies
USER mcp-firewall
EXPOSE 8080 8443 9090
ENTRYPOINT ["/usr/local/bin/mcp-firewall"]
# Works as shipped: the firewall in front of the sample upstream, with tokens
# printed on start. Production: `serve --config /etc/mcp-firewall/config.toml`.
CMD ["demo", "--listen", "0.0.0.0:8080", "--admin", "0.0.0.0:9090"]
