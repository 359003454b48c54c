"""One fault, injected and judged: start a job with launch.sh, SIGKILL one of its ranks once the trainer has logged a
given step, and check what the job does about it (scripts/gpu_check.sh runs it on every layout; on a GPU it is the
check that a rank blocked in a CUDA collective still gets out).

    python scripts/kill_check.py --out DIR --rank R --at-step N --expect heal|stop [--json F] [-- key=value ...]

--expect heal: launched with max_restarts=1, the job must restart once, resume from the checkpoint saved at the
               failure (or start over when there is none: the trainer killed before its first save) and finish:
               exit 0, summary.json, every step logged exactly once.
--expect stop: launched without restarts, the job must end within --deadline seconds of the kill with a non-zero
               exit and a line that names the killed rank.
Either way no process of the job may be left (nor is one when this script is stopped by SIGTERM, as gpu_check.sh's
timeout does). Writes a JSON result (pass, note, rc, seconds from the kill to the job's exit, and for heal the
restarts and the steps redone) and exits 0 on a pass, 1 otherwise.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def logged_steps(out):
    path = os.path.join(out, "metrics.jsonl")
    steps = []
    if os.path.exists(path):
        for line in open(path):
            try:
                steps.append(json.loads(line)["step"])
            except (ValueError, KeyError):  # the row being written
                pass
    return steps


def rank_pid(agent, rank):
    """The pid of the worker with RANK=rank among the children of torchrun's agent (launch.sh execs it)."""
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == agent and f"RANK={rank}".encode() in open(f"/proc/{pid}/environ", "rb").read().split(b"\0"):
                return int(pid)
        except (OSError, ValueError):
            continue
    return None


def leftovers(out):
    """Processes whose command line names out_dir=`out` (there must be none once the job has ended)."""
    left = []
    for pid in os.listdir("/proc"):
        try:
            if f"out_dir={out}" in open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace"):
                left.append(int(pid))
        except OSError:
            continue
    return left


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--at-step", type=int, default=3)
    p.add_argument("--expect", choices=("heal", "stop"), required=True)
    p.add_argument("--deadline", type=float, default=180.0, help="seconds the job has, after the kill, to end")
    p.add_argument("--json", default="")
    p.add_argument("overrides", nargs="*")
    a = p.parse_args()
    out = os.path.abspath(a.out)
    args = [f"out_dir={out}", "overwrite=true", "progress=false", f"max_restarts={int(a.expect == 'heal')}",
            *a.overrides]
    log_path = out + ".log"
    os.makedirs(os.path.dirname(out), exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` below ends the job first
    with open(log_path, "w") as log:
        job = subprocess.Popen(["bash", os.path.join(ROOT, "launch.sh"), "configs/tiny.yaml", *args], cwd=ROOT,
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    res = {"rank": a.rank, "expect": a.expect, "at_step": a.at_step}
    try:
        while not logged_steps(out) or max(logged_steps(out)) < a.at_step:
            if job.poll() is not None:
                raise RuntimeError(f"the job ended (exit {job.returncode}) before step {a.at_step}")
            time.sleep(0.2)
        victim = rank_pid(job.pid, a.rank)
        if victim is None:
            raise RuntimeError(f"no rank {a.rank} among the job's workers")
        res["killed_near_step"] = max(logged_steps(out))
        t_kill = time.time()
        os.kill(victim, signal.SIGKILL)
        try:
            res["rc"] = job.wait(timeout=a.deadline if a.expect == "stop" else a.deadline + 600)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the job was still running {a.deadline:.0f} s after the kill") from None
        res["seconds_to_exit"] = round(time.time() - t_kill, 1)
    except RuntimeError as e:
        res.update(passed=False, note=str(e))
    finally:
        if job.poll() is None:  # its ranks run in sessions of their own: killed by the out_dir they name
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
            for pid in leftovers(out):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:  # gone meanwhile
                    pass
    time.sleep(1)
    left = leftovers(out)
    output = open(log_path, errors="replace").read()
    if "passed" not in res:
        steps = logged_steps(out)
        if a.expect == "heal":
            restarts = len(re.findall(r"^restart \d+ of \d+:", output, re.MULTILINE))
            resumed = [int(x.split("(step ")[1].split(",")[0]) for x in output.splitlines()
                       if x.startswith("resumed from ")]
            stopped = [int(x.split("at step ")[1].split(":")[0]) for x in output.splitlines()
                       if x.startswith("error: at step ")]
            res.update(restarts=restarts, steps_redone=(stopped[0] - resumed[0]) if stopped and resumed else None)
            ok = (res["rc"] == 0 and os.path.exists(os.path.join(out, "summary.json")) and restarts == 1
                  and steps == list(range(len(steps))))
            res["note"] = (f"healed: 1 restart, steps 0..{max(steps)} logged once, {res['steps_redone']} redone"
                           if ok else f"exit {res['rc']}, restarts {restarts}, steps logged once: "
                                      f"{steps == list(range(len(steps)))}")
        else:
            named = [x for x in output.splitlines() if x.startswith("error:") and f"rank {a.rank}" in x]
            ok = res["rc"] != 0 and bool(named)
            res["note"] = (named[0][:160] if ok else f"exit {res['rc']}, no error line naming rank {a.rank}")
        res["passed"] = ok and not left
        if left:
            res["note"] += f"; {len(left)} processes left behind"
    if left:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    res["log"] = log_path
    print(json.dumps(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f)
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
