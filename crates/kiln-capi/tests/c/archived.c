long archived(long x) { return x * 10; }
