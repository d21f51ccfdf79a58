//! Interactive transactions through the edge: the Worker's `POST /items/:id/reprice` reads a
//! price under a row lock, computes the new one in the Worker and writes it, in one
//! transaction on the sidecar. The adversaries: concurrent reprices of one item (none may be
//! lost), and reprices that fail in the Worker or in Postgres (nothing may stay open, holding
//! a connection and the row's lock, until the sidecar's idle timeout). Postgres judges: the
//! price, `pg_stat_activity`, and whether the row can be locked.
use ferry_testkit::{self as kit, client::Answer, Client, Stack, WranglerDev};
use serde_json::json;

fn reprice(c: &Client, id: i64, percent: i64) -> Answer {
    let auth = [("authorization", format!("Bearer {}", kit::API_KEY))];
    let body = json!({ "percent": percent }).to_string().into_bytes();
    c.raw("POST", &format!("/items/{id}/reprice"), body, &auth)
}

/// Sessions of the sidecar left inside a transaction, and whether item `id`'s row is free
/// (a lock that does not wait).
fn left_open(stack: &Stack, id: i32) -> (i64, bool) {
    let mut pg = stack.pg.client();
    let open: i64 = pg
        .query_one(
            "SELECT count(*) FROM pg_stat_activity
             WHERE state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()
               AND application_name NOT IN ('ferry-analysis', 'ferry-own-session-probe')",
            &[],
        )
        .expect("pg_stat_activity")
        .get(0);
    let mut tx = pg.transaction().expect("begin");
    let free = tx
        .query(
            "SELECT 1 FROM items WHERE id = $1 FOR UPDATE NOWAIT",
            &[&id],
        )
        .is_ok();
    let _ = tx.rollback();
    (open, free)
}

fn price(stack: &Stack, id: i32) -> String {
    stack
        .pg
        .client()
        .query_one("SELECT price::text FROM items WHERE id = $1", &[&id])
        .expect("price")
        .get(0)
}

#[test]
fn concurrent_reprices_through_the_edge_lose_none() {
    let stack = Stack::start();
    stack
        .pg
        .client()
        .execute("UPDATE items SET price = 100.00 WHERE id = 5", &[])
        .expect("start price");
    let edge = WranglerDev::start(&stack.sidecar.base_url(), kit::SECRET, 10_000);
    let c = Client::new(&edge.url(), kit::SECRET);
    assert_eq!(c.get("/items/5").body["item"]["price"], "100.00");
    assert_eq!(c.get("/items/5").body["cache"], "hit");

    let auth = [("authorization", format!("Bearer {}", kit::API_KEY))];
    let answers: Vec<Answer> = c.block_on(futures::future::join_all((0..6).map(|_| {
        let body = json!({"percent": 10}).to_string().into_bytes();
        c.send_raw("POST", "/items/5/reprice", body, &auth)
    })));
    let (ok, other): (Vec<_>, Vec<_>) = answers.iter().partition(|a| a.status == 200);
    // The sidecar bounds open transactions (half its pool): past that, a fast 503.
    for a in &other {
        assert_eq!((a.status, a.code()), (503, "overloaded"), "{:?}", a.body);
    }
    assert!(
        ok.len() >= 2,
        "too few ran to race: {answers:?}\n{}",
        edge.log()
    );
    // Each saw the last one's price: a chain from 100.00, one step of 10% per answer.
    let mut steps: Vec<(String, String)> = ok
        .iter()
        .map(|a| {
            let s = |k: &str| a.body[k].as_str().expect(k).to_string();
            (s("old_price"), s("price"))
        })
        .collect();
    steps.sort_by(|a, b| a.0.parse::<f64>().unwrap().total_cmp(&b.0.parse().unwrap()));
    let mut expected = "100.00".to_string();
    for (old, new) in &steps {
        assert_eq!(
            old, &expected,
            "a reprice did not see the one before: {steps:?}"
        );
        expected = new.clone();
    }
    println!(
        "FIGURES 6 concurrent reprices through the edge: {} committed, {} refused (503), \
         price {expected}",
        ok.len(),
        other.len()
    );
    assert_eq!(price(&stack, 5), expected, "Postgres holds the last step");
    assert_eq!(left_open(&stack, 5), (0, true), "nothing left open");
    // The commit invalidated the cached item: the next read is the new price.
    let read = c.get("/items/5");
    assert_eq!(
        read.body["item"]["price"],
        expected.as_str(),
        "{:?}",
        read.body
    );
    assert_eq!(read.body["cache"], "miss");
}

#[test]
fn a_reprice_that_fails_rolls_back_at_once() {
    // The sidecar would roll an abandoned transaction back after 5 s idle: each check below
    // comes right after the answer, so only a rollback sent with the failure passes it.
    let stack = Stack::start();
    let edge = WranglerDev::start(&stack.sidecar.base_url(), kit::SECRET, 10_000);
    let c = Client::new(&edge.url(), kit::SECRET);

    // Refused in the Worker: no such item (after its statement ran).
    let r = reprice(&c, 999_999, 10);
    assert_eq!((r.status, r.code()), (404, "not_found"), "{:?}", r.body);
    assert_eq!(left_open(&stack, 5).0, 0, "the transaction stayed open");

    // Refused by Postgres after the row was locked: the new price overflows numeric(10, 2).
    stack
        .pg
        .client()
        .execute("UPDATE items SET price = 99999999.99 WHERE id = 6", &[])
        .expect("a big price");
    let r = reprice(&c, 6, 100);
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(r.body["error"]["pg_code"], "22003", "{:?}", r.body);
    assert_eq!(left_open(&stack, 6), (0, true), "the row stayed locked");
    assert_eq!(price(&stack, 6), "99999999.99");

    // Bad input never begins one.
    let r = reprice(&c, 6, 0);
    assert_eq!((r.status, r.code()), (400, "invalid_value"), "{:?}", r.body);
    // And the item is still repriced normally afterwards.
    let r = reprice(&c, 7, -50);
    assert_eq!(r.status, 200, "{:?}\n{}", r.body, edge.log());
    assert_eq!(r.body["old_price"], "8.75");
    assert_eq!(r.body["price"], "4.38");
}
