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
    let env = [("FERRY_CONFIG", sample)];
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

/// The same deployment, writes under the knife: a write in flight on the killed sidecar is
/// either answered 200 (the Worker's client asked the live sidecar for its outcome, and it had
/// committed) or answered an error and never commits. Postgres's rows judge every answer.
#[test]
fn writes_through_the_edge_fail_cleanly_or_succeed_when_their_sidecar_dies() {
    // Each write takes 200 ms to commit (a deferred trigger), so the kill finds writes
    // committing as well as running.
    let d = deployment(|pg| {
        pg.client()
            .batch_execute(
                "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN PERFORM pg_sleep(0.2); RETURN NULL; END $$;
             CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON items
               DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.id >= 10000)
               EXECUTE FUNCTION slow_commit();",
            )
            .expect("slow commits");
    });
    let (pg, c, mut sidecars) = (&d.pg, &d.client, d.sidecars);

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
                            let body =
                                serde_json::json!({"name": format!("w{id}"), "price": "1.00"});
                            let auth = [("authorization", format!("Bearer {}", kit::API_KEY))];
                            let a = c
                                .send_raw(
                                    "PUT",
                                    &format!("/items/{id}"),
                                    body.to_string().into_bytes(),
                                    &auth,
                                )
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
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &sidecars[0].pid().to_string()])
        .status();
    let _ = sidecars[0].child.wait();
    std::thread::sleep(Duration::from_millis(1_500));
    stop.store(true, Ordering::Relaxed);
    let answers: Vec<(i64, u16, String)> = answers.join().expect("writers").concat();
    // Anything still running has ended by now (Postgres ends a dead client's transaction).
    std::thread::sleep(Duration::from_millis(500));
    let rows: std::collections::BTreeSet<i64> = pg
        .client()
        .query("SELECT id::bigint FROM items WHERE id >= 10000", &[])
        .expect("rows")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let ok: std::collections::BTreeSet<i64> =
        answers.iter().filter(|a| a.1 == 200).map(|a| a.0).collect();
    let failed: Vec<_> = answers.iter().filter(|a| a.1 != 200).collect();
    let asked = sidecars[1]
        .metric("ferry_requests_total{route=\"/v1/outcome\",status=\"200\"}")
        .unwrap_or(0.0);
    println!(
        "FIGURES sidecar SIGKILLed under writes through the edge: {} writes, {} answered 200, \
         {} errors, {asked} outcomes asked; rows {}",
        answers.len(),
        ok.len(),
        failed.len(),
        rows.len()
    );
    assert!(answers.len() > 20, "the load ran: {}", answers.len());
    let told_failed_but_committed: Vec<_> = failed.iter().filter(|a| rows.contains(&a.0)).collect();
    assert!(
        told_failed_but_committed.is_empty(),
        "answered an error, yet committed: {told_failed_but_committed:?}"
    );
    assert_eq!(
        rows, ok,
        "every write answered 200 is there, and only those"
    );
}
