//! The migration link: framed, checksummed messages over a real TCP
//! connection, and the link model that gives their transfer a time in
//! virtual time (`docs/migration.md`, "The protocol").
//!
//! ```text
//! frame  type u32 | length u32 | CRC-32 u32 | payload (length bytes)
//! ```
//!
//! The receiver checks the type, the length against the type's own
//! maximum before it allocates, and the checksum.

use hv::Cycles;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The first bytes of a `Hello` payload.
pub const MAGIC: [u8; 8] = *b"FLTMIGR\0";
/// The protocol version.
pub const VERSION: u32 = 2;
/// Pages in one `Pages` frame at most.
pub const PAGES_PER_FRAME: usize = 256;
/// Bytes of a frame header.
pub const FRAME_HEADER: u64 = 12;
/// Gfns in one `Pending` or `Need` frame at most.
pub const GFNS_PER_FRAME: usize = 65536;
/// Bytes on the wire of a `Pages` frame holding one page (post-copy sends
/// each page in a frame of its own).
pub const ONE_PAGE_FRAME: u64 = FRAME_HEADER + 4 + PAGE_RECORD as u64;
/// Bytes on the wire of a `Request` frame.
pub const REQUEST_FRAME: u64 = FRAME_HEADER + 8;
const PAGE: usize = 4096;
const PAGE_RECORD: usize = 8 + PAGE;

/// Message types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Source → destination: magic, version, guest memory size, vCPUs.
    Hello = 1,
    /// Source → destination: page records (gfn u64 + 4096 bytes each).
    Pages = 2,
    /// Source → destination: the VM's state section (the VM is stopped).
    State = 3,
    /// Destination → source: the VM was restored; it runs here now.
    Ack = 4,
    /// Destination → source: refused, with the reason (UTF-8).
    Nack = 5,
    /// Source → destination, post-copy, before `State`: gfns still to
    /// come after the switch-over (a count u32, then the gfns, u64 each).
    Pending = 6,
    /// Destination → source, post-copy: send this page next (a gfn u64).
    Request = 7,
    /// Destination → source, post-copy: every page is here; the source
    /// may go.
    Done = 8,
    /// Source → destination, on a new connection during post-copy: a
    /// `Hello`'s payload, to resume after the first connection broke.
    Recover = 9,
    /// Destination → source, answering `Recover`: gfns still missing (as
    /// `Pending`); an `Ack` ends the list.
    Need = 10,
    /// Source → destination, post-copy, before `Pending`: the link model
    /// (bandwidth in bytes/s u64, one-way latency in ns u64), which times
    /// the pages to come at the destination.
    LinkModel = 11,
}

impl Kind {
    fn from_u32(v: u32) -> Option<Kind> {
        Some(match v {
            1 => Kind::Hello,
            2 => Kind::Pages,
            3 => Kind::State,
            4 => Kind::Ack,
            5 => Kind::Nack,
            6 => Kind::Pending,
            7 => Kind::Request,
            8 => Kind::Done,
            9 => Kind::Recover,
            10 => Kind::Need,
            11 => Kind::LinkModel,
            _ => return None,
        })
    }

    /// The largest payload of this type.
    fn max_len(self) -> u32 {
        match self {
            Kind::Hello => 24,
            Kind::Pages => (4 + PAGES_PER_FRAME * PAGE_RECORD) as u32,
            Kind::State => hv::snapshot::format::MAX_STATE_LEN as u32,
            Kind::Ack => 0,
            Kind::Nack => 4096,
            Kind::Pending | Kind::Need => (4 + GFNS_PER_FRAME * 8) as u32,
            Kind::Request => 8,
            Kind::Done => 0,
            Kind::Recover => 24,
            Kind::LinkModel => 16,
        }
    }
}

/// What went wrong on the link.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("no answer within {}", crate::units::format_duration(*.0))]
    Timeout(Duration),
    #[error("the peer closed the connection")]
    Closed,
    #[error("unknown message type {0}")]
    UnknownType(u32),
    #[error("a {kind:?} message of {len} bytes (at most {max})")]
    TooLong { kind: Kind, len: u32, max: u32 },
    #[error("a {0:?} message is corrupted (checksum)")]
    Checksum(Kind),
    #[error("protocol: {0}")]
    Protocol(String),
}

/// The link's speed in virtual time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkModel {
    /// Bytes per second.
    pub bandwidth: u64,
    /// One-way latency.
    pub latency: Duration,
}

impl LinkModel {
    /// Virtual time to move `bytes` across: the latency, then the bytes
    /// at the bandwidth.
    pub fn transfer(&self, bytes: u64) -> Cycles {
        let latency = crate::units::duration_to_cycles(self.latency);
        let wire = (u128::from(bytes) * u128::from(hv::CYCLES_PER_SECOND)
            / u128::from(self.bandwidth.max(1))) as u64;
        Cycles(latency.saturating_add(wire))
    }
}

