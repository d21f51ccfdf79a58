//! One handler per route. Each turns the request into sidecar calls (see `requests.rs`) and
//! every outcome, good or bad, into a JSON response (`handler.rs`).

use crate::handler::{
    anonymous_ferry, body_bytes, ids_asked, param, require_api_key, respond, Ctx,
};
use crate::{pricing, requests};
use ferry_edge::config;
use ferry_edge::ferry::Ferry;
use ferry_edge::EdgeError;
use ferry_shared::api::{CacheCommand, CacheReply, KeyedStatus};
use serde_json::{json, Value};
use worker::{Request, Response, Result};

/// `GET /items/:id`: one item through the cache.
pub async fn get_item(req: Request, ctx: Ctx) -> Result<Response> {
    let rid = ctx.rid.clone();
    respond(
        &rid,
        async {
            let id = requests::parse_id(param(&ctx))?;
            // After a PUT from this browser, its write is read back (read-your-writes).
            let ferry = anonymous_ferry(&req, &ctx)
                .await?
                .after(cookie_position(&req, &ctx));
            let r = requests::item(&ferry, id).response().await?;
            let item = r
                .rows
                .into_iter()
                .next()
                .ok_or_else(|| EdgeError::NotFound(format!("no item {id}")))?;
            let mut body = json!({"item": item, "cache": r.cache, "age_ms": r.age_ms});
            if let Some(reason) = r.stale_reason {
                // Stale rows say why: being refreshed, or standing in for a Postgres failure.
                body["stale_reason"] = json!(reason);
            }
            Ok((200, body))
        }
        .await,
    )
}

/// `GET /items?ids=1,2,3`: many items in one sidecar call (a keyed batch: partial hits from
/// Redis, the rest from one Postgres query), in the order asked.
pub async fn get_items(req: Request, ctx: Ctx) -> Result<Response> {
    let rid = ctx.rid.clone();
    respond(
        &rid,
        async {
            let ids = ids_asked(&req)?;
            let ferry = anonymous_ferry(&req, &ctx).await?;
            let r = ferry.keyed(requests::ITEMS_KEYSPACE, &ids).await?;
            let mut items = Vec::new();
            let mut missing = Vec::new();
            let mut hits = 0;
            for res in r.results {
                match (res.status, res.row) {
                    (KeyedStatus::NotFound, _) | (_, None) => missing.push(res.id),
                    (status, Some(row)) => {
                        hits += usize::from(status == KeyedStatus::Hit);
                        items.push(Value::Object(row));
                    }
                }
            }
            Ok((
                200,
                json!({"items": items, "missing": missing, "hits": hits}),
            ))
        }
        .await,
    )
}

/// `PUT /items/:id` (API key): write the item, then invalidate its cache entry (before answering).
pub async fn put_item(mut req: Request, ctx: Ctx) -> Result<Response> {
    let rid = ctx.rid.clone();
    let mut position = None;
    let resp = respond(
        &rid,
        async {
            require_api_key(&req, &ctx)?;
            let id = requests::parse_id(param(&ctx))?;
            let ferry = Ferry::from_env(&ctx.env, &rid)?;
            let r = requests::item_upsert(&ferry, id, &body_bytes(&mut req).await?)?
                .run()
                .await?;
            position = r.position;
            let mut body =
                json!({"id": id, "written": r.rows_affected == 1, "invalidation": r.invalidation});
            if let Some(p) = position {
                body["position"] = json!(p);
            }
            Ok((200, body))
        }
        .await,
    )?;
    // The next GET from this browser carries the write's position (see `get_item`).
    if let Some(p) = position {
        resp.headers().set(
            "set-cookie",
            &ferry_edge::ferry::position_cookie(p, &cookie_key(&ctx)),
        )?;
    }
    Ok(resp)
}

