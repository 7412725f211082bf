// cxx_comdat_b.cpp: second translation unit of the COMDAT test (see cxx_comdat_a.cpp).
#include <typeinfo>

#include "cxx_comdat.h"

Shape *make_shape_b(int kind)
{
    switch (kind) {
    case 0: return new Rect(2.0, 3.5);
    case 1: return new Square(4.0);
    case 2: return new Polygon<5>(2.0);
    default: return new Polygon<6>(1.5);
    }
}

void b_use_accumulators()
{
    for (int i = 1; i <= 10; i++)
        Accumulator<int>::add(i * 3);
    Accumulator<double>::add(0.125);
    Accumulator<long>::add(1L << 40); // only instantiated in this TU
}

int b_ticket() { return next_ticket(); }
const void *b_addr_mix32() { return reinterpret_cast<const void *>(&mix32); }
const void *b_addr_shared_counter() { return &shared_inline_counter; }
const void *b_addr_acc_int_total() { return &Accumulator<int>::total; }
const void *b_rect_typeinfo() { return &typeid(Rect); }
std::uint32_t b_sum_squares()
{
    std::vector<std::uint32_t> v;
    for (std::uint32_t i = 0; i < 100; i++)
        v.push_back(mix32(i) & 0xffff);
    return sum_squares(v);
}
void b_bump_shared() { shared_inline_counter += 10; }
