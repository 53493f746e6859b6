//! Tests of the workloads: proportions, bodies the firewall accepts,
//! expectations per target.

use mcp_firewall::mcp::jsonrpc;

use super::*;

fn catalog() -> Catalog {
    Catalog::new(100, 310).unwrap()
}

#[test]
fn interleave_keeps_weights_and_spreads_them() {
    let seq = interleave(&[50, 10, 5, 5, 5, 10, 5, 10]);
    assert_eq!(seq.len(), 100);
    let count = |i: u8| seq.iter().filter(|&&x| x == i).count();
    assert_eq!(count(0), 50);
    assert_eq!(count(1), 10);
    assert_eq!(count(7), 10);
    // Spread: the heaviest never runs more than twice in a row at 50 %.
    let longest = seq.split(|&x| x != 0).map(<[u8]>::len).max().unwrap();
    assert!(longest <= 2, "{seq:?}");
    assert_eq!(interleave(&[1]), vec![0]);
}

#[test]
fn every_scenario_name_round_trips() {
    for s in Scenario::ALL {
        assert_eq!(Scenario::parse(s.name()), Ok(s));
    }
    assert!(Scenario::parse("nope").is_err());
}

#[test]
fn every_body_is_valid_json_rpc_for_the_firewall_parser() {
    let limits = jsonrpc::Limits::default();
    for s in Scenario::ALL {
        let w = Workload::new(s, &catalog());
        for t in &w.templates {
            let env =
                jsonrpc::parse(&t.body, &limits).unwrap_or_else(|e| panic!("{s}/{}: {e}", t.label));
            assert_eq!(env.batch, t.label == "batch", "{}", t.label);
            assert_eq!(
                t.version.is_none(),
                env.batch,
                "only the batch omits the revision"
            );
        }
    }
}

#[test]
fn firewall_expectations_differ_from_plain_targets_where_it_decides() {
    let c = catalog();
    let one = |s| Workload::new(s, &c).templates.remove(0);
    assert_eq!(one(Scenario::Denied).firewall, Expect::Error(DENIED));
    assert_eq!(one(Scenario::Denied).plain, Expect::Result);
    assert_eq!(
        one(Scenario::Gated).firewall,
        Expect::Error(APPROVAL_REQUIRED)
    );
    assert_eq!(one(Scenario::Gated).pool, Pool::Operator);
    assert_eq!(one(Scenario::List).plain, Expect::Tools(100));
    assert_eq!(one(Scenario::List).firewall, Expect::Tools(50));
    assert_eq!(one(Scenario::StepCapped).firewall, Expect::ResultOrSkipped);
    assert_eq!(
        one(Scenario::Batch).firewall,
        Expect::Batch {
            results: 3,
            errors: 1
        }
    );
    assert_eq!(one(Scenario::Streams).route, Route::Hold);
    assert_eq!(one(Scenario::CallSse).route, Route::Sse);
}

#[test]
fn pick_cycles_through_the_mix_in_order() {
    let w = Workload::new(Scenario::Mix, &catalog());
    assert_eq!(w.templates.len(), 8);
    let first: Vec<usize> = (0..100).map(|t| w.pick(t).0).collect();
    let again: Vec<usize> = (100..200).map(|t| w.pick(t).0).collect();
    assert_eq!(first, again);
    assert_eq!(
        first
            .iter()
            .filter(|&&i| w.templates[i].label == "list")
            .count(),
        5
    );
    let single = Workload::new(Scenario::Call, &catalog());
    assert_eq!(single.pick(12345).0, 0);
}

#[test]
fn the_cold_list_differs_from_the_warm_one_only_in_its_route() {
    let c = catalog();
    let one = |s| Workload::new(s, &c).templates.remove(0);
    let (warm, cold) = (one(Scenario::List), one(Scenario::ListCold));
    assert_eq!(cold.route, Route::Fresh);
    assert_eq!(warm.route, Route::Json);
    assert_eq!(cold.body, warm.body);
    assert_eq!((cold.plain, cold.firewall), (warm.plain, warm.firewall));
    assert_eq!(Route::Fresh.path(), crate::upstream::ROUTE_FRESH);
    assert_eq!(ROUTES.map(Route::index), [0, 1, 2, 3]);
    assert_eq!(
        Scenario::ListCold.label(),
        "list-cold (view rebuilt per request)"
    );
    assert_eq!(Scenario::List.label(), "list (warm view cache)");
    assert_eq!(Scenario::Call.label(), "call");
    // The scale scenario reads with its own runs; memory cells start fresh.
    let scale = one(Scenario::Scale);
    assert_eq!((scale.pool, scale.route), (Pool::Scale, Route::Json));
    assert_eq!(scale.firewall, Expect::Result);
    assert_eq!(Scenario::Streams.instances(), Instances::FreshPerRound);
    assert_eq!(Scenario::Scale.instances(), Instances::FreshPerCell);
    assert_eq!(Scenario::List.instances(), Instances::Shared);
}
