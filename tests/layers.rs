//! The layer rules of src/: each folder's `mod.rs` says in its module doc
//! which other folders its files may import, and this test holds every file
//! to it. No server is started: it reads the source.
//!
//! A rule is prose with a fixed opening, so that it reads as a sentence and
//! parses as one:
//!
//! - `May import: A, B and C` — every file of the folder;
//! - `` `<file>.rs` may also import: A and B `` — one file of it, besides;
//! - `never D` (after a `;`) — said for the reader; it must not contain an
//!   item the rule allows.
//!
//! A rule runs to its `;` or to the end of its sentence; a parenthesis in it
//! is a comment. An item is a folder of src/ (`server/`), one file of one
//! (`testing/fault.rs`), or a crate (`the core crate`, `redis-module`).
//! Crates are not checked here (Cargo keeps the core pure; redis-module is
//! the server's API), folders and files are: every `crate::`/`$crate::`
//! path and every `super::` path that leaves the folder must name one the
//! rule allows. A file's own folder is always allowed.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// What one item of a rule allows.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Allowed {
    /// A folder of src/: every file in it.
    Folder(String),
    /// One file of a folder: `testing/fault.rs` is (`testing`, `fault`).
    File(String, String),
}

/// One folder's rule, read from its `mod.rs`.
#[derive(Debug, Default)]
struct Rule {
    /// What every file of the folder may import.
    all: BTreeSet<Allowed>,
    /// What one file (`load.rs` -> `load`) may import besides.
    also: Vec<(String, BTreeSet<Allowed>)>,
    /// What the prose says is never imported.
    never: BTreeSet<Allowed>,
}

