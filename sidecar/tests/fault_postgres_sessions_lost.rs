//! Sessions lost under steady reads: Postgres's sessions killed (`pg_terminate_backend`), then
//! Postgres restarted, then frozen (SIGSTOP), on the binary with 4 readers on a pool of 4
//! (event-loop sessions and the pooled path). A lost session must be found and closed, never
//! handed to the next read, and never keep its slot: reads that start while Postgres can
//! answer all succeed, with Postgres's own row, and the others fail fast with a JSON 5xx.
//! Postgres never holds more of the sidecar's sessions than the pool, nor one left in a
//! transaction or with a lock. Run twice: with the demo's `[queries.item]`, which skips the
//! session reset (Postgres finds it plain), so no reset after a read finds its session dead;
//! and with the reset after every read (`skip_reset = false`).
use ferry_testkit::DemoBinary;
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");
const POOL: i64 = 4;

/// One read's answer: when it started, how long it took, its status and what was wrong.
struct Read {
    started: Instant,
    took: Duration,
    status: u16,
    code: String,
    wrong: Option<String>,
}

/// The sidecar's sessions in Postgres, as `pg_stat_activity` counts them.
fn sidecar_sessions(c: &mut postgres::Client, filter: &str) -> Result<i64, postgres::Error> {
    let sql = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'ferry-sidecar' {filter}"
    );
    Ok(c.query_one(&sql, &[])?.get(0))
}

#[test]
fn reads_that_skip_the_reset_never_get_a_dead_session() {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/ferry.toml");
    killed_restarted_and_frozen(config, "skip_reset");
}

/// The same with the reset after every read (asked for), which finds no dead session
/// either: it runs after the read, on the session the read just used.
#[test]
fn reads_with_the_reset_never_get_a_dead_session() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("ferry.toml");
    let sample = include_str!("../../deploy/ferry.toml");
    assert!(
        sample.contains("\n[queries.item]\n"),
        "the demo has an item query"
    );
    let reset = sample.replace(
        "\n[queries.item]\n",
        "\n[queries.item]\nskip_reset = false\n",
    );
    std::fs::write(&file, reset).expect("config");
    killed_restarted_and_frozen(file.to_str().expect("utf-8"), "reset");
}

