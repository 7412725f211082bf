/*
 * platform_posix.c: executor.c's platform (platform.h) on Linux — x86-64, AArch64 and
 * RISC-V 64 (the last two here under qemu-user) — with glibc.
 *
 * - Transport: TCP; each connection served in a forked process, which runs the handshake
 *   under an alarm (HANDSHAKE_SECONDS) and tells the listener through a pipe once it is
 *   authenticated; the listener kills the oldest waiting process to make room.
 * - Memory: a memfd mapped twice per reservation (the target view with each page's final
 *   permission, the working view writable). Code written is made what its target runs by
 *   mapping its pages again over themselves (qemu-user drops its translations of them)
 *   and making the instruction cache coherent: DC CVAU / IC IVAU with the line sizes of
 *   CTR_EL0 on AArch64, __riscv_flush_icache on RISC-V. PROT_BTI guards on AArch64.
 * - Symbols: dlsym in the process (with libgcc_s loaded), dladdr1 for their kind;
 *   LoadLibrary is dlopen; .eh_frame goes to libgcc's __register_frame.
 * - Static TLS and exports: a small shared object made in a memfd and dlopened.
 * - Exits and crashes: on_exit, and fatal signals on an alternate stack.
 * - Standard streams: pipes polled by a forwarder thread; input queued without blocking.
 * - Call-through stubs: the entry (assembly per architecture) and the slot's store.
 */
#define _GNU_SOURCE
#include "platform.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "wire.h"

#if defined(__aarch64__)
#define TRIPLE "aarch64-unknown-linux-gnu"
#elif defined(__x86_64__)
#define TRIPLE "x86_64-unknown-linux-gnu"
#elif defined(__riscv) && __riscv_xlen == 64
#define TRIPLE "riscv64-unknown-linux-gnu"
#include <sys/cachectl.h>
#else
#error "kiln-executor-c knows the triples of AArch64, x86-64 and RISC-V 64"
#endif

#ifndef PROT_BTI
#define PROT_BTI 0x10
#endif

const char plat_executor_name[] = "kiln-executor-c";
const char plat_triple[] = TRIPLE;

/* Everything but Windows' unwind tables. */
int plat_serves(int tag) {
    return tag != T_REGISTER_UNWIND_INFO && tag != T_DEREGISTER_UNWIND_INFO &&
           tag != T_REGISTER_FUNCTION_TABLE;
}

/* ---- the connection ------------------------------------------------------------------ */

static int sock = -1;
static int log_fd = 2; /* the executor's own stderr, kept when the program's is a pipe */
static pid_t executor_pid;
static int listener = -1;

int plat_startup(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return -1;
}

int plat_listen(const char *host, uint16_t port, int plaintext, uint16_t *bound, char *why, size_t why_len) {
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) return LISTEN_NOT_IPV4;
    if (plaintext && (ntohl(addr.sin_addr.s_addr) >> 24) != 127) return LISTEN_NOT_LOOPBACK;
    listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    /* The kernel's largest queue (net.core.somaxconn): a burst of connections completes
     * its TCP handshakes while the listener forks for the earlier ones, instead of
     * having its SYNs dropped and sent again a second later. */
    if (listener < 0 || bind(listener, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(listener, SOMAXCONN) != 0) {
        snprintf(why, why_len, "%s", strerror(errno));
        return LISTEN_FAILED;
    }
    socklen_t alen = sizeof addr;
    getsockname(listener, (struct sockaddr *)&addr, &alen);
    *bound = ntohs(addr.sin_port);
    signal(SIGCHLD, SIG_IGN); /* children are reaped by the kernel */
    return 0;
}

/* A connection's process tells the listener it is authenticated by writing its pid here. */
static int authenticated_pipe[2] = {-1, -1};

/* The processes whose connections are not authenticated yet, oldest first. */
static pid_t waiting[MAX_UNAUTHENTICATED];
static int waiting_count;

static void forget_waiting(int i) {
    memmove(waiting + i, waiting + i + 1, (size_t)(waiting_count - i - 1) * sizeof *waiting);
    waiting_count--;
}

/* Takes the pids of authenticated processes off the pipe (records of 4 bytes: a pipe
 * write of at most PIPE_BUF bytes is never split), and forgets processes that ended
 * (reaped by the kernel: kill finds no such process). */
static void update_waiting(void) {
    int32_t pids[64];
    ssize_t n;
    while ((n = read(authenticated_pipe[0], pids, sizeof pids)) > 0)
        for (ssize_t k = 0; k < n / 4; k++)
            for (int i = 0; i < waiting_count; i++)
                if (waiting[i] == pids[k]) {
                    forget_waiting(i);
                    break;
                }
    for (int i = 0; i < waiting_count;)
        if (kill(waiting[i], 0) != 0 && errno == ESRCH) forget_waiting(i);
        else i++;
}

int plat_serve(int keyed, int max_unauthenticated, char *why, size_t why_len) {
    if (pipe2(authenticated_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        snprintf(why, why_len, "pipe: %s", strerror(errno));
        return -1;
    }
    for (;;) {
        int fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* Out of descriptors or memory for a moment: the connection stays queued. */
                usleep(10000);
                continue;
            }
            snprintf(why, why_len, "accept: %s", strerror(errno));
            return -1;
        }
        if (keyed) {
            update_waiting();
            while (waiting_count >= max_unauthenticated) {
                kill(waiting[0], SIGKILL);
                forget_waiting(0);
            }
        }
        pid_t pid = fork();
        if (pid == 0) {
            close(listener);
            close(authenticated_pipe[0]);
            signal(SIGCHLD, SIG_DFL); /* the program's system() and waitpid() need it */
            /* Until the handshake is done: SIGALRM's default action ends the process. */
            if (keyed) alarm(HANDSHAKE_SECONDS);
            serve_connection((uintptr_t)fd, NULL);
        }
        if (pid < 0) fprintf(stderr, "kiln-executor-c: fork: %s\n", strerror(errno));
        else if (keyed) waiting[waiting_count++] = pid;
        close(fd);
    }
}

