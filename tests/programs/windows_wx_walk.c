/* windows_wx_walk.c: walks the process's address space with VirtualQuery, from main and
 * from a second thread, and counts committed regions that are writable and executable at
 * once (PAGE_EXECUTE_READWRITE, PAGE_EXECUTE_WRITECOPY); it also checks that its own code
 * (main's page) was found, executable and not writable. Exit status 0 when no region is
 * both, 1 otherwise (each such region printed). */
#include <stdio.h>
#include <windows.h>

static int writable_executable(DWORD protect) {
    DWORD p = protect & 0xff;
    return p == PAGE_EXECUTE_READWRITE || p == PAGE_EXECUTE_WRITECOPY;
}

static int executable(DWORD protect) {
    DWORD p = protect & 0xff;
    return p == PAGE_EXECUTE || p == PAGE_EXECUTE_READ || writable_executable(protect);
}

/* Returns the number of writable and executable regions; `*own_code` is set when the
 * region holding `code` was found executable and not writable. */
static int walk(const char *who, const void *code, int *own_code) {
    MEMORY_BASIC_INFORMATION m;
    const char *p = NULL;
    int regions = 0, exec = 0, both = 0;
    while (VirtualQuery(p, &m, sizeof m) == sizeof m) {
        const char *base = m.BaseAddress, *end = base + m.RegionSize;
        if (m.State == MEM_COMMIT) {
            regions++;
            exec += executable(m.Protect);
            if (writable_executable(m.Protect)) {
                both++;
                printf("%s: writable and executable: %p-%p (protect %#lx, type %#lx)\n", who, (void *)base, (void *)end,
                       (unsigned long)m.Protect, (unsigned long)m.Type);
            }
            if ((const char *)code >= base && (const char *)code < end)
                *own_code = executable(m.Protect) && !writable_executable(m.Protect);
        }
        if (end <= p) break;
        p = end;
    }
    printf("%s: %d committed regions, %d executable, %d writable and executable\n", who, regions, exec, both);
    return both;
}

static int thread_found;
static int thread_own_code;

static DWORD WINAPI second_thread(void *arg) {
    (void)arg;
    thread_found = walk("thread", (const void *)second_thread, &thread_own_code);
    return 0;
}

int main(void) {
    HANDLE t = CreateThread(NULL, 0, second_thread, NULL, 0, NULL);
    if (!t) return 2;
    WaitForSingleObject(t, INFINITE);
    CloseHandle(t);
    int own_code = 0;
    int found = walk("main", (const void *)main, &own_code);
    printf("own code found executable and not writable: main %s, thread %s\n", own_code ? "yes" : "no",
           thread_own_code ? "yes" : "no");
    fflush(stdout);
    return found + thread_found == 0 && own_code && thread_own_code ? 0 : 1;
}
