//! The snapshot container: a header, then sections, each with its kind,
//! length and CRC-32 (see `docs/migration.md`, "The format").
//!
//! ```text
//! header   magic "FLTSNAP\0" (8) | version u32 | section count u32
//! section  kind u32 | length u64 | crc32 u32 | payload (length bytes)
//! ```
//!
//! All integers little-endian. Version 2 has exactly two sections, in this
//! order: [`SectionKind::State`] (the VM's state, bincode) and
//! [`SectionKind::Memory`] (guest pages: a count u64, then per page its
//! gfn u64 and 4096 bytes, gfns strictly increasing, pages that read as
//! zero left out). The parser works on a byte slice, never allocates from
//! a length it read, and checks every length against the bytes present
//! before it looks at them.

use super::SnapshotError;

/// The first eight bytes of a snapshot.
pub const MAGIC: [u8; 8] = *b"FLTSNAP\0";
/// The format version this build writes and reads (3: a CPU's pause and
/// the per-vCPU lock counters joined the state section).
pub const VERSION: u32 = 3;
/// Bytes of the header.
pub const HEADER_LEN: usize = 16;
/// Bytes of a section header.
pub const SECTION_HEADER_LEN: usize = 16;
/// The state section's largest length: far above what 64 vCPUs' state
/// takes (a few KiB each) but small enough to hold in memory at once.
pub const MAX_STATE_LEN: u64 = 64 << 20;
/// Bytes of one page record in the memory section.
pub const PAGE_RECORD_LEN: usize = 8 + machine::addr::PAGE_SIZE as usize;

/// What a section holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SectionKind {
    State = 1,
    Memory = 2,
}

impl SectionKind {
    pub fn name(self) -> &'static str {
        match self {
            SectionKind::State => "state",
            SectionKind::Memory => "memory",
        }
    }

    fn from_u32(kind: u32) -> Option<SectionKind> {
        match kind {
            1 => Some(SectionKind::State),
            2 => Some(SectionKind::Memory),
            _ => None,
        }
    }
}

/// Writes the header and the sections, in order.
pub fn encode(sections: &[(SectionKind, &[u8])]) -> Vec<u8> {
    let total = HEADER_LEN
        + sections
            .iter()
            .map(|(_, payload)| SECTION_HEADER_LEN + payload.len())
            .sum::<usize>();
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(sections.len() as u32).to_le_bytes());
    for (kind, payload) in sections {
        out.extend_from_slice(&(*kind as u32).to_le_bytes());
        out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        out.extend_from_slice(payload);
    }
    out
}

/// The two sections of a version-1 snapshot, checked (magic, version,
/// lengths, checksums, order), not yet decoded.
#[derive(Debug, Clone, Copy)]
pub struct Sections<'a> {
    pub state: &'a [u8],
    pub memory: &'a [u8],
}

fn take<'a>(
    bytes: &'a [u8],
    at: &mut usize,
    len: usize,
    what: &'static str,
) -> Result<&'a [u8], SnapshotError> {
    let have = bytes.len().saturating_sub(*at);
    if have < len {
        return Err(SnapshotError::Truncated {
            what,
            needed: len as u64,
            have: have as u64,
        });
    }
    let slice = &bytes[*at..*at + len];
    *at += len;
    Ok(slice)
}

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[offset..offset + 4]);
    u32::from_le_bytes(b)
}

fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[offset..offset + 8]);
    u64::from_le_bytes(b)
}

