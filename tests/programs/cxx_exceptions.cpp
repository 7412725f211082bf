// cxx_exceptions.cpp: static initialization/destruction order, exceptions thrown
// several frames deep and caught in main, catch(...), exceptions thrown by libstdc++
// itself (vector::at), stack unwinding running destructors, std::string/std::vector.
//
// Native link: plain `g++ cxx_exceptions.o` (libstdc++/libgcc_s from the process).
// Global destructors print after main returns (registered with __cxa_atexit), so the
// expected output includes lines printed during exit().
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

int g_events = 0;

struct Tracer {
    std::string name;
    int order;
    explicit Tracer(const char *n) : name(n), order(++g_events)
    {
        std::printf("ctor %s (#%d)\n", name.c_str(), order);
    }
    ~Tracer() { std::printf("dtor %s (#%d)\n", name.c_str(), order); }
};

// Static initialization order within one TU is definition order.
Tracer g_first("global-first");
std::vector<std::string> g_names = {"alpha", "beta", "gamma"};
Tracer g_second("global-second");

Tracer &function_local()
{
    static Tracer t("function-local-static"); // guarded init on first call
    return t;
}

} // namespace

// A custom exception derived from std::runtime_error carrying extra data.
class ParseError : public std::runtime_error {
public:
    ParseError(const std::string &what, int line, std::vector<int> path)
        : std::runtime_error(what), line_(line), path_(std::move(path))
    {
    }
    int line() const { return line_; }
    const std::vector<int> &path() const { return path_; }

private:
    int line_;
    std::vector<int> path_;
};

// A further derived class, to test catch-by-base and dynamic type.
class DeepParseError : public ParseError {
public:
    using ParseError::ParseError;
};

struct Guard {
    int level;
    explicit Guard(int l) : level(l) {}
    ~Guard() { std::printf("  unwinding frame %d\n", level); }
};

__attribute__((noinline)) int parse_level(int level, int fail_at, std::vector<int> &path)
{
    Guard g(level);
    path.push_back(level * 10);
    if (level == fail_at) {
        std::string msg = "unexpected token at depth " + std::to_string(level);
        if (level % 2)
            throw DeepParseError(msg, 100 + level, path);
        throw ParseError(msg, 100 + level, path);
    }
    if (level > 8)
        return level;
    return parse_level(level + 1, fail_at, path) + 1;
}

__attribute__((noinline)) void throw_int(int v)
{
    Guard g(-v);
    if (v > 0)
        throw v;
}

__attribute__((noinline)) int rethrower(int fail_at)
{
    std::vector<int> path;
    try {
        return parse_level(0, fail_at, path);
    } catch (ParseError &e) {
        std::printf("  rethrower saw '%s', rethrowing\n", e.what());
        throw;
    }
}

int main()
{
    std::printf("main starts, events so far=%d, names=%zu\n", g_events, g_names.size());
    function_local();
    function_local(); // constructed once

    // 1. custom exception from several frames deep
    for (int fail_at : {5, 4, 20}) {
        std::vector<int> path;
        try {
            int r = parse_level(0, fail_at, path);
            std::printf("parse fail_at=%d returned %d (no throw)\n", fail_at, r);
        } catch (const DeepParseError &e) {
            std::printf("caught DeepParseError: %s line=%d path_len=%zu last=%d\n", e.what(),
                        e.line(), e.path().size(), e.path().back());
        } catch (const ParseError &e) {
            std::printf("caught ParseError: %s line=%d path_len=%zu last=%d\n", e.what(), e.line(),
                        e.path().size(), e.path().back());
        }
    }

    // 2. rethrow, caught as std::runtime_error then as std::exception
    try {
        rethrower(3);
    } catch (const std::runtime_error &e) {
        const ParseError *pe = dynamic_cast<const ParseError *>(&e);
        std::printf("caught runtime_error after rethrow: %s (is ParseError=%d, line=%d)\n",
                    e.what(), pe != nullptr, pe ? pe->line() : -1);
    }

    // 3. throw of an int, caught by catch(...)
    int caught_any = 0;
    for (int v = 0; v < 3; v++) {
        try {
            throw_int(v);
            std::printf("throw_int(%d) did not throw\n", v);
        } catch (...) {
            caught_any++;
            std::printf("catch(...) caught something from throw_int(%d)\n", v);
        }
    }

    // 4. exception thrown inside libstdc++ (std::out_of_range from vector::at)
    std::vector<int> v{1, 2, 3};
    try {
        std::printf("v.at(1)=%d\n", v.at(1));
        std::printf("v.at(7)=%d\n", v.at(7));
    } catch (const std::out_of_range &e) {
        std::printf("caught std::out_of_range from libstdc++\n");
    }

    // 5. std::string / std::vector work
    std::vector<std::string> words;
    std::string sentence = "the JIT linker loads relocatable objects";
    std::string cur;
    for (char c : sentence) {
        if (c == ' ') {
            words.push_back(cur);
            cur.clear();
        } else {
            cur += c;
        }
    }
    words.push_back(cur);
    std::string acr;
    size_t total = 0;
    for (const auto &w : words) {
        acr += static_cast<char>(w[0] >= 'a' && w[0] <= 'z' ? w[0] - 32 : w[0]);
        total += w.size();
    }
    std::cout << "words=" << words.size() << " letters=" << total << " acronym=" << acr
              << " names=" << g_names[0] << "," << g_names[2] << std::endl;

    // 6. nested try: an exception thrown and caught inside a catch handler
    try {
        try {
            throw std::logic_error("inner");
        } catch (const std::logic_error &e) {
            try {
                throw std::runtime_error(std::string("nested in ") + e.what());
            } catch (const std::exception &e2) {
                std::printf("nested caught: %s\n", e2.what());
            }
            throw std::runtime_error("outer after nested");
        }
    } catch (const std::exception &e) {
        std::printf("outer caught: %s\n", e.what());
    }

    std::fflush(stdout);
    std::printf("main returns, caught_any=%d\n", caught_any);
    return caught_any == 2 ? 0 : 1;
}
