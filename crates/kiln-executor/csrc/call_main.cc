// Calls a JIT program's `main` the way the C runtime calls a native program's: an
// exception that `main` lets escape ends in `std::terminate` here, whose handler prints
// "terminate called after throwing an instance of ..." and aborts, as natively. Without
// this frame the exception would unwind into Rust's frames, which cannot catch a foreign
// exception and abort with a message of their own. Written in C++ because only a
// `noexcept` function's unwind information stops an exception (C frames let it through).
extern "C" int kiln_call_main(int (*entry)(int, char **, char **), int argc, char **argv,
                              char **envp) noexcept {
    return entry(argc, argv, envp);
}
