"""One rule for every option of every command of the `mha` tool.

RULES below lists every option of every command, as each command's `--help`
shows it (test_every_option_is_in_the_table fails when an option appears
that the table does not cover, or one in the table is gone). For each:

- integers (plain decimal in a range): values below, above, past int64 and
  2^64, empty, fractional, hex and with a sign are usage errors that name
  the option, the value and the readable range; `--help` shows the range;
- thread counts: the same, in [1, mha::max_num_threads()];
- seeds: [0, 2^64 - 1]; sizes: a whole number with an optional unit;
- options that apply only with another are refused without it, naming it;
  options that exclude each other are refused together;
- outputs: a name whose extension names another format is refused;
- named values: `--help` shows the names only, and no number is taken.

Usage errors exit with status 2, failures with 1 (docs/errors.md). The rows
of docs/errors.md marked `CLI usage` are triggered here
(catalogue_triggers.CLI_USAGE). Also here: standard output that cannot be
written, outputs that keep the permissions of the file they replace, plain
bench output, other file kinds given as safetensors, and nn.MultiheadAttention
state dicts given to `mha run`.
"""
import os
import pathlib
import pickle
import re
import stat
import subprocess

import numpy as np
import pytest

import catalogue_triggers
import mha

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
I32 = 2**31 - 1
I64 = 2**63 - 1

# Kinds: ("int", lo, hi) (with "pair": two of them, A,B), ("threads",), ("seed",), ("size",), ("flag",),
# ("float",), ("text",), ("choice", names), ("in",) an input file,
# ("out", ext) an output file; "needs"/"excludes": options.
RULES = {
    "": {
        "--help": ("flag",), "--version": ("flag",), "--memory-limit": ("size",),
    },
    "demo": {
        "--help": ("flag",), "--seed": ("seed",), "--heatmap": ("out", ".png"),
        "--no-heatmap": ("flag", {"excludes": ["--heatmap"]}),
    },
    "run": {
        "--help": ("flag",), "--weights": ("in",), "--inputs": ("in",), "--out": ("out", ".safetensors"),
        "--heads": ("int", 1, I32), "--parallel": ("choice", ["heads", "sequence", "grid"]),
        "--head-groups": ("int", 1, I32), "--precision": ("text",),
        "--causal": ("choice", ["top-left", "bottom-right"]), "--window": ("int", -1, I32, {"pair": True}),
    },
    "bench": {
        "--help": ("flag",), "--threads": ("threads",), "--quick": ("flag",), "--no-memory": ("flag",),
        "--masks": ("flag", {"excludes": ["--no-memory", "--decode", "--prefill", "--small-gemm"]}),
        "--decode": ("flag", {"excludes": ["--no-memory", "--masks", "--prefill", "--small-gemm"]}),
        "--prefill": ("flag", {"excludes": ["--no-memory", "--masks", "--decode", "--small-gemm"]}),
        "--small-gemm": ("flag", {"excludes": ["--no-memory", "--masks", "--decode", "--prefill", "--threads"]}),
    },
    "viz": {
        "--help": ("flag",), "--weights": ("in",), "--inputs": ("in",), "--heads": ("int", 1, I32),
        "--checkpoint": ("in",), "--sample-seed": ("seed", {"needs": "--checkpoint"}),
        "--sample-batch": ("int", 1, 4096, {"needs": "--checkpoint"}),
        "--layer": ("int", 0, I32, {"needs": "--checkpoint"}), "--out": ("out", ".png"),
        "--rows": ("int", 0, I32, {"empty": "no row"}), "--show-heads": ("int", 0, I32), "--max-cells": ("int", 1, I32),
        "--title": ("text",), "--layout-json": ("out", ".json"),
        "--causal": ("choice", ["top-left", "bottom-right"]), "--window": ("int", -1, I32, {"pair": True}),
    },
    "train": {
        "--help": ("flag",), "--seed": ("seed",), "--steps": ("int", 0, I64), "--batch": ("int", 1, I32),
        "--layers": ("int", 1, I32), "--heads": ("int", 1, I32), "--hiddens": ("int", 1, I32),
        "--dropout": ("float",), "--bias": ("flag",), "--positions": ("choice", ["learned", "sinusoidal"]),
        "--optimizer": ("choice", ["sgd", "adam", "adamw"]), "--lr": ("float",), "--momentum": ("float",),
        "--weight-decay": ("float",), "--clip": ("float",), "--vocab": ("int", 2, 256),
        "--near": ("int", 1, I32), "--far": ("int", 1, I32), "--min-len": ("int", 1, I32),
        "--max-len": ("int", 1, I32), "--eval-every": ("int", 1, I64), "--eval-size": ("int", 1, I32),
        "--threads": ("threads",), "--target": ("float",), "--stop-at-target": ("flag",),
        "--out": ("out", ".safetensors"), "--curves": ("out", ".csv"), "--plot": ("out", ".png"),
        "--resume": ("in",),
    },
    "prune": {
        "--help": ("flag",), "--checkpoint": ("in",), "--heads": ("int", 1, I32), "--layers": ("int", 1, I32),
        "--hiddens": ("int", 1, I32), "--steps": ("int", 1, I64), "--seed": ("seed",),
        "--train-out": ("out", ".safetensors"), "--importance-size": ("int", 1, I32),
        "--importance-seed": ("seed",), "--random-orders": ("int", 0, I32), "--random-seed": ("seed",),
        "--latency-batch": ("int", 1, I32), "--latency-repeats": ("int", 1, I32), "--threads": ("threads",),
        "--kernel": ("choice", ["reference", "blas", "fused"]), "--plot": ("out", ".png"),
        "--csv": ("out", ".csv"), "--pruned-out": ("out", ".safetensors"),
        "--keep": ("int", 1, I32, {"needs": "--pruned-out"}),
    },
}
COMMANDS = [c for c in RULES if c]


