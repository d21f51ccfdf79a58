//! Reads cached with no tables named: Postgres's own parse says what each one reads, and only
//! what the change stream can keep fresh is cached. The adversaries are a writer that bypasses
//! Ferry (psql) on every table a read reaches through a view, a join, a subquery or a CTE;
//! statements whose result changes with no write (`now()`, `random()`) or that read what the
//! stream does not watch; and schema changes the stream does not carry (`CREATE OR REPLACE
//! VIEW`, `DROP VIEW`). Against the binary, requests as the least-privilege `ferry_app`, a
//! private Postgres with `wal_level = logical`; Postgres's rows judge what is fresh.
mod change_stream_common;
mod inferred_common;

use change_stream_common::after_bound;
use ferry_testkit::{wait_until, SidecarProcess};
use inferred_common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

#[test]
fn inferred_reads_stay_fresh_through_views_joins_subqueries_and_ctes() {
    let (_redis, pg, s) = stack();
    let mut psql = pg.client();

    // A view over a view over a join: both base tables are its dependencies.
    let page = "SELECT name, title FROM author_page WHERE id = $1 ORDER BY title";
    let first = read(&s, page, json!([1]));
    assert_eq!(first.body.get("bypass_reason"), None, "{:?}", first.body);
    until_hit(&s, page, json!([1]), |rows| {
        assert_eq!(rows[0]["title"], "first")
    });
    // The second table of the join, written by psql through the base table.
    psql.execute("UPDATE posts SET title = 'a first' WHERE id = 1", &[])
        .expect("update posts");
    after_bound(Instant::now());
    assert_eq!(
        read(&s, page, json!([1])).body["rows"][0]["title"],
        "a first"
    );
    until_hit(&s, page, json!([1]), |rows| {
        assert_eq!(rows[0]["title"], "a first")
    });
    // The first table.
    psql.execute("UPDATE authors SET name = 'ada l' WHERE id = 1", &[])
        .expect("update authors");
    after_bound(Instant::now());
    assert_eq!(read(&s, page, json!([1])).body["rows"][0]["name"], "ada l");

    // A CTE and a subquery: a row inserted into the table they read inside.
    let cte = "WITH n AS (SELECT author_id, count(*)::int AS posts FROM posts GROUP BY 1) \
               SELECT posts FROM n WHERE author_id = $1";
    let sub = "SELECT count(*)::int AS n FROM authors \
               WHERE id IN (SELECT author_id FROM posts WHERE title LIKE $1)";
    until_hit(&s, cte, json!([2]), |rows| assert_eq!(rows[0]["posts"], 1));
    until_hit(&s, sub, json!(["new%"]), |rows| assert_eq!(rows[0]["n"], 0));
    psql.execute("INSERT INTO posts VALUES (4, 2, 'new one')", &[])
        .expect("insert");
    after_bound(Instant::now());
    assert_eq!(read(&s, cte, json!([2])).body["rows"][0]["posts"], 2);
    assert_eq!(read(&s, sub, json!(["new%"])).body["rows"][0]["n"], 1);

    // An inheritance child's rows are the parent's: a write to the child reaches a read of
    // the parent.
    let family = "SELECT count(*)::int AS n FROM parent";
    until_hit(&s, family, json!([]), |rows| assert_eq!(rows[0]["n"], 2));
    psql.execute("INSERT INTO child VALUES (3, 'c2')", &[])
        .expect("insert child");
    after_bound(Instant::now());
    assert_eq!(read(&s, family, json!([])).body["rows"][0]["n"], 3);

    // What the stream cannot keep fresh is never cached, and says why.
    for (sql, why) in [
        (
            "SELECT CURRENT_TIMESTAMP::text AS t FROM authors WHERE id = 1",
            "the current date or time",
        ),
        (
            "SELECT 'now'::timestamptz::text AS t FROM authors WHERE id = 1",
            "such as 'now'",
        ),
        (
            "SELECT count(*)::int AS n FROM posts TABLESAMPLE BERNOULLI (50)",
            "TABLESAMPLE",
        ),
        (
            "SELECT now()::text AS t FROM authors WHERE id = 1",
            "stable now()",
        ),
        (
            "SELECT random() AS r FROM authors WHERE id = 1",
            "volatile random()",
        ),
        (
            "SELECT note FROM audit WHERE id = 1",
            "public.audit, which the change stream",
        ),
        (
            "SELECT count(*)::int AS n FROM pg_class",
            "system catalog pg_catalog.pg_class",
        ),
    ] {
        for _ in 0..3 {
            let a = read(&s, sql, json!([]));
            assert_eq!(a.body["cache"], "bypass", "{sql}: {:?}", a.body);
            let reason = a.body["bypass_reason"].as_str().unwrap_or_default();
            assert!(reason.contains(why), "{sql}: {reason}");
        }
    }
    // The unwatched table's rows are Postgres's own, every time.
    psql.execute("UPDATE audit SET note = 'changed' WHERE id = 1", &[])
        .expect("audit");
    let a = read(&s, "SELECT note FROM audit WHERE id = 1", json!([]));
    assert_eq!(a.body["rows"][0]["note"], "changed");

    // `only-if-cached` never touches Postgres: a read that is never cached says why.
    let never = s.client.query(json!({"sql": "SELECT now() AS t",
                                      "cache": {"ttl_s": 60, "mode": "only-if-cached"}}));
    assert_eq!(
        (never.status, never.code()),
        (404, "not_cached"),
        "{:?}",
        never.body
    );
    let message = never.body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("never cached: it calls stable now()"),
        "{message}"
    );

    // `infer: false` keeps the old rule: TTL only, whoever writes.
    let ttl_only = |s: &SidecarProcess| {
        s.client
            .query(json!({"sql": "SELECT note FROM audit WHERE id = 1",
                              "cache": {"ttl_s": 600, "infer": false}}))
    };
    ttl_only(&s);
    assert_eq!(ttl_only(&s).body["cache"], "hit");

    let counted = |series: &str| s.metric(series).unwrap_or(0.0);
    assert!(counted("ferry_inferred_total{outcome=\"bypass\",reason=\"function\"}") >= 6.0);
    assert!(counted("ferry_inferred_total{outcome=\"bypass\",reason=\"unwatched\"}") >= 3.0);
    assert!(counted("ferry_inferred_total{outcome=\"cached\",reason=\"\"}") >= 10.0);
}

