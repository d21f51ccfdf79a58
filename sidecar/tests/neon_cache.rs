//! `/sql` reads cached with `Ferry-Cache-TTL`: a writer that bypasses Ferry (plain Postgres)
//! and a write sent through `/sql` itself (which carries no invalidation) are both seen by the
//! next read once the change stream's bound has passed; and caching is refused where it could
//! not be kept fresh.
mod change_stream_common;

use change_stream_common::*;
use ferry_testkit::{wait_until, RedisServer, SidecarProcess};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const TOKEN: &str = "neon-cache-token-0123456789abcdef01234567";

/// POST /sql as the driver sends it; (status, ferry-cache, body).
fn post(
    s: &SidecarProcess,
    body: Value,
    conn_options: &str,
    extra: &[(&str, &str)],
) -> (u16, String, Value) {
    let url = format!("http://127.0.0.1:{}/sql", s.port);
    let conn = format!("postgresql://app:{TOKEN}@db.ferry.invalid/app{conn_options}");
    let extra: Vec<(String, String)> = extra
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    s.client.block_on(async move {
        let mut r = reqwest::Client::new()
            .post(url)
            .header("Neon-Connection-String", conn)
            .header("Neon-Raw-Text-Output", "true")
            .body(body.to_string());
        for (k, v) in extra {
            r = r.header(k, v);
        }
        let resp = r.send().await.expect("send");
        let status = resp.status().as_u16();
        let cache = resp
            .headers()
            .get("ferry-cache")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        (status, cache, resp.json().await.expect("json"))
    })
}

const CACHED: [(&str, &str); 2] = [("Ferry-Cache-TTL", "600"), ("Ferry-Cache-Tables", "items")];

fn name(s: &SidecarProcess) -> (String, String) {
    let (status, cache, body) = post(
        s,
        json!({"query": "SELECT name FROM items WHERE id = $1", "params": ["1"]}),
        "",
        &CACHED,
    );
    assert_eq!(status, 200, "{body}");
    (
        body["rows"][0]["name"]
            .as_str()
            .unwrap_or("<none>")
            .to_string(),
        cache,
    )
}

fn until_hit(s: &SidecarProcess, expect: &str) {
    wait_until("a hit with the fresh row", Duration::from_secs(10), || {
        let (n, cache) = name(s);
        assert_eq!(n, expect, "a read after the bound returned another row");
        cache == "hit"
    });
}

#[test]
fn cached_sql_reads_are_fresh_after_any_writer() {
    let (redis, pg) = (RedisServer::start(), logical_pg());
    let s = spawn_with(
        &redis,
        &pg,
        &[("FERRY_NEON_ENABLED", "true"), ("FERRY_NEON_TOKEN", TOKEN)],
    );
    wait_caught_up(&s);
    until_hit(&s, "item 1");

    // A writer that bypasses Ferry.
    pg.client()
        .execute("UPDATE items SET name = 'from psql' WHERE id = 1", &[])
        .expect("update");
    after_bound(Instant::now());
    assert_eq!(name(&s).0, "from psql");
    until_hit(&s, "from psql");

    // A write through /sql: acknowledged, then never read as before.
    let (status, _, body) = post(
        &s,
        json!({"query": "UPDATE items SET name = $1 WHERE id = 1", "params": ["from /sql"]}),
        "",
        &[],
    );
    assert_eq!(
        (status, body["rowCount"].clone()),
        (200, json!(1)),
        "{body}"
    );
    after_bound(Instant::now());
    assert_eq!(name(&s).0, "from /sql");
    until_hit(&s, "from /sql");

    // The connection string's option turns caching on for every query of that client.
    let read = json!({"query": "SELECT count(*) AS n FROM items", "params": []});
    let opts = "?ferry_cache_ttl=60&ferry_cache_tables=items&application_name=x";
    wait_until(
        "a hit through the connection string",
        Duration::from_secs(10),
        || {
            let (status, cache, body) = post(&s, read.clone(), opts, &[]);
            assert_eq!(
                (status, body["rows"][0]["n"].clone()),
                (200, json!("1000")),
                "{body}"
            );
            cache == "hit"
        },
    );

    // No tables named: Postgres says what it reads, and what could not stay fresh is answered
    // uncached (tests/inferred_cache.rs has the rest).
    let (status, cache, body) = post(
        &s,
        json!({"query": "SELECT now()"}),
        "",
        &[("Ferry-Cache-TTL", "60")],
    );
    assert_eq!((status, cache.as_str()), (200, "bypass"), "{body}");

    // Refused: what could not be kept fresh, or is not one read.
    let refused = [
        (
            json!({"query": "SELECT 1"}),
            vec![
                ("Ferry-Cache-TTL", "60"),
                ("Ferry-Cache-Tables", "not_watched"),
            ],
            "Ferry-Cache-Tables[0]",
        ),
        (
            json!({"query": "SELECT 1"}),
            vec![("Ferry-Cache-TTL", "soon"), ("Ferry-Cache-Tables", "items")],
            "Ferry-Cache-TTL",
        ),
        (
            json!({"queries": [{"query": "SELECT 1"}]}),
            CACHED.to_vec(),
            "Ferry-Cache-TTL",
        ),
    ];
    for (body, headers, field) in refused {
        let (status, _, answer) = post(&s, body.clone(), "", &headers);
        assert_eq!(status, 400, "{body} {headers:?}: {answer}");
        assert_eq!(answer["error"]["field"], field, "{answer}");
    }
    let (status, _, answer) = post(&s, json!({"query": "DELETE FROM items"}), "", &CACHED);
    assert_eq!(
        (status, answer["code"].clone()),
        (400, json!("statement_not_allowed")),
        "{answer}"
    );
    let n: i64 = pg
        .client()
        .query_one("SELECT count(*) FROM items", &[])
        .expect("count")
        .get(0);
    assert_eq!(n, 1000, "a refused statement ran");
}

