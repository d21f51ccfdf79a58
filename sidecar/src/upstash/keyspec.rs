//! Where a command's keys are, from Redis 7's own key specifications (`COMMAND`, element 9):
//! a place to start (an index, or the argument after a keyword) and a way to find the keys from
//! there (a range, or a count given as an argument). They name the keys of commands whose keys
//! move (ZUNIONSTORE's `numkeys`, XREAD's `STREAMS`, LMPOP...), which the legacy first/last/step
//! triple cannot. Read as Redis itself reads them (`getKeysUsingKeySpecs` in `db.c`).

use super::wire::Reply;

/// One key specification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct KeySpec {
    begin: Begin,
    find: Find,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Begin {
    /// The argument at this index (negative: from the end).
    Index(i64),
    /// The argument after the first `keyword`, searched from `from` (negative: backwards from
    /// the end).
    Keyword { keyword: String, from: i64 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Find {
    /// Keys up to `last` (relative to the start; negative: from the end), every `step`; with
    /// `limit` > 1, only the first 1/limit of what remains (XREAD's keys before its ids).
    Range { last: i64, step: i64, limit: i64 },
    /// The argument at `keynum` (relative to the start) counts the keys, which begin `first`
    /// after the start.
    Keynum { keynum: i64, first: i64, step: i64 },
}

/// The specs of one command; Err(why) when one of them cannot say where its keys are (Redis
/// marks those `unknown` or `incomplete`: SORT's BY and GET patterns, MIGRATE's KEYS).
pub(super) fn parse(specs: Option<&Reply>) -> Result<Vec<KeySpec>, String> {
    let Some(Reply::Array(list)) = specs else {
        return Ok(Vec::new());
    };
    list.iter().map(one).collect()
}

fn one(spec: &Reply) -> Result<KeySpec, String> {
    let flags = field(spec, "flags");
    if let Some(Reply::Array(f)) = flags {
        if f.iter().any(|f| text(f) == "incomplete") {
            return Err("some of its keys cannot be named before it runs".into());
        }
    }
    let unknown = || "some of its keys cannot be named before it runs".to_string();
    let begin = field(spec, "begin_search").ok_or_else(unknown)?;
    let begin_spec = field(begin, "spec").ok_or_else(unknown)?;
    let begin = match field(begin, "type").map(text).as_deref() {
        Some("index") => Begin::Index(int(field(begin_spec, "index"))),
        Some("keyword") => Begin::Keyword {
            keyword: field(begin_spec, "keyword").map(text).unwrap_or_default(),
            from: int(field(begin_spec, "startfrom")),
        },
        _ => return Err(unknown()),
    };
    let find = field(spec, "find_keys").ok_or_else(unknown)?;
    let find_spec = field(find, "spec").ok_or_else(unknown)?;
    let find = match field(find, "type").map(text).as_deref() {
        Some("range") => Find::Range {
            last: int(field(find_spec, "lastkey")),
            step: int(field(find_spec, "keystep")),
            limit: int(field(find_spec, "limit")),
        },
        Some("keynum") => Find::Keynum {
            keynum: int(field(find_spec, "keynumidx")),
            first: int(field(find_spec, "firstkey")),
            step: int(field(find_spec, "keystep")),
        },
        _ => return Err(unknown()),
    };
    Ok(KeySpec { begin, find })
}

/// The positions of the keys in `args` (`args[0]` is the command's name), in order and each
/// once. Err: the arguments do not fit the specs (Redis would refuse them too).
pub(super) fn positions(specs: &[KeySpec], args: &[Vec<u8>]) -> Result<Vec<usize>, String> {
    let argc = args.len() as i64;
    let mut out: Vec<usize> = Vec::new();
    let bad = || "ERR syntax error".to_string();
    for spec in specs {
        let first = match &spec.begin {
            Begin::Index(i) => *i,
            Begin::Keyword { keyword, from } => {
                let range: Vec<i64> = if *from > 0 {
                    (*from..argc).collect()
                } else {
                    (1..=argc.saturating_add(*from)).rev().collect()
                };
                let mut found = range
                    .into_iter()
                    .filter(|&i| eq(&args[i as usize], keyword));
                match (found.next(), found.next()) {
                    // Redis's own parser may take another occurrence than its key spec does
                    // (GEORADIUS ... STORE a STORE b stores into b): a repeated keyword is
                    // refused rather than guessed.
                    (Some(_), Some(_)) => {
                        return Err(format!("ERR syntax error ({keyword} given twice)"))
                    }
                    (Some(i), None) => i + 1,
                    (None, _) => continue, // the keyword is optional and absent
                }
            }
        };
        let (first, last, step) = match spec.find {
            Find::Range { last, step, limit } => {
                let end = if last >= 0 {
                    first.saturating_add(last)
                } else if limit <= 1 {
                    argc.saturating_add(last)
                } else {
                    first.saturating_add((argc - first) / limit + last)
                };
                (first, end, step)
            }
            Find::Keynum {
                keynum,
                first: offset,
                step,
            } => {
                // Checked throughout: a count past the arguments, or past any integer, is a
                // syntax error here, never an overflow.
                let count = usize::try_from(first.saturating_add(keynum))
                    .ok()
                    .and_then(|i| args.get(i))
                    .and_then(|n| std::str::from_utf8(n).ok())
                    .and_then(|n| n.parse::<i64>().ok())
                    .filter(|n| (0..=argc).contains(n))
                    .ok_or_else(bad)?;
                if count == 0 {
                    // Redis refuses these itself ("numkeys should be greater than 0").
                    continue;
                }
                let start = first.saturating_add(offset);
                let last = (count - 1)
                    .checked_mul(step.max(1))
                    .and_then(|n| n.checked_add(start))
                    .ok_or_else(bad)?;
                (start, last, step)
            }
        };
        if first < 1 || first >= argc || last >= argc || last < first {
            if last + 1 == first {
                continue; // an empty range: no key
            }
            return Err(bad());
        }
        let mut i = first;
        while i <= last {
            let at = i as usize;
            if !out.contains(&at) {
                out.push(at);
            }
            i += step.max(1);
        }
    }
    Ok(out)
}

fn eq(arg: &[u8], keyword: &str) -> bool {
    arg.eq_ignore_ascii_case(keyword.as_bytes())
}

/// The value after `name` in a flat [name, value, ...] array.
fn field<'r>(map: &'r Reply, name: &str) -> Option<&'r Reply> {
    let Reply::Array(items) = map else {
        return None;
    };
    items
        .chunks(2)
        .find(|kv| text(&kv[0]) == name)
        .and_then(|kv| kv.get(1))
}

