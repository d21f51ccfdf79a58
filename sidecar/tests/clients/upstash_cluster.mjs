// Drives the sidecar's Upstash-compatible endpoints, on a Redis Cluster, with the real
// @upstash/redis client, unchanged. Env: URL, TOKEN. Prints one line per check; exits 1 if any
// failed.
import { Redis } from "@upstash/redis";
import { check, throws, done } from "./checks.mjs";

const redis = new Redis({ url: process.env.URL, token: process.env.TOKEN, retry: false });

await check("set", () => redis.set("greeting", "héllo ✓"), "OK");
await check("get", () => redis.get("greeting"), "héllo ✓");
await check("incr", () => redis.incr("counter"), 1);
await check("hset/hgetall", async () => { await redis.hset("h", { f: "v" }); return redis.hgetall("h"); }, { f: "v" });
// A pipeline whose keys live on several masters: split by slot, answered in order.
const keys = Array.from({ length: 20 }, (_, i) => `k${i}`);
await check("pipeline over many slots", async () => {
  const p = redis.pipeline();
  keys.forEach((k, i) => p.set(k, i));
  keys.forEach((k) => p.get(k));
  p.incr("counter");
  return p.exec();
}, [...keys.map(() => "OK"), ...keys.map((_, i) => i), 2]);
// One command's error is its own answer, the others still run.
await check("an error among the pipeline's answers", async () => {
  const p = redis.pipeline();
  p.set("text", "abc");
  p.incr("text");
  p.get("text");
  return p.exec({ keepErrors: true }).then((r) => r.map((x) => (x.error ? "error" : x.result)));
}, ["OK", "error", "abc"]);
// Multi-key commands and transactions stay in one slot, as on any Redis Cluster.
await check("mget within a slot", async () => { await redis.mset({ "{u1}:a": "1", "{u1}:b": "2" }); return redis.mget("{u1}:a", "{u1}:b"); }, [1, 2]);
await throws("mget across slots", () => redis.mget("k1", "k2", "k3", "k4"), /CROSSSLOT/);
await check("multi within a slot", () => redis.multi().set("{t}:x", "1").incr("{t}:y").exec(), ["OK", 1]);
await throws("multi across slots", () => redis.multi().set("k1", "1").set("k2", "2").exec(), /CROSSSLOT/);
await throws("eval", () => redis.eval("return 1", [], []), /scripts (are not available|run only on a Redis of the door.s own)/);

done();
