-- Ferry demo schema and seed data: used by the dev command and by the tests.
-- Safe to run again: it recreates the tables.
DROP TABLE IF EXISTS items;
CREATE TABLE items (
    id          integer PRIMARY KEY,
    name        text    NOT NULL,
    price       numeric(10, 2) NOT NULL,
    tags        text[]  NOT NULL DEFAULT '{}',
    updated_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO items (id, name, price, tags)
SELECT i,
       'item ' || i,
       round((i * 1.25)::numeric, 2),
       ARRAY['demo', CASE WHEN i % 2 = 0 THEN 'even' ELSE 'odd' END]
FROM generate_series(1, 1000) AS i;

-- The role the sidecar connects as (deploy/ferry.toml, the dev command, deploy/install.sh): it
-- may read and write the demo table and nothing else. Not a superuser (which could read server
-- files and run programs through SQL), no BYPASSRLS, no CREATE in the schema.
DO $$ BEGIN
  CREATE ROLE ferry_app LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO ferry_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON items TO ferry_app;
-- Writes' nonces, shared by every sidecar so none runs a replayed write (auth.replay =
-- "shared"). The sidecar creates this table itself when its role may; ferry_app may not.
DROP TABLE IF EXISTS ferry_nonces;
CREATE TABLE ferry_nonces (nonce bytea PRIMARY KEY, expires_at timestamptz NOT NULL,
                           rows_affected bigint);
GRANT SELECT, INSERT, DELETE ON ferry_nonces TO ferry_app;
-- Invalidations deferred while Redis was unreachable, applied by any sidecar (cache.deferred_table).
DROP TABLE IF EXISTS ferry_deferred;
CREATE TABLE ferry_deferred (id bigserial PRIMARY KEY, kind text NOT NULL, name text NOT NULL,
                             deferred_at timestamptz NOT NULL DEFAULT now());
GRANT SELECT, INSERT, DELETE ON ferry_deferred TO ferry_app;
GRANT USAGE ON SEQUENCE ferry_deferred_id_seq TO ferry_app;

-- Change-stream invalidation (deploy/ferry.toml [changes]): the stream reads a logical
-- replication slot as its own role, ferry_changes, with REPLICATION and SELECT on the watched
-- tables and nothing else. REPLICATION stays off ferry_app, which runs requests' SQL: a role
-- with it could make its own slot and read every table's changes. The publication is made
-- here because creating one needs ownership of its tables.
DO $$ BEGIN
  CREATE ROLE ferry_changes LOGIN REPLICATION NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;
GRANT USAGE ON SCHEMA public TO ferry_changes;
GRANT SELECT ON items TO ferry_changes;
DROP PUBLICATION IF EXISTS ferry;
CREATE PUBLICATION ferry FOR TABLE items;

-- Per-user identity (deploy/ferry.toml [identity], the edge's /me/notes): each note belongs to
-- the `sub` of the JWT the edge verified. The sidecar runs those requests as `authenticated`
-- with the claims in request.jwt.claims, and this policy lets each user see and add only their
-- own notes. ferry_app itself has no policy on notes, so it sees none of them.
DROP TABLE IF EXISTS notes;
CREATE TABLE notes (
    id          bigserial PRIMARY KEY,
    owner       text NOT NULL,
    body        text NOT NULL CHECK (length(body) BETWEEN 1 AND 500),
    created_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO notes (owner, body) VALUES
    ('alice', 'alice''s first note'), ('alice', 'alice''s second note'), ('bob', 'bob''s note');
DO $$ BEGIN
  CREATE ROLE authenticated NOLOGIN NOSUPERUSER NOBYPASSRLS;
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;
GRANT authenticated TO ferry_app;
GRANT SELECT, INSERT ON notes TO authenticated;
GRANT USAGE ON SEQUENCE notes_id_seq TO authenticated;
ALTER TABLE notes ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_notes ON notes TO authenticated
    USING (owner = current_setting('request.jwt.claims', true)::json ->> 'sub')
    WITH CHECK (owner = current_setting('request.jwt.claims', true)::json ->> 'sub');
