/* llvm_queries.c: the pattern of a database's query JIT (PostgreSQL's llvmjit), from C,
 * with LLVM 16's C API: each "query" is a module of its own, built with LLVM-C's IR
 * builder and emitted to an ELF object in memory by one target machine
 * (LLVMTargetMachineEmitToMemoryBuffer); the object is then linked, looked up and called,
 * by Kiln (kiln_add_object lending the buffer, kiln_link, kiln_lookup) or by LLVM's own
 * LLJIT through LLVM-C (LLVMOrcLLJITAddObjectFile, LLVMOrcLLJITLookup). The LLVM context
 * and module are disposed as soon as the object is emitted; the code outlives them.
 *
 *   llvm_queries kiln|lljit N
 *
 * 1. kept: N objects emitted first and copied to memory kept to the end (so that neither
 *    linker's count gains or loses the objects' bytes), then each linked + looked up
 *    (timed) and kept; the resident bytes per module are the process's growth over the
 *    links / N; every query is called and checked.
 * 2. remove cycle: N times in turn, emit, link, look up, call, remove (kiln_remove_module;
 *    a resource tracker per module on the LLJIT side); the growth of the resident bytes
 *    from the first tenth to the end.
 *
 * Prints "queries ok" and one line "RESULT mode=... modules=N link_lookup_us=...
 * resident_kb=... cycle_growth_kb=..." for the benchmark to read. */
#include <llvm-c/Analysis.h>
#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "kiln.h"

/* query_i(x) = |sum over k < x of k * (i + 1) - 1000| + i: a loop and a call of the C
 * library's labs, resolved in this process by the linker. */
static LLVMModuleRef build_query(LLVMContextRef ctx, int i, const char *name)
{
    LLVMModuleRef m = LLVMModuleCreateWithNameInContext(name, ctx);
    LLVMTypeRef i64 = LLVMInt64TypeInContext(ctx);
    LLVMTypeRef fn_type = LLVMFunctionType(i64, &i64, 1, 0);
    LLVMValueRef f = LLVMAddFunction(m, name, fn_type);
    LLVMValueRef labs_fn = LLVMAddFunction(m, "labs", fn_type);
    LLVMBuilderRef b = LLVMCreateBuilderInContext(ctx);
    LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(ctx, f, "entry");
    LLVMBasicBlockRef loop = LLVMAppendBasicBlockInContext(ctx, f, "loop");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(ctx, f, "done");
    LLVMPositionBuilderAtEnd(b, entry);
    LLVMValueRef zero = LLVMConstInt(i64, 0, 0);
    LLVMValueRef start = LLVMBuildICmp(b, LLVMIntSGT, LLVMGetParam(f, 0), zero, "start");
    LLVMBuildCondBr(b, start, loop, done);
    LLVMPositionBuilderAtEnd(b, loop);
    LLVMValueRef k = LLVMBuildPhi(b, i64, "k");
    LLVMValueRef acc = LLVMBuildPhi(b, i64, "acc");
    LLVMValueRef term = LLVMBuildMul(b, k, LLVMConstInt(i64, (unsigned long long)(i + 1), 0), "term");
    LLVMValueRef acc2 = LLVMBuildAdd(b, acc, term, "acc2");
    LLVMValueRef k2 = LLVMBuildAdd(b, k, LLVMConstInt(i64, 1, 0), "k2");
    LLVMValueRef more = LLVMBuildICmp(b, LLVMIntSLT, k2, LLVMGetParam(f, 0), "more");
    LLVMBuildCondBr(b, more, loop, done);
    LLVMValueRef k_in[2] = {zero, k2}, acc_in[2] = {zero, acc2};
    LLVMBasicBlockRef from[2] = {entry, loop};
    LLVMAddIncoming(k, k_in, from, 2);
    LLVMAddIncoming(acc, acc_in, from, 2);
    LLVMPositionBuilderAtEnd(b, done);
    LLVMValueRef sum = LLVMBuildPhi(b, i64, "sum");
    LLVMValueRef s_in[2] = {zero, acc2};
    LLVMAddIncoming(sum, s_in, from, 2);
    LLVMValueRef shifted = LLVMBuildSub(b, sum, LLVMConstInt(i64, 1000, 0), "shifted");
    LLVMValueRef magnitude = LLVMBuildCall2(b, fn_type, labs_fn, &shifted, 1, "magnitude");
    LLVMBuildRet(b, LLVMBuildAdd(b, magnitude, LLVMConstInt(i64, (unsigned long long)i, 0), "r"));
    LLVMDisposeBuilder(b);
    char *error = NULL;
    if (LLVMVerifyModule(m, LLVMReturnStatusAction, &error)) {
        fprintf(stderr, "invalid module: %s\n", error);
        exit(1);
    }
    LLVMDisposeMessage(error);
    return m;
}

