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
    /// Starts the built Worker (edge/build/, from scripts/build-edge.sh) with these bindings.
    pub fn start(sidecar_url: &str, secret: &str, timeout_ms: u64) -> WranglerDev {
        let root = repo_root();
        let main = root.join("edge/build/index.js");
        assert!(
            main.is_file(),
            "{} is missing: build the edge first with scripts/build-edge.sh \
             (scripts/test.sh does it)",
            main.display()
        );
        let dir = tempfile::tempdir().expect("tempdir for wrangler");
        std::fs::write(
            dir.path().join("wrangler.toml"),
            format!(
                "name = \"ferry-edge-test\"\nmain = {main:?}\ncompatibility_date = \"2026-04-01\"\n\
                 [vars]\nFERRY_SIDECAR_URL = {sidecar_url:?}\nFERRY_TIMEOUT_MS = \"{timeout_ms}\"\n",
                main = main.display().to_string()
            ),
        )
        .expect("write wrangler.toml");
        std::fs::write(
            dir.path().join(".dev.vars"),
            format!("FERRY_SECRET={secret}\nFERRY_API_KEY={}\n", super::API_KEY),
        )
        .expect("write .dev.vars");
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
