"""The README's Python example, taken from the README as it is and run with this
interpreter (the test command's virtual environment, with llvmlite): it prints 7."""

import os
import re
import subprocess
import sys

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def run_program(program, cwd):
    """Runs `program` with this interpreter in `cwd`; its output, once it exited 0."""
    out = subprocess.run(
        [sys.executable, "-"],
        input=program,
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_readme_python_example_runs(tmp_path):
    with open(README) as f:
        readme = f.read()
    section = readme.split("## From Python", 1)[1]
    program = re.search(r"python - <<'EOF'\n(.*?)\nEOF\n", section, re.S)
    assert program, "no `python - <<'EOF'` block in the README's section From Python"
    assert run_program(program.group(1), tmp_path) == "7\n"


DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "PYTHON.md")


def test_the_docs_python_examples_run(tmp_path):
    """Every `python - <<'EOF'` program of docs/PYTHON.md runs with this interpreter and
    prints what its `print(...)  # value` comments say."""
    with open(DOCS) as f:
        docs = f.read()
    programs = re.findall(r"python - <<'EOF'\n(.*?)\nEOF\n", docs, re.S)
    assert len(programs) >= 2, "docs/PYTHON.md's examples"
    for program in programs:
        expected = re.findall(r"^\s*print\(.*\)\s+#\s*([^\s,]+)", program, re.M)
        assert expected, f"no `print(...)  # value` line in:\n{program}"
        assert run_program(program, tmp_path).split() == expected


PACKAGE_README = os.path.join(os.path.dirname(__file__), "..", "README.md")


def test_the_package_readme_example_runs(tmp_path):
    """python/README.md's example (the package's own page) runs and prints 101."""
    with open(PACKAGE_README) as f:
        readme = f.read()
    program = re.search(r"```python\n(.*?)\n```", readme, re.S)
    assert program, "no python block in python/README.md"
    assert run_program(program.group(1), tmp_path) == "101\n"
