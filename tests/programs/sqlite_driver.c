/* sqlite_driver.c: drives Debian's static libsqlite3.a with an in-memory database.
 *
 * Creates a table, inserts 2,000 deterministic rows in one transaction with a prepared
 * statement, then prints aggregates (COUNT, SUM, AVG, MIN/MAX, GROUP BY ... ORDER BY),
 * a join with a second table, a scalar function defined in C, and an error path.
 * Exit code 0 on success. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

static void die(sqlite3 *db, const char *what)
{
    printf("error: %s: %s\n", what, db ? sqlite3_errmsg(db) : "?");
    exit(1);
}

static void exec(sqlite3 *db, const char *sql)
{
    char *err = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK) {
        printf("error: exec '%s': %s\n", sql, err ? err : "?");
        sqlite3_free(err);
        exit(1);
    }
}

/* Prints every row of a query, columns separated by " | ". */
static void print_query(sqlite3 *db, const char *title, const char *sql)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
        die(db, sql);
    printf("-- %s\n", title);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int n = sqlite3_column_count(st);
        for (int i = 0; i < n; i++) {
            if (i)
                printf(" | ");
            switch (sqlite3_column_type(st, i)) {
            case SQLITE_INTEGER:
                printf("%lld", (long long)sqlite3_column_int64(st, i));
                break;
            case SQLITE_FLOAT:
                printf("%.4f", sqlite3_column_double(st, i));
                break;
            case SQLITE_NULL:
                printf("NULL");
                break;
            default:
                printf("%s", (const char *)sqlite3_column_text(st, i));
                break;
            }
        }
        printf("\n");
    }
    if (rc != SQLITE_DONE)
        die(db, sql);
    sqlite3_finalize(st);
}

/* A user-defined SQL function implemented in C: called back from inside sqlite. */
static void fn_mix(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    long long a = sqlite3_value_int64(argv[0]);
    long long b = sqlite3_value_int64(argv[1]);
    sqlite3_result_int64(ctx, (a * 31 + b) % 1009);
}

/* A collation implemented in C: reverse byte order. */
static int coll_reverse(void *arg, int n1, const void *s1, int n2, const void *s2)
{
    (void)arg;
    int n = n1 < n2 ? n1 : n2;
    int c = memcmp(s1, s2, (size_t)n);
    if (c == 0)
        c = n1 - n2;
    return -c;
}