/// One module path a file names: the folder (and, when the path goes that
/// deep, the file) it leads to, and where in the file.
#[derive(Debug)]
struct Import {
    folder: String,
    file: Option<String>,
    line: usize,
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The folders of src/, each a layer.
fn folders(src: &Path) -> Vec<String> {
    let mut found: Vec<String> = fs::read_dir(src)
        .expect("src/ is readable")
        .filter_map(Result::ok)
        .filter(|entry| entry.path().is_dir())
        .filter_map(|entry| entry.file_name().into_string().ok())
        .collect();
    found.sort();
    found
}

/// Every .rs file under `dir`, at any depth.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in fs::read_dir(&next).expect("a src/ folder is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The text of a file's leading `//!` lines, joined by spaces.
fn module_doc(source: &str) -> String {
    source
        .lines()
        .map_while(|line| line.trim_start().strip_prefix("//!"))
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The text of a rule that starts right after its opening: up to a `;` or
/// to the end of its sentence (a `.` then a space or the end: the dot of
/// `fault.rs` does not end it), without parentheses.
fn rule_text(after_opening: &str) -> (&str, &str) {
    let bytes = after_opening.as_bytes();
    let mut depth = 0usize;
    for (at, byte) in bytes.iter().enumerate() {
        match byte {
            b'(' => depth += 1,
            b')' => depth = depth.saturating_sub(1),
            b';' if depth == 0 => return (&after_opening[..at], &after_opening[at + 1..]),
            b'.' if depth == 0 && bytes.get(at + 1).is_none_or(|next| *next == b' ') => {
                return (&after_opening[..at], &after_opening[at + 1..]);
            }
            _ => {}
        }
    }
    (after_opening, "")
}

/// The items of a rule's text (`server/, testing/fault.rs (its faults) and
/// the core crate`), checked against the folders that exist.
fn items(text: &str, folders: &[String], context: &str) -> BTreeSet<Allowed> {
    let mut plain = String::new();
    let mut depth = 0usize;
    for ch in text.chars() {
        match ch {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            _ if depth == 0 => plain.push(ch),
            _ => {}
        }
    }
    let mut allowed = BTreeSet::new();
    for item in plain
        .replace(" and ", ",")
        .replace(" or ", ",")
        .split(',')
        .map(|item| item.trim().trim_matches('`').trim())
        .filter(|item| !item.is_empty())
    {
        let Some((folder, file)) = item.split_once('/') else {
            // A crate (`the core crate`, `redis-module`): the reader's.
            assert!(
                !item.contains(".rs"),
                "{context}: `{item}` names a file without its folder (write `folder/{item}`)"
            );
            continue;
        };
        assert!(
            folders.iter().any(|known| known == folder),
            "{context}: `{item}` names no folder of src/ (folders: {folders:?})"
        );
        if file.is_empty() {
            allowed.insert(Allowed::Folder(folder.to_owned()));
        } else {
            let stem = file.strip_suffix(".rs").unwrap_or_else(|| {
                panic!("{context}: `{item}` is neither `folder/` nor `folder/file.rs`")
            });
            assert!(
                src_dir().join(folder).join(file).is_file(),
                "{context}: `{item}` does not exist"
            );
            allowed.insert(Allowed::File(folder.to_owned(), stem.to_owned()));
        }
    }
    allowed
}

/// Reads the rule in `<folder>/mod.rs`; a folder without one fails.
fn read_rule(src: &Path, folder: &str, folders: &[String]) -> Rule {
    let path = src.join(folder).join("mod.rs");
    let source = fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("src/{folder}/ has no mod.rs to state its layer rule"));
    let doc = module_doc(&source);
    let context = format!("src/{folder}/mod.rs");
    let (_, after) = doc.split_once("May import:").unwrap_or_else(|| {
        panic!("{context}: its module doc states no rule (a line `May import: ...`)")
    });
    let (text, mut rest) = rule_text(after);
    let mut rule = Rule {
        all: items(text, folders, &context),
        ..Rule::default()
    };
    let mut opening = rest.trim_start();
    if let Some(never) = opening
        .strip_prefix("never ")
        .or_else(|| opening.strip_prefix("never: "))
    {
        let (text, after) = rule_text(never);
        rule.never = items(text, folders, &context);
        rest = after;
    }
    // Then any number of "`<file>.rs` may also import: ..." rules.
    const ALSO: &str = " may also import:";
    while let Some(at) = rest.find(ALSO) {
        let before = rest[..at].trim_end();
        let file = before
            .rsplit(' ')
            .next()
            .map(|word| word.trim_matches('`'))
            .and_then(|word| word.strip_suffix(".rs"))
            .unwrap_or_else(|| panic!("{context}: `may also import` must follow a `file.rs`"));
        assert!(
            src.join(folder).join(format!("{file}.rs")).is_file(),
            "{context}: `{file}.rs` may also import, but there is no such file"
        );
        let (text, after) = rule_text(&rest[at + ALSO.len()..]);
        rule.also
            .push((file.to_owned(), items(text, folders, &context)));
        rest = after;
        opening = rest;
    }
    let _ = opening;
    for never in &rule.never {
        let granted =
            rule.all.contains(never) || rule.also.iter().any(|(_, also)| also.contains(never));
        assert!(!granted, "{context}: {never:?} is both allowed and never");
    }
    rule
}

/// `source` with comments, strings and character literals blanked (their
/// bytes turned to spaces, newlines kept), so that only code is scanned.
fn code_only(source: &str) -> String {
    let bytes = source.as_bytes();
    let mut out = bytes.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for byte in &mut out[from..to] {
            if *byte != b'\n' {
                *byte = b' ';
            }
        }
    };
    let mut at = 0;
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.starts_with(b"//") {
            let end = rest
                .iter()
                .position(|b| *b == b'\n')
                .map_or(bytes.len(), |n| at + n);
            blank(&mut out, at, end);
            at = end;
        } else if rest.starts_with(b"/*") {
            let mut depth = 0usize;
            let mut end = at;
            while end < bytes.len() {
                if bytes[end..].starts_with(b"/*") {
                    depth += 1;
                    end += 2;
                } else if bytes[end..].starts_with(b"*/") {
                    depth -= 1;
                    end += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    end += 1;
                }
            }
            blank(&mut out, at, end);
            at = end;
        } else if let Some(hashes) = raw_string_start(bytes, at) {
            // r"...", r#"..."#, br"...", cr"...": ends at a quote and as many #.
            let open = at + bytes[at..].iter().position(|b| *b == b'"').unwrap_or(0) + 1;
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let end = bytes[open..]
                .windows(close.len())
                .position(|window| window == close.as_slice())
                .map_or(bytes.len(), |n| open + n + close.len());
            blank(&mut out, at, end);
            at = end;
        } else if rest[0] == b'"' {
            let mut end = at + 1;
            while end < bytes.len() && bytes[end] != b'"' {
                end += if bytes[end] == b'\\' { 2 } else { 1 };
            }
            end = (end + 1).min(bytes.len());
            blank(&mut out, at, end);
            at = end;
        } else if rest[0] == b'\'' {
            // A character literal ('x', '\n', '\'', '\u{..}') or a lifetime ('a).
            let end = if rest.get(1) == Some(&b'\\') {
                rest.iter()
                    .skip(2)
                    .position(|b| *b == b'\'')
                    .map(|n| at + n + 3)
            } else {
                let width = std::str::from_utf8(&rest[1..])
                    .ok()
                    .or_else(|| std::str::from_utf8(&rest[1..rest.len().min(5)]).ok())
                    .and_then(|text| text.chars().next())
                    .map_or(1, char::len_utf8);
                (rest.get(1 + width) == Some(&b'\'')).then_some(at + width + 2)
            };
            match end {
                Some(end) => {
                    blank(&mut out, at, end);
                    at = end;
                }
                None => at += 1,
            }
        } else {
            at += 1;
        }
    }
    String::from_utf8(out).expect("blanking keeps the text UTF-8 at char boundaries")
}