def extras(rule):
    return rule[-1] if isinstance(rule[-1], dict) else {}


def readable(v):
    return {I64: "2^63 - 1", I32: "2^31 - 1", 2**64 - 1: "2^64 - 1"}.get(v, str(v))


def max_threads():
    return max(4, 4 * len(os.sched_getaffinity(0)))


def tool(mha_tool, cwd, *args, timeout=120, **kw):
    return subprocess.run([mha_tool, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=timeout,
                          **kw)


def help_of(mha_tool, cmd):
    r = subprocess.run([mha_tool, *([cmd] if cmd else []), "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout


def help_options(text):
    """{option: its type text (INT:[1, 8]=2 ...)} from a --help page."""
    found = {}
    for line in text.splitlines():
        m = re.match(r"^\s{2}(?:-\w,)?(--[\w-]+)(?:\s+(\S.*?))?(?:\s{2,}|$)", line)
        if m:
            found[m.group(1)] = m.group(2) or ""
    return found


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Files the commands can read: `mha run`'s (4 heads recorded), a checkpoint."""
    t = tmp_path_factory.mktemp("files")
    ones = lambda *s: np.ones(s, np.float32)  # noqa: E731
    m = mha.MultiHeadAttention(8, 4)
    m(ones(1, 2, 8), ones(1, 2, 8), ones(1, 2, 8))
    mha.save_attention(str(t / "w.safetensors"), m)
    mha.save_safetensors(str(t / "i.safetensors"), {"queries": ones(2, 3, 8), "keys": ones(2, 4, 8),
                                                   "values": ones(2, 4, 8)})
    return t


@pytest.fixture(scope="module")
def checkpoint(mha_tool, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ck")
    r = tool(mha_tool, folder, "train", "--hiddens", "8", "--heads", "4", "--eval-size", "4", "--steps", "1",
             "--out", folder / "ck.safetensors", "--curves", "", "--plot", "")
    assert r.returncode == 0, r.stderr
    return folder / "ck.safetensors"


def base_args(cmd, files, checkpoint, out):
    """Arguments under which `cmd` would run, so that an error is the probed option's."""
    return {
        "": ["demo", "--no-heatmap"],
        "demo": ["--no-heatmap"] if out is None else [],
        "run": ["--weights", files / "w.safetensors", "--inputs", files / "i.safetensors", "--out",
                out or files / "o.safetensors"],
        "bench": [],
        "viz": ["--checkpoint", checkpoint, "--out", out or files / "o.png"],
        "train": ["--steps", "0", "--plot", "", "--curves", "", "--out", out or files / "never.safetensors"],
        "prune": ["--checkpoint", checkpoint, "--plot", "", "--csv", ""],
    }[cmd]


# ---- the table covers every option ------------------------------------------

@pytest.mark.parametrize("cmd", [""] + COMMANDS)
def test_every_option_is_in_the_table(mha_tool, cmd):
    shown = set(help_options(help_of(mha_tool, cmd)))
    assert shown == set(RULES[cmd]), (f"mha {cmd} --help shows options the table does not cover, or the table "
                                      f"has options gone: {sorted(shown ^ set(RULES[cmd]))}")


def test_every_command_is_in_the_table(mha_tool):
    text = help_of(mha_tool, "")
    listed = re.findall(r"^\s{2}(\w+)\s{2,}", text.split("Subcommands:")[1], re.M)
    assert sorted(listed) == sorted(COMMANDS)


# ---- integers, thread counts, seeds, sizes ----------------------------------

def integer_cases():
    for cmd, options in RULES.items():
        for option, rule in options.items():
            if rule[0] in ("int", "threads", "seed"):
                yield cmd, option, rule


@pytest.mark.parametrize("cmd,option,rule", list(integer_cases()),
                         ids=[f"{c or 'mha'}{o}" for c, o, _ in integer_cases()])
def test_integers_are_range_checked(mha_tool, tmp_path, files, checkpoint, cmd, option, rule):
    if rule[0] == "int":
        lo, hi = rule[1], rule[2]
    elif rule[0] == "threads":
        lo, hi = 1, max_threads()
    else:
        lo, hi = 0, 2**64 - 1
    rng = f"[{readable(lo)}, {readable(hi)}]"
    assert rng in help_options(help_of(mha_tool, cmd))[option], f"--help does not show {option}'s range {rng}"
    bad = [str(hi + 1), "99999999999999999999", str(2**64), "1.5", "0x10", "+1", " 1", "1e3", "abc",
           str(-2**63 - 1)]
    if lo > -2**63:
        bad.append(str(lo - 1))
    if "empty" not in extras(rule):  # --rows "": no row at all, refused by the command (exit 1)
        bad.append("")
    needs = extras(rule).get("needs")
    enabling = [needs, tmp_path / "p.safetensors"] if needs == "--pruned-out" else []
    for value in bad:
        # A pair (--window LEFT,RIGHT): the bad value second, after a good one.
        given = f"{lo},{value}" if "pair" in extras(rule) and value else value
        r = tool(mha_tool, tmp_path, cmd, *base_args(cmd, files, checkpoint, None), *enabling, option, given)
        want = f"{option}: '{value}' is not an integer in {rng}"
        assert r.returncode == 2 and want in r.stderr, (value, r.returncode, r.stderr)
        assert "\n" not in r.stderr.rstrip("\n"), r.stderr  # one line
    assert not list(tmp_path.glob("*"))


def test_leading_zeros_are_decimal_not_octal(mha_tool, tmp_path):
    """CLI11 alone reads 010 as 8 (strtoll with base 0)."""
    r = tool(mha_tool, tmp_path, "train", "--steps", "0", "--plot", "", "--curves", "", "--hiddens", "010",
             "--heads", "02", "--eval-size", "4", "--seed", "010", "--out", tmp_path / "m.safetensors")
    assert r.returncode == 0, r.stderr
    meta = mha.load_checkpoint(str(tmp_path / "m.safetensors"))[2]
    assert meta["model.num_hiddens"] == "10" and meta["model.num_heads"] == "2", meta
    assert [v for k, v in meta.items() if k.endswith("seed") and "held" not in k] == ["10"], meta


@pytest.mark.parametrize("value", ["99999999999999999999999", "GB", "-1", "1.5GB", "8 XB", "18014398509481984KB",
                                   "", "0x10"])
def test_sizes_are_parsed_strictly(mha_tool, tmp_path, value):
    r = tool(mha_tool, tmp_path, "--memory-limit", value, "demo", "--no-heatmap")
    assert r.returncode == 2 and f"--memory-limit: '{value}' is not a size" in r.stderr, r.stderr


@pytest.mark.parametrize("value", ["0", "1073741824", "8GB", "512MB", "64 mib", "16TB"])
def test_sizes_with_units_are_taken(mha_tool, tmp_path, value):
    r = tool(mha_tool, tmp_path, "--memory-limit", value, "demo", "--no-heatmap")
    assert r.returncode == 0, r.stderr


def test_threads_above_the_most_are_refused_not_crashing(mha_tool, tmp_path):
    """--threads 100000 crashed (SIGSEGV) and 20000 ran with 20000 threads."""
    for value in ("100000", "20000", str(max_threads() + 1)):
        r = tool(mha_tool, tmp_path, "train", "--steps", "0", "--plot", "", "--curves", "", "--threads", value)
        assert r.returncode == 2 and f"[1, {max_threads()}]" in r.stderr, r.stderr
    r = tool(mha_tool, tmp_path, "bench", "--threads", "1", "-1")
    assert r.returncode == 2 and "--threads: '-1' is not an integer in [1, " in r.stderr, r.stderr


# ---- options that do not apply ----------------------------------------------

def needs_cases():
    for cmd, options in RULES.items():
        for option, rule in options.items():
            if "needs" in extras(rule):
                yield cmd, option, rule


VALID = {"int": "1", "seed": "1", "flag": None}


@pytest.mark.parametrize("cmd,option,rule", list(needs_cases()), ids=[f"{c}{o}" for c, o, _ in needs_cases()])
def test_options_that_need_another_are_refused_without_it(mha_tool, tmp_path, files, cmd, option, rule):
    args = {"viz": ["--weights", files / "w.safetensors", "--inputs", files / "i.safetensors",
                    "--out", tmp_path / "o.png"],
            "prune": ["--plot", "", "--csv", ""]}[cmd]
    value = [] if VALID[rule[0]] is None else [VALID[rule[0]]]
    r = tool(mha_tool, tmp_path, cmd, *args, option, *value)
    needed = extras(rule)["needs"]
    assert r.returncode == 2 and f"{option} requires {needed}" in r.stderr, r.stderr
    assert not list(tmp_path.glob("*"))


def excludes_cases():
    for cmd, options in RULES.items():
        for option, rule in options.items():
            for other in extras(rule).get("excludes", []):
                yield cmd, option, other


@pytest.mark.parametrize("cmd,option,other", list(excludes_cases()),
                         ids=[f"{c}{o}{x}" for c, o, x in excludes_cases()])
def test_options_that_exclude_each_other_are_refused_together(mha_tool, tmp_path, cmd, option, other):
    value = {"--heatmap": [tmp_path / "h.png"], "--threads": ["1"]}.get(other, [])
    r = tool(mha_tool, tmp_path, cmd, option, other, *value)
    assert r.returncode == 2, r.stderr
    assert re.search(f"({re.escape(option)} excludes {re.escape(other)}|{re.escape(other)} excludes "
                     f"{re.escape(option)})", r.stderr), r.stderr
    assert not list(tmp_path.glob("*"))


def test_momentum_needs_sgd(mha_tool, tmp_path):
    r = tool(mha_tool, tmp_path, "train", "--steps", "0", "--plot", "", "--curves", "", "--momentum", "0.5")
    assert r.returncode == 2 and "--momentum: applies to --optimizer sgd only, not adam" in r.stderr, r.stderr


def test_prune_keep_past_the_heads_is_refused_before_the_experiment(mha_tool, tmp_path, checkpoint):
    r = tool(mha_tool, tmp_path, "prune", "--checkpoint", checkpoint, "--plot", "", "--csv", "", "--pruned-out",
             tmp_path / "p.safetensors", "--keep", "5", timeout=30)
    assert r.returncode == 1 and "--keep: 5 heads is not in [1, 4]" in r.stderr, r.stderr
    assert "scoring heads" not in r.stdout


@pytest.mark.parametrize("heads", ["0", "-3", "", "x"])
def test_run_checks_given_heads_also_when_the_file_records_them(mha_tool, tmp_path, files, heads):
    r = tool(mha_tool, tmp_path, "run", "--weights", files / "w.safetensors", "--inputs", files / "i.safetensors",
             "--out", tmp_path / "o.safetensors", "--heads", heads)
    assert r.returncode == 2 and f"--heads: '{heads}' is not an integer in [1, 2^31 - 1]" in r.stderr, r.stderr
    r = tool(mha_tool, tmp_path, "run", "--weights", files / "w.safetensors", "--inputs", files / "i.safetensors",
             "--out", tmp_path / "o.safetensors", "--heads", "2")
    assert r.returncode == 1 and "--heads: 2 differs from the 4 heads (as built)" in r.stderr, r.stderr
    assert not list(tmp_path.glob("*"))


# ---- outputs -----------------------------------------------------------------

def output_cases():
    for cmd, options in RULES.items():
        for option, rule in options.items():
            if rule[0] == "out":
                yield cmd, option, rule[1]


def output_args(cmd, option, path, files, checkpoint, tmp):
    """A command line of `cmd` with `option` set to `path` and every other output off or valid."""
    outputs = {o: r[1] for o, r in RULES[cmd].items() if r[0] == "out"}
    args = {"demo": [], "run": ["--weights", files / "w.safetensors", "--inputs", files / "i.safetensors"],
            "viz": ["--checkpoint", checkpoint], "train": ["--steps", "1"],
            "prune": [] if option == "--train-out" else ["--checkpoint", checkpoint]}[cmd]
    required = {"--out"} if cmd in ("run", "viz") else set()
    for o, ext in outputs.items():
        if o == option:
            args += [o, path]
        elif o in required:
            args += [o, tmp / f"main{ext}"]
        elif cmd in ("train", "prune") and o in ("--curves", "--plot", "--csv"):
            args += [o, ""]
    return args


@pytest.mark.parametrize("cmd,option,ext", list(output_cases()), ids=[f"{c}{o}" for c, o, _ in output_cases()])
def test_outputs_with_another_formats_extension_are_refused(mha_tool, tmp_path, files, checkpoint, cmd, option,
                                                            ext):
    for wrong in sorted({".png", ".safetensors", ".csv", ".json", ".pt", ".npy", ".onnx"} - {ext}):
        path = tmp_path / f"x{wrong}"
        r = tool(mha_tool, tmp_path, cmd, *output_args(cmd, option, path, files, checkpoint, tmp_path))
        assert r.returncode == 1, (wrong, r.returncode, r.stderr)
        assert f"{option}: '{path}' names " in r.stderr and f"give it a {ext} name" in r.stderr, r.stderr
    assert not list(tmp_path.glob("*"))


# ---- named values, help, exit statuses --------------------------------------

def test_help_shows_names_not_numbers(mha_tool):
    for cmd, options in RULES.items():
        shown = help_options(help_of(mha_tool, cmd))
        for option, rule in options.items():
            if rule[0] == "choice":
                text = shown[option]
                assert "->" not in text and " OR " not in text, (cmd, option, text)
                assert all(n in text for n in rule[1]), (cmd, option, text)
                assert not re.search(r"\{[\d,]+\}", text), (cmd, option, text)


def test_named_values_take_names_only(mha_tool, tmp_path, files):
    for value in ("1", "3", "grid2"):
        r = tool(mha_tool, tmp_path, "run", "--weights", files / "w.safetensors", "--inputs", files / "i.safetensors",
                 "--out", tmp_path / "o.safetensors", "--parallel", value)
        assert r.returncode == 2 and "--parallel" in r.stderr, r.stderr


def test_defaults_agree_with_the_readme(mha_tool):
    """README.md: the default attention kernel is the fused one."""
    assert "The default attention kernel (`mha.Kernel.FUSED`" in (ROOT / "README.md").read_text()
    assert re.search(r"--kernel TEXT:\{reference,blas,fused\}=fused", help_of(mha_tool, "prune"))


@pytest.mark.parametrize("argv,status", [
    (["bogus"], 2), ([], 2), (["demo", "--bogus"], 2), (["run"], 2), (["--memory-limit"], 2),
    (["run", "--weights", "no-such-file", "--inputs", "x", "--out", "o.safetensors"], 2),
    (["train", "--steps", "1x"], 2), (["viz", "--out"], 2), (["bench", "--threads"], 2),
    (["--help"], 0), (["--version"], 0), (["train", "--help"], 0),
    (["demo", "--heatmap", "no/such/folder/h.png"], 1),
    (["train", "--steps", "0"], 1),
])
def test_exit_status_2_for_usage_errors_and_1_for_failures(mha_tool, tmp_path, argv, status):
    r = tool(mha_tool, tmp_path, *argv)
    assert r.returncode == status, (r.returncode, r.stderr)
    if status:
        assert re.fullmatch(r"mha( \w+)?: error: .+\n", r.stderr), r.stderr


def cli_usage_rows():
    rows = []
    for line in (ROOT / "docs" / "errors.md").read_text().splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if "CLI usage" in {s.strip() for s in cells[2].split(",")}:
                rows.append((cells[0].strip("`"), cells[1][1:-1]))
    return rows


def message_regex(pattern):
    parts = re.split(r"(<[^<> ]+>)", pattern)
    return "".join(".+?" if p.startswith("<") and p.endswith(">") else re.escape(p) for p in parts)


@pytest.mark.parametrize("row_id,message", cli_usage_rows(), ids=[i for i, _ in cli_usage_rows()])
def test_cli_usage_row(mha_tool, tmp_path, row_id, message):
    assert row_id in catalogue_triggers.CLI_USAGE, f"no trigger for catalogue row {row_id}"
    argv = catalogue_triggers.CLI_USAGE[row_id](tmp_path)
    r = tool(mha_tool, tmp_path, *argv)
    assert r.returncode == 2, (r.returncode, r.stderr)
    words = [a for a in argv if not a.startswith("-") and a not in ("GB",)]
    cmd = "mha" + (f" {words[0]}" if words and words[0] in COMMANDS else "")
    assert re.fullmatch(f"{cmd}: error: " + message_regex(message) + "\n", r.stderr), \
        f"\ndocumented: {message}\n   printed: {r.stderr}"
    assert not list(tmp_path.glob("o.*"))


def test_every_usage_trigger_is_catalogued():
    assert set(catalogue_triggers.CLI_USAGE) == {i for i, _ in cli_usage_rows()}


# ---- standard output ----------------------------------------------------------

@pytest.mark.parametrize("argv", [["demo", "--no-heatmap"], ["--help"], ["train", "--help"], ["--version"]])
def test_a_lost_write_to_stdout_is_a_failure(mha_tool, tmp_path, argv):
    with open("/dev/full", "w") as full:
        r = subprocess.run([mha_tool, *argv], stdout=full, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                           timeout=60)
    assert r.returncode == 1, r.stderr
    row = next(m for i, m in catalogue_triggers_rows() if i == "cli.stdout")
    cmd = "mha" + (f" {argv[0]}" if argv[0] in COMMANDS else "")
    op = argv[0] if argv[0] in COMMANDS else "mha"
    want = message_regex(row.replace("[demo]", f"[{op}]"))
    assert re.fullmatch(f"{cmd}: error: {want}\n", r.stderr), r.stderr


def catalogue_triggers_rows():
    for line in (ROOT / "docs" / "errors.md").read_text().splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            yield cells[0].strip("`"), cells[1][1:-1]


# ---- permissions of replaced outputs ----------------------------------------

@pytest.mark.parametrize("mode", [0o600, 0o640, 0o604])
def test_a_replaced_output_keeps_its_permissions(mha_tool, tmp_path, files, mode):
    out = tmp_path / "o.safetensors"
    out.write_bytes(b"old")
    out.chmod(mode)
    r = tool(mha_tool, tmp_path, "run", "--weights", files / "w.safetensors", "--inputs", files / "i.safetensors",
             "--out", out)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(out.stat().st_mode) == mode
    assert "output" in mha.load_safetensors(str(out))


def test_a_new_output_gets_the_umasks_permissions(mha_tool, tmp_path, files):
    out = tmp_path / "o.safetensors"
    r = tool(mha_tool, tmp_path, "run", "--weights", files / "w.safetensors", "--inputs", files / "i.safetensors",
             "--out", out, preexec_fn=lambda: os.umask(0o027))
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o640


# ---- bench output -------------------------------------------------------------

def test_bench_prints_plain_lines_into_files_and_no_target_lines(mha_tool, tmp_path):
    """Redirected (not a terminal): no escapes, no carriage returns, no internal targets."""
    r = tool(mha_tool, tmp_path, "bench", "--prefill", "--quick", "--threads", "1", timeout=600)
    assert r.returncode == 0, r.stderr
    for text in (r.stdout, r.stderr):
        assert "\x1b" not in text and "\r" not in text
        assert "MISSED" not in text and "Target" not in text
    for source in ("bench.cpp", "bench_decode.cpp", "bench_masks.cpp", "bench_gemm_small.cpp"):
        text = (ROOT / "tools" / source).read_text()
        assert "MISSED" not in text and "\\033" not in text, source  # escapes only in bench_progress.h


# ---- other file kinds given as safetensors ----------------------------------

def npy_file(path):
    np.save(path, np.ones(3, np.float32))
    return path


def pickle_file(path):
    path.write_bytes(pickle.dumps({"W_q.weight": [1.0, 2.0]}, protocol=2))
    return path


def zip_file(path):
    try:
        import torch
        torch.save({"w": torch.ones(2)}, str(path))
    except ImportError:
        import zipfile
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    return path


def onnx_file(path):
    path.write_bytes(b"\x08\x07\x12\x07pytorch\x1a\x052.1.0:\x9a\x01\n" + bytes(200))
    return path


KINDS = [
    ("model.pt", zip_file, "it looks like a zip archive, as torch.save writes (.pt, .pth)"),
    ("old.pt", pickle_file, "it looks like a Python pickle, as older torch.save writes"),
    ("x.npy", npy_file, "it looks like a numpy .npy array"),
    ("model.onnx", onnx_file, "it looks like an ONNX model (by its name)"),
    ("model.bin", onnx_file, "not a safetensors file (or a damaged one): its first 8 bytes give a header length"),
]


@pytest.mark.parametrize("name,make,message", KINDS, ids=[k[0] for k in KINDS])
def test_other_file_kinds_are_named(mha_tool, tmp_path, files, name, make, message):
    path = make(tmp_path / name)
    with pytest.raises(ValueError, match=re.escape(f"[safetensors] '{path}': not a safetensors file")) as e:
        mha.load_safetensors(str(path))
    assert message in str(e.value)
    with pytest.raises(ValueError, match=re.escape(message)):
        mha.load_attention(str(path))
    r = tool(mha_tool, tmp_path, "run", "--weights", path, "--inputs", files / "i.safetensors", "--heads", "4",
             "--out", tmp_path / "o.safetensors")
    assert r.returncode == 1 and message in r.stderr, r.stderr
    r = tool(mha_tool, tmp_path, "viz", "--checkpoint", path, "--out", tmp_path / "o.png")
    assert r.returncode == 1 and message in r.stderr, r.stderr


# ---- nn.MultiheadAttention's state dict -------------------------------------

@pytest.mark.parametrize("bias", [True, False])
def test_run_reads_nn_multihead_attentions_state_dict(mha_tool, tmp_path, bias):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    E, H = 12, 3
    ref = torch.nn.MultiheadAttention(E, H, bias=bias, batch_first=True).eval()
    mha.save_safetensors(str(tmp_path / "w.safetensors"), {k: v.detach().numpy() for k, v in ref.state_dict().items()})
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in [(2, 4, E), (2, 5, E), (2, 5, E)])
    mha.save_safetensors(str(tmp_path / "i.safetensors"), {"queries": q, "keys": k, "values": v})
    r = tool(mha_tool, tmp_path, "run", "--weights", "w.safetensors", "--inputs", "i.safetensors", "--heads", H,
             "--out", "o.safetensors")
    assert r.returncode == 0, r.stderr
    got = mha.load_safetensors(str(tmp_path / "o.safetensors"))
    with torch.no_grad():
        out, w = ref(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), average_attn_weights=False)
    np.testing.assert_allclose(got["output"], out.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["attention_weights"], w.numpy(), rtol=1e-5, atol=1e-6)


def test_run_names_nn_multihead_attention_layouts_it_cannot_hold(mha_tool, tmp_path):
    argv = catalogue_triggers.torch_mha_weights(tmp_path, bias_k=np.ones((1, 1, 10), np.float32))
    r = tool(mha_tool, tmp_path, *argv)
    assert r.returncode == 1 and "mha.TorchMultiheadAttention.from_safetensors" in r.stderr, r.stderr
    mha.save_safetensors(str(tmp_path / "w.safetensors"), {"weight": np.ones((2, 2), np.float32)})
    r = tool(mha_tool, tmp_path, *argv)
    assert r.returncode == 1 and "no tensor 'W_q.weight' (found: weight); wanted d2l's" in r.stderr, r.stderr
