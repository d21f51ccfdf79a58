// Drives the libraries most used on top of @upstash/redis, unchanged, against the sidecar's
// Upstash-compatible door: @upstash/ratelimit (every limiter; its scripts carry a shebang flag
// stock Redis does not know) and @upstash/lock. Env: URL, TOKEN (a token with a script user),
// WHOLE (set: the token owns the whole database).
// Prints one line per check; exits 1 if any failed.
import { Redis } from "@upstash/redis";
import { Ratelimit, MultiRegionRatelimit } from "@upstash/ratelimit";
import { Lock } from "@upstash/lock";
import { check, throws, done } from "./checks.mjs";

const redis = new Redis({ url: process.env.URL, token: process.env.TOKEN, retry: false });
const run = `${Date.now()}`;

const limiters = {
  fixedWindow: Ratelimit.fixedWindow(10, "60 s"),
  slidingWindow: Ratelimit.slidingWindow(10, "60 s"),
  tokenBucket: Ratelimit.tokenBucket(10, "60 s", 10),
  cachedFixedWindow: Ratelimit.cachedFixedWindow(10, "60 s"),
};
for (const [name, limiter] of Object.entries(limiters)) {
  const rl = new Ratelimit({
    redis,
    limiter,
    prefix: `rl-${name}-${run}`,
    analytics: false,
    // cachedFixedWindow needs its in-memory cache; the others are checked without one.
    ephemeralCache: name === "cachedFixedWindow" ? new Map() : false,
  });
  // 40 concurrent callers for one identifier: exactly the limit is admitted.
  await check(`${name}: 40 concurrent callers, 10 admitted`, async () => {
    const results = await Promise.all(Array.from({ length: 40 }, () => rl.limit("burst")));
    return results.filter((r) => r.success).length;
  }, 10);
  await check(`${name}: remaining after the burst`, async () => (await rl.getRemaining("burst")).remaining, 0);
  await check(`${name}: another identifier is its own`, async () => {
    const r = await rl.limit("someone-else");
    return [r.success, r.limit];
  }, [true, 10]);
  if (name !== "cachedFixedWindow" && process.env.WHOLE) {
    await check(`${name}: resetUsedTokens frees the identifier`, async () => {
      await rl.resetUsedTokens("burst");
      return [(await rl.getRemaining("burst")).remaining, (await rl.limit("burst")).success];
    }, [10, true]);
  } else if (name !== "cachedFixedWindow") {
    // Its script SCANs: inside a namespace Redis's ACL refuses that (a scan would list every
    // namespace's keys), so it works with a token that owns the whole database.
    await throws(`${name}: resetUsedTokens refused inside a namespace`, () => rl.resetUsedTokens("burst"), /can't run this command/);
  }
}

// blockUntilReady waits out a short window.
const short = new Ratelimit({ redis, limiter: Ratelimit.fixedWindow(1, "2 s"), prefix: `rl-block-${run}`, analytics: false, ephemeralCache: false });
await check("blockUntilReady: admitted once the window passes", async () => {
  const first = await short.limit("u");
  const second = await short.limit("u");
  const waited = await short.blockUntilReady("u", 6000);
  return [first.success, second.success, waited.success];
}, [true, false, true]);

// The multi-region limiters (one region here).
for (const [name, limiter] of Object.entries({
  fixedWindow: MultiRegionRatelimit.fixedWindow(5, "60 s"),
  slidingWindow: MultiRegionRatelimit.slidingWindow(5, "60 s"),
})) {
  const rl = new MultiRegionRatelimit({ redis: [redis], limiter, prefix: `rl-mr-${name}-${run}`, analytics: false, ephemeralCache: false });
  await check(`multi-region ${name}: 5 of 12 admitted`, async () => {
    let admitted = 0;
    for (let i = 0; i < 12; i++) if ((await rl.limit("u")).success) admitted++;
    return admitted;
  }, 5);
}

// @upstash/lock: one holder at a time, released only by its holder.
const a = new Lock({ id: `lock-${run}`, redis, lease: 5000, retry: { attempts: 1, delay: 10 } });
const b = new Lock({ id: `lock-${run}`, redis, lease: 5000, retry: { attempts: 1, delay: 10 } });
await check("lock: the first acquires", () => a.acquire(), true);
await check("lock: the second does not", () => b.acquire(), false);
await check("lock: status", () => a.getStatus(), "ACQUIRED");
await check("lock: the holder extends it", () => a.extend(1000), true);
await check("lock: the other cannot release it", () => b.release(), false);
await check("lock: the holder releases it", () => a.release(), true);
await check("lock: then the second acquires", () => b.acquire(), true);

done();
