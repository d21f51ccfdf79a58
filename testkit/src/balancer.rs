//! nginx in front of several sidecars, configured from `deploy/nginx/ferry-balancer.conf` (the
//! dev command's balancer), on a free port; killed on drop.

use super::{find_program, free_port, wait_until};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct Balancer {
    pub port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Balancer {
    /// Starts nginx over the sidecars listening on `upstreams` (ports on 127.0.0.1).
    pub fn start(upstreams: &[u16]) -> Balancer {
        let bin = find_program(
            "nginx",
            &["/usr/sbin".into()],
            "Install nginx: apt-get install nginx-light.",
        );
        let dir = tempfile::tempdir().expect("tempdir for nginx");
        let port = free_port();
        let template = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/nginx/ferry-balancer.conf"),
        )
        .expect("read deploy/nginx/ferry-balancer.conf");
        let servers: String = upstreams
            .iter()
            .map(|p| format!("    server 127.0.0.1:{p} max_fails=1 fail_timeout=2s;\n"))
            .collect();
        let conf = template
            .replace("@DIR@", &dir.path().display().to_string())
            .replace("@LISTEN@", &format!("127.0.0.1:{port}"))
            .replace("@UPSTREAMS@", &servers);
        let conf_path = dir.path().join("nginx.conf");
        std::fs::write(&conf_path, conf).expect("write nginx.conf");
        let child = Command::new(bin)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf_path)
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nginx");
        wait_until("nginx to listen", Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        Balancer {
            port,
            child,
            _dir: dir,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        // SIGTERM: the master stops its workers (SIGKILL would leave them serving the port).
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
