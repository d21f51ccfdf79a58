// Drives the sidecar's Upstash-compatible endpoints with the real @upstash/redis client,
// unchanged, with its defaults (base64 responses, read-your-writes sync token, auto
// retries). Env: URL, TOKEN (read-write), RO_TOKEN (read-only, same namespace), OTHER_TOKEN
// (another namespace). Prints one line per check; exits 1 if any failed.
import { Redis } from "@upstash/redis";
import { check, throws, done } from "./checks.mjs";

const url = process.env.URL;
const redis = new Redis({ url, token: process.env.TOKEN, retry: false });
const ro = new Redis({ url, token: process.env.RO_TOKEN, retry: false });
const other = new Redis({ url, token: process.env.OTHER_TOKEN, retry: false });
const bad = new Redis({ url, token: "not-a-token-of-ours-not-a-token-of-ours", retry: false });

// strings, unicode, binary-looking values, expiry
await check("set", () => redis.set("greeting", "héllo wörld ✓"), "OK");
await check("get", () => redis.get("greeting"), "héllo wörld ✓");
await check("set ex + ttl", async () => { await redis.set("temp", "x", { ex: 100 }); return (await redis.ttl("temp")) > 90; }, true);
await check("missing key", () => redis.get("nope"), null);
await check("mset/mget", async () => { await redis.mset({ a: "1", b: "two" }); return redis.mget("a", "b", "nope"); }, [1, "two", null]);
// numbers
await check("incr", () => redis.incr("counter"), 1);
await check("incrby", () => redis.incrby("counter", 41), 42);
await check("incrbyfloat", () => redis.incrbyfloat("float", 1.5), 1.5);
// JSON values (the client serializes objects and parses them back)
await check("json value", async () => { await redis.set("obj", { n: 1, list: [1, 2], s: "x" }); return redis.get("obj"); }, { n: 1, list: [1, 2], s: "x" });
// hashes
await check("hset", () => redis.hset("h", { f1: "v1", f2: 2 }), 2);
await check("hgetall", () => redis.hgetall("h"), { f1: "v1", f2: 2 });
await check("hget", () => redis.hget("h", "f1"), "v1");
// lists
await check("rpush", () => redis.rpush("l", "x", "y", "z"), 3);
await check("lrange", () => redis.lrange("l", 0, -1), ["x", "y", "z"]);
await check("lpop", () => redis.lpop("l"), "x");
// sets
await check("sadd", () => redis.sadd("s", "m1", "m2"), 2);
await check("smembers", async () => (await redis.smembers("s")).sort(), ["m1", "m2"]);
await check("sismember", () => redis.sismember("s", "m2"), 1);
// sorted sets
await check("zadd", () => redis.zadd("z", { score: 2, member: "b" }, { score: 1, member: "a" }), 2);
await check("zrange withscores", () => redis.zrange("z", 0, -1, { withScores: true }), ["a", 1, "b", 2]);
await check("zscore", () => redis.zscore("z", "b"), 2);
// pipeline (one request, answered in order, not atomic)
await check("pipeline", async () => {
  const p = redis.pipeline();
  p.set("p1", "v");
  p.get("p1");
  p.incr("pn");
  return p.exec();
}, ["OK", "v", 1]);
// multi (atomic)
await check("multi", async () => {
  const m = redis.multi();
  m.set("t1", "a");
  m.append("t1", "b");
  m.get("t1");
  return m.exec();
}, ["OK", 2, "ab"]);
// errors come back as errors
await throws("wrong type", () => redis.incr("greeting"), /ERR value is not an integer/);
await throws("blocking refused", () => redis.exec(["BLPOP", "l", "1"]), /not allowed/i);
// keyspace commands see the token's own keys, named without its namespace
await check("keys: its own", () => redis.keys("gree*"), ["greeting"]);
await check("scan: its own, whole", async () => {
  let [cursor, found] = ["0", []];
  do { const [next, keys] = await redis.scan(cursor, { count: 1000 }); cursor = next; found.push(...keys); } while (cursor !== "0");
  return [found.includes("greeting"), found.length === (await redis.dbsize())];
}, [true, true]);
await check("randomkey: its own", async () => (await redis.keys("*")).includes(await redis.randomkey()), true);
// scripts run as the token's Redis ACL user: its own keys only, whatever the script builds
await check("eval on its keys", () => redis.eval("return redis.call('GET', KEYS[1])", ["greeting"], []), "héllo wörld ✓");
await throws("eval escaping its namespace (Redis's ACL refuses it)", () => redis.eval("return redis.call('GET', 'other:greeting')", [], []), /can't access|NOPERM/);
await check("script (evalsha, then eval on NOSCRIPT)", () => redis.createScript("return ARGV[1] .. '!'").exec([], ["hi"]), "hi!");
await throws("read-only token: eval refused", () => ro.eval("return 1", [], []), /NOPERM/);
await throws("read-only token: a new script body refused (it would stay in Redis)", () => ro.evalRo("return redis.call('GET', KEYS[1])", ["greeting"], []), /NOPERM/);
const getter = await redis.scriptLoad("return redis.call('GET', KEYS[1])");
await check("read-only token: evalsha_ro of a loaded script", () => ro.evalshaRo(getter, ["greeting"], []), "héllo wörld ✓");
await throws("a token without a script user", () => other.eval("return 1", [], []), /not allowed/i);
// tokens: a read-only token reads and cannot write; another namespace sees nothing; a wrong
// token is unauthorized
await check("read-only reads", () => ro.get("greeting"), "héllo wörld ✓");
await throws("read-only cannot write", () => ro.set("greeting", "x"), /NOPERM/);
await check("another namespace", () => other.get("greeting"), null);
await check("another namespace writes its own", async () => { await other.set("greeting", "mine"); return [await other.get("greeting"), await redis.get("greeting")]; }, ["mine", "héllo wörld ✓"]);
await throws("bad token", () => bad.get("greeting"), /Unauthorized/);
// FLUSHDB empties the token's own namespace, nothing else
await throws("read-only token cannot flush", () => ro.flushdb(), /NOPERM/);
await check("flushdb: its own keys only", async () => { await other.flushdb(); return [await other.dbsize(), await redis.get("greeting")]; }, [0, "héllo wörld ✓"]);

done();
