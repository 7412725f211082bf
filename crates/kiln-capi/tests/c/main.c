int main(int argc, char **argv) { (void)argv; return argc + 40; }
