//! The ABI between faultline's hypervisor and its guest kernel: the boot
//! state, the boot-information block and the hypercalls.
//!
//! Shared by the host (this crate) and the guest (`guest/include/faultline_abi.h`,
//! C). Every `#[repr(C)]` struct has compile-time size and offset asserts
//! here and `_Static_assert`s with the same numbers in the header, so the
//! two cannot drift apart silently.
//!
//! # Boot state
//!
//! The bootstrap vCPU starts in 64-bit long mode at CPL 0 with interrupts
//! off, paging on through hv-built page tables that identity-map all guest
//! RAM with 2 MiB pages (writable, supervisor, executable), a GDT with a
//! 64-bit kernel code segment at 0x08 and a data segment at 0x10, RIP = the
//! kernel ELF's entry point, RSP = the top of a boot stack inside a reserved
//! region, and RDI = the guest-physical address of a [`BootInfo`] (so a C
//! entry point `void kmain(struct boot_info *)` receives it directly).
//! Application processors are started by [`HC_START_CPU`] in the same state
//! with the RIP, RSP and RDI the boot processor chose.
//!
//! # Hypercalls
//!
//! `vmcall` with KVM's register convention: RAX = number, RBX, RCX, RDX,
//! RSI = arguments, result in RAX; a negative result is an error from
//! [`errno`]. Unknown numbers return `-KVM_ENOSYS`, as KVM does.
#![no_std]

/// `BootInfo::magic`: "FLTBOOT1".
pub const BOOT_INFO_MAGIC: u64 = u64::from_le_bytes(*b"FLTBOOT1");
/// `BootInfo::version` of this layout.
pub const BOOT_INFO_VERSION: u32 = 1;
/// Capacity of `BootInfo::regions`.
pub const MAX_MEM_REGIONS: usize = 32;
/// Capacity of `BootInfo::apic_ids`.
pub const MAX_CPUS: usize = 64;
/// Capacity of `BootInfo::cmdline`, NUL included.
pub const CMDLINE_LEN: usize = 512;

/// `MemRegion::kind`: RAM the kernel may allocate.
pub const MEM_USABLE: u32 = 1;
/// `MemRegion::kind`: RAM holding the kernel image or boot structures.
pub const MEM_RESERVED: u32 = 2;

/// A range of guest-physical memory.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemRegion {
    /// Guest-physical base, 4 KiB aligned.
    pub base: u64,
    /// Length in bytes, a multiple of 4 KiB.
    pub len: u64,
    /// [`MEM_USABLE`] or [`MEM_RESERVED`].
    pub kind: u32,
    pub reserved: u32,
}

/// What the hypervisor tells the kernel at boot.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BootInfo {
    /// [`BOOT_INFO_MAGIC`].
    pub magic: u64,
    /// [`BOOT_INFO_VERSION`].
    pub version: u32,
    /// vCPUs in the VM (the boot processor is `apic_ids[0]`).
    pub num_cpus: u32,
    /// Guest RAM size in bytes.
    pub mem_size: u64,
    /// TSC frequency in Hz (virtual time: cycles per second).
    pub tsc_hz: u64,
    /// Guest-physical range of the loaded kernel image.
    pub kernel_start: u64,
    pub kernel_end: u64,
    /// Entries used in `regions`.
    pub num_regions: u32,
    pub reserved: u32,
    /// Memory map, sorted by base, non-overlapping.
    pub regions: [MemRegion; MAX_MEM_REGIONS],
    /// x2APIC ids of the vCPUs.
    pub apic_ids: [u32; MAX_CPUS],
    /// NUL-terminated command line: boot options, then `--`, then the
    /// program name and its arguments (e.g. `no-apf -- bm -f 4`).
    pub cmdline: [u8; CMDLINE_LEN],
}

impl Default for BootInfo {
    fn default() -> Self {
        BootInfo {
            magic: BOOT_INFO_MAGIC,
            version: BOOT_INFO_VERSION,
            num_cpus: 0,
            mem_size: 0,
            tsc_hz: 0,
            kernel_start: 0,
            kernel_end: 0,
            num_regions: 0,
            reserved: 0,
            regions: [MemRegion::default(); MAX_MEM_REGIONS],
            apic_ids: [0; MAX_CPUS],
            cmdline: [0; CMDLINE_LEN],
        }
    }
}

