//! Read-your-writes across requests, through the edge Worker in workerd: `PUT /items/:id`
//! answers the write's position and sets it in a `ferry_position` cookie; `GET /items/:id`
//! carries the cookie's position to the sidecar (`after`). With the change stream on, a
//! position the stream has not applied makes the read skip the cache, which is how the test
//! sees the position arrive. The cookie is signed: a position an anonymous client makes up
//! (which would send each of its reads past the cache, to Postgres) is no position at all.
use ferry_edge::ferry::position_cookie;
use ferry_shared::api::Position;
use ferry_testkit::{
    self as kit, client::Answer, Client, PgServer, RedisServer, Sidecar, WranglerDev,
};
use serde_json::json;

fn get(c: &Client, path: &str, cookie: Option<&str>) -> Answer {
    let headers: Vec<(&str, String)> = cookie
        .map(|c| vec![("cookie", c.to_string())])
        .unwrap_or_default();
    let a = c.raw("GET", path, Vec::new(), &headers);
    assert_eq!(a.status, 200, "{path}: {:?}", a.body);
    a
}

#[test]
fn a_write_position_goes_out_in_a_cookie_and_comes_back_with_the_next_read() {
    let redis = RedisServer::start();
    let pg = PgServer::start_logical();
    pg.setup_demo_schema();
    let mut config = kit::sidecar::test_config(&redis, &pg);
    config.changes.enabled = true;
    config.changes.url = pg.url().replace("postgres@", "ferry_changes@").into();
    config.changes.heartbeat_ms = 50;
    let sidecar = Sidecar::start(config);
    kit::wait_until(
        "the change stream",
        std::time::Duration::from_secs(30),
        || sidecar.state.cache_serves(),
    );
    let edge = WranglerDev::start(&sidecar.base_url(), kit::SECRET, 5_000);
    let c = Client::new(&edge.url(), kit::SECRET);

    get(&c, "/items/1", None);
    assert_eq!(
        get(&c, "/items/1", None).body["cache"],
        "hit",
        "{}",
        edge.log()
    );
    // A position far ahead of the stream, signed with the edge's secret: carried, so this read
    // skips the cache.
    let far: Position = "FFFFFFFF/0".parse().expect("position");
    let signed = position_cookie(far, kit::SECRET.as_bytes());
    let signed = signed.split(';').next().expect("pair");
    let ahead = get(&c, "/items/1", Some(signed));
    assert_eq!(ahead.body["cache"], "bypass", "{:?}", ahead.body);
    // The anonymous client's own far-ahead position, unsigned or signed with another key, would
    // send each of its reads past the cache: no position at all. So are malformed cookies.
    let forged = position_cookie(far, b"not-the-edge-secret-0123");
    let forged = forged.split(';').next().expect("pair").to_string();
    for cookie in [
        "ferry_position=FFFFFFFF/0",
        forged.as_str(),
        "ferry_position=nope",
        "theme=dark",
        "ferry_position=",
    ] {
        assert_eq!(
            get(&c, "/items/1", Some(cookie)).body["cache"],
            "hit",
            "{cookie}"
        );
    }

    let w = c.raw(
        "PUT",
        "/items/1",
        json!({"name": "chair", "price": "40.00"})
            .to_string()
            .into_bytes(),
        &[("authorization", format!("Bearer {}", kit::API_KEY))],
    );
    assert_eq!(w.status, 200, "{:?}", w.body);
    let position = w.body["position"].as_str().expect("position").to_string();
    let set = w.headers["set-cookie"].to_str().expect("ascii").to_string();
    assert!(
        set.starts_with(&format!("ferry_position={position}.")),
        "{set}"
    );
    assert!(set.contains("HttpOnly") && set.contains("Secure"), "{set}");
    let cookie = set.split(';').next().expect("pair").to_string();
    let r = get(&c, "/items/1", Some(&format!("theme=dark; {cookie}")));
    assert_eq!(r.body["item"]["name"], "chair", "{:?}", r.body);
}
