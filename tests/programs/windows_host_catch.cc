// windows_host_catch.cc: the host's side of windows_exceptions.cc, a DLL built natively
// (x86_64-w64-mingw32-g++ -shared): it calls the function it is given and catches what
// that throws.
#include <cstdio>
#include <exception>

extern "C" __declspec(dllexport) int host_call_and_catch(int (*f)(int), int x) {
    try {
        return f(x);
    } catch (const std::exception &e) {
        std::printf("host caught: %s\n", e.what());
        return -1;
    }
}
