//! A plugin's passes in the link: they see the graph (sections, edges, addresses) at each
//! point, may patch the code before it is finalized, and fail the link when they fail —
//! leaving the library as it was.

// kiln::Error wraps link errors, which are large by design (see kiln-link).
#![allow(clippy::result_large_err)]

use kiln::Input;
use kiln::{
    plugin::{GraphView, LinkPass, PassPoint, Plugin},
    Error, Jit,
};
use parking_lot::Mutex;
use std::sync::Arc;

fn compile(name: &str, source: &str) -> Vec<u8> {
    kiln_testkit::cc_object(name, source, &["-O2", "-fPIC", "-ffunction-sections"])
}

const SOURCE: &str = "extern int helper(int);\n\
    int answer(void) { return 41; }\n\
    int twice(int x) { return helper(x) * 2; }\n";
const HELPER: &str = "int helper(int x) { return x + 1; }\n";

/// What the passes saw.
#[derive(Default)]
struct Seen {
    points: Vec<PassPoint>,
    edges_of_twice: Vec<(String, String)>,
    answer_at_allocation: Option<u64>,
    patched: bool,
}

/// Records the graph at each point and makes `answer` return 42 instead of 41.
struct Patcher(Arc<Mutex<Seen>>);

impl LinkPass for Patcher {
    fn name(&self) -> &str {
        "patch-answer"
    }
    fn run(&self, graph: &mut GraphView<'_, '_, '_>) -> Result<(), kiln::plugin::PassError> {
        let mut seen = self.0.lock();
        seen.points.push(graph.point());
        let sections = graph.sections();
        match graph.point() {
            PassPoint::Decoded => {
                assert!(sections.iter().all(|s| s.address.is_none()));
                let twice = sections
                    .iter()
                    .find(|s| s.name == ".text.twice")
                    .ok_or("no .text.twice")?;
                seen.edges_of_twice = graph
                    .edges(twice.id)
                    .into_iter()
                    .map(|e| (e.kind.to_string(), e.target))
                    .collect();
            }
            PassPoint::Allocated => {
                assert!(sections
                    .iter()
                    .all(|s| s.address.is_some() || s.thread_local));
                seen.answer_at_allocation = graph.symbol_address("answer");
            }
            PassPoint::FixedUp => {
                let answer = sections
                    .iter()
                    .find(|s| s.name == ".text.answer")
                    .ok_or("no .text.answer")?;
                let bytes = graph
                    .section_bytes_mut(answer.id)
                    .ok_or("no bytes at FixedUp")?;
                // mov $41, %eax
                let at = bytes
                    .windows(5)
                    .position(|w| w == [0xb8, 41, 0, 0, 0])
                    .ok_or("answer's code is not mov $41, %eax")?;
                bytes[at + 1] = 42;
                seen.patched = true;
            }
        }
        Ok(())
    }
}

struct PatchingPlugin(Arc<Mutex<Seen>>);

impl Plugin for PatchingPlugin {
    fn name(&self) -> &str {
        "patching"
    }
    fn link_passes(&self) -> Vec<(PassPoint, Arc<dyn LinkPass>)> {
        let pass: Arc<dyn LinkPass> = Arc::new(Patcher(self.0.clone()));
        vec![
            (PassPoint::Decoded, pass.clone()),
            (PassPoint::Allocated, pass.clone()),
            (PassPoint::FixedUp, pass),
        ]
    }
}

