//! Which commands run, and where their keys are, from Redis's own command table (`COMMAND`,
//! read once): a command runs only if Redis can say where every key of it is (its key
//! specifications, `keyspec`; the legacy first/last/step before Redis 7) and it is not in a
//! refused category (administration, dangerous, blocking, pub/sub, scripting, connection and
//! transaction state). Container commands (XGROUP, OBJECT, XINFO...) are judged by their
//! subcommand's entry. Read-only tokens are refused every command Redis flags as a write.

use super::keyspec::{self, KeySpec};
use super::wire::Reply;
use super::{bounds, prefix, scoped, scripts, Door, Prepared, Refused, Then};
use std::collections::HashMap;

/// Categories (Redis ACL categories) whose commands are refused: they reach beyond one
/// caller's keys (@admin, @dangerous: CONFIG, DEBUG, SHUTDOWN, MONITOR...), hold a connection
/// (@blocking, @pubsub), or could touch any key from inside (@scripting: `scripts` has the
/// rules for those). @transaction and @connection: the connection is shared by every caller
/// (WATCH, MULTI, SELECT, CLIENT would change it for all).
const REFUSED: [&str; 7] = [
    "@admin",
    "@dangerous",
    "@blocking",
    "@pubsub",
    "@scripting",
    "@connection",
    "@transaction",
];

/// One command (or subcommand) as Redis describes it.
#[derive(Debug, Clone)]
struct Spec {
    /// Where its keys are; Err: why that cannot be known before it runs.
    keys: Result<Keys, String>,
    write: bool,
    categories: Vec<String>,
    /// It has subcommands (`xgroup|create`...), each with an entry of its own.
    container: bool,
}

#[derive(Debug, Clone)]
enum Keys {
    Specs(Vec<KeySpec>),
    /// Before Redis 7: 1-based first key, last key (negative: from the end), step.
    Legacy {
        first: i64,
        last: i64,
        step: i64,
    },
}

/// Redis's command table, as far as this protocol needs it.
#[derive(Debug, Default)]
pub struct Commands {
    specs: HashMap<String, Spec>,
}

impl Commands {
    /// From the reply to `COMMAND` (RESP2: one array per command, subcommands at element 10).
    pub fn from_reply(reply: &Reply) -> Commands {
        let mut specs = HashMap::new();
        if let Reply::Array(all) = reply {
            for c in all {
                add(c, &mut specs);
            }
        }
        Commands { specs }
    }

    /// Checks one command for the door's token and puts its keys under its namespace.
    pub fn prepare(&self, args: Vec<Vec<u8>>, door: &Door<'_>) -> Result<Prepared, Refused> {
        let Some(mut name) = args
            .first()
            .map(|n| String::from_utf8_lossy(n).to_ascii_lowercase())
        else {
            return Err(Refused("ERR empty command".into()));
        };
        if scripts::is_script(&name) {
            return scripts::prepare(name, args, door);
        }
        if let Some(out) = scoped::prepare(&name, &args, door) {
            return out;
        }
        let allocates = bounds::check(&name, &args, door.bounds)?;
        let mut spec = self.specs.get(&name);
        if spec.is_some_and(|s| s.container) {
            let sub = args
                .get(1)
                .map(|s| String::from_utf8_lossy(s).to_ascii_lowercase())
                .unwrap_or_default();
            name = format!("{name}|{sub}");
            spec = self.specs.get(&name);
        }
        let Some(spec) = spec else {
            return Err(Refused(format!("ERR Command is not available: '{name}'")));
        };
        if let Some(c) = spec
            .categories
            .iter()
            .find(|c| REFUSED.contains(&c.as_str()) && !reads_without_blocking(&name, &args, c))
        {
            return Err(Refused(format!("ERR Command is not allowed: {name} ({c})")));
        }
        let keys = match &spec.keys {
            Ok(Keys::Specs(specs)) => keyspec::positions(specs, &args).map_err(Refused)?,
            Ok(Keys::Legacy { first, last, step }) => legacy(*first, *last, *step, args.len()),
            Err(why) => {
                return Err(Refused(format!(
                    "ERR Command is not allowed: {name} ({why})"
                )))
            }
        };
        if keys.is_empty() {
            return Err(Refused(format!(
                "ERR Command is not allowed: {name} (it names no key of its own)"
            )));
        }
        if door.token.read_only && spec.write {
            return Err(Refused(format!(
                "NOPERM this token is read-only and cannot run '{name}'"
            )));
        }
        let mut args = args;
        for &i in &keys {
            prefix(&mut args[i], door.namespace);
        }
        if name == "copy" && args.len() >= 3 && args[1] == args[2] {
            // Redis refuses a copy onto itself; Upstash answers 0 (not copied).
            return Ok(Prepared {
                then: Then::Answer(Reply::Int(0)),
                ..Prepared::keyless(vec![b"PING".to_vec()], false)
            });
        }
        Ok(Prepared {
            args,
            script: false,
            write: spec.write,
            first_key: keys.first().copied(),
            allocates,
            then: match name.as_str() {
                "lmpop" | "zmpop" => Then::FirstIsKey,
                "xread" | "xreadgroup" => Then::EachFirstIsKey,
                _ => Then::AsIs,
            },
            walk: None,
        })
    }
}

