//! The writer that bypasses Ferry: psql, a migration, another service. With `[changes]` on, a
//! read that starts more than `changes.max_lag_ms` after a commit never returns the rows from
//! before it, whoever committed. Against the binary, a private Postgres with
//! `wal_level = logical`, and private Redis; Postgres's rows judge what is fresh.
use ferry_testkit::{wait_until, RedisServer, SidecarProcess};
use serde_json::json;
use std::time::{Duration, Instant};

mod change_stream_common;
use change_stream_common::*;

#[test]
fn update_insert_and_delete_from_psql_are_seen_by_the_next_read() {
    let (redis, pg) = (RedisServer::start(), logical_pg());
    let s = start(&redis, &pg);
    let mut psql = pg.client();
    until_hit(&s, 1, "item 1");

    psql.execute("UPDATE items SET name = 'from psql' WHERE id = 1", &[])
        .expect("update");
    after_bound(Instant::now());
    assert_eq!(name_of(&s, 1).0, "from psql", "UPDATE");
    until_hit(&s, 1, "from psql");

    let count = |s: &SidecarProcess| {
        read(
            s,
            "SELECT count(*)::int AS n FROM items",
            json!([]),
            &["items"],
        )
        .body["rows"][0]["n"]
            .as_i64()
    };
    assert_eq!(count(&s), Some(1000));
    psql.execute(
        "INSERT INTO items (id, name, price) VALUES (5000, 'new', 1)",
        &[],
    )
    .expect("insert");
    after_bound(Instant::now());
    assert_eq!(count(&s), Some(1001), "INSERT");

    psql.execute("DELETE FROM items WHERE id = 5000", &[])
        .expect("delete");
    after_bound(Instant::now());
    assert_eq!(count(&s), Some(1000), "DELETE");

    // Keyed rows: row 2's entry (items:2) goes, row 3's stays cached.
    let keyed = |s: &SidecarProcess| {
        let body = json!({"keyspace": "items", "ids": [2, 3]});
        let a = s.client.block_on(s.client.post("/v1/batch/keyed", &body));
        assert_eq!(a.status, 200, "{:?}", a.body);
        a.body["results"].clone()
    };
    // Statuses need the cache in use: caught up (a lagging stream makes reads bypass it).
    wait_caught_up(&s);
    keyed(&s);
    let warm = keyed(&s);
    assert_eq!(warm[0]["status"], "hit");
    psql.execute("UPDATE items SET name = 'two' WHERE id = 2", &[])
        .expect("update 2");
    after_bound(Instant::now());
    wait_caught_up(&s);
    let after = keyed(&s);
    assert_eq!(after[0]["row"]["name"], "two", "the changed row");
    assert_eq!(after[0]["status"], "miss");
    assert_eq!(
        after[1]["status"], "hit",
        "an unchanged row keeps its entry"
    );

    // An id not found is remembered (cache.negative_ttl_s), and a row inserted by a writer
    // that bypasses Ferry is found at once all the same: its insert drops `items:<id>`.
    let missing = |s: &SidecarProcess| {
        let body = json!({"keyspace": "items", "ids": [7000, 7000]});
        let a = s.client.block_on(s.client.post("/v1/batch/keyed", &body));
        assert_eq!(a.status, 200, "{:?}", a.body);
        a.body["results"][0].clone()
    };
    assert_eq!(missing(&s)["status"], "not_found");
    assert_eq!(missing(&s)["status"], "not_found");
    psql.execute(
        "INSERT INTO items (id, name, price) VALUES (7000, 'late', 1.00)",
        &[],
    )
    .expect("insert 7000");
    after_bound(Instant::now());
    wait_caught_up(&s);
    let found = missing(&s);
    assert_eq!(found["row"]["name"], "late", "{found:?}");
    assert_eq!(found["status"], "miss");
}

