//! The connections scripts run on: one multiplexed connection per token's script user
//! (`upstash.tokens[].script_user`), authenticated as that user, so Redis's ACL, not Ferry,
//! decides which keys a script may touch. Opened on first use, dropped after a failure.

use crate::config::{RedisConfig, UpstashToken};
use redis::aio::MultiplexedConnection;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

#[derive(Default)]
pub struct ScriptConnections {
    open: Mutex<HashMap<String, MultiplexedConnection>>,
}

impl ScriptConnections {
    pub async fn get(
        &self,
        redis: &RedisConfig,
        token: &UpstashToken,
    ) -> Result<MultiplexedConnection, String> {
        let user = &token.script_user;
        if let Some(c) = self.lock().get(user) {
            return Ok(c.clone());
        }
        let client =
            crate::store::redis::redis_client_as(redis, user, token.script_password.as_str())?;
        let connect = client.get_multiplexed_async_connection();
        let conn = tokio::time::timeout(Duration::from_millis(redis.connect_timeout_ms), connect)
            .await
            .map_err(|_| "connect timeout".to_string())?
            .map_err(|e| e.to_string())?;
        self.lock().insert(user.clone(), conn.clone());
        Ok(conn)
    }

    pub fn forget(&self, user: &str) {
        self.lock().remove(user);
    }

    /// Every connection is opened anew on next use (a reload may have changed passwords).
    pub fn forget_all(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, MultiplexedConnection>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}
