//! Tests of the load generator against the real canned upstream.

use std::sync::OnceLock;

use tokio::net::TcpListener;

use super::*;
use crate::catalog::Catalog;
use crate::scenario::Scenario;
use crate::tokens::Issuer;
use crate::upstream::{self, Answers};

fn tokens() -> Arc<Tokens> {
    static T: OnceLock<Arc<Tokens>> = OnceLock::new();
    T.get_or_init(|| {
        Arc::new(
            Issuer::generate()
                .unwrap()
                .tokens(10, Duration::from_secs(600))
                .unwrap(),
        )
    })
    .clone()
}

/// Starts the upstream (plain, and TLS when given) in this runtime.
async fn start(tls: Option<&crate::tls::Material>) -> (SocketAddr, Option<SocketAddr>, Catalog) {
    let catalog = Catalog::new(100, 310).unwrap();
    let answers = Arc::new(Answers::new(&catalog, Duration::from_millis(100)));
    let (stop, rx) = tokio::sync::watch::channel(false);
    std::mem::forget(stop);
    let plain = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let plain_addr = plain.local_addr().unwrap();
    tokio::spawn(upstream::serve(plain, None, answers.clone(), rx.clone()));
    let tls_addr = match tls {
        Some(m) => {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let a = l.local_addr().unwrap();
            let acceptor = tokio_rustls::TlsAcceptor::from(m.server().unwrap());
            tokio::spawn(upstream::serve(l, Some(acceptor), answers, rx));
            Some(a)
        }
        None => None,
    };
    (plain_addr, tls_addr, catalog)
}

fn spec(ep: Endpoint, scenario: Scenario, catalog: &Catalog) -> LoadSpec {
    LoadSpec {
        endpoint: ep,
        workload: Arc::new(Workload::new(scenario, catalog)),
        tokens: tokens(),
        firewall: false,
        concurrency: 4,
        h2_connections: 2,
        rate: None,
        warmup: Duration::from_millis(50),
        duration: Duration::from_millis(300),
        requests: None,
        timeout: Duration::from_secs(5),
        ticket_base: 0,
        calls_per_run: 1,
    }
}

fn plain(addr: SocketAddr, proto: Proto) -> Endpoint {
    Endpoint {
        addr,
        proto,
        tls: None,
        path: None,
    }
}

#[tokio::test]
async fn closed_loop_h1_records_every_measured_answer() {
    let (addr, _, catalog) = start(None).await;
    let mut phases = Vec::new();
    let r = run(
        spec(plain(addr, Proto::H1), Scenario::Call, &catalog),
        |p| phases.push(p),
    )
    .await
    .unwrap();
    assert!(r.ok > 50, "{r:?}");
    assert_eq!(r.failed, 0, "{:?}", r.errors);
    assert_eq!(r.histogram.len(), r.ok);
    assert_eq!(r.outcomes.get("call: result"), Some(&r.ok));
    assert!(phases.contains(&Phase::Warmup));
    assert_eq!(
        phases
            .iter()
            .filter(|p| matches!(p, Phase::Done(_)))
            .count(),
        1
    );
    assert!((0.25..0.6).contains(&r.elapsed.as_secs_f64()));
}

#[tokio::test]
async fn h2c_and_tls_h2_and_sse_lists_work() {
    let dir = tempfile::tempdir().unwrap();
    let m = crate::tls::Material::generate(dir.path()).unwrap();
    let (addr, tls_addr, catalog) = start(Some(&m)).await;
    let r = run(
        spec(plain(addr, Proto::H2), Scenario::List, &catalog),
        |_| {},
    )
    .await
    .unwrap();
    assert!(r.ok > 5 && r.failed == 0, "{:?}", r.errors);
    let ep = Endpoint {
        addr: tls_addr.unwrap(),
        proto: Proto::H2,
        tls: Some(m.client(&[b"h2"]).unwrap()),
        path: None,
    };
    let r = run(spec(ep, Scenario::CallSse, &catalog), |_| {})
        .await
        .unwrap();
    assert!(r.ok > 5 && r.failed == 0, "{:?}", r.errors);
    let ep = Endpoint {
        addr: tls_addr.unwrap(),
        proto: Proto::H1,
        tls: Some(m.client(&[b"http/1.1"]).unwrap()),
        path: None,
    };
    let r = run(spec(ep, Scenario::Batch, &catalog), |_| {})
        .await
        .unwrap();
    assert!(r.ok > 5 && r.failed == 0, "{:?}", r.errors);
}

