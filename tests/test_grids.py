"""scripts/redteam_grid.sh and scripts/tldr_grid.sh (their loop: scripts/grid.sh): an unknown arm is one clear line
and exit 2; a finished run is skipped without a launch, so rerunning a grid resumes it; DRY_RUN=1 prints the launch
lines."""
import json
import os
import subprocess

import pytest
from conftest import ROOT


def grid(script, tmp_path, *args, **env):
    return subprocess.run(["bash", os.path.join(ROOT, "scripts", script), *args], capture_output=True, text=True,
                          env={**os.environ, "OUT": str(tmp_path), **env}, timeout=60)


@pytest.mark.parametrize("script,arm", [("redteam_grid.sh", "tb_sync"), ("tldr_grid.sh", "online_dpo_d14")])
def test_grid_skips_finished_runs_and_refuses_unknown_arms(script, arm, tmp_path):
    args = ["control"] if script == "tldr_grid.sh" else []
    p = grid(script, tmp_path, *args, ARMS="bogus", SEEDS="0")
    assert p.returncode == 2 and "error: unknown arm 'bogus'" in p.stderr and arm in p.stderr
    for seed in (0, 1):
        os.makedirs(tmp_path / arm / f"seed{seed}", exist_ok=True)
        json.dump({"steps": 1}, open(tmp_path / arm / f"seed{seed}" / "summary.json", "w"))
    p = grid(script, tmp_path, *args, ARMS=arm, SEEDS="0 1")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [f"skip {tmp_path}/{arm}/seed{seed} (finished)" for seed in (0, 1)]


def test_tldr_grid_runs_the_positive_control_first_and_dry_runs(tmp_path):
    """tldr_grid.sh control: the six baseline arms (D = 0 and 14), seed by seed; compare: TB and its m ablation;
    every arm at the KL coefficient 0.4 of the config; no phase is a usage line."""
    p = grid("tldr_grid.sh", tmp_path, "control", DRY_RUN="1")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 4 * 6 and all(line.startswith("bash launch.sh configs/tldr_mini.yaml async=false") for line in lines)
    assert [line.split("out_dir=")[1].split()[0] for line in lines[:6]] == [
        f"{tmp_path}/{arm}/seed0" for arm in ("rloo_d0", "rloo_d14", "grpo_d0", "grpo_d14", "online_dpo_d0",
                                              "online_dpo_d14")]
    assert "weight_delay=14 loss=online_dpo dpo_beta=0.4 seed=3" in lines[-1]
    p = grid("tldr_grid.sh", tmp_path, "compare", DRY_RUN="1", SEEDS="0")
    assert [line.split("out_dir=")[1].split()[0].split("/")[-2] for line in p.stdout.splitlines()] == [
        "tb", "tb_m0.1", "tb_m0.9"]
    assert all("beta_end=0.4" in line for line in p.stdout.splitlines())
    p = grid("tldr_grid.sh", tmp_path)
    assert p.returncode == 2 and "usage: bash scripts/tldr_grid.sh control|compare" in p.stderr
