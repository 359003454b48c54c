"""The pass@k question's registered reading (docs/diversity.md, "Does TB keep pass@k where the maximisers lose it?"):
each run's values, the positive control, the primary family of two with the sentence the rule gives, the secondaries;
with --pilot, the pilot's two decisions (the level L and the number of seeds) instead of a reading.

    python scripts/passk_verdict.py docs/grids/passk_pilot --pilot                    # the pilot's decisions
    python scripts/passk_verdict.py docs/grids/passk_test --plot docs/passk_test.png  # the reading
    (--level L: read at the pilot's L where the pilot moved it from 0.40)

A run's arm is its loss (grpo_nokl: grpo with beta 0), paired with the other arms by its seed. Per run, rates in points:
pass@16 where pass@1 first reaches L (linear between the two evaluations around the crossing, tables.matched_value; a
run that never reaches L is named and left out of the pairs that need it); pass@1, pass@16 and distinct_answers, each
the mean of the run's last three evaluations; pass@16 at step 0. Then, per seed:
  control: grpo_nokl's pass@16 (last three) minus its pass@16 at step 0; its 95% interval must lie below zero, or the
           question is not read on this setting;
  primary (one family of two, Holm's step-down at 0.05): TB's pass@16 at L minus grpo's, and minus rloo's, each
           interval at the level its step tests;
  secondary (uncorrected 95% intervals): TB minus each baseline in last-three pass@1, pass@16 and distinct_answers.
The pilot: if a run's pass@1 never reaches L, L becomes the lowest of the runs' highest pass@1 minus 0.02; then from
the sd of each primary contrast's pilot pairs at L, n = the smallest of 4..8 whose predicted half-width t(n - 1) x sd /
sqrt(n), two-sided at Holm's level 1 - 0.05/2, is below 3 points for both contrasts (8 if none is).
"""
import argparse
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tables  # noqa: E402

ARMS = ("tb", "grpo", "rloo", "grpo_nokl")
BASELINES = ("grpo", "rloo")
SECONDARY = (("pass1", "pass@1 (last three)"), ("pass16", "pass@16 (last three)"),
             ("distinct", "distinct_answers (last three)"))
MOVE, GOAL, SEEDS = 0.02, 3.0, range(4, 9)  # the pilot's rules: L's step down, half-width goal (points), n's range


def load(path):
    """{arm: {seed: run}} of every finished run under path (any depth)."""
    runs, _ = tables.load_arms(path, lambda cfg: "grpo_nokl" if cfg["loss"] == "grpo" and cfg["beta_start"] ==
                               cfg["beta_end"] == 0 else cfg["loss"], ("pass@1", "pass@16", "distinct_answers"))
    for arm in ARMS:
        if arm not in runs:
            tables.fail(f"no runs of {arm} under {path} (found: {', '.join(sorted(runs))})")
    return runs


def values(run, level):
    """One run's registered values, rates in points (NaN where pass@1 never reaches `level`)."""
    return dict(step=tables.matched_value(run, "step", "pass@1", level),
                at_level=100 * tables.matched_value(run, "pass@16", "pass@1", level),
                top=100 * max(row["eval/pass@1"] for row in run["rows"] if "eval/pass@1" in row),
                pass1=100 * tables.last_mean(run, "pass@1", 3), pass16=100 * tables.last_mean(run, "pass@16", 3),
                start16=100 * tables.value_at(run, "pass@16", 0), distinct=tables.last_mean(run, "distinct_answers", 3))


def pairs(vals, a, b, key):
    """{seed: a's value minus b's} over the seeds where both runs have it."""
    diffs = {s: vals[a][s][key] - vals[b][s][key] for s in sorted(set(vals[a]) & set(vals[b]))}
    return {s: d for s, d in diffs.items() if math.isfinite(d)}


def side(mean, half, digits=1):
    if not math.isfinite(half):
        return "- (fewer than two seeds)"
    return "above 0" if mean - half > 0 else "below 0" if mean + half < 0 else f"not told apart at ±{half:.{digits}f}"


