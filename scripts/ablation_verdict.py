"""The ablation questions' registered readings (docs/ablations.md, Q1-Q4): each run's values, the positive controls,
the primary family under Holm with the sentence the rule gives, the secondaries; with --pilot, the pilot's decisions
(its rules' fallbacks and the number of seeds) instead of a reading.

    python scripts/ablation_verdict.py q1 docs/grids/ablation_q1_pilot --pilot                    # the decisions
    python scripts/ablation_verdict.py q1 docs/grids/ablation_q1_test --plot docs/ablation_q1.png  # the reading

A run's arm is named from its config as scripts/ablation_grid.sh names it (Q1's low m and inv_temp: whichever the runs
have besides 0.95 and 0, so M_LOW and IT need no flag) and paired with the other arms by its seed. Packed runs
(scripts/pack_runs.py) and full ones read alike: a per-step metric is its mean over the run's steps (tables.value_at).
"""
import argparse
import math
import os
import statistics
import sys

import numpy as np
import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tables  # noqa: E402

GOAL, FLOOR = 1.5, 1.0  # the pilot's half-width goal and the floor of its sd (points)
KNOB = "the knob did not change what it should here"


def last3(m):
    return lambda r: 100 * tables.last_mean(r, m, 3)


def over_steps(m):  # the mean over the run's steps: a packed run's summary.json step_means, else its rows
    return lambda r: tables.value_at(r, m, None)


