//! The session at JIT scale: dependency records that make removal safe, explicit
//! redefinition, checked library ids, batch and typed lookups, lent object bytes, archive
//! members shared between modules, and links into
//! different libraries from several threads while others look up.

// kiln::Error wraps link errors, which are large by design (see kiln-link).
#![allow(clippy::result_large_err)]

use kiln::Input;
use kiln::{Error, Jit};
use std::sync::Arc;

fn compile(name: &str, source: &str) -> Vec<u8> {
    kiln_testkit::cc_object(name, source, &["-O1", "-fPIC"])
}

fn call1(jit: &Jit, lib: kiln::LibraryId, name: &str, x: i64) -> i64 {
    // SAFETY: the tests' functions are `long f(long)`, in this process, and their modules
    // stay in the library while called.
    let f = unsafe { jit.lookup_fn::<extern "C" fn(i64) -> i64>(lib, name) }.unwrap();
    f(x)
}

#[test]
fn a_module_others_call_cannot_be_removed_and_never_leaves_a_dangling_call() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    let base = jit
        .link_object(
            lib,
            "base.o",
            compile("base", "long base(long x) { return x * 10; }"),
        )
        .unwrap();
    let user = jit
        .link_object(
            lib,
            "user.o",
            compile(
                "user",
                "long base(long); long user(long x) { return base(x) + 1; }",
            ),
        )
        .unwrap();
    assert!(
        user.uses().any(|m| m.same(&base)),
        "the dependency is recorded"
    );
    assert_eq!(call1(&jit, lib, "user", 4), 41);
    match jit.remove_module(&base) {
        Err(Error::ModuleInUse { module, users }) => {
            assert_eq!(module, "base.o");
            assert_eq!(users, vec!["user.o".to_string()]);
        }
        other => panic!("expected ModuleInUse, got {other:?}"),
    }
    // Refused: nothing changed.
    assert_eq!(call1(&jit, lib, "user", 5), 51);
    // Without its users, it goes.
    let user_fn = user.symbol("user").unwrap();
    jit.remove_module(&user).unwrap();
    jit.remove_module(&base).unwrap();
    assert!(matches!(
        jit.lookup(lib, "base"),
        Err(Error::SymbolNotFound(_))
    ));
    // A handle of the removed user still runs: it keeps base's memory mapped.
    drop(base);
    // SAFETY: `user` is `long user(long)`, and the handle keeps it (and what it calls)
    // mapped.
    let f: extern "C" fn(i64) -> i64 = unsafe { std::mem::transmute(user_fn as usize) };
    assert_eq!(f(6), 61);
    let live = jit.memory_stats().live_allocations;
    drop(user);
    assert_eq!(jit.memory_stats().live_allocations, live - 2);
}

#[test]
fn defining_a_name_twice_is_an_error_and_changes_nothing() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    jit.link_object(
        lib,
        "one.o",
        compile("one", "long twice(long x) { return x + 1; }"),
    )
    .unwrap();
    let live = jit.memory_stats().live_allocations;
    match jit.link_object(
        lib,
        "two.o",
        compile("two", "long twice(long x) { return x + 2; }"),
    ) {
        Err(Error::Redefinition {
            symbol,
            previous,
            new,
            ..
        }) => {
            assert_eq!(symbol, "twice");
            assert_eq!(previous, "module one.o");
            assert_eq!(new, "two.o");
        }
        other => panic!("expected Redefinition, got {other:?}"),
    }
    assert_eq!(call1(&jit, lib, "twice", 1), 2);
    assert_eq!(jit.memory_stats().live_allocations, live);
    assert!(matches!(
        jit.library(lib).define_symbol("twice", 0x1000),
        Err(Error::Redefinition { .. })
    ));
}

#[test]
fn a_weak_or_common_definition_gives_way_to_the_librarys_own() {
    // Two modules of one library each carry a copy of a weak function and a common
    // variable (an `inline` function's and `int x;`'s shape: LLVM's linkonce_odr and common
    // globals): the second module binds to the first one's, as ELF binds a weak definition
    // to a strong one. Different bodies make the binding visible.
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    let one = jit
        .link_object(
            lib,
            "one.o",
            kiln_testkit::cc_object(
                "one",
                "__attribute__((weak)) long scaled(long x) { return x * 3; }\n\
                 long counter;\n\
                 long use_one(long x) { counter += 1; return scaled(x); }",
                &["-O1", "-fcommon", "-fno-inline"],
            ),
        )
        .unwrap();
    let two = jit
        .link_object(
            lib,
            "two.o",
            kiln_testkit::cc_object(
                "two",
                "__attribute__((weak)) long scaled(long x) { return x * 5; }\n\
                 long counter;\n\
                 long use_two(long x) { counter += 10; return scaled(x) + counter; }",
                &["-O1", "-fcommon", "-fno-inline"],
            ),
        )
        .expect("weak and common copies give way to the library's definitions");
    assert_eq!(call1(&jit, lib, "use_one", 2), 6);
    // The first module's `scaled` (x3), and the one `counter`: 1 from use_one, +10.
    assert_eq!(call1(&jit, lib, "use_two", 2), 6 + 11);
    assert_eq!(
        jit.lookup(lib, "scaled").unwrap(),
        one.symbol("scaled").unwrap()
    );
    assert_eq!(
        two.symbol("scaled"),
        None,
        "the second module does not export its copy"
    );
    // The second module uses the first: removing the first is refused while it is there.
    assert!(jit.remove_module(&one).is_err());
    jit.remove_module(&two).unwrap();
    jit.remove_module(&one).unwrap();
}

