//! What an anonymous Internet client can make the public edge do, through workerd, the real
//! Worker: every failure is JSON; one `/page` of 100 uncached ids costs Postgres one
//! statement (Postgres's own `pg_stat_statements` judges); a flood of made-up ids leaves
//! Redis as it found it (`DBSIZE`, `INFO memory`); a flood from one address is refused past its
//! budget with 429 and Retry-After, while other callers and a signed-in reader are served.
use ferry_edge::jwt::sign_hs256;
use ferry_testkit::{self as kit, client::Answer, Client, PgServer, Stack, WranglerDev};
use serde_json::json;
use std::time::{Duration, Instant};

fn get_from(c: &Client, path: &str, ip: &str) -> Answer {
    c.raw(
        "GET",
        path,
        Vec::new(),
        &[("cf-connecting-ip", ip.to_string())],
    )
}

/// A GET whose request line is written by hand: (status, body).
fn raw_get(base: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let addr = base.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the edge");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    // A chunked body: its one chunk.
    let body = match body.split_once("\r\n") {
        Some((size, rest)) if u64::from_str_radix(size.trim(), 16).is_ok() => {
            rest.split("\r\n").next().unwrap_or_default().to_string()
        }
        _ => body.to_string(),
    };
    (status, body)
}

#[test]
fn every_failure_is_json_with_its_request_id() {
    let stack = Stack::start();
    let edge = WranglerDev::start(&stack.sidecar.base_url(), kit::SECRET, 5_000);
    let c = Client::new(&edge.url(), kit::SECRET);
    for (method, path, status, allow) in [
        ("GET", "/", 404, None),
        ("GET", "/nope", 404, None),
        ("GET", "/items//1", 404, None),
        ("GET", "/cache/a%2Fb", 404, None),
        ("HEAD", "/items/1", 405, Some("GET, PUT")),
        ("PROPFIND", "/items/1", 405, Some("GET, PUT")),
        ("DELETE", "/items", 405, Some("GET, PUT")),
        ("GET", "/items/1/reprice", 405, Some("POST")),
    ] {
        let r = c.raw(method, path, Vec::new(), &[]);
        assert_eq!(r.status, status, "{method} {path}: {:?}", r.body);
        assert!(
            r.headers.contains_key("x-ferry-request-id"),
            "{method} {path}: {:?}",
            r.headers
        );
        if method != "HEAD" {
            let code = if status == 404 {
                "not_found"
            } else {
                "method_not_allowed"
            };
            assert_eq!(r.code(), code, "{method} {path}: {:?}", r.body);
        }
        assert_eq!(
            r.headers.get("allow").and_then(|v| v.to_str().ok()),
            allow,
            "{method} {path}"
        );
    }
    // Paths with dot segments, sent as they are (an HTTP client would resolve them first):
    // whatever the runtime makes of them, the answer is JSON.
    for path in [
        "/items/../health",
        "/items/%2e%2e/cache/x",
        "/./items/1",
        "/items/1/.",
    ] {
        let (status, body) = raw_get(&edge.url(), path);
        assert!(
            serde_json::from_str::<serde_json::Value>(&body).is_ok(),
            "{path}: {status} {body}"
        );
    }
    // Prices the database could not hold, or that would make the next reprice fail.
    let auth = [("authorization", format!("Bearer {}", kit::API_KEY))];
    for price in [
        json!("NaN"),
        json!(-1),
        json!("-0.50"),
        json!("1e3"),
        json!("100000000.00"),
    ] {
        let r = c.raw(
            "PUT",
            "/items/5",
            json!({"name": "x", "price": price})
                .to_string()
                .into_bytes(),
            &auth,
        );
        assert_eq!(r.status, 400, "{price}: {:?}", r.body);
        assert_eq!(r.body["error"]["field"], "price", "{:?}", r.body);
    }
    let price: String = stack
        .pg
        .client()
        .query_one("SELECT price::text FROM items WHERE id = 5", &[])
        .expect("row")
        .get(0);
    assert_eq!(price, "6.25", "no refused price reached Postgres");
    // 101 ids are refused before any is parsed, duplicates or not.
    let many = vec!["1"; 101].join(",");
    let r = c.raw("GET", &format!("/items?ids={many}"), Vec::new(), &[]);
    assert_eq!(r.status, 400, "{:?}", r.body);
}

