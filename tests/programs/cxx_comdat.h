// Shared by cxx_comdat_a.cpp and cxx_comdat_b.cpp: everything here is emitted in
// COMDAT groups in both objects (inline functions, template instantiations, inline
// variables, and the vtable/typeinfo of classes whose virtual functions are all
// inline, i.e. classes without a key function).
#ifndef CXX_COMDAT_H
#define CXX_COMDAT_H

#include <cstdint>
#include <string>
#include <vector>

// An inline function with a static local: one instance program-wide.
inline int next_ticket()
{
    static int counter = 1000;
    return ++counter;
}

// An inline function whose address is compared across TUs.
inline std::uint32_t mix32(std::uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

// C++17 inline variable: a single object shared by both TUs.
inline int shared_inline_counter = 7;

// A template with a static data member (one per instantiation, program-wide).
template <typename T> struct Accumulator {
    static T total;
    static int calls;
    static void add(T v)
    {
        total += v;
        ++calls;
    }
};
template <typename T> T Accumulator<T>::total = T();
template <typename T> int Accumulator<T>::calls = 0;

// A function template instantiated with the same arguments in both TUs.
template <typename T> T sum_squares(const std::vector<T> &v)
{
    T s = T();
    for (const T &x : v)
        s += x * x;
    return s;
}

// Polymorphic classes without a key function: vtable, typeinfo and typeinfo name are
// COMDAT (weak) in each TU that uses them.
struct Shape {
    virtual ~Shape() {}
    virtual double area() const = 0;
    virtual std::string name() const { return "shape"; }
    int id = next_ticket();
};

struct Rect : Shape {
    double w, h;
    Rect(double w_, double h_) : w(w_), h(h_) {}
    double area() const override { return w * h; }
    std::string name() const override { return "rect"; }
};

struct Square : Rect {
    explicit Square(double s) : Rect(s, s) {}
    std::string name() const override { return "square"; }
};

template <int N> struct Polygon : Shape {
    double side;
    explicit Polygon(double s) : side(s) {}
    double area() const override { return N * side * side / 4.0 * cot_pi_over_n(); }
    std::string name() const override { return std::to_string(N) + "-gon"; }
    static double cot_pi_over_n()
    {
        // precomputed cot(pi/N) for the N used here
        return N == 5 ? 1.3763819204711736 : N == 6 ? 1.7320508075688772 : 1.0;
    }
};

// Implemented in cxx_comdat_b.cpp
Shape *make_shape_b(int kind);
void b_use_accumulators();
int b_ticket();
const void *b_addr_mix32();
const void *b_addr_shared_counter();
const void *b_addr_acc_int_total();
const void *b_rect_typeinfo();
std::uint32_t b_sum_squares();
void b_bump_shared();

#endif
