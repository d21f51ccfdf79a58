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
-- Ferry's own role (postgres.owner_url): it owns the schema `ferry`, where Ferry keeps its books
-- (writes' nonces and outcomes, auth.nonce_table; deferred invalidations, cache.deferred_table).
-- No request runs as it. The sidecar makes the tables and the one function requests may call
-- (ferry.ferry_record_write, which asks for a proof only Ferry can give), and grants ferry_app
-- EXECUTE on it and nothing else: a request's SQL can neither forge nor erase Ferry's books.
DO $$ BEGIN
  CREATE ROLE ferry_owner LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;
DROP TABLE IF EXISTS ferry_nonces, ferry_deferred;
DROP SCHEMA IF EXISTS ferry CASCADE;
CREATE SCHEMA ferry AUTHORIZATION ferry_owner;

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
-- The stream's freshness marks are WAL messages (pg_logical_emit_message). Everyone may write
-- those by default, even in a read-only transaction: a request's SQL could then forge a mark
-- (stale cache entries served as fresh) or fill the disk with WAL. Only ferry_changes may now
-- (Ferry refuses to start while a request or token role still can).
DO $$ DECLARE f regprocedure; BEGIN
  FOR f IN SELECT oid::regprocedure FROM pg_proc WHERE proname = 'pg_logical_emit_message' LOOP
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO ferry_changes', f);
  END LOOP;
END $$;
DROP PUBLICATION IF EXISTS ferry;
CREATE PUBLICATION ferry FOR TABLE items;

-- Neon tokens ([[neon.tokens]]): each runs any SQL its holder sends, so each has a login role
-- of its own (postgres_url), apart from ferry_app and from each other: one role's sessions can
-- read each other's statements (pg_stat_activity) and end each other (pg_terminate_backend).
-- Neither holds `authenticated` (a token could then act as any end user).
DO $$ BEGIN
  CREATE ROLE ferry_neon LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;
DO $$ BEGIN
  CREATE ROLE ferry_neon_ro LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;
GRANT USAGE ON SCHEMA public TO ferry_neon, ferry_neon_ro;
GRANT SELECT, INSERT, UPDATE, DELETE ON items TO ferry_neon;
GRANT SELECT ON items TO ferry_neon_ro;
-- Large objects are written even inside a read-only transaction: a read-only token's role must
-- not reach these (Ferry refuses to start otherwise). Revoked from PUBLIC; grant them back to
-- a role that needs them.
REVOKE EXECUTE ON FUNCTION lo_creat(integer), lo_create(oid), lo_from_bytea(oid, bytea),
    lo_import(text), lo_import(text, oid), lo_put(oid, bigint, bytea), lo_unlink(oid),
    lo_truncate(integer, integer), lo_truncate64(integer, bigint), lowrite(integer, bytea)
    FROM PUBLIC;

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
    USING (owner = nullif(current_setting('request.jwt.claims', true), '')::json ->> 'sub')
    WITH CHECK (owner = nullif(current_setting('request.jwt.claims', true), '')::json ->> 'sub');
-- The change stream watches notes too (the dev command's changes.tables): the per-user reads of
-- /me/notes are cached on it, each user's entries apart, and dropped by any committed change.
GRANT SELECT ON notes TO ferry_changes;
ALTER PUBLICATION ferry ADD TABLE notes;
