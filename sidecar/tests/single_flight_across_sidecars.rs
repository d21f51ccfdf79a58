//! A miss hit by many readers at once, spread over two sidecar binaries on one Redis and one
//! Postgres, runs on Postgres once: the first sidecar to miss takes a short lease in Redis, the
//! other waits to be woken by its fill (a message, not a polling loop) and answers from the
//! cache. A leaseholder killed mid-fill costs the others a wait of at most the lease, never an
//! error. Postgres's own count of executions judges.
use ferry_testkit::{Client, PgServer, RedisServer, SidecarProcess};
use serde_json::{json, Value};
use std::process::Stdio;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

/// Redis, Postgres with the demo schema, and two sidecar binaries over them.
fn two_sidecars(env: &[(&str, &str)]) -> (RedisServer, PgServer, Vec<SidecarProcess>) {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let mut env = env.to_vec();
    // Waiters hold no in-flight slot, but each request's lookup briefly does.
    env.push(("FERRY_SERVER_MAX_IN_FLIGHT", "1024"));
    let s = (0..2)
        .map(|_| SidecarProcess::start(BIN, &redis.url(), &pg.url(), &env, Stdio::null()))
        .collect();
    (redis, pg, s)
}

/// `ferry_fill_waits_total{outcome}` of one sidecar, from its own /metrics.
fn fill_waits(s: &SidecarProcess, outcome: &str) -> u64 {
    let series = format!("ferry_fill_waits_total{{outcome=\"{outcome}\"}}");
    s.metric(&series)
        .unwrap_or_else(|| panic!("no {series} in /metrics")) as u64
}

fn spread(clients: &[&Client], n: usize, req: &Value) -> Vec<ferry_testkit::client::Answer> {
    clients[0].block_on(async {
        let all = (0..n).map(|i| clients[i % clients.len()].query_async(req.clone()));
        futures::future::join_all(all).await
    })
}

/// A miss nobody waits on publishes nothing: a publish costs Redis and every sidecar's
/// subscriber a message, on every miss. (Misses waited on wake their waiters: above.)
#[test]
fn misses_nobody_waits_on_publish_nothing() {
    let (redis, _pg, s) = two_sidecars(&[]);
    for i in 0..20 {
        let a = s[i % 2].client.query(json!({
            "sql": "SELECT $1::int AS n", "params": [i], "cache": {"ttl_s": 60}
        }));
        assert_eq!(a.body["cache"], "miss", "{:?}", a.body);
    }
    assert_eq!(
        redis.command_calls("publish"),
        0,
        "misses nobody waited on published"
    );
}

#[test]
fn five_hundred_identical_misses_over_two_sidecars_run_one_query() {
    let (_redis, pg, s) = two_sidecars(&[]);
    let clients = [&s[0].client, &s[1].client];
    // Slow enough that every request arrives while the first one's query runs.
    let req = json!({
        "sql": "SELECT ferry_test_touch() AS n, pg_sleep(1)::text AS slept",
        "cache": {"ttl_s": 60}
    });
    let answers = spread(&clients, 500, &req);
    let failed: Vec<_> = answers.iter().filter(|a| a.status != 200).collect();
    assert!(
        failed.is_empty(),
        "{} failed, e.g. {:?}",
        failed.len(),
        failed.first()
    );
    assert_eq!(
        pg.reads(),
        1,
        "exactly one query ran on Postgres, across both sidecars"
    );
    assert!(answers.iter().all(|a| a.body["rows"][0]["n"] == 1));
    // Both sidecars answered from it, and now from the cache.
    for c in clients {
        assert_eq!(c.query(req.clone()).body["cache"], "hit");
    }
    assert_eq!(pg.reads(), 1);
    // The sidecar without the lease was woken by the fill, not by its wait running out.
    let woken: u64 = s.iter().map(|s| fill_waits(s, "woken")).sum();
    let timed_out: u64 = s.iter().map(|s| fill_waits(s, "timed_out")).sum();
    assert!(
        woken >= 1 && timed_out == 0,
        "woken {woken}, timed out {timed_out}"
    );
    println!(
        "FIGURES 500 misses over 2 sidecars: {} postgres executions, {woken} fill waits woken",
        pg.reads()
    );
}