#[test]
#[cfg(target_arch = "x86_64")]
fn a_plugin_pass_sees_the_graph_and_patches_code_before_it_runs() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let registration = jit.add_plugin(Arc::new(PatchingPlugin(seen.clone())));
    jit.library(lib)
        .add(Input::object("helper.o", compile("helper", HELPER)))
        .unwrap();
    jit.library(lib)
        .add(Input::object("answer.o", compile("answer", SOURCE)))
        .unwrap();
    // SAFETY: `int answer(void)` of the object above.
    let answer: extern "C" fn() -> i32 = unsafe { jit.lookup_fn(lib, "answer") }.unwrap();
    // SAFETY: `int twice(int)` of the object above.
    let twice: extern "C" fn(i32) -> i32 = unsafe { jit.lookup_fn(lib, "twice") }.unwrap();
    assert_eq!(answer(), 42, "the FixedUp pass's patch runs");
    assert_eq!(twice(4), 10);
    let seen = seen.lock();
    assert_eq!(
        seen.points,
        [PassPoint::Decoded, PassPoint::Allocated, PassPoint::FixedUp]
    );
    assert!(
        seen.edges_of_twice
            .iter()
            .any(|(kind, target)| kind.starts_with("R_X86_64_") && target == "helper"),
        "{:?}",
        seen.edges_of_twice
    );
    assert_eq!(
        seen.answer_at_allocation,
        Some(jit.lookup(lib, "answer").unwrap())
    );
    assert!(seen.patched);
    drop(registration);
}

/// Refuses every link.
struct Refuser;

/// The refuser's own error type: it reaches the caller as the link error's source.
#[derive(Debug, thiserror::Error)]
#[error("{0} objects are too many")]
struct TooMany(usize);

impl LinkPass for Refuser {
    fn name(&self) -> &str {
        "refuser"
    }
    fn run(&self, graph: &mut GraphView<'_, '_, '_>) -> Result<(), kiln::plugin::PassError> {
        Err(Box::new(TooMany(graph.object_names().len())))
    }
}

struct RefusingPlugin;

impl Plugin for RefusingPlugin {
    fn name(&self) -> &str {
        "refusing"
    }
    fn link_passes(&self) -> Vec<(PassPoint, Arc<dyn LinkPass>)> {
        vec![(PassPoint::Allocated, Arc::new(Refuser))]
    }
}

#[test]
fn a_failing_pass_fails_the_link_and_leaves_the_library_as_it_was() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    let registration = jit.add_plugin(Arc::new(RefusingPlugin));
    let err = jit
        .link_object(lib, "helper.o", compile("helper", HELPER))
        .unwrap_err();
    match &err {
        Error::Link(kiln::link::LinkError::Pass { pass, source }) => {
            assert_eq!(pass, "refuser");
            // The pass's own error, typed, with its words in the message.
            assert_eq!(source.downcast_ref::<TooMany>().map(|e| e.0), Some(1));
            assert!(err.to_string().contains("1 objects are too many"), "{err}");
        }
        other => panic!("{other}"),
    }
    assert!(jit.lookup(lib, "helper").is_err());
    drop(registration);
    // Without the plugin the same object links.
    jit.link_object(lib, "helper.o", compile("helper", HELPER))
        .unwrap();
    // SAFETY: `int helper(int)`.
    let helper: extern "C" fn(i32) -> i32 = unsafe { jit.lookup_fn(lib, "helper") }.unwrap();
    assert_eq!(helper(1), 2);
}

/// What the table-making pass saw.
#[derive(Default)]
struct TableSeen {
    refused_unknown_symbol: Option<String>,
    refused_unknown_kind: Option<String>,
    made_sections_at_allocation: Vec<String>,
    refused_late_section: Option<String>,
    table: Option<[u64; 2]>,
    addresses: Option<[u64; 2]>,
}

/// At Decoded, adds a section of two pointers with an edge to `answer` and one to
/// `helper`; at Allocated, looks at the link's own sections; at FixedUp, reads its table.
struct TableMaker(
    Arc<Mutex<TableSeen>>,
    Mutex<Option<kiln::plugin::SectionId>>,
);

const ABS64: &str = if cfg!(target_arch = "aarch64") {
    "R_AARCH64_ABS64"
} else {
    "R_X86_64_64"
};

