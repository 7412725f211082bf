/* host_calls.c: JIT code that calls what its host provides (host_add) and, in
 * uses_getpid, a C library function the host may not provide. */
long host_add(long a, long b);
int getpid(void);
int main(int argc, char **argv) { (void)argv; return (int)host_add(argc, 40); }
int uses_getpid(void) { return getpid(); }