impl BootInfo {
    /// The structure as bytes, to copy into guest memory.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: BootInfo is repr(C), made only of integers and arrays of
        // integers with no padding (checked by the asserts below), so every
        // byte is initialized; the slice borrows `self`.
        unsafe {
            core::slice::from_raw_parts(
                (self as *const BootInfo).cast::<u8>(),
                core::mem::size_of::<BootInfo>(),
            )
        }
    }
}

// Layout asserts (mirrored by _Static_assert in faultline_abi.h).
const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<MemRegion>() == 24);
    assert!(offset_of!(BootInfo, magic) == 0);
    assert!(offset_of!(BootInfo, version) == 8);
    assert!(offset_of!(BootInfo, num_cpus) == 12);
    assert!(offset_of!(BootInfo, mem_size) == 16);
    assert!(offset_of!(BootInfo, tsc_hz) == 24);
    assert!(offset_of!(BootInfo, kernel_start) == 32);
    assert!(offset_of!(BootInfo, kernel_end) == 40);
    assert!(offset_of!(BootInfo, num_regions) == 48);
    assert!(offset_of!(BootInfo, regions) == 56);
    assert!(offset_of!(BootInfo, apic_ids) == 56 + 24 * MAX_MEM_REGIONS);
    assert!(offset_of!(BootInfo, cmdline) == 56 + 24 * MAX_MEM_REGIONS + 4 * MAX_CPUS);
    assert!(size_of::<BootInfo>() == 56 + 24 * MAX_MEM_REGIONS + 4 * MAX_CPUS + CMDLINE_LEN);
};

/// KVM: wake a halted vCPU (RBX = flags, RCX = APIC id).
pub const KVM_HC_KICK_CPU: u64 = 5;
/// KVM: send IPIs (RBX/RCX = bitmap low/high, RDX = lowest APIC id, RSI = ICR).
pub const KVM_HC_SEND_IPI: u64 = 10;
/// KVM: yield to the vCPU with APIC id RBX.
pub const KVM_HC_SCHED_YIELD: u64 = 11;

/// First faultline-private hypercall number (outside KVM's range).
pub const HC_FAULTLINE_BASE: u64 = 0x4600_0000;
/// Start an application processor: RBX = APIC id, RCX = RIP, RDX = RSP,
/// RSI = value for RDI. Returns 0, `-EINVAL` (no such vCPU or not
/// canonical) or `-EBUSY` (already started).
pub const HC_START_CPU: u64 = HC_FAULTLINE_BASE;
/// Hand a result to the vmm: RBX = guest-physical address and RCX = length
/// of a UTF-8 line `key=value[ key=value...]`. Returns 0, `-EFAULT` or
/// `-E2BIG` (over [`REPORT_MAX`] bytes).
pub const HC_REPORT: u64 = HC_FAULTLINE_BASE + 1;
/// Power off with exit status RBX (the VM stops; does not return).
pub const HC_SHUTDOWN: u64 = HC_FAULTLINE_BASE + 2;
/// Longest [`HC_REPORT`] line.
pub const REPORT_MAX: u64 = 4096;

// ---- Asynchronous page faults: KVM's x86 ABI ----
//
// CPUID 0x40000001 EAX advertises [`KVM_FEATURE_ASYNC_PF`] and
// [`KVM_FEATURE_ASYNC_PF_INT`] when the hv runs `--apf pv` with the x86
// protocol. The guest enables delivery per vCPU by writing
// [`MSR_KVM_ASYNC_PF_INT`] (the page-ready vector) and then
// [`MSR_KVM_ASYNC_PF_EN`] = gpa of its 64-byte-aligned [`KvmApfData`] |
// [`KVM_ASYNC_PF_ENABLED`] | [`KVM_ASYNC_PF_DELIVERY_AS_INT`] (and
// [`KVM_ASYNC_PF_SEND_ALWAYS`] to be told at CPL 0 too).
//
// Page not present: a #PF with error code 0, CR2 = token, and
// `KvmApfData::flags` = [`KVM_PV_REASON_PAGE_NOT_PRESENT`]; the guest clears
// `flags`, puts the task to sleep on the token and schedules another.
// Page ready: `KvmApfData::token` = token (or [`APF_WAKE_ALL`]) and an
// interrupt on the page-ready vector; the guest wakes the waiter, zeroes
// `token` and writes 1 to [`MSR_KVM_ASYNC_PF_ACK`] so the next can come.

