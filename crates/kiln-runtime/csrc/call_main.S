/* Calls a JIT program's `main` the way the C runtime calls a native program's: an
 * exception that `main` lets escape ends in `std::terminate` here, whose handler prints
 * "terminate called after throwing an instance of ..." and aborts, as natively. Without
 * this frame the exception would unwind into Rust's frames, which cannot catch a foreign
 * exception and abort with a message of their own.
 *
 *   int kiln_call_main(int (*entry)(int, char **, char **), int argc, char **argv,
 *                      char **envp);
 *
 * This is what g++ -O2 makes of a `noexcept` function that calls `entry` (an LSDA with an
 * empty call-site table: the C++ personality calls `std::terminate` for any exception
 * that reaches the frame), with one change: the personality routine is read through
 * `kiln_cxx_personality`, a word the runtime fills with `__gxx_personality_v0`'s address
 * when the C++ library is loaded (runtime.rs, `call_main`). Written in C++ the frame would
 * make every Kiln process load libstdc++ at start (its symbol relocations alone cost more
 * than the rest of the dynamic loader's work for `kiln`); written this way, a C program
 * never loads it, and a C++ program, which loads it anyway, gets the native behaviour.
 * While the word is 0 the unwinder treats the frame as having no personality; no C++
 * exception can be thrown then (there is no C++ runtime to throw it). */

#if defined(__x86_64__) || defined(__aarch64__)

        .section .data.kiln_cxx_personality,"aw",@progbits
        .p2align 3
        .globl  kiln_cxx_personality
        .hidden kiln_cxx_personality
        .type   kiln_cxx_personality, @object
        .size   kiln_cxx_personality, 8
kiln_cxx_personality:
        .quad   0

        .text
        .p2align 4
        .globl  kiln_call_main
        .hidden kiln_call_main
        .type   kiln_call_main, @function
kiln_call_main:
        .cfi_startproc
        /* 0x9b: indirect | pcrel | sdata4 (the word holds the routine's address). */
        .cfi_personality 0x9b, kiln_cxx_personality
        .cfi_lsda 0x1b, .Lkiln_call_main_lsda
#if defined(__x86_64__)
        subq    $8, %rsp
        .cfi_def_cfa_offset 16
        movq    %rdi, %rax
        movl    %esi, %edi
        movq    %rdx, %rsi
        movq    %rcx, %rdx
        call    *%rax
        addq    $8, %rsp
        .cfi_def_cfa_offset 8
        ret
#else
        stp     x29, x30, [sp, #-16]!
        .cfi_def_cfa_offset 16
        .cfi_offset 29, -16
        .cfi_offset 30, -8
        mov     x29, sp
        mov     x16, x0
        mov     w0, w1
        mov     x1, x2
        mov     x2, x3
        blr     x16
        ldp     x29, x30, [sp], #16
        .cfi_restore 30
        .cfi_restore 29
        .cfi_def_cfa_offset 0
        ret
#endif
        .cfi_endproc
        .size   kiln_call_main, .-kiln_call_main

        /* The LSDA: no landing-pad base, no type table, an empty call-site table. */
        .section .gcc_except_table,"a",@progbits
.Lkiln_call_main_lsda:
        .byte   0xff
        .byte   0xff
        .byte   0x1
        .uleb128 0

#endif

        .section .note.GNU-stack,"",@progbits
