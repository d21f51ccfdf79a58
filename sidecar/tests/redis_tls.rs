//! Redis over TLS (rediss://), as hosted plans require: with the CA configured the cache works
//! over TLS; with a certificate the sidecar does not trust, Redis counts as down (reads bypass,
//! /readyz says so) rather than talking in the clear.
use ferry_testkit::{self as common, PgServer, RedisServer, Sidecar};
use serde_json::json;

#[test]
fn the_cache_works_over_tls_and_refuses_an_untrusted_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = common::certs::make(dir.path());
    let (cert, key, ca) = (certs.cert, certs.key, certs.ca);
    let tls_port = common::free_port().to_string();
    let redis = RedisServer::start_with_args(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &cert,
        "--tls-auth-clients",
        "no",
    ]);
    let pg = PgServer::start();
    pg.setup_demo_schema();
    let read = json!({"sql": "SELECT name FROM items WHERE id = 5", "cache": {"ttl_s": 60}});

    let mut trusted = common::sidecar::test_config(&redis, &pg);
    trusted.redis.url = format!("rediss://127.0.0.1:{tls_port}/").into();
    trusted.redis.tls_ca_path = ca.clone();
    let sidecar = Sidecar::start(trusted);
    let c = common::Client::new(&sidecar.base_url(), common::SECRET);
    assert_eq!(c.query(read.clone()).body["cache"], "miss");
    let hit = c.query(read.clone());
    assert_eq!(hit.body["cache"], "hit", "{:?}", hit.body);
    common::wait_until(
        "readyz to see redis up",
        std::time::Duration::from_secs(5),
        || c.get("/readyz").body["redis"] == "up",
    );
    drop(sidecar);

    let mut untrusted = common::sidecar::test_config(&redis, &pg);
    untrusted.redis.url = format!("rediss://127.0.0.1:{tls_port}/").into();
    let sidecar = Sidecar::start(untrusted);
    let c = common::Client::new(&sidecar.base_url(), common::SECRET);
    let r = c.query(read);
    assert_eq!(r.status, 200, "reads still served: {:?}", r.body);
    assert_eq!(r.body["cache"], "bypass");
    common::wait_until(
        "readyz to see redis down",
        std::time::Duration::from_secs(5),
        || c.get("/readyz").body["redis"] == "down",
    );
}