void plat_authenticated(void) {
    alarm(0);
    if (authenticated_pipe[1] >= 0) {
        int32_t pid = (int32_t)getpid();
        ssize_t n = write(authenticated_pipe[1], &pid, sizeof pid);
        (void)n; /* a listener gone or a full pipe: it finds the process by kill() */
        close(authenticated_pipe[1]);
        authenticated_pipe[1] = -1;
    }
}

int plat_random(uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t k = getrandom(p, n, 0);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int plat_read_private_file(const char *path, char *text, size_t size, char *why, size_t why_len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return PRIVATE_FILE_MISSING;
        snprintf(why, why_len, "%s", strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(why, why_len, "%s", strerror(errno));
        close(fd);
        return -1;
    }
    if ((st.st_mode & 077) != 0) {
        snprintf(why, why_len, "the key file is readable or writable by others (mode %o); make it 0600",
                 (unsigned)(st.st_mode & 0777));
        close(fd);
        return -1;
    }
    ssize_t n = read(fd, text, size - 1);
    close(fd);
    if (n < 0 || (size_t)n == size - 1) {
        snprintf(why, why_len, "%s", n < 0 ? strerror(errno) : "longer than a key");
        return -1;
    }
    text[n] = 0;
    return 0;
}

const char plat_private_file_note[] = "mode 0600";

int plat_write_private_file(const char *path, const char *text, char *why, size_t why_len) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(why, why_len, "%s", strerror(errno));
        return -1;
    }
    size_t n = strlen(text);
    int ok = write(fd, text, n) == (ssize_t)n;
    if (close(fd) != 0) ok = 0;
    if (!ok) {
        snprintf(why, why_len, "could not write it");
        unlink(path);
        return -1;
    }
    return 0;
}

void plat_connect(uintptr_t connection) {
    sock = (int)connection;
    executor_pid = getpid();
}

void plat_quit(int status) { _exit(status); }

uint32_t plat_process_id(void) { return (uint32_t)getpid(); }

void plat_log_write(const char *text, size_t n) {
    /* A log whose reader is gone must not end the executor: SIGPIPE is held back for
     * this write (and a pending one taken), the program's own disposition untouched. */
    sigset_t pipe_only, before;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_only, &before);
    ssize_t written = write(log_fd, text, n);
    if (written < 0 && errno == EPIPE) {
        struct timespec now = {0, 0};
        sigtimedwait(&pipe_only, NULL, &now);
    }
    pthread_sigmask(SIG_SETMASK, &before, NULL);
}

long plat_transfer(uint8_t *p, size_t n, int out) {
    ssize_t k = out ? send(sock, p, n, MSG_NOSIGNAL) : recv(sock, p, n, 0);
    if (k < 0 && errno == EINTR) return 0;
    return k > 0 ? (long)k : -1;
}

void plat_shutdown_send(void) { shutdown(sock, SHUT_WR); }

/* ---- locks and threads ----------------------------------------------------------------- */

static pthread_mutex_t locks[LOCK_COUNT] = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
                                            PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER};
static pthread_cond_t conds[COND_COUNT] = {PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER};

void plat_lock(int lock) { pthread_mutex_lock(&locks[lock]); }
void plat_unlock(int lock) { pthread_mutex_unlock(&locks[lock]); }
void plat_wait(int cond, int lock) { pthread_cond_wait(&conds[cond], &locks[lock]); }
void plat_wake_one(int cond) { pthread_cond_signal(&conds[cond]); }
void plat_wake_all(int cond) { pthread_cond_broadcast(&conds[cond]); }

struct plat_thread {
    pthread_t thread;
};

int plat_start_thread(void *(*fn)(void *), void *arg, size_t stack, struct plat_thread **joinable) {
    struct plat_thread *t = joinable ? malloc(sizeof *t) : NULL;
    if (joinable && !t) return -1;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, stack);
    pthread_attr_setdetachstate(&attr, joinable ? PTHREAD_CREATE_JOINABLE : PTHREAD_CREATE_DETACHED);
    pthread_t detached;
    int rc = pthread_create(t ? &t->thread : &detached, &attr, fn, arg);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        free(t);
        return -1;
    }
    if (joinable) *joinable = t;
    return 0;
}

void plat_join(struct plat_thread *thread) {
    pthread_join(thread->thread, NULL);
    free(thread);
}

/* Crash reports run on a stack of their own in code threads too (sigaltstack is per
 * thread), so a stack overflow reports. */
/* Static TLS blocks are the loader's: every thread has them. */
void plat_before_code(void) {}

void *plat_code_thread_enter(void) {
    void *stack = malloc(64 * 1024);
    if (stack) {
        stack_t ss = {.ss_sp = stack, .ss_size = 64 * 1024};
        sigaltstack(&ss, NULL);
    }
    return stack;
}

void plat_code_thread_left(void *room) { free(room); }

static pthread_t reading_thread;

void plat_mark_reading_thread(void) { reading_thread = pthread_self(); }
int plat_is_reading_thread(void) { return pthread_equal(pthread_self(), reading_thread); }
int plat_in_forked_child(void) { return getpid() != executor_pid; }

/* ---- the program's standard streams -------------------------------------------------- */

/* Pipes whose other ends the forwarder reads. */
static int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1}, in_pipe[2] = {-1, -1};
static atomic_int forwarding_busy;

static void *forward_output(void *unused) {
    (void)unused;
    uint8_t buf[65536];
    for (;;) {
        struct pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            return NULL;
        }
        for (int i = 0; i < 2; i++) {
            if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
            atomic_store(&forwarding_busy, 1);
            ssize_t k = read(fds[i].fd, buf, sizeof buf);
            if (k > 0) send_output(i + 1, buf, (uint32_t)k);
            atomic_store(&forwarding_busy, 0);
        }
    }
}

static int pending(int fd) {
    int n = 0;
    return ioctl(fd, FIONREAD, &n) == 0 ? n : 0;
}

void plat_flush_stdio(void) { fflush(NULL); }

