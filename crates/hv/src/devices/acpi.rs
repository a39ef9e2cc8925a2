//! The ACPI tables, built with rust-vmm's `acpi_tables`, and the
//! hardware-reduced sleep registers that power the VM off.
//!
//! The tables sit in the BIOS area at [`ACPI_BASE`] (the RSDP first, on
//! the 16-byte boundary where an OS scans for it), inside the low
//! megabyte the memory map reserves:
//!
//! - RSDP (revision 2) → XSDT → FADT, MADT;
//! - FADT: hardware-reduced (no PM1 blocks, no SCI), the sleep control
//!   and status registers at ports [`SLEEP_CONTROL_PORT`] and
//!   [`SLEEP_STATUS_PORT`], the DSDT's 64-bit address;
//! - MADT: the local APIC address, *no* PCAT_COMPAT flag (there is no
//!   8259 PIC), a local x2APIC entry per vCPU, the IOAPIC, and interrupt
//!   source overrides IRQ0 → GSI 2 and COM1's IRQ 4 (edge, active high);
//! - DMAR (with `--iommu intel` only): the VT-d unit at
//!   [`super::vtd::VTD_BASE`] for every PCI device of segment 0
//!   (INCLUDE_PCI_ALL), host address width 39, interrupt remapping
//!   offered, x2APIC opt-out (no extended interrupt mode), and the IOAPIC
//!   in its device scope as 0xff:00.0, as QEMU's q35 names it;
//! - DSDT: `Name (_S5_, Package () { 5, 0, 0, 0 })`, from which an OS
//!   learns the SLP_TYP of soft-off, and COM1.
//!
//! Multiboot kernels (the platform with the PC's legacy devices:
//! [`super::Platform::attach_test_devices`]) get the fixed-hardware ACPI
//! model instead, as a PC's firmware offers it ([`TableSet::legacy_pm`]):
//!
//! - the FADT is not hardware-reduced: FIRMWARE_CTRL points to the FACS,
//!   the PM1a event block (PM1_STS, PM1_EN) is at [`PM1A_EVT_PORT`] and
//!   the PM1a control block at [`PM1A_CNT_PORT`] ([`Pm1`]), SCI_INT 9,
//!   no SMI_CMD (the machine is always in ACPI mode: SCI_EN reads as 1),
//!   the CMOS RTC present and its century register named;
//! - the FACS (64 bytes, 64-byte aligned), whose firmware waking vector
//!   the OS writes before S3;
//! - the DSDT also has `Name (_S3_, Package () { 1, 1, 0, 0 })` (QEMU's
//!   SLP_TYP for S3, which the kvm-unit-tests suite's `s3` test writes).

use super::ioapic::{IOAPIC_BASE, IOAPIC_ID};
use super::serial::COM1_IRQ;
use acpi_tables::aml::{Device, EISAName, Interrupt, Name, Package, Path, ResourceTemplate, IO};
use acpi_tables::fadt::{FADTBuilder, Flags};
use acpi_tables::gas::{AccessSize, AddressSpace, GAS};
use acpi_tables::rsdp::Rsdp;
use acpi_tables::sdt::Sdt;
use acpi_tables::xsdt::XSDT;
use acpi_tables::Aml;

