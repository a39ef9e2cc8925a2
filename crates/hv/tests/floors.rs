//! The hv's floors: each top-level module of `crates/hv/src` sits on a
//! floor, and code may use only its own floor and the ones below. This test
//! reads the sources, finds every `crate::X` and `super::` path (in `use`
//! items and in code), resolves it to the top-level module it reaches, and
//! fails naming `file:line` for a path that reaches a higher floor. It also
//! fails on an import cycle between top-level modules (on one floor too).
//!
//! The floors (the crate doc of `crates/hv/src/lib.rs` and the hv section
//! of `docs/design.md` draw them):

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every top-level module of the hv and its floor, lowest first.
const FLOORS: &[(&str, u32)] = &[
    // 0: vocabulary: ids, virtual time, costs, host frames.
    ("ids", 0),
    ("time", 0),
    ("cost", 0),
    ("frames", 0),
    ("cpuid", 0),
    ("image", 0),
    // 1: memory: swap, memslots, the pager, the MMU.
    ("swap", 1),
    ("memslot", 1),
    ("mmu", 1),
    ("host", 1),
    ("pager", 1),
    ("fault", 1),
    // 2: the errors a running VM stops with; asynchronous page faults.
    ("error", 2),
    ("apf", 2),
    // 3: vCPUs, the platform devices they drive, their counters, the
    // state they share.
    ("devices", 3),
    // The multiboot image parser lays its memory map around the
    // platform's ACPI tables.
    ("multiboot", 3),
    ("stats", 3),
    ("shared", 3),
    ("vcpu", 3),
    // 4: the VM and its scheduler.
    ("vm", 4),
    // 5: what builds or saves a whole VM: the kernel loaders, snapshots.
    ("boot", 5),
    ("linux", 5),
    ("snapshot", 5),
];

/// Uses of a higher floor not removed yet, as (from, to) module pairs.
/// Every one is a known debt (see `docs/design.md`, "The hv's floors");
/// nothing may be added.
const PENDING: &[(&str, &str)] = &[];

fn floor_of(module: &str) -> Option<u32> {
    FLOORS.iter().find(|(m, _)| *m == module).map(|(_, f)| *f)
}

/// One use of a top-level module from another.
#[derive(Debug, Clone)]
struct Edge {
    file: String,
    line: usize,
    from: String,
    to: String,
}

