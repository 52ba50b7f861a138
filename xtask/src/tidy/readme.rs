//! The README reads as a page: a few words a heading and under a page in all, the rest in
//! the manual it links (tokio's and rust-analyzer's front pages keep the same measure).

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

#[cfg(test)]
mod tests {
    use super::*;

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
