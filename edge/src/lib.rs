//! The Ferry edge Worker. This crate is a placeholder until the edge issue lands: it only proves
//! that the wire crate links into it. The Worker itself (`#[event(fetch)]`, the typed sidecar
//! client and the routes) is built with the `worker` crate for wasm32 only.

// A panic is an outage here (a dead request, or on the edge a dead isolate).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

/// The sidecar path the edge calls for reads; here so the edge and the sidecar cannot disagree.
pub fn query_path() -> &'static str {
    ferry_shared::api::paths::QUERY
}

#[cfg(test)]
mod tests {
    #[test]
    fn uses_the_shared_paths() {
        assert_eq!(super::query_path(), "/v1/query");
    }
}
