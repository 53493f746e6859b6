//! The deployment files work as shipped: the Kubernetes kustomization
//! renders (`kubectl kustomize`) to replicas with their own spool volumes,
//! probes on the admin port, a disruption budget, a grace period longer
//! than the drain, non-root and a read-only root filesystem; its config and
//! the compose config validate; its policy copies are the shipped policies;
//! the image starts something that works without a config of one's own.

use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn env(k: &str) -> Option<String> {
    match k {
        "MCP_FIREWALL_SESSION_KEY" => Some("0123456789abcdef0123456789abcdef".into()),
        "MCP_FIREWALL_DEV_SECRET" => {
            Some("compose-only-secret-that-is-long-enough-for-hs256".into())
        }
        _ => Some("password".into()),
    }
}

#[test]
fn the_kubernetes_and_compose_configs_validate() {
    let k8s = root().join("deploy/kubernetes");
    let text = std::fs::read_to_string(k8s.join("config.toml")).unwrap();
    let cfg = mcp_firewall::config::load_str(&text, &k8s.join("config.toml"), &k8s, &env)
        .unwrap_or_else(|e| panic!("deploy/kubernetes/config.toml: {e}"));
    assert_eq!(cfg.upstreams.len(), 1);
    let compose = std::fs::read_to_string(root().join("config/compose.toml")).unwrap();
    // In the image, `policies` sits beside the config (/etc/mcp-firewall).
    mcp_firewall::config::load_str(
        &compose,
        Path::new("/etc/mcp-firewall/compose.toml"),
        root(),
        &env,
    )
    .unwrap_or_else(|e| panic!("config/compose.toml: {e}"));
}

#[test]
fn the_kustomization_ships_the_policies_as_they_are() {
    let k8s = root().join("deploy/kubernetes/policies");
    for name in [
        "00-gates.toml",
        "10-tools.toml",
        "20-agents.toml",
        "30-conditions.toml",
        "pins/incidents.toml",
    ] {
        let shipped = std::fs::read_to_string(root().join("policies").join(name)).unwrap();
        let copy = std::fs::read_to_string(k8s.join(name)).unwrap();
        assert_eq!(
            copy, shipped,
            "deploy/kubernetes/policies/{name} differs from policies/{name}: copy it again"
        );
    }
}

#[test]
fn kubectl_kustomize_renders_the_replicas() {
    let out = match Command::new("kubectl")
        .args(["kustomize"])
        .arg(root().join("deploy/kubernetes"))
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            panic!("kubectl is needed to render deploy/kubernetes (Debian: kubernetes-client): {e}")
        }
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let y = String::from_utf8_lossy(&out.stdout);
    for kind in [
        "StatefulSet",
        "Service",
        "PodDisruptionBudget",
        "ConfigMap",
        "Secret",
        "ServiceAccount",
    ] {
        assert!(
            y.contains(&format!("kind: {kind}\n")),
            "{kind} rendered:\n{y}"
        );
    }
    for line in [
        "replicas: 3",
        "readOnlyRootFilesystem: true",
        "runAsNonRoot: true",
        "allowPrivilegeEscalation: false",
        "path: /readyz",
        "path: /healthz",
        "port: admin",
        "mountPath: /var/lib/mcp-firewall/spool",
        "volumeClaimTemplates:",
        "maxUnavailable: 1",
        "name: mcp-firewall-secrets",
        "app.kubernetes.io/name: mcp-firewall",
    ] {
        assert!(y.contains(line), "{line:?} in the rendered manifests");
    }
    // Longer than the drain (and the preStop pause).
    let grace: u64 = y
        .lines()
        .find_map(|l| l.trim().strip_prefix("terminationGracePeriodSeconds: "))
        .and_then(|v| v.parse().ok())
        .expect("a grace period");
    let cfg = std::fs::read_to_string(root().join("deploy/kubernetes/config.toml")).unwrap();
    let drain_ms: u64 = cfg
        .lines()
        .find_map(|l| l.trim().strip_prefix("drain_timeout_ms = "))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("drain_timeout_ms");
    assert!(
        grace * 1000 > drain_ms + 5000,
        "grace {grace} s, drain {drain_ms} ms"
    );
}

#[test]
fn the_image_and_compose_start_what_works_as_shipped() {
    let docker = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    assert!(
        docker.contains(r#"CMD ["demo", "--listen", "0.0.0.0:8080", "--admin", "0.0.0.0:9090"]"#)
    );
    assert!(docker.contains("COPY config/compose.toml /etc/mcp-firewall/compose.toml"));
    // `demo` starts the estate from beside the firewall's binary.
    assert!(docker.contains("-p mcp-firewall -p mcp-demo-upstream"));
    assert!(docker.contains(
        "COPY --from=build /src/target/dist/mcp-demo-upstream /usr/local/bin/mcp-demo-upstream"
    ));
    let compose = std::fs::read_to_string(root().join("docker-compose.yml")).unwrap();
    for line in [
        "clickhouse/clickhouse-server:",
        r#"entrypoint: ["/usr/local/bin/mcp-demo-upstream"]"#,
        r#"command: ["--listen", "0.0.0.0:8081"]"#,
        r#"command: ["serve", "--config", "/etc/mcp-firewall/compose.toml"]"#,
        "condition: service_healthy",
    ] {
        assert!(compose.contains(line), "{line:?} in docker-compose.yml");
    }
    // The compose upstream is where compose.toml sends the firewall.
    let cfg = std::fs::read_to_string(root().join("config/compose.toml")).unwrap();
    assert!(cfg.contains(r#"url = "http://incidents:8081/mcp""#));
    assert!(cfg.contains(r#"url = "http://clickhouse:8123""#));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_upstream_serves_the_sample_estate_alone() {
    crate::common::install_crypto();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _child = Kill(
        Command::new(crate::common::estate_binary())
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .spawn()
            .unwrap(),
    );
    let url = format!("http://127.0.0.1:{port}/mcp");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "mcp-demo-upstream did not listen"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let client = crate::common::mcp::connect(
        &url,
        crate::common::mcp::TestClient::new(crate::common::mcp::Era::V2025_11_25),
    )
    .await;
    assert_eq!(client.list_all_tools().await.unwrap().len(), 14);
    client.cancel().await.ok();
}