METRICS = {  # key: (name, with the rule's word before " (", unit, digits, a run's value)
    "acc": ("accuracy (last three)", "points", 1, last3("accuracy")),
    "pass1": ("pass@1 (last three)", "points", 1, last3("pass@1")),
    "pass16": ("pass@16 (last three)", "points", 1, last3("pass@16")),
    "acc1000": ("accuracy at step 1000", "points", 1, lambda r: 100 * tables.value_at(r, "accuracy", 1000)),
    "kl": ("eval/kl_sft at step 1000", "nats", 3, lambda r: tables.value_at(r, "kl_sft", 1000)),
    "gain": ("accuracy end minus start", "points", 1,
             lambda r: 100 * (r["summary"]["eval_end"]["accuracy"] - r["summary"]["eval_start"]["accuracy"])),
    "stale": ("staleness/mean", "updates", 1, over_steps("staleness/mean")),
    "reward": ("train/reward_mean", "", 3, over_steps("train/reward_mean")),
    "distinct": ("train/distinct_per_group", "", 2, over_steps("train/distinct_per_group")),
    "prompts": ("train/distinct_prompts", "", 2, over_steps("train/distinct_prompts")),
    "fresh": ("fresh_samples_per_step", "", 2, lambda r: r["summary"].get("fresh_samples_per_step", math.nan)),
}
# Per question: arm(config) -> name; params {name: (config key, the value it is not)}; columns; primary and secondary
# contrasts (label, arms: (a, b) for a - b or (a, b, c, d) for (a - b) - (c - d), metric(s), tags); checks (label,
# metric, arms, how: ratio (at least 2 per seed) / above (pilot: every seed above 0; test: 95% interval above 0) /
# within (every seed within 1) / ends (an arm's end at or above its start, not stopped), control: a test control that
# labels its tag's contrasts with `fail`, pilot: (what failing does, the grid's env for it; None: no test)).
COND = "the question is reported as \"S did not change the groups here\" and its test not run"
S10 = "the S = 10 arms are out of the test (reported so)"
SFT = "the schedule did not move the policy further from the SFT here"
QUESTIONS = {
    "q1": dict(arm=lambda c: f"m{c['m']:g}_it{c['inv_temp']:g}", params={"lo": ("m", 0.95), "it": ("inv_temp", 0)},
               columns=("acc", "pass1", "pass16", "stale", "reward", "fresh"),
               primary=[("(a) recency: m = 0.95 minus m = {lo} at inv_temp = 0", ("m0.95_it0", "m{lo}_it0"), "acc",
                         "recency"),
                        ("(b) reward priority: inv_temp = {it} minus 0 at m = {lo}", ("m{lo}_it{it}", "m{lo}_it0"),
                         "acc", "priority")],
               secondary=[("(a) at inv_temp = {it}", ("m0.95_it{it}", "m{lo}_it{it}"), ("acc", "pass1", "pass16"),
                           "recency"),
                          ("(b) at m = 0.95", ("m0.95_it{it}", "m0.95_it0"), ("acc", "pass1", "pass16"), "priority"),
                          ("interaction: (a) at inv_temp = {it} minus (a) at 0",
                           ("m0.95_it{it}", "m{lo}_it{it}", "m0.95_it0", "m{lo}_it0"), ("acc",), "recency"),
                          ("(a) at inv_temp = 0", ("m0.95_it0", "m{lo}_it0"), ("pass1", "pass16"), "recency"),
                          ("(b) at m = {lo}", ("m{lo}_it{it}", "m{lo}_it0"), ("pass1", "pass16"), "priority")],
               checks=[(f"staleness/mean, m = {{lo}} over m = 0.95, at inv_temp = {i}", "stale",
                        (f"m{{lo}}_it{i}", f"m0.95_it{i}"), "ratio", "recency", KNOB,
                        ("the low arm becomes m = 0.1", "M_LOW=0.1")) for i in ("0", "{it}")]
               + [("train/reward_mean, inv_temp = {it} minus 0 at m = {lo}", "reward", ("m{lo}_it{it}", "m{lo}_it0"),
                   "above", "priority", KNOB, ("inv_temp becomes 3", "IT=3"))]),
    "q2": dict(arm=lambda c: f"k{c['K']}", columns=("acc", "pass1", "pass16", "distinct", "stale", "fresh"),
               primary=[("K = 16 minus K = 8", ("k16", "k8"), "acc", "design")],
               secondary=[("K = 16 minus K = 8", ("k16", "k8"), ("pass1", "pass16", "distinct", "stale"), "design")],
               checks=[("design: fresh_samples_per_step, k16 minus k8", "fresh", ("k16", "k8"), "within", "design",
                        "not read: the test waits for a design that holds it",
                        ("the test waits for a design that holds it (written in docs/ablations.md first)", None))]),
    "q3": dict(arm=lambda c: f"{c['loss']}_s{c['S']}", optional=("tb_s10", "grpo_s10"),
               columns=("acc", "pass16", "distinct", "prompts", "fresh"),
               primary=[(f"{L}: S = 16 minus S = 8", (f"{l}_s16", f"{l}_s8"), "acc", l)
                        for l, L in (("tb", "TB"), ("grpo", "GRPO"))],
               secondary=[(f"{L}: S = 10 minus S = 8", (f"{l}_s10", f"{l}_s8"), ("acc",), f"{l} s10")
                          for l, L in (("tb", "TB"), ("grpo", "GRPO"))]
               + [("TB's S = 16 effect minus GRPO's", ("tb_s16", "tb_s8", "grpo_s16", "grpo_s8"), ("acc",), "tb grpo")]
               + [(f"{L}: S = 16 minus S = 8", (f"{l}_s16", f"{l}_s8"), ("pass16", "prompts"), l)
                  for l, L in (("tb", "TB"), ("grpo", "GRPO"))],
               checks=[(f"train/distinct_per_group, {l}: S = 16 minus S = 8", "distinct", (f"{l}_s16", f"{l}_s8"),
                        "above", l, f"{KNOB} (S did not change the groups here)", (COND, None)) for l in ("tb", "grpo")]
               + [(f"fresh_samples_per_step, {l}: S = 10 minus S = 8", "fresh", (f"{l}_s10", f"{l}_s8"), "within",
                   "s10", S10, (S10, 'ARMS="tb_s8 tb_s16 grpo_s8 grpo_s16"')) for l in ("tb", "grpo")]),
    "q4": dict(arm=lambda c: "reset" if c["ref_reset_every"] else "anneal" if c["beta_end"] != c["beta_start"]
               else "const", columns=("acc", "acc1000", "pass16", "kl", "gain", "fresh"), curve="kl_sft",
               primary=[("anneal minus const", ("anneal", "const"), "acc", "anneal"),
                        ("reset minus const", ("reset", "const"), "acc", "reset")],
               secondary=[("anneal minus reset", ("anneal", "reset"), ("acc",), "anneal reset"),
                          ("anneal minus const", ("anneal", "const"), ("acc1000", "pass16"), "anneal"),
                          ("reset minus const", ("reset", "const"), ("acc1000", "pass16"), "reset")],
               checks=[(f"eval/kl_sft at step 1000, {a} minus const", "kl", (a, "const"), "above", a,
                        f"{KNOB} ({SFT})", (f"the {a} contrast is reported as \"{SFT}\"", "")) for a in
                       ("anneal", "reset")]
               + [("anneal: accuracy at its end minus its start, and not stopped", "gain", ("anneal",), "ends", None,
                   None, ("the end becomes 0.0167", "BETA_END=0.0167"))]),
}


