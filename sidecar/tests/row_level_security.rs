//! Per-user identity: a signed request names the end user (role + claims), the statement runs
//! as that role with the claims in `request.jwt.claims`, and Postgres row-level security
//! decides what each user sees and may write. The adversaries: a second user who wants the
//! first one's rows (cold, through the cache, through a shared single flight), a later request
//! on the same pooled session, and a caller that names a role it should not have.
//!
//! The sidecar logs in as `ferry_app`, the plain role scripts/demo.sql makes; Postgres's
//! own rows and `current_user` judge.

use ferry_testkit::{Client, PgServer, RedisServer, Sidecar, SECRET};
use serde_json::{json, Value};

struct Rls {
    pg: PgServer,
    _redis: RedisServer,
    _sidecar: Sidecar,
    client: Client,
}

fn start() -> Rls {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    pg.client()
        .batch_execute(
            // The demo schema's notes table and policy give way to this test's own.
            "DROP TABLE notes;
             CREATE TABLE notes (id serial PRIMARY KEY, owner text NOT NULL, body text NOT NULL);
             INSERT INTO notes (owner, body) VALUES ('alice', 'a1'), ('alice', 'a2'), ('bob', 'b1');
             CREATE ROLE app_user NOLOGIN;
             CREATE ROLE too_strong NOLOGIN BYPASSRLS;
             GRANT app_user, too_strong TO ferry_app;
             GRANT SELECT, INSERT ON notes TO app_user, too_strong, ferry_app;
             GRANT USAGE ON SEQUENCE notes_id_seq TO app_user, too_strong;
             ALTER TABLE notes ENABLE ROW LEVEL SECURITY;
             CREATE POLICY own ON notes TO app_user
               USING (owner = current_setting('request.jwt.claims', true)::json ->> 'sub')
               WITH CHECK (owner = current_setting('request.jwt.claims', true)::json ->> 'sub');
             CREATE POLICY sidecar_reads_all ON notes FOR SELECT TO ferry_app USING (true);",
        )
        .expect("set up the RLS schema");
    let mut config = ferry_testkit::sidecar::test_config(&redis, &pg);
    ferry_testkit::sidecar::as_demo_roles(&mut config, &pg);
    config.identity.roles = vec!["app_user".into(), "too_strong".into(), "ghost".into()];
    let named = |sql: &str| ferry_sidecar::config::NamedQuery {
        sql: sql.into(),
        ..Default::default()
    };
    config.queries.insert(
        "my_notes".into(),
        named("SELECT id, owner, body FROM notes ORDER BY id"),
    );
    // Slow enough that concurrent misses of two users overlap in time.
    config.queries.insert(
        "my_notes_slow".into(),
        named("SELECT id, owner, body FROM notes, pg_sleep(0.3) ORDER BY id"),
    );
    config.queries.insert(
        "whoami".into(),
        named(
            "SELECT current_user::text AS role, \
             current_setting('request.jwt.claims', true) AS claims",
        ),
    );
    config.queries.insert(
        "add_note".into(),
        named("INSERT INTO notes (owner, body) VALUES ($1, $2)"),
    );
    let sidecar = Sidecar::start(config);
    let client = Client::new(&sidecar.base_url(), SECRET);
    Rls {
        pg,
        _redis: redis,
        _sidecar: sidecar,
        client,
    }
}

fn as_user(sub: &str) -> Value {
    json!({"role": "app_user", "claims": {"sub": sub, "aud": "app"}})
}

