long square(long);
extern long host_offset;
long twice_square_plus_host(long x) { return 2 * square(x) + host_offset; }
