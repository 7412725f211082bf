#!/usr/bin/env python3
"""Wall time of whole commands, interleaved: runs each command once per round, in turn,
for RUNS rounds (the machine's noise falls on all alike), and prints each one's median
against the first command's (ratio, milliseconds added).

    python3 scripts/interleaved_times.py RUNS "COMMAND 1" "COMMAND 2" ...

Each command runs through the shell, its output discarded; one that fails stops the run.
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

runs = int(sys.argv[1])
commands = sys.argv[2:]
times = [[] for _ in commands]
for _ in range(runs):
    for i, command in enumerate(commands):
        start = time.perf_counter()
        done = subprocess.run(command, shell=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
        elapsed = time.perf_counter() - start
        if done.returncode != 0:
            print(f"failed ({done.returncode}): {command}")
            sys.exit(1)
        times[i].append(elapsed)
base = statistics.median(times[0])
for command, t in zip(commands, times):
    m = statistics.median(t)
    print(f"{m * 1e3:8.2f} ms  {m / base:5.3f}x  {(m - base) * 1e3:+7.2f} ms  {command}")
