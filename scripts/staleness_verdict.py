"""The staleness test's registered reading (docs/staleness.md, "The test"): from its runs, each objective's drop, the
positive control, the one primary statistic and the Holm-adjusted secondaries, with the verdict the rule gives.

    python scripts/staleness_verdict.py docs/grids/staleness_test [--plot docs/staleness_test.png]

A run's value is the mean of its last three evaluations of held-out accuracy, in points. Per seed and objective,
drop = value(D = 0) - value(D), D the test's delay (the one other weight_delay in the runs). Per seed:
  primary  = TB's drop minus the mean of the three policy-gradient baselines' drops (dr_grpo, grpo, rloo);
  control  = the mean of those three drops (staleness must hurt them for the primary to be read);
  secondaries (one family, Holm at 0.05): TB's drop minus each baseline's; TBA''s drop minus Dr. GRPO's.
Each is a mean over the seeds that have every run it needs, with a paired t-interval.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tables  # noqa: E402

BASELINES = ("dr_grpo", "grpo", "rloo")
OBJECTIVES = ("tb",) + BASELINES + ("tba_prime",)
SECONDARY = [("tb", "dr_grpo"), ("tb", "grpo"), ("tb", "rloo"), ("tba_prime", "dr_grpo")]
ALPHA = tables.ALPHA


def load(paths):
    """{(loss, weight_delay): {seed: value in points}} of every finished run under paths."""
    values = {}
    for path in paths:
        for here, dirs, files in os.walk(path):
            if "summary.json" in files and "config.yaml" in files:
                run = tables.load_run(here)
                cfg = run["cfg"]
                values.setdefault((cfg["loss"], int(cfg["weight_delay"])), {})[cfg["seed"]] = \
                    100 * tables.last_mean(run, "accuracy", 3)
    return values


def drops_of(values):
    """(D, {loss: {seed: drop}}) for the one delay D > 0 in the runs."""
    delays = sorted({d for _, d in values if d > 0})
    if len(delays) != 1:
        tables.fail(f"expected runs at weight_delay 0 and one D > 0, found D in {delays}")
    d = delays[0]
    drops = {}
    for loss in OBJECTIVES:
        fresh, stale = values.get((loss, 0), {}), values.get((loss, d), {})
        drops[loss] = {s: fresh[s] - stale[s] for s in sorted(set(fresh) & set(stale))}
    return d, drops


def per_seed(drops, fn, needs):
    """{seed: fn(drops at that seed)} over the seeds where every objective in `needs` has its drop."""
    seeds = set.intersection(*(set(drops[loss]) for loss in needs))
    return {s: fn({loss: drops[loss][s] for loss in needs}) for s in sorted(seeds)}


def verdict(mean, half, below, above, n):
    if n < 2:
        return "-"
    return below if mean + half < 0 else above if mean - half > 0 else f"not told apart at ±{half:.1f}"


def row(name, xs, rule=("below 0", "above 0"), level=1 - ALPHA):
    n, mean, half, p = tables.paired(list(xs.values()), level)
    ci = "-" if n < 2 else f"[{mean - half:+.1f}, {mean + half:+.1f}]"
    return [name, str(n), f"{mean:+.1f}", ci, verdict(mean, half, *rule, n)], (n, mean, half, p)


def report(drops, d):
    """Prints the four tables; returns the forest plot's lines: (label, per-seed values, mean, half)."""
    forest = []
    rows = []
    for loss in OBJECTIVES:
        r, (n, mean, half, _) = row(loss, drops[loss], ("D helps", "staleness costs"))
        rows.append(r)
        forest.append((f"{loss}: drop", drops[loss], mean, half))
    print(f"Each objective's drop: accuracy at D = 0 minus at D = {d}, points (mean of the last three evaluations)")
    tables.markdown(["objective", "n", "mean drop", "95% CI", "reading"], rows)

    control = per_seed(drops, lambda x: np.mean([x[b] for b in BASELINES]), BASELINES)
    primary = per_seed(drops, lambda x: x["tb"] - np.mean([x[b] for b in BASELINES]), ("tb",) + BASELINES)
    c_row, (cn, cmean, chalf, _) = row("control: the baselines' mean drop", control,
                                       ("FAILS (staleness helps them)", "passes"))
    if cn >= 2 and not cmean - chalf > 0:
        c_row[-1] = "fails: no staleness effect to compare"
    p_row, (n, mean, half, _) = row("PRIMARY: TB's drop minus the baselines' mean drop", primary,
                                    ("TB more robust to staleness", "TB less robust to staleness"))
    if c_row[-1] != "passes":
        p_row[-1] = "not read (the control did not pass): " + p_row[-1]
    print("The positive control, then the one primary statistic (paired seeds, 95% t-interval)")
    tables.markdown(["statistic", "n", "mean (pts)", "95% CI", "verdict (the rule)"], [c_row, p_row])
    forest += [("control", control, cmean, chalf), ("PRIMARY", primary, mean, half)]

    contrasts = [per_seed(drops, lambda x, a=a, b=b: x[a] - x[b], (a, b)) for a, b in SECONDARY]
    stats = [tables.paired(list(c.values())) for c in contrasts]
    usable = [i for i, s in enumerate(stats) if s[0] >= 2]
    adjusted, rejected, levels = tables.holm([stats[i][3] for i in usable])
    rows = []
    for j, i in enumerate(usable):
        a, b = SECONDARY[i]
        n, mean, _, _ = stats[i]
        _, _, half, _ = tables.paired(list(contrasts[i].values()), levels[j])
        reading = ("more robust" if mean < 0 else "less robust") if rejected[j] else f"not told apart at ±{half:.1f}"
        rows.append([f"{a}'s drop minus {b}'s", str(n), f"{mean:+.1f}", f"{levels[j]:.4f}",
                     f"[{mean - half:+.1f}, {mean + half:+.1f}]", f"{adjusted[j]:.3f}", f"{a} {reading}"])
        forest.append((f"{a} - {b} (Holm)", contrasts[i], mean, half))
    print(f"Secondary, one family of {len(usable)} (Holm's step-down at 0.05; each interval at the level its step "
          "tests)")
    tables.markdown(["contrast", "n", "mean (pts)", "level", "interval at that level", "Holm-adjusted p", "reading"],
                    rows)
    return forest


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="folders holding the test's finished runs (any depth)")
    p.add_argument("--plot", default="", help="also draw the forest plot into this PNG")
    args = p.parse_args()
    values = load(args.runs)
    if not values:
        tables.fail(f"no finished runs under {' '.join(args.runs)}")
    d, drops = drops_of(values)
    forest = report(drops, d)
    if args.plot:
        tables.plot_forest(forest, args.plot, "points of held-out accuracy (seeds: dots; mean and interval: bars)")


if __name__ == "__main__":
    main()
