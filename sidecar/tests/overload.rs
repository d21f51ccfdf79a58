//! Overload is answered fast with 503 + Retry-After, not by queueing until a 30 s timeout.
use ferry_testkit as common;
use serde_json::json;
use std::time::{Duration, Instant};

fn slow_queries(
    c: &common::Client,
    n: usize,
    seconds: f64,
) -> Vec<(common::client::Answer, Duration)> {
    c.block_on(async {
        let requests = (0..n).map(|i| async move {
            let start = Instant::now();
            // Distinct SQL text per request, so nothing is shared.
            let a = c
                .query_async(
                    json!({"sql": format!("SELECT pg_sleep({seconds})::text AS s, {i} AS i")}),
                )
                .await;
            (a, start.elapsed())
        });
        futures::future::join_all(requests).await
    })
}

#[test]
fn an_exhausted_postgres_pool_answers_503_at_the_checkout_timeout() {
    let stack = common::Stack::start_with(|c| {
        c.postgres.pool_size = 2;
        c.postgres.checkout_timeout_ms = 300;
    });
    let answers = slow_queries(&stack.client, 10, 1.5);
    let ok = answers.iter().filter(|(a, _)| a.status == 200).count();
    let overloaded: Vec<_> = answers.iter().filter(|(a, _)| a.status == 503).collect();
    assert_eq!(ok, 2, "one request per pooled connection");
    assert_eq!(overloaded.len(), 8);
    for (a, took) in overloaded {
        assert_eq!(a.code(), "overloaded", "{:?}", a.body);
        assert_eq!(
            a.headers.get("retry-after").and_then(|v| v.to_str().ok()),
            Some("1")
        );
        // Refused at the checkout timeout, well before the slow queries end.
        assert!(*took < Duration::from_millis(1400), "took {took:?}");
    }
    // The pool is not poisoned: the next request is served normally.
    assert_eq!(
        stack.client.query(json!({"sql": "SELECT 1 AS one"})).status,
        200
    );
}

#[test]
fn the_in_flight_limit_refuses_at_once() {
    let stack = common::Stack::start_with(|c| {
        c.server.max_in_flight = 3;
        // Room for all three on whichever worker they land: the in-flight limit, not the pool,
        // is what refuses here (with a pool of 3, three requests on one worker met its one
        // pooled connection and waited out the checkout: a CI run failed so).
        c.postgres.pool_size = 8;
    });
    let c = &stack.client;
    let (answers, health) = std::thread::scope(|s| {
        let load = s.spawn(|| slow_queries(c, 10, 1.0));
        std::thread::sleep(Duration::from_millis(300));
        let health = c.get("/healthz").status;
        (load.join().expect("load"), health)
    });
    assert_eq!(health, 200, "/healthz answers under overload");
    let ok = answers.iter().filter(|(a, _)| a.status == 200).count();
    let refused: Vec<_> = answers.iter().filter(|(a, _)| a.status == 503).collect();
    assert_eq!(ok, 3);
    assert_eq!(refused.len(), 7);
    for (a, took) in refused {
        assert_eq!(a.code(), "overloaded");
        assert!(*took < Duration::from_millis(900), "took {took:?}");
    }
}

#[test]
fn a_statement_beyond_the_timeout_is_504_and_the_pool_recovers() {
    let stack = common::Stack::start_with(|c| {
        c.postgres.statement_timeout_ms = 300;
        c.postgres.pool_size = 1;
    });
    let r = stack
        .client
        .query(json!({"sql": "SELECT pg_sleep(5)::text AS s"}));
    assert_eq!(r.status, 504, "{:?}", r.body);
    assert_eq!(r.code(), "timeout");
    // The one connection is back in the pool and works.
    assert_eq!(
        stack.client.query(json!({"sql": "SELECT 1 AS one"})).status,
        200
    );
}
