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
    `- ` list item,
  - a line declaring several variables (`int x = 0, y = 0;`) becomes one
    declaration per variable on that line, each documented by the comment
    that documents the line (Doxygen would document the first one only); a
    trailing comment of shapes, one per variable (`// [B,Q,Dq], [B,K,Dk]`),
    is shared out among them.
So the headers need no Doxygen markup, and a header added later is documented
as soon as its declarations have comments. Line numbers are kept.
"""
import re
import sys

FULL = re.compile(r"^(\s*)//(?![/!])(.*)$")
# `type a [= init], b [= init], ...;` with simple initialisers (no commas,
# parentheses or braces): the member lists of the public structs.
DECLARATOR = r"[A-Za-z_]\w*(?:\s*=\s*[^,;(){}]+?)?"
MULTI_DECL = re.compile(
    r"^(\s*)((?:(?:const|static|inline|constexpr|mutable)\s+)*[A-Za-z_][\w:]*(?:<[^;]*?>)?[*&]?)"
    r"\s+(" + DECLARATOR + r"(?:\s*,\s*" + DECLARATOR + r")+)\s*;\s*$")
NOT_TYPES = {"return", "using", "typedef", "friend", "case", "goto", "delete", "throw", "co_return"}


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


def doc_comment(text):
    """`text` as a one-line Doxygen comment for the member before it."""
    return "/**< " + text.strip().replace("*/", "* /") + " */"


def top_level_parts(text):
    """`text` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


def split_declaration(code, trailing, block):
    """One declaration per variable for a line declaring several, or None.

    `trailing` is the line's own comment (or None), `block` the text of the
    comment block just above it (or "").
    """
    m = MULTI_DECL.match(code)
    if not m or m.group(2).split()[0] in NOT_TYPES:
        return None
    indent, type_, names = m.group(1), m.group(2), [d.strip() for d in m.group(3).split(",")]
    if trailing is not None:
        parts = top_level_parts(trailing.strip())
        if len(parts) == len(names) and all(p.startswith(("[", "(")) for p in parts):
            docs = parts
        else:
            docs = [trailing] * len(names)
    else:
        # The block above documents the first; the others repeat it.
        docs = [None] + [block] * (len(names) - 1) if block.strip() else [None] * len(names)
    out = indent
    for name, doc in zip(names, docs):
        out += f"{type_} {name}; " + (doc_comment(doc) + " " if doc else "")
    return out.rstrip()


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
    block = []             # prose of the comment block just above, for split_declaration
    for line in lines:
        m = FULL.match(line)
        if m:
            indent, text = m.group(1), m.group(2)
            if trailing_col is not None and len(indent) == trailing_col:
                out.append(f"{indent}///<{text}")
                continue
            trailing_col = None
            if not is_code(text, in_list):
                block.append(text.strip())
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
        above, block = " ".join(block), []
        t = split_trailing(line)
        split = split_declaration(t[0] if t else line, t[2] if t else None, above)
        if split is not None:
            out.append(split)
            trailing_col = t[1] if t else None
            continue
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
