use super::*;
use crate::config::UpstashToken;
use crate::upstash::keyspec::tests::{index_keynum, index_range, keyword_range};
use crate::upstash::scoped::Walk;
use crate::upstash::Bounds;
use Reply as V;

fn cmd(name: &str, flags: &[&str], first: i64, last: i64, step: i64, cats: &[&str]) -> V {
    let s = |x: &str| V::Status(x.into());
    V::Array(vec![
        V::Bulk(name.as_bytes().to_vec()),
        V::Int(-2),
        V::Array(flags.iter().map(|f| s(f)).collect()),
        V::Int(first),
        V::Int(last),
        V::Int(step),
        V::Array(cats.iter().map(|c| s(c)).collect()),
    ])
}

/// A command with key specs (element 9) and subcommands (element 10).
fn full(name: &str, flags: &[&str], cats: &[&str], specs: Vec<V>, subs: Vec<V>) -> V {
    let V::Array(mut c) = cmd(name, flags, 0, 0, 0, cats) else {
        unreachable!()
    };
    c.push(V::Array(vec![]));
    c.push(V::Array(specs));
    c.push(V::Array(subs));
    V::Array(c)
}

fn modern() -> Commands {
    Commands::from_reply(&V::Array(vec![
        full(
            "zunionstore",
            &["write", "movablekeys"],
            &["@write"],
            vec![index_range(1, 0, 1, 0), index_keynum(2, 0, 1, 1)],
            vec![],
        ),
        full(
            "xread",
            &["readonly", "blocking", "movablekeys"],
            &["@read", "@blocking"],
            vec![keyword_range("STREAMS", -1, 1, 2)],
            vec![],
        ),
        full(
            "xgroup",
            &[],
            &["@slow"],
            vec![],
            vec![full(
                "xgroup|create",
                &["write"],
                &["@write"],
                vec![index_range(2, 0, 1, 0)],
                vec![],
            )],
        ),
        full(
            "lmpop",
            &["write", "movablekeys"],
            &["@write"],
            vec![index_keynum(1, 0, 1, 1)],
            vec![],
        ),
    ]))
}

#[test]
fn moving_keys_subcommands_and_keyspace_commands_stay_in_the_namespace() {
    let t = modern();
    let rw = token(false);
    let d = door(&rw, "p:", true);
    let run = |a: &[&str]| t.prepare(args(a), &d).map(|p| p.args);
    assert_eq!(
        run(&["ZUNIONSTORE", "d", "2", "a", "b", "WEIGHTS", "1", "2"]),
        Ok(args(&[
            "ZUNIONSTORE",
            "p:d",
            "2",
            "p:a",
            "p:b",
            "WEIGHTS",
            "1",
            "2"
        ]))
    );
    assert_eq!(
        run(&["XREAD", "COUNT", "1", "STREAMS", "s", "t", "0", "0"]),
        Ok(args(&[
            "XREAD", "COUNT", "1", "STREAMS", "p:s", "p:t", "0", "0"
        ]))
    );
    assert!(run(&["XREAD", "BLOCK", "0", "STREAMS", "s", "0"]).is_err());
    assert_eq!(
        run(&["XGROUP", "CREATE", "s", "g", "$"]),
        Ok(args(&["XGROUP", "CREATE", "p:s", "g", "$"]))
    );
    assert!(run(&["XGROUP", "NOPE", "s"]).is_err());
    assert!(
        run(&["LMPOP", "3", "a", "LEFT"]).is_err(),
        "more keys than arguments"
    );
    // SCAN and KEYS see only the namespace, with its glob characters escaped.
    let star = token(false);
    let d = door(&star, "a*:", true);
    let scan = t
        .prepare(args(&["SCAN", "0", "COUNT", "10"]), &d)
        .expect("scan");
    assert_eq!(
        scan.args,
        args(&["SCAN", "0", "COUNT", "10", "MATCH", "a\\*:*"])
    );
    // KEYS is a walk the sidecar runs (SCAN rounds), never Redis's blocking KEYS.
    let keys = t.prepare(args(&["KEYS", "u?"]), &d).expect("keys");
    assert_eq!(
        keys.walk,
        Some(Walk::Keys {
            pattern: b"a\\*:u?".to_vec()
        })
    );
    // and the keys come back without it.
    let reply = V::Array(vec![
        V::Bulk(b"7".to_vec()),
        V::Array(vec![V::Bulk(b"a*:u1".to_vec())]),
    ]);
    assert_eq!(
        scan.finish(reply, "a*:"),
        V::Array(vec![
            V::Bulk(b"7".to_vec()),
            V::Array(vec![V::Bulk(b"u1".to_vec())])
        ])
    );
    // FLUSHDB: the namespace's keys (a walk of SCAN and UNLINK rounds), the whole database
    // only for a token that owns it.
    let flush = t.prepare(args(&["FLUSHDB"]), &d).expect("flush");
    assert_eq!(
        flush.walk,
        Some(Walk::Flush {
            pattern: b"a\\*:*".to_vec()
        })
    );
    let mut whole = token(false);
    whole.prefix = String::new();
    let flush = t
        .prepare(args(&["FLUSHALL"]), &door(&whole, "", true))
        .expect("flush");
    assert_eq!(flush.args, args(&["FLUSHDB"]));
}

