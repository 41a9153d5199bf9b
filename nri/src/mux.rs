//! The NRI connection multiplexer: one unix connection to the runtime (the
//! *trunk*) carries several logical connections, each a byte stream of its
//! own. This is the wire format of containerd/nri `pkg/net/multiplex`:
//!
//! ```text
//! +----------------+----------------+----------------------+
//! | conn id (u32)  | length (u32)   | payload (length B)   |
//! | big endian     | big endian     |                      |
//! +----------------+----------------+----------------------+
//! ```
//!
//! Connection 0 is reserved; NRI uses 1 for the plugin's service (the
//! runtime calls the plugin) and 2 for the runtime's service (the plugin
//! calls the runtime). Opening a connection is local: no frame announces it,
//! both ends simply agree on the ids. Frames for a connection nobody opened
//! are dropped, as the Go side does.
//!
//! Frames need not line up with the ttrpc messages they carry: a reader
//! sees one byte stream per connection. Frames we write are at most
//! [`WRITE_CHUNK`] bytes of payload: the Go side hands each frame to one
//! `Read` of its ttrpc reader, whose buffer is 4 KiB, and a larger frame
//! there fails with `ENOMEM`.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// A logical connection's id within the trunk.
pub type ConnId = u32;

/// The connection of the plugin's service (the runtime is the client).
pub const PLUGIN_SERVICE_CONN: ConnId = 1;
/// The connection of the runtime's service (the plugin is the client).
pub const RUNTIME_SERVICE_CONN: ConnId = 2;
/// Frame header: connection id and payload length.
pub const HEADER_LEN: usize = 8;
/// The largest payload a frame may carry: one ttrpc header (10 bytes) and
/// the largest ttrpc message (4 MiB), as `pkg/net/multiplex` bounds it.
pub const MAX_PAYLOAD: usize = 10 + (4 << 20);
/// The largest payload of a frame this side writes (see the module docs).
pub const WRITE_CHUNK: usize = 4096;
/// Frames queued for one connection before the trunk is given up (the Go
/// side's read queue length).
pub const READ_QUEUE_LEN: usize = 256;

/// What the multiplexer could not do.
#[derive(Debug, thiserror::Error)]
pub enum MuxError {
    #[error("connection id 0 is reserved; accepted: 1 to {}", u32::MAX)]
    ReservedConn,
    #[error(
        "connection {conn} is already open on this trunk; accepted: one reader per connection id"
    )]
    AlreadyOpen { conn: ConnId },
    #[error(
        "frame for connection {conn}: payload length {len} bytes; accepted: at most {MAX_PAYLOAD}"
    )]
    Oversized { conn: ConnId, len: u32 },
    #[error("frame for connection {conn}: the trunk ended {got} of {want} payload bytes in")]
    Truncated {
        conn: ConnId,
        got: usize,
        want: usize,
    },
    #[error("connection {conn}: more than {READ_QUEUE_LEN} frames queued unread")]
    QueueFull { conn: ConnId },
    #[error("the trunk is closed")]
    Closed,
    #[error("trunk: {0}")]
    Io(#[from] io::Error),
}

/// The 8-byte header in front of every frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub conn: ConnId,
    pub len: u32,
}

