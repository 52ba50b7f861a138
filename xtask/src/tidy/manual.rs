//! The manual that ships (README.md and docs/*.md, in the crate): the README reads as a page
//! (a few words a heading and under a page in all, the rest in the pages it links: tokio's and
//! rust-analyzer's front pages keep the same measure), no page is a run log (no date, no
//! commit id: those are the records' in docs/dev/records/, and the runs' JSON), and every
//! repository path a page or a comment names exists.

use std::path::Path;

/// The most words the README holds.
pub(crate) const MAX_WORDS: usize = 800;
/// The most words under one heading (the heading's line included).
pub(crate) const MAX_WORDS_PER_HEADING: usize = 150;

/// What in `text` (a README) is over `max` words in all or `per_heading` under a heading.
pub(crate) fn readme_words(text: &str, max: usize, per_heading: usize) -> Vec<String> {
    let mut out = Vec::new();
    let total = text.split_whitespace().count();
    if total > max {
        out.push(format!(
            "the README holds {total} words, over {max}: move the detail to docs/"
        ));
    }
    let mut sections: Vec<(String, usize)> = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        fenced ^= line.trim_start().starts_with("```");
        if !fenced && line.starts_with('#') {
            sections.push((line.trim_start_matches('#').trim().to_string(), 0));
        }
        if let Some(s) = sections.last_mut() {
            s.1 += line.split_whitespace().count();
        }
    }
    for (heading, words) in sections.into_iter().filter(|s| s.1 > per_heading) {
        out.push(format!(
            "the README's \"{heading}\" holds {words} words, over {per_heading}"
        ));
    }
    out
}

/// The pages of `pages` (docs/*.md) that the facade's manifest (`cargo`, its text) does not
/// ship in its `include` list: a page written for users that no user of the crate would get.
pub(crate) fn unshipped(cargo: &str, pages: &[String]) -> Vec<String> {
    let include = cargo
        .lines()
        .find(|l| l.trim_start().starts_with("include"))
        .unwrap_or("");
    pages
        .iter()
        .filter(|p| p.starts_with("docs/") && !include.contains(&format!("\"/{p}\"")))
        .map(|p| {
            format!("{p} is a user's page the crate does not ship: add it to Cargo.toml's include")
        })
        .collect()
}

/// The lines of `text` (page `name`) that name a date (`2026-12-07`) or a commit id (7 to
/// 40 hex digits, letters and digits both, standing alone as a word).
pub(crate) fn dated_lines(name: &str, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let words = line.split(|c: char| !c.is_ascii_alphanumeric() && c != '-');
        for w in words {
            let date = w.len() == 10
                && w.bytes().enumerate().all(|(i, c)| match i {
                    4 | 7 => c == b'-',
                    _ => c.is_ascii_digit(),
                })
                && w.starts_with("20");
            let hex = w.split('-').any(|h| {
                (7..=40).contains(&h.len())
                    && h.bytes()
                        .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
                    && h.bytes().any(|c| c.is_ascii_digit())
                    && h.bytes().any(|c| c.is_ascii_alphabetic())
            });
            if date || hex {
                out.push(format!(
                    "{name}:{}: names {w:?}: a record's, not the manual's",
                    n + 1
                ));
            }
        }
    }
    out
}

