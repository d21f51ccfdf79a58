//! Statements on Ferry's Postgres sessions. `class`: what kind of statement a caller sent,
//! decided before it reaches Postgres. `pooled`: reads and writes on a pooled session (blocking,
//! inside `Blocking::run`), with the checks every result passes. `on_loop`: plain reads on the
//! worker's own event loop (`postgres::loop_session`). `transaction`: several statements in
//! one call; `interactive`: a transaction held open across calls. `text`: statements with
//! Postgres's own text output (Neon's `/sql`). `json` and `params`: values both ways.

pub mod class;
pub mod interactive;
pub mod json;
pub mod on_loop;
pub mod params;
pub mod pooled;
pub mod text;
pub mod transaction;
