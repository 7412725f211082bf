"""Kiln against apache-tvm-ffi-orcjit (LLVM ORC's LLJIT in a PyPI package) on the same
plain objects: N llvmlite objects of one function each, each loaded into a module of its
own; load time and resident growth per object.

  python python/benchmarks/tvm_ffi_orcjit_objects.py kiln 2000
  python python/benchmarks/tvm_ffi_orcjit_objects.py tvm 2000

(`tvm` needs `pip install apache-tvm-ffi-orcjit llvmlite` in the environment; `kiln` the
package.) Kiln links each object, looks its function up and calls it; tvm-ffi-orcjit can
only load it (`load_module`): it gives addresses of TVM-FFI exported functions alone, and
links an object at such a lookup (docs/BENCHMARKS.md).
"""
import os, sys, time, gc
import llvmlite.binding as ll

def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

ll.initialize_native_target(); ll.initialize_native_asmprinter()
tm = ll.Target.from_triple(ll.get_process_triple()).create_target_machine(reloc="pic", codemodel="small", opt=2)
n = int(sys.argv[2])
objs = []
for i in range(n):
    m = ll.parse_assembly(f"declare i64 @labs(i64)\ndefine i64 @f{i}(i64 %x) {{ %m = mul i64 %x, {i+1}\n %s = sub i64 %m, 7\n %r = call i64 @labs(i64 %s)\n ret i64 %r }}")
    objs.append(tm.emit_object(m))
gc.collect()
mode = sys.argv[1]
keep = []
if mode == "tvm":
    import tvm_ffi_orcjit as oj
    s = oj.ExecutionSession()
    s.load_module(objs[0])  # warm
    r0 = resident(); t = time.perf_counter()
    for i, o in enumerate(objs):
        keep.append(s.load_module(o, name=f"m{i}"))
    dt = time.perf_counter() - t
else:
    import kiln, ctypes
    s = kiln.Session()
    s.add_process_symbols()
    lib = s.create_library("w"); s.add_process_symbols(lib); s.add_object(objs[0], "w.o", lib); s.link(lib)
    r0 = resident(); t = time.perf_counter()
    fn = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)
    for i, o in enumerate(objs):
        lib = s.create_library(f"m{i}")
        s.add_process_symbols(lib)
        s.add_object(o, f"m{i}.o", lib)
        keep.append(s.link(lib))
        assert fn(s.lookup(f"f{i}", lib))(3) == abs(3 * (i + 1) - 7)
    dt = time.perf_counter() - t
gc.collect()
print(mode, n, "load us/object %.1f" % (dt * 1e6 / n), "resident B/object %.0f" % ((resident() - r0) / n))
