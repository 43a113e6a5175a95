#!/usr/bin/env python3
"""Doxygen input filter: reads mha's public headers as they are written.

The headers use plain `//` comments (STYLE.md), which Doxygen ignores. This
filter hands Doxygen a copy in which
  - the comment block at the top of a file documents the file (`/// \\file`),
  - a comment on its own line documents the declaration below it (`///`),
  - a comment after code on the same line documents that code (`///<`), and
    lines that continue it at the same column continue it,
  - comment lines indented two or more spaces past `// ` (usage examples,
    shape blocks) become `\\code` blocks, except the continuation lines of a
    `- ` list item.
So the headers need no Doxygen markup, and a header added later is documented
as soon as its declarations have comments. Line numbers are kept.
"""
import re
import sys

FULL = re.compile(r"^(\s*)//(?![/!])(.*)$")


def split_trailing(line):
    """(code, column, text) when `line` is code followed by a // comment."""
    in_string = False
    i = 0
    while i < len(line) - 1:
        c = line[i]
        if c == "\\" and in_string:
            i += 2
            continue
        if c == '"':
            in_string = not in_string
        elif not in_string and line.startswith("//", i):
            if line.startswith("///", i) or line.startswith("//!", i):
                return None
            code = line[:i]
            if not code.strip():
                return None
            return code, i, line[i + 2:]
        i += 1
    return None


def is_code(text, in_list):
    """A comment text that is an example or shape block rather than prose."""
    if not text.startswith("   "):  # `// ` then two more spaces
        return False
    if in_list and re.match(r"^ {3}\S", text):
        return False
    return True


def filter_lines(lines):
    out = []
    at_top = True          # still in the file's first comment block
    trailing_col = None    # column of the last trailing comment, for continuations
    in_code = False
    in_list = False
    for line in lines:
        m = FULL.match(line)
        if m:
            indent, text = m.group(1), m.group(2)
            if trailing_col is not None and len(indent) == trailing_col:
                out.append(f"{indent}///<{text}")
                continue
            trailing_col = None
            prefix = indent + "///"
            if at_top and not out:
                prefix = indent + "/// \\file\n" + prefix
            code = is_code(text, in_list)
            if code and not in_code:
                prefix_line = f"{indent}/// \\code{{.cpp}}\n"
                in_code = True
            else:
                prefix_line = ""
            if not code and in_code:
                out.append(f"{indent}/// \\endcode")
                in_code = False
            stripped = text.strip()
            if stripped.startswith("- "):
                in_list = True
            elif not stripped:
                in_list = False
            out.append(prefix_line + prefix + text)
            continue
        if in_code:
            out.append("/// \\endcode")
            in_code = False
        in_list = False
        if line.strip():
            at_top = False
        t = split_trailing(line)
        if t and t[0].strip() not in ("}", "};"):
            code, col, text = t
            out.append(f"{code}///<{text}")
            trailing_col = col
            continue
        trailing_col = None
        out.append(line)
    return out


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        lines = f.read().split("\n")
    sys.stdout.write("\n".join(filter_lines(lines)))


if __name__ == "__main__":
    main()