def filled(x, params):
    """x with Q1's {lo} and {it} filled in, through tuples and lists."""
    if isinstance(x, str):
        return x.format(**params)
    return type(x)(filled(y, params) for y in x) if isinstance(x, (tuple, list)) else x


def load(q, path):
    """(the question, its params filled in; {arm: {seed: {metric: value}}}; {arm: {seed: run}}; the stopped runs:
    [(arm, path, its .final_stop line)], unfinished runs a restart would only stop again, as on non-finite updates)."""
    spec = QUESTIONS[q]
    runs, unfinished = tables.load_arms(path, spec["arm"], ["pass@1", "pass@16"] + ["kl_sft"] * (q == "q4"))
    stopped = []
    for here in unfinished:
        if os.path.isfile(os.path.join(here, ".final_stop")):
            with open(os.path.join(here, "config.yaml")) as f, open(os.path.join(here, ".final_stop")) as g:
                cfg, line = {**tables.DEFAULTS, **(yaml.safe_load(f) or {})}, g.read().strip()
            stopped.append((spec["arm"](cfg), here, line))
    params = {}
    for name, (key, base) in spec.get("params", {}).items():
        found = sorted({run["cfg"][key] for seeds in runs.values() for run in seeds.values()} - {base})
        if len(found) != 1:
            tables.fail(f"{q}: expected runs at {key} = {base:g} and one other {key}, found {found or 'no other'}")
        params[name] = f"{found[0]:g}"
    spec = {k: filled(v, params) if k in ("primary", "secondary", "checks") else v for k, v in spec.items()}
    used = {a for c in spec["primary"] + spec["secondary"] for a in c[1]} | {a for c in spec["checks"] for a in c[2]}
    for arm in sorted(used - set(spec.get("optional", ())) - set(runs)):
        tables.fail(f"no runs of {arm} under {path} (found: {', '.join(sorted(runs))})")
    vals = {arm: {s: {k: METRICS[k][3](r) for k in spec["columns"]} for s, r in seeds.items()}
            for arm, seeds in runs.items()}
    return spec, vals, runs, stopped


def per_seed(vals, arms, key, how=""):
    """{seed: a - b, a / b (how ratio), (a - b) - (c - d), or a alone} over the seeds where every arm has a value;
    None when an arm has no runs."""
    if any(a not in vals for a in arms):
        return None
    out = {}
    for s in sorted(set.intersection(*(set(vals[a]) for a in arms))):
        x = [vals[a][s][key] for a in arms]
        d = (x[0] / x[1] if x[1] else math.inf) if how == "ratio" else x[0] if len(x) == 1 else (
            x[0] - x[1] if len(x) == 2 else x[0] - x[1] - x[2] + x[3])
        if math.isfinite(d):
            out[s] = d
    return out


def stat(xs, level=1 - tables.ALPHA):
    """(n, mean, half-width at `level`, p) of per-seed values (NaN without two)."""
    return tables.paired(list(xs.values()), level) if xs else (0, math.nan, math.nan, math.nan)


def rule(arms, key, mean, half, told=True):
    """The registered rule's sentence for a contrast's interval (told: Holm's step-down reached and rejected it)."""
    word, unit, dg, _ = METRICS[key]
    word = word.split(" (")[0]
    if not math.isfinite(half):
        return "- (fewer than two seeds)"
    if not told or mean - half <= 0 <= mean + half:
        return f"not told apart at ±{half:.{dg}f} {unit}".rstrip()
    verb = "raises" if mean > 0 else "lowers"
    what = f"{arms[0]} {verb} {word} against {arms[1]}" if len(arms) == 2 else f"the difference {verb} {word}"
    if mean > 0:
        return f"{what} by {mean:+.{dg}f} {tables.interval(mean, half, dg)} {unit}".rstrip()
    # "lowers ... by 3.5 [2.5, 4.6]": the size of the fall and its interval, not a double negative
    return f"{what} by {-mean:.{dg}f} [{-mean - half:.{dg}f}, {-mean + half:.{dg}f}] {unit}".rstrip()


def absent(arms, vals):
    return "no runs of " + ", ".join(a for a in arms if a not in vals)