/// Where the tables start (the RSDP).
pub const ACPI_BASE: u64 = 0xe_0000;
/// End of the area they may use (the end of the BIOS area).
pub const ACPI_END: u64 = 0x10_0000;
/// The FADT's sleep control register (8-bit, I/O space).
pub const SLEEP_CONTROL_PORT: u16 = 0x600;
/// The FADT's sleep status register.
pub const SLEEP_STATUS_PORT: u16 = 0x601;
/// SLP_TYP of S5 (soft-off), as the DSDT's `_S5_` says.
pub const S5_SLEEP_TYPE: u8 = 5;
/// SLP_TYP of S3 (suspend to RAM), as the DSDT's `_S3_` says.
pub const S3_SLEEP_TYPE: u8 = 1;
/// The PM1a event block: PM1_STS (16 bits) and PM1_EN (16 bits at +2).
pub const PM1A_EVT_PORT: u16 = 0x610;
/// Its length in bytes.
pub const PM1_EVT_LEN: u16 = 4;
/// The PM1a control block (16 bits).
pub const PM1A_CNT_PORT: u16 = 0x614;
/// Its length in bytes.
pub const PM1_CNT_LEN: u16 = 2;
/// The SCI's interrupt (ISA IRQ 9, as on a PC).
pub const SCI_IRQ: u16 = 9;
/// SLP_EN in the sleep control register.
const SLP_EN: u8 = 1 << 5;
const SLP_TYP_SHIFT: u8 = 2;
const SLP_TYP_MASK: u8 = 0x7;

/// Local APIC address the MADT reports (the xAPIC's MMIO page).
pub const LOCAL_APIC_BASE: u32 = 0xfee0_0000;

const OEM_ID: [u8; 6] = *b"FLTLNE";
const OEM_TABLE_ID: [u8; 8] = *b"FAULTLIN";
const OEM_REVISION: u32 = 1;

/// What a write to the sleep control register asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SleepRequest {
    /// SLP_EN with S5's SLP_TYP: power off.
    PowerOff,
    /// SLP_EN with S3's SLP_TYP (PM1 control only): suspend to RAM.
    Suspend,
    /// Anything else (no other sleep state is offered): ignored.
    None,
}

/// Decodes a write of `value` to the sleep control register.
pub fn sleep_control_write(value: u8) -> SleepRequest {
    let sleep_type = (value >> SLP_TYP_SHIFT) & SLP_TYP_MASK;
    if value & SLP_EN != 0 && sleep_type == S5_SLEEP_TYPE {
        SleepRequest::PowerOff
    } else {
        SleepRequest::None
    }
}

/// PM1_STS and PM1_EN bits (ACPI 6.5, 4.8.3.1).
pub mod pm1 {
    pub const RTC: u16 = 1 << 10;
    pub const WAK_STS: u16 = 1 << 15;
    /// The PM1_EN bits a guest may set (TMR_EN, GBL_EN, PWRBTN_EN,
    /// SLPBTN_EN, RTC_EN).
    pub const EN_MASK: u16 = 0x0721;
    /// PM1_CNT: SCI_EN (always set: no legacy mode to leave).
    pub const SCI_EN: u16 = 1 << 0;
    pub const SLP_TYP_SHIFT: u16 = 10;
    pub const SLP_EN: u16 = 1 << 13;
}

/// The PM1a event and control registers (fixed-hardware ACPI).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Pm1 {
    pub status: u16,
    pub enable: u16,
    /// PM1_CNT as last written (SLP_EN, write-only, never kept).
    pub control: u16,
}

impl Pm1 {
    /// Reads `size` bytes at `offset` of the event block (`control`
    /// false) or the control block.
    pub fn read(&self, control: bool, offset: u16, size: u8) -> u32 {
        let bytes = if control {
            u32::from(self.control | pm1::SCI_EN)
        } else {
            u32::from(self.status) | u32::from(self.enable) << 16
        };
        let value = bytes >> (8 * u32::from(offset));
        match size {
            1 => value & 0xff,
            2 => value & 0xffff,
            _ => value,
        }
    }