#[test]
fn transactions_count_once_committed_and_rollbacks_not_at_all() {
    let (redis, pg) = (RedisServer::start(), logical_pg());
    let s = start(&redis, &pg);
    let mut psql = pg.client();
    let qty = |s: &SidecarProcess| {
        read(
            s,
            "SELECT qty FROM orders WHERE id = 1",
            json!([]),
            &["orders"],
        )
        .body["rows"][0]["qty"]
            .as_i64()
    };
    until_hit(&s, 1, "item 1");
    assert_eq!(qty(&s), Some(5));
    assert_eq!(qty(&s), Some(5));

    // One transaction over two tables: both reads see it.
    let mut tx = psql.transaction().expect("begin");
    tx.execute("UPDATE items SET name = 'both' WHERE id = 1", &[])
        .expect("items");
    tx.execute("UPDATE orders SET qty = 6 WHERE id = 1", &[])
        .expect("orders");
    tx.commit().expect("commit");
    after_bound(Instant::now());
    assert_eq!(name_of(&s, 1).0, "both");
    assert_eq!(qty(&s), Some(6));
    until_hit(&s, 1, "both");

    // A rolled-back transaction invalidates nothing: the entry stays a hit.
    let mut tx = psql.transaction().expect("begin");
    tx.execute("UPDATE items SET name = 'never' WHERE id = 1", &[])
        .expect("items");
    tx.rollback().expect("rollback");
    after_bound(Instant::now());
    wait_caught_up(&s);
    assert_eq!(name_of(&s, 1), ("both".to_string(), "hit".to_string()));
}

#[test]
fn truncate_and_alter_drop_the_tables_entries() {
    let (redis, pg) = (RedisServer::start(), logical_pg());
    let s = start(&redis, &pg);
    let mut psql = pg.client();
    let orders = |s: &SidecarProcess| {
        read(
            s,
            "SELECT * FROM orders ORDER BY id",
            json!([]),
            &["orders"],
        )
        .body["rows"]
            .clone()
    };
    assert_eq!(orders(&s), json!([{"id": 1, "item_id": 1, "qty": 5}]));
    psql.batch_execute("TRUNCATE orders").expect("truncate");
    after_bound(Instant::now());
    assert_eq!(orders(&s), json!([]), "TRUNCATE");

    psql.batch_execute("INSERT INTO orders VALUES (2, 1, 1)")
        .expect("insert");
    after_bound(Instant::now());
    assert_eq!(orders(&s), json!([{"id": 2, "item_id": 1, "qty": 1}]));
    // DDL is not in the stream: the consumer watches the tables' definitions.
    psql.batch_execute("ALTER TABLE orders ADD COLUMN note text DEFAULT 'n'")
        .expect("alter");
    after_bound(Instant::now());
    assert_eq!(
        orders(&s),
        json!([{"id": 2, "item_id": 1, "qty": 1, "note": "n"}]),
        "ALTER"
    );
}

