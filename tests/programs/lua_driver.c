/* lua_driver.c: embeds Lua 5.4 (Debian's static liblua5.4.a) and runs the script given
 * as argv[1]. Also registers a C function the script calls back into, and reads a
 * global the script sets. Exit code 0 when the script ran without error. */
#include <stdio.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

/* C function callable from Lua: host.checksum(str) -> FNV-1a 32-bit of the bytes. */
static int host_checksum(lua_State *L)
{
    size_t len;
    const char *s = luaL_checklstring(L, 1, &len);
    unsigned int h = 2166136261u;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    lua_pushinteger(L, (lua_Integer)h);
    return 1;
}

/* host.fail(msg): raises a Lua error from C (longjmp through the C frame). */
static int host_fail(lua_State *L) { return luaL_error(L, "host.fail: %s", luaL_checkstring(L, 1)); }

static const luaL_Reg host_funcs[] = {
    {"checksum", host_checksum},
    {"fail", host_fail},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s script.lua\n", argv[0]);
        return 2;
    }
    lua_State *L = luaL_newstate();
    if (!L) {
        printf("cannot create Lua state\n");
        return 1;
    }
    luaL_openlibs(L);
    luaL_newlib(L, host_funcs);
    lua_setglobal(L, "host");

    if (luaL_dofile(L, argv[1]) != LUA_OK) {
        printf("lua error: %s\n", lua_tostring(L, -1));
        lua_close(L);
        return 1;
    }

    lua_getglobal(L, "RESULT");
    if (lua_isinteger(L, -1))
        printf("C side: RESULT = %lld\n", (long long)lua_tointeger(L, -1));
    else
        printf("C side: RESULT missing\n");
    lua_pop(L, 1);

    /* Call a Lua function from C. */
    lua_getglobal(L, "fib");
    lua_pushinteger(L, 30);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
        printf("lua error: %s\n", lua_tostring(L, -1));
        lua_close(L);
        return 1;
    }
    printf("C side: fib(30) = %lld\n", (long long)lua_tointeger(L, -1));
    lua_pop(L, 1);

    lua_close(L);
    return 0;
}
