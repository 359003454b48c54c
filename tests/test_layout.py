"""The files' layout: the project's modules import each other without a circle (a module a reader opens never needs
one that needs it back), read from the sources, imports inside functions included."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def project_imports(root=ROOT):
    """{module: the project's modules it imports}, for every top-level .py file and the rewards package."""
    files = {f[:-3]: os.path.join(root, f) for f in os.listdir(root) if f.endswith(".py")}
    files["rewards"] = os.path.join(root, "rewards", "__init__.py")
    graph = {}
    for name, path in files.items():
        with open(path) as f:
            tree = ast.parse(f.read())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
        graph[name] = sorted(found & set(files) - {name})
    return graph


def find_cycle(graph):
    """One import circle as a list of modules (first == last), or None."""
    state, path = {}, []

    def visit(module):
        state[module] = "open"
        path.append(module)
        for dep in graph[module]:
            if state.get(dep) == "open":
                return path[path.index(dep):] + [dep]
            if dep not in state:
                cycle = visit(dep)
                if cycle:
                    return cycle
        path.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module)
            if cycle:
                return cycle
    return None


def test_no_import_circle():
    assert find_cycle(project_imports()) is None, " -> ".join(find_cycle(project_imports()))


def test_find_cycle_sees_a_circle_through_a_function_import(tmp_path):
    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards" / "__init__.py").write_text("")
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("from c import x\n")
    (tmp_path / "c.py").write_text("def f():\n    import a\n")
    graph = project_imports(str(tmp_path))
    assert graph["a"] == ["b"] and find_cycle(graph) == ["a", "b", "c", "a"]
    (tmp_path / "c.py").write_text("import rewards\n")
    assert find_cycle(project_imports(str(tmp_path))) is None


def wide_functions(path, most=5):
    """'name (n parameters)' for each function in the file at `path` taking more than `most` (self not counted)."""
    with open(path) as f:
        tree = ast.parse(f.read())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg != "self"]
            if len(names) > most:
                found.append(f"{node.name} ({len(names)} parameters)")
    return found


def test_the_loop_passes_one_run_not_five_things():
    """trainer.py: the loop's functions take the Run begin() makes, never cfg, comm, transport, state and learner
    one by one (a reader follows one object, and a new part of the loop does not widen every signature)."""
    assert wide_functions(os.path.join(ROOT, "trainer.py")) == []


def test_wide_functions_counts_parameters(tmp_path):
    (tmp_path / "m.py").write_text("def f(a, b, c, d, e, g=1):\n    pass\n\nclass C:\n"
                                   "    def h(self, a, b, c, d, *, e):\n        pass\n")
    assert wide_functions(str(tmp_path / "m.py")) == ["f (6 parameters)"]