/* Waits until everything the program wrote has been sent. */
void plat_drain_output(void) {
    fflush(NULL);
    for (int spins = 0; spins < 5000; spins++) {
        if (!pending(out_pipe[0]) && !pending(err_pipe[0]) && !atomic_load(&forwarding_busy)) return;
        usleep(200);
    }
}

void plat_setup_stdio(void) {
    if (out_pipe[0] >= 0) return;
    log_fd = fcntl(2, F_DUPFD_CLOEXEC, 3);
    /* Close-on-exec: a program's children must not hold the other ends (a child holding
     * stdin's write end would never see end of input). dup2 onto 0-2 clears the flag. */
    if (pipe2(out_pipe, O_CLOEXEC) || pipe2(err_pipe, O_CLOEXEC) || pipe2(in_pipe, O_CLOEXEC)) {
        logf_("kiln-executor-c: pipes: %s\n", strerror(errno));
        _exit(71);
    }
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    dup2(in_pipe[0], 0);
    /* Input is queued when the program does not read it: the serving thread never blocks. */
    fcntl(in_pipe[1], F_SETFL, fcntl(in_pipe[1], F_GETFL) | O_NONBLOCK);
    pthread_t t;
    pthread_create(&t, NULL, forward_output, NULL);
    pthread_detach(t);
}

/* Input the program has not taken yet, and whether its end has come. */
static struct writer input_queue;
static size_t input_sent;
static int input_ended;

/* Moves queued input into the stdin pipe as far as it takes it without blocking; closes
 * the pipe after the end of input. */
static void flush_input(void) {
    while (in_pipe[1] >= 0 && input_sent < input_queue.len) {
        ssize_t k = write(in_pipe[1], input_queue.p + input_sent, input_queue.len - input_sent);
        if (k <= 0) break;
        input_sent += (size_t)k;
    }
    if (input_sent == input_queue.len) input_queue.len = input_sent = 0;
    if (input_ended && input_queue.len == 0 && in_pipe[1] >= 0) {
        close(in_pipe[1]);
        in_pipe[1] = -1;
    }
}

void plat_give_input(const uint8_t *bytes, uint32_t len) {
    if (in_pipe[1] < 0 || input_ended) return;
    if (len == 0) input_ended = 1;
    else wr_raw(&input_queue, bytes, len);
    flush_input();
}

/* Waits for the connection to be readable; input the program has not taken goes into its
 * pipe meanwhile, as the pipe takes it. */
int plat_wait_request(void) {
    for (;;) {
        int queued = in_pipe[1] >= 0 && input_queue.len > input_sent;
        struct pollfd fds[2] = {{sock, POLLIN, 0}, {queued ? in_pipe[1] : -1, POLLOUT, 0}};
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (fds[1].revents) flush_input();
        if (fds[0].revents) return 0;
    }
}

/* ---- exits and crashes ----------------------------------------------------------------- */

static void report(uint8_t tag, uint32_t value) {
    uint8_t fields[4];
    put_le(fields, value, 4);
    send_report(tag, fields, sizeof fields);
}

static void on_fatal_signal(int signal) {
    /* What the program wrote before it died goes out first: the forwarder thread runs on
     * while this handler waits (a second at most) for the pipes to empty. Only
     * async-signal-safe calls here: ioctl, nanosleep, write. */
    struct timespec tick = {0, 1000000};
    for (int i = 0; i < 1000 && out_pipe[0] >= 0; i++) {
        if (!pending(out_pipe[0]) && !pending(err_pipe[0]) && !atomic_load(&forwarding_busy)) break;
        nanosleep(&tick, NULL);
    }
    if (getpid() == executor_pid) {
        /* Frames are sent whole under the send lock; a frame half sent by another thread
         * would be cut by this one, so wait (bounded) for it to finish. */
        for (int i = 0; i < 1000 && frame_in_flight(); i++) nanosleep(&tick, NULL);
        report(A_CRASHED, (uint32_t)signal);
        shutdown(sock, SHUT_WR);
    }
    raise(signal); /* SA_RESETHAND restored the default action */
}

static void on_program_exit(int status, void *unused) {
    (void)unused;
    if (getpid() != executor_pid || code_running() == 0) return;
    plat_drain_output();
    plat_lock(LOCK_SEND);
    report(A_EXITED, (uint32_t)status);
    shutdown(sock, SHUT_WR);
}

void plat_setup_crash_reports(void) {
    /* Reports go out on a stack of their own, so a stack overflow reports too. */
    static uint8_t alt_stack[64 * 1024];
    stack_t ss = {.ss_sp = alt_stack, .ss_size = sizeof alt_stack};
    sigaltstack(&ss, NULL);
    int fatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGABRT, SIGSYS};
    for (size_t i = 0; i < sizeof fatal / sizeof *fatal; i++) {
        struct sigaction sa = {0};
        sa.sa_handler = on_fatal_signal;
        sa.sa_flags = SA_RESETHAND | SA_ONSTACK | SA_NODEFER;
        sigaction(fatal[i], &sa, NULL);
    }
    on_exit(on_program_exit, NULL);
}

/* exit() runs the program's handlers (glibc's): nothing to do when main has returned. */
void plat_program_end(void) {}

/* ---- symbols and the runtime ----------------------------------------------------------- */

static void measure_vector_state(void);
extern void kiln_lazy_entry_asm(void);
static void *kiln_tls_get_addr(const uint64_t *pair);

void plat_setup_runtime(void) {
    /* The compiler's runtime is part of the process's symbols, as for a native program:
     * the unwinder, and on AArch64 the 128-bit long double helpers (__addtf3, …). */
    dlopen("libgcc_s.so.1", RTLD_NOW | RTLD_GLOBAL);
    measure_vector_state();
}

/* JIT code's __tls_get_addr is this executor's, and call-through stubs enter it here. */
static const struct runtime_symbol runtime_symbols[] = {
    {"__tls_get_addr", (void (*)(void))kiln_tls_get_addr},
    {"__kiln_lazy_entry", kiln_lazy_entry_asm},
    {"__kiln_lazy_call_failed", (void (*)(void))kiln_lazy_call_failed},
};