    /// Writes `size` bytes of `value` at `offset`: PM1_STS bits are
    /// cleared by writing ones, PM1_EN keeps its defined bits, and a
    /// control write with SLP_EN asks for the sleep state of its SLP_TYP.
    pub fn write(&mut self, control: bool, offset: u16, size: u8, value: u32) -> SleepRequest {
        let len = if control { PM1_CNT_LEN } else { PM1_EVT_LEN };
        let mut request = SleepRequest::None;
        for i in 0..u16::from(size) {
            let at = offset + i;
            if at >= len {
                break;
            }
            let byte = ((value >> (8 * u32::from(i))) & 0xff) as u16;
            let shift = 8 * (at % 2);
            let mask = 0xff << shift;
            match (control, at / 2) {
                (true, _) => {
                    let written = self.control & !mask | byte << shift;
                    self.control = written & !pm1::SLP_EN & !pm1::SCI_EN;
                    if written & pm1::SLP_EN != 0 {
                        let sleep_type = ((written >> pm1::SLP_TYP_SHIFT) & 7) as u8;
                        request = match sleep_type {
                            S5_SLEEP_TYPE => SleepRequest::PowerOff,
                            S3_SLEEP_TYPE => SleepRequest::Suspend,
                            _ => SleepRequest::None,
                        };
                    }
                }
                (false, 0) => self.status &= !(byte << shift),
                (false, _) => {
                    self.enable = (self.enable & !mask | byte << shift) & pm1::EN_MASK;
                }
            }
        }
        request
    }
}

/// Which tables [`build_tables`] builds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableSet {
    /// A DMAR table (`--iommu intel`).
    pub intel_iommu: bool,
    /// Fixed-hardware ACPI: PM1 blocks, the FACS, `_S3_`, the CMOS RTC
    /// (multiboot kernels).
    pub legacy_pm: bool,
}

/// The tables for `vcpus` vCPUs (APIC ids 0..vcpus), as the bytes to
/// place at [`ACPI_BASE`].
pub fn build_tables(vcpus: u32, set: TableSet) -> Vec<u8> {
    let mut image = Image::default();
    let rsdp_at = image.reserve(Rsdp::len());
    let facs = set.legacy_pm.then(|| image.place_aligned(&facs(), 64));
    debug_assert!(facs.is_none_or(|at| at == FACS_GPA));
    let dsdt = image.place(&dsdt(set.legacy_pm));
    let fadt = image.place(&aml_bytes(&fadt(dsdt, facs).finalize()));
    let madt = image.place(&madt(vcpus));
    let mut xsdt = XSDT::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    xsdt.add_entry(fadt);
    xsdt.add_entry(madt);
    if set.intel_iommu {
        xsdt.add_entry(image.place(&dmar()));
    }
    let xsdt = image.place(&aml_bytes(&xsdt));
    image.write(rsdp_at, &aml_bytes(&Rsdp::new(OEM_ID, xsdt)));
    image.bytes
}

/// Tables laid out one after the other, 16-byte aligned.
#[derive(Default)]
struct Image {
    bytes: Vec<u8>,
}

impl Image {
    fn reserve(&mut self, len: usize) -> usize {
        self.reserve_aligned(len, 16)
    }

    fn reserve_aligned(&mut self, len: usize, align: usize) -> usize {
        let at = self.bytes.len().next_multiple_of(align);
        self.bytes.resize(at + len, 0);
        at
    }

    /// Appends `table`; returns its guest-physical address.
    fn place(&mut self, table: &[u8]) -> u64 {
        self.place_aligned(table, 16)
    }

    /// Appends `table` at a multiple of `align` (of [`ACPI_BASE`]).
    fn place_aligned(&mut self, table: &[u8], align: usize) -> u64 {
        let at = self.reserve_aligned(table.len(), align);
        self.write(at, table);
        ACPI_BASE + at as u64
    }

    fn write(&mut self, at: usize, bytes: &[u8]) {
        self.bytes[at..at + bytes.len()].copy_from_slice(bytes);
    }
}

fn aml_bytes(table: &dyn Aml) -> Vec<u8> {
    let mut bytes = Vec::new();
    table.to_aml_bytes(&mut bytes);
    bytes
}

