//! No import cycle between the top-level modules of a crate (issue 28).
//!
//! A crate's top-level modules (`src/x.rs` or `src/x/`) are its floors: each may import only
//! the ones below it, so that whoever edits a floor knows what can break and the order is the
//! one `docs/store.md` ("Files, one job each") describes. The compiler checks this between
//! crates; inside one it does not, so this test does: it reads every `.rs` file under a crate's
//! `src/`, finds the top-level modules each file names (`crate::x`, `use crate::{x, y::z}`,
//! `super::x` that reaches the crate root, and names the crate root re-exports, such as
//! `crate::Store`, counted as the module they come from), and fails with each cycle it finds,
//! spelt out with the file and line of every import in it.
//!
//! Test code is not counted (`#[cfg(test)]` items and the files they bring in): a unit test
//! may use the crate from the top, as the integration tests do. Comments and string literals
//! are not read.
//!
//! It checks every crate under `crates/` (this file sits in the store's tests because the
//! store is where the floors matter most; it reads the other crates' sources, not their code).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// Where an import was found, to name it in a failure.
#[derive(Clone, Debug)]
struct Site {
    file: String,
    line: usize,
}

/// The top-level module graph of one crate: `edges[a][b]` is the first place where `a`
/// imports `b`.
struct Graph {
    modules: BTreeSet<String>,
    edges: BTreeMap<String, BTreeMap<String, Site>>,
}

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("crates/").to_path_buf()
}

