//! The edge library batches on its own: a handler that reads ten items at once (`join_all`)
//! makes one call to the sidecar, counted by the sidecar itself.
use ferry_testkit::{self as kit, sidecar::requests_on, Client, Stack, WranglerDev};
use serde_json::json;

#[test]
fn ten_concurrent_reads_are_one_sidecar_call() {
    let stack = Stack::start();
    let edge = WranglerDev::start(&stack.sidecar.base_url(), kit::SECRET, 5_000);
    let c = Client::new(&edge.url(), kit::SECRET);
    let calls = || (requests_on("/v1/batch"), requests_on("/v1/query"));

    for round in ["cold", "cached"] {
        let before = calls();
        let page = c.raw("GET", "/page?ids=1,2,3,4,5,6,7,8,9,10", Vec::new(), &[]);
        assert_eq!(page.status, 200, "{}\n{}", page.body, edge.log());
        let ids: Vec<i64> = page.body["items"]
            .as_array()
            .expect("items")
            .iter()
            .filter_map(|i| i["id"].as_i64())
            .collect();
        assert_eq!(
            ids,
            (1..=10).collect::<Vec<_>>(),
            "{round}: in the order asked"
        );
        assert_eq!(page.body["sidecar_calls"], 1, "{round}: {}", page.body);
        let after = calls();
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            (1, 0),
            "{round}: the sidecar saw one /v1/batch and no /v1/query"
        );
    }
    // A missing item is named, a lone read goes alone; the sidecar's errors come back per read.
    let page = c.raw("GET", "/page?ids=3,999999", Vec::new(), &[]);
    assert_eq!(page.body["missing"], json!([999999]), "{}", page.body);
    let before = calls();
    let one = c.raw("GET", "/page?ids=5", Vec::new(), &[]);
    assert_eq!(one.body["sidecar_calls"], 1);
    assert_eq!(calls().1 - before.1, 1, "a lone read is a plain /v1/query");
}