#[test]
fn made_up_ids_cost_one_statement_and_leave_redis_as_it_was() {
    let stack = Stack::start_on(PgServer::start_counting(), |c| {
        // Short lives, so the test sees them end: the bounds scale with these.
        c.cache.negative_ttl_s = 2;
        c.server.request_timeout_ms = 3_000;
    });
    let edge = WranglerDev::start(&stack.sidecar.base_url(), kit::SECRET, 5_000);
    let c = Client::new(&edge.url(), kit::SECRET);
    let mut redis = stack.redis.conn();
    let dbsize =
        |r: &mut ::redis::Connection| -> i64 { ::redis::cmd("DBSIZE").query(r).expect("dbsize") };
    let used = |r: &mut ::redis::Connection| -> u64 {
        let info: String = ::redis::cmd("INFO").arg("memory").query(r).expect("info");
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("used_memory")
    };
    assert_eq!(get_from(&c, "/items/1", "198.51.100.1").status, 200);
    let (keys_before, memory_before) = (dbsize(&mut redis), used(&mut redis));

    // One page of 100 ids nobody wrote: one statement.
    let before = stack.pg.statements("FROM items WHERE id");
    let ids: Vec<String> = (0..100).map(|i| (900_000 + i).to_string()).collect();
    let page = get_from(&c, &format!("/page?ids={}", ids.join(",")), "198.51.100.1");
    assert_eq!(page.status, 200, "{:?}", page.body);
    assert_eq!(page.body["missing"].as_array().map(Vec::len), Some(100));
    let ran = stack.pg.statements("FROM items WHERE id") - before;
    assert!(
        ran <= 2,
        "{ran} statements for one anonymous page of 100 ids"
    );

    // A flood of made-up ids, through both routes, from a few addresses.
    for round in 0..12u32 {
        let ids: Vec<String> = (0..100)
            .map(|i| (1_000_000 + round * 1_000 + i).to_string())
            .collect();
        let ip = format!("203.0.113.{}", round % 4);
        let path = if round % 2 == 0 { "/page" } else { "/items" };
        let r = get_from(&c, &format!("{path}?ids={}", ids.join(",")), &ip);
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    let (keys_during, memory_during) = (dbsize(&mut redis), used(&mut redis));
    // The keys the made-up ids left (ids of 900000 and up): each lives no longer than a
    // read's flight (3 s + 5 s) or an empty entry (2 s).
    let flood_keys = |r: &mut ::redis::Connection| -> Vec<String> {
        let mut all: Vec<String> = Vec::new();
        for pattern in [
            "*items:9[0-9][0-9][0-9][0-9][0-9]*",
            "*items:1[0-9][0-9][0-9][0-9][0-9][0-9]*",
        ] {
            let found: Vec<String> = ::redis::cmd("KEYS").arg(pattern).query(r).expect("keys");
            all.extend(found);
        }
        all
    };
    let left = flood_keys(&mut redis);
    assert!(!left.is_empty(), "the flood's lookups are seen");
    for k in &left {
        let ttl: i64 = ::redis::cmd("TTL").arg(k).query(&mut redis).expect("ttl");
        assert!(
            (0..=8).contains(&ttl),
            "{k} lives {ttl} s after a lookup of an id nobody wrote"
        );
    }
    kit::wait_until("Redis to forget the flood", Duration::from_secs(20), || {
        flood_keys(&mut redis).is_empty()
    });
    let memory_after = used(&mut redis);
    println!(
        "FIGURES flood of 1,200 made-up ids: {ran} statement(s) for a page of 100; Redis keys \
         {keys_before} -> {keys_during} during -> {} after; used_memory {memory_before} -> \
         {memory_during} -> {memory_after} bytes",
        dbsize(&mut redis)
    );
    assert!(
        memory_after < memory_before + 512 * 1024,
        "Redis kept {} bytes of the flood",
        memory_after.saturating_sub(memory_before)
    );
}

#[test]
fn an_anonymous_flood_is_refused_past_its_budget_and_others_are_served() {
    let stack = Stack::start_with(|c| {
        c.limits.anonymous_rate_per_s = 5;
        c.limits.anonymous_burst = 10;
    });
    let edge = WranglerDev::start(&stack.sidecar.base_url(), kit::SECRET, 5_000);
    let c = Client::new(&edge.url(), kit::SECRET);
    let jwt = sign_hs256(
        &json!({"sub": "alice", "exp": kit::client::now_s() + 600}),
        kit::JWT_SECRET.as_bytes(),
    );
    let auth = [("authorization", format!("Bearer {jwt}"))];
    let reader = |c: &Client| {
        let started = Instant::now();
        let r = c.raw("GET", "/me/notes", Vec::new(), &auth);
        assert_eq!(r.status, 200, "{:?}", r.body);
        started.elapsed()
    };
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let idle = median((0..9).map(|_| reader(&c)).collect());
    // 120 requests at once from one address, while the signed-in reader goes on.
    let flood = {
        let c = c.clone();
        std::thread::spawn(move || {
            c.block_on(futures::future::join_all((0..120).map(|i| {
                let path = format!("/items/{}", i % 50 + 1);
                let ip = [("cf-connecting-ip", "203.0.113.9".to_string())];
                let c = c.clone();
                async move { c.send_raw("GET", &path, Vec::new(), &ip).await }
            })))
        })
    };
    let during = median((0..9).map(|_| reader(&c)).collect());
    let answers = flood.join().expect("flood");
    let ok = answers.iter().filter(|a| a.status == 200).count();
    let limited: Vec<&Answer> = answers.iter().filter(|a| a.status == 429).collect();
    assert_eq!(ok + limited.len(), 120, "only 200s and 429s");
    assert!(
        (10..60).contains(&ok),
        "{ok} of 120 admitted (burst 10, 5 a second)"
    );
    for a in &limited {
        assert_eq!(a.code(), "rate_limited", "{:?}", a.body);
        assert!(a.headers.contains_key("retry-after"), "{:?}", a.headers);
    }
    // Another address is not held back by that one.
    assert_eq!(get_from(&c, "/items/1", "198.51.100.77").status, 200);
    println!(
        "FIGURES anonymous flood of 120 from one address: {ok} admitted, {} refused 429; \
         a signed-in reader's median {idle:?} idle, {during:?} during",
        limited.len()
    );
    // A loose bound on purpose (timing is the bench's to measure): on a shared two-core host
    // the reader's median moved from 10 to 88 ms once with the flood held to its budget. What
    // this guards against is a reader queued behind the flood, not milliseconds.
    assert!(
        during <= idle * 2 + Duration::from_millis(250),
        "the signed-in reader went from {idle:?} to {during:?}"
    );
}
