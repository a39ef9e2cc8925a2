//! An Intel VT-d DMA-remapping unit (Intel VT-d specification, rev. 4,
//! chapters 3, 5, 6, 7, 9, 10), at [`VTD_BASE`] as on QEMU's q35 machine,
//! attached with `--iommu intel`. What it models:
//!
//! - registers (chapter 10): VER (1.0), CAP (SAGAW 39-bit only, MGAW 39,
//!   2 MiB and 1 GiB second-level pages, 16-bit domain ids, page-selective
//!   invalidation, one fault-recording register), ECAP (queued
//!   invalidation, interrupt remapping, pass-through; no extended interrupt
//!   mode, no device TLB), GCMD/GSTS (translation enable, set root table
//!   pointer, queued invalidation enable, interrupt remapping enable, set
//!   interrupt remapping table pointer, compatibility format interrupts;
//!   write-buffer flush and fault log are not offered and ignored), RTADDR,
//!   CCMD and the IOTLB registers (invalidations complete at once),
//!   FSTS/FECTL/FEDATA/FEADDR, the fault-recording register, the
//!   invalidation queue (IQH, IQT, IQA, ICS, IECTL/IEDATA/IEADDR) and IRTA;
//! - DMA remapping of requests without PASID (legacy-mode root table):
//!   root entry → context entry → 3-level second-level page table, with
//!   2 MiB / 1 GiB leaves, pass-through context entries, read and write
//!   permissions ([`Vtd::translate`]);
//! - interrupt remapping ([`Vtd::remap`]): remappable-format MSIs and
//!   IOAPIC redirection entries looked up in the interrupt remapping
//!   table (xAPIC mode: the IRTE's destination bits 15:8), source-id
//!   verification of PCI requests (SVT 1 and 2); compatibility-format
//!   interrupts pass only while CFIS is set;
//! - fault reporting (section 7.1): a failed translation or interrupt
//!   request whose context entry or IRTE does not disable fault
//!   reporting (FPD) is recorded in the fault-recording register (FSTS.PPF,
//!   or FSTS.PFO when the register is already full) and raises the fault
//!   event interrupt unless FECTL masks it (then FECTL.IP is set).
//!
//! The unit keeps no caches (no context cache, IOTLB or interrupt entry
//! cache): every request walks the tables in guest memory, so every
//! invalidation is complete when issued. Interrupt requests from the
//! IOAPIC carry no source id and are not verified against the IRTE's,
//! as in QEMU (whose split-irqchip IOAPIC sends them without a requester
//! id); kvm-unit-tests' `intel_iommu` relies on it.

use super::GuestMemory;
use machine::vmx::{Ipi, IpiDest, IpiMode};

/// Guest-physical base of the registers (QEMU's q35 places its unit here).
pub const VTD_BASE: u64 = 0xfed9_0000;
/// Size of the register window.
pub const VTD_SIZE: u64 = 0x1000;

/// Register offsets (VT-d spec, chapter 10.4).
pub mod reg {
    pub const VER: u64 = 0x00;
    pub const CAP: u64 = 0x08;
    pub const ECAP: u64 = 0x10;
    pub const GCMD: u64 = 0x18;
    pub const GSTS: u64 = 0x1c;
    pub const RTADDR: u64 = 0x20;
    pub const CCMD: u64 = 0x28;
    pub const FSTS: u64 = 0x34;
    pub const FECTL: u64 = 0x38;
    pub const FEDATA: u64 = 0x3c;
    pub const FEADDR: u64 = 0x40;
    pub const FEUADDR: u64 = 0x44;
    pub const AFLOG: u64 = 0x58;
    pub const PMEN: u64 = 0x64;
    pub const IQH: u64 = 0x80;
    pub const IQT: u64 = 0x88;
    pub const IQA: u64 = 0x90;
    pub const ICS: u64 = 0x9c;
    pub const IECTL: u64 = 0xa0;
    pub const IEDATA: u64 = 0xa4;
    pub const IEADDR: u64 = 0xa8;
    pub const IEUADDR: u64 = 0xac;
    pub const IRTA: u64 = 0xb8;
    /// The IOTLB registers (ECAP.IRO = 0x20: at 0x200).
    pub const IVA: u64 = 0x200;
    pub const IOTLB: u64 = 0x208;
    /// The fault-recording register (CAP.FRO = 0x22: at 0x220), 128 bits.
    pub const FRCD_LO: u64 = 0x220;
    pub const FRCD_HI: u64 = 0x228;
}

/// GCMD / GSTS bits.
pub mod gcmd {
    pub const TE: u32 = 1 << 31;
    pub const SRTP: u32 = 1 << 30;
    pub const SFL: u32 = 1 << 29;
    pub const WBF: u32 = 1 << 27;
    pub const QIE: u32 = 1 << 26;
    pub const IRE: u32 = 1 << 25;
    pub const SIRTP: u32 = 1 << 24;
    pub const CFI: u32 = 1 << 23;
}

/// FSTS bits.
pub mod fsts {
    pub const PFO: u32 = 1 << 0;
    pub const PPF: u32 = 1 << 1;
    pub const IQE: u32 = 1 << 4;
}

/// FECTL / IECTL bits.
const CTL_IM: u32 = 1 << 31;
const CTL_IP: u32 = 1 << 30;

/// VER: architecture version 1.0.
pub const VERSION: u32 = 0x10;
/// CAP: ND = 6 (16-bit domain ids), SAGAW = 39-bit (bit 9), MGAW = 38
/// (39 bits), FRO = 0x22, SLLPS = 2 MiB and 1 GiB, PSI, NFR = 0 (one
/// fault-recording register), MAMV = 18.
pub const CAP: u64 =
    6 | (0b00010 << 8) | (38 << 16) | (0x22 << 24) | (0b11 << 34) | (1 << 39) | (18 << 48);
/// ECAP: QI, IR, PT, IRO = 0x20, MHMV = 0xf.
pub const ECAP: u64 = (1 << 1) | (1 << 3) | (1 << 6) | (0x20 << 8) | (0xf << 20);
/// Input addresses are 39 bits wide (3-level tables).
const ADDRESS_WIDTH: u32 = 39;

