//! Fixed virtual addresses shared by the native run and the interpreter.
//!
//! Both runs place the snippet, the data window and the stack at the same
//! linear addresses, so every address a snippet computes (and every
//! rip-relative displacement) means the same thing in both. Everything sits
//! below 4 GiB so that 32-bit address-size forms can reach the window, and
//! inside one 2 MiB region so that one page table maps it all.

/// Where the snippet starts.
pub const CODE_ADDR: u64 = 0x1000_0000;
/// Size of the code page (snippet plus sentinel or native epilogue).
pub const CODE_SIZE: u64 = 0x1000;
/// Longest snippet accepted (the rest of the code page holds the native
/// epilogue).
pub const MAX_SNIPPET_LEN: usize = 0x800;

/// The data page of the compared memory window.
pub const DATA_ADDR: u64 = 0x1001_0000;
/// The stack page of the compared memory window.
pub const STACK_ADDR: u64 = 0x1002_0000;
/// Size of each window page.
pub const WINDOW_PAGE_SIZE: u64 = 0x1000;
/// Bytes in the window: the data page followed by the stack page.
pub const WINDOW_SIZE: usize = 2 * WINDOW_PAGE_SIZE as usize;
/// Initial RSP: the middle of the stack page, so pushes, pops and
/// `[rsp+disp]` operands stay inside it.
pub const INITIAL_RSP: u64 = STACK_ADDR + 0x800;

/// The linear address of byte `offset` of the window.
pub fn window_addr(offset: usize) -> u64 {
    let page = offset as u64 / WINDOW_PAGE_SIZE;
    let base = if page == 0 { DATA_ADDR } else { STACK_ADDR };
    base + offset as u64 % WINDOW_PAGE_SIZE
}

/// The window offset of a linear address, if it is inside the window.
pub fn window_offset(addr: u64) -> Option<usize> {
    if (DATA_ADDR..DATA_ADDR + WINDOW_PAGE_SIZE).contains(&addr) {
        Some((addr - DATA_ADDR) as usize)
    } else if (STACK_ADDR..STACK_ADDR + WINDOW_PAGE_SIZE).contains(&addr) {
        Some((addr - STACK_ADDR + WINDOW_PAGE_SIZE) as usize)
    } else {
        None
    }
}

// Interpreter-only system structures. They are supervisor pages, so a ring-3
// snippet touching them faults exactly as it would touching the unmapped
// addresses there in the native child.

/// Global descriptor table.
pub const GDT_ADDR: u64 = 0x1004_0000;
/// The 64-bit TSS (RSP0 for exceptions taken from ring 3 through the IDT).
pub const TSS_ADDR: u64 = 0x1004_0800;
/// Interrupt descriptor table (256 gates).
pub const IDT_ADDR: u64 = 0x1005_0000;
/// Every IDT gate points here: a `hlt` loop.
pub const HANDLER_ADDR: u64 = 0x1006_0000;
/// Top of the ring-0 stack (the page below it is mapped).
pub const KERNEL_STACK_TOP: u64 = 0x1008_0000;

/// Host-physical placement of the interpreter's page tables (not mapped
/// into the linear address space).
pub const PML4_ADDR: u64 = 0x1000;
pub const PDPT_ADDR: u64 = 0x2000;
pub const PD_ADDR: u64 = 0x3000;
pub const PT_ADDR: u64 = 0x4000;

/// Size of the interpreter's physical memory: everything above is
/// identity-mapped, so it must reach past the highest page used. The
/// memory is mapped lazily, so only touched pages cost anything.
pub const MEMORY_SIZE: u64 = 0x1010_0000;

// GDT selectors (the Linux x86-64 layout for the user segments, so the
// selectors match what the native child runs with).

/// Ring-0 64-bit code.
pub const KERNEL_CS: u16 = 0x08;
/// Ring-0 data.
pub const KERNEL_DS: u16 = 0x10;
/// Ring-3 data (RPL 3).
pub const USER_DS: u16 = 0x2b;
/// Ring-3 64-bit code (RPL 3).
pub const USER_CS: u16 = 0x33;
/// The TSS.
pub const TSS_SELECTOR: u16 = 0x40;

// Native-only areas (far from the snippet's reach: unmapped in the
// interpreter).

/// Input and output register blocks of the native trampoline.
pub const NATIVE_IO_ADDR: u64 = 0x1020_0000;
/// The native prologue (loads state, jumps to the snippet).
pub const NATIVE_TRAMPOLINE_ADDR: u64 = 0x1021_0000;

#[cfg(test)]
mod tests {
    use super::*;

    // The interpreter maps everything below MEMORY_SIZE; the native-only
    // areas must be outside it.
    const _: () = assert!(KERNEL_STACK_TOP < MEMORY_SIZE && NATIVE_IO_ADDR >= MEMORY_SIZE);

    #[test]
    fn window_addresses_round_trip() {
        for off in [0, 1, 0xfff, 0x1000, 0x1fff] {
            assert_eq!(window_offset(window_addr(off)), Some(off));
        }
        assert_eq!(window_offset(DATA_ADDR - 1), None);
        assert_eq!(window_offset(STACK_ADDR + WINDOW_PAGE_SIZE), None);
        // One page table covers everything the interpreter maps.
        assert_eq!(CODE_ADDR >> 21, (KERNEL_STACK_TOP - 1) >> 21);
    }
}
