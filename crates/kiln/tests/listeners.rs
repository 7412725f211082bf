//! Listeners: plugins told of every load and free (several at once, RAII registrations,
//! failures contained), and the built-in debugger and profiler outputs checked against
//! the linked addresses: the GDB JIT list, the perf map and the jitdump file.

// kiln::Error wraps link errors, which are large by design (see kiln-link).
#![allow(clippy::result_large_err)]

use kiln::{
    debug::DebugSupport,
    plugin::{LoadedModule, Plugin, PluginError, SymbolKind},
    Jit,
};
use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::Arc;

fn compile(name: &str, source: &str, flags: &[&str]) -> Vec<u8> {
    let flags: Vec<&str> = ["-O1", "-fPIC"].iter().chain(flags).copied().collect();
    kiln_testkit::cc_object(name, source, &flags)
}

#[derive(Default)]
struct Recorder {
    loaded: Mutex<Vec<LoadedModule>>,
    freed: Mutex<Vec<LoadedModule>>,
}

impl Plugin for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }
    fn module_loaded(&self, module: &LoadedModule) -> Result<(), PluginError> {
        self.loaded.lock().push(module.clone());
        Ok(())
    }
    fn module_freed(&self, module: &LoadedModule) -> Result<(), PluginError> {
        self.freed.lock().push(module.clone());
        Ok(())
    }
}

struct Failing;

impl Plugin for Failing {
    fn name(&self) -> &str {
        "failing"
    }
    fn module_loaded(&self, module: &LoadedModule) -> Result<(), PluginError> {
        Err(format!("cannot describe {}", module.name).into())
    }
}

struct Panicker;

impl Plugin for Panicker {
    fn name(&self) -> &str {
        "panicker"
    }
    fn module_freed(&self, _: &LoadedModule) -> Result<(), PluginError> {
        panic!("a plugin that panics");
    }
}

#[test]
fn listeners_see_sections_symbols_objects_and_frees_and_cannot_break_a_link() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    let recorder = Arc::new(Recorder::default());
    let late = Arc::new(Recorder::default());
    let registration = jit.add_plugin(recorder.clone());
    let _failing = jit.add_plugin(Arc::new(Failing));
    let _panicker = jit.add_plugin(Arc::new(Panicker));
    let module = jit
        .link_object(
            lib,
            "plugged.o",
            compile(
                "plugged",
                "static long hidden_helper(long x) { return x * 3; }\n\
                 long table[4] = {1, 2, 3, 4};\n\
                 long plugged(long x) { return hidden_helper(x) + table[1]; }\n",
                &[],
            ),
        )
        .unwrap();
    // SAFETY: `long plugged(long)`, in this process, its module alive.
    let f = unsafe { jit.lookup_fn::<extern "C" fn(i64) -> i64>(lib, "plugged") }.unwrap();
    assert_eq!(f(2), 8, "the link went on despite a failing plugin");
    let failures = jit.plugin_failures();
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].plugin, "failing");
    assert_eq!(failures[0].event, "load");
    assert!(failures[0].message.contains("cannot describe plugged.o"));
    {
        let loaded = recorder.loaded.lock();
        assert_eq!(loaded.len(), 1);
        let event = &loaded[0];
        assert_eq!(event.name, "plugged.o");
        assert_eq!(event.objects.len(), 1);
        let plugged = event.symbols.iter().find(|s| s.name == "plugged").unwrap();
        assert_eq!(plugged.kind, SymbolKind::Function);
        assert!(plugged.global && plugged.size > 0);
        assert_eq!(Some(plugged.address), module.symbol("plugged"));
        let table = event.symbols.iter().find(|s| s.name == "table").unwrap();
        assert_eq!((table.kind, table.size), (SymbolKind::Data, 32));
        let text = event.sections.iter().find(|s| s.name == ".text").unwrap();
        assert!((text.address..text.address + text.size).contains(&plugged.address));
        assert_eq!(event.segments, module.allocation().segments());
        assert!(event.sections.iter().all(|s| event
            .segments
            .iter()
            .any(|g| g.target <= s.address && s.address + s.size <= g.target + g.len)));
    }
    // A registration dropped: no more loads are announced to it, but the free of a module
    // it was told of still is.
    drop(registration);
    let _late = jit.add_plugin(late.clone());
    let second = jit
        .link_object(
            lib,
            "second.o",
            compile("second_mod", "long second(long x) { return x; }", &[]),
        )
        .unwrap();
    assert_eq!(recorder.loaded.lock().len(), 1);
    assert_eq!(late.loaded.lock().len(), 1);
    jit.remove_module(&module).unwrap();
    let id = module.allocation().segments().to_vec();
    drop(module);
    {
        let freed = recorder.freed.lock();
        assert_eq!(freed.len(), 1);
        assert_eq!(freed[0].name, "plugged.o");
        assert_eq!(freed[0].segments, id);
    }
    assert!(
        late.freed.lock().is_empty(),
        "never told of plugged.o's load"
    );
    let failures = jit.plugin_failures();
    assert_eq!(failures.len(), 2, "{failures:?}");
    assert_eq!(
        (failures[0].plugin.as_str(), failures[0].module.as_str()),
        ("failing", "second.o")
    );
    assert_eq!(
        (failures[1].plugin.as_str(), failures[1].event),
        ("panicker", "free")
    );
    assert!(failures[1].message.contains("a plugin that panics"));
    jit.remove_module(&second).unwrap();
}

