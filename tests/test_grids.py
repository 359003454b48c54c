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
    # PACKED: an empty folder unless a test names one, so no test depends on the runs the repository has packed
    env = {"OUT": str(tmp_path), "PACKED": str(tmp_path.parent / f"{tmp_path.name}_nothing_packed"), **env}
    return subprocess.run(["bash", os.path.join(ROOT, "scripts", script), *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60)


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
        assert "steps=1000 " in args  # the registered length
    # the control's fallback (the pilot's amendment): grpo_nokl alone, seed 0, 2000 steps; the test can follow it there
    p = grid("passk_grid.sh", tmp_path, "control", DRY_RUN="1", PACKED=str(tmp_path / "packed"))
    assert [line.split(" -> ")[0] for line in p.stdout.splitlines() if line.startswith("== ")] == ["== grpo_nokl seed 0"]
    assert "steps=2000 " in p.stdout and "loss=grpo beta_start=0 beta_end=0" in p.stdout
    p = grid("passk_grid.sh", tmp_path, "test", DRY_RUN="1", STEPS="2000", PACKED=str(tmp_path / "packed"))
    heads = [line for line in p.stdout.splitlines() if line.startswith("== ")]
    assert len(heads) == 24 and all("steps=2000 " in h and "_2000/" in h for h in heads)
    p = grid("passk_grid.sh", tmp_path)
    assert p.returncode == 2 and "usage: bash scripts/passk_grid.sh pilot|test|control" in p.stderr


def test_ablation_grid_lists_each_questions_arms_at_equal_fresh_samples(tmp_path):
    """scripts/ablation_grid.sh (docs/ablations.md): each question's arms, seed by seed, every one the tiny default
    with 16 samples a problem on 1,000 test problems; 2 searchers x max_prompts_per_round x S a round is 64 (S = 10:
    60, which max_reuse = 2 tops up) in every arm, B x K = 64; q4's arms also log the KL to the start model."""
    want = {"q1": ["m0.95_it0", "m0.5_it0", "m0.5_it1", "m0.95_it1"], "q2": ["k8", "k16"],
            "q3": ["tb_s8", "tb_s10", "tb_s16", "grpo_s8", "grpo_s10", "grpo_s16"], "q4": ["const", "anneal", "reset"]}
    arms = {}
    for q, names in want.items():
        p = grid("ablation_grid.sh", tmp_path, q, "pilot", DRY_RUN="1", PACKED=str(tmp_path / "packed"))
        assert p.returncode == 0, p.stderr
        runs = [line[3:].split(": ", 1) for line in p.stdout.splitlines() if line.startswith("== ")]
        assert [head.split(" -> ")[0] for head, _ in runs] == [f"{a} seed {s}" for s in (0, 1) for a in names]
        assert not os.listdir(tmp_path)  # nothing launched
        for head, args in runs:
            assert "time_budget_min=0 eval_every=100 eval_samples=16 test_data=procedural:test:1000 n_test=1000" in args
            o = dict(kv.split("=") for kv in args.split())
            arms[(q, head.split()[0])] = o
            assert o["max_reuse"] == "2" and int(o["B"]) * int(o["K"]) == 64 and int(o["S"]) >= int(o["K"])
            per_round = 2 * int(o["max_prompts_per_round"]) * int(o["S"])
            assert per_round == (60 if o["S"] == "10" else 64)
            assert (o.get("eval_kl_sft") == "true") is (q == "q4")
    assert {a: (o["m"], o["inv_temp"]) for (q, a), o in arms.items() if q == "q1"} == {
        "m0.95_it0": ("0.95", "0"), "m0.5_it0": ("0.5", "0"), "m0.5_it1": ("0.5", "1"), "m0.95_it1": ("0.95", "1")}
    assert arms[("q2", "k16")]["K"] == "16" and arms[("q2", "k16")]["B"] == "4"
    assert {arms[("q3", a)]["loss"] for a in want["q3"]} == {"tb", "grpo"}
    assert [arms[("q3", f"tb_s{s}")]["S"] for s in (8, 10, 16)] == ["8", "10", "16"]
    const, anneal, reset = (arms[("q4", a)] for a in want["q4"])
    assert const["beta_start"] == const["beta_end"] == reset["beta_end"] == anneal["beta_start"] == "0.05"
    assert anneal["beta_end"] == "0.0143" and anneal["beta_decay_steps"] == "500" and reset["ref_reset_every"] == "50"
    assert "ref_reset_every" not in const and "beta_decay_steps" not in const
    p = grid("ablation_grid.sh", tmp_path, "q1")
    assert p.returncode == 2 and "usage: bash scripts/ablation_grid.sh q1|q2|q3|q4 pilot|test" in p.stderr


def test_search_scaling_grid_paces_16_32_64_fresh_samples_a_step(tmp_path):
    """scripts/search_scaling_grid.sh (docs/diversity.md, "Does more search find more?"): F fresh samples per 64-sample
    step from 2 searchers x max_prompts_per_round P x S = 8 per round of k = 2 steps (P = F / 8) with the trainer held
    to max_reuse = 64 / F; the real-ranks arms make 16 a step per searcher; the tasks' lengths and evaluations."""
    for task, config in (("redteam", "redteam_modes.yaml"), ("math", "tiny.yaml")):
        cfg = yaml.safe_load(open(os.path.join(ROOT, "configs", config)))
        assert (cfg["n_searchers"], cfg["S"], cfg["k"], cfg["B"] * cfg["K"]) == (2, 8, 2, 64)
        p = grid("search_scaling_grid.sh", tmp_path, task, "pilot", DRY_RUN="1", PACKED=str(tmp_path / "packed"))
        assert p.returncode == 0, p.stderr
        runs = [line[3:].split(": ", 1) for line in p.stdout.splitlines() if line.startswith("== ")]
        assert [r[0].split(" -> ")[0] for r in runs] == [f"{a} seed {s}" for s in (0, 1) for a in (
            "tb_f16", "grpo_f16", "tb_f32", "grpo_f32", "tb_f64", "grpo_f64")] and not os.listdir(tmp_path)
        for head, overrides in runs:
            o = dict(kv.split("=") for kv in overrides.split())
            F = int(head.split()[0].split("_f")[1])
            assert o["loss"] == head.split("_")[0] and o.get("n_searchers", "2") == "2"
            assert 2 * int(o["max_prompts_per_round"]) * cfg["S"] / cfg["k"] == F and float(o["max_reuse"]) == 64 / F
            assert o["steps"] == ("1200" if task == "redteam" else "300")
            if task == "math":
                assert o["eval_samples"] == "16" and o["eval_every"] == "100" and o["time_budget_min"] == "0"
        p = grid("search_scaling_grid.sh", tmp_path, task, "ranks", DRY_RUN="1")
        runs = [line[3:].split(": ", 1) for line in p.stdout.splitlines() if line.startswith("== ")]
        assert len(runs) == 2 * 4 and all(o.endswith("max_prompts_per_round=4 max_reuse=" + ("4" if "n1" in h else "1"))
                                          for h, o in runs)
        assert grid("search_scaling_grid.sh", tmp_path, task, "test", DRY_RUN="1").stdout.count("== ") == 6 * 4
    p = grid("search_scaling_grid.sh", tmp_path, "math")
    assert p.returncode == 2 and "usage: bash scripts/search_scaling_grid.sh redteam|math pilot|test|ranks" in p.stderr
