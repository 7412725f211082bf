long answer(long x) { return x * 100; }
