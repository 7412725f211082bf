/* The GDB JIT interface (gdb's "JIT Compilation Interface"; lldb reads it too).
 *
 * Written in C for one reason: the definitions are *weak*, so that several JIT runtimes
 * in one process (Kiln, LLVM's ORC/MCJIT, Wasmtime, another copy of Kiln) each bring
 * theirs and the linker keeps one: every runtime then links into the same list, the one
 * the debugger reads. Rust has no stable weak linkage. Wasmtime's gdbjit.c does the same.
 *
 * Kiln changes the list only under its own lock (kiln-executor's debug_outputs.rs);
 * runtimes that share the list keep their own locks, as they all do today. */

#include <stdint.h>
#include <stddef.h>

typedef enum {
  JIT_NOACTION = 0,
  JIT_REGISTER_FN,
  JIT_UNREGISTER_FN
} jit_actions_t;

struct jit_code_entry {
  struct jit_code_entry *next_entry;
  struct jit_code_entry *prev_entry;
  const char *symfile_addr;
  uint64_t symfile_size;
};

struct jit_descriptor {
  uint32_t version;
  /* This type should be jit_actions_t, but we use uint32_t to be explicit about the
   * bitwidth. */
  uint32_t action_flag;
  struct jit_code_entry *relevant_entry;
  struct jit_code_entry *first_entry;
};

/* The debugger puts a breakpoint in this function. */
void __attribute__((weak, noinline, used)) __jit_debug_register_code(void) {
  __asm__ __volatile__("" ::: "memory");
}

/* The version is set statically: the debugger checks it before the first registration. */
struct jit_descriptor __attribute__((weak, used)) __jit_debug_descriptor = {1, 0, NULL, NULL};

/* The descriptor and the function the linker kept (perhaps another runtime's). */
struct jit_descriptor *kiln_gdb_jit_descriptor(void) { return &__jit_debug_descriptor; }
void kiln_gdb_jit_notify(void) { __jit_debug_register_code(); }