/// `PUT /items` (API key) with `{"items": [{"id": 1, "name": "...", "price": "12.50"}, ...]}`:
/// all written in one transaction or none, then each one's cache entry invalidated. A
/// transaction whose answer was lost with its sidecar but which committed (its outcome says
/// so) is answered as the success it is: this route needs no per-statement results.
pub async fn put_items(mut req: Request, ctx: Ctx) -> Result<Response> {
    let rid = ctx.rid.clone();
    respond(
        &rid,
        async {
            require_api_key(&req, &ctx)?;
            let ferry = Ferry::from_env(&ctx.env, &rid)?;
            let tx = requests::items_upsert(&ferry, &body_bytes(&mut req).await?)?;
            let (written, invalidation) = match tx.run().await {
                Ok(r) => (
                    r.results.iter().map(|s| s.rows_affected).sum(),
                    r.invalidation,
                ),
                Err(EdgeError::CommittedWithoutResults {
                    rows_affected,
                    invalidation,
                    ..
                }) => (rows_affected, invalidation),
                Err(e) => return Err(e),
            };
            Ok((
                200,
                json!({"written": written, "invalidation": invalidation}),
            ))
        }
        .await,
    )
}

/// `POST /items/:id/reprice` (API key) with `{"percent": 10}`: the price read under a row lock,
/// the new one computed here, in the Worker, and written, in one interactive transaction, so
/// concurrent reprices of one item each see the last one's price (none is lost). A missing
/// item is 404, and its transaction is rolled back at once.
pub async fn reprice_item(mut req: Request, ctx: Ctx) -> Result<Response> {
    #[derive(serde::Deserialize)]
    struct Price {
        price: String,
    }
    let rid = ctx.rid.clone();
    respond(
        &rid,
        async {
            require_api_key(&req, &ctx)?;
            let id = requests::parse_id(param(&ctx))?;
            let percent = pricing::parse_reprice(&body_bytes(&mut req).await?)?;
            let ferry = Ferry::from_env(&ctx.env, &rid)?;
            let ((old, new), end) = ferry
                .begin()
                .run(|tx| async move {
                    let old = tx
                        .statement(pricing::PRICE_FOR_UPDATE_QUERY)
                        .bind(id)
                        .fetch_all::<Price>()
                        .await?
                        .pop()
                        .ok_or_else(|| EdgeError::NotFound(format!("no item {id}")))?
                        .price;
                    let new = pricing::repriced(&old, percent)?;
                    tx.statement(pricing::SET_PRICE_QUERY)
                        .bind(id)
                        .bind(&new)
                        .run()
                        .await?;
                    tx.invalidate_key(requests::item_key(id));
                    Ok((old, new))
                })
                .await?;
            Ok((
                200,
                json!({"id": id, "old_price": old, "price": new, "invalidation": end.invalidation}),
            ))
        }
        .await,
    )
}

/// The write position a browser's `ferry_position` cookie carries, if this edge signed it.
fn cookie_position(req: &Request, ctx: &Ctx) -> Option<ferry_shared::api::Position> {
    let cookies = req.headers().get("cookie").ok().flatten()?;
    ferry_edge::ferry::position_from_cookies(&cookies, &cookie_key(ctx))
}

/// The key position cookies are signed with: the edge's secret (`Ferry::from_env` refuses to
/// run without one, so an empty key never signs a cookie that is then sent anywhere).
fn cookie_key(ctx: &Ctx) -> Vec<u8> {
    ctx.secret(config::SECRET)
        .map(|s| s.to_string().into_bytes())
        .unwrap_or_default()
}

/// `GET /cache/:key` (API key): a value from the edge's cache namespace.
pub async fn get_cache(req: Request, ctx: Ctx) -> Result<Response> {
    let rid = ctx.rid.clone();
    respond(
        &rid,
        async {
            require_api_key(&req, &ctx)?;
            let key = requests::parse_cache_key(param(&ctx))?;
            let cmd = CacheCommand::Get {
                key: requests::edge_cache_key(&key),
            };
            match Ferry::from_env(&ctx.env, &rid)?.cache(cmd).await? {
                CacheReply::Get { value: Some(v) } => Ok((200, json!({"key": key, "value": v}))),
                CacheReply::Get { value: None } => {
                    Err(EdgeError::NotFound(format!("no key {key}")))
                }
                _ => Err(EdgeError::BadResponse { status: 200 }),
            }
        }
        .await,
    )
}

