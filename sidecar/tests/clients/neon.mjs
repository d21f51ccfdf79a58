// Drives the sidecar's Neon-compatible /sql endpoint with the real @neondatabase/serverless
// driver and Drizzle's neon-http, unchanged: only `fetchEndpoint` points at the sidecar, and
// the connection string names a host that does not exist (Ferry never connects to it).
// Env: URL (the sidecar), TOKEN, RO_TOKEN. Prints one line per check; exits 1 on a failure.
import { neon, neonConfig, NeonDbError } from "@neondatabase/serverless";
import { drizzle } from "drizzle-orm/neon-http";
import { pgTable, serial, text, integer } from "drizzle-orm/pg-core";
import { eq } from "drizzle-orm";

neonConfig.fetchEndpoint = `${process.env.URL}/sql`;
const dsn = (token) => `postgresql://app:${token}@db.ferry.invalid/app?sslmode=require`;
const sql = neon(dsn(process.env.TOKEN));
const full = neon(dsn(process.env.TOKEN), { fullResults: true });
const arrays = neon(dsn(process.env.TOKEN), { arrayMode: true });
const ro = neon(dsn(process.env.RO_TOKEN));
const bad = neon(dsn("not-a-token-of-ours-not-a-token-of-ours"));

let failed = false;
const show = (v) => JSON.stringify(v, (_, x) => (typeof x === "bigint" ? `${x}n` : x));
async function check(name, fn, expected) {
  try {
    const got = await fn();
    const ok = show(got) === show(expected);
    console.log(`${ok ? "ok" : "FAIL"} ${name}: ${show(got)}${ok ? "" : ` (expected ${show(expected)})`}`);
    if (!ok) failed = true;
  } catch (e) {
    console.log(`FAIL ${name}: threw ${e} ${show(e)}`);
    failed = true;
  }
}
async function throws(name, fn, test) {
  try {
    const got = await fn();
    console.log(`FAIL ${name}: no error, got ${show(got)}`);
    failed = true;
  } catch (e) {
    const ok = test(e);
    console.log(`${ok ? "ok" : "FAIL"} ${name}: ${e} ${show({ ...e })}`);
    if (!ok) failed = true;
  }
}

// Parameters of every common type, parsed back by the driver's own type parsers.
const when = new Date("2026-11-30T12:34:56.789Z");
await check("int and text", () => sql`SELECT ${41}::int + 1 AS n, ${"héllo ✓"}::text AS t`, [{ n: 42, t: "héllo ✓" }]);
await check("bigint stays exact", () => sql`SELECT ${"9007199254740993"}::bigint AS b`, [{ b: "9007199254740993" }]);
await check("numeric", () => sql`SELECT ${"12345.6789"}::numeric AS x, 1.5::float8 AS f`, [{ x: "12345.6789", f: 1.5 }]);
await check("bool and null", () => sql`SELECT ${true}::bool AS t, ${false}::bool AS f, ${null}::int AS z`, [{ t: true, f: false, z: null }]);
await check("timestamptz", async () => {
  const [r] = await sql`SELECT ${when}::timestamptz AS at, ${when}::timestamptz + interval '1 day' AS next`;
  return [r.at.toISOString(), r.next.toISOString()];
}, ["2026-11-30T12:34:56.789Z", "2026-12-01T12:34:56.789Z"]);
await check("json and jsonb", () => sql`SELECT ${{ a: [1, "x"], b: null }}::jsonb AS j, ${JSON.stringify({ k: "v" })}::json AS k`, [{ j: { a: [1, "x"], b: null }, k: { k: "v" } }]);
await check("arrays", () => sql`SELECT ${[1, 2, 3]}::int[] AS a, ${["a,b", 'q"uote', "back\\slash", null]}::text[] AS t`, [{ a: [1, 2, 3], t: ["a,b", 'q"uote', "back\\slash", null] }]);
await check("bytea", async () => {
  const [r] = await sql`SELECT ${Buffer.from([0, 1, 254, 255])}::bytea AS b`;
  return [...r.b];
}, [0, 1, 254, 255]);
await check("a value is data, never SQL", () => sql`SELECT ${"'); DROP TABLE neon_items; --"}::text AS v`, [{ v: "'); DROP TABLE neon_items; --" }]);
await check("sql.query with $n", () => sql.query("SELECT $1::int * $2::int AS p", [6, 7]), [{ p: 42 }]);

