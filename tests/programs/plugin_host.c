/* A program that loads a plugin which calls back into the program: the plugin finds
 * `host_version` and `host_log` among the program's exported definitions (a native
 * program needs -Wl,-E for that; Kiln exports a JIT program's definitions). */
#include <dlfcn.h>
#include <stdio.h>

int host_version = 42;
int host_calls;

void host_log(const char *message) {
    host_calls++;
    printf("host_log: %s\n", message);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: plugin_host PLUGIN.so\n");
        return 2;
    }
    /* The program's own definitions, found through the loader (before any dlopen). */
    void *self = dlsym(RTLD_DEFAULT, "host_log");
    printf("dlsym(host_log): %s\n", self == (void *)host_log ? "found" : "missing");
    void *plugin = dlopen(argv[1], RTLD_NOW);
    if (!plugin) {
        printf("dlopen failed: %s\n", dlerror());
        return 3;
    }
    int (*run)(int) = (int (*)(int))dlsym(plugin, "plugin_run");
    if (!run) {
        printf("no plugin_run\n");
        return 4;
    }
    int result = run(5);
    printf("plugin_run(5) = %d, host_calls = %d\n", result, host_calls);
    dlclose(plugin);
    return 0;
}
