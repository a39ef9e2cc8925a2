//! The paging-structure caches (`mmu::psc`) save host work only: whole
//! programs, on both engines, in bare mode and under EPT, end with the same
//! output, exit, virtual cycles, CPU counters (page-walk references
//! included) and TLB counters with the caches at their default sizes, tiny,
//! or off.

use machine::bare::page_tables::PageSize;
use machine::bare::{BareConfig, BareMachine, Mode, RunOutput};
use machine::mmu::psc::PscConfig;
use machine::{programs, CpuConfig, Engine};

fn run(elf: &[u8], mode: Mode, engine: Engine, psc: PscConfig) -> RunOutput {
    let config = BareConfig {
        mode,
        page_size: PageSize::Size4K,
        max_cycles: Some(20_000_000_000),
        cpu: CpuConfig {
            engine,
            psc,
            ..CpuConfig::default()
        },
        ..BareConfig::default()
    };
    BareMachine::run_elf(config, elf).unwrap_or_else(|e| panic!("{mode:?} {engine:?}: {e}"))
}

#[test]
fn programs_run_the_same_with_the_caches_on_tiny_or_off() {
    let tiny = PscConfig {
        entries: 1,
        gpa_entries: 1,
    };
    let mut cases: Vec<(&str, &[u8])> = programs::SYSTEM_TESTS.to_vec();
    cases.push(("mips_workload_small", programs::MIPS_WORKLOAD_SMALL));
    for (name, elf) in cases {
        for mode in [Mode::Bare, Mode::GuestEpt] {
            for engine in [Engine::Interp, Engine::Jit] {
                let off = run(elf, mode, engine, PscConfig::OFF);
                assert!(
                    off.stats.cpu.page_walk_refs > 0,
                    "{name} {mode:?}: the program walks page tables"
                );
                for psc in [PscConfig::default(), tiny] {
                    let on = run(elf, mode, engine, psc);
                    assert_eq!(on, off, "{name} {mode:?} {engine:?} {psc:?}");
                }
            }
        }
    }
}
