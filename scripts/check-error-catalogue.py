#!/usr/bin/env python3
"""Every error the source can raise has a row in docs/errors.md.

Finds each call that raises an mha::Error (fail(...), throw Error(...), and
the local helpers bad(...), fail_errno(...), abandon(...)) in src/, tools/
and the Python bindings (python/bindings/*.cpp, *.h), and each `raise ValueError(...)` of
the Python package (python/mha/*.py), takes the longest string literal of
its message (of an f-string, the longest text between its {fields}), and
checks that some catalogue message contains it. A new error therefore fails
this check until docs/errors.md describes it (and the catalogue tests then
require a trigger for it):

    scripts/check-error-catalogue.py
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CALL = re.compile(r"\b(fail|bad|fail_errno|abandon)\(|\bthrow\s+(?:mha::)?Error\(")
PY_CALL = re.compile(r"\braise\s+ValueError\(")
LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')


def call_text(text, start):
    """The argument text of the call whose '(' is at text[start]."""
    depth, i, in_str = 0, start, False
    while i < len(text):
        c = text[i]
        if in_str:
            if c == "\\":
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return text[start + 1:i]
        i += 1
    return text[start + 1:]


def main():
    messages = [line.split("|")[2] for line in (ROOT / "docs" / "errors.md").read_text().splitlines()
                if line.startswith("| `")]
    catalogue = "\n".join(messages)
    files = sorted((ROOT / "src").rglob("*.cpp")) + sorted((ROOT / "tools").rglob("*.cpp")) + \
        sorted((ROOT / "python" / "bindings").glob("*.cpp")) + sorted((ROOT / "python" / "bindings").glob("*.h")) + \
        sorted((ROOT / "python" / "mha").glob("*.py"))
    missing, sites = [], 0
    for path in files:
        text = path.read_text()
        python = path.suffix == ".py"
        for m in (PY_CALL if python else CALL).finditer(text):
            line_start = text.rfind("\n", 0, m.start()) + 1
            if text[line_start:m.start()].lstrip().startswith("#" if python else "//"):
                continue
            args = call_text(text, m.end() - 1)
            literals = [bytes(s, "utf-8").decode("unicode_escape") for s in LITERAL.findall(args)]
            if python:  # the text between an f-string's {fields}
                literals = [piece for s in literals for piece in re.split(r"\{[^{}]*\}", s)]
            literals = [s for s in literals if len(s.strip(" '\":,;()")) >= 3]
            if not literals:
                continue  # a helper's definition, or a call whose text is all variables
            sites += 1
            key = max(literals, key=len)
            if key not in catalogue:
                line = text.count("\n", 0, m.start()) + 1
                missing.append(f"{path.relative_to(ROOT)}:{line}: \"{key}\"")
    if missing:
        print("check-error-catalogue: these errors have no row in docs/errors.md "
              "(add one, with a trigger in tests/cpp/errors/test_error_catalogue.cpp or "
              "tests/python/test_error_catalogue.py):", file=sys.stderr)
        print("\n".join(missing), file=sys.stderr)
        return 1
    print(f"check-error-catalogue: ok ({sites} error sites, {len(messages)} catalogue rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