#[test]
fn schema_changes_outside_ferry_reach_inferred_entries() {
    let (_redis, pg, s) = stack();
    let mut psql = pg.client();
    let page = "SELECT * FROM author_page WHERE id = $1 ORDER BY title";
    until_hit(&s, page, json!([2]), |rows| {
        assert_eq!(rows[0]["name"], "bob")
    });

    // Redefined: same tables, another result. Not in the change stream.
    psql.batch_execute(
        "CREATE OR REPLACE VIEW author_posts AS
           SELECT a.id, upper(a.name) AS name, p.title
             FROM authors a JOIN posts p ON p.author_id = a.id",
    )
    .expect("replace view");
    let changed = Instant::now();
    wait_until("the new definition", Duration::from_secs(10), || {
        read(&s, page, json!([2])).body["rows"][0]["name"] == "BOB"
    });
    let took = changed.elapsed();
    // Within the schema check's period (1 s) and a round of the background work, on a
    // loaded machine: far from the 600 s TTL the entry had.
    assert!(took < Duration::from_secs(5), "took {took:?}");
    for _ in 0..5 {
        assert_eq!(read(&s, page, json!([2])).body["rows"][0]["name"], "BOB");
    }
    until_hit(&s, page, json!([2]), |rows| {
        assert_eq!(rows[0]["name"], "BOB")
    });

    // A schema's privilege revoked: refused as Postgres refuses it, never served from the
    // entry filled while it was granted.
    let secret = "SELECT s FROM sx.secret WHERE id = $1";
    until_hit(&s, secret, json!([1]), |rows| {
        assert_eq!(rows[0]["s"], "topsecret")
    });
    psql.batch_execute("REVOKE USAGE ON SCHEMA sx FROM ferry_app")
        .expect("revoke");
    wait_until(
        "the revoked schema refused",
        Duration::from_secs(10),
        || {
            let a = s
                .client
                .query(json!({"sql": secret, "params": [1], "cache": {"ttl_s": 600}}));
            assert!(a.status == 200 || a.status == 400, "{:?}", a.body);
            a.status == 400
        },
    );
    for _ in 0..3 {
        let a = s
            .client
            .query(json!({"sql": secret, "params": [1], "cache": {"ttl_s": 600}}));
        assert_eq!(a.status, 400, "{:?}", a.body);
    }

    // Dropped: the read fails as Postgres says, never served from the old entry.
    psql.batch_execute("DROP VIEW author_page")
        .expect("drop view");
    wait_until("the view's absence", Duration::from_secs(10), || {
        let a = s
            .client
            .query(json!({"sql": page, "params": [2], "cache": {"ttl_s": 600}}));
        assert!(a.status == 200 || a.status == 400, "{:?}", a.body);
        a.status == 400
    });
    let a = s
        .client
        .query(json!({"sql": page, "params": [2], "cache": {"ttl_s": 600}}));
    assert_eq!(a.body["error"]["pg_code"], "42P01", "{:?}", a.body);
}

