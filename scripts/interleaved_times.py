#!/usr/bin/env python3
"""Wall time of whole commands, interleaved: runs each command once per round, in turn,
for RUNS rounds (the machine's noise falls on all alike), and prints each one's median
against the first command's (ratio, milliseconds added).

    python3 scripts/interleaved_times.py [--pass NAME] RUNS "COMMAND 1" "COMMAND 2" ...

Each command runs through the shell, its output discarded; one that fails stops the run.
With `--pass NAME`, what is timed is one pass of the link: each command is a `kiln`
command given `--show-times`, and its `pass NAME   X ms` line on stderr is the time
(issue 26's fixup and decode figures:

    python3 scripts/interleaved_times.py --pass fixup 12 \\
        "exec /tmp/kiln-before link --target riscv64 --allow-undefined -o /tmp/x.elf \\
            sqlite_driver-rv64.o sqlite3-rv64.o --show-times" \\
        "exec target/release/kiln link --target riscv64 --allow-undefined -o /tmp/x.elf \\
            sqlite_driver-rv64.o sqlite3-rv64.o --show-times"
).
How docs/BENCHMARKS.md compares two builds of Kiln on one input (issue 25's
before/after figures), e.g. a saved `kiln` against the new one:

    python3 scripts/interleaved_times.py 41 \\
        "exec /tmp/kiln-before run --oop lua_driver.o liblua5.4.a -lm -- script.lua" \\
        "exec target/release/kiln run --oop lua_driver.o liblua5.4.a -lm -- script.lua"
"""
import statistics
import subprocess
import sys
import time

args = sys.argv[1:]
link_pass = None
if args[:1] == ["--pass"]:
    link_pass, args = args[1], args[2:]
runs = int(args[0])
commands = args[1:]
times = [[] for _ in commands]
for _ in range(runs):
    for i, command in enumerate(commands):
        start = time.perf_counter()
        done = subprocess.run(command, shell=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE if link_pass else subprocess.DEVNULL,
                              text=True)
        elapsed = time.perf_counter() - start
        if done.returncode != 0:
            print(f"failed ({done.returncode}): {command}")
            sys.exit(1)
        if link_pass:
            # `kiln:   pass NAME   X ms`
            found = [line.split() for line in done.stderr.splitlines()
                     if line.split()[1:3] == ["pass", link_pass]]
            if not found:
                print(f"no 'pass {link_pass}' time in the output of: {command}")
                sys.exit(1)
            elapsed = float(found[0][3]) / 1e3
        times[i].append(elapsed)
base = statistics.median(times[0])
for command, t in zip(commands, times):
    m = statistics.median(t)
    print(f"{m * 1e3:8.2f} ms  {m / base:5.3f}x  {(m - base) * 1e3:+7.2f} ms  {command}")
