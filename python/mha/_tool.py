"""The `mha` command of a pip installation: runs the command-line tool built
beside the extension (mha/_bin/mha, the same program as the CMake build's
bin/mha) with this command's arguments."""
import os
import pathlib
import sys


def tool_path():
    """The installed tool's path (mha/_bin/mha)."""
    return pathlib.Path(__file__).resolve().parent / "_bin" / "mha"


def main():
    path = tool_path()
    if not os.access(path, os.X_OK):
        sys.exit(f"mha: the command-line tool is not installed at {path} (a source tree without a pip "
                 "install? build it with `make build`: build/mha)")
    os.execv(str(path), [str(path)] + sys.argv[1:])