impl LinkPass for TableMaker {
    fn name(&self) -> &str {
        "table-maker"
    }
    fn run(&self, graph: &mut GraphView<'_, '_, '_>) -> Result<(), kiln::plugin::PassError> {
        let mut seen = self.0.lock();
        match graph.point() {
            PassPoint::Decoded => {
                let table = graph.add_section(
                    ".kiln.test.table",
                    kiln::plugin::NewSectionKind::Constants,
                    vec![0; 16],
                    8,
                )?;
                graph.add_edge(table, 0, ABS64, "answer", 0)?;
                graph.add_edge(table, 8, ABS64, "helper", 0)?;
                seen.refused_unknown_symbol = graph
                    .add_edge(table, 0, ABS64, "nobody_defines_this", 0)
                    .err()
                    .map(|e| e.to_string());
                seen.refused_unknown_kind = graph
                    .add_edge(table, 0, "R_NOT_A_RELOCATION", "answer", 0)
                    .err()
                    .map(|e| e.to_string());
                assert!(
                    graph.add_edge(table, 12, ABS64, "answer", 0).is_err(),
                    "an edge past the section's end"
                );
                assert!(graph
                    .sections()
                    .iter()
                    .any(|s| s.id == table && s.edges == 2));
                *self.1.lock() = Some(table);
            }
            PassPoint::Allocated => {
                seen.made_sections_at_allocation = graph
                    .sections()
                    .into_iter()
                    .filter(|s| matches!(s.id, kiln::plugin::SectionId::Synthesized(_)))
                    .filter(|s| s.address.is_some())
                    .map(|s| s.name)
                    .collect();
                seen.refused_late_section = graph
                    .add_section("late", kiln::plugin::NewSectionKind::Data, vec![0; 8], 8)
                    .err()
                    .map(|e| e.to_string());
                seen.addresses = Some([
                    graph.symbol_address("answer").ok_or("no answer")?,
                    graph.symbol_address("helper").ok_or("no helper")?,
                ]);
            }
            PassPoint::FixedUp => {
                let table = self.1.lock().ok_or("no table")?;
                let bytes = graph.section_bytes_mut(table).ok_or("no table bytes")?;
                let word =
                    |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
                seen.table = Some([word(0), word(1)]);
            }
        }
        Ok(())
    }
}

struct TablePlugin(Arc<Mutex<TableSeen>>);

impl Plugin for TablePlugin {
    fn name(&self) -> &str {
        "table"
    }
    fn link_passes(&self) -> Vec<(PassPoint, Arc<dyn LinkPass>)> {
        let pass: Arc<dyn LinkPass> = Arc::new(TableMaker(self.0.clone(), Mutex::new(None)));
        vec![
            (PassPoint::Decoded, pass.clone()),
            (PassPoint::Allocated, pass.clone()),
            (PassPoint::FixedUp, pass),
        ]
    }
}

#[test]
fn a_pass_adds_a_section_and_edges_that_the_link_places_and_applies() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    let seen = Arc::new(Mutex::new(TableSeen::default()));
    let registration = jit.add_plugin(Arc::new(TablePlugin(seen.clone())));
    jit.library(lib)
        .add(Input::object("helper.o", compile("helper", HELPER)))
        .unwrap();
    jit.library(lib)
        .add(Input::object("answer.o", compile("answer", SOURCE)))
        .unwrap();
    let answer = jit.lookup(lib, "answer").unwrap();
    let helper = jit.lookup(lib, "helper").unwrap();
    drop(registration);
    let seen = seen.lock();
    // The edges were applied: the table holds the two functions' addresses.
    assert_eq!(seen.addresses, Some([answer, helper]));
    assert_eq!(seen.table, Some([answer, helper]));
    // The link's own sections are sections of the graph, with addresses, beside the
    // pass's.
    for name in [".kiln.test.table", ".kiln.stubs", ".kiln.got"] {
        assert!(
            seen.made_sections_at_allocation.iter().any(|s| s == name),
            "{name} in {:?}",
            seen.made_sections_at_allocation
        );
    }
    let unknown = seen.refused_unknown_symbol.as_deref().unwrap_or("accepted");
    assert!(unknown.contains("nobody_defines_this"), "{unknown}");
    let kind = seen.refused_unknown_kind.as_deref().unwrap_or("accepted");
    assert!(kind.contains("R_NOT_A_RELOCATION"), "{kind}");
    let late = seen.refused_late_section.as_deref().unwrap_or("accepted");
    assert!(late.contains("only at Decoded"), "{late}");
}
