/*
 * What both of executor-c's executors do alike for requests that run JIT code: the checks
 * and parsing of Call and RunMain, the lists of RunInitializers and RunFinalizers, and a
 * job's answer. Included by each after it defines: struct code_job (id, tag, address,
 * args, list, n, argv, argc), empty_argv, running_code, main_running, drain_output(); it
 * starts a job with the platform's start_job() and new_job() (declared below).
 */
#ifndef KILN_EXECUTOR_CODE_REQUESTS_H
#define KILN_EXECUTOR_CODE_REQUESTS_H

static void start_job(struct code_job *job);
static struct code_job *new_job(uint32_t id, uint8_t tag);

/* Checks that every address of a list lies in reserved memory; answers if not. */
static int all_code(uint32_t id, const uint64_t *functions, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (!runnable(functions[i])) {
            reply_error(id, "%#llx is not code this executor prepared to run", (unsigned long long)functions[i]);
            return 0;
        }
    return 1;
}

static uint64_t *rd_addresses(struct reader *r, uint32_t *n) {
    *n = rd_count(r, 8, "functions");
    uint64_t *list = calloc(*n ? *n : 1, sizeof *list);
    if (!list) { r->bad = "memory"; return NULL; }
    for (uint32_t i = 0; i < *n; i++) list[i] = rd_u64(r, "function");
    return list;
}

static void free_job(struct code_job *job) {
    for (int i = 0; job->argv && i < job->argc; i++) free(job->argv[i]);
    free(job->argv);
    free(job->list);
    free(job);
}

/* After the job's code: its answer, once nothing of it runs. */
static void finish_job(struct code_job *job, uint64_t value) {
    drain_output();
    /* Not running any more before the answer: a Shutdown sent after it is served. */
    atomic_fetch_sub(&running_code, 1);
    if (job->tag == T_RUN_MAIN) atomic_store(&main_running, 0);
    if (job->tag == T_CALL || job->tag == T_RUN_MAIN) reply_value(job->id, value);
    else reply_simple(job->id, A_OK);
    free_job(job);
}

static void do_call(uint32_t id, struct reader *r) {
    uint64_t address = rd_u64(r, "address");
    uint32_t n = rd_count(r, 8, "arguments");
    if (n > 6) return reply_error(id, "Call takes at most 6 arguments, not %u", n);
    struct code_job *job = new_job(id, T_CALL);
    job->address = address;
    for (uint32_t i = 0; i < n; i++) job->args[i] = rd_u64(r, "argument");
    if (r->bad || r->left) {
        reply_error(id, "malformed Call: %s", r->bad ? r->bad : "trailing bytes");
        free_job(job);
    } else if (!runnable(address)) {
        reply_error(id, "%#llx is not code this executor prepared to run", (unsigned long long)address);
        free_job(job);
    } else {
        start_job(job);
    }
}

static void do_run_main(uint32_t id, struct reader *r) {
    struct code_job *job = new_job(id, T_RUN_MAIN);
    job->address = rd_u64(r, "address");
    uint32_t n = rd_count(r, 4, "argv");
    job->argv = calloc((size_t)n + 1, sizeof *job->argv);
    for (uint32_t i = 0; job->argv && i < n; i++) job->argv[i] = rd_string(r, "argument");
    job->argc = job->argv ? (int)n : 0;
    if (!job->argv || r->bad || r->left) {
        reply_error(id, "malformed RunMain: %s", r->bad ? r->bad : "trailing bytes");
    } else if (!runnable(job->address)) {
        reply_error(id, "main at %#llx is not code this executor prepared to run", (unsigned long long)job->address);
    } else if (atomic_exchange(&main_running, 1)) {
        reply_error(id, "main is running");
    } else {
        return start_job(job);
    }
    free_job(job);
}

#endif