/// `PUT /cache/:key` (API key) with `{"value": "...", "ttl_s": 60}`.
pub async fn put_cache(mut req: Request, ctx: Ctx) -> Result<Response> {
    let rid = ctx.rid.clone();
    respond(
        &rid,
        async {
            require_api_key(&req, &ctx)?;
            let key = requests::parse_cache_key(param(&ctx))?;
            let cmd = requests::cache_set(&key, &body_bytes(&mut req).await?)?;
            match Ferry::from_env(&ctx.env, &rid)?.cache(cmd).await? {
                CacheReply::Set {} => Ok((200, json!({"key": key, "stored": true}))),
                _ => Err(EdgeError::BadResponse { status: 200 }),
            }
        }
        .await,
    )
}

/// `GET /me/notes` (JWT): the signed-in user's notes, as Postgres's row-level security lets
/// them see, cached for them alone.
pub async fn get_my_notes(req: Request, ctx: Ctx) -> Result<Response> {
    let rid = ctx.rid.clone();
    respond(
        &rid,
        async {
            let ferry = Ferry::from_env(&ctx.env, &rid)?
                .as_user(ferry_edge::ferry::end_user(&req, &ctx.env).await?);
            let r = requests::my_notes(&ferry).response().await?;
            Ok((200, json!({"notes": r.rows, "cache": r.cache})))
        }
        .await,
    )
}

/// `POST /me/notes` (JWT) with `{"body": "..."}`: a note of the signed-in user's own.
pub async fn post_my_note(mut req: Request, ctx: Ctx) -> Result<Response> {
    let rid = ctx.rid.clone();
    respond(
        &rid,
        async {
            let ferry = Ferry::from_env(&ctx.env, &rid)?
                .as_user(ferry_edge::ferry::end_user(&req, &ctx.env).await?);
            let r = requests::add_note(&ferry, &body_bytes(&mut req).await?)?
                .run()
                .await?;
            Ok((
                201,
                json!({"written": r.rows_affected == 1, "invalidation": r.invalidation}),
            ))
        }
        .await,
    )
}

/// `GET /page?ids=1,2,3`: a page that reads each item on its own, all at once, as handler code
/// naturally does: the library sends them to the sidecar as one call (`sidecar_calls`).
pub async fn get_page(req: Request, ctx: Ctx) -> Result<Response> {
    let rid = ctx.rid.clone();
    respond(
        &rid,
        async {
            let ids = ids_asked(&req)?;
            let ferry = anonymous_ferry(&req, &ctx).await?;
            let reads = ids
                .iter()
                .map(|&id| requests::item(&ferry, id).fetch_optional::<Value>());
            let found = futures_util::future::join_all(reads).await;
            let mut items = Vec::new();
            let mut missing = Vec::new();
            for (id, item) in ids.iter().zip(found) {
                match item? {
                    Some(item) => items.push(item),
                    None => missing.push(*id),
                }
            }
            let calls = ferry.sidecar_calls();
            Ok((
                200,
                json!({"items": items, "missing": missing, "sidecar_calls": calls}),
            ))
        }
        .await,
    )
}

/// `GET /health`: the edge is up; is the sidecar reachable and ready? The sidecar answers from
/// its readiness snapshot, so Internet traffic here never reaches its pools. Anyone learns
/// up or down; the details (each store, the change stream's part and lag) need the API key.
pub async fn health(req: Request, ctx: Ctx) -> Result<Response> {
    let rid = ctx.rid.clone();
    let detailed = require_api_key(&req, &ctx).is_ok();
    respond(
        &rid,
        async {
            let ready = Ferry::from_env(&ctx.env, &rid)?.readiness().await?;
            let status = if ready.ready { 200 } else { 503 };
            let sidecar = if detailed {
                json!(ready)
            } else {
                json!(if ready.ready { "up" } else { "down" })
            };
            Ok((status, json!({"edge": "up", "sidecar": sidecar})))
        }
        .await,
    )
}
