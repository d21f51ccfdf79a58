//! Two sidecar binaries behind nginx (deploy/nginx/ferry-balancer.conf), the Rust Worker in
//! workerd in front, as deployed. The adversary: a sidecar SIGKILLed under read load. Requests
//! in flight on it are answered 502 by the balancer, which never resends them (a resent signed
//! request would be a replay to every sidecar); the Worker's client sends those reads again,
//! freshly signed, and the balancer puts them on the live sidecar. Every read is answered.
use ferry_testkit::{self as kit, Balancer, Client, PgServer, RedisServer, SidecarProcess};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

/// Redis, Postgres (demo schema, then `prepare`), two sidecar binaries with the sample config
/// (the named queries the Worker's routes use), nginx in front, the Worker in workerd.
struct Deployment {
    _redis: RedisServer,
    pg: PgServer,
    sidecars: Vec<SidecarProcess>,
    _lb: Balancer,
    edge: kit::WranglerDev,
    client: Client,
}

fn deployment(prepare: impl FnOnce(&PgServer)) -> Deployment {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    prepare(&pg);
    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/ferry.toml");
    // Room for eight interactive transactions across the two sidecars: five each, with the
    // pooled share they come from (20 - 2 workers x 7 sessions) left one for writes.
    let env = [
        ("FERRY_CONFIG", sample),
        ("FERRY_POSTGRES_POOL_SIZE", "20"),
        ("FERRY_LIMITS_MAX_OPEN_TRANSACTIONS", "5"),
        // The load comes from one address: no anonymous budget for it (anonymous.rs tests it).
        ("FERRY_LIMITS_ANONYMOUS_RATE_PER_S", "0"),
        ("FERRY_LIMITS_ANONYMOUS_TOTAL_PER_S", "0"),
    ];
    let sidecars: Vec<SidecarProcess> = (0..2)
        .map(|_| SidecarProcess::start(BIN, &redis.url(), &pg.url(), &env, Stdio::null()))
        .collect();
    let lb = Balancer::start(&[sidecars[0].port, sidecars[1].port]);
    let edge = kit::WranglerDev::start(&lb.url(), kit::SECRET, 5_000);
    let client = Client::new(&edge.url(), kit::SECRET);
    Deployment {
        _redis: redis,
        pg,
        sidecars,
        _lb: lb,
        edge,
        client,
    }
}

#[test]
fn reads_through_the_edge_survive_a_sidecar_killed_behind_the_balancer() {
    let d = deployment(|_| {});
    let (c, edge, mut sidecars) = (&d.client, &d.edge, d.sidecars);
    assert_eq!(c.get("/items/1").status, 200, "{}", edge.log());

    let stop = Arc::new(AtomicBool::new(false));
    let answers = {
        let (c, stop) = (c.clone(), stop.clone());
        std::thread::spawn(move || {
            c.block_on(async {
                let readers = (0..16).map(|r| {
                    let (c, stop) = (c.clone(), stop.clone());
                    async move {
                        let mut seen = Vec::new();
                        let mut i = r;
                        while !stop.load(Ordering::Relaxed) {
                            // Misses and hits: ids come round every 500 requests a reader.
                            i = (i + 17) % 500 + 1;
                            let a = c
                                .send_raw("GET", &format!("/items/{i}"), Vec::new(), &[])
                                .await;
                            seen.push((a.status, a.body.to_string()));
                        }
                        seen
                    }
                });
                futures::future::join_all(readers).await
            })
        })
    };
    std::thread::sleep(Duration::from_millis(1_500));
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &sidecars[0].pid().to_string()])
        .status();
    let _ = sidecars[0].child.wait();
    std::thread::sleep(Duration::from_millis(2_500));
    stop.store(true, Ordering::Relaxed);
    let answers: Vec<(u16, String)> = answers.join().expect("readers").concat();
    let failed: Vec<_> = answers.iter().filter(|(s, _)| *s != 200).collect();
    println!(
        "FIGURES sidecar SIGKILLed behind nginx: {} reads through the edge, {} failed",
        answers.len(),
        failed.len()
    );
    assert!(answers.len() > 100, "the load ran: {}", answers.len());
    assert!(
        failed.is_empty(),
        "{} of {} reads failed, e.g. {:?}\n{}",
        failed.len(),
        answers.len(),
        failed.first(),
        edge.log()
    );
    // The live sidecar serves on its own afterwards.
    assert_eq!(c.get("/items/2").status, 200);
}

/// Each write of an item with an id from 10,000 up takes 200 ms to commit (a deferred
/// trigger), so a kill finds writes committing as well as running.
fn slow_commits(pg: &PgServer) {
    pg.client()
        .batch_execute(
            "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN PERFORM pg_sleep(0.2); RETURN NULL; END $$;
         CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON items
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.id >= 10000)
           EXECUTE FUNCTION slow_commit();",
        )
        .expect("slow commits");
}

