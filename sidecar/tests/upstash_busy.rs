//! The Upstash door's first request meets a busy Redis: a tenant's script runs long, and Redis
//! answers every other command `-BUSY` until it is killed. The door reads Redis's command table
//! (`COMMAND`) on first use and keeps it; an error answer kept as the table (an empty one)
//! would refuse every command as "not available" until a restart. Once the script is killed,
//! the door must work: Redis's own keys judge.

use ferry_testkit::doors::config_file;
use ferry_testkit::{PgServer, RedisServer, SidecarProcess};
use serde_json::json;
use std::process::Stdio;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
const TOKEN: &str = "upstash-busy-rw-0123456789abcdefghijklmn";

#[test]
fn a_busy_redis_on_the_doors_first_request_is_not_kept_as_its_command_table() {
    let (cache, pg, door) = (
        RedisServer::start(),
        PgServer::start(),
        RedisServer::start(),
    );
    pg.setup_demo_schema();
    let file = config_file(&format!(
        "[upstash]\nenabled = true\nredis_url = \"{}\"\n\
         [[upstash.tokens]]\ntoken = \"{TOKEN}\"\nprefix = \"app:\"\n",
        door.url()
    ));
    let s = SidecarProcess::start(
        BIN,
        &cache.url(),
        &pg.url(),
        &[("FERRY_CONFIG", file.path().to_str().expect("utf-8"))],
        Stdio::null(),
    );

    // A script that never ends, on the door's Redis; past 100 ms Redis answers others -BUSY.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("busy-reply-threshold")
        .arg("100")
        .query(&mut door.conn())
        .expect("threshold");
    let script = {
        let mut conn = door.conn();
        std::thread::spawn(move || {
            redis::cmd("EVAL")
                .arg("while true do end")
                .arg(0)
                .query::<()>(&mut conn)
                .expect_err("the script is killed")
        })
    };
    let started = Instant::now();
    let mut probe = door.conn();
    while redis::cmd("PING").query::<String>(&mut probe).is_ok() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "Redis never got busy"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // The door's first request, while Redis is busy: refused, whatever the words.
    let busy = s
        .client
        .upstash(TOKEN, "/", json!(["SET", "greeting", "hello"]));
    assert!(
        busy.body.get("result").is_none(),
        "nothing was set while Redis was busy: {} {}",
        busy.status,
        busy.body
    );

    let _: () = redis::cmd("SCRIPT")
        .arg("KILL")
        .query(&mut probe)
        .expect("script kill");
    script.join().expect("script thread");

    // Redis is itself again: so is the door.
    let set = s
        .client
        .upstash(TOKEN, "/", json!(["SET", "greeting", "hello"]));
    assert_eq!(
        (set.status, set.body.clone()),
        (200, json!({"result": "OK"})),
        "the door works once Redis does"
    );
    let stored: Option<String> = redis::cmd("GET")
        .arg("app:greeting")
        .query(&mut door.conn())
        .expect("get");
    assert_eq!(stored.as_deref(), Some("hello"));
}
