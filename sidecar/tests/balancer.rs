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

#[test]
fn reads_through_the_edge_survive_a_sidecar_killed_behind_the_balancer() {
    let redis = RedisServer::start();
    let pg = PgServer::start();
    pg.setup_demo_schema();
    // The sample config, for the named queries the Worker's routes use.
    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/ferry.toml");
    let env = [("FERRY_CONFIG", sample)];
    let mut sidecars: Vec<SidecarProcess> = (0..2)
        .map(|_| SidecarProcess::start(BIN, &redis.url(), &pg.url(), &env, Stdio::null()))
        .collect();
    let lb = Balancer::start(&[sidecars[0].port, sidecars[1].port]);
    let edge = kit::WranglerDev::start(&lb.url(), kit::SECRET, 5_000);
    let c = Client::new(&edge.url(), kit::SECRET);
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
