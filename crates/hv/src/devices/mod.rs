//! The platform's devices and the buses that reach them.
//!
//! Port I/O exits and MMIO accesses (EPT violations outside guest RAM)
//! are dispatched by address range to:
//!
//! | device | where |
//! |---|---|
//! | COM1, a 16550A UART (`serial`) | ports 0x3f8..0x400, IRQ 4 |
//! | isa-debug-exit | port 0xf4 |
//! | fw_cfg (`fw_cfg`) | ports 0x510 (selector), 0x511 (data) |
//! | ACPI sleep control / status (`acpi`) | ports 0x600, 0x601 |
//! | guest exit status (faultline's own) | port 0x606 |
//! | guest report lines (faultline's own) | port 0x607 |
//! | IOAPIC (`ioapic`) | MMIO 0xfec00000..0xfec01000 |
//!
//! Multiboot kernels (the kvm-unit-tests suite's) also get QEMU's test
//! device, the legacy PIC, the CMOS RTC and fixed-hardware ACPI's PM1
//! registers with S3 ([`Platform::attach_test_devices`]):
//!
//! | device | where |
//! |---|---|
//! | pc-testdev (`testdev`) | ports 0xe0..0xec, 0x2000..0x2018 (IRQ lines), MMIO 0xff000000..0xff010000 |
//! | 8259A pair (`pic`) | ports 0x20, 0x21, 0xa0, 0xa1 |
//! | MC146818 RTC and CMOS RAM (`rtc`) | ports 0x70 (index), 0x71 (data) |
//! | ACPI PM1a event block, control block (`acpi::Pm1`) | ports 0x610..0x614, 0x614..0x616 |
//!
//! A write of SLP_EN with S3's SLP_TYP to PM1a_CNT puts the machine in
//! S3: the VM (`vm::sleep`) stops every vCPU, keeps memory, and wakes the
//! boot vCPU at the FACS's waking vector when an enabled wake event (the
//! RTC alarm with RTC_EN) comes ([`Platform::suspend`]).
//!
//! With `--device edu` or `--iommu intel` ([`DeviceSet`]) the platform
//! also has a PCI bus and what was asked for:
//!
//! | device | where |
//! |---|---|
//! | PCI configuration mechanism #1 (`pci`): host bridge 00:00.0 | ports 0xcf8 (address, 32-bit), 0xcfc..0xd00 (data) |
//! | QEMU's `edu` (`edu`), 00:03.0 | BAR0: MMIO 0xfe000000..0xfe100000, INTx A on GSI 16, MSI |
//! | Intel VT-d remapping unit (`vtd`) | MMIO 0xfed90000..0xfed91000; the ACPI DMAR table names it |
//!
//! Their work that reaches guest memory (the edu's DMA, interrupt
//! remapping table lookups, the invalidation queue) is done by
//! [`Chipset::service`] after the access that started it, before any
//! vCPU runs again, through [`GuestMemory`].
//!
//! (The xAPIC page at 0xfee00000 is the vCPU's own local APIC:
//! `crate::vcpu::xapic`.) Nothing else is attached: other ports read as
//! all ones (so the PIT, and for other kernels the legacy PIC, are
//! cleanly absent, as the MADT says) and writes to them are ignored.
//! Devices raise interrupts by ISA IRQ, routed through the IOAPIC to
//! local APICs as interrupt messages, and through the PIC (when
//! attached) to LINT0.

pub mod acpi;
pub mod edu;
pub mod fw_cfg;
pub mod ioapic;
pub mod pci;
pub mod pic;
pub mod rtc;
pub mod serial;
pub mod testdev;
pub mod vtd;

use crate::time::Cycles;
use ioapic::{IoApic, IOAPIC_BASE, IOAPIC_SIZE};
use machine::vmx::Ipi;
use pic::Pic;
use serial::{Uart, COM1_IRQ, UART_PORTS};
use testdev::TestDev;

/// A port-I/O device, by what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PioDevice {
    Com1,
    DebugExit,
    FwCfgSelector,
    FwCfgData,
    SleepControl,
    SleepStatus,
    GuestStatus,
    GuestReport,
}

/// The port bus: (first port, count, device).
const PIO_BUS: [(u16, u16, PioDevice); 8] = [
    (abi::COM1_PORT, UART_PORTS, PioDevice::Com1),
    (abi::DEBUG_EXIT_PORT, 1, PioDevice::DebugExit),
    (fw_cfg::FW_CFG_SELECTOR, 1, PioDevice::FwCfgSelector),
    (fw_cfg::FW_CFG_DATA, 1, PioDevice::FwCfgData),
    (acpi::SLEEP_CONTROL_PORT, 1, PioDevice::SleepControl),
    (acpi::SLEEP_STATUS_PORT, 1, PioDevice::SleepStatus),
    (GUEST_STATUS_PORT, 1, PioDevice::GuestStatus),
    (GUEST_REPORT_PORT, 1, PioDevice::GuestReport),
];

/// faultline's guest exit-status register: a byte written here is what the
/// guest wants its run's exit status to be when it then powers off (a
/// Linux guest's init, which cannot make a hypercall from user space,
/// writes its program's status here with `outb` after `ioperm`). Next to
/// the ACPI registers, in no standard device's range.
pub const GUEST_STATUS_PORT: u16 = 0x606;

/// faultline's guest report port: the bytes written here (one `outb` each)
/// form lines, and each newline hands its line to the hv as a report, as
/// HC_REPORT does for the project's own guest (a Linux guest's init
/// forwards its program's result lines here: `guest/linux/report.h`). A
/// line is cut at [`abi::REPORT_MAX`] bytes; bytes that are not UTF-8
/// become U+FFFD.
pub const GUEST_REPORT_PORT: u16 = 0x607;

fn pio_device(port: u16) -> Option<(PioDevice, u16)> {
    PIO_BUS
        .iter()
        .find(|(base, count, _)| port >= *base && port - base < *count)
        .map(|(base, _, device)| (*device, port - base))
}

/// What a device write asks of the VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceStop {
    /// isa-debug-exit: stop with this status.
    DebugExit { status: u32 },
    /// The guest entered S5 through the FADT's sleep control register.
    PowerOff,
}