#[test]
fn a_leaseholder_killed_mid_fill_delays_the_other_sidecar_but_fails_nothing() {
    // A 4 s request deadline: the waiters must be answered within it.
    let (_redis, pg, mut s) = two_sidecars(&[("FERRY_SERVER_REQUEST_TIMEOUT_MS", "4000")]);
    let req = json!({
        "sql": "SELECT ferry_test_touch() AS n, pg_sleep(1.5)::text AS slept",
        "cache": {"ttl_s": 60}
    });
    // The holder's own request never gets its answer (its sidecar is killed): sent by hand, so
    // that its failure is expected rather than a panic.
    let body = serde_json::to_vec(&req).expect("json");
    let headers = s[0].client.headers_for(
        "POST",
        "/v1/query",
        &body,
        ferry_testkit::client::now_s(),
        &ferry_testkit::client::nonce(),
    );
    let port = s[0].port;
    let holder = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let Ok(mut conn) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            return;
        };
        let mut head = format!(
            "POST /v1/query HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n",
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let _ = conn.write_all(head.as_bytes());
        let _ = conn.write_all(&body);
        let _ = conn.read_to_end(&mut Vec::new());
    });
    // The first sidecar holds the lease and runs the query.
    let started = Instant::now();
    ferry_testkit::wait_until("the first query to start", Duration::from_secs(5), || {
        pg.reads() == 1
    });
    let b = s[1].client.clone();
    let waiters = std::thread::spawn(move || spread(&[&b], 20, &req));
    std::thread::sleep(Duration::from_millis(200));
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &s[0].pid().to_string()])
        .status();
    let _ = s[0].child.wait();
    let _ = holder.join();
    let answers = waiters.join().expect("waiters");
    let failed: Vec<_> = answers.iter().filter(|a| a.status != 200).collect();
    assert!(
        failed.is_empty(),
        "{} failed, e.g. {:?}",
        failed.len(),
        failed.first()
    );
    // The second sidecar ran the query itself once the lease lapsed (or the holder's fill
    // landed first): at most one more execution, never one per waiter.
    assert!(pg.reads() <= 2, "{} executions", pg.reads());
    println!(
        "FIGURES leaseholder killed: 20/20 answered in {:?}, {} executions",
        started.elapsed(),
        pg.reads()
    );
}

#[test]
fn an_expired_entry_read_on_two_sidecars_is_refreshed_once() {
    let (_redis, pg, s) = two_sidecars(&[]);
    let clients = [&s[0].client, &s[1].client];
    let req = json!({
        "sql": "SELECT ferry_test_touch() AS n, pg_sleep(0.3)::text AS slept",
        "cache": {"ttl_s": 3, "swr_s": 60}
    });
    assert_eq!(clients[0].query(req.clone()).body["cache"], "miss");
    // Expired, within stale-while-revalidate; the refreshed entry then stays fresh for 3 s,
    // longer than the rest of the test takes, so no second refresh is due.
    std::thread::sleep(Duration::from_millis(3_200));
    // Forty reads of the expired entry over both sidecars: each is served at once (stale, or a
    // hit once the refresh landed), and the refresh runs on Postgres once, not once a sidecar.
    let answers = spread(&clients, 40, &req);
    assert!(answers
        .iter()
        .all(|a| a.status == 200 && (a.body["cache"] == "stale" || a.body["cache"] == "hit")));
    ferry_testkit::wait_until("the refresh to run", Duration::from_secs(5), || {
        pg.reads() >= 2
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        pg.reads(),
        2,
        "one fill, then one refresh across both sidecars"
    );
    for c in clients {
        assert_eq!(c.query(req.clone()).body["rows"][0]["n"], 2);
    }
}
