//! The layering of src/: no import circle among the library's top-level modules (each folder or
//! file directly under src/), and nothing in the backends or the models importing the layers
//! above them.
//!
//! An import is a `crate::` path in code (comments and string literals left out), or a `super::`
//! path that climbs to the crate root; every `cfg` counts, so a wasm-only import is an edge too.
//! src/bin is a crate of its own (its `crate::` names its own modules, and the library cannot
//! name it), so it is not scanned; src/lib.rs only re-exports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules below the front-ends and the decoding strategies, and what they may not import.
const BELOW: &[(&str, &[&str])] = &[
    ("backend", &["engine", "decode", "remote", "runtime", "wasm"]),
    ("model", &["engine", "decode", "remote", "runtime", "wasm"]),
];

/// Where an import is: the file and its line.
type At = (String, usize);
/// `(from, to)` module -> where `from` imports `to`.
type Edges = BTreeMap<(String, String), Vec<At>>;

#[test]
fn no_import_circle_among_top_level_modules() {
    let edges = crate_edges();
    let circles = circles(&edges);
    let report: Vec<String> = circles.iter().map(|c| describe(c, &edges)).collect();
    assert!(report.is_empty(), "import circles among src/'s top-level modules:\n{}", report.join("\n"));
}

#[test]
fn backends_and_models_import_nothing_above_them() {
    let edges = crate_edges();
    let mut bad = vec![];
    for ((from, to), at) in &edges {
        if BELOW.iter().any(|(low, above)| low == from && above.contains(&to.as_str())) {
            bad.extend(at.iter().map(|(file, line)| format!("  {file}:{line} imports {to}")));
        }
    }
    assert!(bad.is_empty(), "src/backend and src/model import from above them:\n{}", bad.join("\n"));
}

/// The scanner reads what code says: paths in groups, in `use` and inline, not in comments,
/// strings or characters.
#[test]
fn imports_are_read_from_code_only() {
    let src = r##"
        use crate::{backend::{cpu, gpu}, kv};
        /* crate::hidden */ // crate::hidden
        /// [`crate::hidden`]
        fn f<'a>(x: &'a str) -> char {
            let _ = "crate::hidden \" crate::hidden";
            let _ = r#"crate::hidden"#;
            let _ = crate :: sampling::argmax(&[]);
            let _ = '"';
            let _ = $crate::error::Error::Closed;
            super::super::storage::f();
            '\''
        }
    "##;
    let found: BTreeSet<String> = imports(src, 2).into_iter().map(|(m, _)| m).collect();
    let want = ["backend", "error", "kv", "sampling", "storage"];
    assert_eq!(found, want.iter().map(|s| s.to_string()).collect());
    // One `super::` from a file two modules deep stays inside its module.
    assert!(imports("use super::storage;", 2).is_empty());
}

#[test]
fn circles_are_found() {
    let mut edges = Edges::new();
    for (a, b) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e"), ("e", "d"), ("f", "a")] {
        edges.insert((a.into(), b.into()), vec![(format!("src/{a}.rs"), 1)]);
    }
    let found = circles(&edges);
    assert_eq!(found, vec![vec!["a", "b", "c"], vec!["d", "e"]]);
    assert!(describe(&found[1], &edges).contains("d -> e (src/d.rs:1)"));
}

/// Every import between two different top-level modules of the library.
fn crate_edges() -> Edges {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let tops: BTreeSet<String> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let name = p.file_stem()?.to_str()?.to_string();
            (p.is_dir() || p.extension().is_some_and(|e| e == "rs")).then_some(name)
        })
        .filter(|name| name != "lib" && name != "bin")
        .collect();
    let mut edges = Edges::new();
    for top in &tops {
        let mut files = vec![];
        let (file, dir) = (src.join(format!("{top}.rs")), src.join(top));
        if file.is_file() {
            files.push(file);
        }
        rust_files(&dir, &mut files);
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            let rel = file.strip_prefix(src.parent().unwrap()).unwrap().display().to_string();
            for (to, line) in imports(&text, depth(&src, &file)) {
                if &to != top && tops.contains(&to) {
                    edges.entry((top.clone(), to)).or_default().push((rel.clone(), line));
                }
            }
        }
    }
    assert!(edges.keys().any(|(from, _)| from == "engine"), "no imports found under {}", src.display());
    edges
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// How many modules deep a file's code is (src/kv.rs and src/decode/mod.rs: 1), which is how
/// many `super::` reach the crate root from it.
fn depth(src: &Path, file: &Path) -> usize {
    let parts = file.strip_prefix(src).unwrap().components().count();
    if file.file_name().is_some_and(|n| n == "mod.rs") { parts - 1 } else { parts }
}

