/* windows_tls.c: thread-locals from several threads on Windows. Each of three threads
 * counts up its own copy of `counter` (initialized to 5) and adds to its own copy of
 * `shared_tls[1]`; main's copies are untouched by them. Built by mingw-w64 gcc, the
 * variables are emulated (__emutls_get_address); by clang for x86_64-w64-windows-gnu,
 * they are native (`_tls_index`, the .tls section, IMAGE_REL_AMD64_SECREL). */
#include <stdio.h>
#include <windows.h>

static __thread int counter = 5;
_Thread_local int shared_tls[4] = {1, 2, 3, 4};

static DWORD WINAPI worker(LPVOID arg) {
    int n = (int)(INT_PTR)arg;
    for (int i = 0; i < n; i++) counter++;
    shared_tls[1] += n;
    return (DWORD)(counter * 100 + shared_tls[1]);
}

int main(void) {
    HANDLE t[3];
    DWORD codes[3];
    for (int i = 0; i < 3; i++) t[i] = CreateThread(NULL, 0, worker, (LPVOID)(INT_PTR)(i + 1), 0, NULL);
    WaitForMultipleObjects(3, t, TRUE, INFINITE);
    for (int i = 0; i < 3; i++) {
        GetExitCodeThread(t[i], &codes[i]);
        CloseHandle(t[i]);
    }
    counter += 10;
    printf("main %d %d, threads %lu %lu %lu\n", counter, shared_tls[1], codes[0], codes[1], codes[2]);
    return 0;
}