/// Why a request failed (VT-d spec, table 7-1 and 7-2: the fault reason
/// recorded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultReason {
    RootNotPresent = 0x1,
    ContextNotPresent = 0x2,
    /// An address width SAGAW does not offer, or a reserved translation
    /// type.
    ContextInvalid = 0x3,
    AddressBeyondWidth = 0x4,
    WriteDenied = 0x5,
    ReadDenied = 0x6,
    /// A table pointer outside guest memory.
    TableAccess = 0x7,
    RootTableAccess = 0x8,
    ContextTableAccess = 0x9,
    /// Reserved bits set in a second-level entry (a large page where
    /// SLLPS does not offer it).
    PagingEntryReserved = 0xc,
    /// A remappable request with reserved bits set.
    InterruptRequestReserved = 0x20,
    InterruptIndexBeyondTable = 0x21,
    IrteNotPresent = 0x22,
    IrteAccess = 0x23,
    IrteReserved = 0x24,
    CompatibilityBlocked = 0x25,
    SourceIdMismatch = 0x26,
}

/// What the guest can read of a failed request: the fault-recording
/// register's contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultRecord {
    pub source_id: u16,
    pub reason: FaultReason,
    /// The faulting page (DMA) or the interrupt index << 12 (interrupts).
    pub info: u64,
    /// A read request (T = 1); writes and interrupt requests record 0.
    pub read: bool,
}

/// An interrupt request in remappable format coming from the IOAPIC
/// (a redirection entry with bit 48 set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoApicRequest {
    /// The interrupt index (entry bits 63:49, and bit 11 as index bit 15).
    pub index: u16,
    /// The entry's vector and trigger mode (the IOAPIC's own EOI
    /// matching; the IRTE decides what is delivered).
    pub vector: u8,
    pub level: bool,
}

/// The unit's state.
#[derive(Debug, Clone, Default)]
pub struct Vtd {
    gsts: u32,
    rtaddr: u64,
    /// The root table in use (latched by SRTP).
    root_table: u64,
    ccmd: u64,
    fsts: u32,
    fectl: u32,
    fedata: u32,
    feaddr: u32,
    feuaddr: u32,
    aflog: u64,
    iqh: u64,
    iqt: u64,
    iqa: u64,
    ics: u32,
    iectl: u32,
    iedata: u32,
    ieaddr: u32,
    ieuaddr: u32,
    irta: u64,
    /// The interrupt remapping table in use (latched by SIRTP).
    ir_table: u64,
    iva: u64,
    iotlb: u64,
    /// The fault-recording register (low, high qword).
    frcd: (u64, u64),
    /// IQT moved while queued invalidation is on: descriptors wait.
    queue_pending: bool,
    /// Interrupts the unit raised itself (fault and invalidation events).
    events: Vec<Ipi>,
}

impl Vtd {
    pub fn new() -> Vtd {
        Vtd {
            fectl: CTL_IM,
            iectl: CTL_IM,
            ..Vtd::default()
        }
    }

    /// The register containing `offset`: (its offset, its width).
    fn register(offset: u64) -> Option<(u64, u8)> {
        use reg::*;
        const REGS: [(u64, u8); 27] = [
            (VER, 4),
            (CAP, 8),
            (ECAP, 8),
            (GCMD, 4),
            (GSTS, 4),
            (RTADDR, 8),
            (CCMD, 8),
            (FSTS, 4),
            (FECTL, 4),
            (FEDATA, 4),
            (FEADDR, 4),
            (FEUADDR, 4),
            (AFLOG, 8),
            (PMEN, 4),
            (IQH, 8),
            (IQT, 8),
            (IQA, 8),
            (ICS, 4),
            (IECTL, 4),
            (IEDATA, 4),
            (IEADDR, 4),
            (IEUADDR, 4),
            (IRTA, 8),
            (IVA, 8),
            (IOTLB, 8),
            (FRCD_LO, 8),
            (FRCD_HI, 8),
        ];
        REGS.iter()
            .copied()
            .find(|&(base, width)| offset >= base && offset < base + u64::from(width))
    }

    fn get(&self, base: u64) -> u64 {
        use reg::*;
        match base {
            VER => u64::from(VERSION),
            CAP => CAP_VALUE,
            ECAP => ECAP_VALUE,
            GSTS => u64::from(self.gsts),
            RTADDR => self.rtaddr,
            CCMD => self.ccmd,
            FSTS => u64::from(self.fsts),
            FECTL => u64::from(self.fectl),
            FEDATA => u64::from(self.fedata),
            FEADDR => u64::from(self.feaddr),
            FEUADDR => u64::from(self.feuaddr),
            AFLOG => self.aflog,
            IQH => self.iqh,
            IQT => self.iqt,
            IQA => self.iqa,
            ICS => u64::from(self.ics),
            IECTL => u64::from(self.iectl),
            IEDATA => u64::from(self.iedata),
            IEADDR => u64::from(self.ieaddr),
            IEUADDR => u64::from(self.ieuaddr),
            IRTA => self.irta,
            IVA => self.iva,
            IOTLB => self.iotlb,
            FRCD_LO => self.frcd.0,
            FRCD_HI => self.frcd.1,
            // GCMD reads as zero (write-only), PMEN as disabled.
            _ => 0,
        }
    }

    /// A read of `size` bytes at `offset` in the register window
    /// (reserved space reads zero).
    pub fn read(&self, offset: u64, size: u8) -> u64 {
        let Some((base, _)) = Self::register(offset) else {
            return 0;
        };
        let value = self.get(base) >> (8 * (offset - base));
        value & size_mask(size)
    }

    /// A write of `size` bytes at `offset`.
    pub fn write(&mut self, offset: u64, size: u8, value: u64) {
        let Some((base, width)) = Self::register(offset) else {
            return;
        };
        let shift = 8 * (offset - base);
        let mask = (size_mask(size) << shift) & size_mask(width);
        let bits = (value << shift) & mask;
        self.put(base, bits, mask);
    }