/// One end of a migration connection; counts the bytes it sent.
pub struct Link {
    stream: TcpStream,
    pub sent: u64,
    /// The read and write timeout (`None`: none).
    timeout: Option<Duration>,
}

impl Link {
    /// A second handle on the same connection (post-copy reads the
    /// return path on one thread while another sends pages).
    pub fn try_clone(&self) -> std::io::Result<Link> {
        Ok(Link {
            stream: self.stream.try_clone()?,
            sent: 0,
            timeout: self.timeout,
        })
    }

    /// The connection's read timeout (`None`: wait as long as it takes).
    /// (The timeout messages still name the first one: a reader with none
    /// never times out.)
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        self.stream.set_read_timeout(timeout)
    }

    /// Closes both directions (the other handles see the end too).
    pub fn shutdown(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }

    pub fn new(stream: TcpStream, timeout: Duration) -> std::io::Result<Link> {
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        Ok(Link {
            stream,
            sent: 0,
            timeout: Some(timeout),
        })
    }

    /// Sends one frame; returns its bytes on the wire.
    pub fn send(&mut self, kind: Kind, payload: &[u8]) -> Result<u64, LinkError> {
        let mut header = [0u8; FRAME_HEADER as usize];
        header[..4].copy_from_slice(&(kind as u32).to_le_bytes());
        header[4..8].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        header[8..].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
        let timeout = self.timeout;
        let timed = |e| timed_out(e, timeout);
        self.stream.write_all(&header).map_err(timed)?;
        self.stream.write_all(payload).map_err(timed)?;
        let bytes = FRAME_HEADER + payload.len() as u64;
        self.sent += bytes;
        Ok(bytes)
    }

    /// Receives one frame, checked.
    pub fn recv(&mut self) -> Result<(Kind, Vec<u8>), LinkError> {
        let mut header = [0u8; FRAME_HEADER as usize];
        read_exact_or_closed(&mut self.stream, &mut header, self.timeout)?;
        let raw = u32::from_le_bytes(header[..4].try_into().expect("4 bytes"));
        let kind = Kind::from_u32(raw).ok_or(LinkError::UnknownType(raw))?;
        let len = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
        let crc = u32::from_le_bytes(header[8..].try_into().expect("4 bytes"));
        if len > kind.max_len() {
            return Err(LinkError::TooLong {
                kind,
                len,
                max: kind.max_len(),
            });
        }
        let mut payload = vec![0u8; len as usize];
        read_exact_or_closed(&mut self.stream, &mut payload, self.timeout)?;
        if crc32fast::hash(&payload) != crc {
            return Err(LinkError::Checksum(kind));
        }
        Ok((kind, payload))
    }
}

fn read_exact_or_closed(
    stream: &mut TcpStream,
    buf: &mut [u8],
    timeout: Option<Duration>,
) -> Result<(), LinkError> {
    stream.read_exact(buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            LinkError::Closed
        } else {
            timed_out(e, timeout)
        }
    })
}

/// An I/O error, or the timeout it stands for: a socket timeout shows as
/// `WouldBlock` ("Resource temporarily unavailable") or `TimedOut`.
pub fn timed_out(e: std::io::Error, timeout: Option<Duration>) -> LinkError {
    use std::io::ErrorKind;
    match (e.kind(), timeout) {
        (ErrorKind::WouldBlock | ErrorKind::TimedOut, Some(t)) => LinkError::Timeout(t),
        _ => LinkError::Io(e),
    }
}

/// The `Hello` payload.
pub fn hello(mem_size: u64, vcpus: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(24);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&mem_size.to_le_bytes());
    out.extend_from_slice(&vcpus.to_le_bytes());
    out
}

/// A `Hello` checked: (guest memory size, vCPUs).
pub fn parse_hello(payload: &[u8]) -> Result<(u64, u32), LinkError> {
    if payload.len() != 24 || payload[..8] != MAGIC {
        return Err(LinkError::Protocol("not a faultline migration".into()));
    }
    let version = u32::from_le_bytes(payload[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(LinkError::Protocol(format!(
            "protocol version {version}, this faultline speaks {VERSION}"
        )));
    }
    let mem_size = u64::from_le_bytes(payload[12..20].try_into().expect("8 bytes"));
    let vcpus = u32::from_le_bytes(payload[20..24].try_into().expect("4 bytes"));
    if mem_size == 0 || mem_size % (2 << 20) != 0 || mem_size > hv::MAX_GUEST_MEM {
        return Err(LinkError::Protocol(format!("a guest of {mem_size} bytes")));
    }
    if vcpus == 0 || vcpus as usize > abi::MAX_CPUS {
        return Err(LinkError::Protocol(format!("a guest of {vcpus} vCPUs")));
    }
    Ok((mem_size, vcpus))
}

/// A `Pages` payload of `pages` (gfn, contents).
pub fn pages(batch: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + batch.len() * PAGE_RECORD);
    out.extend_from_slice(&(batch.len() as u32).to_le_bytes());
    for (gfn, data) in batch {
        out.extend_from_slice(&gfn.to_le_bytes());
        out.extend_from_slice(data);
    }
    out
}

