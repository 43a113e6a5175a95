#!/usr/bin/env python3
"""Every file mha writes goes through mha::io::write_file_atomic.

A file written in place can be left half-written by an error or a kill, and a
good checkpoint replaced by a broken one. write_file_atomic
(src/io/atomic_file.cpp) writes to an unnamed or temporary file beside the
target and renames it into place. This check fails when library, tool or
Python-package code opens a file for writing any other way:

    scripts/check-atomic-writes.py          # from the repository root

Writers to fix: render into memory (e.g. cairo_surface_write_to_png_stream
into a std::vector<uint8_t>, serialize_safetensors) and hand the bytes to
write_file_atomic. A line that really must write directly (a terminal, a pipe)
says so with a comment containing `atomic-writes: ok` and the reason.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
ALLOWED = {"src/io/atomic_file.cpp"}
CPP = [
    (re.compile(r"\b(?:std::)?o?fstream\b(?!>)"), "a C++ file stream for writing"),
    (re.compile(r"\bfopen\s*\([^;]*\"[^\"]*[wa+][^\"]*\""), "fopen for writing"),
    (re.compile(r"\bopen(at)?\s*\([^;]*O_(CREAT|WRONLY|RDWR|TRUNC)"), "open() for writing"),
    (re.compile(r"\bcreat\s*\("), "creat()"),
    (re.compile(r"\bcairo_surface_write_to_png\s*\("), "cairo writing a PNG by name"),
    (re.compile(r"\bcairo_(pdf|svg|ps)_surface_create\s*\("), "cairo writing a file by name"),
    (re.compile(r"\bstd::filesystem::copy(_file)?\s*\("), "a file copy"),
]
PY = [
    (re.compile(r"\bopen\s*\([^)]*[\"'][^\"']*[wax+][^\"']*[\"']"), "open() for writing"),
    (re.compile(r"\.(write_bytes|write_text)\s*\("), "pathlib writing in place"),
    (re.compile(r"\bnp\.(save|savez|savetxt)\s*\(|\.savefig\s*\("), "a library writing in place"),
]


def main():
    problems = []
    folders = ["src", "tools", "python"]
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in ALLOWED or not path.is_file():
                continue
            rules = CPP if path.suffix in {".cpp", ".h", ".hpp", ".cc"} else PY if path.suffix == ".py" else None
            if rules is None:
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                code = line.split("//")[0] if rules is CPP else line.split("#")[0]
                if "atomic-writes: ok" in line:
                    continue
                for pattern, what in rules:
                    if pattern.search(code):
                        problems.append(f"{rel}:{n}: {what}: {line.strip()}")
    if problems:
        print("check-atomic-writes: these lines write files without write_file_atomic "
              "(see scripts/check-atomic-writes.py for how to fix):", file=sys.stderr)
        print("\n".join(problems), file=sys.stderr)
        return 1
    print(f"check-atomic-writes: ok (every writer in {', '.join(folders)} uses write_file_atomic)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
