/* Exercises the async-PF ABI's guest-facing checks in ring 0 with a #GP
 * handler (msr_probe.h) that skips the faulting WRMSR and counts it. Prints
 * one `name=value` line per probe; the Rust test compares them with what
 * KVM would do for the VM's --apf configuration. */
#include "msr_probe.h"

static struct kvm_apf_data x86_area;
static struct apf_event_area event_area;

__attribute__((section(".text.start"))) void _start(struct boot_info *bi) {
    (void)bi;
    setup_idt();
    uint32_t r[4];
    cpuid(0x40000001, r);
    line("features", r[0]);
    uint64_t area = (uint64_t)&x86_area;
    uint64_t on = KVM_ASYNC_PF_ENABLED | KVM_ASYNC_PF_DELIVERY_AS_INT;
    line("gp_reserved", try_wrmsr(MSR_KVM_ASYNC_PF_EN, area | on | 0x10));
    line("gp_pf_vmexit", try_wrmsr(MSR_KVM_ASYNC_PF_EN, area | on | KVM_ASYNC_PF_DELIVERY_AS_PF_VMEXIT));
    line("gp_outside", try_wrmsr(MSR_KVM_ASYNC_PF_EN, 0x7ff00000000ull | on));
    line("gp_int_high", try_wrmsr(MSR_KVM_ASYNC_PF_INT, 0x1ec));
    line("gp_int", try_wrmsr(MSR_KVM_ASYNC_PF_INT, 0xec));
    line("gp_enable", try_wrmsr(MSR_KVM_ASYNC_PF_EN, area | on));
    /* Enabled while the local APIC is still software-disabled, as Linux's
     * boot CPU does: the wake-all waits for the APIC (KVM's
     * kvm_arch_can_dequeue_async_page_present), then arrives. */
    line("token_apic_off", x86_area.token);
    wrmsr(0x80f, 0x1ff); /* x2APIC SVR: software enable, spurious vector 0xff */
    cpuid(0, r);         /* an exit, after which the hv delivers */
    line("token_after_enable", x86_area.token);
    line("ready_pending", (rdmsr(0x827) >> (0xec - 224)) & 1); /* IRR bit of 0xec */
    x86_area.token = 0;
    line("gp_ack", try_wrmsr(MSR_KVM_ASYNC_PF_ACK, 1));
    line("gp_disable", try_wrmsr(MSR_KVM_ASYNC_PF_EN, 0));

    long v = hypercall4(HC_APF_VERSION, 0, 0, 0, 0);
    line("hc_version", (uint64_t)v);
    line("hc_slots", (uint64_t)hypercall4(HC_APF_SLOTS, 0, 0, 0, 0));
    uint64_t ea = (uint64_t)&event_area;
    line("hc_enable_misaligned", (uint64_t)hypercall4(HC_APF_ENABLE, ea + 8, 0x23, 0x22, 0));
    line("hc_enable_same_vector", (uint64_t)hypercall4(HC_APF_ENABLE, ea, 0x22, 0x22, 0));
    line("hc_enable_low_vector", (uint64_t)hypercall4(HC_APF_ENABLE, ea, 0x3, 0x22, 0));
    line("hc_enable_bad_flags", (uint64_t)hypercall4(HC_APF_ENABLE, ea, 0x23, 0x22, 2));
    line("hc_enable_outside", (uint64_t)hypercall4(HC_APF_ENABLE, 0x7ff00000000ull, 0x23, 0x22, 0));
    line("hc_enable", (uint64_t)hypercall4(HC_APF_ENABLE, ea, 0x23, 0x22, 0));
    line("ready_after_enable", event_area.ready_token);
    event_area.ready_token = 0;
    line("hc_ack", (uint64_t)hypercall4(HC_APF_ACK, 0, 0, 0, 0));
    line("hc_disable", (uint64_t)hypercall4(HC_APF_DISABLE, 0, 0, 0, 0));
    line("hc_ack_disabled", (uint64_t)hypercall4(HC_APF_ACK, 0, 0, 0, 0));
    debug_exit(0x21);
}
