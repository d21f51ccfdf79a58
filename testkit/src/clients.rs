//! The real protocol clients (npm and PyPI packages) the tests drive unchanged, installed by
//! scripts/test.sh (`ensure_clients`) into the folders named by FERRY_CLIENTS_DIR and
//! FERRY_PY_CLIENTS_DIR. A test without them fails saying how to install them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The folder an installed client set lives in (`var`: FERRY_CLIENTS_DIR for npm,
/// FERRY_PY_CLIENTS_DIR for PyPI).
pub fn dir(var: &str) -> PathBuf {
    std::env::var(var).map(PathBuf::from).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: run scripts/test.sh, which installs the real protocol clients \
             (or `source scripts/common.sh && ensure_clients`)"
        )
    })
}

/// The npm clients' `node_modules`.
pub fn node_modules() -> PathBuf {
    dir("FERRY_CLIENTS_DIR").join("node_modules")
}

/// Runs a client script (an `.mjs` of sidecar/tests/clients) with node, from a temp folder
/// beside the installed npm clients so its imports resolve there, with `env`. Prints what it
/// printed; asserts that it succeeded and ran at least `min_checks` checks (one line each).
pub fn run_node(script: &Path, env: &[(&str, &str)], min_checks: usize) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let name = script.file_name().expect("a script file");
    std::fs::copy(script, dir.path().join(name)).expect("copy the script");
    // The shared checks (`checks.mjs`) the scripts import, when beside them.
    let checks = script.with_file_name("checks.mjs");
    if checks.is_file() {
        std::fs::copy(&checks, dir.path().join("checks.mjs")).expect("copy checks.mjs");
    }
    std::os::unix::fs::symlink(node_modules(), dir.path().join("node_modules"))
        .expect("link the clients");
    let node = std::env::var("FERRY_NODE").unwrap_or_else(|_| "node".into());
    let mut cmd = Command::new(node);
    cmd.arg(dir.path().join(name));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run node");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the client's checks failed:\n{text}");
    assert!(
        text.lines().count() >= min_checks,
        "too few checks ran:\n{text}"
    );
    text
}
