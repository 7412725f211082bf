/* Declarations shared by relocs.c and relocs_other.c. */
#ifndef RELOCS_SHARED_H
#define RELOCS_SHARED_H

/* Defined in relocs_other.c */
extern int other_counter;
extern long other_array[16];
extern const char other_greeting[];
extern unsigned char other_bss[4096];
extern long *other_array_ptr;
extern const char *const other_words[];
extern int (*const other_ops[4])(int);
extern int (*other_ops_mut[2])(int);
extern int other_ctor_ran;
extern double common_dbl;

int pick_impl(int x);
int only_weak(int x);
int other_add(int a, int b);
long other_sum_array(void);
int other_static_calls_get(void);
void other_poke_main(int v);
int other_apply(int (*fn)(int), int v);
int other_collatz_steps(long n);
const char *other_shared_literal(void);
void other_report(const char *what, long value);
void *other_addr_of_main_negate(void);
void *other_addr_of_common_var(void);
void *other_addr_of_strlen(void);

/* Defined in relocs.c */
extern int main_counter;
int main_negate(int x);
int main_inc(int x);
void main_static_bump(int v);
int main_collatz_step(long n);

#endif