const struct runtime_symbol *plat_runtime_symbols(size_t *n) {
    *n = sizeof runtime_symbols / sizeof *runtime_symbols;
    return runtime_symbols;
}

void plat_lookup(void *library, void *const *libraries, int count, const char *name, uint64_t *address, uint8_t *kind) {
    (void)libraries; /* loaded RTLD_GLOBAL: the process's symbols include theirs */
    (void)count;
    void *p = dlsym(library ? library : RTLD_DEFAULT, name);
    *address = (uint64_t)(uintptr_t)p;
    *kind = 0;
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    if (p && dladdr1(p, &info, (void **)&sym, RTLD_DL_SYMENT) && sym) {
        int type = ELF64_ST_TYPE(sym->st_info);
        *kind = (type == STT_FUNC || type == STT_GNU_IFUNC) ? 1 : (type == STT_OBJECT || type == STT_TLS) ? 2 : 0;
    }
}

void *plat_load_library(const char *path, char *why, size_t why_len) {
    void *handle = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!handle) snprintf(why, why_len, "dlopen %s: %s", path, dlerror());
    return handle;
}

char **plat_environ(void) { return environ; }

void plat_finalize(uint64_t dso) {
    void (*finalize)(void *) = (void (*)(void *))dlsym(RTLD_DEFAULT, "__cxa_finalize");
    if (finalize && dso) finalize((void *)(uintptr_t)dso);
}

int plat_eh_frame(uint64_t address, int reg, char *why, size_t why_len) {
    const char *name = reg ? "__register_frame" : "__deregister_frame";
    void (*fn)(void *) = (void (*)(void *))dlsym(RTLD_DEFAULT, name);
    if (!fn) {
        /* The unwinder of C++ and of -fexceptions code: libgcc_s, loaded on first use. */
        void *libgcc = dlopen("libgcc_s.so.1", RTLD_NOW | RTLD_GLOBAL);
        if (libgcc) fn = (void (*)(void *))dlsym(libgcc, name);
    }
    if (!fn) {
        snprintf(why, why_len, "this process has no unwinder to register with (libgcc_s)");
        return -1;
    }
    fn((void *)(uintptr_t)address);
    return 0;
}

/* Windows' tables: never asked for (plat_serves). */
void *plat_add_unwind_table(const uint64_t *begin, const uint64_t *end, const uint8_t *const *info,
                            const uint32_t *len, uint32_t n, uint64_t lo, uint64_t hi, const char **bad) {
    (void)begin, (void)end, (void)info, (void)len, (void)n, (void)lo, (void)hi;
    *bad = "Windows' unwind tables are not Linux's";
    return NULL;
}

void *plat_add_function_table(const uint32_t *entries, uint32_t n, uint64_t base, const char **bad) {
    (void)entries, (void)n, (void)base;
    *bad = "Windows' unwind tables are not Linux's";
    return NULL;
}

void plat_delete_unwind_table(void *table) { (void)table; }

int plat_enter_directory(const char *dir, char *why, size_t why_len) {
    if (chdir(dir) == 0) return 0;
    snprintf(why, why_len, "cannot enter the working directory %s: %s", dir, strerror(errno));
    return -1;
}

