/* Control flow: switch tables, recursion, function pointers, loops. */
typedef unsigned long u64;
int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
int ack(int m, int n) { return m == 0 ? n + 1 : n == 0 ? ack(m - 1, 1) : ack(m - 1, ack(m, n - 1)); }
int dispatch(int op, int a, int b) {
    switch (op) {
    case 0: return a + b; case 1: return a - b; case 2: return a * b; case 3: return b ? a / b : 0;
    case 4: return a & b; case 5: return a | b; case 6: return a ^ b; case 7: return a << (b & 31);
    case 8: return a >> (b & 31); case 9: return a == b; default: return -1;
    }
}
typedef int (*binop)(int, int);
static int add(int a, int b) { return a + b; }
static int sub(int a, int b) { return a - b; }
static binop table[] = { add, sub };
int apply(int i, int a, int b) { return table[i & 1](a, b); }
void sort(int *a, int n) {
    for (int i = 1; i < n; i++) { int k = a[i], j = i - 1; while (j >= 0 && a[j] > k) { a[j + 1] = a[j]; j--; } a[j + 1] = k; }
}
void qsort_ints(int *a, int lo, int hi) {
    if (lo >= hi) return;
    int p = a[(lo + hi) / 2], i = lo, j = hi;
    while (i <= j) { while (a[i] < p) i++; while (a[j] > p) j--; if (i <= j) { int t = a[i]; a[i] = a[j]; a[j] = t; i++; j--; } }
    qsort_ints(a, lo, j); qsort_ints(a, i, hi);
}
struct node { struct node *next; u64 v; };
u64 list_sum(struct node *n) { u64 s = 0; for (; n; n = n->next) s += n->v; return s; }
struct node *reverse(struct node *n) { struct node *p = 0; while (n) { struct node *x = n->next; n->next = p; p = n; n = x; } return p; }
int matrix(int n, int a[8][8], int b[8][8], int c[8][8]) {
    for (int i = 0; i < n; i++) for (int j = 0; j < n; j++) { int s = 0; for (int k = 0; k < n; k++) s += a[i][k] * b[k][j]; c[i][j] = s; }
    return c[0][0];
}
u64 sieve(unsigned char *flags, u64 n) {
    u64 count = 0;
    for (u64 i = 2; i < n; i++) flags[i] = 1;
    for (u64 i = 2; i < n; i++) if (flags[i]) { count++; for (u64 j = i * i; j < n; j += i) flags[j] = 0; }
    return count;
}
struct big { u64 a[16]; };
struct big copy_big(struct big b) { b.a[3]++; return b; }
void clear_big(struct big *b) { *b = (struct big){0}; }
int varargs_like(int n, ...) { __builtin_va_list ap; __builtin_va_start(ap, n); int s = 0; for (int i = 0; i < n; i++) s += __builtin_va_arg(ap, int); __builtin_va_end(ap); return s; }
void trap_if(int x) { if (x) __builtin_trap(); }
