use super::*;

fn key(id: &str, secret: &str) -> SessionKey {
    SessionKey {
        id: id.to_owned(),
        secret: secret.as_bytes().to_vec(),
    }
}

fn sessions() -> Sessions {
    Sessions::new(&[key("k1", "0123456789abcdef0123456789abcdef")]).expect("keys")
}

const ALICE: Principal<'static> = Principal {
    issuer: "https://idp",
    tenant: "acme",
    subject: "alice",
    upstream: "incidents",
    run: "run-1",
};

#[test]
fn a_sealed_session_opens_for_its_principal_only() {
    let s = sessions();
    let sealed = s.seal(&ALICE, b"upstream-session-1");
    assert!(sealed.starts_with("s1.k1."), "{sealed}");
    assert!(sealed.bytes().all(|b| (0x21..=0x7e).contains(&b)));
    assert_eq!(
        s.open(&ALICE, sealed.as_bytes()).expect("opens"),
        b"upstream-session-1"
    );
    for other in [
        Principal {
            subject: "mallory",
            ..ALICE
        },
        Principal {
            tenant: "globex",
            ..ALICE
        },
        Principal {
            issuer: "https://other-idp",
            ..ALICE
        },
        Principal {
            upstream: "warehouse",
            ..ALICE
        },
        Principal {
            run: "run-2",
            ..ALICE
        },
    ] {
        assert_eq!(
            s.open(&other, sealed.as_bytes()),
            Err(SealError::Mismatch),
            "{other:?}"
        );
    }
}

#[test]
fn altered_forged_and_foreign_ids_are_refused() {
    let s = sessions();
    let sealed = s.seal(&ALICE, b"sid");
    // Another upstream id under the same tag.
    let parts: Vec<&str> = sealed.split('.').collect();
    let swapped = format!(
        "s1.k1.{}.{}",
        URL_SAFE_NO_PAD.encode(b"other-sid"),
        parts[3]
    );
    assert_eq!(s.open(&ALICE, swapped.as_bytes()), Err(SealError::Mismatch));
    // The upstream's raw id, an invented one, garbage.
    for bad in [
        "sid",
        "s1.k1.c2lk",
        "s1.k1.c2lk.AAAA",
        "s1..c2lk.AAAAAAAAAAAAAAAAAAAAAA",
        "",
    ] {
        assert!(s.open(&ALICE, bad.as_bytes()).is_err(), "{bad:?}");
    }
    // Sealed by a firewall with another key.
    let other = Sessions::new(&[key("k1", "another-secret-that-is-long-enough!!")]).expect("keys");
    assert_eq!(
        s.open(&ALICE, other.seal(&ALICE, b"sid").as_bytes()),
        Err(SealError::Mismatch)
    );
    let unknown = Sessions::new(&[key("k9", "0123456789abcdef0123456789abcdef")]).expect("keys");
    assert_eq!(
        s.open(&ALICE, unknown.seal(&ALICE, b"sid").as_bytes()),
        Err(SealError::UnknownKey)
    );
}

#[test]
fn replicas_with_the_same_keys_accept_each_other_and_keys_rotate() {
    let a = sessions();
    let b = sessions();
    assert_eq!(
        b.open(&ALICE, a.seal(&ALICE, b"sid").as_bytes())
            .expect("opens"),
        b"sid"
    );
    // A new key seals; the old one still opens what it sealed.
    let rotated = Sessions::new(&[
        key("k2", "a-new-secret-that-is-long-enough-too!"),
        key("k1", "0123456789abcdef0123456789abcdef"),
    ])
    .expect("keys");
    assert!(rotated.seal(&ALICE, b"sid").starts_with("s1.k2."));
    assert_eq!(
        rotated
            .open(&ALICE, a.seal(&ALICE, b"sid").as_bytes())
            .expect("old key opens"),
        b"sid"
    );
    assert!(!Sessions::new(&[]).expect("random").shared());
    assert!(a.shared());
}

