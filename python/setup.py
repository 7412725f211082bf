"""Builds the wheel and the sdist.

The wheel: Kiln's C library (``cargo build --release -p kiln-capi``, in the Rust
workspace the sdist carries, else in the repository this directory belongs to, or the
library ``KILN_CAPI_LIB`` names) goes into the package as ``kiln/_lib/libkiln_capi.so``;
the wheel is tagged for this platform.

The sdist carries the Rust workspace the C library is built from (``rust/``: the
workspace's manifest and lock file and the crates git tracks), so that ``pip install
kiln-0.1.0.tar.gz`` builds it with nothing else than cargo and the crates it locks.
``KILN_CARGO_PROFILE`` builds with another cargo profile than ``release`` (the test
command's ``smoke``)."""

import os
import shutil
import subprocess
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parent


# The Rust workspace inside an sdist (see SdistWithRust).
BUNDLED = HERE / "rust"


def workspace() -> Path:
    """Where the C library is built from: the sdist's workspace, else the repository's."""
    return BUNDLED if (BUNDLED / "Cargo.toml").is_file() else REPOSITORY


def c_library() -> Path:
    explicit = os.environ.get("KILN_CAPI_LIB")
    if explicit:
        return Path(explicit)
    root = workspace()
    profile = os.environ.get("KILN_CARGO_PROFILE", "release")
    subprocess.run(
        ["cargo", "build", "--locked", "--profile", profile, "-p", "kiln-capi"],
        cwd=root,
        check=True,
    )
    target = Path(os.environ.get("CARGO_TARGET_DIR", root / "target"))
    if not target.is_absolute():
        target = root / target
    return target / profile / "libkiln_capi.so"


def rust_sources() -> list:
    """The files of the repository the C library is built from: the workspace's manifest,
    lock file and README (the crates' readme), and every file git tracks under crates/
    (every member's manifest is needed for cargo to load the workspace)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", "Cargo.toml", "Cargo.lock", "README.md", "crates"],
        cwd=REPOSITORY,
        capture_output=True,
        check=True,
    ).stdout
    files = [name for name in listed.decode().split("\0") if name]
    if "Cargo.lock" not in files:
        raise SystemExit(f"{REPOSITORY} is not Kiln's git checkout: no sdist can be made")
    return files


class SdistWithRust(sdist):
    """The sdist with the Rust workspace under rust/ (see the module's documentation)."""

    def make_release_tree(self, base_dir, files) -> None:
        super().make_release_tree(base_dir, files)
        for name in rust_sources():
            destination = Path(base_dir) / "rust" / name
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPOSITORY / name, destination)


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


setup(
    cmdclass={"build_py": BuildWithLibrary, "sdist": SdistWithRust},
    distclass=PlatformDistribution,
)