def show_runs(spec, vals, runs, stopped):
    """Each run's values, each arm's means (and Q4's curve of eval/kl_sft), the stopped runs."""
    cols, digits = spec["columns"], [METRICS[k][2] for k in spec["columns"]]
    print("Each run (points; nats; updates; as logged)")
    tables.markdown(["arm", "seed"] + [METRICS[k][0] for k in cols], [
        [arm, str(s)] + [f"{v[k]:.{d}f}" for k, d in zip(cols, digits)] for arm in sorted(vals)
        for s, v in sorted(vals[arm].items())])
    print("Each arm: the mean over its seeds")
    tables.markdown(["arm", "n"] + [METRICS[k][0] for k in cols], [
        [arm, str(len(vals[arm]))] + [f"{np.nanmean([v[k] for v in vals[arm].values()]):.{d}f}"
                                      for k, d in zip(cols, digits)] for arm in sorted(vals)])
    if spec.get("curve"):
        m = spec["curve"]
        steps = sorted({row["step"] for seeds in runs.values() for r in seeds.values() for row in r["rows"]
                        if f"eval/{m}" in row})
        print(f"Secondary: eval/{m} at each evaluation, the mean over each arm's seeds (step 0: the policy is the SFT)")
        tables.markdown(["arm"] + [str(s) for s in steps], [
            [arm] + [f"{np.nanmean([tables.value_at(r, m, s) for r in runs[arm].values()]):.3f}" for s in steps]
            for arm in sorted(runs)])
    for arm, path, line in stopped:
        print(f"stopped ({arm}, not finished): {path}: {line}")


def check(vals, stopped, c, pilot):
    """(per-seed values as text, n, mean, half, holds) of a check, or None when an arm has no runs; the pilot needs
    every seed to pass it, the test's "above" its 95% interval above 0."""
    label, key, arms, how = c[:4]
    xs = per_seed(vals, arms, key, how)
    if xs is None:
        return None
    n, mean, half, _ = stat(xs)
    each = {"ratio": lambda x: x >= 2, "within": lambda x: abs(x) <= 1, "ends": lambda x: x >= 0,
            "above": lambda x: x > 0}[how]
    holds = bool(xs) and all(map(each, xs.values())) and not any(a == arms[0] for a, *_ in stopped if how == "ends")
    if how == "above" and not pilot:
        holds = n >= 2 and mean - half > 0
    text = ", ".join(f"{x:.2f}" if how == "ratio" else f"{x:+.{METRICS[key][2]}f}" for x in xs.values())
    return text, n, mean, half, holds


def pilot(q, spec, vals, stopped):
    """The pilot's decisions as one block: each rule's reading and what it changes, the spread, the seeds."""
    print(f"PILOT DECISIONS (docs/ablations.md, {q.upper()}'s pilot rules and \"Pilot, first\"; not part of the test)")
    env, block, seeds = [], [], sorted({s for arm in vals.values() for s in arm})
    for c in spec["checks"]:
        label, key, arms, how, _, _, (action, setting) = c
        got = check(vals, stopped, c, True)
        if got is None:
            print(f"  {label}: {absent(arms, vals)}")
            continue
        lost = [f"{a} seed {s}" for a in arms for s in seeds if s not in vals[a]]
        lost += [f"{p} stopped" for a, p, _ in stopped if a == arms[0] and how == "ends"]
        print(f"  {label}: per seed {got[0] or '-'}" + (f" ({'; '.join(lost)}: no finished run)" if lost else "")
              + (" -> holds: no change" if got[4] else f" -> fails: {action}"))
        if not got[4]:
            (block if setting is None else env).append(action if setting is None else setting)
    diffs = {c[0]: per_seed(vals, c[1], c[2]) for c in spec["primary"]}
    sds = {k: statistics.stdev(d.values()) if len(d) >= 2 else math.nan for k, d in diffs.items()}
    for k, d in diffs.items():
        print(f"  spread: {k}: per seed {', '.join(f'{x:+.1f}' for x in d.values()) or '-'} points, sd {sds[k]:.2f}")
    sd, family = max([s for s in sds.values() if math.isfinite(s)] + [FLOOR]), len(spec["primary"])
    halves, n = tables.seed_count({"sd": sd}, GOAL, family)
    print(f"  sd = the larger of the family's largest pilot sd and {FLOOR:g} point: {sd:.2f}; predicted half-width "
          f"t(n - 1) x sd / sqrt(n), two-sided at {1 - tables.ALPHA / family:g}: "
          + ", ".join(f"n = {m}: {h['sd']:.2f}" for m, h in halves.items()) + " points")
    print(f"  seeds: n = {n or 8} (" + (f"the smallest n from 4 to 8 under {GOAL:g} points)" if n else
                                         f"no n from 4 to 8 is under {GOAL:g} points: 8)"))
    command = " ".join([e for e in dict.fromkeys(env) if e] + [f"SEEDS=\"{' '.join(map(str, range(n or 8)))}\""])
    print(f"  next: no test ({'; '.join(dict.fromkeys(block))})" if block else
          f"  next: {command} bash scripts/ablation_grid.sh {q} test")