/// Redis dies under cached `/sql` reads: they are answered from Postgres (bypass), never
/// failed, and hits resume after Redis restarts. And a `/v1` read of the same statement never
/// shares an entry with a `/sql` read: each protocol gets its own shape, never the other's.
#[test]
fn redis_down_never_fails_a_cached_sql_read_and_protocols_never_share_entries() {
    let (mut redis, pg) = (RedisServer::start(), logical_pg());
    let s = spawn_with(
        &redis,
        &pg,
        &[("FERRY_NEON_ENABLED", "true"), ("FERRY_NEON_TOKEN", TOKEN)],
    );
    wait_caught_up(&s);

    // The same statement, cached through /v1 first: /sql must not be served its entry.
    let sql = "SELECT name FROM items WHERE id = $1";
    let v1 = || {
        s.client.query(json!({
            "sql": sql, "params": ["1"], "cache": {"ttl_s": 600, "tables": ["items"]},
        }))
    };
    wait_until("a /v1 hit", Duration::from_secs(10), || {
        v1().body["cache"] == "hit"
    });
    let (status, cache, body) = post(&s, json!({"query": sql, "params": ["1"]}), "", &CACHED);
    assert_eq!((status, cache.as_str()), (200, "miss"), "{body}");
    assert_eq!(body["command"], "SELECT", "the /sql shape: {body}");
    until_hit(&s, "item 1");
    let again = v1();
    assert_eq!(
        again.body["rows"],
        json!([{"name": "item 1"}]),
        "{:?}",
        again.body
    );
    assert!(
        again.body.get("fields").is_none(),
        "the /v1 shape: {:?}",
        again.body
    );

    redis.kill();
    for _ in 0..5 {
        let (status, cache, body) = post(&s, json!({"query": sql, "params": ["1"]}), "", &CACHED);
        assert_eq!(status, 200, "a read Postgres can serve failed: {body}");
        assert_eq!(cache, "bypass", "{body}");
        assert_eq!(body["rows"][0]["name"], "item 1");
    }
    redis.restart();
    wait_caught_up(&s);
    until_hit(&s, "item 1");
}

/// A cached `/sql` read with the driver's `authToken` is the end user's alone: alice's cached
/// notes never answer bob, and each hits their own entry afterwards. Postgres's row-level
/// security decides what each sees; the cache must not undo it.
#[test]
fn cached_reads_with_an_auth_token_are_each_users_own() {
    // scripts/demo.sql publishes notes to the change stream, and lets ferry_changes read it.
    let (redis, pg) = (RedisServer::start(), logical_pg());
    let secret = "neon-cache-jwt-secret-0123456789abcdef";
    let s = spawn_with(
        &redis,
        &pg,
        &[
            ("FERRY_NEON_ENABLED", "true"),
            ("FERRY_NEON_TOKEN", TOKEN),
            ("FERRY_CHANGES_TABLES", "orders,notes"),
            ("FERRY_IDENTITY_ALLOW_RAW_SQL", "true"),
            ("FERRY_IDENTITY_JWT_SECRET", secret),
        ],
    );
    wait_caught_up(&s);
    let exp = 4_000_000_000u64;
    let notes = |sub: &str| {
        let jwt =
            ferry_shared::jwt::sign_hs256(&json!({"sub": sub, "exp": exp}), secret.as_bytes());
        let auth = format!("Bearer {jwt}");
        let (status, cache, body) = post(
            &s,
            json!({"query": "SELECT owner FROM notes ORDER BY id"}),
            "",
            &[
                ("Ferry-Cache-TTL", "600"),
                ("Ferry-Cache-Tables", "notes"),
                ("Authorization", auth.as_str()),
            ],
        );
        assert_eq!(status, 200, "{body}");
        let owners: Vec<String> = body["rows"]
            .as_array()
            .map(|r| {
                r.iter()
                    .filter_map(|o| o["owner"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        (owners, cache)
    };
    let alice = vec!["alice".to_string(), "alice".to_string()];
    let bob = vec!["bob".to_string()];
    assert_eq!(notes("alice"), (alice.clone(), "miss".into()));
    assert_eq!(
        notes("bob"),
        (bob.clone(), "miss".into()),
        "bob never gets alice's entry"
    );
    assert_eq!(notes("alice"), (alice, "hit".into()));
    assert_eq!(notes("bob"), (bob, "hit".into()));
}