fn table() -> Commands {
    Commands::from_reply(&V::Array(vec![
        cmd("get", &["readonly"], 1, 1, 1, &["@read"]),
        cmd("mset", &["write"], 1, -1, 2, &["@write"]),
        cmd("flushall", &["write"], 0, 0, 0, &["@write", "@dangerous"]),
        cmd("dbsize", &["readonly"], 0, 0, 0, &["@keyspace"]),
        cmd("eval", &["movablekeys"], 0, 0, 0, &["@scripting"]),
        cmd("ping", &[], 0, 0, 0, &["@fast", "@connection"]),
    ]))
}

fn token(read_only: bool) -> UpstashToken {
    UpstashToken {
        token: "t".repeat(32).into(),
        prefix: "a:".into(),
        read_only,
        ..Default::default()
    }
}

fn args(a: &[&str]) -> Vec<Vec<u8>> {
    a.iter().map(|s| s.as_bytes().to_vec()).collect()
}

fn door<'a>(token: &'a UpstashToken, namespace: &'a str, own_redis: bool) -> Door<'a> {
    Door {
        token,
        namespace,
        own_redis,
        bounds: Bounds {
            max_bytes: 1 << 20,
            max_items: 1000,
        },
    }
}

#[test]
fn keys_go_under_the_namespace_and_values_do_not() {
    let t = table();
    let (rw, ro) = (token(false), token(true));
    let out = t
        .prepare(
            args(&["MSET", "k1", "v1", "k2", "v2"]),
            &door(&rw, "f:u:a:", false),
        )
        .expect("allowed");
    assert_eq!(
        out.args,
        args(&["MSET", "f:u:a:k1", "v1", "f:u:a:k2", "v2"])
    );
    assert_eq!(
        t.prepare(args(&["GET", "k"]), &door(&ro, "p:", false))
            .expect("read")
            .args,
        args(&["GET", "p:k"])
    );
    let mut scripted = token(false);
    scripted.script_user = "u".into();
    scripted.script_password = "p".to_string().into();
    let eval = t
        .prepare(
            args(&["EVAL", "return 1", "1", "k", "arg"]),
            &door(&scripted, "p:", true),
        )
        .expect("a script user, on the door's own Redis");
    assert!(eval.script);
    assert_eq!(eval.args, args(&["EVAL", "return 1", "1", "p:k", "arg"]));
    assert!(t
        .prepare(
            args(&["EVAL", "return 1", "5", "k"]),
            &door(&scripted, "p:", true)
        )
        .is_err());
    // Not on the cache's Redis, whatever the token.
    assert!(t
        .prepare(
            args(&["EVAL", "return 1", "0"]),
            &door(&scripted, "p:", false)
        )
        .is_err());
}

#[test]
fn dangerous_keyless_scripted_unknown_and_writes_on_read_only_are_refused() {
    let t = table();
    for (a, ro) in [
        (&["FLUSHALL"][..], true),
        (&["DBSIZE", "extra"][..], false),
        (&["EVAL", "return 1", "0"][..], false),
        (&["NOPE"][..], false),
        (&["MSET", "k", "v"][..], true),
    ] {
        let tok = token(ro);
        assert!(
            t.prepare(args(a), &door(&tok, "p:", false)).is_err(),
            "{a:?}"
        );
    }
    let tok = token(true);
    assert!(t.prepare(args(&["PING"]), &door(&tok, "p:", false)).is_ok());
    // A read-only token loads no script, and runs no script body.
    let mut scripted = token(true);
    scripted.script_user = "u".into();
    for a in [
        &["SCRIPT", "LOAD", "return 1"][..],
        &["EVAL_RO", "return 1", "0"][..],
    ] {
        assert!(
            t.prepare(args(a), &door(&scripted, "p:", true)).is_err(),
            "{a:?}"
        );
    }
    assert!(t
        .prepare(
            args(&["EVALSHA_RO", "abc", "0"]),
            &door(&scripted, "p:", true)
        )
        .is_ok());
}
