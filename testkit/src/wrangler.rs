//! The edge Worker in the real Workers runtime: `wrangler dev` (workerd) on a free port, with
//! its own wrangler.toml and .dev.vars in a temp dir so tests can point it anywhere.

use super::{free_port, wait_until};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct WranglerDev {
    pub port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

impl WranglerDev {
    /// Starts the built Worker (edge/demo/build/, from scripts/build-edge.sh) with these bindings.
    pub fn start(sidecar_url: &str, secret: &str, timeout_ms: u64) -> WranglerDev {
        Self::start_with_vars(sidecar_url, secret, timeout_ms, &[])
    }

    /// The same, with more vars (`FERRY_JWKS_URL`...).
    pub fn start_with_vars(
        sidecar_url: &str,
        secret: &str,
        timeout_ms: u64,
        extra: &[(&str, &str)],
    ) -> WranglerDev {
        let root = repo_root();
        let main = root.join("edge/demo/build/index.js");
        assert!(
            main.is_file(),
            "{} is missing: build the edge first with scripts/build-edge.sh \
             (scripts/test.sh does it)",
            main.display()
        );
        let timeout = timeout_ms.to_string();
        let mut vars = vec![
            ("FERRY_SIDECAR_URL", sidecar_url),
            ("FERRY_TIMEOUT_MS", timeout.as_str()),
        ];
        vars.extend_from_slice(extra);
        Self::start_worker(
            &main,
            &vars,
            &[
                ("FERRY_SECRET", secret),
                ("FERRY_API_KEY", super::API_KEY),
                ("FERRY_JWT_SECRET", super::JWT_SECRET),
            ],
            None,
        )
    }

    /// Starts any Worker script (`main`) with these vars and secrets; `node_modules`, when
    /// given, is where wrangler's bundler finds the script's npm imports.
    pub fn start_worker(
        main: &Path,
        vars: &[(&str, &str)],
        secrets: &[(&str, &str)],
        node_modules: Option<&Path>,
    ) -> WranglerDev {
        let root = repo_root();
        let dir = tempfile::tempdir().expect("tempdir for wrangler");
        let main = match node_modules {
            // The script next to the modules, so its imports resolve there.
            Some(modules) => {
                std::os::unix::fs::symlink(modules, dir.path().join("node_modules"))
                    .expect("link node_modules");
                let copy = dir.path().join("worker.js");
                std::fs::copy(main, &copy).expect("copy the worker script");
                copy
            }
            None => main.to_path_buf(),
        };
        let mut toml = format!(
            "name = \"ferry-test-worker\"\nmain = {main:?}\ncompatibility_date = \"2026-04-01\"\n[vars]\n",
            main = main.display().to_string()
        );
        for (k, v) in vars {
            toml.push_str(&format!("{k} = {v:?}\n"));
        }
        std::fs::write(dir.path().join("wrangler.toml"), toml).expect("write wrangler.toml");
        let dev_vars: String = secrets.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
        std::fs::write(dir.path().join(".dev.vars"), dev_vars).expect("write .dev.vars");
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("wrangler.log")).expect("log file");
        let child = Command::new("bash")
            .arg(root.join("scripts/wrangler.sh"))
            .args(["dev", "--local", "--ip", "127.0.0.1"])
            .args(["--port", &port.to_string()])
            .args(["--inspector-port", &free_port().to_string()])
            .args(["--show-interactive-dev-session=false"])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start wrangler dev (scripts/wrangler.sh)");
        let mut w = WranglerDev {
            port,
            child: Some(child),
            dir,
        };
        let url = w.url();
        let log_path = w.dir.path().join("wrangler.log");
        let mut exited = false;
        wait_until("wrangler dev to serve", Duration::from_secs(90), || {
            if let Some(c) = w.child.as_mut() {
                if matches!(c.try_wait(), Ok(Some(_))) {
                    exited = true;
                    return true;
                }
            }
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() && probe::answers(&url)
        });
        assert!(
            !exited,
            "wrangler dev exited:\n{}",
            std::fs::read_to_string(&log_path).unwrap_or_default()
        );
        w
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("wrangler.log")).unwrap_or_default()
    }
}

/// A tiny readiness probe without an async runtime: any HTTP answer means workerd serves.
mod probe {
    use std::io::{Read, Write};
    pub fn answers(url: &str) -> bool {
        let Some(addr) = url.strip_prefix("http://") else {
            return false;
        };
        let Ok(mut s) = std::net::TcpStream::connect(addr) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
        let req = format!("GET /__probe HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        if s.write_all(req.as_bytes()).is_err() {
            return false;
        }
        let mut buf = [0u8; 12];
        s.read_exact(&mut buf).is_ok() && buf.starts_with(b"HTTP/1.1")
    }
}

impl Drop for WranglerDev {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SIGINT: wrangler stops its workerd children itself.
            let _ = Command::new("kill")
                .args(["-INT", &c.id().to_string()])
                .status();
            for _ in 0..100 {
                if matches!(c.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
