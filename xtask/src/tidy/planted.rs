//! Each rule refuses a planted violation (and passes the same code without it), so that a
//! rule that silently checks nothing cannot pass.

use std::collections::BTreeMap;

use super::rules;
use super::workspace::Crate;

const LAYERS: rules::Layers = &[("low", &["low"]), ("high", &["high"])];

#[test]
fn a_package_depending_on_a_higher_layer_is_refused() {
    let mut deps = BTreeMap::new();
    deps.insert("low".to_string(), vec!["high".to_string()]);
    deps.insert("high".to_string(), vec!["low".to_string()]);
    let v = rules::crate_layers(LAYERS, &deps);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("low (low) depends on high"), "{v:?}");
}

#[test]
fn a_module_naming_a_higher_layer_by_any_path_form_is_refused() {
    for how in [
        "use crate::high::Thing;",
        "use crate::{high::Thing};",
        "use super::high::*;",
        "fn f() { let _ = crate::high::make(); }",
        "fn f() -> super::high::Thing { todo!() }",
    ] {
        let c = Crate::from_texts(
            "t",
            &[
                ("lib.rs", "mod low; mod high;"),
                ("low.rs", how),
                ("high.rs", ""),
            ],
        );
        let v = rules::module_layers(LAYERS, &c);
        assert_eq!(v.len(), 1, "{how}: {v:?}");
    }
    let fine = Crate::from_texts(
        "t",
        &[
            ("lib.rs", "mod low; mod high;"),
            (
                "low.rs",
                "// use crate::high::Thing; (a comment)\nconst S: &str = \"crate::high::x\";",
            ),
            ("high.rs", "use crate::low::Thing;"),
        ],
    );
    assert_eq!(rules::module_layers(LAYERS, &fine), Vec::<String>::new());
}

#[test]
fn a_circle_of_three_files_through_every_path_form_is_refused() {
    let c = Crate::from_texts(
        "t",
        &[
            ("lib.rs", "mod a; mod b; mod c;"),
            ("a/mod.rs", "mod x;\nuse crate::b::B;"),
            ("b.rs", "pub fn f() { super::c::g() }"),
            ("c.rs", "use crate::{a::*};"),
        ],
    );
    let v = rules::import_circles(&c);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("a/mod.rs") && v[0].contains("b.rs") && v[0].contains("c.rs"));
    // The same without the closing edge: no circle. Test modules do not count either.
    let open = Crate::from_texts(
        "t",
        &[
            ("lib.rs", "mod a; mod b; mod c;"),
            ("a/mod.rs", "use crate::b::B;"),
            ("b.rs", "pub fn f() { super::c::g() }"),
            (
                "c.rs",
                "#[cfg(test)]\nmod tests {\n    use crate::a::*;\n}\n",
            ),
        ],
    );
    assert_eq!(rules::import_circles(&open), Vec::<String>::new());
}

fn long_fn(name: &str, body_lines: usize) -> String {
    let body = "    let _x = 1;\n".repeat(body_lines);
    format!("fn {name}() {{\n{body}}}\n")
}

#[test]
fn a_function_over_the_limit_is_refused_and_the_allow_list_only_shrinks() {
    let text = long_fn("long", 99);
    let c = Crate::from_texts("t", &[("lib.rs", &text)]);
    let v = rules::long_functions(100, &[&c], &[]);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("fn long has 101 lines"), "{v:?}");
    // Allowed at its length: accepted; at a shorter recorded length: grown, refused.
    assert!(rules::long_functions(100, &[&c], &[("src/lib.rs", "long", 101)]).is_empty());
    assert_eq!(
        rules::long_functions(100, &[&c], &[("src/lib.rs", "long", 120)]).len(),
        0
    );
    assert_eq!(
        rules::long_functions(100, &[&c], &[("src/lib.rs", "long", 110)]).len(),
        0
    );
    assert_eq!(
        rules::long_functions(100, &[&c], &[("src/lib.rs", "long", 100)]).len(),
        1
    );
    // An entry for a function that is short now is stale.
    let short = Crate::from_texts("t", &[("lib.rs", &long_fn("long", 10))]);
    let v = rules::long_functions(100, &[&short], &[("src/lib.rs", "long", 101)]);
    assert!(v.len() == 1 && v[0].contains("remove its entry"), "{v:?}");
}