/// The records of a `Pages` payload for a guest of `npages` pages,
/// checked: the count matches the bytes, every gfn is inside the guest.
pub fn parse_pages(payload: &[u8], npages: u64) -> Result<Vec<(u64, &[u8])>, LinkError> {
    if payload.len() < 4 {
        return Err(LinkError::Protocol(
            "a page message without its count".into(),
        ));
    }
    let count = u32::from_le_bytes(payload[..4].try_into().expect("4 bytes")) as usize;
    let body = &payload[4..];
    if count > PAGES_PER_FRAME || body.len() != count * PAGE_RECORD {
        return Err(LinkError::Protocol(format!(
            "a page message of {count} pages in {} bytes",
            body.len()
        )));
    }
    body.chunks_exact(PAGE_RECORD)
        .map(|r| {
            let gfn = u64::from_le_bytes(r[..8].try_into().expect("8 bytes"));
            if gfn >= npages {
                Err(LinkError::Protocol(format!(
                    "page {gfn:#x} outside the guest's {npages} pages"
                )))
            } else {
                Ok((gfn, &r[8..]))
            }
        })
        .collect()
}

/// A `Pending` or `Need` payload.
pub fn gfn_list(gfns: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + gfns.len() * 8);
    out.extend_from_slice(&(gfns.len() as u32).to_le_bytes());
    for gfn in gfns {
        out.extend_from_slice(&gfn.to_le_bytes());
    }
    out
}

/// The gfns of a `Pending` or `Need` payload for a guest of `npages`
/// pages, checked: the count matches the bytes, every gfn is inside the
/// guest.
pub fn parse_gfn_list(payload: &[u8], npages: u64) -> Result<Vec<u64>, LinkError> {
    if payload.len() < 4 {
        return Err(LinkError::Protocol("a page list without its count".into()));
    }
    let count = u32::from_le_bytes(payload[..4].try_into().expect("4 bytes")) as usize;
    let body = &payload[4..];
    if count > GFNS_PER_FRAME || body.len() != count * 8 {
        return Err(LinkError::Protocol(format!(
            "a page list of {count} pages in {} bytes",
            body.len()
        )));
    }
    body.chunks_exact(8)
        .map(|r| {
            let gfn = u64::from_le_bytes(r.try_into().expect("8 bytes"));
            if gfn >= npages {
                Err(LinkError::Protocol(format!(
                    "page {gfn:#x} outside the guest's {npages} pages"
                )))
            } else {
                Ok(gfn)
            }
        })
        .collect()
}

/// A `Request` payload checked: the gfn, inside a guest of `npages`.
pub fn parse_request(payload: &[u8], npages: u64) -> Result<u64, LinkError> {
    let gfn = u64::from_le_bytes(
        payload
            .try_into()
            .map_err(|_| LinkError::Protocol(format!("a request of {} bytes", payload.len())))?,
    );
    if gfn >= npages {
        return Err(LinkError::Protocol(format!(
            "a request for page {gfn:#x} outside the guest's {npages} pages"
        )));
    }
    Ok(gfn)
}

/// A `LinkModel` payload.
pub fn link_model(model: &LinkModel) -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    out.extend_from_slice(&model.bandwidth.to_le_bytes());
    let latency = u64::try_from(model.latency.as_nanos()).unwrap_or(u64::MAX);
    out.extend_from_slice(&latency.to_le_bytes());
    out
}

/// A `LinkModel` payload checked: a bandwidth of at least 1 byte/s, a
/// latency of at most a minute.
pub fn parse_link_model(payload: &[u8]) -> Result<LinkModel, LinkError> {
    if payload.len() != 16 {
        return Err(LinkError::Protocol(format!(
            "a link model of {} bytes",
            payload.len()
        )));
    }
    let bandwidth = u64::from_le_bytes(payload[..8].try_into().expect("8 bytes"));
    let latency = u64::from_le_bytes(payload[8..].try_into().expect("8 bytes"));
    if bandwidth == 0 || latency > 60_000_000_000 {
        return Err(LinkError::Protocol(format!(
            "a link of {bandwidth} bytes/s and {latency} ns latency"
        )));
    }
    Ok(LinkModel {
        bandwidth,
        latency: Duration::from_nanos(latency),
    })
}
