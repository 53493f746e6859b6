use super::*;
use crate::auth::Mode;

fn claims(exp: u64, audience: Audience) -> Arc<Claims> {
    Arc::new(Claims {
        sub: "s".into(),
        tenant_id: "t".into(),
        agent: "a".into(),
        run_id: "r".into(),
        mode: Mode::Agent,
        projects: Vec::new().into(),
        project_ceiling: None,
        scopes: vec!["mcp:tools".to_owned()].into(),
        jti: "j".into(),
        iss: "i".into(),
        exp,
        iat: exp - 60,
        nbf: None,
        run_exp: None,
        audience,
        kid: None,
        delegation: Vec::new().into(),
    })
}

#[test]
fn hit_returns_the_cached_claims() {
    let cache = TokenCache::new(8);
    let d = TokenDigest::of("token-a");
    let c = claims(1_000, Audience::Mcp);
    cache.insert(d, Arc::clone(&c), 900, 1);
    let got = cache.get(&d, Audience::Mcp, 900, 1).expect("hit");
    assert!(Arc::ptr_eq(&got, &c));
    assert!(cache
        .get(&TokenDigest::of("token-b"), Audience::Mcp, 900, 1)
        .is_none());
}

#[test]
fn entry_is_never_returned_at_or_past_exp() {
    let cache = TokenCache::new(8);
    let d = TokenDigest::of("t");
    cache.insert(d, claims(1_000, Audience::Mcp), 900, 1);
    assert!(cache.get(&d, Audience::Mcp, 999, 1).is_some());
    assert!(cache.get(&d, Audience::Mcp, 1_000, 1).is_none());
    assert_eq!(cache.len(), 0, "dead entry removed on the way");
}

#[test]
fn generation_change_invalidates() {
    let cache = TokenCache::new(8);
    let d = TokenDigest::of("t");
    cache.insert(d, claims(1_000, Audience::Mcp), 900, 1);
    assert!(cache.get(&d, Audience::Mcp, 900, 2).is_none());
    assert!(
        cache.get(&d, Audience::Mcp, 900, 1).is_none(),
        "removed, not just hidden"
    );
}

#[test]
fn other_audience_misses_without_evicting() {
    let cache = TokenCache::new(8);
    let d = TokenDigest::of("t");
    cache.insert(d, claims(1_000, Audience::Mcp), 900, 1);
    assert!(cache.get(&d, Audience::Admin, 900, 1).is_none());
    assert!(cache.get(&d, Audience::Mcp, 900, 1).is_some());
}

#[test]
fn already_expired_claims_are_not_inserted() {
    let cache = TokenCache::new(8);
    cache.insert(TokenDigest::of("t"), claims(1_000, Audience::Mcp), 1_000, 1);
    assert_eq!(cache.len(), 0);
}

#[test]
fn full_cache_drops_dead_entries_first() {
    let cache = TokenCache::new(4);
    for i in 0..3 {
        cache.insert(
            TokenDigest::of(&format!("dying-{i}")),
            claims(950, Audience::Mcp),
            900,
            1,
        );
    }
    let live = TokenDigest::of("live");
    cache.insert(live, claims(2_000, Audience::Mcp), 900, 1);
    assert_eq!(cache.len(), 4);
    // At 960 the three "dying" entries are dead; inserting sweeps them.
    cache.insert(TokenDigest::of("new"), claims(2_000, Audience::Mcp), 960, 1);
    assert_eq!(cache.len(), 2);
    assert!(
        cache.get(&live, Audience::Mcp, 960, 1).is_some(),
        "the live entry survived the sweep"
    );
}

#[test]
fn full_cache_of_live_entries_stays_bounded() {
    let cache = TokenCache::new(16);
    for i in 0..1_000 {
        cache.insert(
            TokenDigest::of(&format!("t-{i}")),
            claims(2_000, Audience::Mcp),
            900,
            1,
        );
        assert!(cache.len() <= 16);
    }
    let last = TokenDigest::of("t-999");
    assert!(
        cache.get(&last, Audience::Mcp, 900, 1).is_some(),
        "the newest entry is always kept"
    );
}

#[test]
fn zero_capacity_disables_the_cache() {
    let cache = TokenCache::new(0);
    assert!(!cache.enabled());
    cache.insert(TokenDigest::of("t"), claims(2_000, Audience::Mcp), 900, 1);
    assert_eq!(cache.len(), 0);
}

#[test]
fn digest_is_of_the_whole_token() {
    assert!(TokenDigest::of("a.b.c") != TokenDigest::of("a.b.d"));
    assert!(TokenDigest::of("a.b.c") == TokenDigest::of("a.b.c"));
}