/// CPUID 0x40000001 EAX: asynchronous page faults.
pub const KVM_FEATURE_ASYNC_PF: u32 = 1 << 4;
/// CPUID 0x40000001 EAX: KVM_HC_KICK_CPU wakes a halted vCPU.
pub const KVM_FEATURE_PV_UNHALT: u32 = 1 << 7;
/// CPUID 0x40000001 EAX: page-ready notifications as an interrupt.
pub const KVM_FEATURE_ASYNC_PF_INT: u32 = 1 << 14;

/// Enable and area address (bits 63:6).
pub const MSR_KVM_ASYNC_PF_EN: u32 = 0x4b56_4d02;
/// Page-ready interrupt vector (bits 7:0; higher bits are reserved).
pub const MSR_KVM_ASYNC_PF_INT: u32 = 0x4b56_4d06;
/// Write 1: the page-ready slot is free again.
pub const MSR_KVM_ASYNC_PF_ACK: u32 = 0x4b56_4d07;

/// `MSR_KVM_ASYNC_PF_EN` bit 0.
pub const KVM_ASYNC_PF_ENABLED: u64 = 1 << 0;
/// `MSR_KVM_ASYNC_PF_EN` bit 1: also deliver page-not-present at CPL 0.
pub const KVM_ASYNC_PF_SEND_ALWAYS: u64 = 1 << 1;
/// `MSR_KVM_ASYNC_PF_EN` bit 2: nested-only; #GP here (not advertised).
pub const KVM_ASYNC_PF_DELIVERY_AS_PF_VMEXIT: u64 = 1 << 2;
/// `MSR_KVM_ASYNC_PF_EN` bit 3: page-ready as an interrupt (required).
pub const KVM_ASYNC_PF_DELIVERY_AS_INT: u64 = 1 << 3;
/// `MSR_KVM_ASYNC_PF_EN` bits 5:4 are reserved (#GP if set).
pub const KVM_ASYNC_PF_RESERVED: u64 = 0x30;

/// `KvmApfData::flags`: the #PF is a page-not-present notification.
pub const KVM_PV_REASON_PAGE_NOT_PRESENT: u32 = 1;
/// Page-ready token meaning "wake every waiter" (after a cancel or restore).
pub const APF_WAKE_ALL: u32 = u32::MAX;

/// KVM's `struct kvm_vcpu_pv_apf_data`: the per-vCPU 64-byte area.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvmApfData {
    /// [`KVM_PV_REASON_PAGE_NOT_PRESENT`] while a not-present #PF is pending.
    pub flags: u32,
    /// Page-ready token; 0 when the slot is free.
    pub token: u32,
    pub pad: [u32; 14],
}

// ---- Asynchronous page faults: the event protocol (after seed 002) ----
//
// Selected with `--apf pv --apf-protocol event`. CPUID advertises no
// ASYNC_PF bit (the MSRs above give #GP); the guest finds the protocol with
// [`HC_APF_VERSION`]. Both notifications are interrupts on vectors the
// guest chooses, with the token in a 64-byte [`ApfEventArea`]:
// - page not present: `notpresent_token` = token, then an interrupt on the
//   not-present vector (delivered only when the slot is 0, IF = 1, no other
//   event is pending and, unless [`APF_EVENT_SEND_ALWAYS`], at CPL 3);
//   the guest reads the token, zeroes the slot and sleeps the task;
// - page ready: `ready_token` = token (or [`APF_WAKE_ALL`]), then an
//   interrupt on the ready vector; the guest wakes the waiter, zeroes the
//   slot and calls [`HC_APF_ACK`].

