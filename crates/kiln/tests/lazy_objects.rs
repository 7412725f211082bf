//! Lazy objects: read by symbol table when added, linked when first needed.

use kiln::Input;
use kiln::{Error, Jit};

fn compile(name: &str, source: &str) -> Vec<u8> {
    kiln_testkit::cc_object(name, source, &["-O2", "-fPIC"])
}

fn call(jit: &Jit, name: &str, x: i64) -> i64 {
    // SAFETY: the tests' functions are `long f(long)`, run in this process; the session
    // keeps their modules.
    let f = unsafe {
        jit.lookup_fn::<extern "C" fn(i64) -> i64>(jit.main_library(), name)
            .unwrap()
    };
    f(x)
}

#[test]
fn only_what_is_needed_is_linked() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    jit.library(lib)
        .add(Input::lazy_object(
            "a.o",
            compile("a", "long b(long); long a(long x) { return b(x) + 1; }"),
        ))
        .unwrap();
    jit.library(lib)
        .add(Input::lazy_object(
            "b.o",
            compile("b", "long b(long x) { return x * 2; }"),
        ))
        .unwrap();
    jit.library(lib)
        .add(Input::lazy_object(
            "c.o",
            compile("c", "long c(long x) { return x - 1; }"),
        ))
        .unwrap();
    // A lazy object that could never link: nobody needs it, so nobody minds.
    jit.library(lib)
        .add(Input::lazy_object(
            "broken.o",
            compile(
                "broken",
                "long nowhere(long); long broken(long x) { return nowhere(x); }",
            ),
        ))
        .unwrap();
    assert_eq!(jit.library(lib).lazy_objects_pending().unwrap(), 4);
    assert!(
        jit.library(lib).modules().unwrap().is_empty(),
        "nothing links when added"
    );

    assert_eq!(call(&jit, "a", 20), 41);
    // a.o and the b.o it needs, in one module; c.o and broken.o untouched.
    let modules = jit.library(lib).modules().unwrap();
    assert_eq!(modules.len(), 1);
    assert_eq!(jit.library(lib).lazy_objects_pending().unwrap(), 2);
    assert!(modules[0].symbol("b").is_some());

    assert_eq!(call(&jit, "c", 20), 19);
    assert_eq!(jit.library(lib).modules().unwrap().len(), 2);
    assert_eq!(jit.library(lib).lazy_objects_pending().unwrap(), 1);

    // The broken one fails when needed, names what is missing, and stays lazy.
    let error = jit.lookup(lib, "broken").unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("nowhere") && message.contains("broken.o"),
        "{message}"
    );
    assert_eq!(jit.library(lib).lazy_objects_pending().unwrap(), 1);
    assert_eq!(
        jit.library(lib).modules().unwrap().len(),
        2,
        "what was linked stays"
    );
    assert_eq!(call(&jit, "a", 1), 3);
}

#[test]
fn pending_objects_pull_lazy_ones_and_search_order_libraries_link_theirs() {
    let jit = Jit::new().unwrap();
    let main = jit.main_library();
    let runtime = jit.create_library("runtime");
    jit.library(main).set_search_order(&[runtime]).unwrap();
    jit.library(runtime)
        .add(Input::lazy_object(
            "twice.o",
            compile("twice", "long twice(long x) { return 2 * x; }"),
        ))
        .unwrap();
    jit.library(main)
        .add(Input::lazy_object(
            "inc.o",
            compile("inc", "long inc(long x) { return x + 1; }"),
        ))
        .unwrap();
    jit.library(main)
        .add(Input::object(
            "user.o",
            compile(
                "user",
                "long twice(long); long inc(long); long user(long x) { return twice(inc(x)); }",
            ),
        ))
        .unwrap();
    assert_eq!(call(&jit, "user", 4), 10);
    // inc.o joined user.o's module; twice.o became a module of `runtime`.
    assert_eq!(jit.library(main).modules().unwrap().len(), 1);
    assert!(jit.library(main).modules().unwrap()[0]
        .symbol("inc")
        .is_some());
    assert_eq!(jit.library(runtime).modules().unwrap().len(), 1);
    assert_eq!(jit.library(main).lazy_objects_pending().unwrap(), 0);
    assert_eq!(jit.library(runtime).lazy_objects_pending().unwrap(), 0);
    // user's module refers to twice's: it cannot be removed under it.
    let twice = jit.library(runtime).module_of("twice").unwrap().unwrap();
    assert!(matches!(
        jit.remove_module(&twice),
        Err(Error::ModuleInUse { .. })
    ));
}

#[test]
fn bad_lazy_objects_are_refused_when_added() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    let one = compile("one", "long one(long x) { return x; }");
    jit.library(lib)
        .add(Input::lazy_object("one.o", one.clone()))
        .unwrap();
    let error = jit
        .library(lib)
        .add(Input::lazy_object("one-again.o", one.clone()))
        .unwrap_err();
    assert!(
        matches!(&error, Error::Redefinition { symbol, previous, .. } if symbol == "one" && previous.contains("one.o")),
        "{error}"
    );
    let error = jit
        .library(lib)
        .add(Input::lazy_object("cut.o", one[..40].to_vec()))
        .unwrap_err();
    assert!(error.to_string().contains("cut.o"), "{error}");
    let mut wrong = one.clone();
    wrong[18] = 183; // EM_AARCH64
    let error = jit
        .library(lib)
        .add(Input::lazy_object("wrong.o", wrong))
        .unwrap_err();
    assert!(error.to_string().contains("wrong.o"), "{error}");
    // A definition linked eagerly is a redefinition too.
    let error = jit.link_object(lib, "one-eager.o", one).unwrap_err();
    assert!(
        matches!(&error, Error::Redefinition { previous, .. } if previous == "lazy object one.o"),
        "{error}"
    );
    assert_eq!(call(&jit, "one", 5), 5);
    assert_eq!(jit.library(lib).modules().unwrap().len(), 1);
}

#[test]
fn lazy_objects_of_libraries_that_need_each_other_are_an_error_not_a_deadlock() {
    let jit = Jit::new().unwrap();
    let a = jit.main_library();
    let b = jit.create_library("b");
    jit.library(a).set_search_order(&[b]).unwrap();
    jit.library(b).set_search_order(&[a]).unwrap();
    jit.library(b)
        .add(Input::lazy_object(
            "b1.o",
            compile("b1", "long a2(long); long b1(long x) { return a2(x) + 1; }"),
        ))
        .unwrap();
    jit.library(a)
        .add(Input::lazy_object(
            "a2.o",
            compile("a2", "long a2(long x) { return x * 2; }"),
        ))
        .unwrap();
    jit.library(a)
        .add(Input::object(
            "user.o",
            compile(
                "cycle_user",
                "long b1(long); long user(long x) { return b1(x); }",
            ),
        ))
        .unwrap();
    // a's link needs b1 (lazy in b), whose object needs a2 (lazy in a, which this thread
    // is linking into): refused with an error that says so.
    let error = jit.lookup(a, "user").unwrap_err().to_string();
    assert!(error.contains("being linked on this thread"), "{error}");
    // The lazy objects are still there, and a2 alone links.
    assert_eq!(jit.library(b).lazy_objects_pending().unwrap(), 1);
    assert_eq!(call(&jit, "a2", 4), 8);
}
