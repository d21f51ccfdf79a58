//! `ferry-sidecar --explain-cache 'SELECT ...'`: what a read depends on, from Postgres's own
//! parse of it, and whether it can be cached and stay fresh. The adversary is a statement that
//! hides what it reads or calls: a view over a view over a join, a CTE and subqueries, a
//! stable or volatile function, a table the change stream does not watch, a system catalog, a
//! materialized view, a view redefined to read another table; and a read by its key's value
//! told apart from one by a range, and a join read by one value. The binary against a real
//! Postgres; what Postgres parsed judges, never the statement's text.
use ferry_testkit::PgServer;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-sidecar");

const SCHEMA: &str = "
CREATE TABLE posts (id int PRIMARY KEY, author_id int, title text);
CREATE TABLE authors (id int PRIMARY KEY, name text);
CREATE TABLE audit (id int);
CREATE VIEW post_view AS SELECT p.id, p.title, a.name FROM posts p JOIN authors a ON a.id = p.author_id;
CREATE VIEW author_page AS SELECT * FROM post_view;
CREATE MATERIALIZED VIEW post_counts AS SELECT author_id, count(*) AS n FROM posts GROUP BY 1;
CREATE TABLE members (post int);
CREATE TABLE shared_posts (id int, title text);
ALTER TABLE shared_posts ENABLE ROW LEVEL SECURITY;
CREATE POLICY members_only ON shared_posts USING (id IN (SELECT post FROM members));
CREATE FUNCTION shout(text) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT upper($1) $$;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO ferry_app;
CREATE VIEW mine AS SELECT id FROM posts;
ALTER VIEW mine OWNER TO ferry_app;
";

/// The explanation of `sql`, with the change stream watching posts and authors (or off).
fn explain(pg: &PgServer, sql: &str, changes: bool) -> (i32, String) {
    explain_with(pg, sql, changes, &[])
}

/// [`explain`], with `extra` environment.
fn explain_with(pg: &PgServer, sql: &str, changes: bool, extra: &[(&str, &str)]) -> (i32, String) {
    let changes = (
        "FERRY_CHANGES_ENABLED",
        if changes { "true" } else { "false" },
    );
    let env: Vec<(&str, &str)> = [changes].into_iter().chain(extra.iter().copied()).collect();
    run(pg, &["--explain-cache", sql], &env)
}