static long expected(int i, long x)
{
    long s = 0;
    for (long k = 0; k < x; k++) s += k * (i + 1);
    return labs(s - 1000) + i;
}

static long resident_bytes(void)
{
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%ld %ld", &pages, &resident) != 2) exit(1);
    fclose(f);
    return resident * sysconf(_SC_PAGESIZE);
}

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static LLVMTargetMachineRef machine;
/* Phase 1: the objects' bytes are the program's, kept to the end. */
static int module_bytes_kept;

/* Query i, named `prefix`_i, as an ELF object in memory; its context and module are gone
 * on return. */
static LLVMMemoryBufferRef emit(const char *prefix, int i, char *name, size_t name_size)
{
    snprintf(name, name_size, "%s_%d", prefix, i);
    LLVMContextRef ctx = LLVMContextCreate();
    LLVMModuleRef m = build_query(ctx, i, name);
    char *error = NULL;
    LLVMMemoryBufferRef object = NULL;
    if (LLVMTargetMachineEmitToMemoryBuffer(machine, m, LLVMObjectFile, &error, &object)) {
        fprintf(stderr, "%s: emit: %s\n", name, error);
        exit(1);
    }
    LLVMDisposeModule(m);
    LLVMContextDispose(ctx);
    return object;
}

/* kiln_add_object's release callback: Kiln is done with the lent bytes. */
static void dispose_buffer(void *buffer)
{
    LLVMDisposeMemoryBuffer((LLVMMemoryBufferRef)buffer);
}

/* For bytes the program keeps itself. */
static void keep_bytes(void *unused)
{
    (void)unused;
}

static void kiln_check(enum kiln_status status, kiln_error *e, const char *what, const char *name)
{
    if (status != KILN_OK) {
        fprintf(stderr, "%s %s: %s\n", what, name, kiln_error_message(e));
        exit(1);
    }
}

static void llvm_check(LLVMErrorRef e, const char *what, const char *name)
{
    if (e) {
        char *message = LLVMGetErrorMessage(e);
        fprintf(stderr, "%s %s: %s\n", what, name, message);
        LLVMDisposeErrorMessage(message);
        exit(1);
    }
}

struct linker {
    int kiln;
    kiln_session *session;
    uint64_t library;
    LLVMOrcLLJITRef jit;
    LLVMOrcJITDylibRef dylib;
};