/// Returns [`APF_EVENT_VERSION`], or `-KVM_ENOSYS` when the event protocol
/// is not offered.
pub const HC_APF_VERSION: u64 = HC_FAULTLINE_BASE + 3;
/// Returns the most page-not-present notifications outstanding per vCPU.
pub const HC_APF_SLOTS: u64 = HC_FAULTLINE_BASE + 4;
/// RBX = gpa of the [`ApfEventArea`] (64-byte aligned), RCX = not-present
/// vector, RDX = page-ready vector (both 32..=255 and different), RSI =
/// flags ([`APF_EVENT_SEND_ALWAYS`]). Returns 0, `-EINVAL` or `-EFAULT`.
pub const HC_APF_ENABLE: u64 = HC_FAULTLINE_BASE + 5;
/// Disables delivery and cancels everything outstanding. Returns 0.
pub const HC_APF_DISABLE: u64 = HC_FAULTLINE_BASE + 6;
/// The page-ready slot is free again. Returns 0, or `-EINVAL` if disabled.
pub const HC_APF_ACK: u64 = HC_FAULTLINE_BASE + 7;
/// The event protocol's version.
pub const APF_EVENT_VERSION: u64 = 1;
/// `HC_APF_ENABLE` flag: also deliver page-not-present at CPL 0.
pub const APF_EVENT_SEND_ALWAYS: u64 = 1 << 0;
/// Most notifications outstanding per vCPU (both protocols, as KVM's
/// ASYNC_PF_PER_VCPU).
pub const APF_MAX_OUTSTANDING: u64 = 64;

/// The event protocol's per-vCPU shared area.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApfEventArea {
    /// Token of the page-not-present event being delivered; 0 when free.
    pub notpresent_token: u32,
    /// Token of the page-ready interrupt being delivered; 0 when free.
    pub ready_token: u32,
    pub pad: [u32; 14],
}

const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    assert!(size_of::<KvmApfData>() == 64 && align_of::<KvmApfData>() == 64);
    assert!(offset_of!(KvmApfData, flags) == 0);
    assert!(offset_of!(KvmApfData, token) == 4);
    assert!(size_of::<ApfEventArea>() == 64 && align_of::<ApfEventArea>() == 64);
    assert!(offset_of!(ApfEventArea, notpresent_token) == 0);
    assert!(offset_of!(ApfEventArea, ready_token) == 4);
};

// ---- kvmclock: KVM's paravirtual clock ----
//
// CPUID 0x40000001 EAX advertises [`KVM_FEATURE_CLOCKSOURCE2`] and
// [`KVM_FEATURE_CLOCKSOURCE_STABLE_BIT`]. The guest writes
// [`MSR_KVM_SYSTEM_TIME_NEW`] = gpa of a 32-byte [`PvclockVcpuTimeInfo`] |
// [`KVM_SYSTEM_TIME_ENABLE`] per vCPU; the hv fills it (and refreshes it
// whenever the vCPU's TSC is written), and the guest computes nanoseconds
// since the VM started as
// `system_time + (((tsc - tsc_timestamp) << tsc_shift) * tsc_to_system_mul >> 32)`
// (a negative shift shifts right), retrying while `version` is odd or
// changes under it. Writing [`MSR_KVM_WALL_CLOCK_NEW`] = gpa of a
// [`PvclockWallClock`] makes the hv write the wall-clock time at which the
// clock above read zero.

/// CPUID 0x40000001 EAX: the kvmclock MSRs at 0x4b564d00/01.
pub const KVM_FEATURE_CLOCKSOURCE2: u32 = 1 << 3;
/// CPUID 0x40000001 EAX: [`PVCLOCK_TSC_STABLE_BIT`] is meaningful.
pub const KVM_FEATURE_CLOCKSOURCE_STABLE_BIT: u32 = 1 << 24;
/// Write: the gpa of a [`PvclockWallClock`] to fill.
pub const MSR_KVM_WALL_CLOCK_NEW: u32 = 0x4b56_4d00;
/// The gpa of this vCPU's [`PvclockVcpuTimeInfo`] | [`KVM_SYSTEM_TIME_ENABLE`].
pub const MSR_KVM_SYSTEM_TIME_NEW: u32 = 0x4b56_4d01;
/// `MSR_KVM_SYSTEM_TIME_NEW` bit 0.
pub const KVM_SYSTEM_TIME_ENABLE: u64 = 1 << 0;
/// `PvclockVcpuTimeInfo::flags`: every vCPU's TSC runs at the same rate
/// from the same origin, so readings are monotonic across vCPUs.
pub const PVCLOCK_TSC_STABLE_BIT: u8 = 1 << 0;

