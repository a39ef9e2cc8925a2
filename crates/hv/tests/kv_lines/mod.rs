//! The `name=value` lines (value in hex) the test guests print on the
//! serial console, as a map (for `tests/platform.rs` and `tests/iommu.rs`).

use std::collections::BTreeMap;

pub fn values(out: &str) -> BTreeMap<String, u64> {
    out.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once('=')?;
            Some((
                k.to_string(),
                u64::from_str_radix(v.trim_start_matches("0x"), 16).ok()?,
            ))
        })
        .collect()
}
