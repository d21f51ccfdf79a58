//! End users signed in by an auth provider that publishes its keys (RS256 and ES256 tokens,
//! checked in workerd with WebCrypto against `FERRY_JWKS_URL`). The adversaries: a token
//! signed with a key the provider never published, one whose header names another kind of key,
//! a tampered or expired one, a key the provider retired, and a flood of made-up key ids that
//! would make the Worker hammer the provider. A local JWKS server counts its fetches; keys and
//! signatures come from the openssl command.
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use ferry_testkit::{self as kit, client::Answer, Client, Stack, WranglerDev};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn openssl(args: &[&str]) -> Vec<u8> {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("run openssl (apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn unhex(h: &str) -> Vec<u8> {
    (0..h.len() / 2)
        .map(|i| u8::from_str_radix(&h[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

struct Key {
    kid: String,
    alg: &'static str,
    pem: PathBuf,
    jwk: Value,
}

fn rsa_key(dir: &Path, kid: &str) -> Key {
    let pem = dir.join(format!("{kid}.pem"));
    let p = pem.to_str().expect("utf-8 path");
    openssl(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        p,
    ]);
    let modulus =
        String::from_utf8(openssl(&["rsa", "-in", p, "-noout", "-modulus"])).expect("ascii");
    let n = unhex(modulus.trim().trim_start_matches("Modulus="));
    let jwk = json!({"kty": "RSA", "kid": kid, "alg": "RS256", "use": "sig",
                     "n": B64.encode(n), "e": "AQAB"});
    Key {
        kid: kid.into(),
        alg: "RS256",
        pem,
        jwk,
    }
}

fn ec_key(dir: &Path, kid: &str) -> Key {
    let pem = dir.join(format!("{kid}.pem"));
    let p = pem.to_str().expect("utf-8 path");
    openssl(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        p,
    ]);
    let der = openssl(&["pkey", "-in", p, "-pubout", "-outform", "DER"]);
    // The public point ends the DER: 0x04, then x and y (32 bytes each).
    let point = &der[der.len() - 64..];
    let jwk = json!({"kty": "EC", "kid": kid, "crv": "P-256",
                     "x": B64.encode(&point[..32]), "y": B64.encode(&point[32..])});
    Key {
        kid: kid.into(),
        alg: "ES256",
        pem,
        jwk,
    }
}

/// An ECDSA signature as openssl writes it (DER: SEQUENCE of two INTEGERs) → JWS's r || s.
fn der_to_raw(der: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 2; // SEQUENCE tag and length (short form for P-256)
    for _ in 0..2 {
        assert_eq!(der[i], 0x02, "INTEGER");
        let len = der[i + 1] as usize;
        let int = &der[i + 2..i + 2 + len];
        let int = &int[int.len().saturating_sub(32)..];
        out.extend(std::iter::repeat_n(0u8, 32 - int.len()));
        out.extend_from_slice(int);
        i += 2 + len;
    }
    out
}

/// A token signed by `key`, whose header says `alg` and `kid` (normally the key's own).
fn sign_as(key: &Key, alg: &str, kid: &str, claims: &Value, dir: &Path) -> String {
    let header = json!({"alg": alg, "typ": "JWT", "kid": kid});
    let input = format!(
        "{}.{}",
        B64.encode(header.to_string()),
        B64.encode(claims.to_string())
    );
    let file = dir.join("input");
    std::fs::write(&file, &input).expect("write");
    let der = openssl(&[
        "dgst",
        "-sha256",
        "-sign",
        key.pem.to_str().expect("path"),
        file.to_str().expect("path"),
    ]);
    let sig = if key.alg == "ES256" {
        der_to_raw(&der)
    } else {
        der
    };
    format!("{input}.{}", B64.encode(sig))
}

fn sign(key: &Key, claims: &Value, dir: &Path) -> String {
    sign_as(key, key.alg, &key.kid, claims, dir)
}

/// Serves `body` at any path; counts the fetches.
fn jwks_server(body: Arc<Mutex<String>>, fetches: Arc<AtomicUsize>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!(
        "http://{}/.well-known/jwks.json",
        listener.local_addr().expect("addr")
    );
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut stream = stream;
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            fetches.fetch_add(1, Ordering::SeqCst);
            let b = body.lock().expect("lock").clone();
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{b}",
                b.len()
            );
        }
    });
    url
}

fn notes(c: &Client, jwt: &str) -> Answer {
    c.raw(
        "GET",
        "/me/notes",
        Vec::new(),
        &[("authorization", format!("Bearer {jwt}"))],
    )
}