/// The pvclock ABI's `struct pvclock_vcpu_time_info`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PvclockVcpuTimeInfo {
    /// Even when stable; bumped by 2 on every update.
    pub version: u32,
    pub pad0: u32,
    pub tsc_timestamp: u64,
    /// Nanoseconds since the VM started, at `tsc_timestamp`.
    pub system_time: u64,
    pub tsc_to_system_mul: u32,
    pub tsc_shift: i8,
    pub flags: u8,
    pub pad: [u8; 2],
}

/// The pvclock ABI's `struct pvclock_wall_clock`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PvclockWallClock {
    pub version: u32,
    pub sec: u32,
    pub nsec: u32,
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<PvclockVcpuTimeInfo>() == 32);
    assert!(offset_of!(PvclockVcpuTimeInfo, version) == 0);
    assert!(offset_of!(PvclockVcpuTimeInfo, tsc_timestamp) == 8);
    assert!(offset_of!(PvclockVcpuTimeInfo, system_time) == 16);
    assert!(offset_of!(PvclockVcpuTimeInfo, tsc_to_system_mul) == 24);
    assert!(offset_of!(PvclockVcpuTimeInfo, tsc_shift) == 28);
    assert!(offset_of!(PvclockVcpuTimeInfo, flags) == 29);
    assert!(size_of::<PvclockWallClock>() == 12);
    assert!(offset_of!(PvclockWallClock, sec) == 4);
    assert!(offset_of!(PvclockWallClock, nsec) == 8);
};

// ---- The paravirtual CR3 cache (seed 004) ----
//
// Under shadow paging, CPUID 0x40000001 EAX advertises
// [`KVM_FEATURE_CR3_CACHE`] (a bit of the faultline-private range 28-31,
// which KVM leaves unused). Each CPU registers a [`Cr3Cache`] with
// [`HC_CR3_CACHE_REGISTER`]; the hv fills its entries with {guest CR3,
// shadow root} pairs and loads the same roots into the CPU's CR3-target
// list. To switch address space the guest first stores the CR3 it wants
// in `wanted_cr3`, then looks it up: on a hit it loads `host_cr3` (no VM
// exit), on a miss its own CR3 (an exit, after which the hv adds the
// pair). A `host_cr3` carries [`CR3_CACHE_HOST_MARK`] (bit 11, ignored by
// the CPU without CR4.PCIDE), so a load of an entry the hv dropped while
// the guest was looking is told apart from a guest CR3: the hv then loads
// `wanted_cr3`. A registered guest never sets that bit in its own CR3.

/// CPUID 0x40000001 EAX: [`HC_CR3_CACHE_REGISTER`] is available.
pub const KVM_FEATURE_CR3_CACHE: u32 = 1 << 28;
/// Register this CPU's [`Cr3Cache`]: RBX = its guest-physical address
/// (8-byte aligned, within one page), or 0 to unregister. Returns the
/// entries the hv will fill (its CR3-target count), `-EINVAL` (misaligned,
/// crosses a page), `-EFAULT` (not RAM) or `-KVM_ENOSYS` (not offered).
pub const HC_CR3_CACHE_REGISTER: u64 = HC_FAULTLINE_BASE + 0x10;
/// Entries a [`Cr3Cache`] has room for (the largest `--cr3-targets`).
pub const CR3_CACHE_MAX: usize = 16;
/// Bit 11 of every `host_cr3` the hv publishes.
pub const CR3_CACHE_HOST_MARK: u64 = 1 << 11;

/// One {guest CR3, shadow root} pair; `host_cr3` 0 is an empty entry.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cr3CacheEntry {
    pub guest_cr3: u64,
    pub host_cr3: u64,
}

/// A CPU's CR3 cache, shared with the hv (after the seed's
/// `struct kvm_cr3_cache`, with the guest's wanted CR3 added).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cr3Cache {
    pub entry: [Cr3CacheEntry; CR3_CACHE_MAX],
    /// Entries in use from the start (the hv's CR3-target count).
    pub max_idx: u32,
    pub pad: u32,
    /// Written by the guest before each lookup: the CR3 it is switching to.
    pub wanted_cr3: u64,
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<Cr3CacheEntry>() == 16);
    assert!(offset_of!(Cr3CacheEntry, host_cr3) == 8);
    assert!(offset_of!(Cr3Cache, max_idx) == 16 * CR3_CACHE_MAX);
    assert!(offset_of!(Cr3Cache, wanted_cr3) == 16 * CR3_CACHE_MAX + 8);
    assert!(size_of::<Cr3Cache>() == 16 * CR3_CACHE_MAX + 16);
};