/// How the platform is built.
#[derive(Debug, Clone, Default)]
pub struct PlatformConfig {
    pub ram_size: u64,
    pub vcpus: u16,
    pub cmdline: String,
    /// Bytes the console (COM1) offers the guest to read.
    pub console_input: Vec<u8>,
    /// The optional devices.
    pub devices: DeviceSet,
}

/// The optional devices (off by default); either brings the PCI bus.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceSet {
    /// QEMU's `edu` PCI device (`--device edu`).
    pub edu: bool,
    /// An Intel VT-d remapping unit (`--iommu intel`), with interrupt
    /// remapping; the IOAPIC then honours remappable-format entries.
    pub intel_iommu: bool,
}

/// Guest-physical memory as a device reaches it (DMA, table walks): the
/// VM's own path, which faults swapped pages back in and marks written
/// pages dirty (`Shared`'s implementation).
pub trait GuestMemory {
    /// Reads `buf.len()` bytes at `gpa`; `false` if some are not RAM.
    fn read(&mut self, gpa: u64, buf: &mut [u8]) -> bool;
    /// Writes `bytes` at `gpa`; `false` if some are not RAM (those are
    /// dropped).
    fn write(&mut self, gpa: u64, bytes: &[u8]) -> bool;
}

/// The PCI bus, its devices and the IOMMU.
#[derive(Debug, Clone)]
pub struct Chipset {
    /// The configuration address register (port 0xcf8).
    address: u32,
    host_bridge: pci::ConfigSpace,
    pub edu: Option<edu::Edu>,
    pub vtd: Option<vtd::Vtd>,
    /// The level the edu's INTx line was last driven to.
    intx: bool,
}

impl Chipset {
    pub fn new(devices: DeviceSet) -> Chipset {
        Chipset {
            address: 0,
            host_bridge: pci::host_bridge(),
            edu: devices.edu.then(edu::Edu::new),
            vtd: devices.intel_iommu.then(vtd::Vtd::new),
            intx: false,
        }
    }

    /// Whether [`Chipset::service`] has something to do.
    pub fn work_pending(&self) -> bool {
        self.edu.as_ref().is_some_and(edu::Edu::has_work)
            || self.vtd.as_ref().is_some_and(vtd::Vtd::has_work)
    }

    fn config_read(&self, port: u16, size: u8) -> u32 {
        let Some((bus, devfn, reg)) = pci::decode_address(self.address) else {
            return u32::MAX;
        };
        let at = reg | usize::from(port - pci::CONFIG_DATA);
        match (bus, devfn) {
            (0, 0) => self.host_bridge.read(at, size),
            (0, edu::EDU_DEVFN) if self.edu.is_some() => self
                .edu
                .as_ref()
                .map_or(u32::MAX, |e| e.config_read(at, size)),
            _ => u32::MAX,
        }
    }

    fn config_write(&mut self, port: u16, size: u8, value: u32) {
        let Some((bus, devfn, reg)) = pci::decode_address(self.address) else {
            return;
        };
        let at = reg | usize::from(port - pci::CONFIG_DATA);
        match (bus, devfn) {
            (0, 0) => self.host_bridge.write(at, size, value),
            (0, edu::EDU_DEVFN) => {
                if let Some(e) = self.edu.as_mut() {
                    e.config_write(at, size, value);
                }
            }
            _ => {}
        }
    }

    /// The work that reaches guest memory, in order: the invalidation
    /// queue, the edu's DMA (through the IOMMU's translation when one is
    /// attached; a page that does not translate is not transferred, and
    /// the fault is recorded), the MSIs the edu raised and the IOAPIC's
    /// remappable-format requests (through interrupt remapping), and the
    /// IOMMU's own events. Returns the interrupt messages to deliver.
    pub fn service(
        &mut self,
        mem: &mut dyn GuestMemory,
        ioapic_requests: Vec<vtd::IoApicRequest>,
    ) -> Vec<Ipi> {
        let mut out = Vec::new();
        if let Some(vtd) = self.vtd.as_mut() {
            if vtd.queue_pending() {
                vtd.run_queue(mem);
            }
        }
        let sid = u16::from(edu::EDU_DEVFN);
        if let Some(edu) = self.edu.as_mut() {
            if let Some(request) = edu.take_dma() {
                dma(edu, self.vtd.as_mut(), mem, sid, request);
                edu.dma_done();
            }
            for (address, data) in edu.take_msis() {
                let message = match self.vtd.as_mut() {
                    Some(vtd) => vtd.remap(mem, Some(sid), address, data).ok().flatten(),
                    None => vtd::msi_message(address as u32, data),
                };
                out.extend(message);
            }
        }
        if let Some(vtd) = self.vtd.as_mut() {
            for request in ioapic_requests {
                out.extend(vtd.remap_ioapic(mem, request).ok().flatten());
            }
            out.extend(vtd.take_events());
        }
        out
    }
}

/// One edu transfer, page by page through the IOMMU (if any).
fn dma(
    edu: &mut edu::Edu,
    mut vtd: Option<&mut vtd::Vtd>,
    mem: &mut dyn GuestMemory,
    sid: u16,
    request: edu::DmaRequest,
) {
    let mut done = 0usize;
    while done < request.len {
        let bus_address = request.ram + done as u64;
        let chunk = ((0x1000 - (bus_address & 0xfff)) as usize).min(request.len - done);
        let gpa = match vtd.as_deref_mut() {
            Some(vtd) => vtd.translate(mem, sid, bus_address, request.to_ram),
            None => Ok(bus_address),
        };
        if let Ok(gpa) = gpa {
            let at = request.buffer + done;
            let buffer = &mut edu.buffer_mut()[at..at + chunk];
            if request.to_ram {
                mem.write(gpa, buffer);
            } else if !mem.read(gpa, buffer) {
                // Outside RAM: the read completes with all ones.
                buffer.fill(0xff);
            }
        }
        done += chunk;
    }
}

