/* Exercises the async-PF ABI's guest-facing checks in ring 0 with a #GP
 * handler that skips the faulting 2-byte WRMSR/RDMSR and counts it. Prints
 * one `name=value` line per probe; the Rust test compares them with what
 * KVM would do for the VM's --apf configuration. */
#include "common.h"

static struct kvm_apf_data x86_area;
static struct apf_event_area event_area;
volatile uint64_t gp_count;

struct idt_entry {
    uint16_t off_lo, sel;
    uint8_t ist, type;
    uint16_t off_mid;
    uint32_t off_hi, zero;
} __attribute__((packed));
static struct idt_entry idt[32];

void gp_handler(void);
__asm__(".globl gp_handler\n"
        "gp_handler:\n"
        "  add $8, %rsp\n"          /* the error code */
        "  addq $2, (%rsp)\n"       /* skip WRMSR/RDMSR (0f 30 / 0f 32) */
        "  incq gp_count(%rip)\n"
        "  iretq\n");

static void setup_idt(void) {
    uint64_t h = (uint64_t)gp_handler;
    idt[13] = (struct idt_entry){(uint16_t)h, 0x08, 0, 0x8e, (uint16_t)(h >> 16), (uint32_t)(h >> 32), 0};
    struct { uint16_t limit; uint64_t base; } __attribute__((packed)) idtr = {sizeof(idt) - 1, (uint64_t)idt};
    __asm__ volatile("lidt %0" ::"m"(idtr));
}

static void line(const char *name, uint64_t v) {
    puts_serial(name);
    putc_serial('=');
    puthex(v);
    putc_serial('\n');
}

/* How many #GPs the write raised (0 or 1). */
static uint64_t try_wrmsr(uint32_t msr, uint64_t v) {
    uint64_t before = gp_count;
    wrmsr(msr, v);
    return gp_count - before;
}

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
    line("token_after_enable", x86_area.token);
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
