//! The container parser against damaged input.

use super::format::{self, SectionKind};
use super::SnapshotError;

fn sample() -> Vec<u8> {
    let memory = format::encode_memory(&[(1, vec![7u8; 4096]), (5, vec![9u8; 4096])]);
    format::encode(&[
        (SectionKind::State, b"state!"),
        (SectionKind::Memory, &memory),
    ])
}

#[test]
fn round_trip() {
    let bytes = sample();
    let sections = format::parse(&bytes).expect("parses");
    assert_eq!(sections.state, b"state!");
    let pages: Vec<_> = format::memory_pages(sections.memory, 8)
        .expect("pages")
        .map(|(gfn, data)| (gfn, data[0]))
        .collect();
    assert_eq!(pages, vec![(1, 7), (5, 9)]);
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = sample();
    for len in 0..bytes.len() {
        assert!(format::parse(&bytes[..len]).is_err(), "{len} bytes parsed");
    }
}

#[test]
fn every_bit_flip_is_caught() {
    let bytes = sample();
    for byte in 0..bytes.len() {
        for bit in 0..8 {
            let mut bad = bytes.clone();
            bad[byte] ^= 1 << bit;
            assert!(
                format::parse(&bad).is_err(),
                "flip of bit {bit} of byte {byte} not caught"
            );
        }
    }
}

#[test]
fn specific_errors() {
    let bytes = sample();
    let mut wrong_version = bytes.clone();
    let other = format::VERSION + 1;
    wrong_version[8..12].copy_from_slice(&other.to_le_bytes());
    assert!(matches!(
        format::parse(&wrong_version),
        Err(SnapshotError::UnsupportedVersion { found, .. }) if found == other
    ));
    let mut huge = bytes.clone();
    // The state section's length: 16 header bytes, then kind (4).
    huge[20..28].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        format::parse(&huge),
        Err(SnapshotError::SectionTooLarge { .. })
    ));
    let mut trailing = bytes.clone();
    trailing.push(0);
    assert!(matches!(
        format::parse(&trailing),
        Err(SnapshotError::TrailingBytes(1))
    ));
    assert!(matches!(
        format::parse(b"not a snapshot at all"),
        Err(SnapshotError::BadMagic)
    ));
}

#[test]
fn memory_records_are_checked() {
    let page = vec![1u8; 4096];
    let outside = format::encode_memory(&[(8, page.clone())]);
    assert!(
        format::memory_pages(&outside, 8).is_err(),
        "gfn past the guest"
    );
    let repeated = format::encode_memory(&[(2, page.clone()), (2, page.clone())]);
    assert!(format::memory_pages(&repeated, 8).is_err(), "repeated gfn");
    let mut lying = format::encode_memory(&[(2, page.clone())]);
    lying[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(format::memory_pages(&lying, 8).is_err(), "huge count");
    lying[..8].copy_from_slice(&3u64.to_le_bytes());
    assert!(
        format::memory_pages(&lying, 8).is_err(),
        "count above the records"
    );
}
