//! Reading Rust source as text, enough for the architecture rules: code without comments,
//! strings and test modules (line numbers kept), every module path a file names (`use`
//! trees with globs and nesting, inline `crate::`/`super::`/`self::` paths, a child
//! module named bare), the functions with their lengths, and the comments.

/// One source file, read.
pub(crate) struct Source {
    /// Code only: comments, string and char literals blanked, `#[cfg(test)]` items removed;
    /// newlines kept, so a byte's line is its line in the file.
    pub code: String,
    /// The comments' text, each with its line (doc comments included).
    pub comments: Vec<(usize, String)>,
}

impl Source {
    pub(crate) fn parse(text: &str) -> Source {
        let (code, comments) = blank_comments_and_strings(text);
        Source {
            code: drop_test_items(&code),
            comments,
        }
    }
}

/// Blanks comments and literals (keeping newlines), and returns the comments apart.
fn blank_comments_and_strings(text: &str) -> (String, Vec<(usize, String)>) {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut comments = Vec::new();
    let (mut i, mut line) = (0, 1);
    let blank = |out: &mut Vec<u8>, c: u8| out.push(if c == b'\n' { b'\n' } else { b' ' });
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            let end = text[i..].find('\n').map_or(b.len(), |e| i + e);
            comments.push((line, text[i..end].to_string()));
            (i..end).for_each(|_| out.push(b' '));
            i = end;
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let (start, start_line) = (i, line);
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    out.extend([b' ', b' ']);
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    out.extend([b' ', b' ']);
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(b[i] == b'\n');
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
            comments.push((start_line, text[start..i.min(b.len())].to_string()));
        } else if c == b'"' || (c == b'r' && raw_string_at(b, i).is_some()) {
            let hashes = if c == b'r' {
                raw_string_at(b, i).unwrap_or(0)
            } else {
                usize::MAX
            };
            let open = if c == b'r' { 2 + hashes } else { 1 };
            (0..open).for_each(|_| out.push(b' '));
            i += open;
            while i < b.len() {
                if hashes == usize::MAX && b[i] == b'\\' {
                    blank(&mut out, b[i]);
                    if let Some(&n) = b.get(i + 1) {
                        line += usize::from(n == b'\n');
                        blank(&mut out, n);
                    }
                    i += 2;
                    continue;
                }
                if b[i] == b'"' && closes_raw(b, i, hashes) {
                    let close = 1 + if hashes == usize::MAX { 0 } else { hashes };
                    (0..close).for_each(|_| out.push(b' '));
                    i += close;
                    break;
                }
                line += usize::from(b[i] == b'\n');
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if let Some(n) = (c == b'\'').then(|| char_literal_len(text, i)).flatten() {
            (0..n).for_each(|_| out.push(b' '));
            i += n;
        } else {
            line += usize::from(c == b'\n');
            out.push(c);
            i += 1;
        }
    }
    (String::from_utf8_lossy(&out).into_owned(), comments)
}

/// `r"`, `r#"`, `br"`: the number of `#` of a raw string starting at `i`.
fn raw_string_at(b: &[u8], i: usize) -> Option<usize> {
    if i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_') && b[i - 1] != b'b' {
        return None;
    }
    let mut j = i + 1;
    while b.get(j) == Some(&b'#') {
        j += 1;
    }
    (b.get(j) == Some(&b'"')).then_some(j - i - 1)
}

fn closes_raw(b: &[u8], i: usize, hashes: usize) -> bool {
    hashes == usize::MAX || (1..=hashes).all(|k| b.get(i + k) == Some(&b'#'))
}

/// The length of a char literal at `i` (`'a'`, `'\n'`, `'\u{1F600}'`), `None` for a lifetime.
fn char_literal_len(text: &str, i: usize) -> Option<usize> {
    let b = text.as_bytes();
    if b.get(i + 1) == Some(&b'\\') {
        let end = b[i + 2..].iter().position(|&c| c == b'\'')?;
        return Some(end + 3);
    }
    let w = text.get(i + 1..)?.chars().next()?.len_utf8();
    (b.get(i + 1 + w) == Some(&b'\'')).then_some(w + 2)
}

/// Removes `#[cfg(test)]` items (a `mod x { .. }` block or a `mod x;` line), keeping lines.
fn drop_test_items(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        let end = item_end(after).unwrap_or(after.len());
        out.extend(
            after[..end]
                .chars()
                .map(|c| if c == '\n' { '\n' } else { ' ' }),
        );
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The end of the item an attribute at the start of `s` applies to: its first `;` at brace
/// depth 0, or its closing brace.
fn item_end(s: &str) -> Option<usize> {
    let mut depth = 0i32;
    for (i, c) in s.char_indices().skip("#[cfg(test)]".len()) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            ';' if depth == 0 => return Some(i + 1),
            _ => {}
        }
    }
    None
}

/// Every path a file names that may be a module of its crate: each leaf of every `use`
/// tree (a glob names its module) and every inline path starting at `crate`, `super` or
/// `self`.
pub(crate) fn paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = find_word(rest, "use", spaced) {
        let tail = &rest[at + 3..];
        let Some(end) = tail.find(';') else { break };
        expand_use(&tail[..end], &mut Vec::new(), &mut out);
        rest = &tail[end..];
    }
    let b = code.as_bytes();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(start).map(|a| a + from) {
            from = at + start.len();
            if at > 0
                && (b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_' || b[at - 1] == b':')
            {
                continue;
            }
            let len = code[at..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(code.len() - at);
            let p: Vec<String> = code[at..at + len]
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            out.push(p);
        }
    }
    out
}