#[test]
fn a_library_call_outside_its_layer_is_refused_but_a_presence_check_is_not() {
    let c = Crate::from_texts(
        "t",
        &[
            ("lib.rs", "mod sys; mod high;"),
            (
                "sys/mod.rs",
                "fn f(a: &Api) { unsafe { (a.fns.all_reduce)() } }",
            ),
            (
                "high.rs",
                "fn g(a: &Api) -> bool { let f = a.fns.comm_split; a.fns.send.is_some() }",
            ),
        ],
    );
    let v = rules::library_calls_outside(&c, &["sys"]);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].contains("high.rs:1") && v[0].contains("fns.comm_split"),
        "{v:?}"
    );
    assert!(rules::library_calls_outside(&c, &["sys", "high"]).is_empty());
}

#[test]
fn unsafe_outside_the_allowed_files_is_refused_but_not_in_comments_or_strings() {
    let c = Crate::from_texts(
        "t",
        &[
            ("lib.rs", "fn f() { unsafe { g() } }"),
            (
                "ok.rs",
                "// unsafe in a comment\nconst S: &str = \"unsafe\";\nfn unsafe_name() {}",
            ),
        ],
    );
    let v = rules::unsafe_outside(&[&c], &[]);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].starts_with("src/lib.rs"), "{v:?}");
    assert!(rules::unsafe_outside(&[&c], &["src/lib.rs"]).is_empty());
}

#[test]
fn a_type_vouched_for_by_hand_is_refused_outside_the_allowed_files() {
    let c = Crate::from_texts(
        "t",
        &[
            (
                "lib.rs",
                "struct C(*mut u8);\nunsafe\nimpl Send for C {}\nunsafe impl<R> Sync for D<R> {}",
            ),
            (
                "ok.rs",
                "// unsafe impl Send in a comment\nconst S: &str = \"unsafe impl\";\nunsafe fn f() {}",
            ),
        ],
    );
    let v = rules::unsafe_impl_outside(&[&c], &[]);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].starts_with("src/lib.rs"), "{v:?}");
    assert!(rules::unsafe_impl_outside(&[&c], &["src/lib.rs"]).is_empty());
    // An allowed file that no longer vouches for a type (or is gone) loses its place.
    let has = crate::tidy::source::has_unsafe_impl;
    assert!(rules::stale_allowed(&[&c], &["src/lib.rs"], has, "x").is_empty());
    let v = rules::stale_allowed(&[&c], &["src/lib.rs", "src/ok.rs", "src/gone.rs"], has, "x");
    assert_eq!(v.len(), 2, "{v:?}");
}

#[test]
fn the_progress_code_named_above_the_call_layer_is_refused() {
    let c = Crate::from_texts(
        "t",
        &[
            ("sys/mod.rs", "pub const IN_PROGRESS: i32 = 7;"),
            (
                "wait.rs",
                "// IN_PROGRESS in a comment\nfn f(s: i32) -> bool { s == crate::sys::IN_PROGRESS && take_in_progress() }",
            ),
        ],
    );
    let v = rules::names_outside(&c, "IN_PROGRESS", &["sys"]);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].starts_with("src/wait.rs:2"), "{v:?}");
}

