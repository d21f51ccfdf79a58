//! A batch's misses of one named query with a batch form (`[queries.item]` in the sample
//! config) cost one statement, not one each: Postgres's own count of the statements it ran
//! (`pg_stat_statements`) judges. Each read still gets exactly its own rows, is cached on its own, and
//! a write to one row leaves the others hits.
use ferry_testkit::{PgServer, Stack};
use serde_json::{json, Value};

/// Statements on `items` run so far by id (the named query `item`, one by one or grouped).
fn item_statements(stack: &Stack) -> i64 {
    stack.pg.statements("FROM items WHERE id")
}

fn batch_of(ids: &[i64]) -> Value {
    json!({ "reads": ids.iter().map(|id| json!({
        "query": "item", "params": [id], "cache": { "key": format!("items:{id}") }
    })).collect::<Vec<_>>() })
}

#[test]
fn a_batch_of_misses_of_one_query_is_one_statement() {
    let stack = Stack::start_on(PgServer::start_counting(), |_| {});
    let c = &stack.client;
    // 100 ids: 90 that exist, 10 that do not, one asked twice.
    let mut ids: Vec<i64> = (1..=90).chain(50_001..=50_010).collect();
    ids.push(7);
    let before = item_statements(&stack);
    let r = c.block_on(c.post("/v1/batch", &batch_of(&ids)));
    assert_eq!(r.status, 200, "{}", r.body);
    let ran = item_statements(&stack) - before;
    assert_eq!(
        ran, 1,
        "{ran} statements for one batch of 100 misses of one query"
    );
    let results = r.body["results"].as_array().expect("results");
    assert_eq!(results.len(), ids.len());
    for (id, res) in ids.iter().zip(results) {
        let rows = res["ok"]["rows"].as_array().expect("rows");
        if *id <= 90 {
            assert_eq!(rows.len(), 1, "{id}: {res}");
            assert_eq!(rows[0]["id"], json!(id), "{id}: {res}");
            assert_eq!(rows[0]["name"], format!("item {id}"));
        } else {
            assert!(rows.is_empty(), "{id}: {res}");
        }
        // The id asked twice: its second read shares the first's fill (a miss) or, once that
        // has answered, is answered from it (a hit): never a second query (counted above).
        if std::ptr::eq(res, results.last().expect("last")) {
            assert!(
                res["ok"]["cache"] == "miss" || res["ok"]["cache"] == "hit",
                "{id}: {res}"
            );
        } else {
            assert_eq!(res["ok"]["cache"], "miss", "{id}: {res}");
        }
    }
    println!("FIGURES a batch of 100 misses of `item`: {ran} statement(s) (one each before)");

    // Each entry is its own: all hits now, and a write to one row leaves the others hits.
    let again = c.block_on(c.post("/v1/batch", &batch_of(&ids)));
    assert!(again.body["results"]
        .as_array()
        .expect("results")
        .iter()
        .all(|r| r["ok"]["cache"] == "hit"));
    let w = c.execute(json!({
        "query": "upsert_item", "params": [3, "renamed", "1.00"],
        "invalidate": { "keys": ["items:3"] }
    }));
    assert_eq!(w.status, 200, "{}", w.body);
    let third = c.block_on(c.post("/v1/batch", &batch_of(&[3, 4])));
    assert_eq!(third.body["results"][0]["ok"]["cache"], "miss");
    assert_eq!(third.body["results"][0]["ok"]["rows"][0]["name"], "renamed");
    assert_eq!(third.body["results"][1]["ok"]["cache"], "hit");
}