#[test]
fn event_ids_carry_their_stream_context_within_their_session() {
    let s = sessions();
    let ctx = EventContext {
        due: vec![
            Due {
                id: Id::Number(7),
                method: "tools/list".into(),
            },
            Due {
                id: Id::String("a.b".into()),
                method: "tools/call".into(),
            },
        ],
        upstream_event_id: "stream-3/17".into(),
    };
    let sealed = s.seal_event(&ALICE, Some(b"sid"), &ctx).expect("fits");
    assert_eq!(
        s.open_event(&ALICE, Some(b"sid"), sealed.as_bytes())
            .expect("opens"),
        ctx
    );
    // Another session of the same principal, no session, another principal.
    assert_eq!(
        s.open_event(&ALICE, Some(b"sid2"), sealed.as_bytes()),
        Err(SealError::Mismatch)
    );
    assert_eq!(
        s.open_event(&ALICE, None, sealed.as_bytes()),
        Err(SealError::Mismatch)
    );
    let bob = Principal {
        subject: "bob",
        ..ALICE
    };
    assert_eq!(
        s.open_event(&bob, Some(b"sid"), sealed.as_bytes()),
        Err(SealError::Mismatch)
    );
    // A session id is not an event id and the other way round.
    assert!(s.open(&ALICE, sealed.as_bytes()).is_err());
    let session = s.seal(&ALICE, b"sid");
    assert!(s
        .open_event(&ALICE, Some(b"sid"), session.as_bytes())
        .is_err());
}

#[test]
fn a_context_too_large_is_not_sealed() {
    let s = sessions();
    let ctx = EventContext {
        due: Vec::new(),
        upstream_event_id: "x".repeat(MAX_EVENT_CONTEXT),
    };
    assert!(s.seal_event(&ALICE, None, &ctx).is_none());
}

#[test]
fn audit_names_are_stable_and_keyed() {
    let s = sessions();
    let n = s.audit_name(&ALICE, b"sid");
    assert_eq!(n.len(), 24);
    assert_eq!(n, s.audit_name(&ALICE, b"sid"));
    assert_ne!(n, s.audit_name(&ALICE, b"sid2"));
    assert!(!n.contains("sid"));
}

