//! VMCALL: faultline's hypercalls and KVM's kick and directed yield. Arguments in RBX, RCX,
//! RDX, RSI; the number in RAX; the result back in RAX. Only CPL 0 may
//! call (-EPERM otherwise).

use super::{Next, Vcpu};
use crate::error::VmError;
use crate::vm::shared::{CrossRequest, Shared};
use crate::vm::{Report, StopReason};
use abi::errno;
use machine::cpu::Gpr;
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
            crate::apf::event::hypercall(self, shared, nr, [a0, a1, a2, a3])?
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
