/* odd's new body (lazy.c): 1000 + n, no recursion. */
int odd(int n) { return 1000 + n; }