/// What a load of writes through the edge saw when the first sidecar was SIGKILLed under it.
struct Knifed {
    /// (the write's first id, its status, its body), every write sent.
    answers: Vec<(i64, u16, String)>,
    /// The ids from 10,000 up that Postgres holds afterwards.
    rows: std::collections::BTreeSet<i64>,
    /// Outcomes the live sidecar answered (`/v1/outcome`, 200).
    asked: f64,
}

impl Knifed {
    /// The first ids of the writes answered 200.
    fn answered_ok(&self) -> std::collections::BTreeSet<i64> {
        self.answers
            .iter()
            .filter(|a| a.1 == 200)
            .map(|a| a.0)
            .collect()
    }

    /// Postgres judges: no write answered an error committed, and every one answered 200 did
    /// (`committed`: the first ids of those that did).
    fn judge(&self, committed: &std::collections::BTreeSet<i64>) {
        let told_failed_but_committed: Vec<_> = self
            .answers
            .iter()
            .filter(|a| a.1 != 200 && committed.contains(&a.0))
            .collect();
        assert!(
            told_failed_but_committed.is_empty(),
            "answered an error, yet committed: {told_failed_but_committed:?}"
        );
        assert_eq!(
            committed,
            &self.answered_ok(),
            "every write answered 200 is there, and only those"
        );
    }
}

/// One write through the edge: method, path and JSON body.
type Write = (&'static str, String, serde_json::Value);

/// 8 writers send `write(id)` (a path and a JSON body, authorized) for fresh ids (writer `w`
/// takes 10,000 + 1,000 w up, one a write) until 1.5 s after the first sidecar is SIGKILLed.
fn writes_under_the_knife(d: &mut Deployment, write: fn(i64) -> Write) -> Knifed {
    let (pg, c, sidecars) = (&d.pg, &d.client, &mut d.sidecars);
    let stop = Arc::new(AtomicBool::new(false));
    let answers = {
        let (c, stop) = (c.clone(), stop.clone());
        std::thread::spawn(move || {
            c.block_on(async {
                let writers = (0..8).map(|w| {
                    let (c, stop) = (c.clone(), stop.clone());
                    async move {
                        let mut seen = Vec::new();
                        let mut k = 0;
                        while !stop.load(Ordering::Relaxed) {
                            let id = 10_000 + w * 1_000 + k;
                            k += 1;
                            let (method, path, body) = write(id);
                            let auth = [("authorization", format!("Bearer {}", kit::API_KEY))];
                            let a = c
                                .send_raw(method, &path, body.to_string().into_bytes(), &auth)
                                .await;
                            seen.push((id, a.status, a.body.to_string()));
                        }
                        seen
                    }
                });
                futures::future::join_all(writers).await
            })
        })
    };
    std::thread::sleep(Duration::from_millis(1_000));
    // The knife falls while one of the first sidecar's commits is running (its backend in
    // the slow trigger's sleep, which only a commit runs): a kill at a fixed time found none often enough to fail.
    let mut watcher = pg.client();
    let committing = (0..200).any(|_| {
        let ports = sidecars[0].local_ports();
        let busy = watcher
            .query(
                "SELECT client_port FROM pg_stat_activity WHERE wait_event = 'PgSleep'",
                &[],
            )
            .expect("pg_stat_activity")
            .iter()
            .any(|r| ports.contains(&(r.get::<_, i32>(0) as u16)));
        busy || {
            std::thread::sleep(Duration::from_millis(10));
            false
        }
    });
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &sidecars[0].pid().to_string()])
        .status();
    let _ = sidecars[0].child.wait();
    std::thread::sleep(Duration::from_millis(1_500));
    stop.store(true, Ordering::Relaxed);
    assert!(
        committing,
        "no commit ran on the first sidecar within 2 s of load"
    );
    let answers: Vec<(i64, u16, String)> = answers.join().expect("writers").concat();
    // Anything still running has ended by now (Postgres ends a dead client's transaction).
    std::thread::sleep(Duration::from_millis(500));
    let rows = pg
        .client()
        .query("SELECT id::bigint FROM items WHERE id >= 10000", &[])
        .expect("rows")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let asked = sidecars[1]
        .metric("ferry_requests_total{route=\"/v1/outcome\",status=\"200\"}")
        .unwrap_or(0.0);
    Knifed {
        answers,
        rows,
        asked,
    }
}

/// The same deployment, writes under the knife: a write in flight on the killed sidecar is
/// either answered 200 (the Worker's client asked the live sidecar for its outcome, and it had
/// committed) or answered an error and never commits. Postgres's rows judge every answer.
#[test]
fn writes_through_the_edge_fail_cleanly_or_succeed_when_their_sidecar_dies() {
    let k = writes_under_the_knife(&mut deployment(slow_commits), |id| {
        let body = serde_json::json!({"name": format!("w{id}"), "price": "1.00"});
        ("PUT", format!("/items/{id}"), body)
    });
    let ok = k.answered_ok();
    println!(
        "FIGURES sidecar SIGKILLed under writes through the edge: {} writes, {} answered 200, \
         {} errors, {} outcomes asked; rows {}",
        k.answers.len(),
        ok.len(),
        k.answers.len() - ok.len(),
        k.asked,
        k.rows.len()
    );
    assert!(k.answers.len() > 20, "the load ran: {}", k.answers.len());
    k.judge(&k.rows);
}

