"""No function in plugins/ is longer than 80 lines (from its def to its last line; a nested function counts on its
own and inside the one that holds it): long functions are split along what they decide."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIMIT = 80


def function_lengths(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def test_no_function_in_plugins_is_over_80_lines():
    files = sorted((REPO / "plugins").rglob("*.py"))
    assert len(files) > 20
    too_long = [
        f"{path.relative_to(REPO)}:{line} {name} ({length} lines)"
        for path in files
        for name, line, length in function_lengths(path)
        if length > LIMIT
    ]
    assert not too_long, "split along what they decide:\n" + "\n".join(too_long)


def test_the_count_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    src = tmp_path / "long.py"
    src.write_text(f"def long():\n{body}\n\n\ndef short():\n    return 1\n")
    assert dict((n, k) for n, _line, k in function_lengths(src)) == {"long": LIMIT + 1, "short": 2}
