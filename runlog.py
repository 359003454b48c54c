"""What a run leaves in out_dir besides checkpoints: metrics.jsonl and tensorboard events (one row per trainer step,
the same names in both), the wall-clock and CPU timers, and summary.json at the end."""
import json
import os
import sys
import time


class Logger:
    """metrics.jsonl (one object per trainer step) + tensorboard scalars under the same names. Resuming from step N
    keeps the rows and events up to N and appends after them (a row torn by a crash is dropped). A run that starts
    at step 0 where a log exists (resume=auto found no checkpoint) keeps that log as metrics.lost.K.jsonl."""

    def __init__(self, out_dir, resume_step=0):
        from torch.utils.tensorboard import SummaryWriter
        path = os.path.join(out_dir, "metrics.jsonl")
        if resume_step and os.path.isfile(path):  # drop rows logged after the checkpoint (they will be redone)
            with open(path) as f:
                keep = [line for line in f if (row := parse(line)) is not None and row["step"] <= resume_step]
            with open(path + ".tmp", "w") as f:
                f.writelines(line if line.endswith("\n") else line + "\n" for line in keep)
            os.replace(path + ".tmp", path)
        elif os.path.isfile(path) and os.path.getsize(path):
            lost = next(p for k in range(1, 10**6) if not os.path.exists(
                p := os.path.join(out_dir, f"metrics.lost.{k}.jsonl")))
            os.replace(path, lost)
            print(f"warning: no checkpoint to resume from: starting at step 0; the earlier log is kept as {lost}",
                  file=sys.stderr, flush=True)
        self.tb = SummaryWriter(os.path.join(out_dir, "tb"), purge_step=resume_step + 1 if resume_step else None)
        self.file = open(path, "a" if resume_step else "w")
        self.last_step = resume_step  # the last step with a row

    def log(self, step, row):
        for k, v in row.items():
            if isinstance(v, (int, float)) and k != "step":
                self.tb.add_scalar(k, v, step)
        self.file.write(json.dumps({"step": step, **row}) + "\n")
        self.file.flush()
        self.last_step = step

    def close(self):
        self.tb.close()
        self.file.close()


def joined(*rows):
    """One metrics row from a step's parts; sync/seconds adds up a round's gather and push."""
    out = {}
    for row in rows:
        for k, v in row.items():
            out[k] = out[k] + v if k == "sync/seconds" and k in out else v
    return out


def parse(line):
    """One metrics.jsonl row, or None for a blank or torn line."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) and "step" in row else None


class Timers:
    """Wall-clock and CPU seconds behind summary.json. They keep counting across a resume."""

    def __init__(self):
        self.train_s = self.sync_s = self.eval_s = 0.0  # in train steps / sync rounds (with evaluation) / evaluation
        self.rounds = 0
        self.t_start = time.perf_counter()  # the run's start (earlier by the checkpoint's elapsed seconds on resume)
        self.loop_before = self.loop_cpu_before = 0.0  # training loop seconds (wall, CPU) before the resume
        self.t_loop = self.c_loop = None  # when this process's training loop started (wall, CPU)

    def start_loop(self):
        self.t_loop, self.c_loop = time.perf_counter(), time.process_time()

    def loop(self):
        return self.loop_before + (time.perf_counter() - self.t_loop if self.t_loop is not None else 0.0)

    def loop_cpu(self):  # this process's CPU seconds in the loop, all its threads
        return self.loop_cpu_before + (time.process_time() - self.c_loop if self.c_loop is not None else 0.0)

    def elapsed(self):
        return time.perf_counter() - self.t_start

    def state_dict(self):
        return dict(train_s=self.train_s, sync_s=self.sync_s, eval_s=self.eval_s, rounds=self.rounds,
                    elapsed=self.elapsed(), loop=self.loop(), loop_cpu=self.loop_cpu())

    def load_state_dict(self, d):
        self.train_s, self.sync_s, self.eval_s, self.rounds = d["train_s"], d["sync_s"], d["eval_s"], d["rounds"]
        self.t_start = time.perf_counter() - d["elapsed"]
        self.loop_before, self.loop_cpu_before = d["loop"], d["loop_cpu"]

    def summary(self):
        loop = self.loop()
        return {"wall_seconds": self.elapsed(), "loop_seconds": loop, "loop_cpu_seconds": self.loop_cpu(),
                "trainer_busy_fraction": self.train_s / loop if loop else 0.0, "train_seconds_total": self.train_s,
                "sync_rounds": self.rounds, "sync_seconds_total": self.sync_s, "eval_seconds_total": self.eval_s}


def write_summary(cfg, state, row, resumed_from):
    """summary.json: steps, timers, samples generated / trained, evaluations at the start and end, last row."""
    summary = {"steps": state.step, **state.timers.summary(), "skipped_updates": state.skipped,
               "samples_generated": state.generated, "samples_trained": state.trained,
               "replay_ratio": state.trained / max(state.generated, 1),
               "fresh_samples_per_step": state.generated / max(state.step, 1),
               "resumed_from": resumed_from, "eval_start": state.eval_start, "eval_end": state.last_eval,
               "final": {k: v for k, v in row.items() if isinstance(v, (int, float))}}
    tmp = os.path.join(cfg.out_dir, "summary.json.tmp")
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=2)
    os.replace(tmp, os.path.join(cfg.out_dir, "summary.json"))


def say_done(cfg, state):
    """The run's last lines: steps, time, the evaluation at the start and end, and where to look."""
    metrics = [k for k in state.last_eval if k not in ("step", "n")]
    print(f"done: {state.step} steps in {state.timers.elapsed():.0f}s; eval " + ", ".join(
        f"{k} {state.eval_start.get(k, float('nan')):.3f} -> {state.last_eval[k]:.3f}" for k in metrics)
        + f"; out_dir {cfg.out_dir}", flush=True)
    print(f"look: python tables.py {cfg.out_dir}  |  tensorboard --logdir {cfg.out_dir}/tb", flush=True)
