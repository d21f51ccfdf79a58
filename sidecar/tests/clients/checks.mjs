// The client scripts' checks: one line per check ("ok ..." or "FAIL ..."), and the exit status.
let failed = false;

// `fn`'s result, compared with `expected` as JSON.
export async function check(name, fn, expected) {
  try {
    const got = await fn();
    const ok = JSON.stringify(got) === JSON.stringify(expected);
    console.log(`${ok ? "ok" : "FAIL"} ${name}: ${JSON.stringify(got)}${ok ? "" : ` (expected ${JSON.stringify(expected)})`}`);
    if (!ok) failed = true;
  } catch (e) {
    console.log(`FAIL ${name}: threw ${e}`);
    failed = true;
  }
}

// `fn` must throw an error whose text matches `pattern`.
export async function throws(name, fn, pattern) {
  try {
    const got = await fn();
    console.log(`FAIL ${name}: no error, got ${JSON.stringify(got)}`);
    failed = true;
  } catch (e) {
    const ok = pattern.test(String(e));
    console.log(`${ok ? "ok" : "FAIL"} ${name}: ${e}`);
    if (!ok) failed = true;
  }
}

// Ends the script: exit 1 if any check failed.
export function done() {
  process.exit(failed ? 1 : 0);
}