#[test]
fn a_document_whose_layers_differ_from_the_table_is_refused() {
    const TABLE: rules::Layers = &[("low", &["a"]), ("mid", &["b", "c"]), ("top", &["d"])];
    let known = ["a", "b", "c", "d"];
    let doc = |chain: &str, list: &str| {
        format!(
            "# A\n\nPackages, lowest first: {chain}.\n\nModules, lowest first:\n\n{list}\n\n## B\n"
        )
    };
    let check = |d: &str| {
        let mut v = rules::layers_differ(
            "packages",
            &rules::doc_layers(d, "Packages, lowest first", true, &known),
            TABLE,
        );
        v.extend(rules::layers_differ(
            "modules",
            &rules::doc_layers(d, "Modules, lowest first", false, &known),
            TABLE,
        ));
        v
    };
    let list = "1. `a`: the low one (`ncclX`);\n2. the middle: `b`,\n   `c`;\n3. `d`.";
    assert!(check(&doc("the low (`a`) → `b`, `c` → `d`", list)).is_empty());
    // A package moved a layer down, a module left out of the list: each refused.
    let v = check(&doc("`a`, `b` → `c` → `d`", list));
    assert_eq!(v.len(), 1, "{v:?}");
    let v = check(&doc("`a` → `b`, `c` → `d`", "1. `a`;\n2. `b`;\n3. `d`."));
    assert_eq!(v.len(), 1, "{v:?}");
}

#[test]
fn a_commit_citation_is_refused_in_docs_and_comments() {
    let v = rules::commit_citations("README.md", "see a2b12b3:docs/results.md for it");
    assert_eq!(v.len(), 1, "{v:?}");
    for fine in [
        "at 12:30 we ran",
        "cafe:beef",
        "deadbeefcafe: a word",
        "https://x.org/a",
        "nccl 2.28.9: fine",
    ] {
        assert!(rules::commit_citations("x", fine).is_empty(), "{fine}");
    }
    let c = Crate::from_texts(
        "t",
        &[("lib.rs", "//! measured (0123abc:docs/x.md)\nfn f() {}")],
    );
    let texts = rules::comment_texts(&[&c]);
    assert_eq!(rules::commit_citations(&texts[0].0, &texts[0].1).len(), 1);
}

#[test]
fn a_forbidden_dependency_is_refused() {
    let deps = vec!["libloading".to_string(), "unicomm-bootstrap".to_string()];
    let v = rules::forbidden_deps("p", &deps, &["unicomm-bootstrap", "hmac"]);
    assert_eq!(v, vec!["p depends on unicomm-bootstrap".to_string()]);
    assert!(rules::forbidden_deps("p", &deps[..1], &["unicomm-bootstrap"]).is_empty());
}

#[test]
fn a_vendor_identifier_in_code_is_refused_and_one_in_a_comment_or_string_is_not() {
    for (code, found) in [
        ("pub const fn from_nccl_code(c: i32) -> i32 { c }", 1),
        ("fn f() -> i32 { ncclSum }", 1),
        ("/// `ncclSum` in a doc comment\nfn f() {}", 0),
        ("fn f() -> &'static str { \"ncclSum\" }", 0),
    ] {
        let c = Crate::from_texts("t", &[("lib.rs", code)]);
        let v = rules::vendor_identifiers(&c, "nccl");
        assert_eq!(v.len(), found, "{code}: {v:?}");
    }
}

#[test]
fn a_file_embedded_but_left_out_of_the_package_is_refused() {
    use super::package;
    let manifest = r#"include = ["src/**/*.rs", "Cargo.toml"]"#;
    let source = r#"const PTX: &str = include_str!("../kernels/k.ptx");"#;
    let files = package::embedded(std::path::Path::new("src/kernels.rs"), source);
    assert_eq!(files, vec!["kernels/k.ptx".to_string()]);
    let globs = package::include_globs(manifest);
    let v = package::unshipped("p", &globs, &files);
    assert_eq!(v.len(), 1, "{v:?}");
    let globs: Vec<String> = vec!["src/**/*.rs".into(), "kernels/*.ptx".into()];
    assert!(package::unshipped("p", &globs, &files).is_empty());
    assert!(package::matches("src/**/*.rs", "src/a/b/c.rs"));
    assert!(package::matches("src/**/*.md", "src/guide.md"));
    assert!(!package::matches("src/**/*.rs", "kernels/k.rs"));
}

