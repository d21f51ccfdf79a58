//! Ferry's Postgres connections. Here: the pooled session type and its manager (a poisoned
//! session is closed, not reused), the connection settings (session defaults, TLS, loopback),
//! and the check of the role Ferry connects as. `loop_session`: sessions on a worker's own
//! event loop, for plain reads; `param_types`: what Postgres said about each statement's
//! parameters; `own_sessions`: the proof that a session is Ferry's own (no pooler between);
//! `roles`: trust levels as roles, audited; `identity`: a statement run as an end user;
//! `deadline`: a request's deadline cancels its statements; `failure`: Postgres errors as the
//! caller sees them; `user_types`: a new session learns the database's own types; `ask`: a
//! conversation about a statement, written once for both kinds of session.

pub(crate) mod analysis;
pub(crate) mod ask;
pub(crate) mod by_value;
pub(crate) mod deadline;
pub(crate) mod described;
pub(crate) mod failure;
pub(crate) mod identity;
pub(crate) mod loop_session;
pub(crate) mod own_sessions;
pub(crate) mod param_types;
pub(crate) mod roles;
pub(crate) mod schema;
pub(crate) mod top_n;
pub(crate) mod user_types;
pub(crate) mod verdicts;

use crate::config::Config;
use crate::error::ApiError;
use r2d2_postgres::PostgresConnectionManager;
use std::time::Duration;
use tokio_postgres_rustls::MakeRustlsConnect;

/// One pooled Postgres session. `poisoned` marks a session that must not be reused (its reset
/// failed, or a result was abandoned mid-stream): r2d2 then closes it instead of pooling it.
/// `prepared`: the `skip_reset` statements kept prepared on it, as on an event-loop session
/// (`pg_async`): closed at any other checkout (`Pools::pg_conn`) and with every reset.
pub(crate) struct PgSession {
    pub client: postgres::Client,
    pub poisoned: bool,
    pub prepared: crate::store::postgres::loop_session::Prepared,
    /// How to reach the server for a CancelRequest (`store::postgres::deadline`).
    pub tls: MakeRustlsConnect,
}

/// The r2d2 manager of Postgres sessions (one can be discarded by marking it poisoned); the
/// second field counts the connections it opens (`OwnSessions::opened`: new connections are
/// probed again).
pub(crate) struct PgManager(
    pub PostgresConnectionManager<MakeRustlsConnect>,
    pub std::sync::Arc<std::sync::atomic::AtomicU64>,
    MakeRustlsConnect,
);

impl std::fmt::Debug for PgManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The connection settings hold the password: never printed.
        f.write_str("PgManager")
    }
}

impl PgManager {
    /// Connections made with `config` and `tls`, each counted in `opened`.
    pub(crate) fn new(
        config: postgres::Config,
        tls: MakeRustlsConnect,
        opened: std::sync::Arc<std::sync::atomic::AtomicU64>,
    ) -> Self {
        PgManager(
            PostgresConnectionManager::new(config, tls.clone()),
            opened,
            tls,
        )
    }
}

impl r2d2::ManageConnection for PgManager {
    type Connection = PgSession;
    type Error = postgres::Error;

    fn connect(&self) -> Result<PgSession, postgres::Error> {
        let mut client = self.0.connect()?;
        user_types::learn(&mut client);
        self.1.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Ok(PgSession {
            client,
            poisoned: false,
            prepared: Default::default(),
            tls: self.2.clone(),
        })
    }

    fn is_valid(&self, conn: &mut PgSession) -> Result<(), postgres::Error> {
        self.0.is_valid(&mut conn.client)
    }

    fn has_broken(&self, conn: &mut PgSession) -> bool {
        conn.poisoned || conn.client.is_closed()
    }
}

/// libpq's sslmode=verify-ca / verify-full mean "require, and verify": rustls always verifies
/// the certificate and the host name, so both are `require` for the Rust driver.
pub(crate) fn pg_url(url: &str) -> String {
    url.replace("sslmode=verify-full", "sslmode=require")
        .replace("sslmode=verify-ca", "sslmode=require")
}

/// TLS for Postgres: rustls trusting `postgres.tls_ca_path` (PEM) or the system's roots.
/// Whether TLS is used is the URL's `sslmode` (disable / prefer / require); without one, a
/// loopback server is reached in the clear and any other with `prefer`.
pub(crate) fn pg_tls(c: &crate::config::PostgresConfig) -> Result<MakeRustlsConnect, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    if c.tls_ca_path.is_empty() {
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
    } else {
        let certs = CertificateDer::pem_file_iter(&c.tls_ca_path)
            .and_then(|i| i.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("postgres.tls_ca_path {}: {e}", c.tls_ca_path))?;
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| format!("postgres.tls_ca_path {}: {e}", c.tls_ca_path))?;
        }
    }
    crate::tls::install_crypto_provider();
    let tls = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(tls))
}

