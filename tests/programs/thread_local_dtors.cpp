// C++ thread_local objects with constructors and destructors, used from main and from
// two threads (one after the other, so the output is deterministic): each thread's
// destructor runs when it exits, main's at exit, all while their code is still mapped.
#include <cstdio>
#include <string>
#include <thread>

struct Tracker {
    std::string name;
    int value = 0;
    Tracker() : name("unnamed") { std::printf("construct\n"); }
    ~Tracker() { std::printf("destroy %s value=%d\n", name.c_str(), value); std::fflush(stdout); }
};

thread_local Tracker tracker;
thread_local int plain_counter = 40;

static void work(const char *name, int v) {
    tracker.name = name;
    tracker.value = v;
    plain_counter += v;
    std::printf("%s: plain_counter=%d\n", name, plain_counter);
}

int main() {
    work("main", 1);
    std::thread a(work, "thread-a", 2);
    a.join();
    std::thread b(work, "thread-b", 3);
    b.join();
    std::printf("main: value=%d plain_counter=%d\n", tracker.value, plain_counter);
    return 0;
}