/// Records of a jitdump file: (id, body).
fn jitdump_records(bytes: &[u8]) -> Vec<(u32, &[u8])> {
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    assert_eq!(u32_at(0), 0x4A69_5444, "jitdump magic");
    assert_eq!(u32_at(4), 1, "jitdump version");
    assert_eq!(u32_at(20), std::process::id(), "jitdump pid");
    let mut at = u32_at(8) as usize;
    let mut records = Vec::new();
    while at + 16 <= bytes.len() {
        let (id, size) = (u32_at(at), u32_at(at + 4) as usize);
        records.push((id, &bytes[at + 16..at + size]));
        at += size;
    }
    assert_eq!(at, bytes.len(), "records end where the file does");
    records
}

fn cstr(bytes: &[u8]) -> (&str, &[u8]) {
    let end = bytes.iter().position(|&b| b == 0).unwrap();
    (
        std::str::from_utf8(&bytes[..end]).unwrap(),
        &bytes[end + 1..],
    )
}

#[test]
fn gdb_list_perf_map_and_jitdump_match_the_linked_addresses() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("listeners-jitdump");
    let _ = std::fs::remove_dir_all(&dir);
    // A pid is reused: what an earlier process left at this one's perf map name, Kiln
    // would refuse to write.
    kiln_testkit::free_perf_map(std::process::id());
    let jit = Jit::builder()
        .debug_support(DebugSupport {
            gdb: true,
            perf_map: true,
            jitdump: true,
            jitdump_dir: Some(dir.clone()),
        })
        .build()
        .unwrap();
    let lib = jit.main_library();
    let recorder = Arc::new(Recorder::default());
    let _registration = jit.add_plugin(recorder.clone());
    let before = kiln_runtime::debug_outputs::gdb_entry_count();
    let source = "long listened_square(long x)\n{\n    return x * x;\n}\n\n\
                  long listened_twice(long x)\n{\n    return listened_square(x) * 2;\n}\n";
    let module = jit
        .link_object(
            lib,
            "listened.o",
            compile("listened", source, &["-g", "-fno-inline"]),
        )
        .unwrap();
    assert!(jit.plugin_failures().is_empty());
    // GDB: one image in the process's list while the module lives.
    assert_eq!(kiln_runtime::debug_outputs::gdb_entry_count(), before + 1);
    let symbols: Vec<(String, u64, u64)> = recorder.loaded.lock()[0]
        .symbols
        .iter()
        .filter(|s| s.kind == SymbolKind::Function)
        .map(|s| (s.name.clone(), s.address, s.size))
        .collect();
    assert_eq!(symbols.len(), 2);
    for (name, address, _) in &symbols {
        assert_eq!(jit.lookup(lib, name).unwrap(), *address);
    }
    // The perf map: one line per function, address and size as linked (written by the
    // executor's writer thread; flushed here, as at exit).
    kiln_runtime::debug_outputs::flush();
    let map = std::fs::read_to_string(format!("/tmp/perf-{}.map", std::process::id())).unwrap();
    for (name, address, size) in &symbols {
        let line = format!("{address:x} {size:x} {name}");
        assert!(
            map.lines().any(|l| l == line),
            "{line} in the perf map:\n{map}"
        );
    }
    // The jitdump file: a debug-info record then a code-load record per function, the
    // code bytes those in memory, the lines those of the source.
    let path = kiln_runtime::debug_outputs::jitdump_path().unwrap();
    assert_eq!(path.parent().unwrap(), dir);
    let bytes = std::fs::read(&path).unwrap();
    let records = jitdump_records(&bytes);
    for (name, address, size) in &symbols {
        let load = records
            .iter()
            .position(|(id, body)| *id == 0 && cstr(&body[40..]).0 == name)
            .unwrap_or_else(|| panic!("a code-load record for {name}"));
        let body = records[load].1;
        let word = |i: usize| u64::from_le_bytes(body[8 + i * 8..16 + i * 8].try_into().unwrap());
        assert_eq!((word(0), word(1), word(2)), (*address, *address, *size));
        let (_, code) = cstr(&body[40..]);
        // SAFETY: the function's code, in this process, its module alive.
        let memory = unsafe { std::slice::from_raw_parts(*address as *const u8, *size as usize) };
        assert_eq!(code, memory);
        let (id, info) = records[load - 1];
        assert_eq!(id, 2, "a debug-info record before {name}'s code");
        assert_eq!(u64::from_le_bytes(info[..8].try_into().unwrap()), *address);
        let entries = u64::from_le_bytes(info[8..16].try_into().unwrap());
        assert!(entries >= 1);
        let mut rest = &info[16..];
        let mut lines = Vec::new();
        for _ in 0..entries {
            let at = u64::from_le_bytes(rest[..8].try_into().unwrap());
            let line = u32::from_le_bytes(rest[8..12].try_into().unwrap());
            let (file, tail) = cstr(&rest[16..]);
            assert!(file.ends_with("listened.c"), "{file}");
            assert!((*address..*address + *size).contains(&at));
            lines.push(line);
            rest = tail;
        }
        let expected = if name == "listened_square" {
            1..=4
        } else {
            6..=9
        };
        assert!(
            lines.iter().all(|l| expected.contains(l)),
            "{name}'s lines {lines:?} in {expected:?}"
        );
    }
    // Freed: the image leaves the GDB list.
    jit.remove_module(&module).unwrap();
    drop(module);
    assert_eq!(kiln_runtime::debug_outputs::gdb_entry_count(), before);
}