#[test]
fn a_trait_method_the_facade_leaves_to_its_default_is_refused() {
    use super::forward;
    let contract = "pub trait Collective: Send {\n    fn rank(&self) -> usize;\n    fn properties(&self) -> Result<P> {\n        Err(unsupported())\n    }\n}\n";
    let methods = forward::block_methods(contract, "pub trait Collective");
    assert_eq!(methods, vec!["rank".to_string(), "properties".to_string()]);
    // A method of that name elsewhere (another trait's impl) does not count.
    let facade = "impl Collective for AnyComm {\n    fn rank(&self) -> usize { 0 }\n}\nimpl Other for AnyComm {\n    fn properties(&self) -> P { todo!() }\n}\n";
    let implemented = forward::block_methods(facade, "impl Collective for AnyComm");
    let v = forward::unforwarded(&methods, &implemented);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("properties"), "{v:?}");
    let whole = "impl Collective for AnyComm {\n    fn rank(&self) -> usize { 0 }\n    fn properties(&self) -> Result<P> { todo!() }\n}\n";
    let implemented = forward::block_methods(whole, "impl Collective for AnyComm");
    assert!(forward::unforwarded(&methods, &implemented).is_empty());
}

#[test]
fn a_second_door_for_work_on_a_stream_and_a_record_outside_the_doors_are_refused() {
    use super::door;
    use super::source::Source;
    let contract = "pub trait Collective: Send {\n    type Stream;\n    /// fn in a comment: Self::Stream\n    fn enqueue(&self, work: Work, stream: &Self::Stream) -> Result<()>;\n    fn graph_launched(&self, stream: &Self::Stream) {}\n    fn create_stream(&self) -> Result<Self::Stream>;\n    fn symmetric(\n        &self,\n        op: SymmetricOp,\n        stream: &Self::Stream,\n    ) -> Result<()> {\n        Err(unsupported())\n    }\n}\n";
    let code = Source::parse(contract).code;
    let v = door::second_doors(&code, "pub trait Collective");
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("Collective::symmetric"), "{v:?}");
    let one = contract
        .replace("fn symmetric(", "fn symmetric_unused(")
        .replace(
            "stream: &Self::Stream,\n    ) -> Result<()> {",
            ") -> Result<()> {",
        );
    assert!(door::second_doors(&Source::parse(&one).code, "pub trait Collective").is_empty());
    let c = Crate::from_texts(
        "unicomm-nccl-api",
        &[(
            "symmetric/mod.rs",
            "fn f(r: &R) { r.flight.enqueued(what, 0, run, mark); }\n",
        )],
    );
    let v = door::records_outside_doors(&[&c], door::DOOR_FILES);
    assert_eq!(v.len(), 1, "{v:?}");
    let door_file = Crate::from_texts(
        "unicomm-nccl-api",
        &[(
            "comm/collective.rs",
            "fn f(r: &R) { r.flight.enqueued(what, 0, run, mark); }\n",
        )],
    );
    let paths: Vec<&str> = vec!["src/comm/collective.rs"];
    assert!(door::records_outside_doors(&[&door_file], &paths).is_empty());
}

#[test]
fn a_public_function_taking_its_settings_as_a_tuple_and_a_rising_count_are_refused() {
    let text = "pub fn open((op, algorithm): (u8, u8), (a, b): (u8, u8)) {}\n\
                pub(crate) fn inner(x: u8, (lo, hi): (usize, usize)) {}\n\
                fn arrow(f: impl Fn(u8) -> u8, (p, q): (u8, u8)) {}\n\
                pub fn named(how: Options) {}\n";
    let c = Crate::from_texts("t", &[("lib.rs", text)]);
    let v = rules::tuple_parameters(&[&c], 4);
    assert_eq!(v.len(), 2, "{v:?}");
    assert!(v.iter().all(|l| l.contains("pub fn open")), "{v:?}");
    // Four in all (two public, one in a crate-visible function, one after an arrow): a
    // ceiling of three refuses the count as well.
    let v = rules::tuple_parameters(&[&c], 3);
    assert!(
        v.last().is_some_and(|l| l.starts_with("4 parameters")),
        "{v:?}"
    );
}