impl FrameHeader {
    pub fn encode(self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[..4].copy_from_slice(&self.conn.to_be_bytes());
        b[4..].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    pub fn decode(b: [u8; HEADER_LEN]) -> FrameHeader {
        FrameHeader {
            conn: u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            len: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
        }
    }
}

/// `data` for connection `conn` as frames of at most `chunk` payload bytes
/// each (nothing for empty data), concatenated.
pub fn encode_frames(conn: ConnId, data: &[u8], chunk: usize) -> Vec<u8> {
    let chunk = chunk.clamp(1, MAX_PAYLOAD);
    let mut out = Vec::with_capacity(data.len() + HEADER_LEN * data.len().div_ceil(chunk));
    for part in data.chunks(chunk) {
        // `chunk` ≤ MAX_PAYLOAD fits in a u32.
        let len = part.len() as u32;
        out.extend_from_slice(&FrameHeader { conn, len }.encode());
        out.extend_from_slice(part);
    }
    out
}

/// The next frame from `r`: None at a clean end (between frames).
pub fn read_frame(r: &mut impl Read) -> Result<Option<(ConnId, Vec<u8>)>, MuxError> {
    let mut hdr = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut hdr[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let h = FrameHeader::decode(hdr);
    let want = h.len as usize;
    if want > MAX_PAYLOAD {
        return Err(MuxError::Oversized {
            conn: h.conn,
            len: h.len,
        });
    }
    let mut payload = vec![0u8; want];
    let mut got = 0;
    while got < want {
        match r.read(&mut payload[got..]) {
            Ok(0) => {
                return Err(MuxError::Truncated {
                    conn: h.conn,
                    got,
                    want,
                })
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Some((h.conn, payload)))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data: go on with it.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Trunk {
    /// The trunk for writing, one frame run at a time.
    writer: Mutex<UnixStream>,
    /// The trunk for shutting down, without waiting for a writer.
    closer: UnixStream,
    /// Readers of the open connections.
    conns: Mutex<HashMap<ConnId, SyncSender<Vec<u8>>>>,
    closed: AtomicBool,
    /// Why the trunk ended, once it did.
    error: Mutex<Option<String>>,
}

impl Trunk {
    fn close(&self, why: Option<String>) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Some(w) = why {
            *lock(&self.error) = Some(w);
        }
        // Dropping the senders ends every reader (end of stream).
        lock(&self.conns).clear();
        let _ = self.closer.shutdown(std::net::Shutdown::Both);
    }
}

/// A multiplexed trunk. A thread reads it and queues each frame's payload
/// for its connection; writes go out under a lock, a frame run at a time.
/// Closing (or dropping every handle and the trunk ending) ends all
/// connections.
#[derive(Clone)]
pub struct Mux {
    shared: Arc<Trunk>,
}

impl Mux {
    /// Multiplex `trunk`; its reading thread starts now.
    pub fn new(trunk: UnixStream) -> io::Result<Mux> {
        let mut reader = trunk.try_clone()?;
        let closer = trunk.try_clone()?;
        let shared = Arc::new(Trunk {
            writer: Mutex::new(trunk),
            closer,
            conns: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            error: Mutex::new(None),
        });
        let s = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("nri-mux".into())
            .spawn(move || loop {
                match read_frame(&mut reader) {
                    Ok(Some((conn, payload))) => {
                        let tx = lock(&s.conns).get(&conn).cloned();
                        let Some(tx) = tx else { continue };
                        match tx.try_send(payload) {
                            Ok(()) => {}
                            // The reader went away: its frames are dropped.
                            Err(TrySendError::Disconnected(_)) => {
                                lock(&s.conns).remove(&conn);
                            }
                            Err(TrySendError::Full(_)) => {
                                s.close(Some(MuxError::QueueFull { conn }.to_string()));
                                return;
                            }
                        }
                    }
                    Ok(None) => return s.close(None),
                    Err(e) => return s.close(Some(e.to_string())),
                }
            })?;
        Ok(Mux { shared })
    }

    /// Open connection `conn`: its reading and writing halves.
    pub fn open(&self, conn: ConnId) -> Result<(MuxReader, MuxWriter), MuxError> {
        if conn == 0 {
            return Err(MuxError::ReservedConn);
        }
        if self.is_closed() {
            return Err(MuxError::Closed);
        }
        let (tx, rx) = sync_channel(READ_QUEUE_LEN);
        {
            let mut conns = lock(&self.shared.conns);
            if conns.contains_key(&conn) {
                return Err(MuxError::AlreadyOpen { conn });
            }
            conns.insert(conn, tx);
        }
        let reader = MuxReader {
            rx,
            buf: Vec::new(),
            pos: 0,
        };
        let writer = MuxWriter {
            conn,
            shared: Arc::clone(&self.shared),
        };
        Ok((reader, writer))
    }

    /// End the trunk and every connection on it.
    pub fn close(&self) {
        self.shared.close(None);
    }

    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::SeqCst)
    }

    /// Why the trunk ended (None: a clean end, or not ended).
    pub fn error(&self) -> Option<String> {
        lock(&self.shared.error).clone()
    }
}

/// The reading half of a connection: its bytes in order, end of stream
/// once the trunk ends.
pub struct MuxReader {
    rx: Receiver<Vec<u8>>,
    buf: Vec<u8>,
    pos: usize,
}

impl MuxReader {
    /// Like `read`, giving up after `timeout` without data
    /// (`io::ErrorKind::TimedOut`).
    pub fn read_timeout(&mut self, out: &mut [u8], timeout: Duration) -> io::Result<usize> {
        if self.pos >= self.buf.len() {
            match self.rx.recv_timeout(timeout) {
                Ok(b) => {
                    self.buf = b;
                    self.pos = 0;
                }
                Err(RecvTimeoutError::Timeout) => return Err(io::ErrorKind::TimedOut.into()),
                Err(RecvTimeoutError::Disconnected) => return Ok(0),
            }
        }
        Ok(self.take(out))
    }

    fn take(&mut self, out: &mut [u8]) -> usize {
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        n
    }
}

impl Read for MuxReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        while self.pos >= self.buf.len() {
            match self.rx.recv() {
                Ok(b) => {
                    self.buf = b;
                    self.pos = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        Ok(self.take(out))
    }
}

/// The writing half of a connection; clones share the trunk's lock, so
/// each `send` lands whole, never interleaved with another.
#[derive(Clone)]
pub struct MuxWriter {
    conn: ConnId,
    shared: Arc<Trunk>,
}

impl MuxWriter {
    /// Write `data` on the connection as frames of at most [`WRITE_CHUNK`].
    pub fn send(&self, data: &[u8]) -> Result<(), MuxError> {
        if self.shared.closed.load(Ordering::SeqCst) {
            return Err(MuxError::Closed);
        }
        let frames = encode_frames(self.conn, data, WRITE_CHUNK);
        let written = lock(&self.shared.writer).write_all(&frames);
        written.map_err(|e| {
            self.shared.close(Some(format!("write to trunk: {e}")));
            MuxError::Io(e)
        })
    }

    pub fn conn(&self) -> ConnId {
        self.conn
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `mux.write(1, []byte("hello"))` puts on the trunk in
    /// pkg/net/multiplex: `binary.BigEndian.PutUint32(hdr[0:4], id)`,
    /// `PutUint32(hdr[4:8], size)`, then the payload.
    const GO_HELLO_ON_1: [u8; 13] = [0, 0, 0, 1, 0, 0, 0, 5, b'h', b'e', b'l', b'l', b'o'];

    /// A ttrpc request header (length 0x2a, stream 1, type 1, flags 0) that
    /// the Go stub's client writes on the runtime connection (2).
    const GO_TTRPC_HEADER_ON_2: [u8; 18] =
        [0, 0, 0, 2, 0, 0, 0, 10, 0, 0, 0, 0x2a, 0, 0, 0, 1, 1, 0];

    #[test]
    fn header_round_trips_big_endian() {
        let h = FrameHeader {
            conn: 0x0102_0304,
            len: 0x0a0b_0c0d,
        };
        assert_eq!(h.encode(), [1, 2, 3, 4, 0x0a, 0x0b, 0x0c, 0x0d]);
        assert_eq!(FrameHeader::decode(h.encode()), h);
    }

    #[test]
    fn frames_match_the_go_encoding() {
        assert_eq!(encode_frames(1, b"hello", WRITE_CHUNK), GO_HELLO_ON_1);
        let mut r = &GO_HELLO_ON_1[..];
        assert_eq!(read_frame(&mut r).unwrap(), Some((1, b"hello".to_vec())));
        assert_eq!(read_frame(&mut r).unwrap(), None);
        let mut r = &GO_TTRPC_HEADER_ON_2[..];
        let (conn, payload) = read_frame(&mut r).unwrap().unwrap();
        assert_eq!(conn, RUNTIME_SERVICE_CONN);
        assert_eq!(payload, [0, 0, 0, 0x2a, 0, 0, 0, 1, 1, 0]);
        assert!(encode_frames(1, b"", WRITE_CHUNK).is_empty());
    }

    /// Go splits a write above MAX_PAYLOAD into frames of MAX_PAYLOAD; we
    /// split at the chunk asked for, each with its own header.
    #[test]
    fn long_writes_are_split_with_a_header_each() {
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let enc = encode_frames(2, &data, WRITE_CHUNK);
        assert_eq!(enc.len(), data.len() + 3 * HEADER_LEN);
        assert_eq!(&enc[..8], &[0, 0, 0, 2, 0, 0, 0x10, 0]);
        let mut r = &enc[..];
        let mut back = vec![];
        let mut sizes = vec![];
        while let Some((c, p)) = read_frame(&mut r).unwrap() {
            assert_eq!(c, 2);
            sizes.push(p.len());
            back.extend(p);
        }
        assert_eq!(sizes, [4096, 4096, 1808]);
        assert_eq!(back, data);
    }

    #[test]
    fn bad_frames_are_errors_naming_the_connection() {
        let mut big = FrameHeader {
            conn: 1,
            len: (MAX_PAYLOAD + 1) as u32,
        }
        .encode()
        .to_vec();
        big.extend([0; 4]);
        let e = read_frame(&mut &big[..]).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "frame for connection 1: payload length {} bytes; accepted: at most {MAX_PAYLOAD}",
                MAX_PAYLOAD + 1
            )
        );
        let cut = &GO_HELLO_ON_1[..10];
        let e = read_frame(&mut &cut[..]).unwrap_err().to_string();
        assert_eq!(
            e,
            "frame for connection 1: the trunk ended 2 of 5 payload bytes in"
        );
        let e = read_frame(&mut &GO_HELLO_ON_1[..3]).unwrap_err();
        assert!(matches!(e, MuxError::Io(ref err) if err.kind() == io::ErrorKind::UnexpectedEof));
    }

    /// Two muxes over a socket pair: connections are independent streams,
    /// frames for an unopened connection are dropped, and closing one end
    /// ends the other's readers.
    #[test]
    fn muxes_over_a_socket_pair() {
        let (a, b) = UnixStream::pair().unwrap();
        let (ma, mb) = (Mux::new(a).unwrap(), Mux::new(b).unwrap());
        let (mut r1, _w1) = mb.open(1).unwrap();
        let (mut r2, _w2) = mb.open(2).unwrap();
        let (_, wa1) = ma.open(1).unwrap();
        let (_, wa2) = ma.open(2).unwrap();
        let (_, wa3) = ma.open(3).unwrap();
        wa3.send(b"nobody listens").unwrap();
        wa2.send(b"second").unwrap();
        let long = vec![7u8; 3 * WRITE_CHUNK + 5];
        wa1.send(&long).unwrap();
        let mut got = vec![0u8; long.len()];
        r1.read_exact(&mut got).unwrap();
        assert_eq!(got, long);
        let mut two = [0u8; 6];
        r2.read_exact(&mut two).unwrap();
        assert_eq!(&two, b"second");
        assert!(matches!(mb.open(2), Err(MuxError::AlreadyOpen { conn: 2 })));
        assert!(matches!(mb.open(0), Err(MuxError::ReservedConn)));
        let e = r2
            .read_timeout(&mut two, Duration::from_millis(20))
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        ma.close();
        assert_eq!(r1.read(&mut got).unwrap(), 0, "end of stream after close");
        assert!(wa1.send(b"x").is_err());
    }
}