def reading(spec, vals, stopped):
    """The test's reading; returns the forest plot's lines: (label, per-seed values, mean, half)."""
    rows, failed = [], {}
    for c in [c for c in spec["checks"] if c[4]]:
        label, key, arms, how, tag, fail, _ = c
        got = check(vals, stopped, c, False)
        if got is None:
            rows.append([label, "0", "-", "-", "-", absent(arms, vals)])
            continue
        text, n, mean, half, holds = got
        failed.update({} if holds else {tag: fail})
        dg = METRICS[key][2]
        rows.append([label, str(n), text, f"{mean:+.{dg}f}" if how != "ratio" else "-",
                     tables.interval(mean, half, dg) if how == "above" else "-",
                     "holds" if holds else f"fails: {fail}"])
    print("Positive controls and design checks as registered (a ratio: at least 2 in every seed; within 1 in every "
          "seed; above 0: the 95% interval)")
    tables.markdown(["check", "n", "per seed", "mean", "95% CI", "reading"], rows)

    def said(tags, sentence):  # a failed control's words replace its contrasts' verdicts
        return next((failed[t] for t in tags.split() if t in failed), sentence)
    primary = [per_seed(vals, arms, key) for _, arms, key, _ in spec["primary"]]
    stats = [stat(d) for d in primary]
    adjusted, rejected, levels = tables.holm([p if math.isfinite(p) else 1.0 for *_, p in stats])
    rows, forest = [], []
    for j, (label, arms, key, tags) in enumerate(spec["primary"]):
        (n, mean, _, p), half = stats[j], stat(primary[j], levels[j])[2]
        rows.append([label, str(n), f"{mean:+.1f}", f"{p:.3f}", f"{levels[j]:.4f}", tables.interval(mean, half),
                     f"{adjusted[j]:.3f}", said(tags, rule(arms, key, mean, half, rejected[j]))])
        forest.append((f"PRIMARY: {label} (at {levels[j]:.4f})", primary[j], mean, half))
    print(f"PRIMARY, a family of {len(rows)}: accuracy (last three) per seed, points (Holm's step-down at 0.05, each "
          "interval at the level its step tests)")
    tables.markdown(["contrast", "n", "mean", "p", "level", "interval at that level", "Holm-adjusted p", "the rule"],
                    rows)
    rows = []
    for label, arms, keys, tags in spec["secondary"]:
        for key in keys:
            xs, name, dg = per_seed(vals, arms, key), f"{label}: {METRICS[key][0]}", METRICS[key][2]
            if xs is None:
                rows.append([name, "0", "-", "-", "not run: " + absent(arms, vals)])
                continue
            n, mean, half, _ = stat(xs)
            rows.append([name, str(n), f"{mean:+.{dg}f}", tables.interval(mean, half, dg),
                         said(tags, rule(arms, key, mean, half))])
            forest += [(name, xs, mean, half)] if METRICS[key][1] == "points" else []
    print("Secondary, labelled so: per seed (uncorrected 95% t-intervals)")
    tables.markdown(["SECONDARY contrast", "n", "mean", "95% CI", "the rule"], rows)
    return forest


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("question", choices=sorted(QUESTIONS), help="the registered question (docs/ablations.md)")
    p.add_argument("runs", help="the folder holding the question's finished runs (<arm>/seed<N>, any depth)")
    p.add_argument("--pilot", action="store_true", help="the pilot's decisions (fallbacks and seeds), not a reading")
    p.add_argument("--plot", default="", help="also draw the contrasts' forest plot (points) into this PNG")
    args = p.parse_args()
    if args.pilot and args.plot:
        tables.fail("--plot draws the test's reading; the pilot reads nothing (drop --plot or --pilot)")
    spec, vals, runs, stopped = load(args.question, args.runs)
    show_runs(spec, vals, runs, stopped)
    if args.pilot:
        return pilot(args.question, spec, vals, stopped)
    forest = reading(spec, vals, stopped)
    if args.plot:
        tables.plot_forest(forest, args.plot, "points (seeds: dots; mean and interval: bars)")


if __name__ == "__main__":
    main()
