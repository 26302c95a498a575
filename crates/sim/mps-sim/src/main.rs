//! `gpuops-mps-control-sim`: the simulator's `nvidia-cuda-mps-control`. `-d` starts the daemon in
//! the background and returns once it answers, `-f` runs it in the foreground, no argument
//! sends the commands read on stdin to the daemon and prints its answers. The pipe and log
//! directories come from `CUDA_MPS_PIPE_DIRECTORY` and `CUDA_MPS_LOG_DIRECTORY`.

use gpuops_mps_sim::{
    DEFAULT_LOG_DIR, DEFAULT_PIPE_DIR, ERROR_PREFIX, LOG_FILE, Reply, SOCKET, Settings,
};
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The real daemon's PID file name, in its pipe directory.
/// A stand-in program's failure: the message it prints before exiting non-zero.
type Failure = Box<dyn std::error::Error>;

const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
/// How long `-d` waits for the background daemon to answer.
const READY_WITHIN: Duration = Duration::from_secs(10);
/// A client that connects and never sends must not block the daemon for good.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

fn dir(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from)
}

fn main() -> ExitCode {
    let pipe = dir("CUDA_MPS_PIPE_DIRECTORY", DEFAULT_PIPE_DIR);
    let log = dir("CUDA_MPS_LOG_DIRECTORY", DEFAULT_LOG_DIR);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] => client(&pipe),
        ["-d"] => background(&pipe),
        ["-f"] => foreground(&pipe, &log),
        _ => Err(Failure::from(format!("usage: {} [-d | -f]", env_name()))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn env_name() -> String {
    std::env::args()
        .next()
        .unwrap_or_else(|| "gpuops-mps-control-sim".into())
}

fn client(pipe: &Path) -> Result<(), Failure> {
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .map_err(|e| format!("reading the command: {e}"))?;
    for line in input.lines().filter(|l| !l.trim().is_empty()) {
        let answer = ask(pipe, line)?;
        if let Some(why) = answer.strip_prefix(ERROR_PREFIX) {
            return Err(why.into());
        }
        if !answer.is_empty() {
            println!("{answer}");
        }
    }
    Ok(())
}

fn ask(pipe: &Path, line: &str) -> Result<String, Failure> {
    let socket = pipe.join(SOCKET);
    let mut stream = UnixStream::connect(&socket).map_err(|e| {
        format!(
            "cannot reach the MPS control daemon at {}: {e}",
            socket.display()
        )
    })?;
    let io = |e: std::io::Error| format!("talking to the MPS control daemon: {e}");
    stream.write_all(line.trim().as_bytes()).map_err(io)?;
    stream.shutdown(std::net::Shutdown::Write).map_err(io)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).map_err(io)?;
    Ok(answer)
}

/// `-d`: the daemon runs on in its own process group (so the caller's signals and exit do not
/// reach it) and this returns once it answers, as the real `-d` returns with the daemon up.
fn background(pipe: &Path) -> Result<(), Failure> {
    let exe = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    let mut child = Command::new(exe)
        .arg("-f")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("starting the daemon: {e}"))?;
    let socket = pipe.join(SOCKET);
    let start = Instant::now();
    while start.elapsed() < READY_WITHIN {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(Failure::from(format!(
                "the daemon exited with {status} (see {LOG_FILE} in the log directory)"
            )));
        }
        if UnixStream::connect(&socket).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(Failure::from(format!(
        "the daemon did not answer within {READY_WITHIN:?}"
    )))
}

struct Log(Option<std::fs::File>);

impl Log {
    fn line(&mut self, text: &str) {
        if let Some(f) = &mut self.0 {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            // A full disk must not stop the daemon.
            let _ = writeln!(f, "[{now}] {text}");
        }
    }
}

fn foreground(pipe: &Path, log_dir: &Path) -> Result<(), Failure> {
    for d in [pipe, log_dir] {
        std::fs::create_dir_all(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
    }
    let mut log = Log(std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_dir.join(LOG_FILE))
        .ok());
    let socket = pipe.join(SOCKET);
    if socket.exists() {
        if UnixStream::connect(&socket).is_ok() {
            let msg = format!(
                "another MPS control daemon already serves {}",
                pipe.display()
            );
            log.line(&msg);
            return Err(msg.into());
        }
        // Left by a daemon that was killed: nobody answers on it.
        let _ = std::fs::remove_file(&socket);
    }
    let listener =
        UnixListener::bind(&socket).map_err(|e| format!("binding {}: {e}", socket.display()))?;
    let pid_file = pipe.join(PID_FILE);
    std::fs::write(&pid_file, format!("{}\n", std::process::id()))
        .map_err(|e| format!("writing {}: {e}", pid_file.display()))?;
    log.line(&format!(
        "startup pid={} CUDA_VISIBLE_DEVICES={}",
        std::process::id(),
        std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default()
    ));
    let mut settings = Settings::default();
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let _ = stream.set_read_timeout(Some(CLIENT_TIMEOUT));
        let mut line = String::new();
        if stream.read_to_string(&mut line).is_err() {
            continue;
        }
        let reply = settings.apply(&line);
        log.line(&format!("{} -> {:?}", line.trim(), reply.wire()));
        let _ = stream.write_all(reply.wire().as_bytes());
        drop(stream);
        if reply == Reply::Quit {
            break;
        }
    }
    let _ = std::fs::remove_file(&socket);
    let _ = std::fs::remove_file(&pid_file);
    log.line("exit");
    Ok(())
}
