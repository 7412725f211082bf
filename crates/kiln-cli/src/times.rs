//! `--show-times`: one link's phases and passes on stderr, the same lines for `kiln run`
//! and `kiln link` (`link_floor` reads them).

use std::borrow::Cow;
use std::time::Duration;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Prints the time to load the inputs, each phase and pass of the link, and its counts.
pub(crate) fn print_link_times(
    load: Duration,
    times: &kiln::link::LinkTimes,
    passes: &[(Cow<'static, str>, Duration)],
    counts: &kiln::link::LinkCounts,
) {
    eprintln!("kiln: load inputs  {:>9.3} ms", ms(load));
    for (name, d) in [
        ("parse", times.parse),
        ("resolve", times.resolve),
        ("layout", times.layout),
        ("fixup", times.fixup),
        ("finalize", times.finalize),
    ] {
        eprintln!("kiln: {name:<12} {:>9.3} ms", ms(d));
    }
    for (pass, d) in passes {
        eprintln!("kiln:   pass {pass:<26} {:>9.3} ms", ms(*d));
    }
    eprintln!(
        "kiln: {} objects, {} sections, {} relocations, {} GOT entries, {} PLT stubs",
        counts.objects, counts.sections, counts.relocations, counts.got_entries, counts.plt_stubs
    );
}

/// Prints a step after the link (writing the image) and the whole command's time.
pub(crate) fn print_step(name: &str, d: Duration) {
    eprintln!("kiln: {name:<12} {:>9.3} ms", ms(d));
}

/// Prints the round trips a remote executor's connection made, per kind of request.
pub(crate) fn print_round_trips(trips: &[kiln::executor::RoundTrips]) {
    let total: Duration = trips.iter().map(|t| t.waited).sum();
    let count: u32 = trips.iter().map(|t| t.count).sum();
    eprintln!(
        "kiln: executor round trips: {count}, {:.3} ms waiting",
        ms(total)
    );
    for t in trips {
        eprintln!(
            "kiln:   {:<30} {:>3} x {:>9.3} ms",
            t.request,
            t.count,
            ms(t.waited)
        );
    }
}