def show_runs(vals, level):
    """The per-run table, and the runs of the primary's arms that never reach L (left out of its pairs)."""
    rows = []
    for arm in ARMS:
        for s, v in sorted(vals[arm].items()):
            crossing = ["never", "-"] if math.isnan(v["at_level"]) else [f"{v['step']:.0f}", f"{v['at_level']:.1f}"]
            rows.append([arm, str(s)] + crossing + [f"{v[k]:.1f}" for k in ("top", "pass1", "pass16", "start16")]
                        + [f"{v['distinct']:.2f}"])
    print(f"Each run (points; L = {level:g}: the step where pass@1 first reaches it, interpolated, and pass@16 there)")
    tables.markdown(["arm", "seed", "reaches L at step", "pass@16 at L", "highest pass@1", "pass@1 (last three)",
                     "pass@16 (last three)", "pass@16 at step 0", "distinct_answers (last three)"], rows)
    never = [f"{arm} seed {s} (highest pass@1 {v['top']:.1f})" for arm in ARMS[:3] for s, v in sorted(vals[arm].items())
             if math.isnan(v["at_level"])]
    print(f"never reach pass@1 = {level:g}, left out of the primary's pairs: {', '.join(never)}\n" if never else
          f"every run of tb, grpo and rloo reaches pass@1 = {level:g}\n")


def pilot(runs, level):
    """The pilot's decisions (docs/diversity.md, "Pilot, first"): the level L, then the number of seeds at that L."""
    tops = {(arm, s): values(run, level)["top"] / 100 for arm in ARMS for s, run in runs[arm].items()}
    short = [f"{arm} seed {s} ({top:g})" for (arm, s), top in tops.items() if top < level]
    new = min(tops.values()) - MOVE if short else level
    vals = {arm: {s: values(run, new) for s, run in runs[arm].items()} for arm in ARMS}
    show_runs(vals, new)
    diffs = {b: list(pairs(vals, "tb", b, "at_level").values()) for b in BASELINES}
    sd = {b: statistics.stdev(d) if len(d) >= 2 else float("nan") for b, d in diffs.items()}
    half, first = tables.seed_count(sd, GOAL, len(BASELINES), SEEDS)  # 3 points: the doc's 0.03
    print("PILOT DECISIONS (docs/diversity.md, \"Pilot, first\"; not part of the test)")
    if short:
        print(f"  level: pass@1 never reaches L = {level:g} in {', '.join(short)}; L becomes the lowest of the pilot "
              f"runs' highest pass@1 minus 0.02 = {min(tops.values()):g} - 0.02 = {new:g}: write it into "
              f"docs/diversity.md before the test runs, and read the test with --level {new:g}")
    else:
        print(f"  level: every pilot run's pass@1 reaches L = {level:g}; L stays {level:g}")
    for b in BASELINES:
        print(f"  spread: tb - {b}, pass@16 at L = {new:g}: per seed {', '.join(f'{d:+.1f}' for d in diffs[b]) or '-'}"
              f" points, sd {sd[b]:.2f}")
    print("  predicted half-width t(n - 1) x sd / sqrt(n), two-sided at the Holm level 1 - 0.05/2, in points:")
    for m in SEEDS:
        print(f"    n = {m}: " + ", ".join(f"tb - {b} {half[m][b]:.2f}" for b in BASELINES)
              + ("  <- below 3 for both" if all(h < GOAL for h in half[m].values()) else ""))
    n = first or SEEDS[-1]
    why = ("the smallest n from 4 to 8 whose predicted half-width is below 0.03 (3 points) for both contrasts"
           if first else "no n from 4 to 8 gives a half-width below 0.03: 8")
    print(f"  seeds: n = {n} ({why}): SEEDS=\"{' '.join(map(str, range(n)))}\" bash scripts/passk_grid.sh test")


