// windows_exceptions.cc: C++ exceptions on Windows (mingw-w64's SEH-based unwinding: each
// function's handler and language-specific data in .xdata). thrower() throws from below
// middle(), both with an object whose destructor says it ran; main catches them, and
// host_call_and_catch (windows_host_catch.cc, a DLL of the host's own, built natively)
// calls middle() and catches what it throws: an exception that crosses JIT frames into
// the host. The status is the number of exceptions main caught.
#include <cstdio>
#include <stdexcept>
#include <string>

extern "C" int host_call_and_catch(int (*f)(int), int x);

struct Tracker {
    const char *name;
    ~Tracker() { std::printf("unwound %s\n", name); }
};

__attribute__((noinline)) int thrower(int x) {
    Tracker t{"thrower"};
    if (x > 2) throw std::runtime_error("too big: " + std::to_string(x));
    return x * 2;
}

__attribute__((noinline)) int middle(int x) {
    Tracker t{"middle"};
    return thrower(x) + 1;
}

int main() {
    int caught = 0;
    for (int i = 1; i <= 4; i++) {
        try {
            std::printf("%d -> %d\n", i, middle(i));
        } catch (const std::exception &e) {
            caught++;
            std::printf("caught: %s\n", e.what());
        }
    }
    try {
        throw 42;
    } catch (int v) {
        std::printf("int %d\n", v);
    }
    std::printf("host returned %d\n", host_call_and_catch(middle, 1));
    std::printf("host returned %d\n", host_call_and_catch(middle, 5));
    return caught;
}
