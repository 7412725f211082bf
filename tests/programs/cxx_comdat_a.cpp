// cxx_comdat_a.cpp: main of the COMDAT test. Inline functions, template
// instantiations, inline variables and vtables/typeinfo (classes without a key
// function) are defined in COMDAT groups in both this object and cxx_comdat_b.o; the
// linker must keep exactly one copy of each group so that statics, addresses and
// typeinfo identity agree across the two objects. Output is address-free.
#include <cstdio>
#include <memory>
#include <typeinfo>

#include "cxx_comdat.h"

static int failures = 0;
static void check(bool ok, const char *what)
{
    if (!ok) {
        failures++;
        std::printf("CHECK FAILED: %s\n", what);
    }
}

int main()
{
    // inline function with a static local: counter shared by both TUs
    int t1 = next_ticket();
    int t2 = b_ticket();
    int t3 = next_ticket();
    std::printf("tickets: %d %d %d\n", t1, t2, t3);
    check(t2 == t1 + 1 && t3 == t2 + 1, "inline static local shared");

    // address identity of inline function / inline variable / template static member
    std::printf("identity: mix32=%d shared_counter=%d acc_total=%d typeinfo=%d\n",
                reinterpret_cast<const void *>(&mix32) == b_addr_mix32(),
                static_cast<const void *>(&shared_inline_counter) == b_addr_shared_counter(),
                static_cast<const void *>(&Accumulator<int>::total) == b_addr_acc_int_total(),
                static_cast<const void *>(&typeid(Rect)) == b_rect_typeinfo());
    check(static_cast<const void *>(&shared_inline_counter) == b_addr_shared_counter(),
          "inline variable shared");
    check(static_cast<const void *>(&Accumulator<int>::total) == b_addr_acc_int_total(),
          "template static member shared");

    // inline variable written from both TUs
    shared_inline_counter += 1;
    b_bump_shared();
    std::printf("shared_inline_counter=%d\n", shared_inline_counter);
    check(shared_inline_counter == 18, "inline variable value");

    // template static data members accumulated from both TUs
    for (int i = 0; i < 5; i++)
        Accumulator<int>::add(i);
    Accumulator<double>::add(2.5);
    b_use_accumulators();
    std::printf("Accumulator<int>: total=%d calls=%d; Accumulator<double>: total=%.3f calls=%d; "
                "Accumulator<long>: total=%ld calls=%d\n",
                Accumulator<int>::total, Accumulator<int>::calls, Accumulator<double>::total,
                Accumulator<double>::calls, Accumulator<long>::total, Accumulator<long>::calls);
    check(Accumulator<int>::calls == 15 && Accumulator<int>::total == 10 + 165, "template statics");

    // function template instantiated in both TUs
    std::vector<std::uint32_t> v;
    for (std::uint32_t i = 0; i < 100; i++)
        v.push_back(mix32(i) & 0xffff);
    std::uint32_t a = sum_squares(v);
    std::uint32_t b = b_sum_squares();
    std::printf("sum_squares: a=%u b=%u equal=%d\n", a, b, a == b);
    check(a == b, "template function");

    // virtual dispatch on objects created in the other TU and in this one;
    // dynamic_cast and typeid across TUs
    std::vector<std::unique_ptr<Shape>> shapes;
    for (int k = 0; k < 4; k++)
        shapes.emplace_back(make_shape_b(k));
    shapes.emplace_back(new Rect(1.25, 8.0));
    shapes.emplace_back(new Polygon<6>(1.5));
    double total = 0;
    for (const auto &s : shapes) {
        const Rect *r = dynamic_cast<const Rect *>(s.get());
        std::printf("shape id=%d %-7s area=%9.4f is_rect=%d is_square=%d\n", s->id,
                    s->name().c_str(), s->area(), r != nullptr, typeid(*s) == typeid(Square));
        total += s->area();
    }
    std::printf("total area=%.4f typeid(Polygon<6>) same across TUs=%d\n", total,
                typeid(*shapes[3]) == typeid(*shapes[5]));
    check(typeid(*shapes[3]) == typeid(*shapes[5]), "typeinfo equality");

    std::printf("failures=%d\n", failures);
    return failures ? 1 : 0;
}