/// XREAD and XREADGROUP are in @blocking for their BLOCK option; without it they answer at
/// once, as Upstash runs them.
fn reads_without_blocking(name: &str, args: &[Vec<u8>], category: &str) -> bool {
    category == "@blocking"
        && matches!(name, "xread" | "xreadgroup")
        && !args.iter().any(|a| a.eq_ignore_ascii_case(b"BLOCK"))
}

/// Positions of the legacy triple.
fn legacy(first: i64, last: i64, step: i64, argc: usize) -> Vec<usize> {
    let n = argc as i64;
    let last = if last < 0 { n + last } else { last };
    let mut out = Vec::new();
    let mut i = first;
    while first > 0 && i <= last && i < n {
        out.push(i as usize);
        i += step.max(1);
    }
    out
}

fn add(c: &Reply, specs: &mut HashMap<String, Spec>) {
    let Reply::Array(f) = c else { return };
    let text = |v: &Reply| match v {
        Reply::Status(s) => s.to_ascii_lowercase(),
        Reply::Bulk(b) => String::from_utf8_lossy(b).to_ascii_lowercase(),
        _ => String::new(),
    };
    let int = |v: Option<&Reply>| match v {
        Some(Reply::Int(i)) => *i,
        _ => 0,
    };
    let list = |v: Option<&Reply>| match v {
        Some(Reply::Array(a)) => a.iter().map(text).collect::<Vec<_>>(),
        _ => Vec::new(),
    };
    let Some(name) = f.first().map(text) else {
        return;
    };
    let flags = list(f.get(2));
    let subcommands = match f.get(9) {
        Some(Reply::Array(subs)) if !subs.is_empty() => subs.as_slice(),
        _ => &[],
    };
    for sub in subcommands {
        add(sub, specs);
    }
    let keys = match keyspec::parse(f.get(8)) {
        Ok(k) if !k.is_empty() => Ok(Keys::Specs(k)),
        Err(why) => Err(why),
        // No specs: a keyless command, or a Redis before 7.
        Ok(_) if flags.iter().any(|f| f == "movablekeys") => Err("its keys move".into()),
        Ok(_) => Ok(Keys::Legacy {
            first: int(f.get(3)),
            last: int(f.get(4)),
            step: int(f.get(5)),
        }),
    };
    specs.insert(
        name,
        Spec {
            keys,
            write: flags.iter().any(|f| f == "write"),
            categories: list(f.get(6)),
            container: !subcommands.is_empty(),
        },
    );
}

#[cfg(test)]
mod tests;
