#!/usr/bin/env python3
"""Every error the source can raise has a row in docs/errors.md.

Finds each call that raises an mha::Error (fail(...), and the local helpers
bad(...), fail_errno(...), abandon(...)) in src/, tools/ and
python/module.cpp, takes the longest string literal of its message, and
checks that some catalogue message contains it. A new error therefore fails
this check until docs/errors.md describes it (and the catalogue tests then
require a trigger for it):

    scripts/check-error-catalogue.py
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CALL = re.compile(r"\b(fail|bad|fail_errno|abandon)\(")
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
        [ROOT / "python" / "module.cpp"]
    missing, sites = [], 0
    for path in files:
        text = path.read_text()
        for m in CALL.finditer(text):
            line_start = text.rfind("\n", 0, m.start()) + 1
            if text[line_start:m.start()].lstrip().startswith("//"):
                continue
            args = call_text(text, m.end() - 1)
            literals = [bytes(s, "utf-8").decode("unicode_escape") for s in LITERAL.findall(args)]
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
              "(add one, with a trigger in tests/cpp/test_error_catalogue.cpp or "
              "tests/python/test_error_catalogue.py):", file=sys.stderr)
        print("\n".join(missing), file=sys.stderr)
        return 1
    print(f"check-error-catalogue: ok ({sites} error sites, {len(messages)} catalogue rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
