//! VMCALL: faultline's hypercalls and KVM's kick, PV send-IPI and directed yield. Arguments in RBX, RCX,
//! RDX, RSI; the number in RAX; the result back in RAX. Only CPL 0 may
//! call (-EPERM otherwise).

use super::{Next, Vcpu};
use crate::error::VmError;
use crate::shared::{CrossRequest, Shared};
use crate::shared::{Report, StopReason};
use abi::errno;
use machine::cpu::Gpr;
use machine::vmx::{Ipi, IpiDest, IpiMode};
use machine::Gpa;

impl Vcpu {
    pub(super) fn handle_hypercall(&mut self, shared: &mut Shared) -> Result<Next, VmError> {
        let s = self.cpu.state();
        let [nr, a0, a1, a2, a3] =
            [Gpr::Rax, Gpr::Rbx, Gpr::Rcx, Gpr::Rdx, Gpr::Rsi].map(|r| s.gpr[r as usize]);
        let now = self.clock();
        let result: i64 = if s.cpl() != 0 {
            -errno::EPERM
        } else if let Some(result) =
            super::async_pf::event::hypercall(self, shared, nr, [a0, a1, a2, a3])?
        {
            result
        } else {
            match nr {
                abi::HC_START_CPU => match shared.vcpu_by_apic_id(a0) {
                    None => -errno::EINVAL,
                    Some(_)
                        if !machine::addr::is_canonical(a1) || !machine::addr::is_canonical(a2) =>
                    {
                        -errno::EINVAL
                    }
                    Some(target) if shared.directory[target.0].started => -errno::EBUSY,
                    Some(target) => {
                        shared.directory[target.0].started = true;
                        shared.cross.push(CrossRequest::StartCpu {
                            target,
                            rip: a1,
                            rsp: a2,
                            rdi: a3,
                            at: now,
                        });
                        0
                    }
                },
                abi::HC_REPORT => self.report(shared, a0, a1),
                abi::HC_CR3_CACHE_REGISTER => self.register_cr3_cache(shared, a0),
                abi::HC_SHUTDOWN => {
                    self.cpu.skip_instruction();
                    return Ok(Next::Stop(StopReason::Shutdown { status: a0 }));
                }
                abi::KVM_HC_KICK_CPU if shared.kvm_features & abi::KVM_FEATURE_PV_UNHALT != 0 => {
                    // As KVM: an unknown APIC id is ignored.
                    if let Some(target) = shared.vcpu_by_apic_id(a1) {
                        shared.cross.push(CrossRequest::Kick { target, at: now });
                    }
                    self.stats.kicks_sent += 1;
                    0
                }
                abi::KVM_HC_SEND_IPI if shared.kvm_features & abi::KVM_FEATURE_PV_SEND_IPI != 0 => {
                    self.stats.pv_send_ipi_calls += 1;
                    self.pv_send_ipi(shared, [a0, a1], a2 as u32, a3)
                }
                abi::KVM_HC_SCHED_YIELD
                    if shared.kvm_features & abi::KVM_FEATURE_PV_SCHED_YIELD != 0 =>
                {
                    // As KVM's `kvm_sched_yield`: the result is 0 whether
                    // or not the yield happened; an unknown APIC id or the
                    // caller itself is ignored. The scheduler decides
                    // whether the target is preempted.
                    self.stats.sched_yields += 1;
                    self.cpu.state_mut().gpr[Gpr::Rax as usize] = 0;
                    self.cpu.skip_instruction();
                    return Ok(match shared.vcpu_by_apic_id(a0) {
                        Some(target) if target != self.id => Next::YieldTo(target),
                        _ => Next::Continue,
                    });
                }
                _ => -errno::KVM_ENOSYS,
            }
        };
        self.cpu.state_mut().gpr[Gpr::Rax as usize] = result as u64;
        self.cpu.skip_instruction();
        Ok(Next::Continue)
    }

    /// KVM_HC_SEND_IPI (KVM's `kvm_pv_send_ipi`), answered only when
    /// `KVM_FEATURE_PV_SEND_IPI` is offered: the IPI of `icr` to APIC
    /// id `min + i` for each bit `i` of `bitmap` (low word, then the high
    /// word for `min + 64`; 32 bits per word from 32-bit code), routed as
    /// an ICR write's IPI is. As KVM: a logical destination or a
    /// shorthand is `-EINVAL`, APIC ids no vCPU has are skipped (an id
    /// past the largest ends the word), and the result is the count sent.
    /// Fixed, lowest-priority and NMI; SMI (there is no SMM) and the
    /// other modes are `-EINVAL`.
    pub(crate) fn pv_send_ipi(
        &mut self,
        shared: &mut Shared,
        bitmap: [u64; 2],
        min: u32,
        icr: u64,
    ) -> i64 {
        const VECTOR: u64 = 0xff;
        const MODE_SHIFT: u64 = 8;
        const MODE: u64 = 0x7 << MODE_SHIFT;
        const LOGICAL: u64 = 1 << 11;
        const SHORTHAND: u64 = 0x3 << 18;
        if icr & (LOGICAL | SHORTHAND) != 0 {
            return -errno::EINVAL;
        }
        let mode = match (icr & MODE) >> MODE_SHIFT {
            0 => IpiMode::Fixed,
            1 => IpiMode::LowestPriority,
            // Linux's NMI IPIs (`APIC_DM_NMI`: the RCU stall detector's
            // backtraces, `nmi_cpu_backtrace`).
            4 => IpiMode::Nmi,
            _ => return -errno::EINVAL,
        };
        let bits: u64 = if self.cpu.state().in_64bit_mode() {
            64
        } else {
            32
        };
        let sender_apic = self.cpu.apic().id();
        let at = self.clock();
        let mut sent = 0;
        for (word, first) in bitmap.into_iter().zip([0, bits]) {
            for i in (0..bits).filter(|i| word >> i & 1 != 0) {
                let id = u64::from(min) + first + i;
                if shared.vcpu_by_apic_id(id).is_none() {
                    continue;
                }
                shared.cross.push(CrossRequest::Ipi {
                    sender_apic,
                    ipi: Ipi {
                        dest: IpiDest::Physical(id as u32),
                        vector: (icr & VECTOR) as u8,
                        mode,
                        level_assert: true,
                        trigger_level: false,
                    },
                    at,
                });
                self.stats.ipis_sent += 1;
                sent += 1;
            }
        }
        sent
    }

    /// HC_REPORT: a line of `len` bytes at `gpa`.
    fn report(&mut self, shared: &mut Shared, gpa: u64, len: u64) -> i64 {
        if len > abi::REPORT_MAX {
            return -errno::E2BIG;
        }
        let mut buf = vec![0; len as usize];
        if shared.read_guest(Gpa(gpa), &mut buf).is_err() {
            return -errno::EFAULT;
        }
        match String::from_utf8(buf) {
            Err(_) => -errno::EINVAL,
            Ok(line) => {
                shared.reports.push(Report {
                    vcpu: self.id.0,
                    cycles: self.cpu.cycles(),
                    line,
                });
                0
            }
        }
    }
}