#[test]
fn provider_keys_sign_users_in_and_nothing_else_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let (r1, e1, e2, stranger) = (
        rsa_key(d, "r1"),
        ec_key(d, "e1"),
        ec_key(d, "e2"),
        ec_key(d, "x"),
    );
    let published = Arc::new(Mutex::new(json!({"keys": [r1.jwk, e1.jwk]}).to_string()));
    let fetches = Arc::new(AtomicUsize::new(0));
    let url = jwks_server(published.clone(), fetches.clone());

    let stack = Stack::start();
    let edge = WranglerDev::start_with_vars(
        &stack.sidecar.base_url(),
        kit::SECRET,
        5_000,
        &[("FERRY_JWKS_URL", url.as_str())],
    );
    let c = Client::new(&edge.url(), kit::SECRET);
    let exp = kit::client::now_s() + 600;
    let claims = |sub: &str| json!({"sub": sub, "exp": exp});

    // RS256 and ES256 tokens of published keys: each user their own notes.
    let a = notes(&c, &sign(&r1, &claims("alice"), d));
    assert_eq!(a.status, 200, "{}\n{}", a.body, edge.log());
    assert_eq!(a.body["notes"].as_array().map(Vec::len), Some(2));
    let first_fetch = Instant::now();
    let b = notes(&c, &sign(&e1, &claims("bob"), d));
    assert_eq!(b.status, 200, "{}", b.body);
    assert_eq!(b.body["notes"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        fetches.load(Ordering::SeqCst),
        1,
        "the keys are kept in the isolate"
    );

    // Tokens that must not get in.
    let good = sign(&r1, &claims("alice"), d);
    let parts: Vec<&str> = good.split('.').collect();
    let tampered = format!(
        "{}.{}.{}",
        parts[0],
        B64.encode(claims("bob").to_string()),
        parts[2]
    );
    let hs_with_public = {
        // The classic confusion: HS256, keyed with the provider's public key material.
        let header = B64.encode(json!({"alg": "HS256", "kid": "r1"}).to_string());
        let body = B64.encode(claims("alice").to_string());
        let mac = ferry_edge::jwt::sign_hs256(
            &claims("alice"),
            r1.jwk["n"].as_str().unwrap_or("").as_bytes(),
        );
        format!("{header}.{body}.{}", mac.rsplit('.').next().unwrap_or(""))
    };
    for (what, jwt) in [
        (
            "unpublished key, published kid",
            sign_as(&stranger, "ES256", "e1", &claims("alice"), d),
        ),
        (
            "RS256 header on an EC key id",
            sign_as(&r1, "RS256", "e1", &claims("alice"), d),
        ),
        (
            "ES256 header on an RSA key id",
            sign_as(&e1, "ES256", "r1", &claims("alice"), d),
        ),
        ("payload swapped", tampered),
        ("HS256 keyed with the public key", hs_with_public),
        ("expired", sign(&r1, &json!({"sub": "alice", "exp": 1}), d)),
    ] {
        let r = notes(&c, &jwt);
        assert_eq!(
            (r.status, r.code()),
            (401, "unauthorized"),
            "{what}: {}",
            r.body
        );
    }

    // The provider rotates: e2 in, r1 and e1 out. Once the refetch window has passed since the
    // last fetch, the first e2 token fetches the new set; then retired keys are refused.
    *published.lock().expect("lock") = json!({"keys": [e2.jwk]}).to_string();
    let wait = Duration::from_secs(11).saturating_sub(first_fetch.elapsed());
    std::thread::sleep(wait);
    let rotated = notes(&c, &sign(&e2, &claims("alice"), d));
    assert_eq!(rotated.status, 200, "{}", rotated.body);
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    let refetched = Instant::now();
    let retired = notes(&c, &sign(&r1, &claims("alice"), d));
    assert_eq!(retired.status, 401, "{}", retired.body);

    // Made-up key ids: refused, and the provider is not fetched again within the window.
    for i in 0..20 {
        let r = notes(
            &c,
            &sign_as(&e2, "ES256", &format!("made-up-{i}"), &claims("alice"), d),
        );
        assert_eq!(r.status, 401, "{}", r.body);
    }
    // One fetch per 10 s window at most (a very slow run may see one more window open).
    let bound = 2 + refetched.elapsed().as_secs() as usize / 10;
    let n = fetches.load(Ordering::SeqCst);
    assert!(n <= bound, "{n} fetches, at most {bound}");
}

/// The provider dying: its keys cannot be fetched, because nothing listens, or because it
/// accepts connections and never answers. The Worker answers a clear, retryable 502 (not a 401
/// that would sign the user out, and never a pass), within its 3 s fetch timeout, not hanging.
#[test]
fn a_dead_or_hung_provider_is_a_fast_502_never_a_pass() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = rsa_key(dir.path(), "r1");
    // Hung: accepts, reads nothing, answers nothing, keeps the connections open.
    let hung = TcpListener::bind("127.0.0.1:0").expect("bind");
    let hung_url = format!("http://{}/jwks.json", hung.local_addr().expect("addr"));
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in hung.incoming().flatten() {
            held.push(s);
        }
    });
    // Dead: a port nothing listens on.
    let dead_url = format!("http://127.0.0.1:{}/jwks.json", kit::free_port());
    let stack = Stack::start();
    let token = sign(
        &key,
        &json!({"sub": "alice", "exp": kit::client::now_s() + 600}),
        dir.path(),
    );
    for (what, url) in [("hung", hung_url), ("dead", dead_url)] {
        let edge = WranglerDev::start_with_vars(
            &stack.sidecar.base_url(),
            kit::SECRET,
            5_000,
            &[("FERRY_JWKS_URL", url.as_str())],
        );
        let c = Client::new(&edge.url(), kit::SECRET);
        let started = Instant::now();
        let r = notes(&c, &token);
        let took = started.elapsed();
        assert_eq!(
            (r.status, r.code()),
            (502, "upstream_error"),
            "{what}: {}",
            r.body
        );
        assert_eq!(r.headers["retry-after"], "1", "{what}");
        assert!(
            took < Duration::from_secs(10),
            "{what}: answered after {took:?}"
        );
        // HS256 users (the Worker's own key) are not held up by the provider.
        let hs = ferry_edge::jwt::sign_hs256(
            &json!({"sub": "bob", "exp": kit::client::now_s() + 600}),
            kit::JWT_SECRET.as_bytes(),
        );
        assert_eq!(notes(&c, &hs).status, 200, "{what}");
    }
}