/// If a raw string starts at `at` (`r"`, `r#"`, `br"`, `cr#"`...), how many
/// `#` it has.
fn raw_string_start(bytes: &[u8], at: usize) -> Option<usize> {
    if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
        return None;
    }
    let rest = &bytes[at..];
    let rest = rest
        .strip_prefix(b"br")
        .or_else(|| rest.strip_prefix(b"cr"))
        .or_else(|| rest.strip_prefix(b"r"))?;
    let hashes = rest.iter().take_while(|b| **b == b'#').count();
    (rest.get(hashes) == Some(&b'"')).then_some(hashes)
}

fn is_ident_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_'
}

/// The identifier at the start of `text`, after spaces.
fn leading_ident(text: &str) -> &str {
    let text = text.trim_start();
    let end = text
        .bytes()
        .position(|b| !is_ident_byte(b))
        .unwrap_or(text.len());
    &text[..end]
}

/// After `crate::` (or a `super::` that reached the crate root): the paths
/// it goes on to, each cut to its first two segments (folder, file); a
/// `{a::b, c}` group gives one for each of its entries.
fn paths_after(text: &str) -> Vec<(String, Option<String>)> {
    use_tree(text, 2)
        .into_iter()
        .filter_map(|mut path| {
            let file = (path.len() > 1).then(|| path.remove(1));
            let folder = path.into_iter().next()?;
            Some((folder, file))
        })
        .collect()
}

/// The paths of a use tree (`a::{b, c::d}`, or a plain path), each cut to
/// `segments` segments.
fn use_tree(text: &str, segments: usize) -> Vec<Vec<String>> {
    let text = text.trim_start();
    if let Some(group) = text.strip_prefix('{') {
        return group_entries(group)
            .into_iter()
            .flat_map(|entry| use_tree(entry, segments))
            .collect();
    }
    let first = leading_ident(text);
    if first.is_empty() {
        return Vec::new();
    }
    let rest = text[first.len()..].trim_start();
    match rest.strip_prefix("::") {
        Some(rest) if segments > 1 => {
            let deeper = use_tree(rest, segments - 1);
            if deeper.is_empty() {
                return vec![vec![first.to_owned()]];
            }
            deeper
                .into_iter()
                .map(|tail| std::iter::once(first.to_owned()).chain(tail).collect())
                .collect()
        }
        _ => vec![vec![first.to_owned()]],
    }
}

