# Sorts the failures of redis-py's suite (pytest -rfE output) by reason: scripts/client-suites.sh.
import re, sys, collections
VERSION = ('hexpire','hpexpire','hexpireat','hpexpireat','hexpiretime','hpexpiretime','httl','hpttl','hpersist','hgetex','hsetex','hgetdel','xdelex','xackdel')
log = open(sys.argv[1], errors='replace').read()
summary = re.search(r'(\d+) failed, (\d+) passed(?:, [^,]*)*?(?:, (\d+) errors)?', log.splitlines()[-1])
out = collections.Counter(); other = []
for line in log.splitlines():
    m = re.match(r'^(FAILED|ERROR) (\S+)(?: - (.*))?$', line)
    if not m: continue
    test, err = m.group(2), (m.group(3) or '')
    t = test.lower()
    if '/json/' in t: r = 'Upstash JSON (RedisJSON module commands; not in open-source Redis 7.0)'
    elif any(v in t for v in VERSION): r = 'command added after Redis 7.0 (7.4/8.x); the Redis here is 7.0.15'
    elif 'bitop' in t and ('diff' in t or 'andor' in t or 'one' in t): r = 'BITOP DIFF/DIFF1/ANDOR/ONE (Redis 8.2); the Redis here is 7.0.15'
    elif 'test_scan' in t: r = "server semantics: Redis's SCAN examines COUNT entries per call (a match may take several calls); Upstash's returns it in one"
    elif 'xlen_after_trimming' in t: r = "server semantics: how much MAXLEN ~ trims is the server's choice"
    elif 'zrangestore_limit' in t: r = 'server semantics: Redis 7.0 refuses LIMIT without BYSCORE/BYLEX; Upstash accepts it'
    elif 'xinfo_nonexistent_group' in t: r = 'server semantics: Redis answers NOGROUP for a missing group; Upstash answers []'
    elif 'script_flush' in t: r = "by design: SCRIPT FLUSH empties every token's scripts (whole-database tokens only)"
    elif 'lua_script_call' in t: r = "by design: the script names a key outside KEYS; the script user's ACL keeps it to the namespace"
    else: r = 'OTHER'; other.append(line[:220])
    out[r] += 1
print(log.splitlines()[-1])
for r, n in out.most_common(): print(f'{n:4d}  {r}')
for o in other: print('  ', o)
