"""Run by the test command in a fresh virtual environment where only the built wheel is
installed (no source tree on the path): the package imports, finds its C library, and
links and calls an object the system C compiler made."""

import ctypes
import os
import subprocess
import sys
import tempfile

import kiln

here = os.path.dirname(os.path.abspath(kiln.__file__))
assert "site-packages" in here, f"kiln imported from {here}, not the installed wheel"
with tempfile.TemporaryDirectory() as tmp:
    source = os.path.join(tmp, "twice.c")
    with open(source, "w") as f:
        f.write("long twice(long x) { return 2 * x; }\n")
    obj = os.path.join(tmp, "twice.o")
    subprocess.run(["cc", "-O2", "-c", source, "-o", obj], check=True)
    with kiln.Session() as session:
        with open(obj, "rb") as f:
            session.add_object(f.read(), "twice.o")
        session.add_process_symbols()
        session.link()
        twice = session.lookup_fn("twice", ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_long))
        assert twice(21) == 42, twice(21)
print("wheel: kiln", kiln.__file__, "links and calls: ok")
sys.exit(0)
