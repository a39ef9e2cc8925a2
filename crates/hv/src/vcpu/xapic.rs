//! The xAPIC's MMIO page at 0xfee00000, emulated over the machine's
//! local APIC (an x2APIC model), as APIC virtualisation presents it: a
//! guest may program its local APIC through the page (register at offset
//! `n << 4`, 32-bit accesses) before it switches to x2APIC by MSR.
//!
//! What differs from the x2APIC view is translated here: the ID register
//! holds the id in bits 31:24; the ICR is two registers (0x300 low, whose
//! write sends, and 0x310 high, destination in bits 31:24, 0xff
//! broadcast); LDR and DFR are xAPIC-only formats, kept here (the
//! machine's logical destinations stay the x2APIC cluster ones). Other
//! registers are the machine's; reads of reserved ones give 0, writes to
//! them are dropped (as a write to a read-only xAPIC register is).
//!
//! The page is there only in xAPIC mode and at the base IA32_APIC_BASE
//! names (it moves with the base); disabled or in x2APIC mode the APIC
//! does not decode it, and an access there is an unassigned MMIO access
//! (SDM Vol. 3A, "x2APIC Register Address Space": the MMIO interface is
//! disabled in x2APIC mode).

use super::{Next, Vcpu};
use crate::error::VmError;
use crate::shared::Shared;
use machine::apic::{ApicMode, ApicWrite, MSR_X2APIC_FIRST};

/// Guest-physical base of the xAPIC page.
#[allow(dead_code)]
pub const XAPIC_BASE: u64 = 0xfee0_0000;
/// Its size.
pub const XAPIC_SIZE: u64 = 0x1000;

const REG_ID: u32 = 0x02;
const REG_LDR: u32 = 0x0d;
const REG_DFR: u32 = 0x0e;
const REG_ICR_LOW: u32 = 0x30;
const REG_ICR_HIGH: u32 = 0x31;

/// The xAPIC-only register state of a vCPU.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub(crate) struct XapicRegs {
    icr_high: u32,
    ldr: u32,
    dfr: u32,
}

impl Default for XapicRegs {
    fn default() -> Self {
        XapicRegs {
            icr_high: 0,
            ldr: 0,
            // Flat model at reset.
            dfr: u32::MAX,
        }
    }
}

impl Vcpu {
    /// The offset of `gpa` in this vCPU's xAPIC page, if its APIC is in
    /// xAPIC mode and `gpa` is in the page.
    pub(super) fn xapic_offset(&self, gpa: u64) -> Option<u64> {
        let apic = self.cpu.apic();
        let base = apic.mmio_base();
        (apic.mode() == ApicMode::Xapic && (base..base + XAPIC_SIZE).contains(&gpa))
            .then(|| gpa - base)
    }

    /// A 32-bit read of the xAPIC register at `offset`.
    pub(super) fn xapic_read(&self, offset: u64) -> u32 {
        if offset & 0xf != 0 {
            return 0;
        }
        let reg = (offset >> 4) as u32;
        let apic = self.cpu.apic();
        match reg {
            REG_ID => apic.id() << 24,
            REG_LDR => self.xapic.ldr,
            REG_DFR => self.xapic.dfr,
            REG_ICR_HIGH => self.xapic.icr_high,
            _ => apic
                .read_xapic(MSR_X2APIC_FIRST + reg, self.cpu.tsc())
                .map_or(0, |v| v as u32),
        }
    }

    /// A 32-bit write of `value` to the xAPIC register at `offset`.
    pub(super) fn xapic_write(
        &mut self,
        shared: &mut Shared,
        offset: u64,
        value: u32,
    ) -> Result<Next, VmError> {
        if offset & 0xf != 0 {
            return Ok(Next::Continue);
        }
        let reg = (offset >> 4) as u32;
        let x2apic_value = match reg {
            REG_ID => return Ok(Next::Continue),
            REG_LDR => {
                self.xapic.ldr = value & 0xff00_0000;
                return Ok(Next::Continue);
            }
            REG_DFR => {
                self.xapic.dfr = value | 0x0fff_ffff;
                return Ok(Next::Continue);
            }
            REG_ICR_HIGH => {
                self.xapic.icr_high = value & 0xff00_0000;
                return Ok(Next::Continue);
            }
            REG_ICR_LOW => {
                let dest = match self.xapic.icr_high >> 24 {
                    0xff => u32::MAX,
                    id => id,
                };
                (u64::from(dest) << 32) | u64::from(value)
            }
            _ => u64::from(value),
        };
        let tsc = self.cpu.tsc();
        match self
            .cpu
            .apic_mut()
            .write_xapic(MSR_X2APIC_FIRST + reg, x2apic_value, tsc)
        {
            Ok(ApicWrite::SendIpi(ipi)) => self.send_ipi(shared, ipi),
            Ok(ApicWrite::EoiBroadcast(vector)) => {
                self.eoi_broadcast(shared, vector);
                Ok(Next::Continue)
            }
            // Done, or a write the x2APIC refuses (reserved bits, a
            // read-only register): an xAPIC drops it.
            Ok(ApicWrite::Done) | Err(_) => Ok(Next::Continue),
        }
    }
}
