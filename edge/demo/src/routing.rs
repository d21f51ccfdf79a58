//! The demo Worker's routes, matched here rather than by the runtime's router: every request
//! that matches none is answered in JSON, with the request id, a 404 for an unknown path and
//! a 405 with `Allow` for a known path under another method (`HEAD`, `PROPFIND`...). A path
//! with a `.` or `..` segment, an empty segment or a percent-encoded slash matches nothing:
//! it means different things to different layers, so none of them serves it.

/// A matched route, with its path parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `GET /items?ids=...`
    GetItems,
    /// `PUT /items`
    PutItems,
    /// `GET /items/:id`
    GetItem(String),
    /// `PUT /items/:id`
    PutItem(String),
    /// `POST /items/:id/reprice`
    RepriceItem(String),
    /// `GET /cache/:key`
    GetCache(String),
    /// `PUT /cache/:key`
    PutCache(String),
    /// `GET /page?ids=...`
    GetPage,
    /// `GET /me/notes`
    GetMyNotes,
    /// `POST /me/notes`
    PostMyNote,
    /// `GET /health`
    Health,
}

/// Why a request matched no route: 404, or 405 with the methods the path takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unmatched {
    /// No route has this path.
    NotFound,
    /// The path's route takes other methods: these (the `Allow` header).
    MethodNotAllowed(&'static str),
}

/// The route for `method` and `path` (the URL's path, still percent-encoded).
pub fn route(method: &str, path: &str) -> Result<Route, Unmatched> {
    let segments: Vec<&str> = match path.strip_prefix('/') {
        Some(rest) => rest.split('/').collect(),
        None => return Err(Unmatched::NotFound),
    };
    let odd = |s: &&str| {
        s.is_empty()
            || *s == "."
            || *s == ".."
            || s.to_ascii_lowercase().contains("%2f")
            || s.to_ascii_lowercase().contains("%2e")
    };
    if segments.iter().any(odd) {
        return Err(Unmatched::NotFound);
    }
    let param = |s: &str| s.to_string();
    // Each path, with the methods it takes and the route each leads to.
    let (allow, chosen) = match segments.as_slice() {
        ["items"] => (
            "GET, PUT",
            match method {
                "GET" => Some(Route::GetItems),
                "PUT" => Some(Route::PutItems),
                _ => None,
            },
        ),
        ["items", id] => (
            "GET, PUT",
            match method {
                "GET" => Some(Route::GetItem(param(id))),
                "PUT" => Some(Route::PutItem(param(id))),
                _ => None,
            },
        ),
        ["items", id, "reprice"] => (
            "POST",
            (method == "POST").then(|| Route::RepriceItem(param(id))),
        ),
        ["cache", key] => (
            "GET, PUT",
            match method {
                "GET" => Some(Route::GetCache(param(key))),
                "PUT" => Some(Route::PutCache(param(key))),
                _ => None,
            },
        ),
        ["page"] => ("GET", (method == "GET").then_some(Route::GetPage)),
        ["me", "notes"] => (
            "GET, POST",
            match method {
                "GET" => Some(Route::GetMyNotes),
                "POST" => Some(Route::PostMyNote),
                _ => None,
            },
        ),
        ["health"] => ("GET", (method == "GET").then_some(Route::Health)),
        _ => return Err(Unmatched::NotFound),
    };
    chosen.ok_or(Unmatched::MethodNotAllowed(allow))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_paths_take_their_methods_only() {
        assert_eq!(route("GET", "/items/7"), Ok(Route::GetItem("7".into())));
        assert_eq!(route("PUT", "/items"), Ok(Route::PutItems));
        assert_eq!(
            route("POST", "/items/7/reprice"),
            Ok(Route::RepriceItem("7".into()))
        );
        assert_eq!(route("GET", "/health"), Ok(Route::Health));
        for (method, path, allow) in [
            ("HEAD", "/items/7", "GET, PUT"),
            ("PROPFIND", "/items/7", "GET, PUT"),
            ("DELETE", "/items", "GET, PUT"),
            ("GET", "/items/7/reprice", "POST"),
            ("POST", "/health", "GET"),
        ] {
            assert_eq!(
                route(method, path),
                Err(Unmatched::MethodNotAllowed(allow)),
                "{method} {path}"
            );
        }
    }

    #[test]
    fn unknown_and_ambiguous_paths_match_nothing() {
        for path in [
            "/",
            "",
            "/nope",
            "/items/",
            "/items//7",
            "/items/7/",
            "/items/../health",
            "/items/./7",
            "/items/%2e%2e/health",
            "/cache/a%2Fb",
            "/items/7/reprice/more",
        ] {
            assert_eq!(route("GET", path), Err(Unmatched::NotFound), "{path}");
        }
    }
}
