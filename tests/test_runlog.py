"""What a run leaves for a person and their tracker (runlog.py): plain progress lines when the output is a log file,
and every scalar of metrics.jsonl, the resolved config and the run's name in wandb (offline) and trackio (local)."""
import glob
import importlib.util
import io
import json
import math
import os
import sqlite3
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT, read_run, start

import runlog

NEEDS_TRACKERS = pytest.mark.skipif(
    not (importlib.util.find_spec("wandb") and importlib.util.find_spec("trackio")),
    reason="the optional trackers are not installed: pip install wandb==0.31.0 trackio==0.43.0 (.ci/run does)")


def wandb_history(out_dir):
    """Every wandb offline run folder under out_dir/wandb: (run id, display name, config, history rows). The run file
    (run-<id>.wandb) is a LevelDB-style log of protobuf records: a 7-byte header, then 32 KiB blocks of chunks, each
    with a 7-byte head (crc32, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2
    runs = []
    for folder in sorted(glob.glob(os.path.join(out_dir, "wandb", "offline-run-*"))):
        (path,) = glob.glob(os.path.join(folder, "run-*.wandb"))
        data, pos, parts, run = open(path, "rb").read(), 7, b"", {"history": []}
        while pos + 7 <= len(data):
            if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk head is padding
                pos += 32768 - pos % 32768
                continue
            length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
            parts, pos = parts + data[pos + 7:pos + 7 + length], pos + 7 + length
            if kind not in (1, 4):
                continue
            record, parts = wandb_internal_pb2.Record.FromString(parts), b""
            if record.WhichOneof("record_type") == "run":
                run.update(id=record.run.run_id, name=record.run.display_name,
                           config={i.key: json.loads(i.value_json) for i in record.run.config.update})
            elif record.WhichOneof("record_type") == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                run["history"].append({k: v for k, v in row.items() if not k.startswith("_")})
        runs.append(run)
    return runs


def trackio_runs(trackio_dir, project="tba"):
    """trackio's local database: {run id: (name, config, [{"step": s, **scalars}])}."""
    db = sqlite3.connect(os.path.join(trackio_dir, f"{project}.db"))
    runs = {rid: (name, json.loads(config), []) for rid, name, config in
            db.execute("select run_id, run_name, config from configs")}
    for rid, step, metrics in db.execute("select run_id, step, metrics from metrics order by id"):
        runs[rid][2].append({"step": step, **json.loads(metrics)})
    return runs


def scalars(row):
    return {k: v for k, v in row.items() if isinstance(v, (int, float))}


def same(a, b):
    """Two rows of scalars are equal, value for value; NaN equals NaN (trackio stores it as null)."""
    a, b = ({k: math.nan if v is None else float(v) for k, v in row.items()} for row in (a, b))
    return a.keys() == b.keys() and all(a[k] == b[k] or math.isnan(a[k]) and math.isnan(b[k]) for k in a)


def test_progress_is_a_plain_line_every_5_percent_when_stderr_is_a_file():
    """A log file gets readable lines (step, evaluation, reward, loss, steps/s) every 5% of the steps and at the last
    (a time budget can end a run early), never a bar's carriage-return frames; progress=false prints nothing."""
    log = io.StringIO()  # not a terminal, as a redirected stderr, a Slurm job or nohup
    progress = runlog.Progress(0, 100, True, log)
    evaluation = {"accuracy": 0.4, "step": 0, "n": 50}
    for step in range(1, 38):
        progress.update(step, {"train/loss": 0.5, "train/reward_mean": 0.25}, evaluation, last=step == 37)
    progress.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert [line.split(":")[0] for line in lines] == [f"step {s}/100 ({s}%)" for s in (5, 10, 15, 20, 25, 30, 35, 37)]
    assert lines[0].startswith("step 5/100 (5%): accuracy 0.400 (eval at step 0), reward 0.25, loss 0.5, ")
    assert all(line.endswith(" steps/s") and float(line.split(", ")[-1].split()[0]) > 0 for line in lines)
    quiet = io.StringIO()
    off = runlog.Progress(0, 100, False, quiet)
    off.update(5, {"train/loss": 0.5, "train/reward_mean": 0.25}, evaluation, last=True)
    off.close()
    assert quiet.getvalue() == ""


