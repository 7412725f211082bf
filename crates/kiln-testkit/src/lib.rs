//! What Kiln's tests share, in one dev-only crate (each test file used to carry its own
//! copy):
//! - [`compile`]: objects from the system C and C++ compilers, in a scratch directory
//!   of the build;
//! - [`binaries`]: this build's `kiln` and `kiln-executor`, and executor processes that
//!   are killed when the test ends, also when it panics;
//! - [`perf_map`]: perf maps read from a name that no earlier process with the same pid
//!   left taken;
//! - [`sysroot`]: the test programs and the foreign-architecture libraries that
//!   `scripts/test_deps.sh` puts in a private sysroot (never on the machine).
//!
//! Helpers panic with a message saying what is missing: they are for tests.

pub mod attacks;
pub mod binaries;
pub mod compile;
pub mod netns;
pub mod perf_map;
pub mod sysroot;

pub use binaries::{
    binary, c_executor_binary, cargo_build, cargo_profile, executor_binary, key_file,
    start_executor, start_listening, wine, wine_prefix, without_test_environment, ExecutorProcess,
    KillOnDrop,
};
pub use compile::{cc, cc_object, compiled_object, cxx_object, install_capi, run_ok, scratch_dir};
pub use netns::VethPair;
pub use perf_map::{
    free_perf_map, output_with_free_perf_map, perf_map_path, perf_map_was_taken, with_free_perf_map,
};
pub use sysroot::{
    aarch64_includes, aarch64_lib_dir, aarch64_sysroot, c_files, c_sources, find_c_sources,
    host_file, native_program, programs_dir, python_config_dir, python_tests_env, repository,
    skip_cross, source, NativeProgram, AARCH64_GUEST_ROOT,
};
