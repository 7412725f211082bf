/* A plugin for plugin_host.c: built with -shared, it leaves these two undefined. */
extern int host_version;
extern void host_log(const char *message);

int plugin_run(int x) {
    host_log("plugin says hello");
    return x * host_version;
}