#[test]
fn a_read_after_a_commit_never_returns_the_rows_before_it() {
    let (redis, pg) = (RedisServer::start(), logical_pg());
    let s = start(&redis, &pg);
    // A writer bumps row 1's price; readers read it through the cache. Every read must see at
    // least the value committed MAX_LAG before it started.
    let commits: std::sync::Mutex<Vec<(Instant, i64)>> = std::sync::Mutex::new(Vec::new());
    let reads: std::sync::Mutex<Vec<(Instant, i64, String)>> = std::sync::Mutex::new(Vec::new());
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut psql = pg.client();
            for n in 1..=300i64 {
                psql.execute("UPDATE items SET price = $1::int8 WHERE id = 1", &[&n])
                    .expect("update");
                commits.lock().unwrap().push((Instant::now(), n));
                std::thread::sleep(Duration::from_millis(5));
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        for _ in 0..4 {
            scope.spawn(|| {
                while !done.load(std::sync::atomic::Ordering::SeqCst) {
                    let started = Instant::now();
                    let a = read(
                        &s,
                        "SELECT price::int8 AS p FROM items WHERE id = 1",
                        json!([]),
                        &["items"],
                    );
                    let p = a.body["rows"][0]["p"].as_i64().unwrap_or(-1);
                    let cache = a.body["cache"].as_str().unwrap_or_default().to_string();
                    reads.lock().unwrap().push((started, p, cache));
                }
            });
        }
    });
    let commits = commits.into_inner().unwrap();
    let reads = reads.into_inner().unwrap();
    let seen: Vec<(Instant, i64)> = reads.iter().map(|(at, n, _)| (*at, *n)).collect();
    let stale = stale_reads(&commits, &seen, MAX_LAG);
    let hits = reads.iter().filter(|r| r.2 == "hit").count();
    // How old each read's row was: from the commit that replaced it to the read's start.
    let mut ages: Vec<Duration> = reads
        .iter()
        .filter_map(|(started, seen, _)| {
            let next = commits.iter().find(|(_, n)| *n == seen + 1)?;
            started.checked_duration_since(next.0)
        })
        .collect();
    ages.sort();
    println!(
        "FIGURES stream: {} reads ({hits} hits) around {} commits: {stale} stale past {} ms; \
         {} reads older than a commit, p99 {:?}, max {:?}",
        reads.len(),
        commits.len(),
        MAX_LAG.as_millis(),
        ages.len(),
        ages.get(ages.len().saturating_sub(1) * 99 / 100),
        ages.last()
    );
    assert_eq!(stale, 0, "stale reads past the bound, of {}", reads.len());
    assert!(
        hits > 0,
        "no read was served from the cache: the test proves nothing"
    );
}

#[test]
fn a_burst_of_changes_costs_redis_work_per_distinct_row_not_per_change() {
    let (redis, pg) = (RedisServer::start(), logical_pg());
    let s = start(&redis, &pg);
    let scripts = || redis.command_calls("evalsha") + redis.command_calls("eval");
    let (sets, execs, marks) = (
        redis.command_calls("set"),
        redis.command_calls("exec"),
        scripts(),
    );
    // 10,000 row changes in one transaction, over 10 rows.
    pg.client()
        .batch_execute(
            "DO $$ BEGIN FOR i IN 1..10000 LOOP \
               UPDATE items SET price = price + 1 WHERE id = i % 10 + 1; \
             END LOOP; END $$",
        )
        .expect("burst");
    // However long decoding takes on this machine (reads bypass meanwhile): until the stream
    // has applied them all.
    let admin = ferry_testkit::Client::new(&format!("http://127.0.0.1:{}", s.admin_port), "x");
    let applied = || -> u64 {
        let metrics = admin.block_on(async {
            reqwest::get(format!("{}/metrics", admin.base))
                .await
                .expect("metrics")
                .text()
                .await
                .expect("text")
        });
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("ferry_changes_total "))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    wait_until(
        "the stream to apply the burst",
        Duration::from_secs(60),
        || applied() >= 10_000,
    );
    wait_caught_up(&s);
    let changes = applied();
    let (sets, execs, marks) = (
        redis.command_calls("set") - sets,
        redis.command_calls("exec") - execs,
        scripts() - marks,
    );
    println!(
        "FIGURES burst: {changes} row changes -> {sets} SET and {execs} EXEC in Redis \
         ({marks} watermark scripts meanwhile)"
    );
    // 10 keyspace row keys; per column (5), its values' keys (what inferred reads by a value
    // depend on: at most 64 a batch, then the column's tag) and its tag (an UPDATE does not
    // send old values outside the key); one table tag; plus the marks' own work (a watermark
    // script sets at most two keys; a slower machine decodes longer and marks more often
    // meanwhile): nowhere near 10,000.
    let bound = 10 + 5 * (64 + 1) + 1 + 2 * marks + 8;
    assert!(
        sets <= bound,
        "{sets} SETs for 10 distinct rows ({marks} watermark scripts: at most {bound})"
    );
    assert!(execs <= 20, "{execs} transactions for one burst");
    // And the rows are fresh.
    let price = read(
        &s,
        "SELECT price FROM items WHERE id = 1",
        json!([]),
        &["items"],
    );
    assert_eq!(price.body["rows"][0]["price"], "1001.25");
}
