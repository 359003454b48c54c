"""scripts/redteam_grid.sh and scripts/tldr_grid.sh (their loop: scripts/grid.sh): an unknown arm is one clear line
and exit 2; a finished run is skipped without a launch, so rerunning a grid resumes it; DRY_RUN=1 lists the runs; the
red-teaming grid's objectives share each KL coefficient and the TL;DR grid runs its positive control first."""
import json
import os
import subprocess

import pytest
import yaml
from conftest import ROOT


def grid(script, tmp_path, *args, **env):
    return subprocess.run(["bash", os.path.join(ROOT, "scripts", script), *args], capture_output=True, text=True,
                          env={**os.environ, "OUT": str(tmp_path), **env}, timeout=60)


@pytest.mark.parametrize("script,arm", [("redteam_grid.sh", "tb_b0.1"), ("tldr_grid.sh", "online_dpo_d14")])
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
    runs = [line[3:].split(": ", 1) for line in p.stdout.splitlines() if line.startswith("== ")]
    assert len(runs) == 4 * 6 and not os.listdir(tmp_path) and all(o.startswith("async=false") for _, o in runs)
    assert [head for head, _ in runs[:6]] == [f"{arm} seed 0 -> {tmp_path}/{arm}/seed0" for arm in (
        "rloo_d0", "rloo_d14", "grpo_d0", "grpo_d14", "online_dpo_d0", "online_dpo_d14")]
    assert runs[-1][0].startswith("online_dpo_d14 seed 3") and "weight_delay=14 loss=online_dpo dpo_beta=0.4" in runs[-1][1]
    p = grid("tldr_grid.sh", tmp_path, "compare", DRY_RUN="1", SEEDS="0")
    runs = [line[3:].split(": ", 1) for line in p.stdout.splitlines() if line.startswith("== ")]
    assert [head.split()[0] for head, _ in runs] == ["tb", "tb_m0.1", "tb_m0.9"]
    assert all("beta_end=0.4" in o for _, o in runs)
    p = grid("tldr_grid.sh", tmp_path)
    assert p.returncode == 2 and "usage: bash scripts/tldr_grid.sh control|compare" in p.stderr


def test_redteam_grid_runs_every_objective_at_each_kl_coefficient(tmp_path):
    p = grid("redteam_grid.sh", tmp_path, DRY_RUN="1")
    assert p.returncode == 0, p.stderr
    runs = [line[3:].split(": ", 1) for line in p.stdout.splitlines() if line.startswith("== ")]
    assert len(runs) == 63 and not os.listdir(tmp_path)  # 21 arms x 3 seeds, nothing launched
    arms = {head.split(" ")[0]: dict(kv.split("=") for kv in overrides.split()) for head, overrides in runs}
    for beta in ("0.05", "0.1", "0.2", "1.0"):
        for loss in ("tb", "grpo", "rloo", "online_dpo"):
            o = arms[f"{loss}_b{beta}"]
            assert o["loss"] == loss and o["beta_start"] == o["beta_end"] == beta
            assert o.get("dpo_beta", beta) == beta  # online DPO's KL coefficient is its DPO beta
    assert arms["dr_grpo"] == {"loss": "dr_grpo"} and arms["grpo_nokl"]["beta_end"] == "0.0001"
    assert arms["buffer640_b0.2"]["per_prompt_cap"] == "10" and arms["buffer64k_b0.2"]["per_prompt_cap"] == "1000"
    # The amended control runs 1200 steps and is read there; the compared arms' first 600 steps stand for a 1200-step
    # run only because nothing in them is scheduled over the run's length: a constant lr and a constant beta.
    assert arms["grpo_nokl_1200"] == {**arms["grpo_nokl"], "steps": "1200"}
    cfg = yaml.safe_load(open(os.path.join(ROOT, "configs/redteam_modes.yaml")))
    assert cfg["lr_schedule"] == "constant" and cfg["steps"] == 600 and cfg["beta_start"] == cfg["beta_end"]
    assert all(o.get("beta_start", cfg["beta_start"]) == o.get("beta_end", cfg["beta_end"]) and "lr_schedule" not in o
               for o in arms.values())


def test_passk_grid_holds_everything_but_the_objective_and_the_controls_kl(tmp_path):
    """scripts/passk_grid.sh (docs/diversity.md): every arm is the tiny default with 16 samples a problem at each
    evaluation; the objectives share beta 0.05, and only the positive control drops the KL term."""
    p = grid("passk_grid.sh", tmp_path, "pilot", DRY_RUN="1", PACKED=str(tmp_path / "packed"))
    assert p.returncode == 0, p.stderr
    runs = [line.split(": ", 1) for line in p.stdout.splitlines() if line.startswith("== ")]
    assert [r[0].split(" -> ")[0] for r in runs] == [f"== {a} seed {s}" for s in (0, 1)
                                                     for a in ("tb", "grpo", "rloo", "grpo_nokl")]
    for head, args in runs:
        assert "time_budget_min=0 eval_every=100 eval_samples=16" in args
        nokl = "grpo_nokl" in head
        assert ("beta_start=0 beta_end=0" in args) is nokl and ("beta_start=0.05 beta_end=0.05" in args) is not nokl
    p = grid("passk_grid.sh", tmp_path)
    assert p.returncode == 2 and "usage: bash scripts/passk_grid.sh pilot|test" in p.stderr