/// Every device of the VM.
#[derive(Debug)]
pub struct Platform {
    pub uart: Uart,
    pub ioapic: IoApic,
    fw_cfg: fw_cfg::FwCfg,
    /// The last byte written to [`GUEST_STATUS_PORT`].
    pub guest_status: Option<u8>,
    /// The report line being written to [`GUEST_REPORT_PORT`].
    report_line: Vec<u8>,
    /// Report lines completed and not yet taken ([`Platform::take_reports`]).
    reports: Vec<String>,
    /// Interrupt messages raised and not yet delivered.
    pending: Vec<Ipi>,
    /// Whether an access to unassigned MMIO stops the VM
    /// (`--strict-mmio`) instead of reading all ones and dropping writes.
    pub strict_mmio: bool,
    /// QEMU's pc-testdev (multiboot kernels only).
    testdev: Option<TestDev>,
    /// The 8259A pair (multiboot kernels only).
    pic: Option<Pic>,
    /// The PCI bus, the edu and the IOMMU, when asked for.
    pub chipset: Option<Box<Chipset>>,
    /// The CMOS RTC (multiboot kernels only).
    rtc: Option<rtc::Rtc>,
    /// Fixed-hardware ACPI's PM1a registers (multiboot kernels only).
    pm1: Option<acpi::Pm1>,
    /// Virtual time (ns) of the access being handled ([`Platform::set_clock`]).
    now_ns: u64,
    /// The guest asked for S3 ([`Platform::take_suspend_request`]).
    suspend_requested: bool,
}

/// The devices' state in a snapshot (the ACPI tables and fw_cfg items
/// are rebuilt from the configuration).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PlatformSnapshot {
    pub uart: serial::UartSnapshot,
    pub ioapic: IoApic,
    pub fw_cfg_cursor: (Option<usize>, usize),
    /// A report line written halfway.
    #[serde(default)]
    pub report_line: Vec<u8>,
    #[serde(default)]
    pub testdev: Option<TestDev>,
    #[serde(default)]
    pub pic: Option<Pic>,
    #[serde(default)]
    pub rtc: Option<rtc::Rtc>,
    #[serde(default)]
    pub pm1: Option<acpi::Pm1>,
}

impl Platform {
    /// The state to save; an error while interrupt messages wait for
    /// delivery (between two exits; they are delivered before any vCPU
    /// runs again), and with the PCI devices or the IOMMU attached (their
    /// state is not saved: such a VM refuses snapshots and migration).
    pub fn snapshot(&self) -> Result<PlatformSnapshot, String> {
        if self.chipset.is_some() {
            return Err(
                "the PCI devices (--device edu, --iommu intel) are not saved in snapshots".into(),
            );
        }
        if !self.pending.is_empty() {
            return Err("device interrupts wait for delivery".into());
        }
        Ok(PlatformSnapshot {
            uart: self.uart.snapshot(),
            ioapic: self.ioapic.clone(),
            fw_cfg_cursor: self.fw_cfg.cursor(),
            report_line: self.report_line.clone(),
            testdev: self.testdev.clone(),
            pic: self.pic.clone(),
            rtc: self.rtc.clone(),
            pm1: self.pm1.clone(),
        })
    }

    /// Restores saved device state into this (freshly built) platform.
    pub fn restore(&mut self, saved: &PlatformSnapshot) -> Result<(), String> {
        saved.ioapic.check_restored()?;
        self.fw_cfg
            .set_cursor(saved.fw_cfg_cursor.0, saved.fw_cfg_cursor.1)?;
        self.uart = Uart::from_snapshot(&saved.uart)?;
        self.ioapic = saved.ioapic.clone();
        self.report_line = saved.report_line.clone();
        self.report_line.truncate(abi::REPORT_MAX as usize);
        self.testdev = saved.testdev.clone();
        self.pic = saved.pic.clone();
        self.rtc = saved.rtc.clone();
        self.pm1 = saved.pm1.clone();
        self.suspend_requested = false;
        self.pending.clear();
        Ok(())
    }
}

impl Platform {
    pub fn new(config: &PlatformConfig) -> Self {
        let devices = config.devices;
        let mut ioapic = IoApic::default();
        ioapic.set_remappable(devices.intel_iommu);
        Platform {
            uart: Uart::new(&config.console_input),
            ioapic,
            fw_cfg: fw_cfg::FwCfg::new(config.ram_size, config.vcpus, &config.cmdline),
            guest_status: None,
            report_line: Vec::new(),
            reports: Vec::new(),
            pending: Vec::new(),
            strict_mmio: false,
            testdev: None,
            pic: None,
            chipset: (devices != DeviceSet::default()).then(|| Box::new(Chipset::new(devices))),
            rtc: None,
            pm1: None,
            now_ns: 0,
            suspend_requested: false,
        }
    }

    /// Whether an Intel IOMMU is attached (the ACPI tables then have a
    /// DMAR table).
    pub fn has_intel_iommu(&self) -> bool {
        self.chipset.as_ref().is_some_and(|c| c.vtd.is_some())
    }

    /// Whether device work waits for [`Chipset::service`].
    pub fn device_work_pending(&self) -> bool {
        self.ioapic.has_remap_requests() || self.chipset.as_ref().is_some_and(|c| c.work_pending())
    }

    /// Drives the edu's INTx line to its level (GSI 16, IOAPIC only).
    fn sync_intx(&mut self) {
        let Some(chipset) = self.chipset.as_mut() else {
            return;
        };
        let level = chipset.edu.as_ref().is_some_and(edu::Edu::intx_level);
        if level != chipset.intx {
            chipset.intx = level;
            self.pending
                .extend(self.ioapic.set_line(usize::from(edu::EDU_GSI), level));
        }
    }

    /// What a [`Chipset::service`] produced: its messages queued, the
    /// INTx line brought up to date.
    pub fn after_service(&mut self, messages: Vec<Ipi>) {
        self.pending.extend(messages);
        self.sync_intx();
    }

    /// The IOAPIC's remappable-format requests, for the IOMMU.
    pub fn take_ioapic_requests(&mut self) -> Vec<vtd::IoApicRequest> {
        self.ioapic.take_remap_requests()
    }

    /// The PCI configuration ports: the value of an `in`, or `None` if
    /// no PCI bus or not those ports.
    fn pci_pio_read(&mut self, port: u16, size: u8) -> Option<u32> {
        let chipset = self.chipset.as_ref()?;
        match port {
            pci::CONFIG_ADDRESS if size == 4 => Some(chipset.address),
            p if (pci::CONFIG_DATA..pci::CONFIG_DATA + 4).contains(&p) => {
                Some(chipset.config_read(p, size))
            }
            _ => None,
        }
    }