    /// A write of `bits` (only those in `mask`) to the register at `base`.
    fn put(&mut self, base: u64, bits: u64, mask: u64) {
        use reg::*;
        let merge = |old: u64| (old & !mask) | bits;
        match base {
            GCMD => self.command(bits as u32),
            RTADDR => self.rtaddr = merge(self.rtaddr) & !0x3ff,
            CCMD => {
                let v = merge(self.ccmd);
                // ICC: the (empty) context cache is invalidated at once;
                // CAIG reports the granularity asked for (CIRG).
                self.ccmd = if v & (1 << 63) != 0 {
                    (v & !(1 << 63) & !(3 << 59)) | (((v >> 61) & 3) << 59)
                } else {
                    v
                };
            }
            FSTS => {
                // PFO, IQE, ICE, ITE are write-1-to-clear; PPF follows
                // the fault-recording register.
                self.fsts &= !(bits as u32 & 0x71);
            }
            FECTL if mask as u32 & CTL_IM != 0 => {
                self.fectl = (self.fectl & CTL_IP) | (bits as u32 & CTL_IM);
                self.unmask_fault_event();
            }
            FEDATA => self.fedata = merge(u64::from(self.fedata)) as u32,
            FEADDR => self.feaddr = merge(u64::from(self.feaddr)) as u32 & !3,
            FEUADDR => self.feuaddr = merge(u64::from(self.feuaddr)) as u32,
            AFLOG => self.aflog = merge(self.aflog),
            IQT => {
                self.iqt = merge(self.iqt) & 0x7fff0;
                if self.gsts & gcmd::QIE != 0 {
                    self.queue_pending = true;
                }
            }
            IQA => self.iqa = merge(self.iqa) & !0xff8,
            ICS => self.ics &= !(bits as u32 & 1),
            IECTL => {
                let im = if mask as u32 & CTL_IM != 0 {
                    bits as u32 & CTL_IM
                } else {
                    self.iectl & CTL_IM
                };
                self.iectl = (self.iectl & CTL_IP) | im;
                if im == 0 && self.iectl & CTL_IP != 0 {
                    self.iectl &= !CTL_IP;
                    let message = msi_message(self.ieaddr, self.iedata);
                    self.events.extend(message);
                }
            }
            IEDATA => self.iedata = merge(u64::from(self.iedata)) as u32,
            IEADDR => self.ieaddr = merge(u64::from(self.ieaddr)) as u32 & !3,
            IEUADDR => self.ieuaddr = merge(u64::from(self.ieuaddr)) as u32,
            IRTA => self.irta = merge(self.irta) & !0x7f0,
            IVA => self.iva = merge(self.iva),
            IOTLB => {
                let v = merge(self.iotlb);
                // IVT: the (empty) IOTLB is invalidated at once; IAIG
                // reports the granularity asked for (IIRG).
                self.iotlb = if v & (1 << 63) != 0 {
                    (v & !(1 << 63) & !(3 << 57)) | (((v >> 60) & 3) << 57)
                } else {
                    v
                };
            }
            // F (bit 63) is write-1-to-clear.
            FRCD_HI if bits & (1 << 63) != 0 => {
                self.frcd = (0, 0);
                self.fsts &= !fsts::PPF;
            }
            // VER, CAP, ECAP, GSTS, IQH, FRCD_LO are read-only; PMEN's
            // protected regions are not offered.
            _ => {}
        }
    }

    /// A GCMD write: each control bit's new value; the one-shot bits
    /// (SRTP, SIRTP) latch their pointer.
    fn command(&mut self, value: u32) {
        let persistent = gcmd::TE | gcmd::QIE | gcmd::IRE | gcmd::CFI;
        let before = self.gsts;
        self.gsts = (self.gsts & !persistent) | (value & persistent);
        if value & gcmd::SRTP != 0 {
            self.root_table = self.rtaddr & !0xfff;
            self.gsts |= gcmd::SRTP;
        }
        if value & gcmd::SIRTP != 0 {
            self.ir_table = self.irta;
            self.gsts |= gcmd::SIRTP;
        }
        if value & gcmd::QIE != 0 && before & gcmd::QIE == 0 {
            // Enabling the queue starts it at its head, 0.
            self.iqh = 0;
        }
        if value & gcmd::IRE != 0 && self.gsts & gcmd::SIRTP == 0 {
            // Remapping without a table pointer: not enabled.
            self.gsts &= !gcmd::IRE;
        }
    }

    /// Global status bits (GSTS).
    pub fn status(&self) -> u32 {
        self.gsts
    }

    /// Whether IQT moved since the queue last ran ([`Vtd::run_queue`]).
    pub fn queue_pending(&self) -> bool {
        self.queue_pending
    }

    /// Whether the queue waits or events wait to be sent.
    pub fn has_work(&self) -> bool {
        self.queue_pending || !self.events.is_empty()
    }

    /// Runs the invalidation queue from IQH up to IQT (VT-d spec 6.5.2).
    /// Context-cache, IOTLB, device-TLB and interrupt-entry-cache
    /// invalidations complete at once (there are no caches); an
    /// invalidation wait descriptor writes its status (SW) and sets
    /// ICS.IWC, raising the completion event unless IECTL masks it (IF).
    /// An unknown descriptor, or a tail beyond the queue, stops the queue
    /// with FSTS.IQE, IQH at the descriptor.
    pub fn run_queue(&mut self, mem: &mut dyn GuestMemory) {
        self.queue_pending = false;
        if self.gsts & gcmd::QIE == 0 {
            return;
        }
        let base = self.iqa & !0xfff;
        let entries = 256u64 << (self.iqa & 7);
        if self.iqt >> 4 >= entries {
            self.fsts |= fsts::IQE;
            return;
        }
        while self.iqh != self.iqt && self.fsts & fsts::IQE == 0 {
            let mut raw = [0u8; 16];
            if !mem.read(base + self.iqh, &mut raw) {
                self.fsts |= fsts::IQE;
                break;
            }
            let lo = u64::from_le_bytes(raw[..8].try_into().unwrap());
            let hi = u64::from_le_bytes(raw[8..].try_into().unwrap());
            match lo & 0xf {
                // Context cache, IOTLB, device TLB, interrupt entry cache.
                1..=4 => {}
                5 => {
                    if lo & (1 << 5) != 0 {
                        let status = ((lo >> 32) as u32).to_le_bytes();
                        mem.write(hi & !3, &status);
                    }
                    if lo & (1 << 4) != 0 {
                        self.ics |= 1;
                        if self.iectl & CTL_IM == 0 {
                            self.events.extend(msi_message(self.ieaddr, self.iedata));
                        } else {
                            self.iectl |= CTL_IP;
                        }
                    }
                }
                _ => {
                    self.fsts |= fsts::IQE;
                    break;
                }
            }
            self.iqh = (self.iqh + 16) % (entries * 16);
        }
    }