/// Transactions under the knife (`PUT /items`, two items each, `/v1/transaction`): one whose
/// answer died with its sidecar cannot get its per-statement results back, but the Worker's
/// client still asks its outcome, so one that committed is never answered as a failure (the
/// route, which needs only the count, answers it 200), and one answered a failure left no row.
#[test]
fn transactions_through_the_edge_are_settled_by_their_outcome_when_their_sidecar_dies() {
    let k = writes_under_the_knife(&mut deployment(slow_commits), |id| {
        let item =
            |id: i64| serde_json::json!({"id": id, "name": format!("t{id}"), "price": "2.00"});
        (
            "PUT",
            "/items".into(),
            serde_json::json!({"items": [item(id), item(id + 500)]}),
        )
    });
    // Each transaction's rows, both or neither.
    let firsts: std::collections::BTreeSet<i64> = k
        .rows
        .iter()
        .copied()
        .filter(|id| id % 1_000 < 500)
        .collect();
    let seconds: std::collections::BTreeSet<i64> = k
        .rows
        .iter()
        .filter(|id| *id % 1_000 >= 500)
        .map(|id| id - 500)
        .collect();
    assert_eq!(firsts, seconds, "a transaction's two rows, both or neither");
    let ok = k.answered_ok();
    println!(
        "FIGURES sidecar SIGKILLed under transactions through the edge: {} transactions, {} \
         answered 200, {} errors, {} outcomes asked; committed {}",
        k.answers.len(),
        ok.len(),
        k.answers.len() - ok.len(),
        k.asked,
        firsts.len()
    );
    assert!(k.answers.len() > 10, "the load ran: {}", k.answers.len());
    k.judge(&firsts);
    assert!(
        k.asked > 0.0,
        "no transaction was in flight on the killed sidecar"
    );
    for (id, _, body) in k.answers.iter().filter(|a| a.1 == 200) {
        assert!(body.contains(r#""written":2"#), "{id}: {body}");
    }
}

/// Interactive transactions under the knife (`POST /items/:id/reprice`: begin, read the price
/// `FOR UPDATE`, +10% computed in the Worker, write, commit). Each writer reprices one item of
/// its own, whose COMMIT takes 200 ms, over and over. A transaction on the killed sidecar
/// before its commit dies with it (Postgres rolls it back); one whose commit was in flight is
/// settled by the commit's outcome. Postgres judges through the chain: each reprice answered
/// 200 must have read the price the one answered 200 before it wrote, so a reprice answered
/// as failed that had committed (or a lost update) breaks it, and the final price is the last
/// one answered.
#[test]
fn interactive_commits_through_the_edge_are_settled_by_their_outcome_when_their_sidecar_dies() {
    let mut d = deployment(|pg| {
        let mut c = pg.client();
        c.batch_execute(
            "INSERT INTO items (id, name, price)
               SELECT 10000 + w * 1000, 'repriced', 100.00 FROM generate_series(0, 7) AS w;
             CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN PERFORM pg_sleep(0.2); RETURN NULL; END $$;
             CREATE CONSTRAINT TRIGGER slow_commit AFTER UPDATE ON items
               DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.id >= 10000)
               EXECUTE FUNCTION slow_commit();",
        )
        .expect("items with slow commits");
    });
    let k = writes_under_the_knife(&mut d, |id| {
        let item = id - id % 1_000;
        let body = serde_json::json!({"percent": 10});
        ("POST", format!("/items/{item}/reprice"), body)
    });
    let mut pg = d.pg.client();
    let mut committed = 0;
    for w in 0..8 {
        let item = 10_000 + w * 1_000;
        let mut expected = "100.00".to_string();
        for (id, status, body) in k.answers.iter().filter(|a| a.0 - a.0 % 1_000 == item) {
            if *status != 200 {
                continue;
            }
            let answer: serde_json::Value = serde_json::from_str(body).expect("json");
            assert_eq!(
                answer["old_price"],
                expected.as_str(),
                "reprice {id} read another price than the last one answered wrote: a reprice \
                 answered as failed committed, or an update was lost"
            );
            expected = answer["price"].as_str().expect("price").to_string();
            committed += 1;
        }
        let price: String = pg
            .query_one(
                "SELECT price::text FROM items WHERE id = $1",
                &[&(item as i32)],
            )
            .expect("price")
            .get(0);
        assert_eq!(
            price, expected,
            "item {item}: Postgres holds the last price answered"
        );
    }
    println!(
        "FIGURES sidecar SIGKILLed under interactive transactions through the edge: {} \
         reprices, {committed} answered 200, {} errors, {} outcomes asked",
        k.answers.len(),
        k.answers.len() - committed,
        k.asked
    );
    assert!(committed > 8, "the load ran: {committed} committed");
    assert!(
        k.asked > 0.0,
        "no commit was in flight on the killed sidecar"
    );
}
