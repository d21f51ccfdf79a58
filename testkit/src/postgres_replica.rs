//! A streaming replica of a private Postgres (`pg_basebackup -R`), for read-your-writes tests.

use super::free_port;
use super::postgres::{give_to_postgres, pg_command, run, PgServer};

impl PgServer {
    /// A hot standby of `primary`, streaming from it, started and accepting reads. `extra` are
    /// more server options (`-c recovery_min_apply_delay=300ms` holds each commit back that
    /// long before it is replayed: a lagging replica).
    pub fn replica_of(primary: &PgServer, extra: &str) -> PgServer {
        let dir = tempfile::tempdir().expect("tempdir for the replica");
        give_to_postgres(dir.path());
        let mut c = pg_command("pg_basebackup");
        c.arg("-D")
            .arg(dir.path().join("data"))
            .args(["-h", "127.0.0.1", "-p", &primary.port.to_string()])
            .args(["-U", "postgres", "-R", "-X", "stream", "--checkpoint=fast"])
            .arg("--no-sync")
            .current_dir(dir.path());
        run(c, "pg_basebackup");
        let mut replica = PgServer {
            port: free_port(),
            dir,
            running: false,
            extra: extra.to_string(),
        };
        replica.start_on_a_free_port();
        replica
    }

    /// Where this replica has replayed to (`pg_last_wal_replay_lsn()`).
    pub fn replayed(&self) -> String {
        self.client()
            .query_one("SELECT pg_last_wal_replay_lsn()::text", &[])
            .expect("replay position")
            .get(0)
    }

    /// Changes how long this replica holds each commit back (`recovery_min_apply_delay`).
    pub fn set_apply_delay(&self, delay: &str) {
        let mut c = self.client();
        c.batch_execute(&format!(
            "ALTER SYSTEM SET recovery_min_apply_delay = '{delay}'"
        ))
        .expect("set recovery_min_apply_delay");
        c.batch_execute("SELECT pg_reload_conf()").expect("reload");
    }
}