fn killed_restarted_and_frozen(config: &str, label: &str) {
    let pool = POOL.to_string();
    let DemoBinary {
        redis: _redis,
        mut pg,
        sidecar: s,
    } = DemoBinary::start(
        BIN,
        &[
            ("FERRY_CONFIG", config),
            ("FERRY_POSTGRES_POOL_SIZE", pool.as_str()),
            ("FERRY_SERVER_WORKERS", "2"),
            ("FERRY_SERVER_REQUEST_TIMEOUT_MS", "1000"),
            ("FERRY_POSTGRES_CHECKOUT_TIMEOUT_MS", "500"),
        ],
    );
    let names: HashMap<i32, String> = pg
        .client()
        .query("SELECT id, name FROM items WHERE id <= 50", &[])
        .expect("rows")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let pg_url = pg.url();
    let reads: Mutex<Vec<Read>> = Mutex::default();
    let most_sessions = AtomicI64::new(0);
    let (stop, pg_up) = (AtomicBool::new(false), AtomicBool::new(true));
    // When Postgres was away: stopped, then frozen (from, to).
    let away: Mutex<Vec<(Instant, Instant)>> = Mutex::default();
    std::thread::scope(|scope| {
        for r in 0..4 {
            let (s, reads, names, stop) = (&s, &reads, &names, &stop);
            scope.spawn(move || {
                let mut i = r * 13;
                while !stop.load(Ordering::SeqCst) {
                    i += 1;
                    let id = i % 50 + 1;
                    let started = Instant::now();
                    // no-cache: every read runs the opted-in statement on Postgres.
                    let a = s.client.query(json!({
                        "query": "item", "params": [id], "cache": {"mode": "no-cache"},
                    }));
                    let wrong = match a.status {
                        200 if a.body["rows"][0]["name"] == names[&id].as_str() => None,
                        502..=504 if !a.code().is_empty() => None,
                        _ => Some(format!("{}: {}", a.status, a.body)),
                    };
                    let took = started.elapsed();
                    let (status, code) = (a.status, a.code().to_string());
                    let read = Read {
                        started,
                        took,
                        status,
                        code,
                        wrong,
                    };
                    reads.lock().unwrap().push(read);
                }
            });
        }
        // Postgres's count of the sidecar's sessions, sampled while it answers.
        scope.spawn(|| {
            let mut judge: Option<postgres::Client> = None;
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
                if !pg_up.load(Ordering::SeqCst) {
                    judge = None;
                    continue;
                }
                let c = match judge.as_mut() {
                    Some(c) => c,
                    None => match postgres::Client::connect(&pg_url, postgres::NoTls) {
                        Ok(c) => judge.insert(c),
                        Err(_) => continue,
                    },
                };
                match sidecar_sessions(c, "") {
                    Ok(n) => _ = most_sessions.fetch_max(n, Ordering::SeqCst),
                    Err(_) => judge = None,
                }
            }
        });
        let steady = || std::thread::sleep(Duration::from_millis(800));
        steady();
        // Every session of the sidecar killed under it, between or during reads.
        let killed: i64 = pg
            .client()
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                  WHERE application_name = 'ferry-sidecar'",
                &[],
            )
            .expect("terminate")
            .get(0);
        assert!(killed > 0, "the sidecar held no session to kill");
        steady();
        pg_up.store(false, Ordering::SeqCst);
        let stopped = Instant::now();
        pg.stop();
        std::thread::sleep(Duration::from_millis(1500));
        pg.start_again();
        away.lock().unwrap().push((stopped, Instant::now()));
        pg_up.store(true, Ordering::SeqCst);
        steady();
        pg_up.store(false, Ordering::SeqCst);
        let frozen = Instant::now();
        let pids = pg.freeze();
        std::thread::sleep(Duration::from_millis(1500));
        pg.thaw(&pids);
        away.lock().unwrap().push((frozen, Instant::now()));
        pg_up.store(true, Ordering::SeqCst);
        steady();
        stop.store(true, Ordering::SeqCst);
    });

    let reads = reads.into_inner().unwrap();
    let failed = |r: &&Read| r.status != 200;
    let away = away.into_inner().unwrap();
    // A read that overlapped an outage may fail; one that started after it may not.
    let while_away = |r: &&Read| {
        away.iter()
            .any(|(from, to)| r.started < *to && r.started + r.took > *from)
    };
    let wrong: Vec<&String> = reads.iter().filter_map(|r| r.wrong.as_ref()).collect();
    let slowest = reads.iter().map(|r| r.took).max().unwrap_or_default();
    let failed_away = reads.iter().filter(failed).filter(while_away).count();
    // Each named by when it started (ms after the test's start) and its answer.
    let t0 = reads
        .first()
        .map(|r| r.started)
        .unwrap_or_else(Instant::now);
    let failed_otherwise: Vec<String> = reads
        .iter()
        .filter(failed)
        .filter(|r| !while_away(r))
        .map(|r| {
            let at = r.started.duration_since(t0).as_millis();
            format!(
                "{} {} at {at} ms, {} ms",
                r.status,
                r.code,
                r.took.as_millis()
            )
        })
        .collect();
    let most = most_sessions.load(Ordering::SeqCst);
    let outages: Vec<(u128, u128)> = away
        .iter()
        .map(|(f, t)| {
            (
                f.duration_since(t0).as_millis(),
                t.duration_since(t0).as_millis(),
            )
        })
        .collect();
    println!(
        "FIGURES sessions lost ({label}): {} reads; {failed_away} failed while Postgres was stopped or \
         frozen, {} at other times; slowest answer {slowest:?} (deadline 1 s); at most {most} \
         sessions for a pool of {POOL}",
        reads.len(),
        failed_otherwise.len()
    );
    assert!(
        wrong.is_empty(),
        "wrong answers: {:?}",
        &wrong[..wrong.len().min(5)]
    );
    assert!(
        slowest < Duration::from_millis(2500),
        "an answer took {slowest:?}"
    );
    assert!(
        failed_otherwise.is_empty(),
        "reads failed with Postgres up (killed sessions, or back after {outages:?} ms): \
         {failed_otherwise:?}"
    );
    assert!(
        failed_away > 0,
        "the outages were not felt: the test proves nothing"
    );
    assert!(most <= POOL, "{most} sessions for a pool of {POOL}");
    assert!(most > 0, "no session was ever seen");

    // After it all: nothing left open in a transaction, no lock, reads as before.
    let c = &mut pg.client();
    let in_tx = sidecar_sessions(c, "AND state LIKE 'idle in transaction%'").expect("activity");
    assert_eq!(in_tx, 0, "a session was left in a transaction");
    let locks: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
              WHERE a.application_name = 'ferry-sidecar' AND l.locktype <> 'virtualxid'",
            &[],
        )
        .expect("pg_locks")
        .get(0);
    assert_eq!(locks, 0, "a session holds a lock");
    for id in 1..=8 {
        let a = s
            .client
            .query(json!({"query": "item", "params": [id], "cache": {"mode": "no-cache"}}));
        assert_eq!(a.status, 200, "{:?}", a.body);
    }
    assert!(pg.sidecar_backends() <= POOL);
}
