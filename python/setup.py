"""Builds the wheel: Kiln's C library (``cargo build --release -p kiln-capi`` in the
repository this directory belongs to, or the one ``KILN_CAPI_LIB`` names) goes into the
package as ``kiln/_lib/libkiln_capi.so``; the wheel is tagged for this platform."""

import os
import shutil
import subprocess
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parent


def c_library() -> Path:
    explicit = os.environ.get("KILN_CAPI_LIB")
    if explicit:
        return Path(explicit)
    subprocess.run(
        ["cargo", "build", "--release", "-p", "kiln-capi"], cwd=REPOSITORY, check=True
    )
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPOSITORY / "target"))
    if not target.is_absolute():
        target = REPOSITORY / target
    return target / "release" / "libkiln_capi.so"


# Installed next to the package (site-packages' root): Python runs its line at start-up.
# With KILN_NUMBA=1 in the environment it switches Numba to Kiln before the program runs
# (for programs one cannot edit, and the processes they start); otherwise it costs one
# environment lookup (the package and its C library are not even imported).
STARTUP_PTH = (
    'import os; os.environ.get("KILN_NUMBA") == "1" and '
    '__import__("kiln.numba", fromlist=["enable"]).enable()\n'
)


class BuildWithLibrary(build_py):
    def run(self) -> None:
        super().run()
        destination = Path(self.build_lib) / "kiln" / "_lib"
        destination.mkdir(parents=True, exist_ok=True)
        shutil.copy2(c_library(), destination / "libkiln_capi.so")
        (Path(self.build_lib) / "kiln_numba.pth").write_text(STARTUP_PTH)


class PlatformDistribution(Distribution):
    """The wheel carries a shared library: not pure Python."""

    def has_ext_modules(self) -> bool:
        return True


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=PlatformDistribution)
