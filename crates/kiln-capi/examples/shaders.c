/* shaders.c: the shader pattern from C with LLVM-C and Kiln. Each "shader" is a module
 * built with LLVM-C's IR builder, compiled by its own MCJIT engine whose memory manager
 * is Kiln's (kiln_mcjit_create_memory_manager); the engine, module and context are
 * disposed once the function's address is known, and the code lives on in Kiln's shared
 * slabs until kiln_module_code_free.
 *
 *   shaders N [kiln|llvm]   kiln (default): engines disposed, code in Kiln
 *                           llvm: LLVM's own memory manager, one engine kept per module
 * Prints the resident bytes per module (RSS growth / N) and checks every shader. */
#include <llvm-c/Analysis.h>
#include <llvm-c/Core.h>
#include <llvm-c/ExecutionEngine.h>
#include <llvm-c/Target.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "kiln.h"

/* shader_i(x) = sum over k < x of (k * (i + 1)) + i, as a loop. */
static LLVMModuleRef build_shader(LLVMContextRef ctx, int i, char *name)
{
    LLVMModuleRef m = LLVMModuleCreateWithNameInContext(name, ctx);
    LLVMTypeRef i32 = LLVMInt32TypeInContext(ctx);
    LLVMTypeRef fn_type = LLVMFunctionType(i32, &i32, 1, 0);
    LLVMValueRef f = LLVMAddFunction(m, name, fn_type);
    LLVMBuilderRef b = LLVMCreateBuilderInContext(ctx);
    LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(ctx, f, "entry");
    LLVMBasicBlockRef loop = LLVMAppendBasicBlockInContext(ctx, f, "loop");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(ctx, f, "done");
    LLVMPositionBuilderAtEnd(b, entry);
    LLVMValueRef zero = LLVMConstInt(i32, 0, 0);
    LLVMValueRef start = LLVMBuildICmp(b, LLVMIntSGT, LLVMGetParam(f, 0), zero, "start");
    LLVMBuildCondBr(b, start, loop, done);
    LLVMPositionBuilderAtEnd(b, loop);
    LLVMValueRef k = LLVMBuildPhi(b, i32, "k");
    LLVMValueRef acc = LLVMBuildPhi(b, i32, "acc");
    LLVMValueRef term = LLVMBuildMul(b, k, LLVMConstInt(i32, (unsigned)(i + 1), 0), "term");
    LLVMValueRef acc2 = LLVMBuildAdd(b, acc, term, "acc2");
    LLVMValueRef k2 = LLVMBuildAdd(b, k, LLVMConstInt(i32, 1, 0), "k2");
    LLVMValueRef more = LLVMBuildICmp(b, LLVMIntSLT, k2, LLVMGetParam(f, 0), "more");
    LLVMBuildCondBr(b, more, loop, done);
    LLVMValueRef k_in[2] = {zero, k2}, acc_in[2] = {zero, acc2};
    LLVMBasicBlockRef from[2] = {entry, loop};
    LLVMAddIncoming(k, k_in, from, 2);
    LLVMAddIncoming(acc, acc_in, from, 2);
    LLVMPositionBuilderAtEnd(b, done);
    LLVMValueRef result = LLVMBuildPhi(b, i32, "result");
    LLVMValueRef r_in[2] = {zero, acc2};
    LLVMAddIncoming(result, r_in, from, 2);
    LLVMBuildRet(b, LLVMBuildAdd(b, result, LLVMConstInt(i32, (unsigned)i, 0), "r"));
    LLVMDisposeBuilder(b);
    char *error = NULL;
    if (LLVMVerifyModule(m, LLVMReturnStatusAction, &error)) {
        fprintf(stderr, "invalid module: %s\n", error);
        exit(1);
    }
    LLVMDisposeMessage(error);
    return m;
}

static int expected(int i, int x)
{
    int s = 0;
    for (int k = 0; k < x; k++) s += k * (i + 1);
    return s + i;
}

