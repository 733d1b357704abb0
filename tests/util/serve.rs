//! `saguaro serve` started as a child process for the tests that talk to it.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// `saguaro serve` on the SmolLM2 target (1 thread, exact precision), killed when dropped.
pub struct Serve {
    child: Child,
    pub url: String,
}

impl Serve {
    pub fn start(extra: &[&str]) -> Serve {
        Serve::start_at("127.0.0.1:0", extra)
    }

    pub fn start_at(listen: &str, extra: &[&str]) -> Serve {
        let model = super::root().join(format!("models/{}.gguf", super::SMOLLM2));
        assert!(model.exists(), "{} is missing: run scripts/fetch-models.sh first", model.display());
        let mut child = Command::new(env!("CARGO_BIN_EXE_saguaro"))
            .arg("serve")
            .arg("--target")
            .arg(&model)
            .args(["--threads", "1", "--listen", listen])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the saguaro binary runs");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(120)).expect("saguaro serve starts within 2 minutes");
        let url = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("unexpected first line: {line:?}"));
        Serve { url: url.to_string(), child }
    }

    pub fn port(&self) -> u16 {
        self.url.rsplit(':').next().and_then(|p| p.parse().ok()).expect("a port in the url")
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

