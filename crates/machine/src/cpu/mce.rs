//! Machine-check architecture registers, as KVM offers them to a guest
//! (`arch/x86/kvm/x86.c`, `set_msr_mce`/`get_msr_mce`) and QEMU configures
//! them by default: IA32_MCG_CAP with MCG_CTL_P and [`MCE_BANKS`] banks,
//! IA32_MCG_STATUS, IA32_MCG_CTL, and per bank IA32_MCi_CTL, _STATUS,
//! _ADDR, _MISC at 0x400 + 4 i. The machine never signals a machine check;
//! the registers hold what software writes, with the architectural checks:
//! IA32_MCG_CAP is read-only, IA32_MCG_CTL and IA32_MCi_CTL take only 0 or
//! all ones (bit 10 of a bank's CTL aside, as KVM allows), IA32_MCi_STATUS
//! only 0 (clearing a logged error). Registers of banks that do not exist
//! are #GP.

use serde::{Deserialize, Serialize};

/// IA32_MCG_CAP.
pub const MSR_MCG_CAP: u32 = 0x179;
/// IA32_MCG_STATUS.
pub const MSR_MCG_STATUS: u32 = 0x17a;
/// IA32_MCG_CTL.
pub const MSR_MCG_CTL: u32 = 0x17b;
/// IA32_MC0_CTL; bank i's registers are at 0x400 + 4 i + (CTL, STATUS,
/// ADDR, MISC).
pub const MSR_MC0_CTL: u32 = 0x400;
/// Banks offered (QEMU's default, `MCE_BANKS_DEF`).
pub const MCE_BANKS: usize = 10;
/// IA32_MCG_CAP bit 8: IA32_MCG_CTL exists.
pub const MCG_CTL_P: u64 = 1 << 8;
/// The IA32_MCG_CAP value.
pub const MCG_CAP: u64 = MCG_CTL_P | MCE_BANKS as u64;

/// The machine-check registers software can write.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MceRegs {
    pub mcg_status: u64,
    pub mcg_ctl: u64,
    /// Per bank: CTL, STATUS, ADDR, MISC.
    pub banks: [[u64; 4]; MCE_BANKS],
}

impl Default for MceRegs {
    /// After RESET: every control enabled (KVM's reset value of MCG_CTL
    /// and the banks' CTL is all ones), no errors logged.
    fn default() -> Self {
        MceRegs {
            mcg_status: 0,
            mcg_ctl: u64::MAX,
            banks: [[u64::MAX, 0, 0, 0]; MCE_BANKS],
        }
    }
}

/// A bank register: (bank, register 0-3), if `index` names one that exists.
fn bank_register(index: u32) -> Option<(usize, usize)> {
    let offset = index.checked_sub(MSR_MC0_CTL)? as usize;
    (offset < 4 * MCE_BANKS).then_some((offset / 4, offset % 4))
}

impl MceRegs {
    /// RDMSR: `None` if `index` is not a machine-check register (or one
    /// of a bank that does not exist: #GP).
    pub fn read(&self, index: u32) -> Option<u64> {
        match index {
            MSR_MCG_CAP => Some(MCG_CAP),
            MSR_MCG_STATUS => Some(self.mcg_status),
            MSR_MCG_CTL => Some(self.mcg_ctl),
            _ => bank_register(index).map(|(bank, reg)| self.banks[bank][reg]),
        }
    }

    /// Whether `index` is a machine-check register this CPU has.
    pub fn has(index: u32) -> bool {
        matches!(index, MSR_MCG_CAP | MSR_MCG_STATUS | MSR_MCG_CTL)
            || bank_register(index).is_some()
    }

    /// WRMSR: false if refused (#GP).
    pub fn write(&mut self, index: u32, value: u64) -> bool {
        match index {
            MSR_MCG_STATUS => self.mcg_status = value,
            MSR_MCG_CTL if value == 0 || value == u64::MAX => self.mcg_ctl = value,
            _ => match bank_register(index) {
                // CTL: 0 or all ones (KVM also lets bit 10 and bit 0 vary).
                Some((bank, 0)) if value == 0 || value | (1 << 10) | 1 == u64::MAX => {
                    self.banks[bank][0] = value
                }
                // STATUS: only cleared.
                Some((bank, 1)) if value == 0 => self.banks[bank][1] = 0,
                Some((bank, reg @ (2 | 3))) => self.banks[bank][reg] = value,
                _ => return false,
            },
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kvm-unit-tests' `msr` test_mce_msrs, rule by rule.
    #[test]
    fn machine_check_registers_follow_kvm() {
        let mut m = MceRegs::default();
        assert_eq!(m.read(MSR_MCG_CAP), Some(0x10a));
        assert!(!m.write(MSR_MCG_CAP, 0), "MCG_CAP is read-only");
        const NONCANONICAL: u64 = 0xaaaa_aaaa_aaaa_aaaa;
        for bank in 0..MCE_BANKS as u32 {
            let ctl = MSR_MC0_CTL + 4 * bank;
            for v in [0, u64::MAX] {
                assert!(m.write(ctl, v));
                assert_eq!(m.read(ctl), Some(v));
            }
            assert!(!m.write(ctl, NONCANONICAL));
            assert!(m.write(ctl + 1, 0));
            assert!(!m.write(ctl + 1, 1), "STATUS is only cleared");
            for reg in [ctl + 2, ctl + 3] {
                for v in [0, u64::MAX, NONCANONICAL] {
                    assert!(m.write(reg, v));
                    assert_eq!(m.read(reg), Some(v));
                }
            }
        }
        for bank in MCE_BANKS as u32..32 {
            for reg in 0..4 {
                let index = MSR_MC0_CTL + 4 * bank + reg;
                assert_eq!(m.read(index), None, "{index:#x}");
                assert!(!m.write(index, 0), "{index:#x}");
                assert!(!MceRegs::has(index));
            }
        }
        assert!(!m.write(MSR_MCG_CTL, 5));
        assert!(m.write(MSR_MCG_STATUS, 5));
        assert_eq!(m.read(MSR_MCG_STATUS), Some(5));
    }
}