int plat_replace_environment(char **vars, uint32_t n, char *why, size_t why_len) {
    clearenv();
    for (uint32_t i = 0; i < n; i++) {
        char *eq = strchr(vars[i], '=');
        *eq = 0;
        if (setenv(vars[i], eq + 1, 1) != 0) {
            snprintf(why, why_len, "cannot set %s: %s", vars[i], strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* ---- memory -------------------------------------------------------------------------- */

static uint64_t page_size = 4096;

uint64_t plat_page_size(void) {
    page_size = (uint64_t)sysconf(_SC_PAGESIZE);
    return page_size;
}

uint64_t plat_view_alignment(void) { return page_size; }

static int prot_of(int permission) {
    switch (permission) {
    case 0: return PROT_READ | PROT_EXEC;
    case 1: return PROT_READ;
    case 2: return PROT_READ | PROT_WRITE;
    default: return PROT_NONE;
    }
}

/* Within reach of an address in the C library. */
int plat_library_windows(uint64_t reach, uint64_t len, uint64_t window[2][2], char *why, size_t why_len) {
    (void)len, (void)why, (void)why_len;
    uint64_t anchor = (uint64_t)(uintptr_t)dlsym(RTLD_DEFAULT, "printf");
    window[0][0] = anchor > reach ? anchor - reach : 0;
    window[0][1] = anchor + reach;
    return 1;
}

intptr_t plat_new_memory(uint64_t len, char *why, size_t why_len) {
    int fd = memfd_create("kiln-code", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)len) != 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        snprintf(why, why_len, "memfd of %#llx bytes: %s", (unsigned long long)len, strerror(e));
        return -1;
    }
    return fd;
}

void *plat_map_target(intptr_t memory, uint64_t len, uint64_t hint, uint64_t lo, uint64_t hi) {
    int fd = (int)memory;
    if (hint == 0) {
        void *p = mmap(NULL, len, PROT_NONE, MAP_SHARED, fd, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    void *p = mmap((void *)(uintptr_t)hint, len, PROT_NONE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
    if (p == MAP_FAILED) {
        p = mmap((void *)(uintptr_t)hint, len, PROT_NONE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) return NULL;
    }
    uint64_t at = (uint64_t)(uintptr_t)p;
    if (at >= lo && at + len <= hi) return p;
    munmap(p, len);
    return NULL;
}

/* Hints only: Linux gives no list of free ranges. */
void *plat_map_free_range(intptr_t memory, uint64_t len, uint64_t lo, uint64_t hi) {
    (void)memory, (void)len, (void)lo, (void)hi;
    return NULL;
}

int plat_working_view(intptr_t memory, void *target, uint64_t len, uint8_t **working, char *why, size_t why_len) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, (int)memory, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        munmap(target, len);
        close((int)memory);
        snprintf(why, why_len, "working view: %s", strerror(e));
        return -1;
    }
    *working = p;
    return 0;
}

void plat_release(const struct reservation *r) {
    if (r->target) munmap((void *)(uintptr_t)r->target, r->len);
    if (r->working) munmap(r->working, r->len);
    close((int)r->memory);
}

int plat_prepare(uint64_t start, uint64_t end, int permission, char *why, size_t why_len) {
    if (mprotect((void *)(uintptr_t)start, end - start, prot_of(permission)) == 0) return 0;
    snprintf(why, why_len, "mprotect: %s", strerror(errno));
    return -1;
}

/* Makes the instruction cache coherent with the data cache for [start, end). */
static void sync_icache(uintptr_t start, uintptr_t end) {
#if defined(__aarch64__)
    uint64_t ctr;
    __asm__ volatile("mrs %0, ctr_el0" : "=r"(ctr));
    uintptr_t dline = (uintptr_t)4 << ((ctr >> 16) & 0xf);
    uintptr_t iline = (uintptr_t)4 << (ctr & 0xf);
    for (uintptr_t a = start & ~(dline - 1); a < end; a += dline)
        __asm__ volatile("dc cvau, %0" ::"r"(a) : "memory");
    __asm__ volatile("dsb ish" ::: "memory");
    for (uintptr_t a = start & ~(iline - 1); a < end; a += iline)
        __asm__ volatile("ic ivau, %0" ::"r"(a) : "memory");
    __asm__ volatile("dsb ish\n\tisb" ::: "memory");
#elif defined(__riscv)
    /* glibc's wrapper of the riscv_flush_icache system call: every hart that runs a
       thread of this process fences its instruction fetches (flags 0: all threads). */
    __riscv_flush_icache((void *)start, (void *)end, 0);
#else
    __builtin___clear_cache((char *)start, (char *)end);
#endif
}

/* Maps the pages of code [addr, addr + len) again, over themselves: the same memfd pages,
 * the same permission (PROT_BTI where guarded), in one atomic mmap that threads running
 * there do not notice. An emulator that translates code (qemu-user) sees no write through
 * the working view, and no instruction-cache maintenance: a new mapping is what makes it
 * drop the translations of code that was on these pages before (a module removed, a body
 * replaced by hot swap, and new code placed there since). Then the instruction cache. */
int plat_code_written(const struct reservation *res, uint64_t addr, uint64_t len, char *why, size_t why_len) {
    uint64_t ps = page_size;
    uint64_t first = (addr - res->target) / ps, end = (addr + len - res->target + ps - 1) / ps;
    for (uint64_t p = first; p < end;) {
        uint8_t guarded = res->pages[p] & GUARDED;
        uint64_t q = p + 1;
        while (q < end && (res->pages[q] & GUARDED) == guarded) q++;
        int prot = PROT_READ | PROT_EXEC;
#if defined(__aarch64__)
        if (guarded) prot |= PROT_BTI;
#endif
        void *at = (void *)(uintptr_t)(res->target + p * ps);
        if (mmap(at, (q - p) * ps, prot, MAP_SHARED | MAP_FIXED, (int)res->memory, (off_t)(p * ps)) == MAP_FAILED) {
            snprintf(why, why_len, "mapping code %#llx+%#llx again: %s", (unsigned long long)addr, (unsigned long long)len, strerror(errno));
            return -1;
        }
        p = q;
    }
    sync_icache((uintptr_t)addr, (uintptr_t)(addr + len));
    return 0;
}

/* Whole pages of read-execute code built for BTI are mapped guarded (PROT_BTI) on AArch64:
 * an indirect branch to anything but a landing pad traps with SIGILL. */
int plat_guard_branch_targets(struct reservation *res, uint64_t addr, uint64_t len, char *why, size_t why_len) {
#if defined(__aarch64__)
    if (mprotect((void *)(uintptr_t)addr, len, PROT_READ | PROT_EXEC | PROT_BTI) != 0) {
        snprintf(why, why_len, "guard branch targets: mprotect: %s", strerror(errno));
        return -1;
    }
    for (uint64_t p = (addr - res->target) / page_size; p < (addr + len - res->target) / page_size; p++)
        res->pages[p] |= GUARDED;
#else
    (void)res, (void)addr, (void)len, (void)why, (void)why_len;
#endif
    return 0;
}

void plat_discard(const struct reservation *res, uint64_t start, uint64_t end) {
    mprotect((void *)(uintptr_t)start, end - start, PROT_NONE);
    /* The pages' contents are discarded: they read as zeros when prepared again. */
    if (fallocate((int)res->memory, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(start - res->target), (off_t)(end - start)) != 0)
        memset(res->working + (start - res->target), 0, end - start);
}

/* ---- small shared objects: exports and static TLS -------------------------------------
 *
 * What the C runtime's loader does for libraries it loads, it does for JIT modules when
 * they come as a shared object it loads: an object made here in memory (a memfd) and
 * opened with dlopen, which holds
 * - exported definitions: absolute dynamic symbols (SHN_ABS, which glibc 2.28 and later
 *   does not relocate) at the module's addresses, opened RTLD_GLOBAL, so that libraries
 *   loaded later find them as they find a native executable's -Wl,-E exports;
 * - a static TLS block: a PT_TLS segment of the module's size, alignment and initial
 *   image, DF_STATIC_TLS, and one TPOFF dynamic relocation against it, whose relocated
 *   word is then the block's offset from the thread pointer. glibc places such a block in
 *   its static TLS surplus and copies the image into every thread, existing and future.
 * Only program headers (no sections): the loader reads nothing else. PT_GNU_STACK keeps
 * thread stacks non-executable (without it, glibc would make them executable). */
#if defined(__aarch64__)
#define SO_MACHINE EM_AARCH64
#define SO_TPOFF R_AARCH64_TLS_TPREL
#elif defined(__x86_64__)
#define SO_MACHINE EM_X86_64
#define SO_TPOFF R_X86_64_TPOFF64
#else
#define SO_MACHINE EM_RISCV
#define SO_TPOFF R_RISCV_TLS_TPREL64
#endif

static uint64_t align_up(uint64_t v, uint64_t a) { return a > 1 ? (v + a - 1) / a * a : v; }

/* Builds the object in a memfd and opens it; NULL with the reason in `why`. With
 * `tls_size`, `*tp_offset` gets the block's offset from the thread pointer. The memfd
 * stays open as long as the object (`*fd_out`): the loader knows an object by its path,
 * and a later memfd given the same /proc/self/fd/N would be taken for this one. */
static void *open_shared_object(const struct export_symbol *symbols, uint32_t n, uint64_t tls_size,
                                uint64_t tls_align, const uint8_t *image, uint64_t image_len,
                                int64_t *tp_offset, int *fd_out, char *why, size_t why_len) {
    int tls = tls_size != 0;
    uint32_t nsyms = n + 1;
    uint64_t strsz = 1;
    for (uint32_t i = 0; i < n; i++) strsz += strlen(symbols[i].name) + 1;
    int phnum = tls ? 4 : 3;
    uint64_t off_hash = sizeof(Elf64_Ehdr) + (uint64_t)phnum * sizeof(Elf64_Phdr);
    uint64_t off_sym = align_up(off_hash + 4 * (2 + 1 + (uint64_t)nsyms), 8);
    uint64_t off_str = off_sym + (uint64_t)nsyms * sizeof(Elf64_Sym);
    uint64_t off_rela = align_up(off_str + strsz, 8);
    uint64_t off_dyn = off_rela + (tls ? sizeof(Elf64_Rela) : 0);
    int ndyn = tls ? 10 : 6;
    uint64_t off_word = off_dyn + (uint64_t)ndyn * sizeof(Elf64_Dyn);
    if (tls_align == 0) tls_align = 1;
    uint64_t off_tls = align_up(off_word + 8, tls_align);
    uint64_t file_size = off_tls + (tls ? image_len : 0);
    uint8_t *f = calloc(1, file_size);
    if (!f) { snprintf(why, why_len, "out of memory for a %llu-byte object", (unsigned long long)file_size); return NULL; }
    Elf64_Ehdr *eh = (Elf64_Ehdr *)f;
    memcpy(eh->e_ident, ELFMAG, SELFMAG);
    eh->e_ident[EI_CLASS] = ELFCLASS64;
    eh->e_ident[EI_DATA] = ELFDATA2LSB;
    eh->e_ident[EI_VERSION] = EV_CURRENT;
    eh->e_type = ET_DYN;
    eh->e_machine = SO_MACHINE;
    eh->e_version = EV_CURRENT;
    eh->e_phoff = sizeof(Elf64_Ehdr);
    eh->e_ehsize = sizeof(Elf64_Ehdr);
    eh->e_phentsize = sizeof(Elf64_Phdr);
    eh->e_phnum = (uint16_t)phnum;
#if defined(__riscv)
    eh->e_flags = EF_RISCV_FLOAT_ABI_DOUBLE | EF_RISCV_RVC;
#endif
    Elf64_Phdr *ph = (Elf64_Phdr *)(f + sizeof(Elf64_Ehdr));
    uint64_t memsz = tls ? off_tls + image_len : file_size;
    ph[0] = (Elf64_Phdr){.p_type = PT_LOAD, .p_flags = PF_R | PF_W, .p_offset = 0, .p_vaddr = 0,
                         .p_paddr = 0, .p_filesz = file_size, .p_memsz = memsz, .p_align = (uint64_t)page_size};
    ph[1] = (Elf64_Phdr){.p_type = PT_DYNAMIC, .p_flags = PF_R | PF_W, .p_offset = off_dyn, .p_vaddr = off_dyn,
                         .p_paddr = off_dyn, .p_filesz = (uint64_t)ndyn * sizeof(Elf64_Dyn),
                         .p_memsz = (uint64_t)ndyn * sizeof(Elf64_Dyn), .p_align = 8};
    ph[2] = (Elf64_Phdr){.p_type = PT_GNU_STACK, .p_flags = PF_R | PF_W, .p_align = 16};
    if (tls)
        ph[3] = (Elf64_Phdr){.p_type = PT_TLS, .p_flags = PF_R, .p_offset = off_tls, .p_vaddr = off_tls,
                             .p_paddr = off_tls, .p_filesz = image_len, .p_memsz = tls_size, .p_align = tls_align};
    /* SysV hash: one bucket, the symbols chained from the last to the first. */
    uint32_t *hash = (uint32_t *)(f + off_hash);
    hash[0] = 1;
    hash[1] = nsyms;
    hash[2] = nsyms - 1;
    for (uint32_t i = 1; i < nsyms; i++) hash[3 + i] = i - 1;
    Elf64_Sym *sym = (Elf64_Sym *)(f + off_sym);
    char *str = (char *)(f + off_str);
    uint64_t at = 1;
    for (uint32_t i = 0; i < n; i++) {
        size_t len = strlen(symbols[i].name);
        memcpy(str + at, symbols[i].name, len + 1);
        sym[i + 1].st_name = (uint32_t)at;
        sym[i + 1].st_info = ELF64_ST_INFO(STB_GLOBAL, symbols[i].function ? STT_FUNC : STT_OBJECT);
        sym[i + 1].st_other = STV_DEFAULT;
        sym[i + 1].st_shndx = SHN_ABS;
        sym[i + 1].st_value = symbols[i].address;
        sym[i + 1].st_size = symbols[i].size;
        at += len + 1;
    }
    if (tls) {
        Elf64_Rela *rela = (Elf64_Rela *)(f + off_rela);
        rela->r_offset = off_word;
        rela->r_info = ELF64_R_INFO(0, SO_TPOFF);
        rela->r_addend = 0;
        memcpy(f + off_tls, image, image_len);
    }
    Elf64_Dyn *dyn = (Elf64_Dyn *)(f + off_dyn);
    int d = 0;
    dyn[d++] = (Elf64_Dyn){.d_tag = DT_HASH, .d_un.d_ptr = off_hash};
    dyn[d++] = (Elf64_Dyn){.d_tag = DT_STRTAB, .d_un.d_ptr = off_str};
    dyn[d++] = (Elf64_Dyn){.d_tag = DT_SYMTAB, .d_un.d_ptr = off_sym};
    dyn[d++] = (Elf64_Dyn){.d_tag = DT_STRSZ, .d_un.d_val = strsz};
    dyn[d++] = (Elf64_Dyn){.d_tag = DT_SYMENT, .d_un.d_val = sizeof(Elf64_Sym)};
    if (tls) {
        dyn[d++] = (Elf64_Dyn){.d_tag = DT_RELA, .d_un.d_ptr = off_rela};
        dyn[d++] = (Elf64_Dyn){.d_tag = DT_RELASZ, .d_un.d_val = sizeof(Elf64_Rela)};
        dyn[d++] = (Elf64_Dyn){.d_tag = DT_RELAENT, .d_un.d_val = sizeof(Elf64_Rela)};
        dyn[d++] = (Elf64_Dyn){.d_tag = DT_FLAGS, .d_un.d_val = DF_STATIC_TLS};
    }
    dyn[d++] = (Elf64_Dyn){.d_tag = DT_NULL};
    int fd = memfd_create("kiln-module.so", MFD_CLOEXEC);
    ssize_t written = fd < 0 ? -1 : pwrite(fd, f, file_size, 0);
    if (written != (ssize_t)file_size) {
        snprintf(why, why_len, "memfd: %s", strerror(errno));
        if (fd >= 0) close(fd);
        free(f);
        return NULL;
    }
    free(f);
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    void *handle = dlopen(path, RTLD_NOW | (n ? RTLD_GLOBAL : RTLD_LOCAL));
    if (!handle) {
        snprintf(why, why_len, "dlopen of the object made for it: %s", dlerror());
        close(fd);
        return NULL;
    }
    if (tls) {
        struct link_map *map = NULL;
        if (dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || !map) {
            snprintf(why, why_len, "dlinfo: %s", dlerror());
            dlclose(handle);
            close(fd);
            return NULL;
        }
        memcpy(tp_offset, (const void *)(map->l_addr + off_word), 8);
    }
    *fd_out = fd;
    return handle;
}


/* The loader places a block in static TLS only if its alignment is at most that of the
 * static TLS area, which is the largest of the TCB's and the executable's own PT_TLS's
 * (16 on AArch64): this thread-local, aligned like a cache line, raises it to 64 so that
 * over-aligned thread-locals of JIT code (aligned(64)) can be placed. */
static _Thread_local char static_tls_alignment[64] __attribute__((aligned(64), used));

#if defined(__riscv)
/* glibc's TLS_DTV_OFFSET: what a GOT pair's offset is biased by on RISC-V. */
#define DTV_OFFSET 0x800
#else
#define DTV_OFFSET 0
#endif

/* JIT code's __tls_get_addr (the hello's runtime symbols): the address of the variable a
 * GOT pair (module id, offset) names in the calling thread. Every block is in static
 * TLS, at one offset from the thread pointer in every thread. */
static void *kiln_tls_get_addr(const uint64_t *pair) {
    int64_t offset;
    if (!tls_block_offset(pair[0], &offset)) {
        static const char message[] = "kiln-executor-c: __tls_get_addr of a module with no TLS block\n";
        (void)!write(log_fd, message, sizeof message - 1);
        abort();
    }
    return (char *)__builtin_thread_pointer() + offset + pair[1] + DTV_OFFSET;
}

/* The object of a static TLS block, and its memfd, stay as long as the process: static
 * TLS is not given back by the loader. */
int plat_static_tls(uint64_t size, uint64_t align, const uint8_t *image, uint32_t image_len, int64_t *tp_offset,
                    char *why, size_t why_len) {
    int fd;
    return open_shared_object(NULL, 0, size, align, image, image_len, tp_offset, &fd, why, why_len) ? 0 : -1;
}

void *plat_export(const struct export_symbol *symbols, uint32_t n, char *why, size_t why_len) {
    int fd;
    return open_shared_object(symbols, n, 0, 0, NULL, 0, NULL, &fd, why, why_len);
}

/* The memfd stays open: the loader may keep the object (a library loaded later can hold
 * it), and its path must not name another object. */
void plat_unexport(void *set) { dlclose(set); }

/* ---- call-through stubs ------------------------------------------------------------------ */

#if defined(__aarch64__)
#include <linux/membarrier.h>
#include <sys/syscall.h>
/* Whether membarrier(SYNC_CORE) was registered: after a slot's store, every thread of the
 * process runs a context synchronization event before it can reach the new body. */
static int sync_core;
#endif

void plat_store_code_pointer(uint64_t slot, uint64_t target) {
    __atomic_store_n((uint64_t *)(uintptr_t)slot, target, __ATOMIC_SEQ_CST);
#if defined(__aarch64__)
    if (sync_core) syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0);
#endif
}


/* The saved registers are the calling convention's arguments, whole: the integer ones,
 * the static chain and the vector/floating-point ones (x86-64: every vector component the
 * OS enabled, with xsave; AArch64: q0-q7; RISC-V: fa0-fa7). */
#if defined(__x86_64__)
#include <cpuid.h>
/* The bytes xsave needs for every state component the OS enabled, or 0 (fxsave). */
__attribute__((visibility("hidden"), used)) uint64_t kiln_xsave_size;
static void measure_vector_state(void) {
    unsigned a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d) && (c & bit_OSXSAVE) && __get_cpuid_count(0xd, 0, &a, &b, &c, &d))
        kiln_xsave_size = b;
}
__asm__(
    ".pushsection .text.kiln_lazy_entry,\"ax\",@progbits\n"
    ".p2align 4\n"
    ".globl kiln_lazy_entry_asm\n"
    ".hidden kiln_lazy_entry_asm\n"
    ".type kiln_lazy_entry_asm, @function\n"
    "kiln_lazy_entry_asm:\n"
    "endbr64\n"
    /* 0(%rsp): the id the stub pushed; 8(%rsp): the caller's return address. */
    "push %rbp\n"
    "mov %rsp, %rbp\n"
    "push %rdi\n push %rsi\n push %rdx\n push %rcx\n push %r8\n push %r9\n push %rax\n push %r10\n"
    "mov kiln_xsave_size(%rip), %r11\n"
    "test %r11, %r11\n"
    "jz 2f\n"
    "sub %r11, %rsp\n"
    "and $-64, %rsp\n"
    "xor %eax, %eax\n"
    "mov %rax, 512(%rsp)\n mov %rax, 520(%rsp)\n mov %rax, 528(%rsp)\n mov %rax, 536(%rsp)\n"
    "mov %rax, 544(%rsp)\n mov %rax, 552(%rsp)\n mov %rax, 560(%rsp)\n mov %rax, 568(%rsp)\n"
    "mov $-1, %eax\n mov $-1, %edx\n"
    "xsave64 (%rsp)\n"
    "mov 8(%rbp), %rdi\n"
    "call kiln_lazy_resolve\n"
    "mov %rax, %r11\n"
    "mov $-1, %eax\n mov $-1, %edx\n"
    "xrstor64 (%rsp)\n"
    "jmp 3f\n"
    "2:\n"
    "sub $512, %rsp\n"
    "and $-16, %rsp\n"
    "fxsave64 (%rsp)\n"
    "mov 8(%rbp), %rdi\n"
    "call kiln_lazy_resolve\n"
    "mov %rax, %r11\n"
    "fxrstor64 (%rsp)\n"
    "3:\n"
    "lea -64(%rbp), %rsp\n"
    "pop %r10\n pop %rax\n pop %r9\n pop %r8\n pop %rcx\n pop %rdx\n pop %rsi\n pop %rdi\n"
    "pop %rbp\n"
    "add $8, %rsp\n" /* the id: the caller's return address is on top again */
    "jmp *%r11\n"
    ".size kiln_lazy_entry_asm, . - kiln_lazy_entry_asm\n"
    ".popsection\n");
