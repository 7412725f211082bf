//! The common JIT link — one object, linked at once with nothing pending and no plugin,
//! its bytes lent (`link_object_shared`) — against the general path (the object added,
//! checked, then linked as what is pending, with a plugin registered, which walks the
//! plugins and reports sections): random sequences of small modules that call each
//! other, earlier modules, the host, and names nobody defines, some of them corrupt. Both
//! ways must give the same modules (names, layout, what each function returns) and the
//! same errors.
#![cfg(all(target_os = "linux", target_arch = "x86_64"))]
// Errors wrap link errors, which are large by design (see kiln-link).
#![allow(clippy::result_large_err)]

use kiln::{plugin::Plugin, Jit};
use object::write::{Object, Relocation, StandardSection, Symbol, SymbolId, SymbolSection};
use object::{RelocationEncoding, RelocationFlags, RelocationKind, SymbolFlags, SymbolKind};
use proptest::prelude::*;
use std::sync::Arc;

/// What one function calls, besides returning its constant.
#[derive(Debug, Clone)]
enum Callee {
    /// An earlier function of the same module (index modulo the ones before it).
    Local(usize),
    /// A function of an earlier module of the sequence: (module, function), modulo.
    Earlier(usize, usize),
    /// The host's `getpid`.
    Host,
    /// A name nobody defines.
    Missing,
}

#[derive(Debug, Clone)]
struct FunctionSpec {
    value: i32,
    calls: Vec<Callee>,
}

#[derive(Debug, Clone)]
struct ModuleSpec {
    functions: Vec<FunctionSpec>,
    /// Bytes cut off the end of the object (0: whole).
    cut: usize,
    /// Whether its last function takes the name of an earlier module's first (a
    /// redefinition, refused).
    redefines: bool,
}

fn callee() -> impl Strategy<Value = Callee> {
    prop_oneof![
        4 => any::<usize>().prop_map(Callee::Local),
        4 => (any::<usize>(), any::<usize>()).prop_map(|(m, f)| Callee::Earlier(m, f)),
        2 => Just(Callee::Host),
        1 => Just(Callee::Missing),
    ]
}

fn module_spec() -> impl Strategy<Value = ModuleSpec> {
    let function = (-1000i32..1000, prop::collection::vec(callee(), 0..3))
        .prop_map(|(value, calls)| FunctionSpec { value, calls });
    (
        prop::collection::vec(function, 1..4),
        prop_oneof![8 => Just(0usize), 1 => 1usize..200],
        prop::bool::weighted(0.1),
    )
        .prop_map(|(functions, cut, redefines)| ModuleSpec {
            functions,
            cut,
            redefines,
        })
}

fn function_name(module: usize, function: usize) -> String {
    format!("m{module}_f{function}")
}

/// The object of module `k`: each function `mK_fI` returns its value plus what its
/// callees return (`call rel32` through `R_X86_64_PLT32`).
fn object_of(k: usize, spec: &ModuleSpec, earlier: &[ModuleSpec]) -> Vec<u8> {
    let mut obj = Object::new(
        object::BinaryFormat::Elf,
        object::Architecture::X86_64,
        object::Endianness::Little,
    );
    let text = obj.section_id(StandardSection::Text);
    let mut defined: Vec<SymbolId> = Vec::new();
    let mut undefined = std::collections::HashMap::<String, SymbolId>::new();
    for (i, f) in spec.functions.iter().enumerate() {
        let mut code = vec![0x53, 0xbb]; // push %rbx; mov $value, %ebx
        code.extend_from_slice(&f.value.to_le_bytes());
        let mut calls: Vec<(usize, Option<SymbolId>, String)> = Vec::new();
        // A function that takes an earlier module's name calls nothing: if that module
        // failed, the name is its own, and a call to it would be a call to itself.
        let renamed = spec.redefines && i + 1 == spec.functions.len() && !earlier.is_empty();
        for c in f.calls.iter().filter(|_| !renamed) {
            let target: Result<SymbolId, String> = match *c {
                Callee::Local(j) if i > 0 => Ok(defined[j % i]),
                Callee::Local(_) => continue,
                Callee::Earlier(m, g) if !earlier.is_empty() => {
                    let m = m % earlier.len();
                    Err(function_name(m, g % earlier[m].functions.len()))
                }
                Callee::Earlier(..) => continue,
                Callee::Host => Err("getpid".into()),
                Callee::Missing => Err(format!("nobody_defines_{k}")),
            };
            code.push(0xe8); // call rel32
            let at = code.len();
            code.extend_from_slice(&[0; 4]);
            code.extend_from_slice(&[0x01, 0xc3]); // add %eax, %ebx
            match target {
                Ok(id) => calls.push((at, Some(id), String::new())),
                Err(name) => calls.push((at, None, name)),
            }
        }
        code.extend_from_slice(&[0x89, 0xd8, 0x5b, 0xc3]); // mov %ebx, %eax; pop %rbx; ret
        let offset = obj.append_section_data(text, &code, 16);
        let name = match renamed {
            true => function_name(k % earlier.len(), 0),
            false => function_name(k, i),
        };
        let id = obj.add_symbol(Symbol {
            name: name.into_bytes(),
            value: offset,
            size: code.len() as u64,
            kind: SymbolKind::Text,
            scope: object::SymbolScope::Dynamic,
            weak: false,
            section: SymbolSection::Section(text),
            flags: SymbolFlags::None,
        });
        for (at, local, name) in calls {
            let symbol = local.unwrap_or_else(|| {
                *undefined.entry(name.clone()).or_insert_with(|| {
                    obj.add_symbol(Symbol {
                        name: name.into_bytes(),
                        value: 0,
                        size: 0,
                        kind: SymbolKind::Text,
                        scope: object::SymbolScope::Dynamic,
                        weak: false,
                        section: SymbolSection::Undefined,
                        flags: SymbolFlags::None,
                    })
                })
            });
            obj.add_relocation(
                text,
                Relocation {
                    offset: offset + at as u64,
                    symbol,
                    addend: -4,
                    flags: RelocationFlags::Generic {
                        kind: RelocationKind::PltRelative,
                        encoding: RelocationEncoding::Generic,
                        size: 32,
                    },
                },
            )
            .expect("relocation");
        }
        defined.push(id);
    }
    let mut bytes = obj.write().expect("object");
    bytes.truncate(bytes.len().saturating_sub(spec.cut));
    bytes
}

