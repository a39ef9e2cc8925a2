/* faultline's boot and hypercall ABI, guest side. Mirrors crates/abi
 * (the Rust side); the _Static_asserts below use the same numbers as the
 * Rust const asserts, so the two layouts cannot drift apart silently. */
#ifndef FAULTLINE_ABI_H
#define FAULTLINE_ABI_H

#include <stdint.h>
#include <stddef.h>

#define BOOT_INFO_MAGIC 0x31544f4f42544c46ull /* "FLTBOOT1" */
#define BOOT_INFO_VERSION 1
#define MAX_MEM_REGIONS 32
#define MAX_CPUS 64
#define CMDLINE_LEN 512
#define MEM_USABLE 1
#define MEM_RESERVED 2

struct mem_region {
    uint64_t base;
    uint64_t len;
    uint32_t kind;
    uint32_t reserved;
};

struct boot_info {
    uint64_t magic;
    uint32_t version;
    uint32_t num_cpus;
    uint64_t mem_size;
    uint64_t tsc_hz;
    uint64_t kernel_start;
    uint64_t kernel_end;
    uint32_t num_regions;
    uint32_t reserved;
    struct mem_region regions[MAX_MEM_REGIONS];
    uint32_t apic_ids[MAX_CPUS];
    char cmdline[CMDLINE_LEN];
};

_Static_assert(sizeof(struct mem_region) == 24, "mem_region layout");
_Static_assert(offsetof(struct boot_info, magic) == 0, "boot_info layout");
_Static_assert(offsetof(struct boot_info, version) == 8, "boot_info layout");
_Static_assert(offsetof(struct boot_info, num_cpus) == 12, "boot_info layout");
_Static_assert(offsetof(struct boot_info, mem_size) == 16, "boot_info layout");
_Static_assert(offsetof(struct boot_info, tsc_hz) == 24, "boot_info layout");
_Static_assert(offsetof(struct boot_info, kernel_start) == 32, "boot_info layout");
_Static_assert(offsetof(struct boot_info, kernel_end) == 40, "boot_info layout");
_Static_assert(offsetof(struct boot_info, num_regions) == 48, "boot_info layout");
_Static_assert(offsetof(struct boot_info, regions) == 56, "boot_info layout");
_Static_assert(offsetof(struct boot_info, apic_ids) == 56 + 24 * MAX_MEM_REGIONS, "boot_info layout");
_Static_assert(offsetof(struct boot_info, cmdline) == 56 + 24 * MAX_MEM_REGIONS + 4 * MAX_CPUS, "boot_info layout");
_Static_assert(sizeof(struct boot_info) == 56 + 24 * MAX_MEM_REGIONS + 4 * MAX_CPUS + CMDLINE_LEN, "boot_info layout");

#define KVM_HC_KICK_CPU 5
#define KVM_HC_SEND_IPI 10
#define KVM_HC_SCHED_YIELD 11
#define HC_FAULTLINE_BASE 0x46000000ull
#define HC_START_CPU (HC_FAULTLINE_BASE + 0)
#define HC_REPORT (HC_FAULTLINE_BASE + 1)
#define HC_SHUTDOWN (HC_FAULTLINE_BASE + 2)
#define REPORT_MAX 4096

/* Asynchronous page faults: KVM's x86 ABI (see crates/abi for the prose). */
#define KVM_FEATURE_ASYNC_PF (1u << 4)
#define KVM_FEATURE_PV_UNHALT (1u << 7)
#define KVM_FEATURE_ASYNC_PF_INT (1u << 14)
#define MSR_KVM_ASYNC_PF_EN 0x4b564d02u
#define MSR_KVM_ASYNC_PF_INT 0x4b564d06u
#define MSR_KVM_ASYNC_PF_ACK 0x4b564d07u
#define KVM_ASYNC_PF_ENABLED (1ull << 0)
#define KVM_ASYNC_PF_SEND_ALWAYS (1ull << 1)
#define KVM_ASYNC_PF_DELIVERY_AS_PF_VMEXIT (1ull << 2)
#define KVM_ASYNC_PF_DELIVERY_AS_INT (1ull << 3)
#define KVM_ASYNC_PF_RESERVED 0x30ull
#define KVM_PV_REASON_PAGE_NOT_PRESENT 1u
#define APF_WAKE_ALL 0xffffffffu