// Writes, full results and array mode.
await check("insert, fullResults", async () => {
  const r = await full`INSERT INTO neon_items (name, qty) VALUES (${"a"}, ${1}), (${"b"}, ${2}) RETURNING id, name`;
  return { command: r.command, rowCount: r.rowCount, names: r.rows.map((x) => x.name), fields: r.fields.map((f) => [f.name, f.dataTypeID]) };
}, { command: "INSERT", rowCount: 2, names: ["a", "b"], fields: [["id", 23], ["name", 25]] });
await check("update, fullResults", async () => {
  const r = await full`UPDATE neon_items SET qty = qty + 1 WHERE name = ${"a"}`;
  return { command: r.command, rowCount: r.rowCount, rows: r.rows };
}, { command: "UPDATE", rowCount: 1, rows: [] });
await check("array mode", () => arrays`SELECT name, qty FROM neon_items ORDER BY name`, [["a", 2], ["b", 2]]);

// Transactions: options reach Postgres, and a failure rolls everything back.
await check("transaction with options", async () => {
  const [iso, ro_] = await sql.transaction(
    [sql`SELECT current_setting('transaction_isolation') AS i`, sql`SELECT current_setting('transaction_read_only') AS r`],
    { isolationLevel: "Serializable", readOnly: true, deferrable: true },
  );
  return [iso[0].i, ro_[0].r];
}, ["serializable", "on"]);
await check("transaction commits all", async () => {
  const [, , count] = await sql.transaction((tx) => [
    tx`INSERT INTO neon_items (name, qty) VALUES ('c', 3)`,
    tx`UPDATE neon_items SET qty = 30 WHERE name = 'c'`,
    tx`SELECT qty FROM neon_items WHERE name = 'c'`,
  ]);
  return count;
}, [{ qty: 30 }]);
await throws("a failing transaction rolls back", () => sql.transaction([
  sql`INSERT INTO neon_items (name, qty) VALUES ('d', 4)`,
  sql`INSERT INTO neon_items (name, qty) VALUES ('a', 5)`,
]), (e) => e instanceof NeonDbError && e.code === "23505" && e.constraint === "neon_items_name_key" && e.table === "neon_items" && /already exists/.test(e.detail));
await check("nothing of it stayed", () => sql`SELECT count(*)::int AS n FROM neon_items WHERE name = 'd'`, [{ n: 0 }]);
await throws("a read-only transaction cannot write", () => sql.transaction([sql`INSERT INTO neon_items (name, qty) VALUES ('e', 1)`], { readOnly: true }), (e) => e.code === "25006");

// Errors carry Postgres's fields.
await throws("syntax error with position", () => sql`SELEC 1`, (e) => e instanceof NeonDbError && e.code === "42601" && e.position === "1");
await throws("error position in the caller's SQL", () => sql`SELECT ${1}::int FROM no_such_table`, (e) => e.code === "42P01" && e.position === "21");
await throws("bad parameter value", () => sql`SELECT ${"abc"}::int AS n`, (e) => e.code === "22P02" && /invalid input syntax/.test(e.message));
await throws("parameter count", () => sql.query("SELECT $1::int, $2::int", [1]), (e) => e.code === "08P01");
await throws("transaction control is refused", () => sql`BEGIN`, (e) => e.code === "statement_not_allowed");
await throws("read-only token", () => ro`INSERT INTO neon_items (name, qty) VALUES ('f', 1)`, (e) => e.code === "25006");
await check("read-only token reads", () => ro`SELECT count(*)::int AS n FROM neon_items`, [{ n: 3 }]);
await throws("unknown token", () => bad`SELECT 1`, (e) => /HTTP status 401/.test(e.message));

// Drizzle ORM over neon-http.
const items = pgTable("neon_items", { id: serial("id").primaryKey(), name: text("name").notNull(), qty: integer("qty").notNull() });
const db = drizzle({ client: sql });
await check("drizzle insert returning", async () => (await db.insert(items).values({ name: "drizzle", qty: 7 }).returning({ name: items.name, qty: items.qty })), [{ name: "drizzle", qty: 7 }]);
await check("drizzle update", async () => (await db.update(items).set({ qty: 8 }).where(eq(items.name, "drizzle")).returning({ qty: items.qty })), [{ qty: 8 }]);
await check("drizzle select", async () => (await db.select({ name: items.name, qty: items.qty }).from(items).where(eq(items.name, "drizzle"))), [{ name: "drizzle", qty: 8 }]);
await check("drizzle batch", async () => {
  const [a, b] = await db.batch([db.select({ n: items.name }).from(items).where(eq(items.name, "a")), db.select({ n: items.name }).from(items).where(eq(items.name, "b"))]);
  return [a, b];
}, [[{ n: "a" }], [{ n: "b" }]]);

process.exit(failed ? 1 : 0);