static long resident_bytes(void)
{
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%ld %ld", &pages, &resident) != 2) exit(1);
    fclose(f);
    return resident * sysconf(_SC_PAGESIZE);
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    int use_kiln = argc < 3 || strcmp(argv[2], "kiln") == 0;
    LLVMLinkInMCJIT();
    LLVMInitializeNativeTarget();
    LLVMInitializeNativeAsmPrinter();
    kiln_mcjit *mcjit = NULL;
    kiln_error *e = NULL;
    if (kiln_mcjit_create(&mcjit, &e) != KILN_OK) {
        fprintf(stderr, "kiln_mcjit_create: %s\n", kiln_error_message(e));
        return 1;
    }
    int (**fns)(int) = calloc((size_t)n, sizeof *fns);
    kiln_module_code **codes = calloc((size_t)n, sizeof *codes);
    LLVMExecutionEngineRef *kept = calloc((size_t)n, sizeof *kept);
    LLVMContextRef *contexts = calloc((size_t)n, sizeof *contexts);
    /* Warm-up: LLVM's own one-time allocations are not the modules'. */
    long before = 0;
    for (int i = -1; i < n; i++) {
        int index = i < 0 ? 0 : i;
        char name[32];
        snprintf(name, sizeof name, "shader_%d", index);
        LLVMContextRef ctx = LLVMContextCreate();
        LLVMModuleRef m = build_shader(ctx, index, name);
        struct LLVMMCJITCompilerOptions options;
        LLVMInitializeMCJITCompilerOptions(&options, sizeof options);
        options.OptLevel = 2;
        kiln_module_code *code = NULL;
        if (use_kiln)
            options.MCJMM = (LLVMMCJITMemoryManagerRef)kiln_mcjit_create_memory_manager(mcjit, &code);
        LLVMExecutionEngineRef engine;
        char *error = NULL;
        if (LLVMCreateMCJITCompilerForModule(&engine, m, &options, sizeof options, &error)) {
            fprintf(stderr, "engine: %s\n", error);
            return 1;
        }
        uint64_t address = LLVMGetFunctionAddress(engine, name);
        if (address == 0 || (code && kiln_module_code_error(code))) {
            fprintf(stderr, "%s: no code (%s)\n", name, code ? kiln_module_code_error(code) : "?");
            return 1;
        }
        int (*f)(int) = (int (*)(int))(uintptr_t)address;
        if (use_kiln) {
            LLVMDisposeExecutionEngine(engine); /* disposes the module too */
            LLVMContextDispose(ctx);
        }
        if (i < 0) { /* warm-up module */
            if (f(10) != expected(0, 10)) return 1;
            if (use_kiln) kiln_module_code_free(code);
            else { LLVMDisposeExecutionEngine(engine); LLVMContextDispose(ctx); }
            before = resident_bytes();
            continue;
        }
        fns[i] = f;
        codes[i] = code;
        kept[i] = use_kiln ? NULL : engine;
        contexts[i] = use_kiln ? NULL : ctx;
    }
    long after = resident_bytes();
    for (int i = 0; i < n; i++)
        if (fns[i](10) != expected(i, 10)) {
            fprintf(stderr, "shader %d: %d, expected %d\n", i, fns[i](10), expected(i, 10));
            return 1;
        }
    uint64_t live = 0, resident = 0;
    kiln_mcjit_memory(mcjit, &live, &resident);
    printf("%d shaders ok (%s): %.1f KB resident per module; Kiln: %llu live allocations\n", n,
           use_kiln ? "engines disposed, code in Kiln" : "one MCJIT engine per module kept",
           (double)(after - before) / n / 1000.0, (unsigned long long)live);
    for (int i = 0; i < n; i++) {
        kiln_module_code_free(codes[i]);
        if (kept[i]) {
            LLVMDisposeExecutionEngine(kept[i]);
            LLVMContextDispose(contexts[i]);
        }
    }
    kiln_mcjit_memory(mcjit, &live, NULL);
    if (live != 0) {
        fprintf(stderr, "%llu allocations left after freeing every module\n", (unsigned long long)live);
        return 1;
    }
    printf("all freed\n");
    kiln_mcjit_dispose(mcjit);
    free(fns);
    free(codes);
    free(kept);
    free(contexts);
    return 0;
}
