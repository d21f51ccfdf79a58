//! Slow clients (slowloris): headers or a body trickled in are cut off by bounded read
//! timeouts, and other requests keep being served meanwhile.
use ferry_testkit as common;
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Sends `head` then trickles `rest` a byte every 200 ms; returns what the server answered
/// and when the connection ended.
fn trickle(addr: std::net::SocketAddr, head: &str, rest: &str) -> (String, Duration) {
    let start = Instant::now();
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    s.write_all(head.as_bytes()).expect("write");
    for b in rest.bytes() {
        if s.write_all(&[b]).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
        if start.elapsed() > Duration::from_secs(20) {
            break;
        }
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    (out, start.elapsed())
}

#[test]
fn trickled_headers_and_bodies_are_cut_off() {
    let stack = common::Stack::start_with(|c| c.server.request_timeout_ms = 2_000);
    let addr = stack.sidecar.addr;
    let headers = std::thread::spawn(move || {
        trickle(
            addr,
            "POST /v1/query HTTP/1.1\r\n",
            &"x-slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n".repeat(3),
        )
    });
    // Well-formed, current signature headers (the MAC can only be checked once the body is in).
    let head = format!(
        "POST /v1/query HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 400\r\n\
         x-ferry-timestamp: {}\r\nx-ferry-nonce: 00112233445566778899\r\nx-ferry-signature: v1={}\r\n\r\n",
        common::client::now_s(),
        "0".repeat(64)
    );
    let body = std::thread::spawn(move || trickle(addr, &head, &"{".repeat(100)));
    // Meanwhile the sidecar serves others.
    for _ in 0..5 {
        assert_eq!(
            stack.client.query(json!({"sql": "SELECT 1 AS one"})).status,
            200
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let (h_out, h_took) = headers.join().expect("headers");
    let (b_out, b_took) = body.join().expect("body");
    println!("FIGURES slowloris: trickled headers cut after {h_took:?}; trickled body cut after {b_took:?}");
    assert!(
        h_took < Duration::from_secs(8),
        "header read is bounded ({h_took:?})"
    );
    assert!(
        b_took < Duration::from_secs(5),
        "body read is bounded ({b_took:?})"
    );
    // The slow body gets a JSON 400, not a hang.
    assert!(
        b_out.starts_with("HTTP/1.1 400") || b_out.is_empty(),
        "{b_out}"
    );
    let _ = h_out;
}

#[test]
fn a_stale_or_malformed_signature_is_refused_before_the_body_is_read() {
    let stack = common::Stack::start_with(|c| c.server.request_timeout_ms = 2_000);
    for (ts, sig) in [("1", "0".repeat(64)), ("now", "00".to_string())] {
        let ts = if ts == "now" {
            common::client::now_s().to_string()
        } else {
            ts.to_string()
        };
        let start = Instant::now();
        let mut s = TcpStream::connect(stack.sidecar.addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        // Headers announce 400 bytes of body that never come.
        s.write_all(
            format!(
                "POST /v1/query HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
                 content-length: 400\r\nx-ferry-timestamp: {ts}\r\n\
                 x-ferry-nonce: 00112233445566778899\r\nx-ferry-signature: v1={sig}\r\n\r\n"
            )
            .as_bytes(),
        )
        .expect("write");
        let mut out = [0u8; 512];
        let n = s.read(&mut out).unwrap_or(0);
        let answer = String::from_utf8_lossy(&out[..n]).to_string();
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
        // Answered without waiting for the body (the body deadline here is 2 s).
        assert!(
            start.elapsed() < Duration::from_millis(1_500),
            "{:?}",
            start.elapsed()
        );
    }
}