    /// Translates the DMA address `iova` of a request by `source_id`
    /// (bus << 8 | devfn) to a guest-physical address: identity while
    /// translation is off, else through the root and context entries and
    /// the second-level tables (VT-d spec 3.4, 3.6, 9.1, 9.3, 9.8). A
    /// failure is recorded unless the context entry disables fault
    /// reporting.
    pub fn translate(
        &mut self,
        mem: &mut dyn GuestMemory,
        source_id: u16,
        iova: u64,
        write: bool,
    ) -> Result<u64, FaultReason> {
        if self.gsts & gcmd::TE == 0 {
            return Ok(iova);
        }
        let mut report = true;
        let result = self.walk(mem, source_id, iova, write, &mut report);
        if let Err(reason) = result {
            if report {
                self.record_fault(FaultRecord {
                    source_id,
                    reason,
                    info: iova & !0xfff,
                    read: !write,
                });
            }
        }
        result
    }

    fn walk(
        &mut self,
        mem: &mut dyn GuestMemory,
        source_id: u16,
        iova: u64,
        write: bool,
        report: &mut bool,
    ) -> Result<u64, FaultReason> {
        let bus = u64::from(source_id >> 8);
        let devfn = u64::from(source_id & 0xff);
        let root = read_u64(mem, self.root_table + bus * 16).ok_or(FaultReason::RootTableAccess)?;
        if root & 1 == 0 {
            return Err(FaultReason::RootNotPresent);
        }
        let context_at = (root & !0xfff) + devfn * 16;
        let lo = read_u64(mem, context_at).ok_or(FaultReason::ContextTableAccess)?;
        let hi = read_u64(mem, context_at + 8).ok_or(FaultReason::ContextTableAccess)?;
        if lo & 1 == 0 {
            return Err(FaultReason::ContextNotPresent);
        }
        *report = lo & 2 == 0;
        match (lo >> 2) & 3 {
            // Untranslated requests through the second-level tables (a
            // device TLB, type 1, is not offered: ECAP.DT = 0).
            0 => {}
            2 => return Ok(iova),
            _ => return Err(FaultReason::ContextInvalid),
        }
        // AW = 1: 39 bits, the one width SAGAW offers.
        if hi & 7 != 1 {
            return Err(FaultReason::ContextInvalid);
        }
        if iova >> ADDRESS_WIDTH != 0 {
            return Err(FaultReason::AddressBeyondWidth);
        }
        let mut table = lo & 0x000f_ffff_ffff_f000;
        for level in (1..=3u32).rev() {
            let shift = 12 + 9 * (level - 1);
            let index = (iova >> shift) & 0x1ff;
            let entry = read_u64(mem, table + index * 8).ok_or(FaultReason::TableAccess)?;
            let allowed = if write { entry & 2 } else { entry & 1 };
            if allowed == 0 {
                return Err(if write {
                    FaultReason::WriteDenied
                } else {
                    FaultReason::ReadDenied
                });
            }
            let address = entry & 0x000f_ffff_ffff_f000;
            let large = level > 1 && entry & (1 << 7) != 0;
            if level == 1 || large {
                let page = 1u64 << shift;
                if address & (page - 1) != 0 {
                    return Err(FaultReason::PagingEntryReserved);
                }
                return Ok(address | (iova & (page - 1)));
            }
            table = address;
        }
        unreachable!("the level-1 entry is a leaf")
    }

    /// Remaps an interrupt request: a PCI device's MSI write of `data`
    /// to `address` (`source_id` set), or the IOAPIC's (`None`), to the
    /// interrupt message the local APICs get (VT-d spec 5.1). `Ok(None)`:
    /// nothing to deliver (a delivery mode the platform does not carry).
    pub fn remap(
        &mut self,
        mem: &mut dyn GuestMemory,
        source_id: Option<u16>,
        address: u64,
        data: u32,
    ) -> Result<Option<Ipi>, FaultReason> {
        let remappable = address & (1 << 4) != 0;
        if self.gsts & gcmd::IRE == 0 {
            return Ok(msi_message(address as u32, data));
        }
        if !remappable {
            if self.gsts & gcmd::CFI != 0 {
                return Ok(msi_message(address as u32, data));
            }
            return self.interrupt_fault(source_id, 0, FaultReason::CompatibilityBlocked, true);
        }
        let mut index = ((address >> 5) & 0x7fff) as u32 | (((address >> 2) & 1) as u32) << 15;
        if address & (1 << 3) != 0 {
            // SHV: the subhandle in the data's low 16 bits.
            index = index.wrapping_add(data & 0xffff) & 0xffff;
        }
        self.remap_index(mem, source_id, index)
    }

    /// Remaps an IOAPIC redirection entry in remappable format.
    pub fn remap_ioapic(
        &mut self,
        mem: &mut dyn GuestMemory,
        request: IoApicRequest,
    ) -> Result<Option<Ipi>, FaultReason> {
        // The message the IOAPIC sends for such an entry: the index in
        // the address (bits 19:5, bit 2 for index bit 15), the format bit,
        // the entry's vector and trigger mode in the data.
        let index = u32::from(request.index);
        let address = 0xfee0_0000 | ((index & 0x7fff) << 5) | (1 << 4) | ((index >> 15) << 2);
        let data = u32::from(request.vector) | (u32::from(request.level) << 15);
        self.remap(mem, None, u64::from(address), data)
    }