int main(void)
{
    sqlite3 *db;
    printf("sqlite version %s\n", sqlite3_libversion_number() >= 3000000 ? "3.x" : "old");
    if (sqlite3_open(":memory:", &db) != SQLITE_OK)
        die(db, "open");

    exec(db, "CREATE TABLE items(id INTEGER PRIMARY KEY, category TEXT NOT NULL, "
             "qty INTEGER NOT NULL, price REAL NOT NULL, label TEXT)");
    exec(db, "CREATE TABLE categories(name TEXT PRIMARY KEY, weight INTEGER)");
    exec(db, "INSERT INTO categories VALUES ('alpha',1),('beta',2),('gamma',3),"
             "('delta',5),('epsilon',8),('zeta',13),('eta',21)");
    exec(db, "CREATE INDEX items_cat ON items(category, qty)");

    static const char *const cats[] = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"};
    sqlite3_stmt *ins;
    if (sqlite3_prepare_v2(db, "INSERT INTO items(id, category, qty, price, label) VALUES (?,?,?,?,?)",
                           -1, &ins, NULL) != SQLITE_OK)
        die(db, "prepare insert");

    exec(db, "BEGIN");
    unsigned int x = 12345u; /* LCG: deterministic values */
    for (int i = 1; i <= 2000; i++) {
        x = x * 1103515245u + 12345u;
        unsigned int r = (x >> 8) & 0xffffff;
        char label[32];
        snprintf(label, sizeof label, "item-%04d-%c%c", i, 'a' + (int)(r % 26),
                 'a' + (int)((r / 26) % 26));
        sqlite3_bind_int(ins, 1, i);
        sqlite3_bind_text(ins, 2, cats[r % 7], -1, SQLITE_STATIC);
        sqlite3_bind_int(ins, 3, (int)(r % 100) + 1);
        sqlite3_bind_double(ins, 4, (double)(r % 10000) / 100.0);
        if (i % 50 == 0)
            sqlite3_bind_null(ins, 5);
        else
            sqlite3_bind_text(ins, 5, label, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(ins) != SQLITE_DONE)
            die(db, "insert step");
        sqlite3_reset(ins);
        sqlite3_clear_bindings(ins);
    }
    exec(db, "COMMIT");
    sqlite3_finalize(ins);
    printf("inserted rows, changes=%d total_changes=%d\n", sqlite3_changes(db),
           sqlite3_total_changes(db));

    if (sqlite3_create_function(db, "mix", 2, SQLITE_UTF8 | SQLITE_DETERMINISTIC, NULL, fn_mix,
                                NULL, NULL) != SQLITE_OK)
        die(db, "create_function");
    if (sqlite3_create_collation(db, "REVERSE", SQLITE_UTF8, NULL, coll_reverse) != SQLITE_OK)
        die(db, "create_collation");

    print_query(db, "totals",
                "SELECT COUNT(*), SUM(qty), printf('%.4f', AVG(price)), MIN(price), MAX(price), "
                "COUNT(label), SUM(qty * price) FROM items");
    print_query(db, "group by category",
                "SELECT category, COUNT(*) AS n, SUM(qty), printf('%.4f', AVG(price)), MAX(qty) "
                "FROM items GROUP BY category ORDER BY n DESC, category");
    print_query(db, "join with weights",
                "SELECT c.name, c.weight, SUM(i.qty) * c.weight AS score FROM items i "
                "JOIN categories c ON c.name = i.category GROUP BY c.name "
                "HAVING score > 1000 ORDER BY score DESC LIMIT 5");
    print_query(db, "top-2 per category (correlated subquery)",
                "SELECT category, id, qty FROM items i1 WHERE "
                "(SELECT COUNT(*) FROM items i2 WHERE i2.category = i1.category AND "
                "(i2.qty > i1.qty OR (i2.qty = i1.qty AND i2.id < i1.id))) < 2 "
                "ORDER BY category, qty DESC, id");
    print_query(db, "user function", "SELECT SUM(mix(id, qty)), MAX(mix(qty, id)) FROM items");
    print_query(db, "collation",
                "SELECT name FROM categories ORDER BY name COLLATE REVERSE");
    print_query(db, "string functions",
                "SELECT upper(substr(label, 1, 9)), length(label), instr(label, '-') FROM items "
                "WHERE id IN (1, 2, 3, 1999) ORDER BY id");
    print_query(db, "cte",
                "WITH RECURSIVE fib(a, b, n) AS (SELECT 0, 1, 0 UNION ALL "
                "SELECT b, a + b, n + 1 FROM fib WHERE n < 40) SELECT n, a FROM fib WHERE n % 10 = 0");

    exec(db, "UPDATE items SET qty = qty * 2 WHERE category = 'beta'");
    printf("update changes=%d\n", sqlite3_changes(db));
    exec(db, "DELETE FROM items WHERE price < 10.0");
    printf("delete changes=%d\n", sqlite3_changes(db));
    print_query(db, "after update/delete", "SELECT COUNT(*), SUM(qty) FROM items");

    /* error path: syntax error and constraint violation */
    char *err = NULL;
    int rc = sqlite3_exec(db, "SELEC nothing", NULL, NULL, &err);
    printf("syntax error rc=%d msg=%s\n", rc, err ? err : "(null)");
    sqlite3_free(err);
    err = NULL;
    rc = sqlite3_exec(db, "INSERT INTO categories VALUES ('alpha', 0)", NULL, NULL, &err);
    printf("constraint rc=%d msg=%s\n", rc, err ? err : "(null)");
    sqlite3_free(err);

    if (sqlite3_close(db) != SQLITE_OK) {
        printf("close failed\n");
        return 1;
    }
    printf("done\n");
    return 0;
}