/// The FACS's length, and where its firmware waking vector and its
/// 64-bit waking vector are (ACPI 6.5, 5.2.10).
pub const FACS_LEN: usize = 64;
/// Where the FACS is (the first 64-byte boundary after the RSDP), which
/// the platform's resume path reads as firmware does.
pub const FACS_GPA: u64 = ACPI_BASE + 64;
pub const FACS_WAKING_VECTOR: u64 = 12;
pub const FACS_X_WAKING_VECTOR: u64 = 24;

/// The Firmware ACPI Control Structure: no hardware signature, no
/// global lock owner, no S4BIOS, no 64-bit wake (the OS's waking vector
/// is entered in real mode).
fn facs() -> Vec<u8> {
    let mut facs = vec![0u8; FACS_LEN];
    facs[..4].copy_from_slice(b"FACS");
    facs[4..8].copy_from_slice(&(FACS_LEN as u32).to_le_bytes());
    // Version (offset 32): 2.
    facs[32] = 2;
    facs
}

fn dsdt(legacy_pm: bool) -> Vec<u8> {
    let mut dsdt = Sdt::new(*b"DSDT", 36, 6, OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    let s5 = Name::new(
        Path::new("_S5_"),
        &Package::new(vec![&S5_SLEEP_TYPE, &0u8, &0u8, &0u8]),
    );
    dsdt.append_slice(&aml_bytes(&s5));
    if legacy_pm {
        let s3 = Name::new(
            Path::new("_S3_"),
            &Package::new(vec![&S3_SLEEP_TYPE, &S3_SLEEP_TYPE, &0u8, &0u8]),
        );
        dsdt.append_slice(&aml_bytes(&s3));
    }
    dsdt.append_slice(&com1());
    dsdt.as_slice().to_vec()
}

/// COM1 as ACPI describes a PC's serial port (`PNP0501`, its eight ports
/// and IRQ 4, edge-triggered, active high), as cloud-hypervisor's DSDT
/// does. An OS without a legacy PIC (this platform has none) maps ISA IRQs
/// only for devices the firmware describes: without this, Linux's 8250
/// driver cannot request IRQ 4 and its ttyS0 fails to open (EIO).
fn com1() -> Vec<u8> {
    let hid = Name::new(Path::new("_HID"), &EISAName::new("PNP0501"));
    let uid = Name::new(Path::new("_UID"), &acpi_tables::aml::ZERO);
    let ports = IO::new(abi::COM1_PORT, abi::COM1_PORT, 1, 8);
    let irq = Interrupt::new(true, true, false, false, u32::from(COM1_IRQ));
    let crs = Name::new(
        Path::new("_CRS"),
        &ResourceTemplate::new(vec![&ports, &irq]),
    );
    aml_bytes(&Device::new(Path::new("_SB_.COM1"), vec![&hid, &uid, &crs]))
}

/// The FADT; with a FACS (at `facs`), fixed-hardware ACPI with the PM1a
/// blocks, else hardware-reduced.
fn fadt(dsdt: u64, facs: Option<u64>) -> FADTBuilder {
    let io = |port: u16, bits: u8, size: AccessSize| {
        GAS::new(AddressSpace::SystemIo, bits, 0, size, port.into())
    };
    let io_byte = |port: u16| io(port, 8, AccessSize::ByteAccess);
    let mut fadt = FADTBuilder::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION).dsdt_64(dsdt);
    // The sleep registers in both models (an OS of the fixed-hardware
    // model uses PM1a_CNT; kernels written for this platform find S5
    // here either way).
    fadt.sleep_control_reg = io_byte(SLEEP_CONTROL_PORT);
    fadt.sleep_status_reg = io_byte(SLEEP_STATUS_PORT);
    if let Some(facs) = facs {
        // Below 4 GiB: the 32-bit field (X_FIRMWARE_CTRL must then be 0).
        fadt = fadt.firmware_ctrl_32(facs as u32);
        fadt.sci_int = SCI_IRQ.into();
        fadt.pm1a_evt_blk = u32::from(PM1A_EVT_PORT).into();
        fadt.pm1a_cnt_blk = u32::from(PM1A_CNT_PORT).into();
        fadt.pm1_evt_len = PM1_EVT_LEN as u8;
        fadt.pm1_cnt_len = PM1_CNT_LEN as u8;
        fadt.x_pm1a_evt_blk = io(PM1A_EVT_PORT, 32, AccessSize::WordAccess);
        fadt.x_pm1a_cnt_blk = io(PM1A_CNT_PORT, 16, AccessSize::WordAccess);
        fadt.century = super::rtc::CENTURY;
        return fadt;
    }
    fadt = fadt.flag(Flags::HwReducedAcpi);
    // IA-PC boot architecture flags (ACPI 6.5, table 5.11): no CMOS RTC at
    // ports 0x70/0x71 (nothing is there: they read all ones, which Linux's
    // rtc_cmos probe takes a second of polling to call broken).
    fadt.iapc_boot_arch = IAPC_BOOT_ARCH_CMOS_RTC_NOT_PRESENT.into();
    fadt
}

