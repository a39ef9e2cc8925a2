//! What a VMM needs to emulate an MMIO access: when a data access exits
//! with an EPT violation, the machine records the access of the
//! faulting instruction if it is a plain `mov` between a general
//! register (or an immediate) and memory, the form device drivers use
//! (Linux's `readl`/`writel`, a C `volatile` load or store). The VMM
//! reads it with [`Cpu::mmio_access`] and finishes the instruction with
//! [`Cpu::skip_instruction`] (a store) or [`Cpu::complete_mmio_read`] (a
//! load): hardware VMX leaves this decoding to the VMM; the machine has
//! the instruction decoded already, so it hands the result over.

use super::access::gpr_info;
use super::{Cpu, Fault, FaultKind, Step};
use crate::alu::Size;
use crate::memory::PhysMemory;
use crate::mmu::AccessKind;
use crate::vmx::{MmioAccess, VmExit};
use crate::{Gpa, Hpa};
use iced_x86::{Instruction, Mnemonic, OpKind};

/// Where a recorded MMIO load goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MmioLoad {
    idx: u8,
    size: Size,
    high: bool,
}

/// The recorded access of the instruction that exited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PendingMmio {
    access: MmioAccess,
    load: Option<MmioLoad>,
}

impl Cpu {
    /// Records the MMIO access of `insn` if `fault` is an EPT violation
    /// or a page fault (under shadow paging the hv sees MMIO as a #PF
    /// exit) and the instruction a plain register/immediate `mov` (else
    /// clears it).
    pub(super) fn note_mmio(&mut self, insn: &Instruction, fault: &Fault) {
        self.mmio = match fault.kind() {
            FaultKind::Exit(VmExit::EptViolation { .. })
            | FaultKind::Exception {
                vector: super::vector::PF,
                ..
            } => self.decode_mmio(insn),
            _ => None,
        };
    }

    fn decode_mmio(&self, i: &Instruction) -> Option<PendingMmio> {
        if i.mnemonic() != Mnemonic::Mov || i.op_count() != 2 {
            return None;
        }
        // An access that crosses into the next page is two accesses, one
        // per page (a device sees each page's bytes at its own address):
        // not one to describe; `emulate_mmio` runs it byte by byte (under
        // shadow paging with the second linear page from the VMM,
        // `emulate_mmio_paged`).
        let mem_op = if i.op_kind(0) == OpKind::Memory { 0 } else { 1 };
        let bytes = u64::from(Cpu::op_size(i, mem_op).bytes());
        if (self.effective_address(i) & 0xfff) + bytes > 0x1000 {
            return None;
        }
        let gpr = |n: u32| i.op_kind(n) == OpKind::Register && i.op_register(n).is_gpr();
        if i.op_kind(0) == OpKind::Memory {
            let size = Cpu::op_size(i, 0);
            let value = if gpr(1) {
                self.reg(i.op_register(1))
            } else if matches!(
                i.op_kind(1),
                OpKind::Immediate8
                    | OpKind::Immediate16
                    | OpKind::Immediate32
                    | OpKind::Immediate32to64
            ) {
                i.immediate(1) & size.mask()
            } else {
                return None;
            };
            Some(PendingMmio {
                access: MmioAccess {
                    size: size.bytes(),
                    write: Some(value),
                },
                load: None,
            })
        } else if gpr(0) && i.op_kind(1) == OpKind::Memory {
            let (idx, size, high) = gpr_info(i.op_register(0));
            Some(PendingMmio {
                access: MmioAccess {
                    size: size.bytes(),
                    write: None,
                },
                load: Some(MmioLoad { idx, size, high }),
            })
        } else {
            None
        }
    }

    /// After an [`VmExit::EptViolation`] (or a #PF exit): the data access of the
    /// instruction, if the machine could describe it (see the module).
    pub fn mmio_access(&self) -> Option<MmioAccess> {
        self.mmio.map(|m| m.access)
    }

    /// Completes the MMIO load [`Cpu::mmio_access`] described: the
    /// destination register gets `value` (x86 partial-register rules)
    /// and the instruction is skipped. Without a recorded load, nothing
    /// is written and the instruction is still skipped.
    pub fn complete_mmio_read(&mut self, value: u64) {
        if let Some(load) = self.mmio.and_then(|m| m.load) {
            self.set_gpr_sized(load.idx, load.size, load.high, value);
        }
        self.mmio = None;
        self.skip_instruction();
    }
}

