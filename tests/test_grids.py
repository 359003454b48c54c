"""scripts/redteam_grid.sh and scripts/tldr_grid.sh (their loop: scripts/grid.sh): an unknown arm is one clear line
and exit 2; a finished run is skipped without a launch, so rerunning a grid resumes it."""
import json
import os
import subprocess

import pytest
from conftest import ROOT


def grid(script, tmp_path, **env):
    return subprocess.run(["bash", os.path.join(ROOT, "scripts", script)], capture_output=True, text=True,
                          env={**os.environ, "OUT": str(tmp_path), **env}, timeout=60)


@pytest.mark.parametrize("script,arm", [("redteam_grid.sh", "tb_sync"), ("tldr_grid.sh", "online_dpo_d14")])
def test_grid_skips_finished_runs_and_refuses_unknown_arms(script, arm, tmp_path):
    p = grid(script, tmp_path, ARMS="bogus", SEEDS="0")
    assert p.returncode == 2 and "error: unknown arm 'bogus'" in p.stderr and arm in p.stderr
    for seed in (0, 1):
        os.makedirs(tmp_path / arm / f"seed{seed}", exist_ok=True)
        json.dump({"steps": 1}, open(tmp_path / arm / f"seed{seed}" / "summary.json", "w"))
    p = grid(script, tmp_path, ARMS=arm, SEEDS="0 1")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [f"skip {tmp_path}/{arm}/seed{seed} (finished)" for seed in (0, 1)]
