//! The fill leases' wake-ups (`leases.rs`): one subscriber connection per sidecar, which
//! wakes this sidecar's waiters on a lease when its holder's release publishes its name.

use super::leases::Leases;
use std::sync::Weak;
use std::time::Duration;

/// Subscribes on the first node, moving to the next after a failure (a cluster relays PUBLISH
/// to every node, so any node that answers will do).
pub(super) fn listen(
    leases: Weak<Leases>,
    clients: &[redis::Client],
    channel: &str,
    stop: &crate::background::Stop,
) {
    let mut next = clients.iter().cycle();
    while leases.strong_count() > 0 && !stop.stopping() {
        let Some(client) = next.next() else {
            return;
        };
        let subscribed = client
            .get_connection_with_timeout(Duration::from_secs(1))
            .and_then(|mut conn| {
                // A read timeout lets the loop notice when the sidecar goes.
                conn.set_read_timeout(Some(Duration::from_secs(1)))?;
                let mut ps = conn.as_pubsub();
                ps.subscribe(channel)?;
                loop {
                    match ps.get_message() {
                        Ok(msg) => {
                            let Some(l) = leases.upgrade() else {
                                return Ok(());
                            };
                            if let Ok(key) = msg.get_payload::<String>() {
                                l.wake(&key);
                            }
                        }
                        Err(e) if e.is_timeout() => {
                            if leases.strong_count() == 0 || stop.stopping() {
                                return Ok(());
                            }
                        }
                        Err(e) => return Err(e),
                    }
                }
            });
        if let Err(e) = subscribed {
            tracing::debug!(error = %e, "fill wake-ups: redis failed; reconnecting");
            stop.wait(Duration::from_millis(250));
        }
    }
}