def reading(runs, level):
    """The test's reading; returns the forest plot's lines: (label, per-seed values, mean, half)."""
    vals = {arm: {s: values(run, level) for s, run in runs[arm].items()} for arm in ARMS}
    show_runs(vals, level)
    control = {s: v["pass16"] - v["start16"] for s, v in vals["grpo_nokl"].items()}
    cn, cmean, chalf, _ = tables.paired(list(control.values()))
    holds = cn >= 2 and cmean + chalf < 0
    print("Positive control: grpo_nokl's pass@16 (last three) minus its pass@16 at step 0 (points, 95% t-interval)")
    tables.markdown(["statistic", "n", "mean", "95% CI", "reading"], [[
        "control", str(cn), f"{cmean:+.1f}", tables.interval(cmean, chalf),
        "control holds" if holds else "control fails: the question is not read on this setting"]])

    primary = {b: pairs(vals, "tb", b, "at_level") for b in BASELINES}
    stats = [tables.paired(list(primary[b].values())) for b in BASELINES]
    adjusted, rejected, levels = tables.holm([p if math.isfinite(p) else 1.0 for *_, p in stats])
    rows, forest = [], [("control: grpo_nokl end - start", control, cmean, chalf)]
    for j, b in enumerate(BASELINES):
        n, mean, _, p = stats[j]
        half = tables.paired(list(primary[b].values()), levels[j])[2]
        rule = (f"TB keeps {'more' if mean > 0 else 'less'} pass@16 than {b} at equal pass@1 (pass@1 = {level:g}): "
                f"{mean:+.1f} points, {tables.interval(mean, half)}" if rejected[j] else
                f"not told apart at ±{half:.1f}" if math.isfinite(half) else "- (fewer than two seeds)")
        rows.append([f"tb - {b}", str(n), f"{mean:+.1f}", f"{p:.3f}", f"{levels[j]:.4f}", tables.interval(mean, half),
                     f"{adjusted[j]:.3f}", rule if holds else "not read (the control fails): " + rule])
        forest.append((f"PRIMARY: tb - {b} (at {levels[j]:.4f})", primary[b], mean, half))
    print(f"PRIMARY, one family of two: TB's pass@16 minus each baseline's where pass@1 first reaches {level:g}, per "
          "seed (points; Holm's step-down at 0.05, each interval at the level its step tests)")
    tables.markdown(["contrast", "n", "mean", "p", "level", "interval at that level", "Holm-adjusted p",
                     "the rule"], rows)

    rows = []
    for key, name in SECONDARY:
        digits = 2 if key == "distinct" else 1
        for b in BASELINES:
            n, mean, half, _ = tables.paired(list(pairs(vals, "tb", b, key).values()))
            rows.append([f"{name}: tb - {b}", str(n), f"{mean:+.{digits}f}", tables.interval(mean, half, digits),
                         side(mean, half, digits)])
    print("Secondary, labelled so: TB minus each baseline per seed (points; distinct_answers in answers; uncorrected "
          "95% t-intervals)")
    tables.markdown(["SECONDARY contrast", "n", "mean", "95% CI", "reading"], rows)
    return forest


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", help="the folder holding the grid's finished runs (<arm>/seed<N>, any depth)")
    p.add_argument("--pilot", action="store_true", help="the pilot's decisions (level and seeds), not a reading")
    p.add_argument("--level", type=float, default=0.40, help="L, the pass@1 the primary is read at (default 0.40)")
    p.add_argument("--plot", default="", help="also draw the primary's and the control's forest plot into this PNG")
    args = p.parse_args()
    if args.pilot and args.plot:
        tables.fail("--plot draws the test's reading; the pilot reads nothing (drop --plot or --pilot)")
    runs = load(args.runs)
    if args.pilot:
        pilot(runs, args.level)
        return
    forest = reading(runs, args.level)
    if args.plot:
        tables.plot_forest(forest, args.plot, "points of pass@16 (seeds: dots; mean and interval: bars)")


if __name__ == "__main__":
    main()
