/* even and odd call each other; linked swappably, odd is replaced (lazy.c). */
int odd(int n);
int even(int n) { return n == 0 ? 1 : odd(n - 1); }
int odd(int n) { return n == 0 ? 0 : even(n - 1); }
