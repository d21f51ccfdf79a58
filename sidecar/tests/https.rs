//! HTTPS in the sidecar: with a certificate and key configured, the public listener speaks
//! TLS (checked with curl against a throwaway CA and certificate) and refuses
//! plain HTTP; signed requests work over it.
use ferry_testkit as common;
use std::process::Command;

fn curl(args: &[&str]) -> (bool, String) {
    let out = Command::new("curl").args(args).output().expect("run curl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn the_listener_speaks_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = common::certs::make(dir.path());
    let (cert_s, key_s, ca) = (certs.cert, certs.key, certs.ca);
    let stack = common::Stack::start_with(|c| {
        c.server.tls_cert_path = cert_s.clone();
        c.server.tls_key_path = key_s.clone();
    });
    let https = format!("https://{}", stack.sidecar.addr);
    let (ok, body) = curl(&["-sS", "--cacert", &ca, &format!("{https}/healthz")]);
    assert!(ok, "HTTPS /healthz failed");
    assert_eq!(body, r#"{"status":"ok"}"#);
    let (ok, _) = curl(&[
        "-sS",
        "-m",
        "5",
        &format!("http://{}/healthz", stack.sidecar.addr),
    ]);
    assert!(!ok, "plain HTTP must not be served on the TLS listener");

    // A signed read over TLS, with the project's own signing script.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/ferry-curl.sh");
    let out = Command::new("bash")
        .arg(script)
        .args([
            "POST",
            "/v1/query",
            r#"{"sql": "SELECT 41 + 1 AS answer"}"#,
            "--cacert",
            &cert_s,
        ])
        .env("FERRY_SECRET", common::SECRET)
        .env("FERRY_URL", &https)
        .output()
        .expect("ferry-curl");
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(
        body.contains(r#""answer":42"#),
        "{body} {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
