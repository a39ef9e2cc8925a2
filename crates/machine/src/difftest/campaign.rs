//! Running many cases: generation, the runs (host, interpreter,
//! translator), comparison.

use super::compare::compare_engines;
use super::compare::{compare, Difference};
use super::gen::{generate_case, Case, GenConfig};
use super::interp::{run_snippet_on, EngineRun};
use super::native::{NativeError, NativeRunner};
use super::panics::catching;
use super::{FinalState, Stop};
use crate::jit::Engine;
use std::collections::BTreeMap;

/// Cycle budget of one interpreted snippet (a few hundred instructions at
/// most, plus the VM exit).
pub const CYCLE_LIMIT: u64 = 1_000_000;

/// Both runs of one case and how they differ.
#[derive(Debug, Clone)]
pub struct CaseOutcome {
    pub case: Case,
    pub native: FinalState,
    pub interp: FinalState,
    pub differences: Vec<Difference>,
}

impl CaseOutcome {
    /// Whether the runs agree.
    pub fn matches(&self) -> bool {
        self.differences.is_empty()
    }
}

/// The result of a campaign.
#[derive(Debug, Clone, Default)]
pub struct CampaignReport {
    /// Cases run.
    pub cases: u64,
    /// The mismatching ones, in case order.
    pub mismatches: Vec<CaseOutcome>,
    /// How the native runs stopped ("finished", fault names), with counts.
    pub native_stops: BTreeMap<String, u64>,
}

/// Runs a case in the interpreter, turning a panic into an abnormal stop.
pub fn run_interpreter(case: &Case) -> FinalState {
    run_engine(case, Engine::Interp).state
}

/// Runs a case on `engine`, turning a panic into an abnormal stop.
pub fn run_engine(case: &Case, engine: Engine) -> EngineRun {
    let bits = case.group.bits();
    let failed = |why: String| EngineRun {
        state: FinalState::abnormal(why),
        cycles: 0,
        instructions: 0,
        tlb: Default::default(),
    };
    match catching(|| run_snippet_on(&case.code, &case.initial, CYCLE_LIMIT, bits, engine)) {
        Ok(Ok(run)) => run,
        Ok(Err(e)) => failed(format!("{engine} setup failed: {e}")),
        Err(message) => failed(format!("{engine} panicked: {message}")),
    }
}

/// Runs one case both ways and compares.
pub fn run_case(runner: &mut NativeRunner, case: Case) -> Result<CaseOutcome, NativeError> {
    let native = if case.group.bits() == 32 {
        runner.run_compat(&case.code, &case.initial)?
    } else {
        runner.run(&case.code, &case.initial)?
    };
    // The interpreter against the host, then the translator against the
    // interpreter on everything (so against the host too).
    let interp = run_engine(&case, Engine::Interp);
    let jit = run_engine(&case, Engine::Jit);
    let mut differences = compare(&case, &native, &interp.state);
    differences.extend(compare_engines(&interp, &jit));
    Ok(CaseOutcome {
        case,
        native,
        interp: interp.state,
        differences,
    })
}

/// A short name for how a run stopped, for statistics.
pub fn stop_name(stop: &Stop) -> String {
    match stop {
        Stop::Finished => "finished".into(),
        Stop::Fault { kind, .. } => kind.name(),
        Stop::Abnormal(_) => "abnormal".into(),
    }
}

/// Runs cases `first..first + count` of `seed`. `progress` is called after
/// each case with the number done and the mismatches so far.
pub fn run_campaign(
    seed: u64,
    first: u64,
    count: u64,
    config: &GenConfig,
    mut progress: impl FnMut(u64, usize),
) -> Result<CampaignReport, NativeError> {
    let mut runner = NativeRunner::new()?;
    let mut report = CampaignReport::default();
    for index in first..first + count {
        let outcome = run_case(&mut runner, generate_case(seed, index, config))?;
        *report
            .native_stops
            .entry(stop_name(&outcome.native.stop))
            .or_default() += 1;
        report.cases += 1;
        if !outcome.matches() {
            report.mismatches.push(outcome);
        }
        progress(report.cases, report.mismatches.len());
    }
    Ok(report)
}
