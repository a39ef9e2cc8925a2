//! Turning panics inside the interpreter into reportable results.
//!
//! The tools run the interpreter under `catch_unwind`; the default panic
//! hook would print every caught panic. [`install_quiet_hook`] replaces it
//! with one that remembers where the panic happened (for the report) and
//! prints only panics outside [`catching`].

use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    static CATCHING: Cell<bool> = const { Cell::new(false) };
    static LAST_LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs the hook (once per process is enough; installing again is
/// harmless).
pub fn install_quiet_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if CATCHING.with(Cell::get) {
            let location = info
                .location()
                .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()));
            LAST_LOCATION.with(|c| *c.borrow_mut() = location);
        } else {
            default(info);
        }
    }));
}

/// Runs `f`, returning its result or the panic message (with the location
/// when the quiet hook is installed).
pub fn catching<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    LAST_LOCATION.with(|c| *c.borrow_mut() = None);
    let was = CATCHING.with(|c| c.replace(true));
    let result = catch_unwind(AssertUnwindSafe(f));
    CATCHING.with(|c| c.set(was));
    result.map_err(|payload| {
        let message = if let Some(s) = payload.downcast_ref::<&str>() {
            (*s).to_string()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "(non-string panic payload)".to_string()
        };
        match LAST_LOCATION.with(|c| c.borrow_mut().take()) {
            Some(location) => format!("{message} (at {location})"),
            None => message,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catches_and_locates() {
        install_quiet_hook();
        assert_eq!(catching(|| 5), Ok(5));
        let err = catching(|| -> u8 { panic!("boom {}", 1) }).unwrap_err();
        assert!(err.starts_with("boom 1 (at "), "{err}");
        assert!(err.contains("panics.rs"), "{err}");
    }
}