#[tokio::test]
async fn firewall_expectations_fail_against_a_plain_upstream() {
    let (addr, _, catalog) = start(None).await;
    let mut s = spec(plain(addr, Proto::H1), Scenario::Denied, &catalog);
    s.firewall = true;
    let r = run(s, |_| {}).await.unwrap();
    assert_eq!(r.ok, 0);
    assert!(r.failed > 0);
    assert_eq!(
        r.errors.keys().collect::<Vec<_>>(),
        ["denied: got result, expected rpc error -31001"]
    );
}

#[tokio::test]
async fn open_loop_keeps_the_rate_and_measures_from_the_intended_time() {
    let (addr, _, catalog) = start(None).await;
    let mut s = spec(plain(addr, Proto::H1), Scenario::Call, &catalog);
    s.rate = Some(200.0);
    s.warmup = Duration::ZERO;
    s.duration = Duration::from_millis(500);
    let r = run(s, |_| {}).await.unwrap();
    assert!((70..=130).contains(&r.ok), "{}", r.ok);
    // Held answers (100 ms) at 2 in flight and 200/s cannot keep up: the
    // backlog shows in the latency, measured from when each was due.
    let mut s = spec(plain(addr, Proto::H1), Scenario::Streams, &catalog);
    s.rate = Some(200.0);
    s.concurrency = 2;
    s.warmup = Duration::ZERO;
    s.duration = Duration::from_millis(600);
    let r = run(s, |_| {}).await.unwrap();
    assert!(r.ok >= 6, "{}", r.ok);
    assert!(r.histogram.max() > 200_000, "max {} us", r.histogram.max());
}

#[tokio::test]
async fn request_limit_stops_the_round() {
    let (addr, _, catalog) = start(None).await;
    let mut s = spec(plain(addr, Proto::H1), Scenario::Call, &catalog);
    s.requests = Some(40);
    s.duration = Duration::from_secs(30);
    let r = run(s, |_| {}).await.unwrap();
    assert_eq!(r.ok + r.failed, 40);
    assert!(r.elapsed < Duration::from_secs(5));
}

#[tokio::test]
async fn a_closed_port_is_a_connect_error() {
    let port = crate::procs::free_port().unwrap();
    let catalog = Catalog::new(100, 310).unwrap();
    let ep = plain(SocketAddr::from(([127, 0, 0, 1], port)), Proto::H1);
    match run(spec(ep, Scenario::Call, &catalog), |_| {}).await {
        Err(LoadError::Connect { .. }) => {}
        other => panic!("expected a connect error, got {:?}", other.map(|r| r.ok)),
    }
}

#[tokio::test]
async fn a_path_override_sends_every_request_there() {
    let (addr, _, catalog) = start(None).await;
    for proto in [Proto::H1, Proto::H2] {
        // The canned upstream knows no `/mcp/vs3`: every answer is a 404.
        let mut ep = plain(addr, proto);
        ep.path = Some(Arc::from("/mcp/vs3"));
        let r = run(spec(ep, Scenario::List, &catalog), |_| {})
            .await
            .unwrap();
        assert_eq!(r.ok, 0);
        assert!(r.failed > 5);
        assert_eq!(
            r.errors.keys().collect::<Vec<_>>(),
            ["list: got http 404, expected tools 100"]
        );
        let mut ep = plain(addr, proto);
        ep.path = None;
        let mut s = spec(ep, Scenario::List, &catalog);
        s.requests = Some(3);
        let r = run(s, |_| {}).await.unwrap();
        assert_eq!(r.ok, 3, "{:?}", r.errors);
    }
}
