//! ttrpc over a multiplexed connection: the message framing of
//! containerd/ttrpc (a 10-byte header — length u32, stream id u32, type u8,
//! flags u8, big endian — then a protobuf `ttrpc.Request` or
//! `ttrpc.Response`), a server that answers the runtime's calls on the
//! plugin connection and a client for the calls the plugin makes on the
//! runtime connection. The message types and their codec are the `ttrpc`
//! crate's; its own transport needs a listening socket or a file
//! descriptor per connection, which a logical connection of the
//! multiplexer is not.

use std::collections::HashMap;
use std::io::{self, Read};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{sync_channel, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use protobuf::Message;
use ttrpc::proto::{
    Request, Response, MESSAGE_HEADER_LENGTH, MESSAGE_LENGTH_MAX, MESSAGE_TYPE_REQUEST,
    MESSAGE_TYPE_RESPONSE,
};
use ttrpc::{Code, MessageHeader, Status};

use crate::mux::{MuxError, MuxReader, MuxWriter};

/// What a ttrpc exchange could not do.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    #[error("ttrpc message on stream {stream}: length {len} bytes; accepted: at most {MESSAGE_LENGTH_MAX}")]
    Oversized { stream: u32, len: u32 },
    #[error("ttrpc message on stream {stream}: type {kind}; accepted: {MESSAGE_TYPE_REQUEST} (request) or {MESSAGE_TYPE_RESPONSE} (response)")]
    UnexpectedType { stream: u32, kind: u8 },
    #[error("ttrpc {what}: {source}")]
    Decode {
        what: &'static str,
        source: protobuf::Error,
    },
    #[error("{service}/{method}: no answer within {timeout:?}")]
    TimedOut {
        service: String,
        method: String,
        timeout: Duration,
    },
    #[error("{service}/{method}: the runtime answered {code:?}: {message}")]
    Status {
        service: String,
        method: String,
        code: Code,
        message: String,
    },
    #[error("the connection closed")]
    Closed,
    #[error("ttrpc connection: {0}")]
    Io(#[from] io::Error),
    #[error(transparent)]
    Mux(#[from] MuxError),
}

/// One ttrpc message: header fields and payload, or None at a clean end.
pub fn read_message(r: &mut impl Read) -> Result<Option<(MessageHeader, Vec<u8>)>, RpcError> {
    let mut hdr = [0u8; MESSAGE_HEADER_LENGTH];
    let mut got = 0;
    while got < hdr.len() {
        match r.read(&mut hdr[got..])? {
            0 if got == 0 => return Ok(None),
            0 => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
            n => got += n,
        }
    }
    let mh = MessageHeader::from(hdr);
    if mh.length as usize > MESSAGE_LENGTH_MAX {
        return Err(RpcError::Oversized {
            stream: mh.stream_id,
            len: mh.length,
        });
    }
    let mut payload = vec![0u8; mh.length as usize];
    r.read_exact(&mut payload)?;
    Ok(Some((mh, payload)))
}

/// A message's bytes: header then payload.
pub fn encode_message(stream_id: u32, kind: u8, payload: &[u8]) -> Vec<u8> {
    let mh = MessageHeader {
        // Bounded by MESSAGE_LENGTH_MAX before this is called.
        length: payload.len() as u32,
        stream_id,
        type_: kind,
        flags: 0,
    };
    let mut out: Vec<u8> = mh.into();
    out.extend_from_slice(payload);
    out
}

fn status(code: Code, message: impl Into<String>) -> Status {
    ttrpc::get_status(code, message.into())
}

/// The answer to one request: a payload, or an error status.
pub type Answer = Result<Vec<u8>, Status>;

/// Handles one call: `(service, method, payload)`.
pub type Handler = Arc<dyn Fn(&str, &str, &[u8]) -> Answer + Send + Sync>;

/// Serve the requests arriving on `reader`, each on a thread of its own
/// (a slow one never holds up another), answers on `writer`. Returns when
/// the connection ends.
pub fn serve(mut reader: MuxReader, writer: MuxWriter, handler: Handler) -> Result<(), RpcError> {
    loop {
        let Some((mh, payload)) = read_message(&mut reader)? else {
            return Ok(());
        };
        if mh.type_ != MESSAGE_TYPE_REQUEST {
            // Data frames belong to streaming calls, which NRI has none of.
            continue;
        }
        let answer_on = writer.clone();
        let handler = Arc::clone(&handler);
        let spawned = std::thread::Builder::new()
            .name("nri-call".into())
            .spawn(move || {
                let mut res = Response::new();
                match Request::parse_from_bytes(&payload) {
                    Ok(req) => match handler(&req.service, &req.method, &req.payload) {
                        Ok(p) => {
                            res.status = protobuf::MessageField::some(status(Code::OK, ""));
                            res.payload = p;
                        }
                        Err(s) => res.status = protobuf::MessageField::some(s),
                    },
                    Err(e) => {
                        res.status = protobuf::MessageField::some(status(
                            Code::INVALID_ARGUMENT,
                            e.to_string(),
                        ))
                    }
                }
                let bytes = res.write_to_bytes().unwrap_or_default();
                let msg = encode_message(mh.stream_id, MESSAGE_TYPE_RESPONSE, &bytes);
                // A closed connection: the runtime gave up on this call.
                let _ = answer_on.send(&msg);
            });
        if let Err(e) = spawned {
            let mut res = Response::new();
            res.status =
                protobuf::MessageField::some(status(Code::RESOURCE_EXHAUSTED, e.to_string()));
            let bytes = res.write_to_bytes().unwrap_or_default();
            writer.send(&encode_message(mh.stream_id, MESSAGE_TYPE_RESPONSE, &bytes))?;
        }
    }
}

type Waiters = Arc<Mutex<HashMap<u32, SyncSender<Response>>>>;

/// A ttrpc client on one connection: calls carry odd stream ids (the
/// client's, as in containerd/ttrpc); a thread hands each response to the
/// call waiting for its stream.
pub struct Client {
    writer: MuxWriter,
    waiters: Waiters,
    next_stream: AtomicU32,
}

impl Client {
    pub fn new(mut reader: MuxReader, writer: MuxWriter) -> io::Result<Client> {
        let waiters: Waiters = Arc::default();
        let w = Arc::clone(&waiters);
        std::thread::Builder::new()
            .name("nri-client".into())
            .spawn(move || {
                while let Ok(Some((mh, payload))) = read_message(&mut reader) {
                    if mh.type_ != MESSAGE_TYPE_RESPONSE {
                        continue;
                    }
                    let waiter = w
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(&mh.stream_id);
                    if let (Some(tx), Ok(res)) = (waiter, Response::parse_from_bytes(&payload)) {
                        let _ = tx.try_send(res);
                    }
                }
                // The connection ended: every waiting call learns it.
                w.lock().unwrap_or_else(PoisonError::into_inner).clear();
            })?;
        Ok(Client {
            writer,
            waiters,
            next_stream: AtomicU32::new(1),
        })
    }

    /// Call `service/method` with `req`; the answer within `timeout`.
    pub fn call<Q: Message, A: Message>(
        &self,
        service: &str,
        method: &str,
        req: &Q,
        timeout: Duration,
    ) -> Result<A, RpcError> {
        let stream = self.next_stream.fetch_add(2, Ordering::SeqCst);
        let mut r = Request::new();
        r.service = service.into();
        r.method = method.into();
        r.timeout_nano = i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX);
        r.payload = req.write_to_bytes().map_err(|source| RpcError::Decode {
            what: "request",
            source,
        })?;
        let bytes = r.write_to_bytes().map_err(|source| RpcError::Decode {
            what: "request",
            source,
        })?;
        let (tx, rx) = sync_channel(1);
        self.waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(stream, tx);
        self.writer
            .send(&encode_message(stream, MESSAGE_TYPE_REQUEST, &bytes))?;
        let res = match rx.recv_timeout(timeout) {
            Ok(res) => res,
            Err(RecvTimeoutError::Timeout) => {
                self.waiters
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&stream);
                return Err(RpcError::TimedOut {
                    service: service.into(),
                    method: method.into(),
                    timeout,
                });
            }
            Err(RecvTimeoutError::Disconnected) => return Err(RpcError::Closed),
        };
        if let Some(s) = res.status.as_ref() {
            let code = s.code.enum_value_or(Code::UNKNOWN);
            if code != Code::OK {
                return Err(RpcError::Status {
                    service: service.into(),
                    method: method.into(),
                    code,
                    message: s.message.clone(),
                });
            }
        }
        A::parse_from_bytes(&res.payload).map_err(|source| RpcError::Decode {
            what: "response",
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mux::Mux;
    use std::os::unix::net::UnixStream;

    /// containerd/ttrpc's `writeMessageHeader`: length, stream id, type,
    /// flags, big endian.
    #[test]
    fn message_framing_matches_go() {
        let m = encode_message(3, MESSAGE_TYPE_RESPONSE, b"abc");
        assert_eq!(m, [0, 0, 0, 3, 0, 0, 0, 3, 2, 0, b'a', b'b', b'c']);
        let (mh, p) = read_message(&mut &m[..]).unwrap().unwrap();
        assert_eq!((mh.length, mh.stream_id, mh.type_, mh.flags), (3, 3, 2, 0));
        assert_eq!(p, b"abc");
        assert!(read_message(&mut &[][..]).unwrap().is_none());
        let huge = encode_message(5, 1, b"");
        let mut huge = huge.clone();
        huge[..4].copy_from_slice(&((MESSAGE_LENGTH_MAX as u32) + 1).to_be_bytes());
        let e = read_message(&mut &huge[..]).unwrap_err().to_string();
        assert!(e.starts_with("ttrpc message on stream 5: length"), "{e}");
    }

    /// A client on one mux calls a server on the other: the answer comes
    /// back on the caller's stream; an unknown method is a status error.
    #[test]
    fn client_calls_server_across_muxes() {
        let (a, b) = UnixStream::pair().unwrap();
        let (ma, mb) = (Mux::new(a).unwrap(), Mux::new(b).unwrap());
        let (sr, sw) = mb.open(2).unwrap();
        let handler: Handler = Arc::new(|service: &str, method: &str, payload: &[u8]| {
            if method == "Echo" {
                let mut r = Request::new();
                r.service = format!("{service}!");
                r.payload = payload.to_vec();
                Ok(r.write_to_bytes().unwrap())
            } else {
                Err(status(
                    Code::UNIMPLEMENTED,
                    format!("{method} is not served"),
                ))
            }
        });
        let server = std::thread::spawn(move || serve(sr, sw, handler));
        let (cr, cw) = ma.open(2).unwrap();
        let client = Client::new(cr, cw).unwrap();
        let mut q = Request::new();
        q.method = "inner".into();
        let got: Request = client
            .call("svc", "Echo", &q, Duration::from_secs(5))
            .unwrap();
        assert_eq!(got.service, "svc!");
        assert_eq!(
            Request::parse_from_bytes(&got.payload).unwrap().method,
            "inner"
        );
        let e = client
            .call::<Request, Request>("svc", "Other", &q, Duration::from_secs(5))
            .unwrap_err();
        assert!(
            matches!(
                e,
                RpcError::Status {
                    code: Code::UNIMPLEMENTED,
                    ..
                }
            ),
            "{e}"
        );
        ma.close();
        server.join().unwrap().unwrap();
    }
}