struct kvm_apf_data {
    uint32_t flags;
    uint32_t token;
    uint32_t pad[14];
} __attribute__((aligned(64)));

/* Asynchronous page faults: the event protocol (after seed 002). */
#define HC_APF_VERSION (HC_FAULTLINE_BASE + 3)
#define HC_APF_SLOTS (HC_FAULTLINE_BASE + 4)
#define HC_APF_ENABLE (HC_FAULTLINE_BASE + 5)
#define HC_APF_DISABLE (HC_FAULTLINE_BASE + 6)
#define HC_APF_ACK (HC_FAULTLINE_BASE + 7)
#define APF_EVENT_VERSION 1
#define APF_EVENT_SEND_ALWAYS (1ull << 0)
#define APF_MAX_OUTSTANDING 64

struct apf_event_area {
    uint32_t notpresent_token;
    uint32_t ready_token;
    uint32_t pad[14];
} __attribute__((aligned(64)));

_Static_assert(sizeof(struct kvm_apf_data) == 64 && _Alignof(struct kvm_apf_data) == 64, "kvm_apf_data layout");
_Static_assert(offsetof(struct kvm_apf_data, flags) == 0, "kvm_apf_data layout");
_Static_assert(offsetof(struct kvm_apf_data, token) == 4, "kvm_apf_data layout");
_Static_assert(sizeof(struct apf_event_area) == 64 && _Alignof(struct apf_event_area) == 64, "apf_event_area layout");
_Static_assert(offsetof(struct apf_event_area, notpresent_token) == 0, "apf_event_area layout");
_Static_assert(offsetof(struct apf_event_area, ready_token) == 4, "apf_event_area layout");

/* kvmclock: KVM's paravirtual clock (see crates/abi for the prose). */
#define KVM_FEATURE_CLOCKSOURCE2 (1u << 3)
#define KVM_FEATURE_CLOCKSOURCE_STABLE_BIT (1u << 24)
#define MSR_KVM_WALL_CLOCK_NEW 0x4b564d00u
#define MSR_KVM_SYSTEM_TIME_NEW 0x4b564d01u
#define KVM_SYSTEM_TIME_ENABLE (1ull << 0)
#define PVCLOCK_TSC_STABLE_BIT (1u << 0)

struct pvclock_vcpu_time_info {
    uint32_t version;
    uint32_t pad0;
    uint64_t tsc_timestamp;
    uint64_t system_time;
    uint32_t tsc_to_system_mul;
    int8_t tsc_shift;
    uint8_t flags;
    uint8_t pad[2];
} __attribute__((packed));

struct pvclock_wall_clock {
    uint32_t version;
    uint32_t sec;
    uint32_t nsec;
} __attribute__((packed));

_Static_assert(sizeof(struct pvclock_vcpu_time_info) == 32, "pvclock_vcpu_time_info layout");
_Static_assert(offsetof(struct pvclock_vcpu_time_info, tsc_timestamp) == 8, "pvclock_vcpu_time_info layout");
_Static_assert(offsetof(struct pvclock_vcpu_time_info, system_time) == 16, "pvclock_vcpu_time_info layout");
_Static_assert(offsetof(struct pvclock_vcpu_time_info, tsc_to_system_mul) == 24, "pvclock_vcpu_time_info layout");
_Static_assert(offsetof(struct pvclock_vcpu_time_info, tsc_shift) == 28, "pvclock_vcpu_time_info layout");
_Static_assert(offsetof(struct pvclock_vcpu_time_info, flags) == 29, "pvclock_vcpu_time_info layout");
_Static_assert(sizeof(struct pvclock_wall_clock) == 12, "pvclock_wall_clock layout");
_Static_assert(offsetof(struct pvclock_wall_clock, sec) == 4, "pvclock_wall_clock layout");
_Static_assert(offsetof(struct pvclock_wall_clock, nsec) == 8, "pvclock_wall_clock layout");