fn bodies(answer: &Value) -> Vec<String> {
    answer["rows"]
        .as_array()
        .unwrap_or_else(|| panic!("rows in {answer}"))
        .iter()
        .map(|r| r["body"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn read(c: &Client, query: &str, who: Option<Value>, cache: Value) -> (Vec<String>, String) {
    let mut body = json!({"query": query, "cache": cache});
    if let Some(who) = who {
        body["identity"] = who;
    }
    let a = c.query(body);
    assert_eq!(a.status, 200, "{}", a.body);
    (
        bodies(&a.body),
        a.body["cache"].as_str().unwrap_or("").into(),
    )
}

#[test]
fn each_user_sees_only_their_rows_cold_and_cached() {
    let s = start();
    let c = &s.client;
    let cached = json!({"ttl_s": 60, "tags": ["notes"]});
    let alice = || Some(as_user("alice"));
    let bob = || Some(as_user("bob"));
    let a1a2 = vec!["a1".to_string(), "a2".to_string()];
    let b1 = vec!["b1".to_string()];
    assert_eq!(
        read(c, "my_notes", alice(), cached.clone()),
        (a1a2.clone(), "miss".into())
    );
    // Bob asks for the very same statement and parameters: never Alice's entry.
    assert_eq!(
        read(c, "my_notes", bob(), cached.clone()),
        (b1.clone(), "miss".into())
    );
    assert_eq!(
        read(c, "my_notes", alice(), cached.clone()),
        (a1a2.clone(), "hit".into())
    );
    assert_eq!(
        read(c, "my_notes", bob(), cached.clone()),
        (b1.clone(), "hit".into())
    );
    // Other claims are another scope too, even under the same subject.
    let other_aud = Some(json!({"role": "app_user", "claims": {"sub": "alice", "aud": "x"}}));
    assert_eq!(read(c, "my_notes", other_aud, cached.clone()).1, "miss");
    // The sidecar's own role (no identity) has its own entry: all three rows.
    assert_eq!(read(c, "my_notes", None, cached.clone()).0.len(), 3);

    // A write by Alice, invalidating the tag: her next read is fresh, Bob's unchanged.
    let w = c.execute(json!({
        "query": "add_note", "params": ["alice", "a3"], "identity": as_user("alice"),
        "invalidate": {"tags": ["notes"]}
    }));
    assert_eq!(w.status, 200, "{}", w.body);
    let (rows, status) = read(c, "my_notes", alice(), cached.clone());
    assert_eq!((rows.len(), status.as_str()), (3, "miss"));
    assert_eq!(read(c, "my_notes", bob(), cached.clone()).0, b1);

    // Concurrent misses of both users at once (no-cache forces a fill each time): a single
    // flight is never shared across users.
    let answers = c.block_on(async {
        let all = (0..24).map(|i| {
            let who = if i % 2 == 0 { "alice" } else { "bob" };
            let body = json!({
                "query": "my_notes_slow", "identity": as_user(who),
                "cache": {"ttl_s": 60, "mode": "no-cache"}
            });
            async move { (who, c.query_async(body).await) }
        });
        futures::future::join_all(all).await
    });
    for (who, a) in answers {
        assert_eq!(a.status, 200, "{}", a.body);
        let owners: Vec<&str> = a.body["rows"]
            .as_array()
            .expect("rows")
            .iter()
            .map(|r| r["owner"].as_str().unwrap_or(""))
            .collect();
        assert!(
            !owners.is_empty() && owners.iter().all(|o| *o == who),
            "{who} got {owners:?}"
        );
    }
}

#[test]
fn a_session_comes_back_as_the_sidecar_after_an_identity() {
    let s = start();
    let c = &s.client;
    // Identity reads and writes over every session the pools hold (both paths), then plain
    // reads: each must run as the login role with no claims left behind.
    c.block_on(async {
        let all = (0..40).map(|i| {
            let sub = format!("user{i}");
            c.query_async(json!({"query": "whoami", "identity": as_user(&sub)}))
        });
        for a in futures::future::join_all(all).await {
            assert_eq!(a.status, 200, "{}", a.body);
            assert_eq!(a.body["rows"][0]["role"], "app_user");
            assert!(a.body["rows"][0]["claims"]
                .as_str()
                .is_some_and(|cl| cl.contains("\"sub\":\"user")));
        }
    });
    for i in 0..5 {
        let w = c.execute(json!({
            "query": "add_note", "params": ["w", format!("w{i}")],
            "identity": json!({"role": "app_user", "claims": {"sub": "w"}})
        }));
        assert_eq!(w.status, 200, "{}", w.body);
    }
    let answers = c.block_on(async {
        let all = (0..40).map(|_| c.query_async(json!({"query": "whoami"})));
        futures::future::join_all(all).await
    });
    for a in answers {
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.body["rows"][0]["role"], "ferry_app", "{}", a.body);
        let claims = &a.body["rows"][0]["claims"];
        assert!(
            claims.is_null() || claims == "",
            "claims left on the session: {claims}"
        );
    }
}

#[test]
fn writes_are_held_to_the_policy() {
    let s = start();
    let c = &s.client;
    let count = |owner: &str| -> i64 {
        s.pg.client()
            .query_one("SELECT count(*) FROM notes WHERE owner = $1", &[&owner])
            .expect("count")
            .get(0)
    };
    // Alice writing a row for Bob: Postgres's WITH CHECK refuses it.
    let w = c.execute(json!({
        "query": "add_note", "params": ["bob", "forged"], "identity": as_user("alice")
    }));
    assert_eq!(w.status, 400, "{}", w.body);
    assert_eq!(w.code(), "sql_error");
    assert_eq!(w.body["error"]["pg_code"], "42501");
    assert_eq!(count("bob"), 1, "no forged row");
    let ok = c.execute(json!({
        "query": "add_note", "params": ["alice", "mine"], "identity": as_user("alice")
    }));
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(count("alice"), 3);
}

#[test]
fn identities_the_sidecar_does_not_allow_are_refused() {
    let s = start();
    let c = &s.client;
    let notes = || -> i64 {
        s.pg.client()
            .query_one("SELECT count(*) FROM notes", &[])
            .expect("count")
            .get(0)
    };
    let refused = |body: Value, status: u16, code: &str| {
        let a = c.execute(body.clone());
        assert_eq!((a.status, a.code()), (status, code), "{body} → {}", a.body);
        a
    };
    let write = |who: Value| json!({"query": "add_note", "params": ["x", "y"], "identity": who});
    // Roles outside identity.roles, including the login role and a superuser's.
    for role in ["postgres", "ferry_app", "APP_USER", ""] {
        refused(
            write(json!({"role": role, "claims": {}})),
            403,
            "role_not_allowed",
        );
    }
    // Raw SQL could end the role: refused unless identity.allow_raw_sql.
    let raw = c.query(json!({"sql": "SELECT 1 AS one", "identity": as_user("alice")}));
    assert_eq!(
        (raw.status, raw.body["error"]["field"].as_str()),
        (400, Some("sql"))
    );
    // A named entry cannot keep users apart.
    let keyed = c.query(json!({
        "query": "my_notes", "identity": as_user("alice"), "cache": {"ttl_s": 60, "key": "notes"}
    }));
    assert_eq!(keyed.body["error"]["field"], "cache.key", "{}", keyed.body);
    // Claims are bounded, and an identity has no other fields.
    let huge = json!({"role": "app_user", "claims": {"pad": "x".repeat(9000)}});
    refused(write(huge), 400, "invalid_value");
    refused(
        write(json!({"role": "app_user", "claims": {}, "superuser": true})),
        400,
        "bad_request",
    );
    // A role in the config that Postgres would not hold to its policies (BYPASSRLS), and
    // one that does not exist: refused by the sidecar, no detail to the caller.
    for role in ["too_strong", "ghost"] {
        let a = refused(write(json!({"role": role, "claims": {}})), 500, "internal");
        assert_eq!(a.body["error"]["message"], "internal error");
        let r = c.query(json!({"query": "my_notes", "identity": {"role": role, "claims": {}}}));
        assert_eq!(r.status, 500, "{}", r.body);
    }
    assert_eq!(notes(), 3, "no refused write reached the table");
}

#[test]
fn transactions_run_as_their_user_and_stay_theirs() {
    let s = start();
    let c = &s.client;
    let owners = || -> Vec<String> {
        s.pg.client()
            .query("SELECT owner FROM notes ORDER BY id", &[])
            .expect("rows")
            .iter()
            .map(|r| r.get(0))
            .collect()
    };
    // One request, two statements, as Alice: her write, then her view of the table.
    let t = c.block_on(c.post(
        "/v1/transaction",
        &json!({"identity": as_user("alice"), "statements": [
            {"query": "add_note", "params": ["alice", "in a transaction"]},
            {"query": "my_notes"}
        ]}),
    ));
    assert_eq!(t.status, 200, "{}", t.body);
    let seen: Vec<&str> = t.body["results"][1]["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r["owner"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(seen, ["alice", "alice", "alice"]);
    // A forged row fails its statement; the whole transaction rolls back.
    let forged = c.block_on(c.post(
        "/v1/transaction",
        &json!({"identity": as_user("alice"), "statements": [
            {"query": "add_note", "params": ["alice", "rolled back"]},
            {"query": "add_note", "params": ["bob", "forged"]}
        ]}),
    ));
    assert_eq!(
        (forged.status, forged.body["error"]["statement"].clone()),
        (400, json!(1))
    );
    assert_eq!(owners(), ["alice", "alice", "bob", "alice"]);

    // Interactive, begun as Alice: her statements see her rows; nobody else can use the id.
    let b = c.block_on(c.post(
        "/v1/transaction/begin",
        &json!({"identity": as_user("alice")}),
    ));
    assert_eq!(b.status, 200, "{}", b.body);
    let id = b.body["id"].as_str().expect("id").to_string();
    let q = |who: Option<Value>| {
        let mut body = json!({"id": id, "query": "my_notes"});
        if let Some(w) = who {
            body["identity"] = w;
        }
        c.block_on(c.post("/v1/transaction/query", &body))
    };
    let mine = q(Some(as_user("alice")));
    assert_eq!(mine.status, 200, "{}", mine.body);
    assert_eq!(mine.body["rows"].as_array().map(Vec::len), Some(3));
    for (what, who) in [("bob", Some(as_user("bob"))), ("no identity", None)] {
        let r = q(who.clone());
        assert_eq!(
            (r.status, r.code()),
            (404, "transaction_not_found"),
            "{what}"
        );
        let mut end = json!({"id": id});
        if let Some(w) = who {
            end["identity"] = w;
        }
        let e = c.block_on(c.post("/v1/transaction/commit", &end));
        assert_eq!(e.status, 404, "{what}: {}", e.body);
    }
    let done = c.block_on(c.post(
        "/v1/transaction/commit",
        &json!({"id": id, "identity": as_user("alice")}),
    ));
    assert_eq!(done.status, 200, "{}", done.body);
    // And the session it held is the sidecar's again.
    let who = c.query(json!({"query": "whoami"}));
    assert_eq!(who.body["rows"][0]["role"], "ferry_app", "{}", who.body);
}