/// POST /sql as `neon()` sends it, with no Ferry header: (ferry-cache, its reason, body).
fn neon(s: &SidecarProcess, sql: &str, params: Value) -> (String, String, Value) {
    let url = format!("http://127.0.0.1:{}/sql", s.port);
    let conn = format!("postgresql://app:{TOKEN}@db.ferry.invalid/app");
    let body = json!({"query": sql, "params": params}).to_string();
    s.client.block_on(async move {
        let resp = reqwest::Client::new()
            .post(url)
            .header("Neon-Connection-String", conn)
            .body(body)
            .send()
            .await
            .expect("send");
        assert_eq!(resp.status(), 200);
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        let (cache, reason) = (header("ferry-cache"), header("ferry-cache-reason"));
        (cache, reason, resp.json().await.expect("json"))
    })
}

#[test]
fn a_neon_token_caches_unchanged_code_and_psql_writes_reach_it() {
    let (_redis, pg, s) = stack();
    let sql = "SELECT title FROM posts WHERE id = $1";
    wait_until(
        "a hit on the token's default",
        Duration::from_secs(10),
        || {
            let (cache, _, body) = neon(&s, sql, json!(["3"]));
            assert_eq!(body["rows"][0]["title"], "third");
            cache == "hit"
        },
    );
    pg.client()
        .execute("UPDATE posts SET title = 'third, edited' WHERE id = 3", &[])
        .expect("update");
    after_bound(Instant::now());
    let (_, _, body) = neon(&s, sql, json!(["3"]));
    assert_eq!(body["rows"][0]["title"], "third, edited");

    // A read it cannot keep fresh is answered from Postgres, and the header says why.
    let (cache, reason, _) = neon(&s, "SELECT now() AS t", json!([]));
    assert_eq!(cache, "bypass");
    assert!(reason.contains("stable now()"), "{reason}");
    // Writes are never cached, nor refused for the token's default.
    let (cache, _, body) = neon(&s, "UPDATE items SET name = $1 WHERE id = 1", json!(["w"]));
    assert_eq!(cache, "", "{body}");
}

/// `cache.default_ttl_s`: a read that asks for no caching is cached all the same, on the tables
/// Postgres says it reads, and kept fresh by the stream; one it cannot keep fresh says why.
#[test]
fn the_sidecars_default_caches_reads_that_ask_nothing() {
    let (_redis, pg, s) = stack_with(&[("FERRY_CACHE_DEFAULT_TTL_S", "600")]);
    let plain = |sql: &str| {
        let a = s.client.query(json!({"sql": sql}));
        assert_eq!(a.status, 200, "{:?}", a.body);
        a.body
    };
    let sql = "SELECT name FROM authors WHERE id = 2";
    wait_until("a hit with no cache asked", Duration::from_secs(10), || {
        let b = plain(sql);
        assert_eq!(b["rows"][0]["name"], "bob");
        b["cache"] == "hit"
    });
    pg.client()
        .execute("UPDATE authors SET name = 'bob b' WHERE id = 2", &[])
        .expect("update");
    after_bound(Instant::now());
    assert_eq!(plain(sql)["rows"][0]["name"], "bob b");
    let b = plain("SELECT now() AS t");
    assert_eq!(b["cache"], "bypass");
    assert!(b["bypass_reason"]
        .as_str()
        .unwrap_or_default()
        .contains("now()"));
}