/// Splits and checks a snapshot.
pub fn parse(bytes: &[u8]) -> Result<Sections<'_>, SnapshotError> {
    let mut at = 0usize;
    let header = take(bytes, &mut at, HEADER_LEN, "the header")?;
    if header[..8] != MAGIC {
        return Err(SnapshotError::BadMagic);
    }
    let version = u32_at(header, 8);
    if version != VERSION {
        return Err(SnapshotError::UnsupportedVersion {
            found: version,
            supported: VERSION,
        });
    }
    let count = u32_at(header, 12);
    const ORDER: [SectionKind; 2] = [SectionKind::State, SectionKind::Memory];
    if count != ORDER.len() as u32 {
        return Err(SnapshotError::SectionCount {
            found: count,
            expected: ORDER.len() as u32,
        });
    }
    let mut payloads: [&[u8]; 2] = [&[], &[]];
    for (slot, expected) in payloads.iter_mut().zip(ORDER) {
        let head = take(bytes, &mut at, SECTION_HEADER_LEN, "a section header")?;
        let raw_kind = u32_at(head, 0);
        let kind =
            SectionKind::from_u32(raw_kind).ok_or(SnapshotError::UnknownSection(raw_kind))?;
        if kind != expected {
            return Err(SnapshotError::SectionOrder {
                found: kind.name(),
                expected: expected.name(),
            });
        }
        let len = u64_at(head, 4);
        let crc = u32_at(head, 12);
        let max = match kind {
            SectionKind::State => MAX_STATE_LEN,
            // Bounded by the bytes present below, and by the guest's size
            // once the state is decoded.
            SectionKind::Memory => u64::MAX,
        };
        if len > max {
            return Err(SnapshotError::SectionTooLarge {
                section: kind.name(),
                len,
                max,
            });
        }
        let len = usize::try_from(len).map_err(|_| SnapshotError::Truncated {
            what: kind.name(),
            needed: len,
            have: bytes.len().saturating_sub(at) as u64,
        })?;
        let payload = take(bytes, &mut at, len, kind.name())?;
        let computed = crc32fast::hash(payload);
        if computed != crc {
            return Err(SnapshotError::Checksum {
                section: kind.name(),
                stored: crc,
                computed,
            });
        }
        *slot = payload;
    }
    if at != bytes.len() {
        return Err(SnapshotError::TrailingBytes((bytes.len() - at) as u64));
    }
    Ok(Sections {
        state: payloads[0],
        memory: payloads[1],
    })
}

/// Encodes guest pages as the memory section.
pub fn encode_memory(pages: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + pages.len() * PAGE_RECORD_LEN);
    out.extend_from_slice(&(pages.len() as u64).to_le_bytes());
    for (gfn, data) in pages {
        out.extend_from_slice(&gfn.to_le_bytes());
        out.extend_from_slice(data);
    }
    out
}

/// The pages of a memory section for a guest of `npages` pages: each
/// (gfn, its 4096 bytes), gfns strictly increasing and below `npages`.
pub fn memory_pages(
    memory: &[u8],
    npages: u64,
) -> Result<impl Iterator<Item = (u64, &[u8])>, SnapshotError> {
    let mut at = 0usize;
    let head = take(memory, &mut at, 8, "the memory section's page count")?;
    let count = u64_at(head, 0);
    if count > npages {
        return Err(SnapshotError::Invalid(format!(
            "the memory section has {count} pages, the guest {npages}"
        )));
    }
    let body = &memory[at..];
    let expected = count.checked_mul(PAGE_RECORD_LEN as u64);
    if expected != Some(body.len() as u64) {
        return Err(SnapshotError::Invalid(format!(
            "the memory section holds {} bytes of page records for {count} pages",
            body.len()
        )));
    }
    let mut previous: Option<u64> = None;
    for record in body.chunks_exact(PAGE_RECORD_LEN) {
        let gfn = u64_at(record, 0);
        if gfn >= npages {
            return Err(SnapshotError::Invalid(format!(
                "page {gfn:#x} is outside the guest's {npages} pages"
            )));
        }
        if previous.is_some_and(|p| p >= gfn) {
            return Err(SnapshotError::Invalid(format!(
                "page {gfn:#x} is out of order or repeated"
            )));
        }
        previous = Some(gfn);
    }
    Ok(body
        .chunks_exact(PAGE_RECORD_LEN)
        .map(|record| (u64_at(record, 0), &record[8..])))
}

/// Recomputes the CRC-32 of every section whose header and payload are
/// present, leaving everything else as it is: a fuzzer's input, resealed,
/// reaches the decoders behind the checksums instead of stopping at them.
pub fn reseal(bytes: &mut [u8]) {
    let mut at = HEADER_LEN;
    while at + SECTION_HEADER_LEN <= bytes.len() {
        let len = u64_at(bytes, at + 4);
        let start = at + SECTION_HEADER_LEN;
        let Some(end) = usize::try_from(len)
            .ok()
            .and_then(|len| start.checked_add(len))
            .filter(|&end| end <= bytes.len())
        else {
            return;
        };
        let crc = crc32fast::hash(&bytes[start..end]);
        bytes[at + 12..at + 16].copy_from_slice(&crc.to_le_bytes());
        at = end;
    }
}
