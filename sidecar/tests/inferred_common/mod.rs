//! What the inferred-caching tests share: a logical Postgres with a blog's tables (a view over
//! a view over a join, an inheritance child, a schema of its own, a case-insensitive key),
//! the binary with `[changes]` on as the least-privilege `ferry_app`, and reads cached with no
//! tables named.
#![allow(dead_code)]
use crate::change_stream_common::*;
use ferry_testkit::{client::Answer, wait_until, PgServer, RedisServer, SidecarProcess};
use serde_json::{json, Value};
use std::process::Stdio;
use std::time::Duration;

pub const TOKEN: &str = "neon-inferred-token-0123456789abcdef0123456";

pub const SCHEMA: &str = "
CREATE TABLE authors (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE posts (id int PRIMARY KEY, author_id int NOT NULL, title text NOT NULL);
CREATE TABLE audit (id int PRIMARY KEY, note text NOT NULL);
INSERT INTO authors VALUES (1, 'ada'), (2, 'bob');
INSERT INTO posts VALUES (1, 1, 'first'), (2, 1, 'second'), (3, 2, 'third');
INSERT INTO audit VALUES (1, 'unwatched');
CREATE TABLE comments (id int PRIMARY KEY, post_id int NOT NULL, body text NOT NULL);
CREATE INDEX ON comments (post_id);
INSERT INTO comments VALUES (1, 1, 'c1'), (2, 1, 'c2'), (3, 2, 'c3');
CREATE TABLE gen (id int PRIMARY KEY, a int NOT NULL, g int GENERATED ALWAYS AS (a * 2) STORED);
CREATE INDEX ON gen (g);
INSERT INTO gen (id, a) VALUES (1, 10);
CREATE TABLE partial (id int PRIMARY KEY, post_id int NOT NULL, body text NOT NULL);
CREATE INDEX ON partial (post_id);
INSERT INTO partial VALUES (1, 1, 'p1');
CREATE TABLE slugs (id int PRIMARY KEY, slug text COLLATE \"C\" NOT NULL);
CREATE INDEX ON slugs (slug);
INSERT INTO slugs VALUES (1, repeat('a', 63));
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE TABLE moods (id int PRIMARY KEY, m mood NOT NULL);
INSERT INTO moods VALUES (1, 'sad');
CREATE VIEW author_posts AS
  SELECT a.id, a.name, p.title FROM authors a JOIN posts p ON p.author_id = a.id;
CREATE VIEW author_page AS SELECT * FROM author_posts;
CREATE TABLE parent (id int PRIMARY KEY, v text NOT NULL);
CREATE TABLE child () INHERITS (parent);
INSERT INTO parent VALUES (1, 'p');
INSERT INTO child VALUES (2, 'c');
CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
CREATE TABLE users (name text COLLATE ci PRIMARY KEY, v int NOT NULL);
INSERT INTO users VALUES ('alice', 1);
CREATE SCHEMA sx;
CREATE TABLE sx.secret (id int PRIMARY KEY, s text NOT NULL);
INSERT INTO sx.secret VALUES (1, 'topsecret');
GRANT USAGE ON SCHEMA sx TO ferry_app, ferry_changes;
GRANT SELECT ON authors, posts, comments, gen, partial, slugs, moods, audit, author_posts, author_page, parent, child, sx.secret, users
  TO ferry_app, ferry_changes, ferry_neon;
ALTER PUBLICATION ferry ADD TABLE authors, posts, comments, gen, partial (id, body), slugs, moods,
  parent, child, sx.secret, users;
";

/// The tables the shared stack's stream watches.
pub const WATCHED: &str =
    "orders,authors,posts,comments,gen,partial,slugs,moods,parent,child,sx.secret,users";

pub fn stack() -> (RedisServer, PgServer, SidecarProcess) {
    stack_with(&[])
}

pub fn stack_with(extra: &[(&str, &str)]) -> (RedisServer, PgServer, SidecarProcess) {
    stack_more("", extra)
}

/// The stack with `more` schema made after the shared one (before the sidecar starts); its
/// tables watched through `extra`'s `FERRY_CHANGES_TABLES` (which replaces the default).
pub fn stack_more(more: &str, extra: &[(&str, &str)]) -> (RedisServer, PgServer, SidecarProcess) {
    let (redis, pg) = (RedisServer::start(), logical_pg());
    pg.client().batch_execute(SCHEMA).expect("schema");
    pg.client().batch_execute(more).expect("more schema");
    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/ferry.toml");
    let stream_url = pg.url().replace("postgres@", "ferry_changes@");
    let neon_url = pg.url_as("ferry_neon");
    let env = [
        ("FERRY_CONFIG", sample),
        ("FERRY_CHANGES_URL", stream_url.as_str()),
        ("FERRY_CHANGES_ENABLED", "true"),
        ("FERRY_CHANGES_TABLES", WATCHED),
        ("FERRY_CHANGES_MAX_LAG_MS", "400"),
        ("FERRY_CHANGES_HEARTBEAT_MS", "50"),
        ("FERRY_NEON_ENABLED", "true"),
        ("FERRY_NEON_TOKEN", TOKEN),
        ("FERRY_NEON_POSTGRES_URL", neon_url.as_str()),
        ("FERRY_NEON_CACHE_TTL_S", "600"),
    ];
    let env: Vec<(&str, &str)> = env.iter().chain(extra).copied().collect();
    let s = SidecarProcess::start(
        BIN,
        &redis.url(),
        &pg.url_as("ferry_app"),
        &env,
        Stdio::null(),
    );
    wait_caught_up(&s);
    (redis, pg, s)
}

/// A raw read cached for 600 s with no tables named.
pub fn read(s: &SidecarProcess, sql: &str, params: Value) -> Answer {
    let a = s
        .client
        .query(json!({"sql": sql, "params": params, "cache": {"ttl_s": 600}}));
    assert_eq!(a.status, 200, "{sql}: {:?}", a.body);
    a
}

/// Reads until the answer is a hit, each answer checked by `fresh` (what Postgres holds now).
pub fn until_hit(s: &SidecarProcess, sql: &str, params: Value, fresh: impl Fn(&Value)) {
    wait_until("a hit with the fresh rows", Duration::from_secs(10), || {
        let a = read(s, sql, params.clone());
        fresh(&a.body["rows"]);
        a.body["cache"] == "hit"
    });
}

/// Waits out the change stream's bound after a write, and until the stream has caught up.
pub fn settle(s: &SidecarProcess) {
    after_bound(std::time::Instant::now());
    wait_caught_up(s);
}
