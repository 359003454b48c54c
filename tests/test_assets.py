"""The shipped tiny models and data (assets/): every machine loads the same bytes, and a changed file is refused."""
import os
import shutil
import subprocess
import sys

import pytest

import policy
from conftest import ASSETS, ROOT
from policy import ModelError, check_shipped


def test_every_shipped_file_is_listed_and_matches():
    on_disk = sorted(os.path.relpath(os.path.join(d, f), ASSETS) for d, _, fs in os.walk(ASSETS) for f in fs
                     if f not in ("SHA256SUMS", "README.md"))
    listed = [line.split()[1] for line in open(os.path.join(ASSETS, "SHA256SUMS")).read().splitlines()]
    assert on_disk == sorted(listed)
    for name in listed:
        check_shipped(os.path.join(ASSETS, name))
    for path in ("tiny-arith/sft", "tiny-tldr", "tiny-redteam/toxicity", "tiny-redteam-modes/sft", "tiny-tldr-mini/sft",
                 "tiny-tldr-mini/rm"):
        check_shipped(os.path.join(ASSETS, path))


@pytest.fixture
def copy(tmp_path, monkeypatch):
    """A copy of assets/ that policy.check_shipped takes for the shipped one."""
    root = tmp_path / "assets"
    shutil.copytree(ASSETS, root)
    monkeypatch.setattr(policy, "ASSETS", str(root))
    return root


def test_a_changed_or_missing_file_is_refused_in_one_line(copy):
    model = copy / "tiny-arith" / "sft"
    check_shipped(str(model))  # the copy is intact
    data = bytearray((model / "model.safetensors").read_bytes())
    data[-1] ^= 1  # one bit of the last weight
    (model / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ModelError, match=r"sft/model\.safetensors is not the shipped file.*git checkout -- assets"):
        check_shipped(str(model))
    with pytest.raises(ModelError, match="not the shipped file"):
        policy.load_model(str(model), "float32", "cpu")
    check_shipped(str(copy / "tiny-tldr"))  # other folders are not concerned
    os.remove(copy / "tiny-tldr" / "test.jsonl")
    with pytest.raises(ModelError, match=r"test\.jsonl is missing"):
        check_shipped(str(copy / "tiny-tldr"))
    with pytest.raises(ModelError, match="not among the shipped files"):
        check_shipped(str(copy / "tiny-nothing"))
    check_shipped("/tmp")  # outside assets/: nothing to check


def test_prepare_refuses_a_changed_shipped_model(tmp_path):
    """The run's first check (launch.sh runs train.py --prepare) names the file in one line, exit code 2."""
    work = tmp_path / "repo"
    shutil.copytree(ROOT, work, ignore=shutil.ignore_patterns(".venv", ".git", "out", "__pycache__", ".cache"))
    with open(work / "assets" / "tiny-arith" / "sft" / "config.json", "a") as f:
        f.write(" ")
    p = subprocess.run([sys.executable, "train.py", "configs/tiny.yaml", "--prepare", f"out_dir={tmp_path / 'out'}"],
                       cwd=work, capture_output=True, text=True, timeout=120, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "assets/tiny-arith/sft/config.json is not the shipped file" in p.stderr