    fn remap_index(
        &mut self,
        mem: &mut dyn GuestMemory,
        source_id: Option<u16>,
        index: u32,
    ) -> Result<Option<Ipi>, FaultReason> {
        let entries = 2u64 << (self.ir_table & 0xf);
        if u64::from(index) >= entries {
            return self.interrupt_fault(
                source_id,
                index,
                FaultReason::InterruptIndexBeyondTable,
                true,
            );
        }
        let at = (self.ir_table & !0xfff) + u64::from(index) * 16;
        let (Some(lo), Some(hi)) = (read_u64(mem, at), read_u64(mem, at + 8)) else {
            return self.interrupt_fault(source_id, index, FaultReason::IrteAccess, true);
        };
        let report = lo & 2 == 0;
        if lo & 1 == 0 {
            return self.interrupt_fault(source_id, index, FaultReason::IrteNotPresent, report);
        }
        // IM (posted interrupts) is not offered; reserved bits 14:12, 31:24.
        if lo & (1 << 15) != 0 || lo & 0xff00_7000 != 0 {
            return self.interrupt_fault(source_id, index, FaultReason::IrteReserved, report);
        }
        if let Some(sid) = source_id {
            let expected = (hi & 0xffff) as u16;
            let verified = match (hi >> 18) & 3 {
                0 => true,
                1 => {
                    // SQ: which function-number bits to ignore.
                    let ignore: u16 = [0, 0b100, 0b110, 0b111][((hi >> 16) & 3) as usize];
                    sid & !ignore == expected & !ignore
                }
                2 => {
                    let bus = sid >> 8;
                    (expected >> 8..=expected & 0xff).contains(&bus)
                }
                _ => false,
            };
            if !verified {
                return self.interrupt_fault(
                    source_id,
                    index,
                    FaultReason::SourceIdMismatch,
                    report,
                );
            }
        }
        let dest = ((lo >> 40) & 0xff) as u32;
        let logical = lo & (1 << 2) != 0;
        let mode = match (lo >> 5) & 7 {
            0 => IpiMode::Fixed,
            1 => IpiMode::LowestPriority,
            2 => IpiMode::Smi,
            4 => IpiMode::Nmi,
            5 => IpiMode::Init,
            _ => return Ok(None),
        };
        Ok(Some(Ipi {
            dest: apic_destination(dest, logical),
            vector: ((lo >> 16) & 0xff) as u8,
            mode,
            level_assert: true,
            trigger_level: lo & (1 << 4) != 0,
        }))
    }

    fn interrupt_fault(
        &mut self,
        source_id: Option<u16>,
        index: u32,
        reason: FaultReason,
        report: bool,
    ) -> Result<Option<Ipi>, FaultReason> {
        if report {
            self.record_fault(FaultRecord {
                source_id: source_id.unwrap_or(0),
                reason,
                info: u64::from(index) << 48,
                read: false,
            });
        }
        Err(reason)
    }

    /// Records a fault (VT-d spec 7.2.1): in the fault-recording register
    /// if it is free, else FSTS.PFO; a new record raises the fault event
    /// (FECTL.IM clear) or sets FECTL.IP.
    pub fn record_fault(&mut self, fault: FaultRecord) {
        if self.frcd.1 & (1 << 63) != 0 {
            self.fsts |= fsts::PFO;
            return;
        }
        self.frcd = (
            fault.info,
            u64::from(fault.source_id)
                | ((fault.reason as u64) << 32)
                | (u64::from(fault.read) << 62)
                | (1 << 63),
        );
        // PPF, FRI = 0 (the one register).
        self.fsts = (self.fsts & !0xff00) | fsts::PPF;
        if self.fectl & CTL_IM == 0 {
            self.events.extend(msi_message(self.feaddr, self.fedata));
        } else {
            self.fectl |= CTL_IP;
        }
    }

    /// FECTL.IM cleared with an event pending: it is sent now.
    fn unmask_fault_event(&mut self) {
        if self.fectl & CTL_IM == 0 && self.fectl & CTL_IP != 0 {
            self.fectl &= !CTL_IP;
            self.events.extend(msi_message(self.feaddr, self.fedata));
        }
    }

    /// The recorded fault, if the fault-recording register holds one.
    pub fn fault(&self) -> Option<FaultRecord> {
        (self.frcd.1 & (1 << 63) != 0).then(|| FaultRecord {
            source_id: self.frcd.1 as u16,
            reason: reason_from(((self.frcd.1 >> 32) & 0xff) as u8),
            info: self.frcd.0,
            read: self.frcd.1 & (1 << 62) != 0,
        })
    }

    /// The fault and invalidation-completion events raised since the
    /// last call (compatibility-format messages, not remapped).
    pub fn take_events(&mut self) -> Vec<Ipi> {
        std::mem::take(&mut self.events)
    }
}

const CAP_VALUE: u64 = CAP;
const ECAP_VALUE: u64 = ECAP;

fn reason_from(code: u8) -> FaultReason {
    use FaultReason::*;
    [
        RootNotPresent,
        ContextNotPresent,
        ContextInvalid,
        AddressBeyondWidth,
        WriteDenied,
        ReadDenied,
        TableAccess,
        RootTableAccess,
        ContextTableAccess,
        PagingEntryReserved,
        InterruptRequestReserved,
        InterruptIndexBeyondTable,
        IrteNotPresent,
        IrteAccess,
        IrteReserved,
        CompatibilityBlocked,
        SourceIdMismatch,
    ]
    .into_iter()
    .find(|r| *r as u8 == code)
    .unwrap_or(InterruptRequestReserved)
}

fn read_u64(mem: &mut dyn GuestMemory, gpa: u64) -> Option<u64> {
    let mut raw = [0u8; 8];
    mem.read(gpa, &mut raw).then(|| u64::from_le_bytes(raw))
}

