"""Drives the sidecar's Upstash-compatible endpoints with the real PyPI upstash-redis client,
unchanged (its defaults: base64 responses). Env: URL, TOKEN, RO_TOKEN. One line per check;
exit 1 on any failure."""
import os
import sys

from upstash_redis import Redis

url = os.environ["URL"]
redis = Redis(url=url, token=os.environ["TOKEN"])
ro = Redis(url=url, token=os.environ["RO_TOKEN"])
failed = False


def check(name, fn, expected):
    global failed
    try:
        got = fn()
    except Exception as e:  # noqa: BLE001 - any failure is reported
        print(f"FAIL {name}: raised {e!r}")
        failed = True
        return
    ok = got == expected
    print(f"{'ok' if ok else 'FAIL'} {name}: {got!r}" + ("" if ok else f" (expected {expected!r})"))
    failed = failed or not ok


def raises(name, fn, fragment):
    global failed
    try:
        got = fn()
    except Exception as e:  # noqa: BLE001
        ok = fragment in str(e)
        print(f"{'ok' if ok else 'FAIL'} {name}: {e}")
        failed = failed or not ok
        return
    print(f"FAIL {name}: no error, got {got!r}")
    failed = True


check("set", lambda: redis.set("py:greeting", "héllo ✓"), True)
check("get", lambda: redis.get("py:greeting"), "héllo ✓")
check("missing", lambda: redis.get("py:nope"), None)
check("incr", lambda: redis.incr("py:n"), 1)
check("incrby", lambda: redis.incrby("py:n", 9), 10)
check("hset", lambda: redis.hset("py:h", values={"a": "1", "b": "2"}), 2)
check("hgetall", lambda: redis.hgetall("py:h"), {"a": "1", "b": "2"})
check("rpush", lambda: redis.rpush("py:l", "x", "y"), 2)
check("lrange", lambda: redis.lrange("py:l", 0, -1), ["x", "y"])
check("sadd", lambda: redis.sadd("py:s", "m"), 1)
check("smembers", lambda: redis.smembers("py:s"), ["m"])
check("zadd", lambda: redis.zadd("py:z", {"a": 1, "b": 2}), 2)
check("zrange", lambda: redis.zrange("py:z", 0, -1), ["a", "b"])


def pipeline():
    p = redis.pipeline()
    p.set("py:p", "v")
    p.get("py:p")
    return p.exec()


def multi():
    m = redis.multi()
    m.set("py:m", "1")
    m.incr("py:m")
    return m.exec()


check("pipeline", pipeline, [True, "v"])
check("multi", multi, [True, 2])
raises("wrong type", lambda: redis.incr("py:greeting"), "not an integer")
raises("blocking refused", lambda: redis.execute(["BLPOP", "py:l", "1"]), "not allowed")
# keyspace commands see the token's own keys, named without its namespace
check("keys: its own", lambda: redis.keys("py:gree*"), ["py:greeting"])
check("scan: its own", lambda: "py:greeting" in redis.scan(0, match="py:*", count=1000)[1], True)
check("dbsize: its own", lambda: redis.dbsize() == len(redis.keys("*")), True)
check("read-only reads", lambda: ro.get("py:greeting"), "héllo ✓")
raises("read-only cannot write", lambda: ro.set("py:greeting", "x"), "NOPERM")
raises("read-only cannot flush", lambda: ro.flushdb(), "NOPERM")
sys.exit(1 if failed else 0)
