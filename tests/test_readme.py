"""The README's two commands are exactly what CI runs, so neither can drift from the other."""
import re

from .conftest import REPO_ROOT


def readme_commands():
    text = (REPO_ROOT / "README.md").read_text()
    quick_start = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", quick_start, flags=re.S)


def test_readme_has_exactly_two_commands_and_ci_runs_them():
    commands = readme_commands()
    assert len(commands) == 2
    setup, test = commands
    assert "python -m pysparse_hpc demo" in setup and "pytest" in test
    ci_lines = (REPO_ROOT / ".ci" / "run").read_text().splitlines()
    assert setup in ci_lines and test in ci_lines


def test_readme_python_examples_run():
    """Every ```python block of the README runs as written (in order, one namespace)."""
    text = (REPO_ROOT / "README.md").read_text()
    namespace = {}
    blocks = re.findall(r"```python\n(.*?)\n```", text, flags=re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