/// Blanks out comments, string and char literals (keeping newlines, so lines still count).
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let blank = |out: &mut Vec<u8>, c: u8| out.push(if c == b'\n' { b'\n' } else { b' ' });
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if c == b'r' && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#')) && (i == 0 || !is_ident(b[i - 1])) {
            // A raw string r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
            let end = (j + 1..b.len()).find(|&k| b[k..].starts_with(&close)).map_or(b.len(), |k| k + close.len());
            for &x in &b[i..end] {
                blank(&mut out, x);
            }
            i = end;
        } else if c == b'"' {
            blank(&mut out, c);
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    blank(&mut out, b[i]);
                    i += 1;
                }
                if i < b.len() {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
            if i < b.len() {
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if c == b'\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            let len = if b.get(i + 1) == Some(&b'\\') {
                (i + 2..b.len()).find(|&k| b[k] == b'\'').map(|k| k + 1 - i)
            } else {
                let ch = src[i + 1..].chars().next().map_or(1, char::len_utf8);
                (b.get(i + 1 + ch) == Some(&b'\'')).then_some(ch + 2)
            };
            match len {
                Some(n) => {
                    for &x in &b[i..i + n] {
                        blank(&mut out, x);
                    }
                    i += n;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8(out).expect("only ASCII was replaced")
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Blanks out every `#[cfg(test)]` item (up to its `;` or the end of its block); returns the
/// text and the names of the `mod x;` among them (files that are test code).
fn drop_test_items(src: &str) -> (String, Vec<String>) {
    let mut b = src.as_bytes().to_vec();
    let mut test_mods = Vec::new();
    let mut from = 0;
    while let Some(at) = find(&b, b"#[cfg(test)]", from) {
        let start = at;
        let mut i = at + b"#[cfg(test)]".len();
        // Further attributes of the same item.
        loop {
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
            if b[i..].starts_with(b"#[") {
                let mut depth = 0;
                while i < b.len() {
                    match b[i] {
                        b'[' => depth += 1,
                        b']' => {
                            depth -= 1;
                            if depth == 0 {
                                i += 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
            } else {
                break;
            }
        }
        let item_start = i;
        let mut depth = 0i32;
        let mut end = b.len();
        while i < b.len() {
            match b[i] {
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' => depth -= 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                b';' if depth == 0 => {
                    end = i + 1;
                    break;
                }
                _ => {}
            }
            i += 1;
        }
        let item = String::from_utf8_lossy(&b[item_start..end]).to_string();
        let words: Vec<&str> = item.split(|c: char| !(c.is_alphanumeric() || c == '_')).filter(|w| !w.is_empty()).collect();
        if item.trim_end().ends_with(';') {
            if let Some(p) = words.iter().position(|w| *w == "mod") {
                if let Some(name) = words.get(p + 1) {
                    test_mods.push(name.to_string());
                }
            }
        }
        for x in &mut b[start..end] {
            if *x != b'\n' {
                *x = b' ';
            }
        }
        from = end;
    }
    (String::from_utf8(b).expect("ASCII blanks"), test_mods)
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    (from..hay.len().saturating_sub(needle.len() - 1)).find(|&i| hay[i..].starts_with(needle))
}

/// The identifier at `i` (after spaces), and where it ends.
fn ident_at(b: &[u8], mut i: usize) -> Option<(String, usize)> {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    let s = i;
    while i < b.len() && is_ident(b[i]) {
        i += 1;
    }
    (i > s).then(|| (String::from_utf8_lossy(&b[s..i]).to_string(), i))
}

/// The first segment of each path in the use tree at `i` (`x::...`, or `{x, y::z, ...}`).
fn heads(b: &[u8], mut i: usize, out: &mut Vec<String>) {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    if b.get(i) == Some(&b'{') {
        i += 1;
        let mut depth = 1;
        let mut at_entry = true;
        while i < b.len() && depth > 0 {
            match b[i] {
                b'{' => depth += 1,
                b'}' => depth -= 1,
                b',' if depth == 1 => at_entry = true,
                c if depth == 1 && at_entry && !c.is_ascii_whitespace() => {
                    heads(b, i, out);
                    at_entry = false;
                }
                _ => {}
            }
            i += 1;
        }
    } else if let Some((name, _)) = ident_at(b, i) {
        out.push(name);
    }
}

/// Every occurrence of `word::` at `i` that is not part of a longer name (nor `$crate::`).
fn occurrences(b: &[u8], word: &[u8]) -> Vec<usize> {
    let pat = [word, b"::"].concat();
    let mut v = Vec::new();
    let mut from = 0;
    while let Some(at) = find(b, &pat, from) {
        if at == 0 || !(is_ident(b[at - 1]) || b[at - 1] == b'$' || b[at - 1] == b':') {
            v.push(at + pat.len());
        }
        from = at + pat.len();
    }
    v
}

fn line_of(b: &[u8], at: usize) -> usize {
    b[..at].iter().filter(|&&c| c == b'\n').count() + 1
}

/// The graph of the crate whose sources are in `src`.
fn graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    collect(src, &mut files);
    let rel = |f: &Path| f.strip_prefix(src).expect("under src").to_path_buf();
    // The crate's top-level modules.
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|f| {
            let r = rel(f);
            let first = r.components().next()?.as_os_str().to_str()?.to_string();
            let name = first.strip_suffix(".rs").unwrap_or(&first).to_string();
            (name != "lib" && name != "main" && name != "bin").then_some(name)
        })
        .collect();
    let texts: BTreeMap<PathBuf, (String, Vec<String>)> = files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            (rel(f), drop_test_items(&strip(&text)))
        })
        .collect();
    // Files a `#[cfg(test)] mod x;` brings in: test code.
    let mut test_files = BTreeSet::new();
    for (path, (_, mods)) in &texts {
        let dir = match path.file_name().and_then(|n| n.to_str()) {
            Some("lib.rs" | "main.rs" | "mod.rs") => path.parent().unwrap_or(Path::new("")).to_path_buf(),
            _ => path.with_extension(""),
        };
        for m in mods {
            test_files.insert(dir.join(format!("{m}.rs")));
            test_files.insert(dir.join(m));
        }
    }
    let is_test = |p: &Path| test_files.iter().any(|t| p == t || p.starts_with(t));
    // What the crate root re-exports (`pub use x::...::{A, B}`), counted as module `x`.
    let mut reexports: BTreeMap<String, String> = BTreeMap::new();
    for root in ["lib.rs", "main.rs"] {
        let Some((text, _)) = texts.get(Path::new(root)) else { continue };
        for stmt in text.split(';') {
            let Some(at) = stmt.find("pub use ") else { continue };
            let path = stmt[at + "pub use ".len()..].trim().trim_start_matches("crate::");
            let Some((first, _)) = ident_at(path.as_bytes(), 0) else { continue };
            if !modules.contains(&first) {
                continue;
            }
            for w in path.split(|c: char| !(c.is_alphanumeric() || c == '_')).skip(1).filter(|w| !w.is_empty() && *w != "as") {
                reexports.entry(w.to_string()).or_insert_with(|| first.clone());
            }
        }
    }
    let mut edges: BTreeMap<String, BTreeMap<String, Site>> = BTreeMap::new();
    for (path, (text, _)) in &texts {
        if is_test(path) {
            continue;
        }
        let comps: Vec<String> = path.with_extension("").components().map(|c| c.as_os_str().to_string_lossy().to_string()).collect();
        // The file's module path: `a/b.rs` is a::b, `a/mod.rs` and `a.rs` are a, the root none.
        let mut modpath = comps.clone();
        if matches!(modpath.last().map(String::as_str), Some("mod" | "lib" | "main")) {
            modpath.pop();
        }
        let Some(from) = modpath.first().cloned() else { continue };
        let b = text.as_bytes();
        let mut add = |name: &str, at: usize| {
            let to = if modules.contains(name) {
                name.to_string()
            } else if let Some(m) = reexports.get(name) {
                m.clone()
            } else {
                return;
            };
            if to != from {
                edges
                    .entry(from.clone())
                    .or_default()
                    .entry(to)
                    .or_insert_with(|| Site { file: path.display().to_string(), line: line_of(b, at) });
            }
        };
        for at in occurrences(b, b"crate") {
            let mut names = Vec::new();
            heads(b, at, &mut names);
            for n in names {
                add(&n, at);
            }
        }
        // `super::x` from `a.rs` or `a/mod.rs` (module path of length 1) names root's `x`;
        // `super::super::x` from `a/b.rs` too.
        for at in occurrences(b, b"super") {
            let mut depth = 1;
            let mut i = at;
            while b[i..].starts_with(b"super::") {
                depth += 1;
                i += b"super::".len();
            }
            if depth == modpath.len() {
                let mut names = Vec::new();
                heads(b, i, &mut names);
                for n in names {
                    add(&n, at);
                }
            }
        }
    }
    Graph { modules, edges }
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).map(|e| e.expect("entry").path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            collect(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The strongly connected components of more than one module (Tarjan's algorithm).
fn cycles(g: &Graph) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        let g = t.g;
        for w in g.edges.get(v).into_iter().flat_map(|e| e.keys()) {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let l = t.low[w].min(t.low[v]);
                t.low.insert(v, l);
            } else if t.on.contains(w) {
                let l = t.index[w].min(t.low[v]);
                t.low.insert(v, l);
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = Vec::new();
            loop {
                let w = t.stack.pop().expect("on the stack");
                t.on.remove(w);
                scc.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                t.out.push(scc);
            }
        }
    }
    let mut t = T { g, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), on: BTreeSet::new(), out: Vec::new() };
    for m in &g.modules {
        if !t.index.contains_key(m.as_str()) {
            visit(&mut t, m);
        }
    }
    t.out
}

/// A shortest cycle through `scc[0]` inside the component, each step with where it is imported.
fn describe(g: &Graph, scc: &[String]) -> String {
    let start = &scc[0];
    let inside: BTreeSet<&String> = scc.iter().collect();
    let mut prev: BTreeMap<&String, &String> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    let mut last = None;
    'bfs: while let Some(v) = queue.pop_front() {
        for w in g.edges.get(v).into_iter().flat_map(|e| e.keys()).filter(|w| inside.contains(w)) {
            if w == start {
                last = Some(v);
                break 'bfs;
            }
            if !prev.contains_key(w) {
                prev.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    let mut path = vec![last.expect("a component has a cycle")];
    while path.last() != Some(&start) {
        path.push(prev[path.last().expect("non-empty")]);
    }
    path.reverse();
    path.push(start);
    let mut s = format!(
        "cycle of {} modules {{{}}}: {}",
        scc.len(),
        scc.join(", "),
        path.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(" -> ")
    );
    for w in path.windows(2) {
        let site = &g.edges[w[0]][w[1]];
        s += &format!("\n      {} -> {}: src/{}:{}", w[0], w[1], site.file, site.line);
    }
    s += "\n    every import inside it (the first place each is made):";
    for (from, to, site) in g.edges.iter().filter(|(f, _)| inside.contains(f)).flat_map(|(f, e)| e.iter().map(move |(t, s)| (f, t, s))) {
        if inside.contains(to) {
            s += &format!("\n      {from} -> {to}: src/{}:{}", site.file, site.line);
        }
    }
    s
}

/// Fails with every cycle among the top-level modules of `crates/<name>`.
fn assert_no_cycle(name: &str) {
    let g = graph(&crates_dir().join(name).join("src"));
    let found = cycles(&g);
    assert!(
        found.is_empty(),
        "crates/{name}: its top-level modules import each other in a circle; move what both need to the lower one (docs/store.md, \"Files, one job each\"):\n  {}",
        found.iter().map(|c| describe(&g, c)).collect::<Vec<_>>().join("\n  ")
    );
}

#[test]
fn store_modules_import_one_way() {
    assert_no_cycle("store");
}

#[test]
fn cli_modules_import_one_way() {
    assert_no_cycle("cli");
}

#[test]
fn nbd_modules_import_one_way() {
    assert_no_cycle("nbd");
}

#[test]
fn other_crates_modules_import_one_way() {
    for name in ["control", "ublk", "fuse", "kernel-nbd", "bench", "log"] {
        assert_no_cycle(name);
    }
}

/// The check finds a cycle and names it, through each way of importing it reads.
#[test]
fn the_check_finds_a_planted_cycle() {
    let dir = std::env::temp_dir().join(format!("compcache-module-cycles-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("low")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod high;\nmod low;\nmod mid;\npub use high::Top;\n").unwrap();
    std::fs::write(src.join("high.rs"), "use crate::{mid::M, low};\npub struct Top;\n").unwrap();
    std::fs::write(src.join("mid.rs"), "// crate::high in a comment is not an import\npub struct M;\nconst S: &str = \"crate::low\";\n")
        .unwrap();
    // The cycle: low/mod.rs -> the root's re-export of high.
    std::fs::write(src.join("low/mod.rs"), "mod deep;\npub struct L;\n#[cfg(test)]\nmod tests { use crate::mid::M; }\n").unwrap();
    std::fs::write(src.join("low/deep.rs"), "fn f(_: &crate::Top) {}\n").unwrap();
    let g = graph(&src);
    std::fs::remove_dir_all(&dir).unwrap();
    let found = cycles(&g);
    assert_eq!(found, vec![vec!["high".to_string(), "low".to_string()]], "{:?}", g.edges);
    let text = describe(&g, &found[0]);
    assert!(text.contains("high -> low: src/high.rs:1"), "{text}");
    assert!(text.contains("low -> high: src/low/deep.rs:1"), "{text}");
    // Nothing in a comment, a string or a test is an import.
    assert!(!g.edges.contains_key("mid"), "{:?}", g.edges);
    assert_eq!(g.edges["low"].keys().collect::<Vec<_>>(), vec!["high"]);
}