fn size_mask(size: u8) -> u64 {
    if size >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * u32::from(size))) - 1
    }
}

/// An xAPIC destination: 0xff physical is a broadcast.
fn apic_destination(dest: u32, logical: bool) -> IpiDest {
    if logical {
        IpiDest::Logical(dest)
    } else if dest == 0xff {
        IpiDest::Physical(u32::MAX)
    } else {
        IpiDest::Physical(dest)
    }
}

/// A compatibility-format MSI (Intel SDM Vol. 3A, 11.11: address
/// 0xfeeDD00x with the destination in bits 19:12 and the destination mode
/// in bit 2; data with the vector, delivery mode and trigger mode) as the
/// message the local APICs get; `None` for a write outside the interrupt
/// range or a delivery mode the platform does not carry (ExtINT).
pub fn msi_message(address: u32, data: u32) -> Option<Ipi> {
    if address >> 20 != 0xfee {
        return None;
    }
    let mode = match (data >> 8) & 7 {
        0 => IpiMode::Fixed,
        1 => IpiMode::LowestPriority,
        2 => IpiMode::Smi,
        4 => IpiMode::Nmi,
        5 => IpiMode::Init,
        _ => return None,
    };
    Some(Ipi {
        dest: apic_destination((address >> 12) & 0xff, address & (1 << 2) != 0),
        vector: data as u8,
        mode,
        level_assert: true,
        trigger_level: data & (1 << 15) != 0,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Guest memory for the tests: 4 MiB from gpa 0.
    pub(crate) struct TestMemory(pub Vec<u8>);

    impl TestMemory {
        pub(crate) fn new() -> Self {
            TestMemory(vec![0; 4 << 20])
        }

        pub(crate) fn put(&mut self, gpa: u64, value: u64) {
            self.write(gpa, &value.to_le_bytes());
        }
    }

    impl GuestMemory for TestMemory {
        fn read(&mut self, gpa: u64, buf: &mut [u8]) -> bool {
            let at = gpa as usize;
            match self.0.get(at..at + buf.len()) {
                Some(src) => {
                    buf.copy_from_slice(src);
                    true
                }
                None => false,
            }
        }

        fn write(&mut self, gpa: u64, bytes: &[u8]) -> bool {
            let at = gpa as usize;
            match self.0.get_mut(at..at + bytes.len()) {
                Some(dst) => {
                    dst.copy_from_slice(bytes);
                    true
                }
                None => false,
            }
        }
    }

    const ROOT: u64 = 0x10_000;
    const CONTEXT: u64 = 0x11_000;
    const L3: u64 = 0x12_000;
    const L2: u64 = 0x13_000;
    const L1: u64 = 0x14_000;
    const IRT: u64 = 0x20_000;
    const SID: u16 = 0x0018;

    /// A unit with the root table at ROOT and translation on.
    fn enabled() -> Vtd {
        let mut vtd = Vtd::new();
        vtd.write(reg::RTADDR, 8, ROOT);
        vtd.write(reg::GCMD, 4, u64::from(gcmd::SRTP));
        assert_ne!(vtd.read(reg::GSTS, 4) as u32 & gcmd::SRTP, 0, "RTPS");
        let status = vtd.read(reg::GSTS, 4);
        vtd.write(reg::GCMD, 4, status | u64::from(gcmd::TE));
        assert_ne!(vtd.status() & gcmd::TE, 0);
        vtd
    }

    /// Bus 0's root entry, SID's context entry (fault reporting on iff
    /// `report`), and IOVA 0x5000 → 0x30_0000 read/write.
    fn tables(mem: &mut TestMemory, report: bool) {
        mem.put(ROOT, CONTEXT | 1);
        mem.put(
            CONTEXT + u64::from(SID) * 16,
            L3 | 1 | (u64::from(!report) << 1),
        );
        mem.put(CONTEXT + u64::from(SID) * 16 + 8, 1 | (7 << 8));
        mem.put(L3, L2 | 3);
        mem.put(L2, L1 | 3);
        mem.put(L1 + 5 * 8, 0x30_0000 | 3);
    }

    #[test]
    fn registers_read_as_the_capabilities_say() {
        let vtd = Vtd::new();
        assert_eq!(vtd.read(reg::VER, 4), 0x10);
        let cap = vtd.read(reg::CAP, 8);
        assert_eq!(cap & (0x1f << 8), 1 << 9, "SAGAW: 39-bit only");
        assert_eq!((cap >> 34) & 3, 3, "SLLPS: 2 MiB and 1 GiB");
        assert_eq!((cap >> 16) & 0x3f, 38, "MGAW");
        assert_eq!(((cap >> 24) & 0x3ff) * 16, reg::FRCD_LO, "FRO");
        assert_eq!(vtd.read(reg::CAP + 4, 4), cap >> 32, "high half");
        let ecap = vtd.read(reg::ECAP, 8);
        assert_eq!(ecap & 0b1010, 0b1010, "QI, IR");
        assert_eq!(((ecap >> 8) & 0x3ff) * 16, reg::IVA, "IRO");
        assert_eq!(vtd.read(reg::FSTS, 4), 0);
        assert_eq!(
            vtd.read(reg::FECTL, 4),
            u64::from(CTL_IM),
            "masked at reset"
        );
        assert_eq!(vtd.read(reg::GCMD, 4), 0, "write-only");
    }

    #[test]
    fn gcmd_sets_and_clears_status_and_one_shots_latch_their_pointers() {
        let mut vtd = Vtd::new();
        vtd.write(reg::GCMD, 4, u64::from(gcmd::QIE));
        assert_eq!(vtd.status(), gcmd::QIE);
        // IRE without a table pointer does not take.
        vtd.write(reg::GCMD, 4, u64::from(gcmd::QIE | gcmd::IRE));
        assert_eq!(vtd.status(), gcmd::QIE);
        vtd.write(reg::IRTA, 8, IRT | 0xf);
        vtd.write(reg::GCMD, 4, u64::from(gcmd::QIE | gcmd::SIRTP));
        vtd.write(reg::GCMD, 4, u64::from(vtd.status() | gcmd::IRE));
        assert_eq!(vtd.status(), gcmd::QIE | gcmd::SIRTP | gcmd::IRE);
        // Written as two halves, a 64-bit register holds both.
        vtd.write(reg::RTADDR, 4, 0x1234_5000);
        vtd.write(reg::RTADDR + 4, 4, 0x1);
        assert_eq!(vtd.read(reg::RTADDR, 8), 0x1_1234_5000);
        vtd.write(reg::GCMD, 4, 0);
        assert_eq!(vtd.status(), gcmd::SIRTP, "the pointer-set status stays");
        // Context-cache and IOTLB invalidations complete at once.
        vtd.write(reg::CCMD, 8, (1 << 63) | (1 << 61));
        assert_eq!(
            vtd.read(reg::CCMD, 8),
            (1 << 61) | (1 << 59),
            "ICC clear, CIRG kept, CAIG global"
        );
        vtd.write(reg::IOTLB, 8, (1 << 63) | (1 << 60));
        assert_eq!(
            vtd.read(reg::IOTLB, 8),
            (1 << 60) | (1 << 57),
            "IVT clear, IIRG kept, IAIG global"
        );
    }

    #[test]
    fn dma_translates_through_root_context_and_three_levels() {
        let mut mem = TestMemory::new();
        let mut vtd = Vtd::new();
        // Translation off: identity.
        assert_eq!(vtd.translate(&mut mem, SID, 0x5123, true), Ok(0x5123));
        let mut vtd2 = enabled();
        tables(&mut mem, true);
        assert_eq!(vtd2.translate(&mut mem, SID, 0x5123, true), Ok(0x30_0123));
        assert_eq!(vtd2.translate(&mut mem, SID, 0x5ff8, false), Ok(0x30_0ff8));
        // A 2 MiB leaf at level 2 and a pass-through context.
        mem.put(L2 + 8, 0x20_0000 | 3 | (1 << 7));
        assert_eq!(
            vtd2.translate(&mut mem, SID, 0x2f_1234, true),
            Ok(0x2f_1234)
        );
        mem.put(CONTEXT + 0x20 * 16, 1 | (2 << 2));
        assert_eq!(
            vtd2.translate(&mut mem, 0x20, 0xabc_d000, true),
            Ok(0xabc_d000)
        );
        assert_eq!(vtd2.fault(), None, "no fault so far");
        vtd = vtd2;
        // Read-only page: a write fails.
        mem.put(L1 + 6 * 8, 0x31_0000 | 1);
        assert_eq!(vtd.translate(&mut mem, SID, 0x6000, false), Ok(0x31_0000));
        assert_eq!(
            vtd.translate(&mut mem, SID, 0x6000, true),
            Err(FaultReason::WriteDenied)
        );
    }

    #[test]
    fn non_present_entries_fault_and_the_fault_is_recorded_unless_disabled() {
        let mut mem = TestMemory::new();
        let mut vtd = enabled();
        // No root entry for bus 1: not reported through any context entry,
        // so it is recorded.
        assert_eq!(
            vtd.translate(&mut mem, 0x0100, 0x1000, false),
            Err(FaultReason::RootNotPresent)
        );
        assert_eq!(
            vtd.fault(),
            Some(FaultRecord {
                source_id: 0x0100,
                reason: FaultReason::RootNotPresent,
                info: 0x1000,
                read: true
            })
        );
        assert_eq!(vtd.read(reg::FSTS, 4) as u32 & fsts::PPF, fsts::PPF);
        assert_eq!(
            vtd.read(reg::FECTL, 4) as u32 & CTL_IP,
            CTL_IP,
            "masked: pending"
        );
        // A second fault while the register is full: PFO.
        tables(&mut mem, true);
        assert_eq!(
            vtd.translate(&mut mem, 0x0019, 0x1000, true),
            Err(FaultReason::ContextNotPresent)
        );
        assert_eq!(vtd.read(reg::FSTS, 4) as u32 & fsts::PFO, fsts::PFO);
        assert_eq!(vtd.fault().unwrap().reason, FaultReason::RootNotPresent);
        // Clearing F and PFO; then unmasking sends the event on the next.
        vtd.write(reg::FRCD_HI + 4, 4, 1 << 31);
        vtd.write(reg::FSTS, 4, u64::from(fsts::PFO));
        assert_eq!(vtd.read(reg::FSTS, 4), 0);
        vtd.write(reg::FEDATA, 4, 0x55);
        vtd.write(reg::FEADDR, 4, 0xfee0_1000);
        vtd.write(reg::FECTL, 4, 0);
        assert_eq!(vtd.take_events().len(), 1, "the pending event on unmask");
        assert_eq!(
            vtd.translate(&mut mem, SID, 0x9000, false),
            Err(FaultReason::ReadDenied),
            "no level-1 entry for 0x9000"
        );
        let events = vtd.take_events();
        assert_eq!(events.len(), 1);
        assert_eq!(
            (events[0].vector, events[0].dest),
            (0x55, IpiDest::Physical(1))
        );
        assert_eq!(vtd.fault().unwrap().reason, FaultReason::ReadDenied);
        // Beyond 39 bits.
        vtd.write(reg::FRCD_HI + 4, 4, 1 << 31);
        assert_eq!(
            vtd.translate(&mut mem, SID, 1 << 39, false),
            Err(FaultReason::AddressBeyondWidth)
        );
        // FPD set in the context entry: the failure is not recorded.
        vtd.write(reg::FRCD_HI + 4, 4, 1 << 31);
        tables(&mut mem, false);
        assert!(vtd.translate(&mut mem, SID, 0x9000, true).is_err());
        assert_eq!(vtd.fault(), None);
        assert_eq!(vtd.read(reg::FSTS, 4), 0);
    }

    /// An IRTE: present, physical destination `dest`, `vector`, edge,
    /// fixed, SVT 1 with `sid`.
    fn irte(mem: &mut TestMemory, index: u64, vector: u8, dest: u8, sid: u16) {
        let lo = 1 | (u64::from(vector) << 16) | (u64::from(dest) << 40);
        mem.put(IRT + index * 16, lo);
        mem.put(IRT + index * 16 + 8, u64::from(sid) | (1 << 18));
    }

    fn remapping() -> Vtd {
        let mut vtd = Vtd::new();
        vtd.write(reg::IRTA, 8, IRT | 3); // 16 entries
        vtd.write(reg::GCMD, 4, u64::from(gcmd::SIRTP));
        vtd.write(reg::GCMD, 4, u64::from(gcmd::SIRTP | gcmd::IRE));
        vtd
    }

    #[test]
    fn remappable_msis_are_looked_up_in_the_irte_table() {
        let mut mem = TestMemory::new();
        let mut vtd = remapping();
        irte(&mut mem, 2, 0xee, 3, SID);
        // Handle 2 in address bits 19:5, format bit 4.
        let address = 0xfee0_0000 | (2 << 5) | (1 << 4);
        let ipi = vtd.remap(&mut mem, Some(SID), address, 0).unwrap().unwrap();
        assert_eq!(
            (ipi.vector, ipi.dest, ipi.mode),
            (0xee, IpiDest::Physical(3), IpiMode::Fixed)
        );
        assert!(!ipi.trigger_level);
        // SHV: the subhandle in the data is added.
        irte(&mut mem, 5, 0xef, 0, SID);
        let shv = 0xfee0_0000 | (2 << 5) | (1 << 4) | (1 << 3);
        assert_eq!(
            vtd.remap(&mut mem, Some(SID), shv, 3)
                .unwrap()
                .unwrap()
                .vector,
            0xef
        );
        // Another requester: the source id does not verify.
        assert_eq!(
            vtd.remap(&mut mem, Some(0x0020), address, 0),
            Err(FaultReason::SourceIdMismatch)
        );
        assert_eq!(vtd.fault().unwrap().reason, FaultReason::SourceIdMismatch);
        vtd.write(reg::FRCD_HI + 4, 4, 1 << 31);
        // Not present; beyond the table (16 entries).
        assert_eq!(
            vtd.remap(&mut mem, Some(SID), 0xfee0_0000 | (7 << 5) | (1 << 4), 0),
            Err(FaultReason::IrteNotPresent)
        );
        vtd.write(reg::FRCD_HI + 4, 4, 1 << 31);
        assert_eq!(
            vtd.remap(&mut mem, Some(SID), 0xfee0_0000 | (16 << 5) | (1 << 4), 0),
            Err(FaultReason::InterruptIndexBeyondTable)
        );
        // Compatibility format: blocked unless CFI.
        vtd.write(reg::FRCD_HI + 4, 4, 1 << 31);
        assert_eq!(
            vtd.remap(&mut mem, Some(SID), 0xfee0_1000, 0x41),
            Err(FaultReason::CompatibilityBlocked)
        );
        vtd.write(reg::GCMD, 4, u64::from(vtd.status() | gcmd::CFI));
        let compat = vtd
            .remap(&mut mem, Some(SID), 0xfee0_1000, 0x41)
            .unwrap()
            .unwrap();
        assert_eq!((compat.vector, compat.dest), (0x41, IpiDest::Physical(1)));
    }

    #[test]
    fn ioapic_requests_are_remapped_without_source_id_checks() {
        let mut mem = TestMemory::new();
        let mut vtd = remapping();
        // The IRTE names another requester: IOAPIC requests carry none.
        irte(&mut mem, 1, 0xed, 0, SID);
        let request = IoApicRequest {
            index: 1,
            vector: 0xed,
            level: false,
        };
        let ipi = vtd.remap_ioapic(&mut mem, request).unwrap().unwrap();
        assert_eq!((ipi.vector, ipi.dest), (0xed, IpiDest::Physical(0)));
        // Level-triggered IRTE.
        mem.put(IRT + 16, 1 | (0xed << 16) | (1 << 4));
        assert!(
            vtd.remap_ioapic(&mut mem, request)
                .unwrap()
                .unwrap()
                .trigger_level
        );
        // Remapping off: the message is the compatibility reading of the
        // remappable one (index bits as the destination).
        let mut off = Vtd::new();
        let ipi = off.remap_ioapic(&mut mem, request).unwrap().unwrap();
        assert_eq!((ipi.vector, ipi.dest), (0xed, IpiDest::Physical(0)));
    }

    #[test]
    fn the_invalidation_queue_runs_wait_descriptors_and_stops_at_bad_ones() {
        let mut mem = TestMemory::new();
        let mut vtd = Vtd::new();
        const QUEUE: u64 = 0x40_000;
        vtd.write(reg::IQA, 8, QUEUE);
        vtd.write(reg::GCMD, 4, u64::from(gcmd::QIE));
        // An IOTLB invalidation, then a wait with status write and IF.
        mem.put(QUEUE, 2 | (3 << 4));
        mem.put(QUEUE + 16, 5 | (1 << 5) | (1 << 4) | (0xabcd << 32));
        mem.put(QUEUE + 24, 0x50_000);
        vtd.write(reg::IQT, 8, 32);
        assert!(vtd.queue_pending());
        vtd.run_queue(&mut mem);
        assert_eq!(vtd.read(reg::IQH, 8), 32);
        assert_eq!(&mem.0[0x50_000..0x50_004], &0xabcdu32.to_le_bytes());
        assert_eq!(vtd.read(reg::ICS, 4), 1, "IWC");
        assert_eq!(vtd.read(reg::IECTL, 4) as u32, CTL_IM | CTL_IP);
        // Type 0 is invalid: IQE, the head stays on it.
        vtd.write(reg::IQT, 8, 48);
        vtd.run_queue(&mut mem);
        assert_eq!(vtd.read(reg::IQH, 8), 32);
        assert_eq!(vtd.read(reg::FSTS, 4) as u32 & fsts::IQE, fsts::IQE);
    }
}
