"""The README's Python example, taken from the README as it is and run with this
interpreter (the test command's virtual environment, with llvmlite): it prints 7."""

import os
import re
import subprocess
import sys

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def test_the_readme_python_example_runs(tmp_path):
    with open(README) as f:
        readme = f.read()
    section = readme.split("## From Python", 1)[1]
    program = re.search(r"python - <<'EOF'\n(.*?)\nEOF\n", section, re.S)
    assert program, "no `python - <<'EOF'` block in the README's section From Python"
    out = subprocess.run(
        [sys.executable, "-"],
        input=program.group(1),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "7\n", out.stdout + out.stderr
