//! TLS: termination with a certificate from a test CA (rcgen), certificate
//! rotation without dropping open connections, and an `https` upstream
//! trusted through a configured CA file.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use serde_json::json;
use tokio::net::TcpListener;

use crate::common::{self, raw};

/// A CA and a function to issue server certificates for 127.0.0.1/localhost.
pub(crate) struct Ca {
    /// The CA certificate, PEM.
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// (certificate PEM, key PEM) for localhost and 127.0.0.1.
    pub fn issue(&self) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

fn client_trusting(ca_pem: &str) -> reqwest::Client {
    common::install_crypto();
    reqwest::Client::builder()
        .no_proxy()
        .tls_certs_only([reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap()])
        .pool_max_idle_per_host(1)
        .build()
        .unwrap()
}

fn tls_config(dir: &Path, upstream: &str) -> String {
    common::TestConfig::new()
        .upstream("u", upstream)
        .unset("server.plaintext")
        .set("server.tls.cert", common::toml_path(&dir.join("cert.pem")))
        .set("server.tls.key", common::toml_path(&dir.join("key.pem")))
        .set("server.tls.reload_interval_ms", 100)
        .text()
}

async fn ping(client: &reqwest::Client, url: &str) -> reqwest::Result<reqwest::Response> {
    client
        .post(url)
        .bearer_auth(common::token())
        .header("content-type", "application/json")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)
        .send()
        .await
}

#[tokio::test]
async fn tls_handshake_and_certificate_rotation_keep_connections() {
    let up = raw::upstream(|seen| async move { raw::result_for(&seen, json!({})) }).await;
    let dir = tempfile::tempdir().unwrap();
    let old_ca = Ca::new("old test CA");
    let (cert, key) = old_ca.issue();
    std::fs::write(dir.path().join("cert.pem"), cert).unwrap();
    std::fs::write(dir.path().join("key.pem"), key).unwrap();
    let fw = common::firewall(&tls_config(dir.path(), &up.url())).await;
    let url = format!("https://127.0.0.1:{}/mcp/u", fw.running.mcp_addr.port());

    let old_client = client_trusting(&old_ca.pem);
    let resp = ping(&old_client, &url)
        .await
        .expect("TLS handshake with the test CA");
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    // A client that does not trust the CA fails the handshake.
    let stranger = client_trusting(&Ca::new("other").pem);
    assert!(ping(&stranger, &url).await.is_err());

    // Rotate to a certificate from a new CA.
    let new_ca = Ca::new("new test CA");
    let (cert, key) = new_ca.issue();
    std::fs::write(dir.path().join("key.pem"), key).unwrap();
    std::fs::write(dir.path().join("cert.pem"), cert).unwrap();
    let new_client = client_trusting(&new_ca.pem);
    let mut rotated = false;
    for _ in 0..50 {
        if ping(&new_client, &url)
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            rotated = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(rotated, "new handshakes get the new certificate");
    // The connection opened under the old certificate is still served.
    let resp = ping(&old_client, &url)
        .await
        .expect("open connection kept across rotation");
    assert_eq!(resp.status(), 200);
    fw.stop().await;
}

#[tokio::test]
async fn https_upstream_with_a_custom_ca() {
    common::install_crypto();
    let ca = Ca::new("upstream CA");
    let (cert, key) = ca.issue();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.pem"), &ca.pem).unwrap();
    std::fs::write(dir.path().join("cert.pem"), &cert).unwrap();
    std::fs::write(dir.path().join("key.pem"), &key).unwrap();

    // A TLS upstream.
    let certified = mcp_firewall::internals::load_certified_key(
        &dir.path().join("cert.pem"),
        &dir.path().join("key.pem"),
    )
    .unwrap();
    let resolver = Arc::new(FixedCert(Arc::new(certified)));
    let mut server = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(raw::full(
                        200,
                        "application/json",
                        r#"{"jsonrpc":"2.0","id":1,"result":{"secure":true}}"#,
                    ))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                .await;
            });
        }
    });

    let url = format!("https://127.0.0.1:{port}/mcp");
    let without_ca = common::TestConfig::new().upstream("u", &url);
    let with_ca = without_ca
        .clone()
        .upstream_set(
            "u",
            "ca_file",
            common::toml_path(&dir.path().join("ca.pem")),
        )
        .text();
    let without_ca = without_ca.text();
    let fw = common::firewall(&with_ca).await;
    let resp = common::post_json(
        &fw.mcp_url("u"),
        r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
    )
    .await;
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["result"]["secure"], true, "{v}");
    fw.stop().await;

    // Without the CA the upstream's certificate is not trusted.
    let fw = common::firewall(&without_ca).await;
    let resp = common::post_json(
        &fw.mcp_url("u"),
        r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
    )
    .await;
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], -31004, "{v}");
    fw.stop().await;
}

#[derive(Debug)]
struct FixedCert(Arc<rustls::sign::CertifiedKey>);

impl rustls::server::ResolvesServerCert for FixedCert {
    fn resolve(
        &self,
        _: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }
}