/// Where a translation that found an MMIO page points while
/// [`Cpu::emulate_mmio`] runs: this bit set over the guest-physical
/// address, never a host-physical address of the machine's memory.
pub(crate) const MMIO_HPA: u64 = 1 << 62;

/// One store of an emulated instruction to the MMIO page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmioWrite {
    pub gpa: Gpa,
    /// Bytes stored (1, 2, 4 or 8).
    pub size: u8,
    pub value: u64,
}

/// What [`Cpu::emulate_mmio`] came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MmioEmulation {
    /// The instruction reads `size` bytes of the MMIO page at `gpa`: the
    /// VMM reads its device and calls again with the value appended to
    /// the reads it gave. Nothing of the instruction has happened.
    NeedRead { gpa: Gpa, size: u8 },
    /// The instruction ran (it retired, or raised an exception the guest
    /// takes): the VMM applies `writes` to its device, in order, then
    /// handles `exit` if the instruction ended in one (an exception the
    /// exception bitmap intercepts, a single-step trap, the monitor trap).
    Done {
        writes: Vec<MmioWrite>,
        exit: Option<VmExit>,
    },
    /// The instruction stopped at another exit before it retired (an EPT
    /// violation on a RAM page not yet mapped, say): nothing of it has
    /// happened; the VMM handles the exit and emulates again.
    Exit(VmExit),
}

/// The state of one [`Cpu::emulate_mmio`].
#[derive(Debug, Clone, Default)]
pub(crate) struct MmioEmu {
    /// The MMIO page (guest-physical, 4 KiB aligned).
    gpa_page: u64,
    /// Under shadow paging: the linear page that maps it (the hv's page
    /// tables never do).
    la_page: Option<u64>,
    /// Under shadow paging: more (linear page, MMIO page) pairs the VMM
    /// found the instruction reaching (a second linear page of the same
    /// access, say).
    linear: Vec<(u64, u64)>,
    reads: Vec<u64>,
    next_read: usize,
    writes: Vec<MmioWrite>,
    need: Option<(u64, u8)>,
}

impl Cpu {
    /// Emulates the instruction at RIP, which exited on an access to the
    /// MMIO page holding `gpa` (an EPT violation, or a #PF exit under
    /// shadow paging), whatever the instruction: every access it makes to
    /// that page is a device access, the rest of it executes as usual on
    /// the interpreter (flags, other operands, RIP, a single-step trap).
    /// Reads return `reads` in order; the first read beyond them ends the
    /// emulation with [`MmioEmulation::NeedRead`], with the CPU as it was,
    /// so the VMM performs each device read once and in order. For the
    /// plain `mov` forms [`Cpu::mmio_access`] is the cheaper way.
    ///
    /// An access that crosses a page boundary reaches the device one byte
    /// at a time, each at its own page's address; under EPT both pages
    /// may be virtual pages mapping this one MMIO page (kvm-unit-tests'
    /// `emulator` "cross-page mmio"). An instruction whose accesses reach
    /// a second MMIO page (or, under shadow paging, a second linear page
    /// not given to [`Cpu::emulate_mmio_paged`]) is not emulated: that
    /// access is an [`MmioEmulation::Exit`].
    pub fn emulate_mmio(&mut self, mem: &PhysMemory, gpa: Gpa, reads: &[u64]) -> MmioEmulation {
        self.emulate_mmio_paged(mem, gpa, reads, &[])
    }