/// The repository paths `text` (page or comments `name`) names that do not exist under
/// `root`: a word that starts with one of `tops` (the repository's own top-level folders)
/// and a slash. A path another project's possessive precedes on its line (as in
/// "rust-analyzer's tidy test") is that project's, not ours.
pub(crate) fn missing_paths(name: &str, text: &str, root: &Path, tops: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let b = line.as_bytes();
        for (i, _) in line.char_indices() {
            let starts =
                i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b"./-_".contains(&b[i - 1]));
            if !starts {
                continue;
            }
            let word: String = line[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || "./-_".contains(*c))
                .collect();
            let word = word.trim_end_matches(['.', '-']);
            let Some((first, rest)) = word.split_once('/') else {
                continue;
            };
            if rest.is_empty() || !tops.iter().any(|t| t == first) {
                continue;
            }
            let before = line[..i].trim_end_matches(['`', ' ', '(']);
            if before.ends_with("'s") || before.ends_with("’s") {
                continue;
            }
            if !root.join(word).exists() {
                out.push(format!(
                    "{name}:{}: names {word}, which does not exist",
                    n + 1
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The repository's own top-level folders (its crates, docs/, .ci/ ...), not `src/`,
    /// `tests/` or `examples/`, which a crate's page names relative to itself.
    fn tops(root: &Path) -> Vec<String> {
        let mut t: Vec<String> = std::fs::read_dir(root)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.path().is_dir())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| {
                        !["src", "tests", "examples", "target", ".git"].contains(&n.as_str())
                    })
                    .collect()
            })
            .unwrap_or_default();
        t.sort();
        t
    }

    #[test]
    fn every_repository_path_a_page_or_a_comment_names_exists() {
        let root = super::super::root();
        let tops = tops(&root);
        let mut pages = shipped();
        let dev = root.join("docs/dev");
        for d in [dev.clone(), dev.join("records")] {
            if let Ok(rd) = std::fs::read_dir(&d) {
                for p in rd.filter_map(|e| e.ok().map(|e| e.path())) {
                    if p.extension().is_some_and(|x| x == "md") {
                        let name = p.strip_prefix(&root).unwrap_or(&p).display().to_string();
                        pages.push((name, std::fs::read_to_string(&p).unwrap_or_default()));
                    }
                }
            }
        }
        let cs = super::super::crates();
        let refs: Vec<&super::super::workspace::Crate> = cs.iter().collect();
        pages.extend(super::super::rules::comment_texts(&refs));
        let v: Vec<String> = pages
            .iter()
            .flat_map(|(n, t)| missing_paths(n, t, &root, &tops))
            .collect();
        assert!(v.is_empty(), "{}", v.join("\n"));
    }

    #[test]
    fn a_path_that_is_not_there_is_refused_and_another_projects_is_not_ours() {
        let root = super::super::root();
        let tops = vec!["docs".to_string(), "xtask".to_string()];
        let text = "See docs/usage.md and docs/nowhere.md; rust-analyzer's `xtask/src/tidy.rs`.\n";
        let v = missing_paths("p.md", text, &root, &tops);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("docs/nowhere.md"), "{v:?}");
    }

    /// Every page that ships: README.md and docs/*.md.
    fn shipped() -> Vec<(String, String)> {
        let root = super::super::root();
        let mut pages = vec![root.join("README.md")];
        if let Ok(d) = std::fs::read_dir(root.join("docs")) {
            pages.extend(
                d.filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "md")),
            );
        }
        pages.sort();
        pages
            .into_iter()
            .map(|p| {
                let name = p.strip_prefix(&root).unwrap_or(&p).display().to_string();
                (name, std::fs::read_to_string(&p).unwrap_or_default())
            })
            .collect()
    }

    #[test]
    fn every_users_page_ships_in_the_crate() {
        let root = super::super::root();
        let cargo = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        let pages: Vec<String> = shipped().into_iter().map(|(n, _)| n).collect();
        assert!(pages.iter().any(|p| p == "docs/security.md"), "{pages:?}");
        let v = unshipped(&cargo, &pages);
        assert!(v.is_empty(), "{}", v.join("\n"));
    }

    #[test]
    fn a_page_left_out_of_the_include_list_is_refused() {
        let cargo = "[package]\ninclude = [\"/README.md\", \"/docs/usage.md\"]\n";
        let pages = ["README.md", "docs/usage.md", "docs/security.md"].map(String::from);
        let v = unshipped(cargo, &pages);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].starts_with("docs/security.md"), "{v:?}");
    }

    #[test]
    fn the_shipped_manual_names_no_date_and_no_commit() {
        let v: Vec<String> = shipped()
            .iter()
            .flat_map(|(n, t)| dated_lines(n, t))
            .collect();
        assert!(v.is_empty(), "{}", v.join("\n"));
    }

    #[test]
    fn a_date_and_a_commit_id_in_a_page_are_refused() {
        let text = "Run on 2026-12-06 (the build of 9f99dee).\n\
                    0x7f3a2b1c, deadbeefcafe, 1024-4096 ranks, sha256 and NCCL 2.28.9 pass.\n";
        let v = dated_lines("p.md", text);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(
            v[0].contains("2026-12-06") && v[1].contains("9f99dee"),
            "{v:?}"
        );
    }

    #[test]
    fn the_readme_is_a_page_of_short_sections() {
        let text = std::fs::read_to_string(super::super::root().join("README.md")).unwrap();
        let v = readme_words(&text, MAX_WORDS, MAX_WORDS_PER_HEADING);
        assert!(v.is_empty(), "{}", v.join("\n"));
    }

    #[test]
    fn a_long_section_and_a_long_readme_are_refused() {
        let long = "word ".repeat(12);
        let text = format!("# a\n{long}\n## b\nshort\n```sh\n# not a heading\n```\n");
        let v = readme_words(&text, 100, 10);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("\"a\" holds 14 words"), "{v:?}");
        assert_eq!(readme_words(&text, 10, 100).len(), 1);
        assert!(readme_words(&text, 100, 100).is_empty());
    }
}