/// The login role a `postgres://` URL names (None: it names none, so libpq's default, the OS
/// user, would apply).
pub(crate) fn login_role(url: &str) -> Option<String> {
    pg_url(url)
        .parse::<postgres::Config>()
        .ok()?
        .get_user()
        .map(str::to_string)
}

/// Whether a host name is this machine: `localhost`, or an address in 127.0.0.0/8 or ::1,
/// decided on the parsed address (so `127.db.example.com` is not loopback).
pub(crate) fn is_loopback_host(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A session as `postgres.url`'s role, with the settings every session gets, for the checks
/// made before serving (`--check-config`, the startup log).
pub(crate) fn check_session(config: &Config) -> Result<postgres::Client, String> {
    let pg = pg_config(config).map_err(|e| e.to_string())?;
    let tls = pg_tls(&config.postgres)?;
    // Where it tried, as the operator wrote it (no password): a forgotten FERRY_DATABASE_URL
    // falls back to the config file's `postgres.url`, which may be another server.
    let hosts: Vec<String> = pg
        .get_hosts()
        .iter()
        .zip(pg.get_ports().iter().chain(std::iter::repeat(&5432)))
        .map(|(h, p)| match h {
            postgres::config::Host::Tcp(h) => format!("{h}:{p}"),
            postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    let user = pg.get_user().unwrap_or("?").to_string();
    pg.connect(tls).map_err(|e| {
        format!(
            "cannot connect to {} as {user} (postgres.url, FERRY_DATABASE_URL): {}",
            hosts.join(","),
            failure::describe(&e)
        )
    })
}

/// Problems with the database role the sidecar connects as: a superuser can read files and
/// run programs through SQL, and a role that bypasses row-level security ignores policies.
/// Connects once (blocking); Err when Postgres cannot be reached.
pub fn role_warnings(config: &Config) -> Result<Vec<String>, String> {
    let mut client = check_session(config)?;
    let row = client
        .query_one(
            "SELECT current_user::text, rolsuper, rolbypassrls FROM pg_roles \
             WHERE rolname = current_user",
            &[],
        )
        .map_err(|e| format!("cannot read the role: {e}"))?;
    let (who, superuser, bypassrls): (String, bool, bool) = (row.get(0), row.get(1), row.get(2));
    let mut out = Vec::new();
    if superuser {
        out.push(format!(
            "postgres.url connects as {who:?}, a superuser: SQL sent through Ferry could read \
             server files (pg_read_file) and run programs (COPY ... TO PROGRAM). Use a \
             least-privilege role (scripts/demo.sql creates ferry_app)."
        ));
    } else if bypassrls {
        out.push(format!(
            "postgres.url connects as {who:?}, which bypasses row-level security (BYPASSRLS): \
             policies will not apply to Ferry's queries."
        ));
    }
    for role in &config.identity.roles {
        let row = client
            .query_opt(
                "SELECT pg_has_role(current_user, oid, 'MEMBER'), rolsuper OR rolbypassrls \
                 FROM pg_roles WHERE rolname = $1",
                &[role],
            )
            .map_err(|e| format!("cannot read role {role:?}: {e}"))?;
        let problem = match row.map(|r| (r.get::<_, bool>(0), r.get::<_, bool>(1))) {
            None => "does not exist",
            Some((false, _)) => "is not granted to the login role (GRANT it TO the login role)",
            Some((_, true)) => "is a superuser or has BYPASSRLS (requests naming it are refused)",
            Some((true, false)) => continue,
        };
        out.push(format!(
            "identity.roles: {role:?} {problem}: requests with this role will fail"
        ));
    }
    Ok(out)
}

/// Settings Ferry's promises rest on, pinned for every session it opens. Options given at
/// connection start win over any a role or a database carries (`ALTER ROLE ... SET`, which a
/// request's SQL can run on its own role), and `DISCARD ALL` goes back to them, so no request
/// can change them for the next, nor for the sessions opened after a restart:
/// - `role=none`: every statement runs as the login role (a role default of `role =
///   'authenticated'` made every /v1 read fail with 42501);
/// - `synchronous_commit=on`: an acknowledged write is flushed (`off` loses the last ones in a
///   crash);
/// - `lock_timeout=0`: lock waits end at `statement_timeout` and the request deadline, not at
///   a value a caller chose (`1ms` failed every write that met a lock);
/// - isolation and deferrable defaults, `row_security`: what the code assumes when it asks for
///   nothing;
/// - `DateStyle`, `IntervalStyle`, `bytea_output`, `extra_float_digits`: the text `/sql`
///   answers (node-postgres parses it) and the JSON values `/v1` decodes (`-15` rounded every
///   float, in the cache too);
/// - `standard_conforming_strings=on`: a backslash in a literal is a backslash, as the SQL the
///   clients send assumes; and where one statement ends is decided once (`/sql` runs a text
///   its prepare found to be one statement as a simple query, later without the prepare:
///   `store::postgres::described`; with it off, `'a\' -- '; COMMIT; ...` is several).
///
/// The readiness probe reports role and database settings that appear all the same
/// (`store::readiness`).
pub(crate) const PINNED: &str = "-c role=none -c synchronous_commit=on -c lock_timeout=0 \
    -c default_transaction_isolation=read\\ committed -c default_transaction_deferrable=off \
    -c row_security=on -c DateStyle=ISO,\\ MDY -c IntervalStyle=postgres -c bytea_output=hex \
    -c extra_float_digits=1 -c standard_conforming_strings=on";

/// The Postgres connection settings, from the URL plus the sidecar's own settings.
pub(crate) fn pg_config(config: &Config) -> Result<postgres::Config, ApiError> {
    pg_async_config(config).map(postgres::Config::from)
}

/// The same settings for the async driver (the event-loop sessions of `pg_async`).
pub(crate) fn pg_async_config(config: &Config) -> Result<tokio_postgres::Config, ApiError> {
    let c = &config.postgres;
    let url = pg_url(&c.url);
    let mut pg: tokio_postgres::Config = url
        .parse()
        .map_err(|_| ApiError::internal("postgres.url is not a valid URL"))?;
    if !url.contains("sslmode=") {
        // Without an sslmode: loopback in the clear, anything else over verified TLS (never
        // libpq's `prefer`, which a man in the middle can downgrade to plain text).
        let loopback = pg.get_hosts().iter().all(|h| match h {
            tokio_postgres::config::Host::Tcp(name) => is_loopback_host(name),
            tokio_postgres::config::Host::Unix(_) => true,
        });
        pg.ssl_mode(if loopback {
            tokio_postgres::config::SslMode::Disable
        } else {
            tokio_postgres::config::SslMode::Require
        });
    }
    pg.connect_timeout(Duration::from_millis(c.connect_timeout_ms));
    // Lets operators (and the pool-bound test) tell Ferry's backends apart in pg_stat_activity.
    pg.application_name("ferry-sidecar");
    // Session defaults, restored by the reset after every request (RESET ALL goes back to
    // the values given at connection start). Transactions are read-only unless a write asks
    // otherwise, so a read cannot write; a session left in a transaction is ended by Postgres.
    // client_min_messages: callers never see notices, and the driver would log every one.
    let mut options = format!(
        "-c default_transaction_read_only=on -c client_min_messages=error \
         -c idle_in_transaction_session_timeout={} {PINNED}",
        config.server.request_timeout_ms.max(1000)
    );
    if c.statement_timeout_ms > 0 {
        options.push_str(&format!(" -c statement_timeout={}", c.statement_timeout_ms));
    }
    pg.options(&options);
    if let Some(password) = &c.password {
        pg.password(password.as_str());
    }
    Ok(pg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use postgres::config::SslMode;

    #[test]
    fn loopback_is_decided_on_the_address() {
        for host in ["localhost", "127.0.0.1", "127.3.2.1", "::1", "[::1]"] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "127.db.example.com",
            "127.0.0.1.nip.io",
            "db",
            "10.0.0.1",
            "::2",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn remote_postgres_without_sslmode_gets_verified_tls() {
        let mode = |url: &str| {
            let mut c = Config::default();
            c.postgres.url = url.into();
            pg_config(&c).expect("valid").get_ssl_mode()
        };
        assert_eq!(mode("postgres://u@127.0.0.1:5432/db"), SslMode::Disable);
        assert_eq!(mode("postgres://u@db.example.com/db"), SslMode::Require);
        assert_eq!(mode("postgres://u@127.db.example.com/db"), SslMode::Require);
        assert_eq!(
            mode("postgres://u@db.example.com/db?sslmode=disable"),
            SslMode::Disable
        );
        assert_eq!(
            mode("postgres://u@db.example.com/db?sslmode=verify-full"),
            SslMode::Require
        );
    }
}