fn text(r: &Reply) -> String {
    match r {
        Reply::Status(s) => s.to_ascii_lowercase(),
        Reply::Bulk(b) => String::from_utf8_lossy(b).to_ascii_lowercase(),
        _ => String::new(),
    }
}

fn int(r: Option<&Reply>) -> i64 {
    match r {
        Some(Reply::Int(i)) => *i,
        _ => 0,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn b(s: &str) -> Reply {
        Reply::Bulk(s.as_bytes().to_vec())
    }

    /// A spec as `COMMAND` sends it.
    pub(crate) fn index_range(index: i64, last: i64, step: i64, limit: i64) -> Reply {
        spec(
            vec![
                b("type"),
                b("index"),
                b("spec"),
                Reply::Array(vec![b("index"), Reply::Int(index)]),
            ],
            range(last, step, limit),
        )
    }

    pub(crate) fn keyword_range(keyword: &str, last: i64, step: i64, limit: i64) -> Reply {
        spec(
            vec![
                b("type"),
                b("keyword"),
                b("spec"),
                Reply::Array(vec![
                    b("keyword"),
                    b(keyword),
                    b("startfrom"),
                    Reply::Int(1),
                ]),
            ],
            range(last, step, limit),
        )
    }

    pub(crate) fn index_keynum(index: i64, keynum: i64, first: i64, step: i64) -> Reply {
        spec(
            vec![
                b("type"),
                b("index"),
                b("spec"),
                Reply::Array(vec![b("index"), Reply::Int(index)]),
            ],
            vec![
                b("type"),
                b("keynum"),
                b("spec"),
                Reply::Array(vec![
                    b("keynumidx"),
                    Reply::Int(keynum),
                    b("firstkey"),
                    Reply::Int(first),
                    b("keystep"),
                    Reply::Int(step),
                ]),
            ],
        )
    }

    fn range(last: i64, step: i64, limit: i64) -> Vec<Reply> {
        vec![
            b("type"),
            b("range"),
            b("spec"),
            Reply::Array(vec![
                b("lastkey"),
                Reply::Int(last),
                b("keystep"),
                Reply::Int(step),
                b("limit"),
                Reply::Int(limit),
            ]),
        ]
    }

    fn spec(begin: Vec<Reply>, find: Vec<Reply>) -> Reply {
        Reply::Array(vec![
            b("flags"),
            Reply::Array(vec![Reply::Status("RW".into())]),
            b("begin_search"),
            Reply::Array(begin),
            b("find_keys"),
            Reply::Array(find),
        ])
    }

    fn args(a: &str) -> Vec<Vec<u8>> {
        a.split(' ').map(|s| s.as_bytes().to_vec()).collect()
    }

    fn at(specs: Vec<Reply>, a: &str) -> Result<Vec<usize>, String> {
        let specs = parse(Some(&Reply::Array(specs))).expect("specs");
        positions(&specs, &args(a))
    }

    #[test]
    fn keys_are_found_where_redis_finds_them() {
        // ZUNIONSTORE dest numkeys key...
        let zunionstore = || vec![index_range(1, 0, 1, 0), index_keynum(2, 0, 1, 1)];
        assert_eq!(
            at(zunionstore(), "ZUNIONSTORE d 2 a b WEIGHTS 1 2"),
            Ok(vec![1, 3, 4])
        );
        assert!(at(zunionstore(), "ZUNIONSTORE d 5 a b").is_err());
        assert!(at(zunionstore(), "ZUNIONSTORE d x a").is_err());
        // A count past the arguments, or past any integer: refused, never a panic.
        assert!(at(zunionstore(), "ZUNIONSTORE d 9223372036854775807 a").is_err());
        assert!(at(zunionstore(), "ZUNIONSTORE d -1 a").is_err());
        // A key-naming keyword given twice: refused (Redis's parser may take the other one).
        let store = || vec![index_range(1, 0, 1, 0), keyword_range("STORE", 0, 1, 0)];
        assert_eq!(at(store(), "GEORADIUS p 1 2 3 km STORE a"), Ok(vec![1, 7]));
        assert!(at(store(), "GEORADIUS p 1 2 3 km STORE a STORE b").is_err());
        // XREAD COUNT 2 STREAMS a b 0 0: the keys are the first half after STREAMS.
        let xread = || vec![keyword_range("STREAMS", -1, 1, 2)];
        assert_eq!(at(xread(), "XREAD COUNT 2 STREAMS a b 0 0"), Ok(vec![4, 5]));
        assert_eq!(at(xread(), "XREAD COUNT 2"), Ok(vec![]));
        // MSET k v k v
        assert_eq!(
            at(vec![index_range(1, -1, 2, 0)], "MSET a 1 b 2"),
            Ok(vec![1, 3])
        );
        // LMPOP numkeys key... LEFT
        assert_eq!(
            at(vec![index_keynum(1, 0, 1, 1)], "LMPOP 2 a b LEFT COUNT 2"),
            Ok(vec![2, 3])
        );
    }

    #[test]
    fn specs_that_cannot_name_their_keys_are_refused() {
        let unknown = Reply::Array(vec![
            b("flags"),
            Reply::Array(vec![]),
            b("begin_search"),
            Reply::Array(vec![
                b("type"),
                b("unknown"),
                b("spec"),
                Reply::Array(vec![]),
            ]),
            b("find_keys"),
            Reply::Array(vec![
                b("type"),
                b("unknown"),
                b("spec"),
                Reply::Array(vec![]),
            ]),
        ]);
        assert!(parse(Some(&Reply::Array(vec![unknown]))).is_err());
    }
}