#[test]
fn a_library_id_of_another_session_is_an_error() {
    let a = Jit::new().unwrap();
    let b = Jit::new().unwrap();
    let other = b.create_library("other");
    assert!(matches!(
        a.lookup(other, "x"),
        Err(Error::UnknownLibrary(_))
    ));
    assert!(matches!(
        a.library(other)
            .add(Input::object("x.o", compile("x", "int x;"))),
        Err(Error::UnknownLibrary(_))
    ));
    assert!(matches!(
        a.library(b.main_library()).define_symbol("y", 1),
        Err(Error::UnknownLibrary(_))
    ));
}

#[test]
fn batch_lookup_and_lent_bytes() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    let bytes: Arc<Vec<u8>> = Arc::new(compile(
        "many",
        "long f1(long x) { return x + 1; } long f2(long x) { return x + 2; } long f3(long x) { return x + 3; }",
    ));
    jit.library(lib)
        .add(Input::object_shared("many.o", bytes.clone()))
        .unwrap();
    assert!(Arc::strong_count(&bytes) > 1, "lent, not copied");
    let addresses = jit.lookup_many(lib, &["f1", "f2", "f3"]).unwrap();
    assert_eq!(addresses.len(), 3);
    assert!(addresses.iter().all(|&a| a != 0));
    assert_eq!(call1(&jit, lib, "f3", 1), 4);
    assert!(matches!(
        jit.lookup_many(lib, &["f1", "missing"]),
        Err(Error::SymbolNotFound(name)) if name == "missing"
    ));
}

#[test]
fn an_archive_member_linked_once_serves_later_modules() {
    // Two modules need zlib's crc32: the second binds to the first's copy (and records
    // the dependency) instead of linking the member again and defining crc32 twice.
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    jit.library(lib)
        .add(Input::archive_file("/usr/lib/x86_64-linux-gnu/libz.a"))
        .unwrap();
    jit.library(lib).add(Input::ProcessSymbols).unwrap();
    let src = |n: &str| {
        format!(
            "unsigned long crc32(unsigned long, const unsigned char *, unsigned);\n\
             long {n}(long x) {{ return (long)crc32(0, (const unsigned char *)\"kiln\", 4) + x; }}\n"
        )
    };
    let first = jit
        .link_object(lib, "first.o", compile("crc_first", &src("first")))
        .unwrap();
    let second = jit
        .link_object(lib, "second.o", compile("crc_second", &src("second")))
        .unwrap();
    assert_eq!(call1(&jit, lib, "first", 0), call1(&jit, lib, "second", 0));
    assert!(second.uses().any(|m| m.same(&first)));
}

#[test]
fn links_into_different_libraries_proceed_in_parallel_with_lookups() {
    let jit = Jit::new().unwrap();
    let libs: Vec<_> = (0..2)
        .map(|i| jit.create_library(&format!("lib{i}")))
        .collect();
    let objects: Vec<Vec<Vec<u8>>> = (0..2)
        .map(|l| {
            (0..40)
                .map(|i| {
                    compile(
                        &format!("par_{l}_{i}"),
                        &format!("long f_{l}_{i}(long x) {{ return x + {i}; }}"),
                    )
                })
                .collect()
        })
        .collect();
    std::thread::scope(|scope| {
        for (l, objs) in objects.iter().enumerate() {
            let jit = jit.clone();
            let lib = libs[l];
            scope.spawn(move || {
                for (i, bytes) in objs.iter().enumerate() {
                    jit.link_object(lib, &format!("f_{l}_{i}.o"), bytes.clone())
                        .unwrap();
                }
            });
        }
        // Meanwhile, lookups in both libraries answer (found or not yet).
        let jit = jit.clone();
        let libs = libs.clone();
        scope.spawn(move || {
            for round in 0..200 {
                for (l, &lib) in libs.iter().enumerate() {
                    let _ = jit.lookup(lib, &format!("f_{l}_{}", round % 40));
                }
            }
        });
    });
    for (l, &lib) in libs.iter().enumerate() {
        for i in 0..40 {
            assert_eq!(call1(&jit, lib, &format!("f_{l}_{i}"), 100), 100 + i);
        }
        assert_eq!(jit.library(lib).modules().unwrap().len(), 40);
    }
}