/// A plugin that only watches: registered, it puts the link on the general path.
struct Watcher;

impl Plugin for Watcher {
    fn name(&self) -> &str {
        "watcher"
    }
}

/// What linking one module gave: its exported names, each function's offset from the
/// module's code and what it returns; or the error's kind and message.
#[derive(Debug, PartialEq)]
enum Outcome {
    Linked(Vec<(String, u64, i32)>),
    Failed(kiln::ErrorKind, String),
}

fn link_all(specs: &[ModuleSpec], general: bool) -> Vec<Outcome> {
    let jit = Jit::new().expect("session");
    let lib = jit.main_library();
    jit.library(lib)
        .add(kiln::Input::ProcessSymbols)
        .expect("process symbols");
    let _registration = general.then(|| jit.add_plugin(Arc::new(Watcher)));
    let mut outcomes = Vec::new();
    for (k, spec) in specs.iter().enumerate() {
        let bytes = object_of(k, spec, &specs[..k]);
        let name = format!("m{k}.o");
        let linked = if general {
            jit.library(lib)
                .add(kiln::Input::object(&name, bytes))
                .and_then(|()| {
                    jit.link_pending(lib)?
                        .map(|(module, _)| module)
                        .ok_or_else(|| kiln::Error::Executor("nothing linked".into()))
                })
        } else {
            jit.link_object_shared(lib, &name, Arc::new(bytes))
        };
        outcomes.push(match linked {
            Ok(module) => {
                let code = module.allocation().segments()[0].target;
                let mut names: Vec<(String, u64, i32)> = module
                    .exported_names()
                    .map(|n| {
                        let address = module.symbol(n).expect("exported name");
                        // SAFETY: every exported name is a function of the form above:
                        // `int f(void)`, linked into this process.
                        let f: extern "C" fn() -> i32 =
                            unsafe { std::mem::transmute(address as usize) };
                        (n.to_string(), address - code, f())
                    })
                    .collect();
                names.sort();
                Outcome::Linked(names)
            }
            Err(error) => Outcome::Failed(error.kind(), error.to_string()),
        });
    }
    outcomes
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn one_object_links_as_the_general_path_does(
        specs in prop::collection::vec(module_spec(), 1..6)
    ) {
        let fast = link_all(&specs, false);
        let general = link_all(&specs, true);
        prop_assert_eq!(fast, general);
    }
}

#[test]
fn the_generated_modules_link_call_and_fail_as_written() {
    // The generator itself: a module calling itself, an earlier module and the host
    // returns the sum; a name nobody defines fails the link, naming it; so do a cut object
    // and a name an earlier module defines.
    let f = |value, calls| FunctionSpec { value, calls };
    let specs = vec![
        ModuleSpec {
            functions: vec![f(5, vec![]), f(7, vec![Callee::Local(0)])],
            cut: 0,
            redefines: false,
        },
        ModuleSpec {
            functions: vec![f(1, vec![Callee::Earlier(0, 1)]), f(0, vec![Callee::Host])],
            cut: 0,
            redefines: false,
        },
        ModuleSpec {
            functions: vec![f(1, vec![Callee::Missing])],
            cut: 0,
            redefines: false,
        },
        ModuleSpec {
            functions: vec![f(1, vec![])],
            cut: 40,
            redefines: false,
        },
        ModuleSpec {
            functions: vec![f(1, vec![])],
            cut: 0,
            redefines: true,
        },
    ];
    let outcomes = link_all(&specs, false);
    let pid = std::process::id() as i32;
    let Outcome::Linked(first) = &outcomes[0] else {
        panic!("{:?}", outcomes[0])
    };
    assert_eq!(
        first
            .iter()
            .map(|(n, _, v)| (n.as_str(), *v))
            .collect::<Vec<_>>(),
        [("m0_f0", 5), ("m0_f1", 12)]
    );
    let Outcome::Linked(second) = &outcomes[1] else {
        panic!("{:?}", outcomes[1])
    };
    assert_eq!(
        second
            .iter()
            .map(|(n, _, v)| (n.as_str(), *v))
            .collect::<Vec<_>>(),
        [("m1_f0", 13), ("m1_f1", pid)]
    );
    assert!(
        matches!(&outcomes[2], Outcome::Failed(kiln::ErrorKind::UndefinedSymbol, m) if m.contains("nobody_defines_2")),
        "{:?}",
        outcomes[2]
    );
    assert!(
        matches!(&outcomes[3], Outcome::Failed(kiln::ErrorKind::Link, m) if m.contains("m3.o")),
        "{:?}",
        outcomes[3]
    );
    assert!(
        matches!(&outcomes[4], Outcome::Failed(kiln::ErrorKind::Redefinition, m) if m.contains("m0_f0")),
        "{:?}",
        outcomes[4]
    );
    assert_eq!(outcomes, link_all(&specs, true));
}
