//! The facade forwards every backend call: `AnyComm` implements each method of the
//! contract's `Collective` trait itself. A method it leaves to the trait's default answers
//! `Unsupported` through `unicomm::Comm` on every vendor, while the backend's own `Comm`
//! has it (found on an H100: NCCL 2.32.3's properties and sleep mode).

/// The methods declared directly in the braced block that follows `header` in `src` (a
/// trait's `pub trait Name`, an implementation's `impl Name for Type`): its body's `fn`
/// items, not those of nested items.
pub(crate) fn block_methods(src: &str, header: &str) -> Vec<String> {
    let Some(at) = src.find(header) else {
        return Vec::new();
    };
    let Some(open) = src[at..].find('{').map(|i| at + i) else {
        return Vec::new();
    };
    let mut depth = 0usize;
    let mut end = src.len();
    for (i, ch) in src[open..].char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    end = open + i;
                    break;
                }
            }
            _ => {}
        }
    }
    fns_at_depth_one(&src[open..end])
}

/// The `fn` names declared directly in a braced body (`{ ... }`), not in nested items.
fn fns_at_depth_one(body: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    for line in body.lines() {
        let t = line.trim_start();
        if depth == 1 && !t.starts_with("//") {
            let rest = t.strip_prefix("unsafe ").unwrap_or(t);
            if let Some(r) = rest.strip_prefix("fn ") {
                let name: String = r
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                out.push(name);
            }
        }
        for ch in line.chars() {
            match ch {
                '{' => depth += 1,
                '}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
    }
    out
}

/// The trait's methods that the implementation leaves to their defaults.
pub(crate) fn unforwarded(methods: &[String], implemented: &[String]) -> Vec<String> {
    methods
        .iter()
        .filter(|m| !implemented.contains(m))
        .map(|m| format!("Collective::{m} is not forwarded by the facade's AnyComm (it would answer the default)"))
        .collect()
}
