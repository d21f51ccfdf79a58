//! Postgres over TLS: `sslmode=require` / `verify-full` with the CA configured connects over
//! TLS (Postgres itself says so in pg_stat_ssl); a server certificate the sidecar does not
//! trust is refused (503, never a silent fallback to plain text); `sslmode=disable` stays plain.
use ferry_testkit::{self as common, PgServer, RedisServer, Sidecar};
use serde_json::json;

fn sidecar_ssl(pg: &PgServer) -> Vec<bool> {
    pg.client()
        .query(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = 'ferry-sidecar'",
            &[],
        )
        .expect("pg_stat_ssl")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[test]
fn tls_to_postgres_is_verified() {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = common::certs::make(dir.path());
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    pg.enable_ssl(&certs.cert, &certs.key);
    let read = json!({"sql": "SELECT name FROM items WHERE id = 6"});
    let url = |mode: &str| {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode={mode}",
            pg.port
        )
    };

    let mut config = common::sidecar::test_config(&redis, &pg);
    config.postgres.url = url("verify-full").into();
    config.postgres.tls_ca_path = certs.ca.clone();
    let sidecar = Sidecar::start(config);
    let c = common::Client::new(&sidecar.base_url(), common::SECRET);
    let r = c.query(read.clone());
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["rows"][0]["name"], "item 6");
    let ssl = sidecar_ssl(&pg);
    assert!(
        !ssl.is_empty() && ssl.iter().all(|s| *s),
        "the sidecar's backends use TLS: {ssl:?}"
    );
    drop(sidecar);

    // Not trusting the server's CA: refused, not downgraded.
    let mut config = common::sidecar::test_config(&redis, &pg);
    config.postgres.url = url("require").into();
    let sidecar = Sidecar::start(config);
    let c = common::Client::new(&sidecar.base_url(), common::SECRET);
    let r = c.query(read.clone());
    assert_eq!(r.status, 503, "{:?}", r.body);
    assert_eq!(r.code(), "database_unavailable");
    drop(sidecar);

    let mut config = common::sidecar::test_config(&redis, &pg);
    config.postgres.url = url("disable").into();
    let sidecar = Sidecar::start(config);
    let c = common::Client::new(&sidecar.base_url(), common::SECRET);
    assert_eq!(c.query(read).status, 200);
    assert!(
        sidecar_ssl(&pg).iter().any(|s| !*s),
        "sslmode=disable is plain"
    );
}
