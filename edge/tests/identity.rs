//! Per-user data end to end: the Worker in workerd verifies each end user's JWT and the sidecar
//! runs their statements as them, so Postgres row-level security (scripts/demo.sql's policy on
//! `notes`) decides what they see. The adversaries: another signed-in user, a forged, expired
//! or `alg: none` token, a token naming a role of its choosing, and an anonymous client.
//! Postgres's rows judge.
use ferry_edge::jwt::sign_hs256;
use ferry_testkit::{self as kit, client::Answer, Client, Stack, WranglerDev};
use serde_json::{json, Value};

fn token(claims: Value) -> String {
    sign_hs256(&claims, kit::JWT_SECRET.as_bytes())
}

fn user(sub: &str) -> String {
    token(json!({"sub": sub, "exp": kit::client::now_s() + 600}))
}

fn get(c: &Client, jwt: Option<&str>) -> Answer {
    let auth: Vec<(&str, String)> = jwt
        .map(|t| vec![("authorization", format!("Bearer {t}"))])
        .unwrap_or_default();
    c.raw("GET", "/me/notes", Vec::new(), &auth)
}

fn post(c: &Client, jwt: &str, body: Value) -> Answer {
    c.raw(
        "POST",
        "/me/notes",
        body.to_string().into_bytes(),
        &[("authorization", format!("Bearer {jwt}"))],
    )
}

fn bodies(a: &Answer) -> Vec<String> {
    a.body["notes"]
        .as_array()
        .unwrap_or_else(|| panic!("notes in {}", a.body))
        .iter()
        .map(|n| n["body"].as_str().unwrap_or("").to_string())
        .collect()
}

#[test]
fn each_signed_in_user_sees_only_their_own_notes() {
    let stack = Stack::start();
    let edge = WranglerDev::start(&stack.sidecar.base_url(), kit::SECRET, 5_000);
    let c = Client::new(&edge.url(), kit::SECRET);
    let (alice, bob) = (user("alice"), user("bob"));
    let owners = |o: &str| -> i64 {
        stack
            .pg
            .client()
            .query_one("SELECT count(*) FROM notes WHERE owner = $1", &[&o])
            .expect("count")
            .get(0)
    };

    let a = get(&c, Some(&alice));
    assert_eq!(a.status, 200, "{}\n{}", a.body, edge.log());
    assert_eq!(bodies(&a), ["alice's first note", "alice's second note"]);
    assert_eq!(a.body["cache"], "miss");
    let b = get(&c, Some(&bob));
    assert_eq!(
        (bodies(&b), b.body["cache"].clone()),
        (vec!["bob's note".to_string()], json!("miss"))
    );
    assert_eq!(get(&c, Some(&alice)).body["cache"], "hit");
    let b = get(&c, Some(&bob));
    assert_eq!(
        (bodies(&b), b.body["cache"].clone()),
        (vec!["bob's note".to_string()], json!("hit"))
    );

    // Alice writes: the note is hers (the owner comes from her verified claims), her next
    // read is fresh, Bob's cached notes are untouched.
    let w = post(&c, &alice, json!({"body": "written at the edge"}));
    assert_eq!(w.status, 201, "{}", w.body);
    assert_eq!(owners("alice"), 3);
    let a = get(&c, Some(&alice));
    assert_eq!(
        (bodies(&a).len(), a.body["cache"].clone()),
        (3, json!("miss"))
    );
    let b = get(&c, Some(&bob));
    assert_eq!(
        (bodies(&b).len(), b.body["cache"].clone()),
        (1, json!("hit"))
    );

    // Tokens that must not get in: 401, and nothing written.
    let now = kit::client::now_s();
    let wrong_key = sign_hs256(&json!({"sub": "alice", "exp": now + 600}), &[b'k'; 32]);
    let expired = token(json!({"sub": "alice", "exp": now - 120}));
    let parts: Vec<&str> = alice.split('.').collect();
    let none_header = "eyJhbGciOiJub25lIn0"; // {"alg":"none"}
    let alg_none = format!("{none_header}.{}.", parts[1]);
    let bob_payload = bob.split('.').nth(1).unwrap_or_default().to_string();
    let swapped = format!("{}.{bob_payload}.{}", parts[0], parts[2]);
    for (what, jwt) in [
        ("wrong key", Some(wrong_key.as_str())),
        ("expired", Some(expired.as_str())),
        ("alg none", Some(alg_none.as_str())),
        ("payload swapped", Some(swapped.as_str())),
        ("garbage", Some("not.a.jwt")),
        ("missing", None),
    ] {
        let r = get(&c, jwt);
        assert_eq!(
            (r.status, r.code()),
            (401, "unauthorized"),
            "{what}: {}",
            r.body
        );
        if let Some(jwt) = jwt {
            let w = post(&c, jwt, json!({"body": "sneaked in"}));
            assert_eq!(w.status, 401, "{what}: {}", w.body);
        }
    }
    // A validly signed token that names a role the sidecar does not allow.
    let superuser = token(json!({"sub": "alice", "role": "postgres", "exp": now + 600}));
    let r = get(&c, Some(&superuser));
    assert_eq!(
        (r.status, r.code()),
        (403, "role_not_allowed"),
        "{}",
        r.body
    );
    assert_eq!(
        (owners("alice"), owners("bob")),
        (3, 1),
        "no refused write landed"
    );
}

#[test]
fn one_user_flooding_gets_429_with_retry_after_through_the_edge() {
    // One request a second, five at once: 80 at once cannot all pass, however slow the machine.
    let stack = Stack::start_with(|c| {
        c.identity.rate_per_s = 1;
        c.identity.burst = 5;
    });
    let edge = WranglerDev::start(&stack.sidecar.base_url(), kit::SECRET, 5_000);
    let c = Client::new(&edge.url(), kit::SECRET);
    let carol = user("carol");
    let answers = c.block_on(async {
        let auth = [("authorization", format!("Bearer {carol}"))];
        let all = (0..80).map(|_| c.send_raw("GET", "/me/notes", Vec::new(), &auth));
        futures::future::join_all(all).await
    });
    let ok = answers.iter().filter(|a| a.status == 200).count();
    let limited: Vec<&Answer> = answers.iter().filter(|a| a.status == 429).collect();
    assert_eq!(ok + limited.len(), 80, "only 200s and 429s");
    assert!((5..40).contains(&ok), "{ok} admitted of 80");
    for a in &limited {
        assert_eq!(a.code(), "rate_limited");
        assert!(a.headers.contains_key("retry-after"), "{:?}", a.headers);
    }
    // Another user is not held back by Carol.
    assert_eq!(get(&c, Some(&user("bob"))).status, 200);
}
