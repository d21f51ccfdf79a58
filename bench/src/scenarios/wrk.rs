//! `wrk` as the pinned scenario drives it: what a load sends (`Load`), its script (fixed
//! requests, or requests signed ahead of the clock in a file of their own), one run of it, and
//! its own CPU, read from the shell that waited for it.

use crate::Ctx;
use ferry_shared::sign;
use rand::Rng;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The most requests per second a signed load is signed for (each request is used once; past
/// it, `wrk` resends the last one and the sidecar refuses it as a replay: counted as errors).
const MAX_SIGNED_RPS: u64 = 100_000;

/// Sends the pre-signed requests (raw HTTP, each after its length in 8 digits) once each, read
/// from the file as they are sent. (Read whole into a table at start, a run's million requests
/// cost seconds of `wrk`'s CPU before the first was sent, which its CPU per request counted.)
const PRESIGNED_LUA: &str = r#"
local f, last
function init(args)
  f = assert(io.open(args[1], "rb"))
end
function request()
  local len = f:read(8)
  if len then last = f:read(tonumber(len)) end
  return last
end
"#;

/// One load: what to send and to which server (whose CPU is read around it).
pub(super) struct Load {
    pub(super) path: &'static str,
    /// `wrk`'s target URL.
    pub(super) url: String,
    pub(super) what: Requests,
    /// Read Postgres's CPU too.
    pub(super) postgres: bool,
    /// The server process whose CPU counts (the sidecar or webdis).
    pub(super) server: u32,
}

pub(super) enum Requests {
    /// The same GET every time.
    Get,
    /// The same POST every time, with these headers.
    Post {
        body: String,
        headers: Vec<(String, String)>,
    },
    /// Signed POSTs to this path, one body per request (made by the function from a number).
    Signed {
        path: &'static str,
        body: fn(u64) -> String,
    },
}

/// The `wrk` script for `load`: fixed requests set once, signed ones written to a file of
/// their own (as many as `MAX_SIGNED_RPS` for `d`, signed now).
pub(super) fn script(dir: &Path, load: &Load, d: Duration, ctx: &Ctx) -> Option<PathBuf> {
    let file = dir.join("load.lua");
    let lua = match &load.what {
        Requests::Get => return None,
        Requests::Post { body, headers } => {
            let mut s = format!(
                "wrk.method = \"POST\"\nwrk.body = {body:?}\n\
                 wrk.headers[\"Content-Type\"] = \"application/json\"\n"
            );
            for (k, v) in headers {
                let _ = writeln!(s, "wrk.headers[{k:?}] = {v:?}");
            }
            s
        }
        Requests::Signed { path, body } => {
            let n = MAX_SIGNED_RPS * d.as_secs().max(1);
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |t| t.as_secs());
            let base: u128 = rand::thread_rng().gen();
            let host = ctx.sidecar_addr;
            let mut all = Vec::with_capacity(n as usize * 400);
            for i in 0..n {
                let b = body(i);
                let nonce = format!("{:032x}", base.wrapping_add(u128::from(i)));
                let h = sign::sign(
                    crate::env::SECRET.as_bytes(),
                    now,
                    &nonce,
                    "POST",
                    path,
                    b.as_bytes(),
                );
                let request = format!(
                    "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\n{}: {}\r\n{}: {}\r\n{}: {}\r\n\r\n{b}",
                    b.len(),
                    sign::HEADER_TIMESTAMP,
                    h.timestamp,
                    sign::HEADER_NONCE,
                    h.nonce,
                    sign::HEADER_SIGNATURE,
                    h.signature,
                );
                let _ = write!(AsFmt(&mut all), "{:08}{request}", request.len());
            }
            std::fs::write(dir.join("requests"), all).expect("write the signed requests");
            PRESIGNED_LUA.to_string()
        }
    };
    std::fs::write(&file, lua).expect("write wrk's script");
    Some(file)
}

/// `fmt::Write` into a byte buffer.
struct AsFmt<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for AsFmt<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// What `wrk` did: requests answered 2xx, in how long, and its own CPU ticks.
pub(super) struct Wrk {
    pub(super) ok: u64,
    pub(super) errors: u64,
    pub(super) seconds: f64,
    pub(super) own_ticks: u64,
}

/// Runs `wrk` (pinned to core 0, or not) with one thread and `c` connections for `d`; its own
/// CPU is read from the shell that waited for it (children's time, /proc/PID/stat).
pub(super) fn wrk(pinned: bool, c: usize, d: Duration, url: &str, script: &Option<PathBuf>) -> Wrk {
    let mut cmd = format!(
        "{}wrk -t1 -c{c} -d{}s",
        if pinned { "taskset -c 0 " } else { "" },
        d.as_secs().max(1)
    );
    if let Some(s) = script {
        let requests = s.with_file_name("requests");
        let _ = write!(cmd, " -s {} {url} -- {}", s.display(), requests.display());
    } else {
        let _ = write!(cmd, " {url}");
    }
    cmd.push_str("; echo \"STAT $(cat /proc/$$/stat)\"");
    let out = Command::new("sh")
        .args(["-c", &cmd])
        .output()
        .expect("run wrk");
    let text = String::from_utf8_lossy(&out.stdout);
    // "  123456 requests in 3.00s, 12.34MB read", "  Non-2xx or 3xx responses: 12",
    // "  Socket errors: connect 0, read 0, write 0, timeout 3"
    let mut requests: u64 = 0;
    let mut seconds = d.as_secs_f64();
    let mut errors = 0;
    for line in text.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        if line.contains(" requests in ") {
            requests = words.first().and_then(|v| v.parse().ok()).unwrap_or(0);
            seconds = words
                .get(3)
                .and_then(|v| v.trim_end_matches(',').trim_end_matches('s').parse().ok())
                .unwrap_or(seconds);
        } else if line.starts_with("Non-2xx") {
            errors += words
                .last()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        } else if line.starts_with("Socket errors") {
            errors += words
                .iter()
                .filter_map(|v| v.trim_end_matches(',').parse::<u64>().ok())
                .sum::<u64>();
        }
    }
    let own_ticks = waited_ticks(&text);
    Wrk {
        ok: requests.saturating_sub(errors),
        errors,
        seconds,
        own_ticks,
    }
}

/// The CPU ticks of the children a shell waited for (its cutime and cstime: indexes 13 and 14
/// after the command name), from the `STAT` line the command printed last: the load
/// generator's own.
pub(super) fn waited_ticks(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("STAT "))
        .and_then(|s| s.rsplit_once(')'))
        .map(|(_, rest)| {
            let f: Vec<u64> = rest
                .split_whitespace()
                .map(|v| v.parse().unwrap_or(0))
                .collect();
            f.get(13).copied().unwrap_or(0) + f.get(14).copied().unwrap_or(0)
        })
        .unwrap_or(0)
}
