// The Neon driver's authToken (Neon's RLS path), unchanged, against the sidecar's /sql: each
// end user's JWT makes the statements run as that user, so Postgres's row-level security
// shows each only their own notes. HS256 with the shared secret, and ES256 against the JWKS
// the test serves (written to JWKS_FILE here). Env: URL, TOKEN, SECRET, JWKS_FILE.
import { neon, neonConfig } from "@neondatabase/serverless";
import { createHmac, generateKeyPairSync, sign } from "node:crypto";
import { writeFileSync } from "node:fs";
import { check, throws, done } from "./checks.mjs";

neonConfig.fetchEndpoint = `${process.env.URL}/sql`;
const conn = `postgresql://app:${process.env.TOKEN}@db.ferry.invalid/app`;
const b64 = (x) => Buffer.from(x).toString("base64url");
const exp = Math.floor(Date.now() / 1000) + 300;

function hs256(claims, secret = process.env.SECRET) {
  const input = `${b64(JSON.stringify({ alg: "HS256", typ: "JWT" }))}.${b64(JSON.stringify(claims))}`;
  return `${input}.${createHmac("sha256", secret).update(input).digest("base64url")}`;
}

// An ES256 key of the "provider", published as a JWKS.
const { publicKey, privateKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
const jwk = publicKey.export({ format: "jwk" });
writeFileSync(process.env.JWKS_FILE, JSON.stringify({ keys: [{ ...jwk, kid: "k1", alg: "ES256", use: "sig" }] }));
function es256(claims, kid = "k1") {
  const input = `${b64(JSON.stringify({ alg: "ES256", kid }))}.${b64(JSON.stringify(claims))}`;
  const sig = sign("sha256", Buffer.from(input), { key: privateKey, dsaEncoding: "ieee-p1363" });
  return `${input}.${sig.toString("base64url")}`;
}

const notes = (authToken) => neon(conn, { authToken })`SELECT owner FROM notes ORDER BY id`;
const owners = async (authToken) => [...new Set((await notes(authToken)).map((r) => r.owner))];

await check("alice sees only her notes (HS256)", () => owners(hs256({ sub: "alice", exp })), ["alice"]);
await check("bob sees only his (HS256)", () => owners(hs256({ sub: "bob", exp })), ["bob"]);
await check("an authToken given as a function", () => owners(async () => hs256({ sub: "bob", exp })), ["bob"]);
await check("alice, through the provider's JWKS (ES256)", () => owners(es256({ sub: "alice", exp })), ["alice"]);
await check("a write as alice is hers", async () => {
  const sql = neon(conn, { authToken: hs256({ sub: "alice", exp }) });
  await sql`INSERT INTO notes (owner, body) VALUES ('alice', 'from /sql')`;
  return (await sql`SELECT count(*)::int AS n FROM notes WHERE body = 'from /sql'`)[0].n;
}, 1);
await throws("bob cannot write as alice (the policy)", () =>
  neon(conn, { authToken: hs256({ sub: "bob", exp }) })`INSERT INTO notes (owner, body) VALUES ('alice', 'forged')`,
  /row-level security/);
await throws("a token signed with another secret", () => notes(hs256({ sub: "alice", exp }, "x".repeat(32))), /signature/);
await throws("an expired token", () => notes(hs256({ sub: "alice", exp: 1000 })), /expired/);
await throws("alg none", () => notes(`${b64('{"alg":"none"}')}.${b64(JSON.stringify({ sub: "alice", exp }))}.`), /algorithm/);
await throws("an ES256 token from an unknown key", () => notes(es256({ sub: "alice", exp }, "k2")), /key/);
await throws("a role the config does not allow", () => notes(hs256({ sub: "alice", exp, role: "postgres" })), /role/);
// Without a token the claims are empty: the policy reads no `sub`, and Postgres refuses.
// No claims on the session: the policy matches no owner (the demo's policy reads an unset or
// reset claims setting as no one, not as an error).
await check("without a token: no one's notes", () => owners(undefined), []);

done();
