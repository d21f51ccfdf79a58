//! Statements on Ferry's Postgres sessions. `class`: what kind of statement a caller sent,
//! decided before it reaches Postgres. `read`: a plain read's statement, written once for
//! both kinds of session: `pooled` (reads and writes on a pooled session, blocking, inside
//! `Blocking::run`) and `on_loop` (plain reads on the worker's own event loop,
//! `postgres::loop_session`). `rows`: parameters bound and rows decoded within the read
//! limits, for both. `transaction`: several statements in one call; `interactive`: a
//! transaction held open across calls. `text`: statements with Postgres's own text output
//! (Neon's `/sql`). `json` and `params`: values both ways. `plain`: which named reads Postgres
//! says leave their session as they found it (no reset after them); `inference`: what a read
//! cached with no tables named depends on, asked on the request path.

pub(crate) mod behind;
pub(crate) mod class;
pub(crate) mod inference;
pub(crate) mod interactive;
pub(crate) mod json;
pub(crate) mod on_loop;
pub(crate) mod params;
pub(crate) mod plain;
pub(crate) mod pooled;
pub(crate) mod read;
pub(crate) mod rows;
pub(crate) mod text;
pub(crate) mod transaction;