    fn pci_pio_write(&mut self, port: u16, size: u8, value: u32) -> bool {
        let Some(chipset) = self.chipset.as_mut() else {
            return false;
        };
        match port {
            pci::CONFIG_ADDRESS if size == 4 => chipset.address = value & 0x80ff_ffff,
            p if (pci::CONFIG_DATA..pci::CONFIG_DATA + 4).contains(&p) => {
                chipset.config_write(p, size, value);
            }
            _ => return false,
        }
        self.sync_intx();
        true
    }

    /// Attaches QEMU's pc-testdev, the 8259A pair, the CMOS RTC (reading
    /// `wall_clock_at_boot_ns` at virtual time 0) and the PM1a registers,
    /// which the kvm-unit-tests suite drives (multiboot kernels get them):
    /// the PIC as a PC BIOS initializes it (`pic`). The ACPI tables then
    /// describe fixed-hardware ACPI ([`Platform::legacy_pm`]).
    pub fn attach_test_devices(&mut self, wall_clock_at_boot_ns: u64) {
        self.testdev = Some(TestDev::default());
        self.pic = Some(Pic::default());
        self.rtc = Some(rtc::Rtc::new(wall_clock_at_boot_ns));
        self.pm1 = Some(acpi::Pm1::default());
    }

    /// Whether the platform has the PM1 registers, the RTC and S3 (the
    /// ACPI tables must then say so: `acpi::TableSet::legacy_pm`).
    pub fn legacy_pm(&self) -> bool {
        self.pm1.is_some()
    }

    /// The virtual time (the accessing vCPU's clock, in cycles) of the
    /// port accesses that follow: the RTC's time.
    pub fn set_clock(&mut self, cycles: u64) {
        self.now_ns = Cycles(cycles).as_ns();
    }

    /// Whether the guest asked for S3 since the last call.
    pub fn take_suspend_request(&mut self) -> bool {
        std::mem::take(&mut self.suspend_requested)
    }

    /// The machine enters S3 at `cycles`: returns when (in cycles) an
    /// enabled wake event ends it, and sets what the OS finds on resume
    /// (WAK_STS; RTC_STS and register C's AF follow from the alarm's
    /// time). `None`: no enabled wake event ever comes (the RTC alarm
    /// needs AIE in register B and RTC_EN in PM1_EN).
    pub fn suspend(&mut self, cycles: u64) -> Option<u64> {
        let now = Cycles(cycles).as_ns();
        let pm1 = self.pm1.as_mut()?;
        if pm1.enable & acpi::pm1::RTC == 0 {
            return None;
        }
        let wake = self.rtc.as_ref()?.next_alarm(now)?;
        pm1.status |= acpi::pm1::WAK_STS;
        Some(Cycles::from_ns_ceil(wake).0)
    }

    /// The RTC's and PM1's ports: the value of an `in`, or `None`.
    fn pm_pio_read(&mut self, port: u16, size: u8) -> Option<u32> {
        let now = self.now_ns;
        if let Some(rtc) = self.rtc.as_mut() {
            if port == rtc::INDEX_PORT || port == rtc::DATA_PORT {
                return Some(u32::from(rtc.read(port, now)));
            }
        }
        let (control, offset) = pm1_register(port)?;
        if !control {
            self.sync_rtc_status();
        }
        self.pm1.as_ref().map(|pm| pm.read(control, offset, size))
    }

    /// An `out` to the RTC's or PM1's ports: the sleep state it asks
    /// for, or `None` if neither has the port.
    fn pm_pio_write(&mut self, port: u16, size: u8, value: u32) -> Option<acpi::SleepRequest> {
        let now = self.now_ns;
        if let Some(rtc) = self.rtc.as_mut() {
            if port == rtc::INDEX_PORT || port == rtc::DATA_PORT {
                rtc.write(port, value as u8, now);
                return Some(acpi::SleepRequest::None);
            }
        }
        let (control, offset) = pm1_register(port)?;
        if !control {
            self.sync_rtc_status();
        }
        let pm = self.pm1.as_mut()?;
        Some(pm.write(control, offset, size, value))
    }

    /// RTC_STS: set when the RTC's alarm interrupt happened.
    fn sync_rtc_status(&mut self) {
        let now = self.now_ns;
        if let (Some(rtc), Some(pm)) = (self.rtc.as_mut(), self.pm1.as_mut()) {
            if rtc.take_alarm_event(now) {
                pm.status |= acpi::pm1::RTC;
            }
        }
    }

    /// A port of the test devices: its value for an `in`, or `None`.
    fn test_pio_read(&mut self, port: u16, size: u8) -> Option<u32> {
        if let Some(pic) = self.pic.as_ref().filter(|_| Pic::owns(port)) {
            return Some(u32::from(pic.read(port)));
        }
        if let Some(value) = self.pm_pio_read(port, size) {
            return Some(value);
        }
        let testdev = self.testdev.as_ref()?;
        match port {
            testdev::DATA_PORT..=0xe3 => Some(testdev.data_read(port - testdev::DATA_PORT, size)),
            testdev::DATA_BYTE_PORT..=0xeb => {
                Some(testdev.data_read(port - testdev::DATA_BYTE_PORT, size))
            }
            _ => None,
        }
    }

    /// An `out` to a port of the test devices; `false` if none has it.
    fn test_pio_write(&mut self, port: u16, size: u8, value: u32) -> bool {
        if let Some(pic) = self.pic.as_mut().filter(|_| Pic::owns(port)) {
            pic.write(port, value as u8);
            return true;
        }

        let Some(testdev) = self.testdev.as_mut() else {
            return false;
        };
        match port {
            testdev::DATA_PORT..=0xe3 => testdev.data_write(port - testdev::DATA_PORT, size, value),
            testdev::DATA_BYTE_PORT..=0xeb => {
                testdev.data_write(port - testdev::DATA_BYTE_PORT, size, value)
            }
            testdev::FLUSH_PORT..=0xe7 => {}
            p if (testdev::IRQ_PORT..testdev::IRQ_PORT + testdev::IRQ_LINES).contains(&p) => {
                for (line, level) in TestDev::irq_lines(p - testdev::IRQ_PORT, size, value) {
                    self.set_irq_line(line, level);
                }
            }
            _ => return false,
        }
        true
    }