/// The crate-root names the code of a file `depth` modules deep imports, with their lines.
fn imports(text: &str, depth: usize) -> Vec<(String, usize)> {
    let code = code_only(text);
    let b = code.as_bytes();
    let ident = |i: usize| {
        let end = (i..b.len()).find(|&j| !(b[j].is_ascii_alphanumeric() || b[j] == b'_')).unwrap_or(b.len());
        (&code[i..end], end)
    };
    let skip_space = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    // After `::` at `i`: the path's next segment, or `None` where there is none.
    let colons = |i: usize| {
        let i = skip_space(i);
        b[i..].starts_with(b"::").then(|| skip_space(i + 2))
    };
    let line = |i: usize| code[..i].matches('\n').count() + 1;
    let mut found = vec![];
    let mut i = 0;
    while i < b.len() {
        let starts_word = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if !(starts_word && b[i].is_ascii_alphabetic()) {
            i += 1;
            continue;
        }
        let (word, end) = ident(i);
        let mut next = match word {
            "crate" => colons(end),
            "super" => {
                // The whole chain of `super::`, which reaches the root at `depth` of them.
                let (mut n, mut at) = (1, colons(end));
                while let Some(j) = at.filter(|&j| ident(j).0 == "super") {
                    n += 1;
                    at = colons(ident(j).1);
                }
                at.filter(|_| n >= depth)
            }
            _ => None,
        };
        if let Some(j) = next.take() {
            if b[j] == b'{' {
                // A group: the first segment of each of its paths.
                let (mut depth, mut k, mut item_start) = (0, j, true);
                loop {
                    match b[k] {
                        b'{' => {
                            depth += 1;
                            item_start = depth == 1;
                        }
                        b'}' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        b',' if depth == 1 => item_start = true,
                        c if item_start && (c.is_ascii_alphabetic() || c == b'_') => {
                            found.push((ident(k).0.to_string(), line(k)));
                            item_start = false;
                        }
                        _ => {}
                    }
                    k += 1;
                }
            } else {
                found.push((ident(j).0.to_string(), line(j)));
            }
        }
        i = end;
    }
    found
}

/// `text` with its comments and the contents of its string and character literals blanked out
/// (newlines kept, so lines still count).
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, s: &[char]| out.extend(s.iter().map(|&ch| if ch == '\n' { '\n' } else { ' ' }));
    let mut i = 0;
    while i < c.len() {
        let rest = &c[i..];
        let end = if rest.starts_with(&['/', '/']) {
            i + rest.iter().position(|&ch| ch == '\n').unwrap_or(rest.len())
        } else if rest.starts_with(&['/', '*']) {
            let mut depth = 0;
            let mut j = i;
            loop {
                if c[j..].starts_with(&['/', '*']) {
                    depth += 1;
                    j += 2;
                } else if c[j..].starts_with(&['*', '/']) {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break j;
                    }
                } else {
                    j += 1;
                }
            }
        } else if rest[0] == 'r' && (i == 0 || !(c[i - 1].is_alphanumeric() || c[i - 1] == '_')) && raw_hashes(&rest[1..]).is_some() {
            let hashes = raw_hashes(&rest[1..]).unwrap();
            let close: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            let body = i + 2 + hashes;
            body + (body..c.len()).position(|j| c[j..].starts_with(&close)).unwrap() + close.len()
        } else if rest[0] == '"' {
            let mut j = i + 1;
            while c[j] != '"' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            j + 1
        } else if rest[0] == '\'' && rest.len() > 2 && (rest[1] == '\\' || rest[2] == '\'') {
            // A character (a lifetime has no closing quote right after its first character).
            let mut j = i + 1 + if rest[1] == '\\' { 2 } else { 1 };
            while c[j] != '\'' {
                j += 1;
            }
            j + 1
        } else {
            out.push(rest[0]);
            i += 1;
            continue;
        };
        blank(&mut out, &c[i..end]);
        i = end;
    }
    out
}

/// Where `s` (what follows an `r`) opens a raw string: its number of `#`.
fn raw_hashes(s: &[char]) -> Option<usize> {
    let hashes = s.iter().take_while(|&&ch| ch == '#').count();
    (s.get(hashes) == Some(&'"')).then_some(hashes)
}

/// The import circles: each set of modules that reach one another (a strongly connected
/// component of more than one module), sorted.
fn circles(edges: &Edges) -> Vec<Vec<String>> {
    let nodes: BTreeSet<&String> = edges.keys().flat_map(|(a, b)| [a, b]).collect();
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from];
        while let Some(n) = todo.pop() {
            for (a, b) in edges.keys() {
                if a == n && seen.insert(b) {
                    todo.push(b);
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<&String>> = nodes.iter().map(|&n| (n, reach(n))).collect();
    let mut out: Vec<Vec<String>> = vec![];
    for &n in &nodes {
        let circle: Vec<String> =
            nodes.iter().filter(|&&m| reaches[n].contains(m) && reaches[m].contains(n)).map(|m| m.to_string()).collect();
        if circle.len() > 1 && !out.contains(&circle) {
            out.push(circle);
        }
    }
    out
}

/// A circle's modules and the imports between them, with the first place each is made.
fn describe(circle: &[String], edges: &Edges) -> String {
    let mut s = format!("  {}:", circle.join(", "));
    for ((from, to), at) in edges {
        if circle.contains(from) && circle.contains(to) {
            let more = if at.len() > 1 { format!(" and {} more", at.len() - 1) } else { String::new() };
            s += &format!("\n    {from} -> {to} ({}:{}{more})", at[0].0, at[0].1);
        }
    }
    s
}
