//! Per-program output kept in memory: a ring buffer of lines (stdout and stderr together) that
//! `talosctl logs` tails, and a broadcast that `logs -f` follows. Nothing is written to disk.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use tokio::io::AsyncBufReadExt;
use tokio::sync::broadcast;

/// Lines kept per program.
pub const MAX_LINES: usize = 2000;
/// Bytes kept per program (lines beyond are dropped oldest first).
pub const MAX_BYTES: usize = 512 * 1024;
/// Longest line kept; longer ones are cut.
pub const MAX_LINE: usize = 8 * 1024;

/// One line and its sequence number (to join a tail and a follow without gaps or repeats).
#[derive(Clone, Debug)]
pub struct Line {
    /// Increases by one per line of this buffer.
    pub seq: u64,
    /// The text, without the newline.
    pub text: Arc<[u8]>,
}

struct Ring {
    lines: VecDeque<Line>,
    bytes: usize,
    next: u64,
}

/// The output of one program across its restarts.
pub struct LogBuffer {
    ring: Mutex<Ring>,
    tx: broadcast::Sender<Line>,
}

impl Default for LogBuffer {
    fn default() -> Self {
        LogBuffer::new()
    }
}

impl LogBuffer {
    /// An empty buffer.
    pub fn new() -> LogBuffer {
        LogBuffer {
            ring: Mutex::new(Ring {
                lines: VecDeque::new(),
                bytes: 0,
                next: 0,
            }),
            tx: broadcast::channel(256).0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends a line.
    pub fn push(&self, text: &[u8]) {
        let text: Arc<[u8]> = Arc::from(&text[..text.len().min(MAX_LINE)]);
        let mut ring = self.lock();
        let line = Line {
            seq: ring.next,
            text,
        };
        ring.next += 1;
        ring.bytes += line.text.len();
        ring.lines.push_back(line.clone());
        while ring.lines.len() > MAX_LINES || ring.bytes > MAX_BYTES {
            if let Some(old) = ring.lines.pop_front() {
                ring.bytes -= old.text.len();
            }
        }
        let _ = self.tx.send(line);
    }

    /// The last `n` lines (all kept for `None`), oldest first.
    pub fn tail(&self, n: Option<usize>) -> Vec<Line> {
        let ring = self.lock();
        let skip = n.map_or(0, |n| ring.lines.len().saturating_sub(n));
        ring.lines.iter().skip(skip).cloned().collect()
    }

    /// The sequence number the next line will get (to tell one run's lines from earlier ones).
    pub fn next_seq(&self) -> u64 {
        self.lock().next
    }

    /// The newest lines from sequence number `seq` on, joined by newlines, at most `max` bytes:
    /// whole lines (invalid UTF-8 replaced), except a newest line longer than `max` alone, which
    /// is cut to its last `max` bytes (at a character boundary). A one-shot service's
    /// `ServiceStatus` output.
    pub fn text_since(&self, seq: u64, max: usize) -> String {
        let ring = self.lock();
        let mut kept: Vec<String> = Vec::new();
        let mut bytes = 0;
        for line in ring.lines.iter().rev().take_while(|l| l.seq >= seq) {
            let text = String::from_utf8_lossy(&line.text).into_owned();
            let need = text.len() + usize::from(!kept.is_empty());
            if bytes + need > max {
                if kept.is_empty() {
                    let mut cut = text.len() - max;
                    while !text.is_char_boundary(cut) {
                        cut += 1;
                    }
                    kept.push(text[cut..].to_string());
                }
                break;
            }
            bytes += need;
            kept.push(text);
        }
        kept.reverse();
        kept.join("\n")
    }

    /// New lines from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Line> {
        self.tx.subscribe()
    }

    /// Reads `fd` (the read end of the program's stdout/stderr pipe) line by line into the
    /// buffer until every writer closed it.
    pub async fn collect(self: Arc<Self>, fd: OwnedFd, program: String) {
        let pipe = match tokio::net::unix::pipe::Receiver::from_owned_fd(fd) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(program, error = %e, "cannot read the output pipe");
                return;
            }
        };
        let mut reader = tokio::io::BufReader::new(pipe);
        let mut buf = Vec::with_capacity(256);
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                        buf.pop();
                    }
                    tracing::debug!(target: "init::output", program, "{}", String::from_utf8_lossy(&buf));
                    self.push(&buf);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_lines_within_bounds() {
        let b = LogBuffer::new();
        for i in 0..(MAX_LINES + 10) {
            b.push(format!("line {i}").as_bytes());
        }
        let all = b.tail(None);
        assert_eq!(all.len(), MAX_LINES);
        assert_eq!(&*all[0].text, b"line 10");
        let last = b.tail(Some(2));
        assert_eq!(last.len(), 2);
        assert_eq!(last[1].seq, (MAX_LINES + 9) as u64);
        b.push(&vec![b'x'; MAX_LINE * 2]);
        assert_eq!(b.tail(Some(1))[0].text.len(), MAX_LINE);
    }

    #[test]
    fn the_text_of_a_run_is_its_newest_whole_lines_within_the_bound() {
        let b = LogBuffer::new();
        b.push(b"an earlier run");
        let start = b.next_seq();
        assert_eq!(b.text_since(start, 4096), "");
        b.push(b"DEVNAME=/dev/vda");
        b.push(b"PTTYPE=gpt");
        assert_eq!(b.text_since(start, 4096), "DEVNAME=/dev/vda\nPTTYPE=gpt");
        // 10 bytes: "PTTYPE=gpt" fits, the line before it with its newline does not.
        assert_eq!(b.text_since(start, 20), "PTTYPE=gpt");
        assert_eq!(b.text_since(start, 27), "DEVNAME=/dev/vda\nPTTYPE=gpt");
        // A newest line longer than the bound alone: its end, cut at a character boundary.
        b.push("é".repeat(10).as_bytes());
        assert_eq!(b.text_since(start, 5), "éé");
    }
}
