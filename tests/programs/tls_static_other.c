extern __thread long counter;
long bump(long by) { counter += by; return counter; }