// ---- Steal time, PV TLB flush, PV sched yield: KVM's ABI ----
//
// CPUID 0x40000001 EAX advertises [`KVM_FEATURE_STEAL_TIME`],
// [`KVM_FEATURE_PV_TLB_FLUSH`] and [`KVM_FEATURE_PV_SCHED_YIELD`] (and
// [`KVM_FEATURE_PV_UNHALT`] above). Each vCPU writes
// [`MSR_KVM_STEAL_TIME`] = gpa of its 64-byte-aligned [`KvmStealTime`] |
// [`KVM_MSR_ENABLED`] (bits 5:1 reserved: #GP). Whenever the vCPU is
// scheduled in again after waiting for a host CPU the hv adds the wait, in
// nanoseconds, to `steal` between two increments of `version` (odd while it
// writes: the guest retries a read that saw an odd or changed version).
// While the vCPU is preempted (runnable but on no host CPU) `preempted`
// holds [`KVM_VCPU_PREEMPTED`]; a guest that wants to flush that vCPU's TLB
// sets [`KVM_VCPU_FLUSH_TLB`] in it with a compare-and-exchange instead of
// sending an IPI, and the hv flushes the vCPU's TLB before it next runs
// guest code (KVM's `record_steal_time`). [`KVM_HC_SCHED_YIELD`] gives the
// caller's host CPU to the vCPU with the APIC id in RBX if that vCPU is
// preempted; [`KVM_HC_KICK_CPU`] (RBX flags, RCX APIC id) wakes a vCPU
// halted with interrupts off.

/// CPUID 0x40000001 EAX: [`MSR_KVM_STEAL_TIME`].
pub const KVM_FEATURE_STEAL_TIME: u32 = 1 << 5;
/// CPUID 0x40000001 EAX: [`KVM_VCPU_FLUSH_TLB`] in a preempted vCPU's area.
pub const KVM_FEATURE_PV_TLB_FLUSH: u32 = 1 << 9;
/// CPUID 0x40000001 EAX: [`KVM_HC_SCHED_YIELD`].
pub const KVM_FEATURE_PV_SCHED_YIELD: u32 = 1 << 13;
/// CPUID 0x40000001 EAX: [`KVM_HC_SEND_IPI`] (KVM's `KVM_FEATURE_PV_SEND_IPI`):
/// one hypercall sends a fixed IPI to every APIC id `RDX + i` for each bit
/// `i` set in RBX (and `RDX + 64 + i` for RCX; 32 bits each from 32-bit
/// code), with the vector and delivery mode from the ICR value in RSI
/// (physical destination, no shorthand); it returns how many were sent.
pub const KVM_FEATURE_PV_SEND_IPI: u32 = 1 << 11;
/// The gpa of this vCPU's [`KvmStealTime`] | [`KVM_MSR_ENABLED`].
pub const MSR_KVM_STEAL_TIME: u32 = 0x4b56_4d03;
/// CPUID 0x40000001 EAX: [`MSR_KVM_PV_EOI_EN`] (KVM's `KVM_FEATURE_PV_EOI`).
pub const KVM_FEATURE_PV_EOI: u32 = 1 << 6;
/// The gpa of this vCPU's PV EOI flag word (4-byte aligned) |
/// [`KVM_MSR_ENABLED`]. Before an entry with exactly one vector in service
/// and none pending, the hv sets the flag's bit 0 ([`KVM_PV_EOI_BIT`]); an
/// EOI that finds it set only clears it (no APIC write), and the hv does
/// that EOI at the next exit. The hv writes the flag as one byte.
pub const MSR_KVM_PV_EOI_EN: u32 = 0x4b56_4d04;
/// Bit 0 of the PV EOI flag (KVM's `KVM_PV_EOI_BIT`).
pub const KVM_PV_EOI_BIT: u32 = 0;
/// KVM's `KVM_MSR_ENABLED` (bit 0 of the PV area MSRs).
pub const KVM_MSR_ENABLED: u64 = 1;
/// `MSR_KVM_STEAL_TIME` bits 5:1 (KVM's `KVM_STEAL_RESERVED_MASK`).
pub const KVM_STEAL_RESERVED_MASK: u64 = 0x3e;
/// `MSR_KVM_STEAL_TIME` bits 63:6: the area (KVM's `KVM_STEAL_VALID_BITS`).
pub const KVM_STEAL_VALID_BITS: u64 = !0x3f;
/// `KvmStealTime::preempted`: the vCPU waits for a host CPU.
pub const KVM_VCPU_PREEMPTED: u8 = 1 << 0;
/// `KvmStealTime::preempted`: flush its TLB before it runs again.
pub const KVM_VCPU_FLUSH_TLB: u8 = 1 << 1;