/// The binary with `args`, as `ferry_app` with its own roles, the change stream's tables
/// posts and authors, and `env`: (exit code, everything it printed).
fn run(pg: &PgServer, args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new(BIN)
        .args(args)
        .env_clear()
        .env("FERRY_SECRET", ferry_testkit::SECRET)
        .env("FERRY_DATABASE_URL", pg.url_as("ferry_app"))
        .envs(ferry_testkit::process::roles_env(&pg.url_as("ferry_app")))
        .env("FERRY_CHANGES_TABLES", "posts,authors")
        .envs(env.iter().copied())
        .output()
        .expect("run binary");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

fn cache_line(text: &str) -> String {
    text.lines()
        .find(|l| l.starts_with("cache: "))
        .unwrap_or_else(|| panic!("no cache line: {text}"))
        .to_string()
}

#[test]
fn dependencies_come_from_postgres_and_only_what_can_stay_fresh_is_cached() {
    let pg = PgServer::start();
    pg.setup_demo_schema();
    pg.client().batch_execute(SCHEMA).expect("schema");
    let fresh_on_both = "cache: cached with no table named, dropped by any committed change \
                         to public.authors, public.posts";

    // A view over a view over a join: both base tables, seen through two views.
    let (code, text) = explain(&pg, "SELECT * FROM author_page WHERE id = $1", true);
    assert_eq!(code, 0, "{text}");
    assert_eq!(cache_line(&text), fresh_on_both, "{text}");
    assert!(text.contains("public.post_view (view)"), "{text}");

    // A CTE and subqueries: the tables inside them count.
    let sql = "WITH recent AS (SELECT id FROM posts ORDER BY id DESC LIMIT 5) \
               SELECT name FROM authors WHERE id IN \
               (SELECT author_id FROM posts WHERE id IN (SELECT id FROM recent))";
    assert_eq!(cache_line(&explain(&pg, sql, true).1), fresh_on_both);

    // A join whose second table is the one that changes: it is a dependency too.
    let sql = "SELECT p.title FROM posts p JOIN authors a ON a.id = p.author_id WHERE a.id = $1";
    assert_eq!(cache_line(&explain(&pg, sql, true).1), fresh_on_both);

    // Functions whose result changes with no write: never cached, the reason named.
    let (code, text) = explain(
        &pg,
        "SELECT id FROM posts WHERE created_at_guard(now())",
        true,
    );
    assert!(
        text.contains("created_at_guard"),
        "an unknown function must be named: {text}"
    );
    // Postgres could not analyse it: said, and the command fails.
    assert_eq!(code, 2, "{text}");
    let (_, text) = explain(&pg, "SELECT id, now() AS t FROM posts WHERE id = $1", true);
    assert_eq!(
        cache_line(&text),
        "cache: could not be kept fresh by the change stream: it calls stable now(): its result \
         can change with no write to any table"
    );
    let (_, text) = explain(&pg, "SELECT id FROM post_view WHERE random() < 0.5", true);
    assert!(cache_line(&text).contains("volatile random()"), "{text}");
    assert!(
        text.contains("session reset after it, as a named query: yes"),
        "{text}"
    );

    // A user's function, however it is marked: Postgres cannot say what it reads.
    let (_, text) = explain(&pg, "SELECT shout(title) FROM posts WHERE id = $1", true);
    assert!(
        cache_line(&text).contains("user-defined function shout(text)"),
        "{text}"
    );
    assert!(
        cache_line(&text).contains("cache.immutable_functions = [\"public.shout(text)\"]"),
        "{text}"
    );
    // The operator vouches for it: then it is cached on what it reads.
    let (_, text) = explain_with(
        &pg,
        "SELECT shout(title) FROM posts WHERE id = $1",
        true,
        &[("FERRY_CACHE_IMMUTABLE_FUNCTIONS", "public.shout(text)")],
    );
    assert_eq!(
        cache_line(&text),
        "cache: cached with no table named, dropped by any committed change to public.posts",
        "{text}"
    );
    // A view the request role owns: a request could redefine it.
    let (_, text) = explain(&pg, "SELECT id FROM mine", true);
    assert!(cache_line(&text).contains("public.mine, which the role requests run as owns"));
    // A row-level-security policy reads another table: that table is a dependency too.
    let (_, text) = explain(&pg, "SELECT title FROM shared_posts WHERE id = $1", true);
    assert!(text.contains("public.members (table)"), "{text}");
    assert!(
        cache_line(&text).contains("public.members, which the change stream"),
        "{text}"
    );

    // What the change stream does not see: an unwatched table, a system catalog, a
    // materialized view.
    let (_, text) = explain(&pg, "SELECT count(*) FROM audit", true);
    assert!(cache_line(&text).contains("public.audit, which the change stream does not watch"));
    let (_, text) = explain(&pg, "SELECT relname FROM pg_class WHERE oid = $1", true);
    assert!(
        cache_line(&text).contains("system catalog pg_catalog.pg_class"),
        "{text}"
    );
    let (_, text) = explain(&pg, "SELECT n FROM post_counts WHERE author_id = $1", true);
    assert!(
        cache_line(&text).contains("materialized view public.post_counts"),
        "{text}"
    );

    // The view redefined to read another table: the next analysis sees it.
    pg.client()
        .batch_execute(
            "CREATE OR REPLACE VIEW post_view AS SELECT p.id, p.title, a.name FROM posts p \
             JOIN authors a ON a.id = p.author_id WHERE p.id NOT IN (SELECT id FROM audit)",
        )
        .expect("redefine the view");
    let (_, text) = explain(&pg, "SELECT * FROM author_page WHERE id = $1", true);
    assert!(cache_line(&text).contains("public.audit"), "{text}");
    // Every reason is given, not only the first.
    let (_, text) = explain(&pg, "SELECT count(*), now() FROM audit", true);
    let line = cache_line(&text);
    assert!(
        line.contains("stable now()") && line.contains("public.audit"),
        "{line}"
    );

    // The change stream off: nothing can be kept fresh.
    let (_, text) = explain(&pg, "SELECT title FROM posts WHERE id = $1", false);
    assert!(
        cache_line(&text).contains("the change stream is off"),
        "{text}"
    );

    // Not a read: refused, as a read request would be.
    let (code, text) = explain(&pg, "DELETE FROM posts", true);
    assert_eq!(code, 2, "{text}");
}

/// `--check-config` says, for each named read cached with no tables named, the tables
/// Postgres says it reads, or (a warning) why it will be answered uncached.
#[test]
fn check_config_names_what_each_named_read_is_cached_on() {
    let pg = PgServer::start_logical();
    pg.setup_demo_schema();
    pg.client().batch_execute(SCHEMA).expect("schema");
    pg.client()
        .batch_execute(
            "GRANT SELECT ON posts, authors TO ferry_changes;
             ALTER PUBLICATION ferry ADD TABLE posts, authors;",
        )
        .expect("publication");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ferry.toml");
    std::fs::write(
        &path,
        r#"
[queries.page]
sql = "SELECT * FROM author_page WHERE id = $1"
ttl_s = 60
[queries.clock]
sql = "SELECT now() AS at, title FROM posts WHERE id = $1"
ttl_s = 60
[queries.named_tables]
sql = "SELECT id FROM audit"
ttl_s = 60
tables = ["posts"]
[queries.post]
sql = "SELECT title FROM posts WHERE id = $1"
ttl_s = 60
"#,
    )
    .expect("config");
    let changes_url = pg.url_as("ferry_changes");
    let (_, text) = run(
        &pg,
        &[
            "--config",
            path.to_str().unwrap_or_default(),
            "--check-config",
        ],
        &[
            ("FERRY_CHANGES_ENABLED", "true"),
            ("FERRY_CHANGES_URL", changes_url.as_str()),
        ],
    );
    assert!(
        text.contains(
            "queries.page: cached, dropped by any committed change to public.authors, public.posts"
        ),
        "{text}"
    );
    assert!(
        text.contains("queries.clock: has ttl_s and no tables, but is answered uncached: it calls stable now()"),
        "{text}"
    );
    // A named query that names its tables is kept fresh by those: nothing inferred.
    assert!(!text.contains("queries.named_tables: cached"), "{text}");
    // A read of one row by its key, the table published: by the key's value alone.
    assert!(
        text.contains("queries.post: cached by the value of public.posts.id in $1"),
        "{text}"
    );
    let (code, text) = explain(&pg, "SELECT title FROM posts WHERE id = $1", true);
    assert_eq!(code, 0, "{text}");
    assert!(
        cache_line(&text).starts_with(
            "cache: cached with no table named, by the value of public.posts.id in $1"
        ),
        "{text}"
    );
    // Not by a column the index does not take whole: the table.
    let (_, text) = explain(&pg, "SELECT title FROM posts WHERE id > $1", true);
    assert!(
        cache_line(&text).contains("dropped by any committed change to public.posts"),
        "{text}"
    );
    // The first posts in the order of their key: by the rows it returns. With an OFFSET
    // (which the plan does not print), by its table.
    let (_, text) = explain(
        &pg,
        "SELECT id, title FROM posts ORDER BY id DESC LIMIT 10",
        true,
    );
    assert!(
        cache_line(&text).starts_with(
            "cache: cached with no table named, by the rows it returns, the first of \
             public.posts in the order of id"
        ),
        "{text}"
    );
    let skip = "SELECT id, title FROM posts ORDER BY id DESC LIMIT 10 OFFSET 5";
    let (_, text) = explain(&pg, skip, true);
    assert!(
        cache_line(&text).contains("dropped by any committed change to public.posts"),
        "{text}"
    );
    // A join read by one value in both tables, once posts can be found by author; the posts'
    // column is outside their replica identity, and the explanation says what that costs.
    pg.client()
        .batch_execute("CREATE INDEX ON posts (author_id)")
        .expect("index");
    let join = "SELECT p.title FROM posts p JOIN authors a ON a.id = p.author_id WHERE a.id = $1";
    let (_, text) = explain(&pg, join, true);
    assert!(
        cache_line(&text).starts_with(
            "cache: cached with no table named, by the value of public.authors.id in $1 and \
             public.posts.author_id in $1 (outside the table's replica identity: any UPDATE or \
             DELETE of the table drops it; REPLICA IDENTITY FULL would not)"
        ),
        "{text}"
    );
}
