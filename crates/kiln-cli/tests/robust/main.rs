//! `kiln run` with what users and other users put in its way, in one test binary: arguments
//! and paths that are not UTF-8, inputs that are not regular files, a perf map planted
//! by another user, and the launchers' cache.

mod bytes_paths;
mod launcher_cache;
mod perf_map;
mod special_inputs;