@NEEDS_TRACKERS
def test_wandb_and_trackio_carry_every_scalar_and_continue_the_run_on_resume(tmp_path, monkeypatch):
    """Every int / float of a row, whatever its name (eval/pass@k too), reaches wandb and trackio at its step; text
    stays in metrics.jsonl only. A resume from step 2 continues the same wandb run (same id) and trackio run."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    import trackio.utils  # noqa: F401  (its database folder is read once, at import)
    trackio_dir = str(trackio.utils.TRACKIO_DIR)
    out = str(tmp_path / "run")
    os.makedirs(out)
    config = {"lr": 3e-5, "trackers": "tensorboard,wandb,trackio"}
    rows = [{"train/loss": 1.0 / (s + 1), "eval/pass@4": 0.5, "eval/distinct_correct": s, "note": "text"}
            for s in range(4)]
    log = runlog.Logger(out, 0, "wandb,trackio", config)
    for step, row in enumerate(rows):
        log.log(step, row)
    log.close()
    log = runlog.Logger(out, 2, "wandb,trackio", config)  # resumed from a checkpoint at step 2: step 3 is redone
    log.log(3, dict(rows[3], **{"train/loss": 9.0}))
    log.close()
    first, resumed = wandb_history(out)
    assert first["id"] == resumed["id"] and first["name"] == resumed["name"] == out
    assert first["config"]["lr"] == 3e-5 and first["config"]["trackers"] == "tensorboard,wandb,trackio"
    assert [r["step"] for r in first["history"]] == [0, 1, 2, 3] and resumed["history"][0]["step"] == 3
    assert all(same(h, dict(scalars(r), step=s)) for s, (h, r) in enumerate(zip(first["history"], rows)))
    assert resumed["history"][0]["train/loss"] == 9.0
    (run_id, (name, logged_config, history)), = trackio_runs(trackio_dir).items()  # one run, continued
    assert name == out and logged_config["lr"] == 3e-5
    assert [h["step"] for h in history] == [0, 1, 2, 3, 3] and history[-1]["train/loss"] == 9.0
    assert all(same(h, dict(scalars(r), step=s)) for s, (h, r) in enumerate(zip(history, rows)))


@NEEDS_TRACKERS
def test_a_redirected_run_logs_plain_progress_and_fills_every_tracker(tmp_path):
    """A 4-step tiny run (HF engine) with its output in a pipe (not a terminal), progress on and all three trackers: the log has
    one plain progress line per step and no bar frames; wandb (offline), trackio and tensorboard hold every scalar of
    every metrics.jsonl row, and wandb / trackio the resolved config under the run's name (its out_dir)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out, trackio_dir = str(tmp_path / "run"), str(tmp_path / "trackio")
    p = start(["engine=hf", "steps=4", "n_test=16", "initial_buffer=16", "time_budget_min=0", "progress=true",
               "trackers=tensorboard,wandb,trackio"], out, env={"WANDB_MODE": "offline", "TRACKIO_DIR": trackio_dir})
    try:
        output, _ = p.communicate(timeout=600)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
    assert p.returncode == 0, output[-6000:]
    assert "it/s" not in output and "s/it" not in output  # no tqdm frame (text mode turned its \r into \n)
    assert [line.split(":")[0] for line in output.splitlines() if line.startswith("step ")] == \
        [f"step {s}/4 ({25 * s}%)" for s in (1, 2, 3, 4)]
    rows, _ = read_run(out)
    want = [scalars(r) for r in rows]
    resolved = yaml.safe_load(open(os.path.join(out, "config.yaml")))
    assert resolved["trackers"] == "tensorboard,wandb,trackio" and resolved["steps"] == 4
    (run,) = wandb_history(out)
    assert run["name"] == out and {k: run["config"][k] for k in resolved} == resolved
    assert len(run["history"]) == len(want) and all(same(h, w) for h, w in zip(run["history"], want))
    ((name, config, history),) = trackio_runs(trackio_dir).values()
    assert name == out and {k: config[k] for k in resolved} == resolved
    assert len(history) == len(want) and all(same(h, w) for h, w in zip(history, want))
    events = EventAccumulator(os.path.join(out, "tb"), size_guidance={"scalars": 0})
    events.Reload()
    assert set(events.Tags()["scalars"]) == {k for w in want for k in w if k != "step"}


def test_a_tracker_that_is_not_installed_or_unknown_is_a_config_error(monkeypatch):
    """trackers= names only tensorboard, wandb, trackio; an optional one missing says how to install it."""
    import config
    from config import ConfigError, load_config
    with pytest.raises(ConfigError, match="'trackers' takes a comma-separated list of tensorboard, wandb, trackio"):
        load_config(None, ["trackers=tensorboard,mlflow"])
    real = config.importlib.util.find_spec
    monkeypatch.setattr(config.importlib.util, "find_spec", lambda name, *a: None if name == "trackio" else
                        real(name, *a))
    with pytest.raises(ConfigError, match=r"trackers=trackio: trackio is not installed: pip install trackio==0\.43\.0"):
        load_config(None, ["trackers=tensorboard,trackio"])
    assert load_config(None, ["trackers="]).trackers == ""


@NEEDS_TRACKERS
def test_prepare_refuses_wandb_online_without_an_api_key(tmp_path):
    """trackers=wandb online with no API key anywhere: one line and exit 2 from --prepare, before any rank starts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path), NETRC=str(tmp_path / "netrc"), WANDB_CONFIG_DIR=str(tmp_path / "wandb"))
    p = subprocess.run([sys.executable, "train.py", "--prepare", "configs/tiny.yaml", "trackers=tensorboard,wandb",
                        f"out_dir={tmp_path / 'run'}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.splitlines() == ["error: trackers=wandb: no Weights & Biases API key: run `wandb login` (or set "
                                     "WANDB_API_KEY), or WANDB_MODE=offline to log into out_dir/wandb without an "
                                     "account"]
    assert not os.path.exists(tmp_path / "run")
