//! Recording a real execution with qemu-user.
//!
//! The program runs under `qemu-x86_64 -singlestep -d exec,nochain,in_asm`
//! with the log going to a pipe that is parsed while qemu runs, so nothing
//! big is ever written to disk and a long program can be cut off after
//! [`Limits::max_instructions`] (qemu is then killed). qemu is handed the
//! pipe's write end as a file descriptor and opens it by name
//! (`-D /dev/fd/N`): nothing is made in the file system, so nothing is left
//! behind when the recorder is killed (a named FIFO in a temporary
//! directory was, by a SIGKILL). The recorder keeps a write end too: when
//! qemu has exited, it writes an end marker into the pipe, so the parser
//! knows that every byte qemu wrote has been read.
//!
//! With [`QemuRecorder::log_mappings`], qemu also logs `-d page,strace`
//! (its guest memory map after the program is loaded, and every system
//! call with its result); those lines are kept, unparsed, in
//! [`Recording::mapping_log`] for whoever needs to know where files were
//! mapped.

use std::ffi::OsStr;
use std::io::{BufReader, PipeReader, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::execution::{Execution, Limits, LogError, LogErrorKind, Parsed, parse_log};

/// The line the recorder appends once qemu has exited; qemu never writes a
/// NUL byte into its log.
const END_MARKER: &[u8] = b"\0hwtrace-sim: end of qemu log";

/// Why a recording failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// The pipe for the qemu log could not be made.
    #[error("cannot create a pipe for the qemu log")]
    Pipe(#[source] std::io::Error),
    /// qemu could not be started.
    #[error("cannot start {qemu}")]
    Spawn {
        /// The qemu binary.
        qemu: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// qemu ran but logged no instruction (the program could not be
    /// loaded, say).
    #[error("qemu logged no instruction ({status}); its stderr: {stderr}")]
    Qemu {
        /// How qemu ended.
        status: ExitStatus,
        /// What qemu printed.
        stderr: String,
    },
    /// The log did not parse.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The program ran longer than [`Limits::timeout`].
    #[error("the program ran longer than {0:?}; it was killed")]
    Timeout(Duration),
    /// Waiting for or talking to qemu failed.
    #[error("i/o with qemu failed")]
    Io(#[from] std::io::Error),
}

/// How a recorded program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordEnd {
    /// The program ran to its end; qemu exited with this status.
    Exited(ExitStatus),
    /// [`Limits::max_instructions`] was reached and qemu was killed.
    Limit,
}

/// A recorded run: the execution, how it ended, and what the program wrote.
#[derive(Debug, Clone)]
pub struct Recording {
    /// The executed instructions and their code.
    pub execution: Execution,
    /// How the run ended.
    pub end: RecordEnd,
    /// What the program wrote to stdout.
    pub stdout: Vec<u8>,
    /// What the program (and qemu) wrote to stderr.
    pub stderr: Vec<u8>,
    /// qemu's `-d page,strace` lines, in order, when
    /// [`QemuRecorder::log_mappings`] asked for them (empty otherwise).
    pub mapping_log: Vec<String>,
}

/// Runs programs under qemu-user and records what they execute.
#[derive(Debug, Clone)]
pub struct QemuRecorder {
    qemu: PathBuf,
    limits: Limits,
    mappings: bool,
}

impl Default for QemuRecorder {
    fn default() -> Self {
        QemuRecorder {
            qemu: PathBuf::from("qemu-x86_64"),
            limits: Limits::default(),
            mappings: false,
        }
    }
}

impl QemuRecorder {
    /// A recorder using `qemu-x86_64` from `PATH` and no limits.
    pub fn new() -> Self {
        Self::default()
    }

    /// Use this qemu binary.
    pub fn qemu(mut self, path: impl Into<PathBuf>) -> Self {
        self.qemu = path.into();
        self
    }

    /// Stop at these limits.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Also log the guest's memory map and system calls (`-d page,strace`)
    /// into [`Recording::mapping_log`].
    pub fn log_mappings(mut self, on: bool) -> Self {
        self.mappings = on;
        self
    }

    /// Runs `program` with `args` (stdin empty) and records its execution.
    pub fn record<S: AsRef<OsStr>>(
        &self,
        program: impl AsRef<OsStr>,
        args: &[S],
    ) -> Result<Recording, RecordError> {
        // Both ends close on exec: qemu gets the write end alone, kept
        // open across its exec by `hand_down`.
        let (reader, mut marker_writer) = std::io::pipe().map_err(RecordError::Pipe)?;
        let log_fd = marker_writer.as_raw_fd();

        let mut cmd = Command::new(&self.qemu);
        cmd.arg("-singlestep")
            .arg("-d")
            .arg(if self.mappings {
                "exec,nochain,in_asm,page,strace"
            } else {
                "exec,nochain,in_asm"
            })
            .arg("-D")
            .arg(format!("/dev/fd/{log_fd}"))
            .arg(program.as_ref())
            .args(args.iter().map(|a| a.as_ref().to_os_string()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        hand_down(&mut cmd, log_fd);
        die_with_parent(&mut cmd);
        let mut child = cmd.spawn().map_err(|source| RecordError::Spawn {
            qemu: self.qemu.clone(),
            source,
        })?;
        let stdout = drain(child.stdout.take());
        let stderr = drain(child.stderr.take());

        let limits = self.limits;
        let keep = self.mappings;
        let done = Arc::new(AtomicBool::new(false));
        let parser = {
            let done = Arc::clone(&done);
            std::thread::spawn(move || parse_until_marker(reader, &limits, &done, keep))
        };

        let started = Instant::now();
        let mut killed = false;
        let mut timed_out = false;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            let over_time = limits.timeout.is_some_and(|t| started.elapsed() > t);
            if (done.load(Ordering::Acquire) || over_time) && !killed {
                // The parser has what it needs (or gave up): stop qemu.
                timed_out = over_time && !done.load(Ordering::Acquire);
                kill(&mut child)?;
                killed = true;
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        // qemu is gone: everything it wrote precedes the marker. A killed
        // qemu may have left half a line; the newline first ends it, so the
        // marker always stands on a line of its own (without it the parser
        // never saw the marker and waited on the pipe forever).
        marker_writer.write_all(b"\n")?;
        marker_writer.write_all(END_MARKER)?;
        marker_writer.write_all(b"\n")?;
        let (parsed, mapping_log) = parser
            .join()
            .map_err(|_| std::io::Error::other("the log parser thread panicked"))?;
        let stdout = join_output(stdout);
        let stderr = join_output(stderr);
        if timed_out {
            return Err(RecordError::Timeout(limits.timeout.unwrap_or_default()));
        }
        let Parsed { execution, limited } = match parsed {
            Ok(v) => v,
            Err(LogError {
                kind: LogErrorKind::Empty,
                ..
            }) => {
                return Err(RecordError::Qemu {
                    status,
                    stderr: String::from_utf8_lossy(&stderr).into_owned(),
                });
            }
            Err(e) => return Err(e.into()),
        };
        let end = if limited {
            RecordEnd::Limit
        } else {
            RecordEnd::Exited(status)
        };
        Ok(Recording {
            execution,
            end,
            stdout,
            stderr,
            mapping_log,
        })
    }
}

impl Execution {
    /// Records `program` with `args` under `qemu-x86_64` from `PATH`
    /// (see [`QemuRecorder`]).
    pub fn record_qemu<S: AsRef<OsStr>>(
        program: impl AsRef<OsStr>,
        args: &[S],
        limits: Limits,
    ) -> Result<Recording, RecordError> {
        QemuRecorder::new().limits(limits).record(program, args)
    }
}

/// Parses the log pipe up to the end marker. Once the limit is reached (or
/// the log turned out bad) `done` is raised so that qemu gets killed, but
/// the pipe is still drained to the marker, so qemu never blocks on a full pipe
/// and the marker write never blocks either. With `keep`, the lines of
/// other `-d` items (but not `in_asm`'s separators and blank lines) are
/// returned too.
fn parse_until_marker(
    log: PipeReader,
    limits: &Limits,
    done: &AtomicBool,
    keep: bool,
) -> (Result<Parsed, LogError>, Vec<String>) {
    let mut reader = BufReader::with_capacity(1 << 20, log);
    let mut at_marker = false;
    let mut kept = Vec::new();
    let mut other = |raw: &[u8]| {
        if keep && !raw.is_empty() && !raw.starts_with(b"----") {
            kept.push(String::from_utf8_lossy(raw).into_owned());
        }
    };
    let result = parse_log(
        &mut reader,
        limits,
        Some(END_MARKER),
        &mut at_marker,
        &mut other,
    );
    done.store(true, Ordering::Release);
    let mut line = Vec::new();
    while !at_marker {
        line.clear();
        match std::io::BufRead::read_until(&mut reader, b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                at_marker = line
                    .strip_suffix(b"\n")
                    .unwrap_or(&line)
                    .ends_with(END_MARKER)
            }
        }
    }
    (result, kept)
}

/// Makes the process `cmd` starts be killed when this one ends, however
/// it ends. qemu-user hands signals (SIGTERM, SIGPIPE...) to the guest, and a
/// recorder killed by a signal runs no destructor, so qemu outlived it:
/// one left single-stepping `xz` at 70% of a core for half an hour,
/// writing to a pipe nobody read.
#[cfg(target_os = "linux")]
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    // SAFETY: the closure runs in the child between fork and exec, where
    // only async-signal-safe calls are sound: it makes two system calls
    // (prctl, getppid) and `_exit`, reads errno, and neither allocates nor
    // takes a lock. The signal is sent when the thread that forks exits;
    // `record` waits for qemu on that thread.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The recorder died before the signal was asked for.
            if u32::try_from(libc::getppid()) != Ok(parent) {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_: &mut Command) {}

/// Keeps file descriptor `fd` (the log pipe's write end, close-on-exec in
/// the recorder, so no other child inherits it) open in the child across
/// its exec.
fn hand_down(cmd: &mut Command, fd: RawFd) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec, where
    // only async-signal-safe calls are sound: one fcntl system call, errno
    // read, no allocation, no lock.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn kill(child: &mut Child) -> std::io::Result<()> {
    match child.kill() {
        Ok(()) => Ok(()),
        // It exited on its own in the meantime.
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => Ok(()),
        Err(e) => Err(e),
    }
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> Option<JoinHandle<Vec<u8>>> {
    pipe.map(|mut p| {
        std::thread::spawn(move || {
            let mut out = Vec::new();
            // A read error just ends the capture; the program's output is
            // informational.
            let _ = p.read_to_end(&mut out);
            out
        })
    })
}

fn join_output(handle: Option<JoinHandle<Vec<u8>>>) -> Vec<u8> {
    handle.and_then(|h| h.join().ok()).unwrap_or_default()
}