#elif defined(__aarch64__)
static void measure_vector_state(void) {
    sync_core = syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0) == 0;
}
/* The id in x17 (the stub's `movz/movk x17`); x16 holds where to go. */
__asm__(
    ".pushsection .text.kiln_lazy_entry,\"ax\",%progbits\n"
    ".p2align 4\n"
    ".globl kiln_lazy_entry_asm\n"
    ".hidden kiln_lazy_entry_asm\n"
    ".type kiln_lazy_entry_asm, %function\n"
    "kiln_lazy_entry_asm:\n"
    "hint #34\n" /* bti c: reached by the common tail's br x16 */
    "stp x29, x30, [sp, #-224]!\n"
    "mov x29, sp\n"
    "stp x0, x1, [sp, #16]\n stp x2, x3, [sp, #32]\n stp x4, x5, [sp, #48]\n stp x6, x7, [sp, #64]\n"
    "stp x8, x18, [sp, #80]\n" /* x8: the indirect result; x18: gcc's static chain */
    "stp q0, q1, [sp, #96]\n stp q2, q3, [sp, #128]\n stp q4, q5, [sp, #160]\n stp q6, q7, [sp, #192]\n"
    "mov x0, x17\n"
    "bl kiln_lazy_resolve\n"
    "mov x16, x0\n"
    "ldp q0, q1, [sp, #96]\n ldp q2, q3, [sp, #128]\n ldp q4, q5, [sp, #160]\n ldp q6, q7, [sp, #192]\n"
    "ldp x8, x18, [sp, #80]\n"
    "ldp x0, x1, [sp, #16]\n ldp x2, x3, [sp, #32]\n ldp x4, x5, [sp, #48]\n ldp x6, x7, [sp, #64]\n"
    "ldp x29, x30, [sp], #224\n"
    "br x16\n"
    ".size kiln_lazy_entry_asm, . - kiln_lazy_entry_asm\n"
    ".popsection\n");