/// FADT IAPC_BOOT_ARCH bit 5: "CMOS RTC Not Present".
pub const IAPC_BOOT_ARCH_CMOS_RTC_NOT_PRESENT: u16 = 1 << 5;

/// MADT structure types (ACPI 6.5, 5.2.12).
mod madt_type {
    pub const IO_APIC: u8 = 1;
    pub const INTERRUPT_SOURCE_OVERRIDE: u8 = 2;
    pub const LOCAL_X2APIC: u8 = 9;
}

/// MPS INTI flags of an override: edge-triggered, active high.
const EDGE_ACTIVE_HIGH: u16 = 0b0101;

fn madt(vcpus: u32) -> Vec<u8> {
    let mut entries = Vec::new();
    for id in 0..vcpus {
        entries.extend([madt_type::LOCAL_X2APIC, 16, 0, 0]);
        entries.extend(id.to_le_bytes()); // x2APIC id
        entries.extend(1u32.to_le_bytes()); // enabled
        entries.extend(id.to_le_bytes()); // ACPI processor UID
    }
    entries.extend([madt_type::IO_APIC, 12, IOAPIC_ID, 0]);
    entries.extend((IOAPIC_BASE as u32).to_le_bytes());
    entries.extend(0u32.to_le_bytes()); // GSI base
    let mut source_override = |irq: u8, gsi: u32, flags: u16| {
        entries.extend([madt_type::INTERRUPT_SOURCE_OVERRIDE, 10, 0, irq]);
        entries.extend(gsi.to_le_bytes());
        entries.extend(flags.to_le_bytes());
    };
    // The PC convention (the timer's IRQ 0 on pin 2), though no PIT is
    // there to use it; conforming polarity and trigger.
    source_override(0, 2, 0);
    source_override(COM1_IRQ, u32::from(COM1_IRQ), EDGE_ACTIVE_HIGH);
    let mut madt = Sdt::new(*b"APIC", 44, 5, OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    madt.write_u32(36, LOCAL_APIC_BASE);
    // Flags: no PCAT_COMPAT (bit 0): no 8259s to disable.
    madt.write_u32(40, 0);
    madt.append_slice(&entries);
    madt.as_slice().to_vec()
}

/// The IOAPIC's source id in the DMAR's device scope: bus 0xff,
/// device 0, function 0 (QEMU's q35 pseudo-bus for platform devices).
pub const IOAPIC_SOURCE_ID: u16 = 0xff00;

/// The DMA Remapping table (VT-d spec, 8.1-8.3).
fn dmar() -> Vec<u8> {
    const INTR_REMAP: u8 = 1 << 0;
    const X2APIC_OPT_OUT: u8 = 1 << 1;
    const DRHD: u16 = 0;
    const INCLUDE_PCI_ALL: u8 = 1;
    const SCOPE_IOAPIC: u8 = 3;
    let mut dmar = Sdt::new(*b"DMAR", 48, 1, OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    // Host address width - 1, flags; 10 reserved bytes follow.
    dmar.write_u8(36, 38);
    dmar.write_u8(37, INTR_REMAP | X2APIC_OPT_OUT);
    let scope = [
        SCOPE_IOAPIC,
        8,
        0,
        0,
        IOAPIC_ID,
        (IOAPIC_SOURCE_ID >> 8) as u8,
        ((IOAPIC_SOURCE_ID >> 3) & 0x1f) as u8,
        (IOAPIC_SOURCE_ID & 7) as u8,
    ];
    let mut drhd = Vec::new();
    drhd.extend(DRHD.to_le_bytes());
    drhd.extend(((16 + scope.len()) as u16).to_le_bytes());
    drhd.extend([INCLUDE_PCI_ALL, 0]);
    drhd.extend(0u16.to_le_bytes()); // segment
    drhd.extend(super::vtd::VTD_BASE.to_le_bytes());
    drhd.extend(scope);
    dmar.append_slice(&drhd);
    dmar.as_slice().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table at `gpa` in `image`, its checksum and length checked.
    fn table(image: &[u8], gpa: u64, signature: &[u8; 4]) -> Vec<u8> {
        let at = (gpa - ACPI_BASE) as usize;
        assert_eq!(&image[at..at + 4], signature);
        let len = u32::from_le_bytes(image[at + 4..at + 8].try_into().unwrap()) as usize;
        let table = &image[at..at + len];
        assert_eq!(
            sum(table),
            0,
            "{} checksum",
            String::from_utf8_lossy(signature)
        );
        table.to_vec()
    }

    fn sum(bytes: &[u8]) -> u8 {
        bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b))
    }

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    fn u64_at(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
    }

    #[test]
    fn tables_parse_back_with_valid_checksums() {
        let image = build_tables(4, TableSet::default());
        assert!(ACPI_BASE + image.len() as u64 <= ACPI_END);
        // RSDP: signature, both checksums, revision 2.
        assert_eq!(&image[..8], b"RSD PTR ");
        assert_eq!(sum(&image[..20]), 0);
        assert_eq!(sum(&image[..36]), 0);
        assert_eq!(image[15], 2);
        let xsdt = table(&image, u64_at(&image, 24), b"XSDT");
        let entries: Vec<u64> = (36..xsdt.len())
            .step_by(8)
            .map(|i| u64_at(&xsdt, i))
            .collect();
        assert_eq!(entries.len(), 2);
        let fadt = table(&image, entries[0], b"FACP");
        let madt = table(&image, entries[1], b"APIC");

        // FADT: hardware-reduced, sleep registers in I/O space, the DSDT.
        assert_ne!(u32_at(&fadt, 112) & (1 << 20), 0, "HW_REDUCED_ACPI");
        // IAPC_BOOT_ARCH (offset 109): no CMOS RTC.
        assert_eq!(
            u16::from_le_bytes([fadt[109], fadt[110]]),
            IAPC_BOOT_ARCH_CMOS_RTC_NOT_PRESENT
        );
        let gas = |at: usize| (fadt[at], fadt[at + 1], u64_at(&fadt, at + 4));
        assert_eq!(gas(244), (1, 8, u64::from(SLEEP_CONTROL_PORT)));
        assert_eq!(gas(256), (1, 8, u64::from(SLEEP_STATUS_PORT)));
        let dsdt = table(&image, u64_at(&fadt, 140), b"DSDT");
        // Name(_S5_, Package(4) { 5, Zero, Zero, Zero }).
        let aml = &dsdt[36..];
        assert_eq!(
            aml[..13],
            [0x08, b'_', b'S', b'5', b'_', 0x12, 0x07, 0x04, 0x0a, 5, 0, 0, 0]
        );
        // Then Device (\_SB.COM1): _HID EISAID("PNP0501"), _CRS with
        // IO (Decode16, 0x3f8, 0x3f8, 1, 8) and Interrupt (consumer, edge,
        // active high, exclusive) { 4 }.
        let com1 = &aml[13..];
        assert_eq!(com1[..2], [0x5b, 0x82], "DeviceOp");
        let has = |needle: &[u8]| com1.windows(needle.len()).any(|w| w == needle);
        assert!(has(b"COM1"));
        assert!(has(&[0x0c, 0x41, 0xd0, 0x05, 0x01]), "EISAID PNP0501");
        assert!(has(&[0x47, 1, 0xf8, 0x03, 0xf8, 0x03, 1, 8]), "IO");
        assert!(has(&[0x89, 6, 0, 0b0011, 1, 4, 0, 0, 0]), "IRQ 4");

        // MADT: the LAPIC address, no PCAT_COMPAT, then the structures.
        assert_eq!(u32_at(&madt, 36), LOCAL_APIC_BASE);
        assert_eq!(u32_at(&madt, 40) & 1, 0);
        let mut at = 44;
        let mut x2apic_ids = Vec::new();
        let mut ioapics = Vec::new();
        let mut overrides = Vec::new();
        while at < madt.len() {
            let (kind, len) = (madt[at], madt[at + 1] as usize);
            let s = &madt[at..at + len];
            match kind {
                9 => {
                    assert_eq!(u32_at(s, 8), 1, "enabled");
                    x2apic_ids.push(u32_at(s, 4));
                }
                1 => ioapics.push((s[2], u32_at(s, 4), u32_at(s, 8))),
                2 => overrides.push((s[3], u32_at(s, 4), u16::from_le_bytes([s[8], s[9]]))),
                other => panic!("unexpected MADT structure {other}"),
            }
            at += len;
        }
        assert_eq!(at, madt.len());
        assert_eq!(x2apic_ids, [0, 1, 2, 3]);
        assert_eq!(ioapics, [(0, 0xfec0_0000, 0)]);
        assert_eq!(overrides, [(0, 2, 0), (4, 4, 5)]);
    }

    #[test]
    fn the_dmar_table_names_the_vtd_unit_only_with_the_iommu() {
        let image = build_tables(
            2,
            TableSet {
                intel_iommu: true,
                legacy_pm: false,
            },
        );
        let xsdt = table(&image, u64_at(&image, 24), b"XSDT");
        assert_eq!(xsdt.len(), 36 + 3 * 8);
        let dmar = table(&image, u64_at(&xsdt, 36 + 16), b"DMAR");
        assert_eq!(
            (dmar[36], dmar[37]),
            (38, 0b11),
            "width 39, INTR_REMAP, x2APIC opt-out"
        );
        let drhd = &dmar[48..];
        assert_eq!(u16::from_le_bytes([drhd[0], drhd[1]]), 0, "DRHD");
        assert_eq!(u16::from_le_bytes([drhd[2], drhd[3]]) as usize, drhd.len());
        assert_eq!(drhd[4] & 1, 1, "INCLUDE_PCI_ALL");
        assert_eq!(u64_at(drhd, 8), crate::devices::vtd::VTD_BASE);
        // The IOAPIC's scope: type 3, id 0, bus 0xff, path 00.0.
        assert_eq!(&drhd[16..], &[3, 8, 0, 0, IOAPIC_ID, 0xff, 0, 0]);
        let plain = build_tables(2, TableSet::default());
        let xsdt = table(&plain, u64_at(&plain, 24), b"XSDT");
        assert_eq!(xsdt.len(), 36 + 2 * 8, "no DMAR without the IOMMU");
    }

    #[test]
    fn only_s5_with_slp_en_powers_off() {
        assert_eq!(
            sleep_control_write((5 << 2) | (1 << 5)),
            SleepRequest::PowerOff
        );
        assert_eq!(sleep_control_write(5 << 2), SleepRequest::None);
        assert_eq!(sleep_control_write((3 << 2) | (1 << 5)), SleepRequest::None);
    }

    #[test]
    fn legacy_pm_tables_have_the_facs_the_pm1_blocks_and_s3() {
        let set = TableSet {
            intel_iommu: false,
            legacy_pm: true,
        };
        let image = build_tables(1, set);
        let xsdt = table(&image, u64_at(&image, 24), b"XSDT");
        let fadt = table(&image, u64_at(&xsdt, 36), b"FACP");
        assert_eq!(u32_at(&fadt, 112) & (1 << 20), 0, "not hardware-reduced");
        // FIRMWARE_CTRL (36) and X_FIRMWARE_CTRL (132): the 32-bit one.
        let facs_at = u64::from(u32_at(&fadt, 36));
        assert_eq!(u64_at(&fadt, 132), 0);
        assert_eq!(facs_at % 64, 0, "64-byte aligned");
        let at = (facs_at - ACPI_BASE) as usize;
        let facs = &image[at..at + FACS_LEN];
        assert_eq!(&facs[..4], b"FACS");
        assert_eq!(u32_at(facs, 4) as usize, FACS_LEN);
        assert_eq!(u32_at(facs, FACS_WAKING_VECTOR as usize), 0);
        // SCI_INT, PM1a_EVT_BLK, PM1a_CNT_BLK, the lengths, the century.
        assert_eq!(u16::from_le_bytes([fadt[46], fadt[47]]), SCI_IRQ);
        assert_eq!(u32_at(&fadt, 56), u32::from(PM1A_EVT_PORT));
        assert_eq!(u32_at(&fadt, 64), u32::from(PM1A_CNT_PORT));
        assert_eq!((fadt[88], fadt[89]), (4, 2));
        assert_eq!(fadt[108], crate::devices::rtc::CENTURY);
        assert_eq!(u16::from_le_bytes([fadt[109], fadt[110]]), 0, "CMOS RTC");
        let dsdt = table(&image, u64_at(&fadt, 140), b"DSDT");
        let s3 = [
            0x08, b'_', b'S', b'3', b'_', 0x12, 0x06, 0x04, 0x01, 0x01, 0, 0,
        ];
        assert!(dsdt.windows(s3.len()).any(|w| w == s3), "_S3_");
        let plain = build_tables(1, TableSet::default());
        assert!(!plain.windows(4).any(|w| w == b"FACS"));
        assert!(!plain.windows(4).any(|w| w == b"_S3_"));
    }

    #[test]
    fn pm1_status_clears_by_ones_and_slp_en_asks_for_s3_or_s5() {
        let mut pm = Pm1 {
            status: pm1::WAK_STS | pm1::RTC,
            ..Pm1::default()
        };
        // The guest enables RTC_EN with a 16-bit write at +2.
        assert_eq!(pm.write(false, 2, 2, 0x400), SleepRequest::None);
        assert_eq!(pm.read(false, 0, 4), 0x0400_8400);
        assert_eq!(
            pm.write(false, 0, 2, u32::from(pm1::RTC)),
            SleepRequest::None
        );
        assert_eq!(pm.read(false, 0, 2), u32::from(pm1::WAK_STS));
        assert_eq!(pm.read(false, 1, 1), 0x80);
        // SCI_EN reads as set; SLP_EN is write-only.
        assert_eq!(pm.read(true, 0, 2), 1);
        assert_eq!(pm.write(true, 0, 2, 0x2400), SleepRequest::Suspend);
        assert_eq!(pm.read(true, 0, 2), 0x0401);
        assert_eq!(pm.write(true, 1, 1, 0x34), SleepRequest::PowerOff);
        assert_eq!(pm.write(true, 0, 2, 0x0c00), SleepRequest::None);
        assert_eq!(pm.write(true, 0, 2, 0x2c00), SleepRequest::None, "type 3");
    }

    #[test]
    fn tables_are_deterministic() {
        assert_eq!(
            build_tables(2, TableSet::default()),
            build_tables(2, TableSet::default())
        );
    }
}
