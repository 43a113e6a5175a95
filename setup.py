"""Builds and installs the mha Python package (the `mha` folder of python/
plus the compiled extension mha._core) with Debian's setuptools, offline.

    python3 -m venv --system-site-packages /tmp/venv-mha    # numpy from Debian
    /tmp/venv-mha/bin/pip install .
    /tmp/venv-mha/bin/mha --help                              # the command-line tool

The extension is built by CMake (the same CMakeLists.txt as everything else,
target mha_python), so the compiler flags, the BLAS and the version are the
ones of the C++ build. The version is read from the project() line of
CMakeLists.txt, the one place it is set.
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent


def project_version():
    text = (ROOT / "CMakeLists.txt").read_text()
    match = re.search(r"project\(mha\s+VERSION\s+([0-9]+\.[0-9]+\.[0-9]+)", text)
    if not match:
        sys.exit("setup.py: no `project(mha VERSION x.y.z` line in CMakeLists.txt")
    return match.group(1)


class CMakeBuild(build_ext):
    """Builds mha._core with CMake instead of setuptools' compiler calls."""

    def build_extension(self, ext):
        # A folder of its own, kept between runs so that a second install
        # only rebuilds what changed.
        build_dir = pathlib.Path(os.environ.get("MHA_PY_BUILD_DIR", ROOT / "build-python" / "cmake"))
        jobs = os.environ.get("JOBS", str(os.cpu_count() or 1))
        subprocess.check_call([
            "cmake", "-S", str(ROOT), "-B", str(build_dir),
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DPython_EXECUTABLE={sys.executable}",
            "-DMHA_BUILD_PYTHON=ON", "-DMHA_BUILD_TESTS=OFF", "-DMHA_BUILD_TOOLS=ON",
        ])
        subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "mha_python", "mha_tool", "-j", jobs])
        built = sorted((build_dir / "python" / "mha").glob("_core*.so"))
        if len(built) != 1:
            sys.exit(f"setup.py: expected one _core*.so in {build_dir}/python/mha, found {built}")
        dest = pathlib.Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[0], dest)
        # The command-line tool rides in the package (mha/_bin/mha); the
        # `mha` console command (mha/_tool.py) runs it.
        tool = dest.parent / "_bin" / "mha"
        tool.parent.mkdir(exist_ok=True)
        shutil.copyfile(build_dir / "mha", tool)
        tool.chmod(0o755)


setup(
    name="mha",
    version=project_version(),
    description="Multi-head attention (Dive into Deep Learning 11.5) in C++, exact to the d2l chapter's PyTorch code",
    packages=find_packages("python"),
    package_dir={"": "python"},
    ext_modules=[Extension("mha._core", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    install_requires=["numpy"],
    entry_points={"console_scripts": ["mha = mha._tool:main"]},
    python_requires=">=3.9",
    # setuptools' own build/ would land beside CMake's build/ folder.
    options={"build": {"build_base": "build-python"}, "egg_info": {"egg_base": "build-python"}},
    zip_safe=False,
)