    /// Sets ISA IRQ / GSI `line`'s level: the IOAPIC pin, and the PIC
    /// input for the ISA lines (0..16) when the PIC is attached.
    fn set_irq_line(&mut self, line: usize, level: bool) {
        self.pending.extend(self.ioapic.set_line(line, level));
        if let Some(pic) = self.pic.as_mut() {
            pic.set_line(line, level);
        }
    }

    /// Whether the PIC (if attached) requests an interrupt.
    pub fn pic_output(&self) -> bool {
        self.pic.as_ref().is_some_and(Pic::output)
    }

    /// The PIC's INTA cycle: the vector it delivers (`None` without a
    /// PIC).
    pub fn pic_acknowledge(&mut self) -> Option<u8> {
        self.pic.as_mut().map(Pic::acknowledge)
    }

    /// A local APIC broadcast the EOI of a level-triggered `vector`.
    pub fn eoi_broadcast(&mut self, vector: u8) {
        let messages = self.ioapic.eoi(vector);
        self.pending.extend(messages);
    }

    /// An `in` of `size` bytes from `port`.
    pub fn pio_read(&mut self, port: u16, size: u8) -> u32 {
        if let Some(value) = self.pci_pio_read(port, size) {
            return value & size_mask(size);
        }
        if let Some(value) = self.test_pio_read(port, size) {
            return value & size_mask(size);
        }
        let value = match pio_device(port) {
            Some((PioDevice::Com1, offset)) => u32::from(self.uart.read(offset as u8)),
            Some((PioDevice::FwCfgData, _)) => u32::from(self.fw_cfg.read_byte()),
            // The sleep status register: never woken (WAK_STS clear).
            Some((PioDevice::SleepStatus, _)) => 0,
            // Write-only, or nothing attached: the bus floats high.
            _ => u32::MAX,
        };
        self.poll_interrupts();
        value & size_mask(size)
    }

    /// An `out` of `size` bytes of `value` to `port`.
    pub fn pio_write(&mut self, port: u16, size: u8, value: u32) -> Option<DeviceStop> {
        let value = value & size_mask(size);
        match self.pm_pio_write(port, size, value) {
            Some(acpi::SleepRequest::PowerOff) => return Some(DeviceStop::PowerOff),
            Some(acpi::SleepRequest::Suspend) => {
                self.suspend_requested = true;
                return None;
            }
            Some(acpi::SleepRequest::None) => return None,
            None => {}
        }
        if self.pci_pio_write(port, size, value) || self.test_pio_write(port, size, value) {
            return None;
        }
        let stop = match pio_device(port) {
            Some((PioDevice::Com1, offset)) => {
                self.uart.write(offset as u8, value as u8);
                None
            }
            Some((PioDevice::DebugExit, _)) => Some(DeviceStop::DebugExit {
                status: (value << 1) | 1,
            }),
            // (Writes to the data port are ignored, as QEMU does for
            // read-only items.)
            Some((PioDevice::FwCfgSelector, _)) => {
                self.fw_cfg.select(value as u16);
                None
            }
            Some((PioDevice::GuestStatus, _)) => {
                self.guest_status = Some(value as u8);
                None
            }
            Some((PioDevice::GuestReport, _)) => {
                self.report_byte(value as u8);
                None
            }
            Some((PioDevice::SleepControl, _)) => match acpi::sleep_control_write(value as u8) {
                acpi::SleepRequest::PowerOff => Some(DeviceStop::PowerOff),
                // (The hardware-reduced register offers S5 only.)
                acpi::SleepRequest::Suspend | acpi::SleepRequest::None => None,
            },
            _ => None,
        };
        self.poll_interrupts();
        stop
    }

    /// A byte written to the report port: a newline completes the line.
    fn report_byte(&mut self, byte: u8) {
        if byte == b'\n' {
            let line = std::mem::take(&mut self.report_line);
            self.reports
                .push(String::from_utf8_lossy(&line).into_owned());
        } else if self.report_line.len() < abi::REPORT_MAX as usize {
            self.report_line.push(byte);
        }
    }

    /// The report lines completed since the last call, oldest first.
    pub fn take_reports(&mut self) -> Vec<String> {
        std::mem::take(&mut self.reports)
    }

    /// Whether `gpa` is a device's MMIO (the xAPIC page aside).
    pub fn is_mmio(&self, gpa: u64) -> bool {
        (IOAPIC_BASE..IOAPIC_BASE + IOAPIC_SIZE).contains(&gpa)
            || (self.testdev.is_some() && TestDev::is_iomem(gpa))
            || self.chipset_mmio(gpa).is_some()
    }

    /// Which chipset device decodes `gpa`.
    fn chipset_mmio(&self, gpa: u64) -> Option<ChipsetMmio> {
        let chipset = self.chipset.as_ref()?;
        if chipset.vtd.is_some() && (vtd::VTD_BASE..vtd::VTD_BASE + vtd::VTD_SIZE).contains(&gpa) {
            return Some(ChipsetMmio::Vtd);
        }
        chipset
            .edu
            .as_ref()
            .is_some_and(|e| e.owns(gpa))
            .then_some(ChipsetMmio::Edu)
    }

    /// An MMIO read of `size` bytes at `gpa` ([`Platform::is_mmio`]).
    pub fn mmio_read(&mut self, gpa: u64, size: u8) -> u64 {
        if let Some(device) = self.chipset_mmio(gpa) {
            let chipset = self.chipset.as_ref().expect("decoded");
            return match device {
                ChipsetMmio::Vtd => chipset
                    .vtd
                    .as_ref()
                    .map_or(0, |v| v.read(gpa - vtd::VTD_BASE, size)),
                ChipsetMmio::Edu => chipset.edu.as_ref().map_or(0, |e| e.mmio_read(gpa, size)),
            };
        }
        if let Some(testdev) = self.testdev.as_ref().filter(|_| TestDev::is_iomem(gpa)) {
            return testdev.iomem_read(gpa, size);
        }
        let value = u64::from(self.ioapic.read(gpa - IOAPIC_BASE));
        value & u64::from(size_mask(size))
    }

