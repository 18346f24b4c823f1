//! The `gomux-tunnel` binary run as a process by the tests that drive it as people run it
//! (`binary.rs`, `attack.rs`, `outage.rs`, `pipes.rs`): scratch directories for keys and
//! files, an end whose printed addresses and log are kept, and an echo target.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gomux_tunnel::Identity;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};

use crate::common::{within, STEP};

/// The binary under test.
pub const BINARY: &str = env!("CARGO_BIN_EXE_gomux-tunnel");

/// A scratch directory for keys and files, removed when dropped.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "gomux-tunnel-{name}-{}-{:?}",
            std::process::id(),
            Instant::now()
        ));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        Scratch(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// A key pair saved in `name`, as keygen writes it.
    pub fn identity(&self, name: &str) -> (Identity, PathBuf) {
        let identity = Identity::generate().expect("a key pair");
        let dir = self.path(name);
        identity.save(&dir).expect("save the key");
        (identity, dir)
    }

    /// A password file readable by its owner only.
    pub fn password(&self, password: &str) -> PathBuf {
        let path = self.path("password");
        std::fs::write(&path, format!("{password}\n")).expect("password file");
        private(&path);
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Makes a file readable by its owner only, as the tool asks of a password file.
pub fn private(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
}

/// A path as an argument.
pub fn text(path: &Path) -> &str {
    path.to_str().expect("a path")
}

/// One end of the tunnel running as a process, killed when dropped, its standard error kept.
pub struct End {
    pub child: Child,
    log: Arc<Mutex<String>>,
    /// The addresses it printed, by listener name.
    listening: Vec<(String, SocketAddr)>,
}

impl End {
    /// Starts the binary with `args` (`RUST_LOG=info`) and waits until it has printed
    /// `listeners` addresses.
    pub async fn start(args: &[&str], listeners: usize) -> End {
        End::start_logging(args, listeners, "info").await
    }

    /// As [`End::start`], with `RUST_LOG` set to `filter`.
    pub async fn start_logging(args: &[&str], listeners: usize, filter: &str) -> End {
        let mut child = Command::new(BINARY)
            .args(args)
            .env("RUST_LOG", filter)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start gomux-tunnel");
        let log = Arc::new(Mutex::new(String::new()));
        let mut stderr = BufReader::new(child.stderr.take().expect("stderr")).lines();
        {
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                while let Ok(Some(line)) = stderr.next_line().await {
                    let mut log = log.lock().expect("not poisoned");
                    log.push_str(&line);
                    log.push('\n');
                }
            });
        }
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut listening = Vec::new();
        while listening.len() < listeners {
            let line = within("the bound address", stdout.next_line())
                .await
                .expect("read stdout")
                .unwrap_or_else(|| panic!("no address printed; log:\n{}", log.lock().unwrap()));
            let mut words = line.split_whitespace();
            if words.next() == Some("listening") {
                let name = words.next().expect("a name").to_owned();
                let addr = words.next().expect("an address").parse().expect("address");
                listening.push((name, addr));
            }
        }
        End {
            child,
            log,
            listening,
        }
    }

    pub fn addr(&self, name: &str) -> SocketAddr {
        self.listening
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, addr)| addr)
            .unwrap_or_else(|| panic!("no {name} listener"))
    }

    pub fn log(&self) -> String {
        self.log.lock().expect("not poisoned").clone()
    }

    /// Waits until a log line contains every one of `texts`, then checks that exactly one
    /// does (with `once`) or at least one.
    pub async fn await_log(&self, texts: &[&str], once: bool) {
        let found = |log: &str| {
            log.lines()
                .filter(|line| texts.iter().all(|text| line.contains(text)))
                .count()
        };
        let outcome = tokio::time::timeout(STEP, async {
            while found(&self.log()) == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        let log = self.log();
        let lines = found(&log);
        assert!(
            outcome.is_ok() && (lines == 1 || !once && lines > 1),
            "want {} line with {texts:?}, found {lines}; log:\n{log}",
            if once { "one" } else { "at least one" },
        );
    }

    /// The peak resident set of the process, from /proc, in KiB.
    pub fn peak_resident_kib(&self) -> u64 {
        let pid = self.child.id().expect("running");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM")
    }
}

/// An echo server on a loopback port.
pub async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut reader, mut writer) = socket.split();
                let _ = tokio::io::copy(&mut reader, &mut writer).await;
                let _ = tokio::io::AsyncWriteExt::shutdown(&mut writer).await;
            });
        }
    });
    addr
}