/// The top-level entries of a `{...}` group, `group` starting after its `{`.
fn group_entries(group: &str) -> Vec<&str> {
    let mut entries = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (at, ch) in group.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' if depth == 0 => {
                entries.push(&group[start..at]);
                return entries;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                entries.push(&group[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    entries
}

/// Every path in `file` (under src/<folder>/) that names a folder of src/:
/// `crate::x`, `$crate::x`, and `super::` paths that climb out of the file's
/// folder. (Inline `mod` blocks are not counted when climbing, which only
/// makes a `super::` reach higher than it does: a stricter check.)
fn imports(src: &Path, file: &Path) -> Vec<Import> {
    let source = fs::read_to_string(file).expect("a source file is readable");
    let code = code_only(&source);
    let relative = file.strip_prefix(src).expect("under src/");
    // The file's module path: src/<a>/<b>.rs is [a, b]; src/<a>/mod.rs is [a].
    let mut module: Vec<String> = relative
        .with_extension("")
        .components()
        .map(|part| part.as_os_str().to_string_lossy().into_owned())
        .collect();
    if module.last().is_some_and(|last| last == "mod") {
        module.pop();
    }
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    let line_of = |at: usize| code[..at].bytes().filter(|b| *b == b'\n').count() + 1;
    let mut at = 0;
    while let Some(offset) = code[at..].find("crate") {
        let start = at + offset;
        at = start + "crate".len();
        let before_ok = start == 0 || !is_ident_byte(bytes[start - 1]);
        let after = code[at..].trim_start();
        if !before_ok || !after.starts_with("::") {
            continue;
        }
        for (folder, file) in paths_after(&after[2..]) {
            found.push(Import {
                folder,
                file,
                line: line_of(start),
            });
        }
    }
    let mut at = 0;
    while let Some(offset) = code[at..].find("super") {
        let start = at + offset;
        at = start + "super".len();
        if start > 0
            && (is_ident_byte(bytes[start - 1]) || code[..start].trim_end().ends_with("::"))
        {
            continue; // part of a longer word, or a `super::super` counted from its first
        }
        // Climb: each `super::` leaves one module.
        let mut rest = &code[start..];
        let mut here = module.clone();
        while let Some(after) = rest.strip_prefix("super").map(str::trim_start) {
            let Some(after) = after.strip_prefix("::") else {
                break;
            };
            here.pop();
            rest = after.trim_start();
        }
        if rest.starts_with("super") {
            continue; // `use super::super;`-like: names a module, not a path through one
        }
        let targets: Vec<(String, Option<String>)> = match here.as_slice() {
            // At the crate root: the path goes on to a folder.
            [] => paths_after(rest),
            // Still inside a folder: its own folder, whatever comes next.
            [folder, ..] => vec![(folder.clone(), None)],
        };
        for (folder, file) in targets {
            found.push(Import {
                folder,
                file,
                line: line_of(start),
            });
        }
    }
    found
}

/// Whether `rule` lets `file_stem` (a file of `folder`) import `import`.
fn allows(rule: &Rule, folder: &str, file_stem: &str, import: &Import) -> bool {
    if import.folder == folder {
        return true;
    }
    let grants = |set: &BTreeSet<Allowed>| {
        set.iter().any(|allowed| match allowed {
            Allowed::Folder(name) => *name == import.folder,
            Allowed::File(name, stem) => {
                *name == import.folder && import.file.as_deref() == Some(stem.as_str())
            }
        })
    };
    grants(&rule.all)
        || rule
            .also
            .iter()
            .any(|(file, also)| file == file_stem && grants(also))
}

/// The paths in src/<folder>/ that cross the folder's rule, as
/// `src/<a>/<b>.rs:12 names c::d`.
fn crossings(src: &Path) -> Vec<String> {
    let folders = folders(src);
    let mut crossed = Vec::new();
    for folder in &folders {
        let rule = read_rule(src, folder, &folders);
        for file in rust_files(&src.join(folder)) {
            let stem = file
                .file_stem()
                .map(|stem| stem.to_string_lossy().into_owned())
                .unwrap_or_default();
            for import in imports(src, &file) {
                if !folders.contains(&import.folder) {
                    continue; // an item at the crate root (`crate::ALLOCATOR`), not a layer
                }
                if !allows(&rule, folder, &stem, &import) {
                    let shown = file.strip_prefix(src).unwrap_or(&file).display();
                    let target = match &import.file {
                        Some(file) => format!("{}::{file}", import.folder),
                        None => import.folder.clone(),
                    };
                    crossed.push(format!(
                        "src/{shown}:{} names {target}, which src/{folder}/mod.rs does not allow",
                        import.line
                    ));
                }
            }
        }
    }
    crossed
}

#[test]
fn every_file_imports_only_what_its_folders_mod_rs_allows() {
    let crossed = crossings(&src_dir());
    assert!(
        crossed.is_empty(),
        "imports across a layer rule:\n{}",
        crossed.join("\n")
    );
}

#[test]
fn every_folder_of_src_states_a_rule_the_test_can_read() {
    let src = src_dir();
    let folders = folders(&src);
    assert!(folders.len() >= 4, "src/ has its folders: {folders:?}");
    for folder in &folders {
        let rule = read_rule(&src, folder, &folders);
        assert!(
            !rule.all.contains(&Allowed::Folder(folder.clone())),
            "src/{folder}/mod.rs need not allow its own folder"
        );
    }
}

/// The reader itself: a rule in each of its forms, and paths in each form
/// the scanner must see (and the ones it must not: comments, strings).
#[test]
fn the_rule_reader_and_the_path_scanner_see_what_they_should() {
    let folders: Vec<String> = ["bucket", "lease", "server", "testing"]
        .map(str::to_owned)
        .to_vec();
    let (text, rest) = rule_text(
        " the core crate, redis-module, server/ and testing/fault.rs (fault injection; one file); never lease/.",
    );
    assert_eq!(
        items(text, &folders, "test"),
        BTreeSet::from([
            Allowed::Folder("server".into()),
            Allowed::File("testing".into(), "fault".into()),
        ])
    );
    assert_eq!(rest, " never lease/.");

    let code = code_only(
        "use crate::server::{api, keys};\n\
         // crate::lease::x in a comment\n\
         let s = \"crate::lease::y\"; let c = '\"'; let r = r#\"crate::lease\"#;\n\
         fn f<'a>(x: &'a u8) { crate::bucket::hash::write(x) }\n\
         use crate::{testing::fault, lease::set::LeaseSet};\n",
    );
    assert!(!code.contains("lease::x") && !code.contains("lease::y") && !code.contains("r#"));
    assert!(code.contains("crate::bucket::hash::write"));
    let mut scanned = Vec::new();
    let mut at = 0;
    while let Some(offset) = code[at..].find("crate::") {
        let start = at + offset + "crate::".len();
        scanned.extend(paths_after(&code[start..]));
        at = start;
    }
    assert_eq!(
        scanned,
        vec![
            ("server".to_owned(), Some("api".to_owned())),
            ("server".to_owned(), Some("keys".to_owned())),
            ("bucket".to_owned(), Some("hash".to_owned())),
            ("testing".to_owned(), Some("fault".to_owned())),
            ("lease".to_owned(), Some("set".to_owned())),
        ]
    );
}