    /// An MMIO write at `gpa` ([`Platform::is_mmio`]).
    pub fn mmio_write(&mut self, gpa: u64, size: u8, value: u64) {
        if let Some(device) = self.chipset_mmio(gpa) {
            let chipset = self.chipset.as_mut().expect("decoded");
            match device {
                ChipsetMmio::Vtd => {
                    if let Some(v) = chipset.vtd.as_mut() {
                        v.write(gpa - vtd::VTD_BASE, size, value);
                    }
                }
                ChipsetMmio::Edu => {
                    if let Some(e) = chipset.edu.as_mut() {
                        e.mmio_write(gpa, size, value);
                    }
                }
            }
            self.sync_intx();
            return;
        }
        if let Some(testdev) = self.testdev.as_mut().filter(|_| TestDev::is_iomem(gpa)) {
            testdev.iomem_write(gpa, size, value);
            return;
        }
        let messages = self.ioapic.write(gpa - IOAPIC_BASE, value as u32);
        self.pending.extend(messages);
    }

    /// Routes what the devices raised through the IOAPIC.
    fn poll_interrupts(&mut self) {
        if self.uart.take_interrupt() {
            self.pending
                .extend(self.ioapic.pulse(usize::from(COM1_IRQ)));
            if let Some(pic) = self.pic.as_mut() {
                pic.set_line(usize::from(COM1_IRQ), true);
                pic.set_line(usize::from(COM1_IRQ), false);
            }
        }
    }

    /// Interrupt messages for the local APICs, oldest first.
    pub fn take_interrupts(&mut self) -> Vec<Ipi> {
        std::mem::take(&mut self.pending)
    }
}

/// The PM1a register at `port`: (control block, offset in it).
fn pm1_register(port: u16) -> Option<(bool, u16)> {
    use acpi::{PM1A_CNT_PORT, PM1A_EVT_PORT, PM1_CNT_LEN, PM1_EVT_LEN};
    if (PM1A_EVT_PORT..PM1A_EVT_PORT + PM1_EVT_LEN).contains(&port) {
        Some((false, port - PM1A_EVT_PORT))
    } else if (PM1A_CNT_PORT..PM1A_CNT_PORT + PM1_CNT_LEN).contains(&port) {
        Some((true, port - PM1A_CNT_PORT))
    } else {
        None
    }
}

/// A chipset device's MMIO window.
#[derive(Debug, Clone, Copy)]
enum ChipsetMmio {
    Vtd,
    Edu,
}