/// One table for every kind of state the firewall hands out: a forged
/// value, an altered one, another principal's, another run's and one of
/// another kind are refused; the value opens again for its owner (replay:
/// single use, where a value releases an action, is the caller's to
/// enforce: a `requestState`'s round is spent in the approvals store).
#[test]
fn every_sealed_kind_refuses_forged_altered_foreign_and_cross_kind_values() {
    type Open = fn(&Sessions, &Principal<'_>, &[u8]) -> Result<Vec<u8>, SealError>;
    let s = sessions();
    let other_keys = Sessions::new(&[key("k1", "fedcba9876543210fedcba9876543210")]).expect("keys");
    let ctx = EventContext {
        due: vec![Due {
            id: Id::Number(7),
            method: "tools/call".into(),
        }],
        upstream_event_id: "up-e1".into(),
    };
    let kinds: Vec<(&str, String, Open)> = vec![
        ("session", s.seal(&ALICE, b"sid"), |s, w, b| s.open(w, b)),
        (
            "event",
            s.seal_event(&ALICE, Some(b"sid"), &ctx).expect("fits"),
            |s, w, b| {
                s.open_event(w, Some(b"sid"), b)
                    .map(|c| c.upstream_event_id.into_bytes())
            },
        ),
        ("requestState", s.seal_state(&ALICE, b"{}"), |s, w, b| {
            s.open_state(w, b)
        }),
        ("task", s.seal_task(&ALICE, b"task-1"), |s, w, b| {
            s.open_task(w, b)
        }),
    ];
    for (i, (kind, sealed, open)) in kinds.iter().enumerate() {
        // Opens for its owner, as often as asked (replay).
        assert!(open(&s, &ALICE, sealed.as_bytes()).is_ok(), "{kind}");
        assert!(
            open(&s, &ALICE, sealed.as_bytes()).is_ok(),
            "{kind} replayed"
        );
        // Forged with another key of the same id.
        let forged = match *kind {
            "session" => other_keys.seal(&ALICE, b"sid"),
            "event" => other_keys
                .seal_event(&ALICE, Some(b"sid"), &ctx)
                .expect("fits"),
            "requestState" => other_keys.seal_state(&ALICE, b"{}"),
            _ => other_keys.seal_task(&ALICE, b"task-1"),
        };
        assert_eq!(
            open(&s, &ALICE, forged.as_bytes()),
            Err(SealError::Mismatch),
            "{kind} forged"
        );
        // Altered: every single character of the body or the tag.
        let bytes = sealed.as_bytes();
        let body_start = sealed.match_indices('.').nth(1).map_or(0, |(p, _)| p + 1);
        for at in body_start..bytes.len() {
            if bytes[at] == b'.' {
                continue;
            }
            let mut altered = bytes.to_vec();
            altered[at] = if altered[at] == b'A' { b'B' } else { b'A' };
            assert!(
                open(&s, &ALICE, &altered).is_err(),
                "{kind} altered at {at}"
            );
        }
        // Another principal's, another run's.
        for who in [
            Principal {
                subject: "mallory",
                ..ALICE
            },
            Principal {
                tenant: "globex",
                ..ALICE
            },
            Principal {
                run: "run-2",
                ..ALICE
            },
            Principal {
                upstream: "warehouse",
                ..ALICE
            },
        ] {
            assert_eq!(
                open(&s, &who, sealed.as_bytes()),
                Err(SealError::Mismatch),
                "{kind} {who:?}"
            );
        }
        // A value of another kind never opens as this one.
        for (j, (other, value, _)) in kinds.iter().enumerate() {
            if i != j {
                assert!(
                    open(&s, &ALICE, value.as_bytes()).is_err(),
                    "{other} opened as {kind}"
                );
            }
        }
    }
}

/// The tags are what earlier releases sealed with (a replica of another
/// release, or a value sealed before a restart, still opens): each an
/// HMAC-SHA256 of length-prefixed fields, truncated, written out here
/// without the module's helpers.
#[test]
fn tags_keep_their_bytes_across_releases() {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"k");
    let who = Principal {
        issuer: "i",
        tenant: "t",
        subject: "s",
        upstream: "u",
        run: "r",
    };
    let by_hand = |fields: &[&[u8]]| {
        let mut ctx = ring::hmac::Context::with_key(&key);
        for f in fields {
            ctx.update(&(f.len() as u32).to_be_bytes());
            ctx.update(f);
        }
        let tag = ctx.sign();
        tag.as_ref()[..TAG_BYTES].to_vec()
    };
    let who_fields: [&[u8]; 5] = [b"i", b"t", b"s", b"u", b"r"];
    let with = |domain: &[&[u8]], tail: &[&[u8]]| {
        let mut v: Vec<&[u8]> = domain.to_vec();
        v.extend_from_slice(&who_fields);
        v.extend_from_slice(tail);
        by_hand(&v)
    };
    assert_eq!(
        session_tag(&key, &who, b"x").to_vec(),
        with(&[b"mcp-firewall session v1"], &[b"x"])
    );
    assert_eq!(
        event_tag(&key, &who, Some(b"s1"), b"p").to_vec(),
        with(&[b"mcp-firewall event v1"], &[b"s1", b"p"])
    );
    assert_eq!(
        state_tag(&key, &who, b"p").to_vec(),
        with(&[b"mcp-firewall request state v1"], &[b"p"])
    );
    assert_eq!(
        task_tag(&key, &who, b"p").to_vec(),
        with(&[b"mcp-firewall task v1"], &[b"p"])
    );
    assert_eq!(
        virtual_tag(&key, VirtualKind::Cursor, &who, b"p").to_vec(),
        with(&[b"mcp-firewall virtual v1", b"vc1"], &[b"p"])
    );
}
