"""What a run leaves in out_dir besides checkpoints: metrics.jsonl and the trackers (trackers=: tensorboard events,
Weights & Biases, trackio; one row per trainer step, the same names in all), rank 0's progress lines, the wall-clock
and CPU timers, and summary.json at the end."""
import json
import os
import secrets
import sys
import time

from tqdm import tqdm

from config import ConfigError, tracker_names

PROJECT = "tba"  # the wandb / trackio project of every run (wandb: WANDB_PROJECT overrides it)


class Logger:
    """metrics.jsonl (one object per trainer step) + every scalar of it, under the same names, to each of `trackers`
    (config key trackers=; `config`: the resolved config they record). Resuming from step N keeps the rows and events
    up to N and appends after them (a row torn by a crash is dropped). A run that starts at step 0 where a log exists
    (resume=auto found no checkpoint) keeps that log as metrics.lost.K.jsonl."""

    def __init__(self, out_dir, resume_step=0, trackers="tensorboard", config=None):
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
        start = {"tensorboard": Tensorboard, "wandb": Wandb, "trackio": Trackio}
        self.trackers = [start[name](out_dir, resume_step, config or {}) for name in tracker_names(trackers)]
        self.file = open(path, "a" if resume_step else "w")
        self.last_step = resume_step  # the last step with a row

    def log(self, step, row):
        scalars = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}
        for tracker in self.trackers:
            tracker.log(step, scalars)
        self.file.write(json.dumps({"step": step, **row}) + "\n")
        self.file.flush()
        self.last_step = step

    def close(self):
        for tracker in self.trackers:
            tracker.close()
        self.file.close()


def check_login(trackers):
    """--prepare: trackers=wandb online (WANDB_MODE not offline / disabled) needs an API key, or the trainer would stop
    at its start: ConfigError now, before any process starts."""
    if "wandb" not in tracker_names(trackers) or os.environ.get("WANDB_MODE") in ("offline", "disabled", "dryrun"):
        return
    import wandb
    try:
        logged_in = wandb.login(verify=False, prompt=False)
    except wandb.errors.AuthenticationError as e:
        raise ConfigError(f"trackers=wandb: {e}") from None
    if not logged_in:
        raise ConfigError("trackers=wandb: no Weights & Biases API key: run `wandb login` (or set WANDB_API_KEY), or "
                          "WANDB_MODE=offline to log into out_dir/wandb without an account")


class Tensorboard:
    """out_dir/tb: a resume drops the events logged after its step (purge_step), as metrics.jsonl drops the rows."""

    def __init__(self, out_dir, resume_step, config):
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(os.path.join(out_dir, "tb"), purge_step=resume_step + 1 if resume_step else None)

    def log(self, step, scalars):
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, step)

    def close(self):
        self.writer.close()


class Wandb:
    """Weights & Biases: a run named after out_dir with the resolved config, its files in out_dir/wandb. WANDB_MODE=
    offline logs without an account (`wandb sync` uploads it later). A resume continues the same run (its id is kept
    in out_dir/wandb/run_id); rows are plotted against `step`, so the steps redone after a checkpoint are kept rather
    than refused for going back in wandb's own step count."""

    def __init__(self, out_dir, resume_step, config):
        import wandb
        id_file = os.path.join(out_dir, "wandb", "run_id")
        if resume_step and os.path.isfile(id_file):
            with open(id_file) as f:
                run_id = f.read().strip()
        else:
            run_id = secrets.token_hex(4)
            os.makedirs(os.path.dirname(id_file), exist_ok=True)
            with open(id_file, "w") as f:
                f.write(run_id)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), name=os.path.normpath(out_dir),
                              config=config, dir=out_dir, id=run_id, resume="allow")
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log(self, step, scalars):
        self.run.log({"step": step, **scalars})

    def close(self):
        self.run.finish()


class Trackio:
    """trackio, local: project tba in its database under TRACKIO_DIR (default ~/.cache/huggingface/trackio; `trackio
    show` opens the dashboard), a run named after out_dir with the resolved config. A resume continues the newest run
    of that name."""

    def __init__(self, out_dir, resume_step, config):
        import trackio
        self.trackio = trackio
        trackio.init(project=PROJECT, name=os.path.normpath(out_dir), config=config,
                     resume="allow" if resume_step else "never", embed=False)

    def log(self, step, scalars):
        self.trackio.log(scalars, step=step)

    def close(self):
        self.trackio.finish()


class Progress:
    """Rank 0's progress over steps start + 1 .. total (`enabled`: config key progress). On a terminal a tqdm bar;
    when stderr is not one (a redirected log, a Slurm job, nohup) a plain line every 5% of the steps and at the last,
    since a bar's carriage-return frames pile up there into one unreadable line."""

    def __init__(self, start, total, enabled, stream=None):
        self.stream = stream or sys.stderr
        tty = self.stream.isatty()
        self.bar = tqdm(initial=start, total=total, desc="train", dynamic_ncols=True, file=self.stream,
                        disable=not (enabled and tty))
        self.lines = enabled and not tty
        self.total, self.every = total, max(1, total // 20)
        self.since = start, time.perf_counter()  # the step and time of the last line

    def update(self, step, row, last_eval, last):
        """After `step`: its metrics row and the latest evaluation (trainer state's last_eval); `last`: the run ends."""
        loss, reward = f"{row['train/loss']:.3g}", f"{row['train/reward_mean']:.2f}"
        if not self.bar.disable:
            self.bar.update(1)
            self.bar.set_postfix(loss=loss, reward=reward, acc=f"{last_eval.get('accuracy', float('nan')):.3f}")
        elif self.lines and (step % self.every == 0 or last):
            (before, t0), now = self.since, time.perf_counter()
            name = next((k for k in ("accuracy", *last_eval) if k in last_eval and k not in ("step", "n")), None)
            score = f"{name} {last_eval[name]:.3f} (eval at step {last_eval['step']})" if name else "no evaluation yet"
            print(f"step {step}/{self.total} ({100 * step / self.total:.0f}%): {score}, reward {reward}, loss {loss}, "
                  f"{(step - before) / (now - t0):.2f} steps/s", file=self.stream, flush=True)
            self.since = step, now

    def close(self):
        self.bar.close()


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
        self.load_s_unlogged = 0.0  # weight loads reported in rounds whose rows are not logged (trainer.gather)
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
    look, trackers = [f"python tables.py {cfg.out_dir}"], tracker_names(cfg.trackers)
    if "tensorboard" in trackers:
        look.append(f"tensorboard --logdir {cfg.out_dir}/tb")
    if "trackio" in trackers:  # wandb says where its run is itself
        look.append(f"trackio show --project {PROJECT}")
    print("look: " + "  |  ".join(look), flush=True)
