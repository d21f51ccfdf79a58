// A plain JavaScript Worker that uses Ferry through the clients it would use anyway:
// @neondatabase/serverless for Postgres and @upstash/redis for Redis, unchanged. The only
// Ferry-specific line is `neonConfig.fetchEndpoint`, which points the driver at the sidecar's
// /sql instead of the host named in DATABASE_URL (which is never contacted).
//
//   GET /item?id=7   a row, read through the sidecar's pooled Postgres sessions
//   GET /both?id=7   the row and a visit counter (Redis INCR), in one request
//   GET /cached?id=7 the row through Ferry's cache (the connection string's ferry_cache_ttl)
import { neon, neonConfig } from "@neondatabase/serverless";
import { Redis } from "@upstash/redis/cloudflare";

function json(body, status = 200) {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json" },
  });
}

export default {
  async fetch(request, env) {
    neonConfig.fetchEndpoint = env.FERRY_SQL_ENDPOINT;
    const url = new URL(request.url);
    const id = Number(url.searchParams.get("id") ?? "1");
    if (!Number.isInteger(id) || id < 1) {
      return json({ error: { code: "invalid_value", message: "id: a positive integer" } }, 400);
    }
    const sql = neon(env.DATABASE_URL);
    const redis = Redis.fromEnv(env);
    try {
      switch (url.pathname) {
        case "/item": {
          const [item] = await sql`SELECT id, name, price FROM items WHERE id = ${id}`;
          return item ? json({ item }) : json({ error: { code: "not_found", message: "no such item" } }, 404);
        }
        case "/both": {
          const [[item], visits] = await Promise.all([
            sql`SELECT id, name FROM items WHERE id = ${id}`,
            redis.incr(`visits:${id}`),
          ]);
          return json({ item, visits });
        }
        case "/cached": {
          const cached = neon(`${env.DATABASE_URL}?ferry_cache_ttl=60&ferry_cache_tables=items`, { fullResults: true });
          const r = await cached`SELECT id, name FROM items WHERE id = ${id}`;
          return json({ item: r.rows[0] });
        }
        default:
          return json({ error: { code: "not_found", message: "try /item, /both or /cached" } }, 404);
      }
    } catch (e) {
      // The driver's errors carry Postgres's code; nothing else of them is shown.
      return json({ error: { code: e.code ?? "upstream_error", message: "the query failed" } }, 502);
    }
  },
};