    /// [`Cpu::emulate_mmio`] under shadow paging, with `linear`: more
    /// (linear page, guest-physical MMIO page) pairs, 4 KiB aligned, that
    /// the VMM's walk of the guest's page tables found behind the #PF
    /// exits of earlier attempts ([`MmioEmulation::Exit`]). Their
    /// accesses go to the device as the first page's do: an access
    /// crossing from one linear page of MMIO into the next reaches each
    /// page's device at its own address.
    pub fn emulate_mmio_paged(
        &mut self,
        mem: &PhysMemory,
        gpa: Gpa,
        reads: &[u64],
        linear: &[(u64, u64)],
    ) -> MmioEmulation {
        let la_page = if self.vmx.as_ref().is_some_and(|v| v.ept.is_some()) {
            None
        } else {
            self.fault_la.map(|la| la & !0xfff)
        };
        self.flush_flags();
        let saved_state = self.state.clone();
        let saved_cycles = self.cycles;
        let saved_stats = self.stats;
        self.mmio = None;
        self.mmio_emu = Some(Box::new(MmioEmu {
            gpa_page: gpa.0 & !0xfff,
            la_page,
            linear: linear.to_vec(),
            reads: reads.to_vec(),
            ..MmioEmu::default()
        }));
        let step = self.run_block::<false>(mem, u64::MAX);
        self.flush_flags();
        let emu = self.mmio_emu.take().expect("set above");
        let rolled_back = match (&step, emu.need) {
            (_, Some((gpa, size))) => Some(MmioEmulation::NeedRead {
                gpa: Gpa(gpa),
                size,
            }),
            (
                Step::Exit(
                    exit @ (VmExit::EptViolation { .. }
                    | VmExit::Exception {
                        vector: super::vector::PF,
                        ..
                    }),
                ),
                _,
            ) => Some(MmioEmulation::Exit(exit.clone())),
            _ => None,
        };
        match rolled_back {
            Some(result) => {
                self.state = saved_state;
                self.cycles = saved_cycles;
                self.stats = saved_stats;
                result
            }
            None => MmioEmulation::Done {
                writes: emu.writes,
                exit: match step {
                    Step::Exit(exit) => Some(exit),
                    Step::Continue => None,
                },
            },
        }
    }

    /// Whether a failed translation of `la` for `kind` hit the page
    /// [`Cpu::emulate_mmio`] routes to the VMM: its sentinel address.
    #[cold]
    #[inline(never)]
    pub(super) fn mmio_emu_translation(
        &self,
        la: u64,
        kind: AccessKind,
        fault: &Fault,
    ) -> Option<Hpa> {
        let emu = self.mmio_emu.as_ref()?;
        if kind == AccessKind::Execute {
            return None;
        }
        let gpa = match (fault.kind(), emu.la_page) {
            (FaultKind::Exit(VmExit::EptViolation { gpa, .. }), _) => gpa.0,
            (
                FaultKind::Exception {
                    vector: super::vector::PF,
                    ..
                },
                Some(page),
            ) if la & !0xfff == page => emu.gpa_page | (la & 0xfff),
            (
                FaultKind::Exception {
                    vector: super::vector::PF,
                    ..
                },
                Some(_),
            ) => {
                // A page the VMM added: whichever MMIO page it maps.
                let &(_, gpa_page) = emu.linear.iter().find(|p| p.0 == la & !0xfff)?;
                return Some(Hpa(MMIO_HPA | gpa_page | (la & 0xfff)));
            }
            _ => return None,
        };
        (gpa & !0xfff == emu.gpa_page).then_some(Hpa(MMIO_HPA | gpa))
    }

    /// A read of `bytes` at `hpa`, which may be [`Cpu::emulate_mmio`]'s
    /// MMIO page.
    #[inline]
    pub(crate) fn phys_read(
        &mut self,
        mem: &PhysMemory,
        hpa: Hpa,
        bytes: u8,
    ) -> Result<u64, Fault> {
        if hpa.0 & MMIO_HPA != 0 && self.mmio_emu.is_some() {
            return self.mmio_emu_read(hpa.0 & !MMIO_HPA, bytes);
        }
        Ok(mem.read(hpa, bytes)?)
    }

    #[cold]
    #[inline(never)]
    fn mmio_emu_read(&mut self, gpa: u64, bytes: u8) -> Result<u64, Fault> {
        let emu = self
            .mmio_emu
            .as_mut()
            .expect("an MMIO address outside emulate_mmio");
        if let Some(&value) = emu.reads.get(emu.next_read) {
            emu.next_read += 1;
            return Ok(value & (u64::MAX >> (64 - 8 * u32::from(bytes))));
        }
        emu.need = Some((gpa, bytes));
        // Ends the instruction; `emulate_mmio` undoes it.
        Err(Fault::exit(VmExit::EptViolation {
            gpa: Gpa(gpa),
            gla: None,
            qualification: crate::vmx::ept_qual::READ,
        }))
    }

    /// [`Cpu::emulate_mmio`]'s store to the MMIO page.
    #[cold]
    #[inline(never)]
    pub(super) fn mmio_emu_write(&mut self, gpa: u64, bytes: u8, value: u64) {
        let emu = self
            .mmio_emu
            .as_mut()
            .expect("an MMIO address outside emulate_mmio");
        emu.writes.push(MmioWrite {
            gpa: Gpa(gpa),
            size: bytes,
            value: value & (u64::MAX >> (64 - 8 * u32::from(bytes))),
        });
    }
}