/* The paravirtual CR3 cache (see crates/abi for the prose). */
#define KVM_FEATURE_CR3_CACHE (1u << 28)
#define HC_CR3_CACHE_REGISTER (HC_FAULTLINE_BASE + 0x10)
#define CR3_CACHE_MAX 16
#define CR3_CACHE_HOST_MARK (1ull << 11)

struct cr3_cache_entry {
    uint64_t guest_cr3;
    uint64_t host_cr3;
};

struct cr3_cache {
    struct cr3_cache_entry entry[CR3_CACHE_MAX];
    uint32_t max_idx;
    uint32_t pad;
    uint64_t wanted_cr3;
};

_Static_assert(sizeof(struct cr3_cache_entry) == 16, "cr3_cache_entry layout");
_Static_assert(offsetof(struct cr3_cache_entry, host_cr3) == 8, "cr3_cache_entry layout");
_Static_assert(offsetof(struct cr3_cache, max_idx) == 16 * CR3_CACHE_MAX, "cr3_cache layout");
_Static_assert(offsetof(struct cr3_cache, wanted_cr3) == 16 * CR3_CACHE_MAX + 8, "cr3_cache layout");
_Static_assert(sizeof(struct cr3_cache) == 16 * CR3_CACHE_MAX + 16, "cr3_cache layout");

/* Steal time, PV TLB flush, PV sched yield: KVM's ABI (see crates/abi). */
#define KVM_FEATURE_STEAL_TIME (1u << 5)
#define KVM_FEATURE_PV_TLB_FLUSH (1u << 9)
#define KVM_FEATURE_PV_SCHED_YIELD (1u << 13)
#define KVM_FEATURE_PV_SEND_IPI (1u << 11)
#define MSR_KVM_STEAL_TIME 0x4b564d03u
#define KVM_MSR_ENABLED 1ull
#define KVM_STEAL_RESERVED_MASK 0x3eull
#define KVM_VCPU_PREEMPTED (1u << 0)
#define KVM_VCPU_FLUSH_TLB (1u << 1)
/* PV EOI: KVM's ABI (see crates/abi). */
#define KVM_FEATURE_PV_EOI (1u << 6)
#define MSR_KVM_PV_EOI_EN 0x4b564d04u
#define KVM_PV_EOI_BIT 0

struct kvm_steal_time {
    uint64_t steal;
    uint32_t version;
    uint32_t flags;
    uint8_t preempted;
    uint8_t u8_pad[3];
    uint32_t pad[11];
} __attribute__((aligned(64)));

_Static_assert(sizeof(struct kvm_steal_time) == 64 && _Alignof(struct kvm_steal_time) == 64, "kvm_steal_time layout");
_Static_assert(offsetof(struct kvm_steal_time, version) == 8, "kvm_steal_time layout");
_Static_assert(offsetof(struct kvm_steal_time, flags) == 12, "kvm_steal_time layout");
_Static_assert(offsetof(struct kvm_steal_time, preempted) == 16, "kvm_steal_time layout");
_Static_assert(offsetof(struct kvm_steal_time, pad) == 20, "kvm_steal_time layout");

#define HC_EPERM 1
#define HC_E2BIG 7
#define HC_EFAULT 14
#define HC_EBUSY 16
#define HC_EINVAL 22
#define KVM_ENOSYS 1000

#define COM1_PORT 0x3f8
#define DEBUG_EXIT_PORT 0xf4

static inline long hypercall4(unsigned long nr, unsigned long a0, unsigned long a1,
                              unsigned long a2, unsigned long a3) {
    long ret;
    __asm__ volatile("vmcall"
                     : "=a"(ret)
                     : "a"(nr), "b"(a0), "c"(a1), "d"(a2), "S"(a3)
                     : "memory");
    return ret;
}

#endif