/// KVM's `struct kvm_steal_time`.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvmStealTime {
    /// Nanoseconds the vCPU waited for a host CPU while runnable.
    pub steal: u64,
    /// Odd while the hv updates `steal`.
    pub version: u32,
    pub flags: u32,
    /// [`KVM_VCPU_PREEMPTED`] | [`KVM_VCPU_FLUSH_TLB`].
    pub preempted: u8,
    pub u8_pad: [u8; 3],
    pub pad: [u32; 11],
}

const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    assert!(size_of::<KvmStealTime>() == 64 && align_of::<KvmStealTime>() == 64);
    assert!(offset_of!(KvmStealTime, steal) == 0);
    assert!(offset_of!(KvmStealTime, version) == 8);
    assert!(offset_of!(KvmStealTime, flags) == 12);
    assert!(offset_of!(KvmStealTime, preempted) == 16);
    assert!(offset_of!(KvmStealTime, pad) == 20);
};

/// Hypercall error numbers, as KVM returns them (negated in RAX).
pub mod errno {
    pub const EPERM: i64 = 1;
    pub const E2BIG: i64 = 7;
    pub const EFAULT: i64 = 14;
    pub const EBUSY: i64 = 16;
    pub const EINVAL: i64 = 22;
    /// KVM's "no such hypercall" (`-KVM_ENOSYS` = -1000).
    pub const KVM_ENOSYS: i64 = 1000;
}

/// I/O port of the COM1 serial console.
pub const COM1_PORT: u16 = 0x3f8;
/// I/O port of the isa-debug-exit device: writing v exits with status
/// `(v << 1) | 1`.
pub const DEBUG_EXIT_PORT: u16 = 0xf4;

/// The dirty-logging workload's contract with the VMM (the hv's test kernel
/// `tests/guests/dirtywrite.c`, run by the dirty-log exactness test and
/// `faultline bench dirty-log`): vCPU `cpu` owns the pages at
/// `REGION_BASE + cpu * pages * 4096`; it starts pass `p` when the word at
/// [`dirtywrite::GO`] reaches `p`, then stores `tsc_start`, writes its
/// pages (each write stores [`dirtywrite::stamp`] in the page's first
/// word), stores `tsc_end` and sets its `done` word to `p`.
pub mod dirtywrite {
    /// The control block.
    pub const CTRL_GPA: u64 = 0x10_0000;
    /// The first vCPU's region.
    pub const REGION_BASE: u64 = 0x80_0000;
    /// Offset of `go` in the control block.
    pub const GO: u64 = 0;
    /// Offset of vCPU `cpu`'s `done` word.
    pub const fn done(cpu: u64) -> u64 {
        64 + 8 * cpu
    }
    /// Offset of vCPU `cpu`'s rdtsc at the start of its last pass.
    pub const fn tsc_start(cpu: u64) -> u64 {
        64 + 8 * (super::MAX_CPUS as u64 + cpu)
    }
    /// Offset of vCPU `cpu`'s rdtsc at the end of its last pass.
    pub const fn tsc_end(cpu: u64) -> u64 {
        64 + 8 * (2 * super::MAX_CPUS as u64 + cpu)
    }
    /// What vCPU `cpu` stores in a page it writes in pass `pass`.
    pub const fn stamp(pass: u64, cpu: u64) -> u64 {
        pass << 32 | 0xd170_0000 | cpu
    }
}
