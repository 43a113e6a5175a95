"""The Python package's modules import one another without a circle (docs/architecture.md: each module
imports only modules below it). Read from the source: every module-level `from . import x` and
`from .x import y` of python/mha/*.py is an edge; imports inside functions (lazy ones, such as
mha.torch's on first use) are not."""
import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent.parent / "python" / "mha"


def module_imports(path):
    """The package modules that `path` imports at module level."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
    return found


def circle(graph):
    """An import circle of graph (name -> imported names) as a list of names, or None."""
    state = {}

    def visit(name, path):
        state[name] = "open"
        for dep in graph.get(name, ()):
            if state.get(dep) == "open":
                return path + [dep]
            if dep not in state:
                found = visit(dep, path + [dep])
                if found:
                    return found
        state[name] = "done"
        return None

    for name in sorted(graph):
        if name not in state:
            found = visit(name, [name])
            if found:
                return found
    return None


def test_no_import_circle():
    modules = {p.stem: p for p in PACKAGE.glob("*.py")}
    graph = {name: sorted(module_imports(p) & set(modules)) for name, p in modules.items()}
    assert "torch_drop_in" in graph and graph["torch"], "the package layout this test reads"
    found = circle(graph)
    assert found is None, "import circle: " + " -> ".join(found or [])


def test_the_check_finds_a_circle(tmp_path):
    (tmp_path / "a.py").write_text("from . import b\n\ndef f():\n    from . import c\n")
    (tmp_path / "b.py").write_text("from .c import x\n")
    (tmp_path / "c.py").write_text("from .a import y\n")
    graph = {p.stem: sorted(module_imports(p)) for p in tmp_path.glob("*.py")}
    assert graph == {"a": ["b"], "b": ["c"], "c": ["a"]}  # a's import inside f is lazy: no edge
    assert circle(graph) == ["a", "b", "c", "a"]
    assert circle({"a": ["b"], "b": [], "c": ["a", "b"]}) is None