/* Links `object` (taking it), looks `name` up: its address, and what removes it. */
static uint64_t link_one(struct linker *l, LLVMMemoryBufferRef object, const char *name,
                         kiln_module **module, LLVMOrcResourceTrackerRef *tracker)
{
    uint64_t address = 0;
    if (l->kiln) {
        kiln_error *e = NULL;
        /* A buffer over bytes the program keeps (phase 1) is the program's to free;
         * LLVM's own is lent and disposed when Kiln is done with it. */
        int owned = LLVMGetBufferStart(object) != NULL && tracker == NULL && module_bytes_kept;
        kiln_check(kiln_add_object(l->session, l->library, name, LLVMGetBufferStart(object),
                                   LLVMGetBufferSize(object), owned ? keep_bytes : dispose_buffer,
                                   owned ? NULL : object, &e),
                   e, "kiln_add_object", name);
        if (owned) LLVMDisposeMemoryBuffer(object);
        kiln_check(kiln_link(l->session, l->library, module, &e), e, "kiln_link", name);
        kiln_check(kiln_lookup(l->session, l->library, name, &address, &e), e, "kiln_lookup", name);
    } else {
        if (tracker) {
            *tracker = LLVMOrcJITDylibCreateResourceTracker(l->dylib);
            llvm_check(LLVMOrcLLJITAddObjectFileWithRT(l->jit, *tracker, object),
                       "LLVMOrcLLJITAddObjectFileWithRT", name);
        } else {
            llvm_check(LLVMOrcLLJITAddObjectFile(l->jit, l->dylib, object),
                       "LLVMOrcLLJITAddObjectFile", name);
        }
        LLVMOrcExecutorAddress found = 0;
        llvm_check(LLVMOrcLLJITLookup(l->jit, &found, name), "LLVMOrcLLJITLookup", name);
        address = found;
    }
    return address;
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[1], "kiln") != 0 && strcmp(argv[1], "lljit") != 0)) {
        fprintf(stderr, "usage: llvm_queries kiln|lljit N\n");
        return 2;
    }
    struct linker l = {.kiln = strcmp(argv[1], "kiln") == 0};
    int n = atoi(argv[2]);
    if (n < 10) n = 10;
    LLVMInitializeNativeTarget();
    LLVMInitializeNativeAsmPrinter();
    char *triple = LLVMGetDefaultTargetTriple();
    LLVMTargetRef target;
    char *error = NULL;
    if (LLVMGetTargetFromTriple(triple, &target, &error)) {
        fprintf(stderr, "target %s: %s\n", triple, error);
        return 1;
    }
    machine = LLVMCreateTargetMachine(target, triple, "", "", LLVMCodeGenLevelDefault,
                                      LLVMRelocPIC, LLVMCodeModelDefault);
    if (l.kiln) {
        kiln_error *e = NULL;
        kiln_check(kiln_session_create(NULL, &l.session, &e), e, "kiln_session_create", "");
        l.library = kiln_main_library(l.session);
        kiln_check(kiln_add_process_symbols(l.session, l.library, &e), e,
                   "kiln_add_process_symbols", "");
    } else {
        llvm_check(LLVMOrcCreateLLJIT(&l.jit, LLVMOrcCreateLLJITBuilder()), "LLVMOrcCreateLLJIT", "");
        l.dylib = LLVMOrcLLJITGetMainJITDylib(l.jit);
        LLVMOrcDefinitionGeneratorRef process = NULL;
        llvm_check(LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(
                       &process, LLVMOrcLLJITGetGlobalPrefix(l.jit), NULL, NULL),
                   "process symbols", "");
        LLVMOrcJITDylibAddGenerator(l.dylib, process);
    }
    char name[32];
    /* Warm-up: each linker's one-time allocations are not the modules'. */
    {
        LLVMMemoryBufferRef object = emit("warm", n + 1, name, sizeof name);
        kiln_module *module = NULL;
        LLVMOrcResourceTrackerRef tracker = NULL;
        uint64_t address = link_one(&l, object, name, &module, &tracker);
        if (((long (*)(long))(uintptr_t)address)(10) != expected(n + 1, 10)) return 1;
        if (l.kiln) {
            kiln_error *e = NULL;
            kiln_check(kiln_remove_module(l.session, module, &e), e, "kiln_remove_module", name);
            kiln_module_release(module);
        } else {
            llvm_check(LLVMOrcResourceTrackerRemove(tracker), "remove", name);
            LLVMOrcReleaseResourceTracker(tracker);
        }
    }

    /* 1. kept */
    char **bytes = calloc((size_t)n, sizeof *bytes);
    size_t *sizes = calloc((size_t)n, sizeof *sizes);
    long (**queries)(long) = calloc((size_t)n, sizeof *queries);
    kiln_module **modules = calloc((size_t)n, sizeof *modules);
    for (int i = 0; i < n; i++) {
        LLVMMemoryBufferRef object = emit("query", i, name, sizeof name);
        sizes[i] = LLVMGetBufferSize(object);
        bytes[i] = malloc(sizes[i]);
        memcpy(bytes[i], LLVMGetBufferStart(object), sizes[i]);
        LLVMDisposeMemoryBuffer(object);
    }
    module_bytes_kept = 1;
    long before = resident_bytes();
    double linking = 0;
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "query_%d", i);
        double t = now_us();
        /* Over the kept bytes, not copying them (LLJIT takes the buffer, not the bytes). */
        LLVMMemoryBufferRef object =
            LLVMCreateMemoryBufferWithMemoryRange(bytes[i], sizes[i], name, 0);
        uint64_t address = link_one(&l, object, name, &modules[i], NULL);
        linking += now_us() - t;
        queries[i] = (long (*)(long))(uintptr_t)address;
    }
    long after = resident_bytes();
    module_bytes_kept = 0;
    for (int i = 0; i < n; i++)
        if (queries[i](10) != expected(i, 10) || queries[i](100) != expected(i, 100)) {
            fprintf(stderr, "query %d: %ld, expected %ld\n", i, queries[i](10), expected(i, 10));
            return 1;
        }

    /* 2. remove cycle: beside the kept modules, each linked, called and removed in turn */
    long tenth = 0;
    for (int i = 0; i < n; i++) {
        if (i == n / 10) tenth = resident_bytes();
        LLVMMemoryBufferRef object = emit("cycle", i, name, sizeof name);
        kiln_module *module = NULL;
        LLVMOrcResourceTrackerRef tracker = NULL;
        uint64_t address = link_one(&l, object, name, &module, &tracker);
        if (((long (*)(long))(uintptr_t)address)(10) != expected(i, 10)) {
            fprintf(stderr, "%s: wrong result\n", name);
            return 1;
        }
        if (l.kiln) {
            kiln_error *e = NULL;
            kiln_check(kiln_remove_module(l.session, module, &e), e, "kiln_remove_module", name);
            kiln_module_release(module);
        } else {
            llvm_check(LLVMOrcResourceTrackerRemove(tracker), "LLVMOrcResourceTrackerRemove", name);
            LLVMOrcReleaseResourceTracker(tracker);
        }
    }
    long end = resident_bytes();
    printf("queries ok: %d modules linked by %s\n", n, l.kiln ? "Kiln" : "LLJIT");
    printf("RESULT mode=%s modules=%d link_lookup_us=%.2f resident_kb=%.2f "
           "cycle_growth_kb=%.1f\n",
           argv[1], n, linking / n, (double)(after - before) / n / 1000.0,
           (double)(end - tenth) / 1000.0);
    /* Kiln: every kept module freed, nothing left behind. */
    if (l.kiln) {
        for (int i = 0; i < n; i++) {
            kiln_error *e = NULL;
            kiln_check(kiln_remove_module(l.session, modules[i], &e), e, "kiln_remove_module",
                       "query");
            kiln_module_release(modules[i]);
        }
        kiln_session_dispose(l.session);
    } else {
        llvm_check(LLVMOrcDisposeLLJIT(l.jit), "LLVMOrcDisposeLLJIT", "");
    }
    for (int i = 0; i < n; i++) free(bytes[i]);
    free(bytes);
    free(sizes);
    free(queries);
    free(modules);
    LLVMDisposeTargetMachine(machine);
    LLVMDisposeMessage(triple);
    return 0;
}
