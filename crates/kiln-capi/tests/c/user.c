#include <math.h>
long square(long);
long archived(long);
extern long host_offset;
long use_all(long x) { return square(x) + archived(x) + host_offset + (long)sqrt((double)(x * x)); }