fn size_mask(size: u8) -> u32 {
    match size {
        1 => 0xff,
        2 => 0xffff,
        _ => u32::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_ports_float_high_and_legacy_pic_pit_are_absent() {
        let mut p = Platform::new(&PlatformConfig::default());
        for port in [0x20, 0x21, 0xa0, 0xa1, 0x40, 0x43, 0x2f8] {
            assert_eq!(p.pio_read(port, 1) & 0xff, 0xff, "port {port:#x}");
        }
        assert_eq!(p.pio_write(0x20, 1, 0x11), None);
    }

    #[test]
    fn report_port_bytes_form_lines_cut_at_the_report_limit() {
        let mut p = Platform::new(&PlatformConfig::default());
        for &b in b"bm_total=12 x=1\nsecond" {
            assert_eq!(p.pio_write(GUEST_REPORT_PORT, 1, u32::from(b)), None);
        }
        assert_eq!(p.take_reports(), vec!["bm_total=12 x=1".to_string()]);
        assert!(p.take_reports().is_empty(), "taken once");
        // The half-written line survives a snapshot and ends later.
        let saved = p.snapshot().unwrap();
        let mut q = Platform::new(&PlatformConfig::default());
        q.restore(&saved).unwrap();
        q.pio_write(GUEST_REPORT_PORT, 1, u32::from(b'\n'));
        assert_eq!(q.take_reports(), vec!["second".to_string()]);
        // Over-long lines are cut; invalid UTF-8 is replaced, not refused.
        for _ in 0..abi::REPORT_MAX + 10 {
            p.pio_write(GUEST_REPORT_PORT, 1, u32::from(b'a'));
        }
        p.pio_write(GUEST_REPORT_PORT, 1, 0xff);
        p.pio_write(GUEST_REPORT_PORT, 1, u32::from(b'\n'));
        p.pio_write(GUEST_REPORT_PORT, 1, 0xff);
        p.pio_write(GUEST_REPORT_PORT, 1, u32::from(b'\n'));
        let lines = p.take_reports();
        assert_eq!(lines[0].len(), abi::REPORT_MAX as usize);
        assert_eq!(lines[1], "\u{fffd}");
        // The port reads as nothing attached.
        assert_eq!(p.pio_read(GUEST_REPORT_PORT, 1), 0xff);
    }

    #[test]
    fn uart_input_interrupt_reaches_the_ioapic_route() {
        let mut p = Platform::new(&PlatformConfig {
            console_input: b"x".to_vec(),
            ..PlatformConfig::default()
        });
        // Route IRQ 4 to vector 0x24 on APIC 1, then enable RDA.
        p.mmio_write(IOAPIC_BASE, 4, 0x19);
        p.mmio_write(IOAPIC_BASE + 0x10, 4, 1 << 24);
        p.mmio_write(IOAPIC_BASE, 4, 0x18);
        p.mmio_write(IOAPIC_BASE + 0x10, 4, 0x24);
        assert!(p.take_interrupts().is_empty());
        p.pio_write(abi::COM1_PORT + 1, 1, 1);
        let ipis = p.take_interrupts();
        assert_eq!(ipis.len(), 1);
        assert_eq!(ipis[0].vector, 0x24);
        assert_eq!(p.pio_read(abi::COM1_PORT, 1), u32::from(b'x'));
    }

    #[test]
    fn fw_cfg_and_power_off_through_ports() {
        let mut p = Platform::new(&PlatformConfig {
            vcpus: 3,
            ..PlatformConfig::default()
        });
        p.pio_write(fw_cfg::FW_CFG_SELECTOR, 2, u32::from(fw_cfg::key::NB_CPUS));
        assert_eq!(p.pio_read(fw_cfg::FW_CFG_DATA, 1), 3);
        assert_eq!(
            p.pio_write(acpi::SLEEP_CONTROL_PORT, 1, (5 << 2) | (1 << 5)),
            Some(DeviceStop::PowerOff)
        );
        assert_eq!(
            p.pio_write(abi::DEBUG_EXIT_PORT, 1, 0x1_03),
            Some(DeviceStop::DebugExit { status: 7 })
        );
    }

    #[test]
    fn test_device_lines_drive_level_ioapic_pins_until_the_eoi_broadcast() {
        let mut p = Platform::new(&PlatformConfig::default());
        assert_eq!(p.pio_read(testdev::DATA_PORT, 4), u32::MAX, "not attached");
        p.attach_test_devices(0);
        // Pin 14 level-triggered, vector 0x79, APIC 0.
        p.mmio_write(IOAPIC_BASE, 4, 0x10 + 2 * 14);
        p.mmio_write(IOAPIC_BASE + 0x10, 4, 0x79 | (1 << 15));
        p.pio_write(testdev::IRQ_PORT + 14, 1, 1);
        let ipis = p.take_interrupts();
        assert_eq!(ipis.len(), 1);
        assert!(ipis[0].trigger_level);
        p.eoi_broadcast(0x79);
        assert_eq!(p.take_interrupts().len(), 1, "still up: again");
        p.pio_write(testdev::IRQ_PORT + 14, 1, 0);
        p.eoi_broadcast(0x79);
        assert!(p.take_interrupts().is_empty());
        // The data register and the I/O RAM.
        p.pio_write(testdev::DATA_PORT, 4, 0xdead_beef);
        assert_eq!(p.pio_read(testdev::DATA_BYTE_PORT + 1, 1), 0xbe);
        assert!(p.is_mmio(testdev::IOMEM_BASE));
        p.mmio_write(testdev::IOMEM_BASE + 4, 4, 0x1234_5678);
        assert_eq!(p.mmio_read(testdev::IOMEM_BASE + 6, 2), 0x1234);
        // The PIC answers its ports now.
        assert_eq!(p.pio_read(0x21, 1), 0x10);
    }

    #[test]
    fn s3_wakes_at_the_rtc_alarm_only_with_rtc_en_and_aie() {
        use acpi::{pm1, PM1A_CNT_PORT, PM1A_EVT_PORT};
        let second = machine::cost::CYCLES_PER_SECOND;
        let mut p = Platform::new(&PlatformConfig::default());
        // Nothing at the RTC's and PM1's ports without the test devices.
        assert_eq!(p.pio_read(rtc::DATA_PORT, 1), 0xff);
        assert_eq!(p.pio_read(PM1A_EVT_PORT, 2), 0xffff);
        assert_eq!(p.pio_write(PM1A_CNT_PORT, 2, 0x2400), None);
        assert!(!p.take_suspend_request());
        p.attach_test_devices(1_767_225_600 * 1_000_000_000);
        assert!(p.legacy_pm());
        p.set_clock(second / 2);
        // 2026-01-01 00:00:00, BCD.
        p.pio_write(rtc::INDEX_PORT, 1, u32::from(rtc::reg::YEAR));
        assert_eq!(p.pio_read(rtc::DATA_PORT, 1), 0x26);
        // Alarm: don't care everywhere, AIE.
        for alarm in [1, 3, 5] {
            p.pio_write(rtc::INDEX_PORT, 1, alarm);
            p.pio_write(rtc::DATA_PORT, 1, u32::from(rtc::DONT_CARE));
        }
        p.pio_write(rtc::INDEX_PORT, 1, u32::from(rtc::reg::B));
        p.pio_write(rtc::DATA_PORT, 1, u32::from(rtc::b::HOUR_24 | rtc::b::AIE));
        assert_eq!(p.suspend(second / 2), None, "RTC_EN clear: no wake");
        p.pio_write(PM1A_EVT_PORT + 2, 2, u32::from(pm1::RTC));
        assert_eq!(p.pio_write(PM1A_CNT_PORT, 2, 0x2400), None);
        assert!(p.take_suspend_request());
        assert_eq!(p.suspend(second / 2), Some(second));
        // Resumed at 1 s: WAK_STS and RTC_STS, cleared by writing ones.
        p.set_clock(second + 1000);
        let sts = p.pio_read(PM1A_EVT_PORT, 2) as u16;
        assert_eq!(sts, pm1::WAK_STS | pm1::RTC);
        p.pio_write(PM1A_EVT_PORT, 2, u32::from(sts));
        assert_eq!(p.pio_read(PM1A_EVT_PORT, 2), 0);
        // S5 through PM1a_CNT powers off.
        assert_eq!(
            p.pio_write(PM1A_CNT_PORT, 2, 0x3400),
            Some(DeviceStop::PowerOff)
        );
        // The RTC and PM1 state is in snapshots.
        let saved = p.snapshot().unwrap();
        let mut q = Platform::new(&PlatformConfig::default());
        q.restore(&saved).unwrap();
        q.set_clock(second + 1000);
        assert_eq!(q.pio_read(PM1A_EVT_PORT + 2, 2), u32::from(pm1::RTC));
        q.pio_write(rtc::INDEX_PORT, 1, u32::from(rtc::reg::B));
        assert_eq!(
            q.pio_read(rtc::DATA_PORT, 1),
            u32::from(rtc::b::HOUR_24 | rtc::b::AIE)
        );
    }

    #[test]
    fn the_guest_status_port_keeps_the_last_byte() {
        let mut p = Platform::new(&PlatformConfig::default());
        assert_eq!(p.guest_status, None);
        assert_eq!(p.pio_write(GUEST_STATUS_PORT, 1, 0x1_07), None);
        assert_eq!(p.pio_write(GUEST_STATUS_PORT, 1, 3), None);
        assert_eq!(p.guest_status, Some(3));
    }
}

#[cfg(test)]
mod chipset_tests {
    use super::*;

    fn platform(edu: bool, intel_iommu: bool) -> Platform {
        Platform::new(&PlatformConfig {
            devices: DeviceSet { edu, intel_iommu },
            ..PlatformConfig::default()
        })
    }

    fn config_read(p: &mut Platform, devfn: u32, reg: u32, size: u8) -> u32 {
        p.pio_write(
            pci::CONFIG_ADDRESS,
            4,
            (1 << 31) | (devfn << 8) | (reg & !3),
        );
        p.pio_read(pci::CONFIG_DATA + (reg & 3) as u16, size)
    }

    #[test]
    fn the_pci_bus_is_there_only_with_its_devices() {
        let mut p = platform(false, false);
        assert_eq!(p.pio_read(pci::CONFIG_DATA, 4), u32::MAX);
        let mut p = platform(true, false);
        assert_eq!(config_read(&mut p, 0, 0, 4), 0x29c0_8086, "host bridge");
        assert_eq!(config_read(&mut p, u32::from(edu::EDU_DEVFN), 0, 2), 0x1234);
        assert_eq!(config_read(&mut p, u32::from(edu::EDU_DEVFN), 2, 2), 0x11e8);
        assert_eq!(config_read(&mut p, 0x20, 0, 2), 0xffff, "no function");
        assert!(p.is_mmio(u64::from(edu::EDU_BAR0)));
        assert!(!p.is_mmio(vtd::VTD_BASE), "no IOMMU asked for");
    }

    /// The VT-d unit's tables in `mem`: bus 0's root entry, the edu's
    /// context entry, IOVA 0 → `page`; the IRT at 0x20000 with IRTE 1
    /// (vector 0xed) and IRTE 2 (vector 0xee), both for APIC 0.
    fn iommu_tables(mem: &mut vtd::tests::TestMemory, page: u64) {
        let sid = u64::from(edu::EDU_DEVFN);
        mem.put(0x10_000, 0x11_000 | 1);
        mem.put(0x11_000 + sid * 16, 0x12_000 | 1 | 2);
        mem.put(0x11_000 + sid * 16 + 8, 1 | (sid << 8));
        mem.put(0x12_000, 0x13_000 | 3);
        mem.put(0x13_000, 0x14_000 | 3);
        mem.put(0x14_000, page | 3);
        for (index, vector) in [(1u64, 0xedu64), (2, 0xee)] {
            mem.put(0x20_000 + index * 16, 1 | (vector << 16));
            mem.put(0x20_000 + index * 16 + 8, sid | (1 << 18));
        }
    }

    fn service(p: &mut Platform, mem: &mut vtd::tests::TestMemory) {
        while p.device_work_pending() {
            let mut chipset = p.chipset.take().unwrap();
            let requests = p.take_ioapic_requests();
            let messages = chipset.service(mem, requests);
            p.chipset = Some(chipset);
            p.after_service(messages);
        }
    }

    #[test]
    fn edu_dma_through_the_iommu_and_remapped_interrupts() {
        let mut p = platform(true, true);
        let mut mem = vtd::tests::TestMemory::new();
        let page = 0x30_0000u64;
        iommu_tables(&mut mem, page);
        mem.put(page, 0x1234_5678);
        let v = |r: u64| vtd::VTD_BASE + r;
        p.mmio_write(v(vtd::reg::RTADDR), 8, 0x10_000);
        p.mmio_write(v(vtd::reg::GCMD), 4, u64::from(vtd::gcmd::SRTP));
        p.mmio_write(v(vtd::reg::IRTA), 8, 0x20_000 | 0xf);
        p.mmio_write(v(vtd::reg::GCMD), 4, u64::from(vtd::gcmd::SIRTP));
        let on = vtd::gcmd::TE | vtd::gcmd::IRE;
        p.mmio_write(v(vtd::reg::GCMD), 4, u64::from(on));
        // Bus mastering on; DMA 4 bytes from IOVA 0 into the buffer, then
        // back out to IOVA 4.
        p.pio_write(
            pci::CONFIG_ADDRESS,
            4,
            (1 << 31) | (u32::from(edu::EDU_DEVFN) << 8) | 4,
        );
        p.pio_write(pci::CONFIG_DATA, 2, 0x6);
        let bar = u64::from(edu::EDU_BAR0);
        let dma = |p: &mut Platform, mem: &mut vtd::tests::TestMemory, src, dst, cmd| {
            p.mmio_write(bar + 0x80, 8, src);
            p.mmio_write(bar + 0x88, 8, dst);
            p.mmio_write(bar + 0x90, 8, 4);
            p.mmio_write(bar + 0x98, 4, cmd);
            assert!(p.device_work_pending());
            service(p, mem);
            assert_eq!(p.mmio_read(bar + 0x98, 4) & 1, 0, "done");
        };
        dma(&mut p, &mut mem, 0, edu::DMA_START, 1);
        dma(&mut p, &mut mem, edu::DMA_START, 4, 3);
        assert_eq!(
            &mem.0[page as usize + 4..page as usize + 8],
            &0x1234_5678u32.to_le_bytes()
        );
        // An IOVA with no mapping: nothing moves, and (FPD set) nothing
        // is recorded.
        dma(&mut p, &mut mem, edu::DMA_START, 0x1000, 3);
        assert_eq!(p.mmio_read(v(vtd::reg::FSTS), 4), 0);
        // INTx through a remappable IOAPIC entry (pin 16, index 1).
        p.mmio_write(IOAPIC_BASE, 4, 0x10 + 2 * 16 + 1);
        p.mmio_write(
            IOAPIC_BASE + 0x10,
            4,
            ((1u64 << 48 | 1 << 49) >> 32) as u32 as u64,
        );
        p.mmio_write(IOAPIC_BASE, 4, 0x10 + 2 * 16);
        p.mmio_write(IOAPIC_BASE + 0x10, 4, 0xed);
        p.mmio_write(bar + 0x60, 4, 1);
        assert!(p.take_interrupts().is_empty(), "waits for the IOMMU");
        service(&mut p, &mut mem);
        let ipis = p.take_interrupts();
        assert_eq!(ipis.iter().map(|i| i.vector).collect::<Vec<_>>(), [0xed]);
        p.mmio_write(bar + 0x64, 4, 1);
        // MSI in remappable format, handle 2.
        let cap = edu::MSI_CAP as u32;
        let devfn = u32::from(edu::EDU_DEVFN) << 8;
        for (reg, value) in [(cap + 4, 0xfee0_0050u32), (cap + 8, 0), (cap + 12, 0)] {
            p.pio_write(pci::CONFIG_ADDRESS, 4, (1 << 31) | devfn | reg);
            p.pio_write(pci::CONFIG_DATA, 4, value);
        }
        p.pio_write(pci::CONFIG_ADDRESS, 4, (1 << 31) | devfn | cap);
        p.pio_write(pci::CONFIG_DATA + 2, 2, 1);
        p.mmio_write(bar + 0x60, 4, 1);
        service(&mut p, &mut mem);
        let ipis = p.take_interrupts();
        assert_eq!(ipis.iter().map(|i| i.vector).collect::<Vec<_>>(), [0xee]);
        // The PCI devices refuse snapshots.
        assert!(p.snapshot().unwrap_err().contains("--device edu"));
    }
}
