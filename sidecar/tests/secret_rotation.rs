//! Rotating the shared secret without downtime: while `auth.previous_secret` is set, requests
//! signed with either secret are accepted; once it is cleared, only the new one.
use ferry_testkit as common;
use serde_json::json;

const OLD: &str = "old-secret-0123456789abcdef";

#[test]
fn both_secrets_work_during_a_rotation() {
    let stack = common::Stack::start_with(|c| c.auth.previous_secret = OLD.into());
    let new = &stack.client;
    let old = common::Client::new(&new.base, OLD);
    let other = common::Client::new(&new.base, "not-a-secret-of-ours-0123");
    let q = json!({"sql": "SELECT 1 AS one"});
    assert_eq!(new.query(q.clone()).status, 200);
    assert_eq!(old.query(q.clone()).status, 200);
    assert_eq!(other.query(q).status, 401);
}

#[test]
fn without_a_previous_secret_the_old_one_is_refused() {
    let stack = common::Stack::start();
    let old = common::Client::new(&stack.client.base, OLD);
    let r = old.query(json!({"sql": "SELECT 1"}));
    assert_eq!(r.status, 401);
    assert_eq!(r.code(), "auth_bad_signature");
}