/// The first place `w` stands as a word in `s` (no identifier character before it) and
/// is followed by a byte `follows` accepts (or the end).
fn find_word(s: &str, w: &str, follows: fn(u8) -> bool) -> Option<usize> {
    let b = s.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut from = 0;
    while let Some(at) = s[from..].find(w).map(|a| a + from) {
        let before = at == 0 || !ident(b[at - 1]);
        if before && b.get(at + w.len()).is_none_or(|&c| follows(c)) {
            return Some(at);
        }
        from = at + w.len();
    }
    None
}

/// `use` and `fn` as keywords: followed by whitespace.
fn spaced(c: u8) -> bool {
    c.is_ascii_whitespace()
}

/// `a::{b, c::{d, *}}` -> `[a,b]`, `[a,c,d]`, `[a,c]` (the glob names `a::c`).
fn expand_use(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    // `x as y` keeps `x`: the alias is marked before whitespace goes.
    let tree = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let tree: String = tree
        .replace(" as ", "@")
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let tree = tree.strip_prefix("::").unwrap_or(&tree);
    let (head, group) = match tree.find('{') {
        Some(open) if tree.ends_with('}') => (&tree[..open], Some(&tree[open + 1..tree.len() - 1])),
        _ => (tree, None),
    };
    let n = prefix.len();
    for seg in head.split("::").filter(|s| !s.is_empty() && *s != "*") {
        let seg = seg.split('@').next().unwrap_or(seg);
        prefix.push(seg.to_string());
    }
    match group {
        None => out.push(prefix.clone()),
        Some(g) => {
            let (mut depth, mut start) = (0, 0);
            for (i, c) in g.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand_use(&g[start..i], prefix, out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            if start < g.len() {
                expand_use(&g[start..], prefix, out);
            }
        }
    }
    prefix.truncate(n);
}

/// A function with a body: its name, first line and length in lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Function {
    pub name: String,
    pub line: usize,
    pub lines: usize,
}

/// Every `fn` with a body in `code` (nested ones too, each counted whole).
pub(crate) fn functions(code: &str) -> Vec<Function> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = find_word(&code[from..], "fn", spaced).map(|a| a + from) {
        from = at + 2;
        let name: String = code[from..]
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        let (mut paren, mut i) = (0i32, from);
        let open = loop {
            match b.get(i) {
                None => break None,
                Some(b'(') | Some(b'[') => paren += 1,
                Some(b')') | Some(b']') => paren -= 1,
                Some(b';') if paren == 0 => break None,
                Some(b'{') if paren == 0 => break Some(i),
                _ => {}
            }
            i += 1;
        };
        let Some(open) = open else { continue };
        let mut depth = 0;
        let close = (open..b.len()).find(|&j| {
            depth += i32::from(b[j] == b'{') - i32::from(b[j] == b'}');
            depth == 0
        });
        let Some(close) = close else { continue };
        let line = code[..at].matches('\n').count() + 1;
        let last = code[..close].matches('\n').count() + 1;
        out.push(Function {
            name,
            line,
            lines: last - line + 1,
        });
    }
    out
}

/// A function's parameter bound by a tuple pattern (`(op, algorithm): (ReduceOp, ..)`): a
/// group of settings without a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TupleParam {
    pub function: String,
    pub line: usize,
    /// Whether the function is `pub` (not `pub(crate)` or narrower).
    pub public: bool,
}

/// Every parameter of a `fn` in `code` (comments and strings blanked) bound by a tuple
/// pattern, bodies or not (trait methods too).
pub(crate) fn tuple_params(code: &str) -> Vec<TupleParam> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = find_word(&code[from..], "fn", spaced).map(|a| a + from) {
        from = at + 2;
        let rest = &code[from..];
        let name: String = rest
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let Some(open) = rest.find('(') else { break };
        // Generics before the parameters (`fn f<T: Fn(u8)>(..)` is rare here): skip `<..>`.
        if name.is_empty() || rest[..open].contains(['{', ';']) {
            continue;
        }
        let params = balanced(&rest[open..]);
        let line_start = code[..at].rfind('\n').map_or(0, |i| i + 1);
        let head = code[line_start..at].trim();
        let public = head.split_whitespace().any(|w| w == "pub");
        for p in split_top(params) {
            let p = p.trim().trim_start_matches("mut ").trim_start();
            if p.starts_with('(') {
                out.push(TupleParam {
                    function: name.clone(),
                    line: code[..at].matches('\n').count() + 1,
                    public,
                });
            }
        }
    }
    out
}

/// The text inside the bracket `s` opens with, up to its match.
fn balanced(s: &str) -> &str {
    let mut depth = 0i32;
    for (i, c) in s.char_indices() {
        depth += i32::from(matches!(c, '(' | '[' | '{')) - i32::from(matches!(c, ')' | ']' | '}'));
        if depth == 0 {
            return &s[1..i];
        }
    }
    ""
}

/// `s` split at its top-level commas (none inside brackets or angle brackets).
fn split_top(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' | '{' | '<' => depth += 1,
            // An arrow (`impl Fn(u8) -> u8`) closes nothing.
            '>' if s[..i].ends_with('-') => {}
            ')' | ']' | '}' | '>' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// Whether `code` holds the keyword `unsafe` (a block, fn, impl or trait).
/// Whether `code` (comments and strings blanked) vouches for a type by hand (`unsafe impl`,
/// `Send` and `Sync` above all).
pub(crate) fn has_unsafe_impl(code: &str) -> bool {
    let joined = code.split_whitespace().collect::<Vec<_>>().join(" ");
    find_word(&joined, "unsafe impl", |c| c == b' ' || c == b'<').is_some()
}

pub(crate) fn has_unsafe(code: &str) -> bool {
    find_word(code, "unsafe", |c| {
        !(c.is_ascii_alphanumeric() || c == b'_')
    })
    .is_some()
}
