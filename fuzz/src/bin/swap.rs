//! Fuzz target: the swap file reader (`hv::swap::file`). The input is a
//! program of operations on a swap file in /dev/shm (allocate, write a
//! page, free, read, and corrupt the file underneath: overwrite bytes,
//! truncate, extend). The property: a read returns exactly the page last
//! written to the slot, or an error; never other data, never a panic.

use hv::swap::file::{SwapFile, SwapSlot, SLOT_BYTES};
use std::collections::HashMap;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

fn main() {
    let dir = tempfile::Builder::new()
        .prefix("faultline-fuzz-swap-")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .expect("a temporary directory");
    let path = dir.path().join("swap");
    afl::fuzz!(|data: &[u8]| {
        let mut swap = SwapFile::create(&path).expect("create the swap file");
        swap.set_max_slots(64);
        let raw = OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open it again");
        // slot -> the page written there (what a read must return).
        let mut written: HashMap<u32, [u8; SLOT_BYTES]> = HashMap::new();
        let mut slots: Vec<SwapSlot> = Vec::new();
        let mut bytes = data.iter().copied();
        let mut next = || bytes.next();
        while let Some(op) = next() {
            let arg = next().unwrap_or(0);
            match op % 6 {
                0 => {
                    if let Ok(slot) = swap.alloc() {
                        slots.push(slot);
                    }
                }
                1 if !slots.is_empty() => {
                    let slot = slots[arg as usize % slots.len()];
                    let mut page = [0u8; SLOT_BYTES];
                    for (i, b) in page.iter_mut().enumerate() {
                        *b = (i as u8).wrapping_mul(arg).wrapping_add(op);
                    }
                    if swap.write(slot, &page).is_ok() {
                        written.insert(slot.0, page);
                    }
                }
                2 if !slots.is_empty() => {
                    let slot = slots.swap_remove(arg as usize % slots.len());
                    swap.free(slot);
                    written.remove(&slot.0);
                }
                3 => {
                    // Any slot number, allocated or not.
                    let slot = SwapSlot(u32::from(arg) % 80);
                    let mut page = [0u8; SLOT_BYTES];
                    if swap.read(slot, &mut page).is_ok() {
                        let want = written.get(&slot.0);
                        assert!(
                            want.is_some_and(|w| w[..] == page[..]),
                            "slot {} read back data that was not written there",
                            slot.0
                        );
                    }
                }
                4 => {
                    // Garbage written under the swap file.
                    let offset = u64::from(arg) * 997 + u64::from(next().unwrap_or(0)) * 4096;
                    let junk = [next().unwrap_or(0xa5); 3];
                    let _ = raw.write_all_at(&junk, offset);
                }
                5 => {
                    let len = u64::from(arg) * 1500;
                    let _ = raw.set_len(len);
                }
                _ => {}
            }
        }
    });
}