/// Source with comments, string and char literals blanked out (newlines
/// kept, so byte offsets still give line numbers).
fn strip(src: &str) -> Vec<u8> {
    let b = src.as_bytes();
    let mut out = b.to_vec();
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in out.iter_mut().take(to).skip(from) {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            let end = b[i..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |p| i + p);
            blank(&mut out, i, end);
            i = end;
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            let mut j = i;
            while j < b.len() {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if b[i] == b'r'
            && (b[i..].starts_with(b"r\"") || b[i..].starts_with(b"r#"))
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
        {
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            if b.get(i + 1 + hashes) != Some(&b'"') {
                i += 1;
                continue;
            }
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            let start = i + 2 + hashes;
            let end = b[start..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(b.len(), |p| start + p + close.len());
            blank(&mut out, i, end);
            i = end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '\u{..}'), or a lifetime.
            if b.get(i + 1) == Some(&b'\\') {
                let end = b[i + 2..]
                    .iter()
                    .position(|&c| c == b'\'')
                    .map_or(b.len(), |p| i + 3 + p);
                blank(&mut out, i, end);
                i = end;
            } else if let Some(len) = std::str::from_utf8(&b[i + 1..])
                .ok()
                .or_else(|| std::str::from_utf8(&b[i + 1..(i + 5).min(b.len())]).ok())
                .and_then(|s| s.chars().next())
                .map(char::len_utf8)
                .filter(|&len| b.get(i + 1 + len) == Some(&b'\''))
            {
                blank(&mut out, i, i + 2 + len);
                i += 2 + len;
            } else {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The identifier at `i` (after spaces), and where it ends.
fn ident_at(s: &[u8], mut i: usize) -> Option<(String, usize)> {
    while i < s.len() && s[i].is_ascii_whitespace() {
        i += 1;
    }
    let start = i;
    while i < s.len() && is_ident(s[i]) {
        i += 1;
    }
    (i > start).then(|| (String::from_utf8_lossy(&s[start..i]).into_owned(), i))
}

/// Skips spaces and one `::`; returns the position after it.
fn path_sep(s: &[u8], mut i: usize) -> Option<usize> {
    while i < s.len() && s[i].is_ascii_whitespace() {
        i += 1;
    }
    s[i..].starts_with(b"::").then_some(i + 2)
}

/// The first segment of each path in a `{ a::b, c, d::{e, f} }` group that
/// starts at `open` (the `{`), with its offset.
fn group_heads(s: &[u8], open: usize) -> Vec<(String, usize)> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut expect_head = true;
    let mut i = open;
    while i < s.len() {
        match s[i] {
            b'{' => {
                depth += 1;
                expect_head = depth == 1;
                i += 1;
            }
            b'}' => {
                depth -= 1;
                i += 1;
                if depth == 0 {
                    break;
                }
            }
            b',' => {
                expect_head = depth == 1;
                i += 1;
            }
            c if is_ident(c) && expect_head && depth == 1 => {
                let (name, end) = ident_at(s, i).unwrap();
                heads.push((name, i));
                expect_head = false;
                i = end;
            }
            _ => i += 1,
        }
    }
    heads
}

/// The module path (below the crate root) of each byte offset's inline
/// `mod name { ... }`, innermost last.
fn inline_mods(s: &[u8]) -> Vec<(usize, usize, String)> {
    let mut spans = Vec::new();
    let mut stack: Vec<(usize, String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < s.len() {
        if s[i..].starts_with(b"mod") && (i == 0 || !is_ident(s[i - 1])) {
            if let Some((name, end)) = ident_at(s, i + 3).filter(|_| !is_ident(s[i + 3])) {
                let mut j = end;
                while j < s.len() && s[j].is_ascii_whitespace() {
                    j += 1;
                }
                if s.get(j) == Some(&b'{') {
                    stack.push((j, name, depth));
                    depth += 1;
                    i = j + 1;
                    continue;
                }
            }
        }
        match s[i] {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if stack.last().is_some_and(|(_, _, d)| *d == depth) {
                    let (start, name, _) = stack.pop().unwrap();
                    spans.push((start, i, name));
                }
            }
            _ => {}
        }
        i += 1;
    }
    spans
}

fn line_of(s: &[u8], offset: usize) -> usize {
    s[..offset].iter().filter(|&&c| c == b'\n').count() + 1
}

/// The module path of a source file below `src`, e.g. `mmu/shadow/cache.rs`
/// is `["mmu", "shadow", "cache"]` and `mmu/mod.rs` is `["mmu"]`.
fn file_module(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// Names `lib.rs` re-exports, with the top-level module each comes from
/// (`crate::VcpuId` is a use of the module that defines it).
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let s = strip(lib);
    let text = String::from_utf8_lossy(&s).into_owned();
    let mut map = BTreeMap::new();
    for item in text.split(';') {
        let item = item.trim();
        let Some(rest) = item.strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, tail)) = rest.split_once("::") else {
            continue;
        };
        let module = module.trim().to_string();
        for name in tail
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
        {
            // The last word of each `a::b as c` is the name it exports; every
            // word is mapped, which only adds harmless extra keys.
            map.insert(name.to_string(), module.clone());
        }
    }
    map
}

/// Every use of another top-level module in the sources under `src`.
fn edges(src: &Path) -> Vec<Edge> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap_or_default();
    let reexported = reexports(&lib);
    let mut files = Vec::new();
    collect(src, &mut files);
    let mut out = Vec::new();
    for path in files {
        let rel = path.strip_prefix(src).unwrap().to_path_buf();
        let module = file_module(&rel);
        let Some(top) = module.first().cloned() else {
            continue;
        };
        let text = std::fs::read_to_string(&path).unwrap();
        let s = strip(&text);
        let mods = inline_mods(&s);
        let resolve = |name: &str| -> Option<String> {
            if floor_of(name).is_some() {
                Some(name.to_string())
            } else {
                reexported.get(name).cloned()
            }
        };
        let mut push = |offset: usize, to: String| {
            if to != top {
                out.push(Edge {
                    file: rel.display().to_string(),
                    line: line_of(&s, offset),
                    from: top.clone(),
                    to,
                });
            }
        };
        let mut i = 0;
        while i < s.len() {
            let word_start = i == 0 || !is_ident(s[i - 1]);
            if word_start
                && s[i..].starts_with(b"crate")
                && !s.get(i + 5).is_some_and(|&c| is_ident(c))
            {
                if let Some(j) = path_sep(&s, i + 5) {
                    let mut k = j;
                    while k < s.len() && s[k].is_ascii_whitespace() {
                        k += 1;
                    }
                    if s.get(k) == Some(&b'{') {
                        for (name, at) in group_heads(&s, k) {
                            if let Some(to) = resolve(&name) {
                                push(at, to);
                            }
                        }
                    } else if let Some((name, _)) = ident_at(&s, k) {
                        if let Some(to) = resolve(&name) {
                            push(i, to);
                        }
                    }
                }
                i += 5;
                continue;
            }
            if word_start
                && s[i..].starts_with(b"super")
                && !s.get(i + 5).is_some_and(|&c| is_ident(c))
            {
                // Count the `super::` run and resolve it from this offset's module.
                let mut ups = 0;
                let mut k = i;
                while s[k..].starts_with(b"super") {
                    let Some(next) = path_sep(&s, k + 5) else {
                        break;
                    };
                    ups += 1;
                    k = next;
                    while k < s.len() && s[k].is_ascii_whitespace() {
                        k += 1;
                    }
                }
                if ups > 0 {
                    let mut here = module.clone();
                    let mut inner: Vec<&(usize, usize, String)> =
                        mods.iter().filter(|(a, b, _)| *a < i && i < *b).collect();
                    inner.sort_by_key(|(a, _, _)| *a);
                    here.extend(inner.iter().map(|(_, _, n)| n.clone()));
                    if ups <= here.len() {
                        here.truncate(here.len() - ups);
                        let names: Vec<(String, usize)> = if !here.is_empty() {
                            vec![(here[0].clone(), i)]
                        } else if s.get(k) == Some(&b'{') {
                            group_heads(&s, k)
                        } else {
                            ident_at(&s, k).map(|(n, _)| (n, i)).into_iter().collect()
                        };
                        for (name, at) in names {
                            if let Some(to) = resolve(&name) {
                                push(at, to);
                            }
                        }
                    }
                }
                i = k.max(i + 5);
                continue;
            }
            i += 1;
        }
    }
    out
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// The top-level modules of `src` (its `.rs` files and directories).
fn top_modules(src: &Path) -> BTreeSet<String> {
    std::fs::read_dir(src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir() || p.extension().is_some_and(|e| e == "rs"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .filter(|m| m != "lib")
        .collect()
}

/// What is wrong with the floors under `src`, one line each. `pending`
/// lists module pairs known to reach up still (each must still occur, so
/// the list only shrinks).
fn violations(src: &Path, pending: &[(&str, &str)]) -> Vec<String> {
    let mut problems = Vec::new();
    for m in top_modules(src) {
        if floor_of(&m).is_none() {
            problems.push(format!(
                "{m}: a top-level module with no floor (add it to FLOORS)"
            ));
        }
    }
    let edges: Vec<Edge> = edges(src);
    let is_pending = |e: &Edge| pending.iter().any(|&(f, t)| f == e.from && t == e.to);
    for &(f, t) in pending {
        if !edges.iter().any(|e| e.from == f && e.to == t) {
            problems.push(format!("`{f}` -> `{t}` is gone: take it off PENDING"));
        }
    }
    for e in edges.iter().filter(|e| !is_pending(e)) {
        let (Some(from), Some(to)) = (floor_of(&e.from), floor_of(&e.to)) else {
            continue;
        };
        if to > from {
            problems.push(format!(
                "{}:{}: `{}` (floor {from}) uses `{}` (floor {to}), a higher floor",
                e.file, e.line, e.from, e.to
            ));
        }
    }
    let mut graph: BTreeMap<&str, BTreeMap<&str, &Edge>> = BTreeMap::new();
    for e in edges.iter().filter(|e| !is_pending(e)) {
        graph.entry(&e.from).or_default().entry(&e.to).or_insert(e);
    }
    // Every cycle, one at a time: report one, drop its last step, look again.
    while let Some(cycle) = find_cycle(&graph) {
        let steps: Vec<String> = cycle
            .windows(2)
            .map(|w| {
                let e = graph[w[0]][w[1]];
                format!("{} -> {} ({}:{})", w[0], w[1], e.file, e.line)
            })
            .collect();
        problems.push(format!("import cycle: {}", steps.join(", ")));
        let n = cycle.len();
        graph.get_mut(cycle[n - 2]).unwrap().remove(cycle[n - 1]);
    }
    problems
}

/// A cycle in the module graph, as its modules with the first repeated last.
fn find_cycle<'a>(graph: &BTreeMap<&'a str, BTreeMap<&'a str, &Edge>>) -> Option<Vec<&'a str>> {
    fn visit<'a>(
        node: &'a str,
        graph: &BTreeMap<&'a str, BTreeMap<&'a str, &Edge>>,
        state: &mut BTreeMap<&'a str, u8>,
        stack: &mut Vec<&'a str>,
    ) -> Option<Vec<&'a str>> {
        state.insert(node, 1);
        stack.push(node);
        for &next in graph.get(node).map(|m| m.keys()).into_iter().flatten() {
            match state.get(next) {
                Some(1) => {
                    let at = stack.iter().position(|&n| n == next).unwrap();
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(next);
                    return Some(cycle);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(next, graph, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node, 2);
        None
    }
    let mut state = BTreeMap::new();
    for &node in graph.keys() {
        if !state.contains_key(node) {
            if let Some(c) = visit(node, graph, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

fn hv_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn no_lower_floor_uses_a_higher_one_and_no_cycles() {
    let problems = violations(&hv_src(), PENDING);
    assert!(
        problems.is_empty(),
        "{} floor violations in crates/hv/src:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The check sees all the ways a path can reach up: a planted tree with one
/// of each must fail on each, with its file and line.
#[test]
fn planted_violations_are_caught() {
    let dir = std::env::temp_dir().join(format!("hv-floors-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let write = |rel: &str, text: &str| {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write(
        "lib.rs",
        "pub mod vcpu;\npub mod mmu;\npub use vcpu::{Vcpu, VcpuId};\n",
    );
    write("vcpu/mod.rs", "use crate::mmu::Mmu;\npub struct VcpuId;\n");
    write(
        "mmu/mod.rs",
        "// crate::vcpu in a comment is not a use\nconst S: &str = \"crate::vcpu\";\n\
         pub struct Mmu;\nuse crate::{\n    time::Cycles,\n    vcpu::Vcpu,\n};\n",
    );
    write(
        "mmu/dirty_log.rs",
        "fn f() {}\n\nfn g(_: crate::VcpuId) {}\n",
    );
    write(
        "mmu/shadow/cache.rs",
        "mod tests {\n    use super::super::super::super::vcpu::Vcpu;\n    use super::super::Mmu;\n}\n",
    );
    write("time.rs", "");
    let problems = violations(&dir, &[]);
    let _ = std::fs::remove_dir_all(&dir);
    let text = problems.join("\n");
    for expected in [
        "mmu/mod.rs:6: `mmu` (floor 1) uses `vcpu` (floor 3)",
        "mmu/dirty_log.rs:3: `mmu` (floor 1) uses `vcpu` (floor 3)",
        "mmu/shadow/cache.rs:2: `mmu` (floor 1) uses `vcpu` (floor 3)",
        "import cycle: ",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    assert_eq!(problems.len(), 4, "{text}");
}