#elif defined(__riscv)
static void measure_vector_state(void) {}
/* The id in t5 (the stub's `lui/addiw t5`); t3 holds where to go. */
__asm__(
    ".pushsection .text.kiln_lazy_entry,\"ax\",@progbits\n"
    ".p2align 2\n"
    ".globl kiln_lazy_entry_asm\n"
    ".hidden kiln_lazy_entry_asm\n"
    ".type kiln_lazy_entry_asm, @function\n"
    "kiln_lazy_entry_asm:\n"
    "addi sp, sp, -144\n"
    "sd ra, 0(sp)\n sd t2, 8(sp)\n" /* t2: gcc's static chain */
    "sd a0, 16(sp)\n sd a1, 24(sp)\n sd a2, 32(sp)\n sd a3, 40(sp)\n"
    "sd a4, 48(sp)\n sd a5, 56(sp)\n sd a6, 64(sp)\n sd a7, 72(sp)\n"
    "fsd fa0, 80(sp)\n fsd fa1, 88(sp)\n fsd fa2, 96(sp)\n fsd fa3, 104(sp)\n"
    "fsd fa4, 112(sp)\n fsd fa5, 120(sp)\n fsd fa6, 128(sp)\n fsd fa7, 136(sp)\n"
    "mv a0, t5\n"
    "call kiln_lazy_resolve\n"
    "mv t3, a0\n"
    "fld fa0, 80(sp)\n fld fa1, 88(sp)\n fld fa2, 96(sp)\n fld fa3, 104(sp)\n"
    "fld fa4, 112(sp)\n fld fa5, 120(sp)\n fld fa6, 128(sp)\n fld fa7, 136(sp)\n"
    "ld a0, 16(sp)\n ld a1, 24(sp)\n ld a2, 32(sp)\n ld a3, 40(sp)\n"
    "ld a4, 48(sp)\n ld a5, 56(sp)\n ld a6, 64(sp)\n ld a7, 72(sp)\n"
    "ld ra, 0(sp)\n ld t2, 8(sp)\n"
    "addi sp, sp, 144\n"
    "jr t3\n"
    ".size kiln_lazy_entry_asm, . - kiln_lazy_entry_asm\n"
    ".popsection\n");
#endif
