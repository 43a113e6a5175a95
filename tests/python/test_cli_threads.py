"""`mha train --threads N` and `mha prune --threads N` compute on N of mha's threads.

mha's thread count (mha::set_num_threads) defaults to OpenMP's
(OMP_NUM_THREADS); --threads must set it, whatever that default is. Each run
is checked twice: the count its header line reports (mha::num_threads(), the
count in effect) and the threads the process really has while it computes
(/proc/<pid>/task; OpenMP's team stays alive between products, and
OPENBLAS_NUM_THREADS=1 keeps OpenBLAS's own pool out of the count).
"""
import os
import re
import subprocess
import time

import pytest

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc")


def run_counting_threads(argv, omp_threads, cwd):
    """(returncode, stdout, stderr, the most threads the process had at once)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(omp_threads), OPENBLAS_NUM_THREADS="1")
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    most = 0
    while p.poll() is None:
        try:
            most = max(most, len(os.listdir(f"/proc/{p.pid}/task")))
        except FileNotFoundError:
            break
        time.sleep(0.002)
    out, err = p.communicate(timeout=300)
    return p.returncode, out, err, most


def train_argv(tool, tmp_path, threads, steps=40):
    return [tool, "train", "--steps", str(steps), "--eval-every", "1000", "--eval-size", "16", "--threads",
            str(threads), "--out", str(tmp_path / f"t{threads}.safetensors"), "--curves", "", "--plot", ""]


@pytest.mark.parametrize("default,threads", [(1, 3), (4, 1)])
def test_train_threads_sets_mhas_thread_count(mha_tool, tmp_path, default, threads):
    rc, out, err, most = run_counting_threads(train_argv(mha_tool, tmp_path, threads), default, tmp_path)
    assert rc == 0, err
    reported = re.search(r", (\d+) thread\(s\)\n", out)
    assert reported and int(reported.group(1)) == threads, out
    # OpenMP's default would give `default` threads; --threads gives its own.
    assert most == threads, f"the process had {most} threads at most, wanted {threads}"


@pytest.mark.parametrize("default,threads", [(1, 3), (4, 1)])
def test_prune_threads_sets_mhas_thread_count(mha_tool, tmp_path, default, threads):
    rc, _, err, _ = run_counting_threads(train_argv(mha_tool, tmp_path, 1, steps=0), 1, tmp_path)
    assert rc == 0, err
    argv = [mha_tool, "prune", "--checkpoint", str(tmp_path / "t1.safetensors"), "--importance-size", "64",
            "--random-orders", "0", "--latency-batch", "64", "--latency-repeats", "2", "--threads", str(threads),
            "--plot", "", "--csv", ""]
    rc, out, err, most = run_counting_threads(argv, default, tmp_path)
    assert rc == 0, err
    reported = re.search(r"kernel, (\d+) thread\(s\)\n", out)
    assert reported and int(reported.group(1)) == threads, out
    assert most == threads, f"the process had {most} threads at most, wanted {threads}"
