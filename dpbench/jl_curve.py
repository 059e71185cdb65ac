"""Bu et al. 2021, Figure 3: epsilon of DP-SGD-JL against the JL dimension r (and epochs), beside vanilla DP-SGD.

    python -m dpbench.jl_curve [--sigma 0.6 --batch-size 256 --train-size 25000 --epochs 15 --delta 1e-5]
        [--projections 1,5,10,30,100] [--points 1,5,10,15] [--out outputs/jl_privacy_curve]

Writes jl_privacy_curve.csv, jl_privacy_curve.md and jl_privacy_curve.png; the defaults are Table 2's IMDb setting.
Each figure comes from the accountant the runs use (the chi-square mixture of Theorem 2.3 for JL).
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

from dpbench.privacy.jl_epsilon import VANILLA, epsilon_table


def write_outputs(table: dict[str, dict[int, float]], out: Path, title: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    points = sorted(next(iter(table.values())))
    paths = [out / "jl_privacy_curve.csv", out / "jl_privacy_curve.md", out / "jl_privacy_curve.png"]
    with paths[0].open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["r", *[f"epoch_{e}" for e in points]])
        for r, row in table.items():
            writer.writerow([r, *[row[e] for e in points]])
    lines = [f"# {title}", "", "| r | " + " | ".join(f"epoch {e}" for e in points) + " |",
             "|---|" + "---|" * len(points)]
    lines += [f"| {r} | " + " | ".join(f"{row[e]:.3g}" for e in points) + " |" for r, row in table.items()]
    paths[1].write_text("\n".join(lines) + "\n")
    figure, (by_epoch, by_r) = plt.subplots(1, 2, figsize=(11, 4))
    for r, row in table.items():
        finite = [(e, v) for e, v in row.items() if math.isfinite(v)]
        if finite:
            by_epoch.plot(*zip(*finite, strict=True), marker="o", label=f"JL({r})" if r != VANILLA else "vanilla")
    by_epoch.set(xlabel="epoch", ylabel="epsilon", title="epsilon per epoch", yscale="log")
    by_epoch.legend()
    last = points[-1]
    finite_r = [(int(r), row[last]) for r, row in table.items() if r != VANILLA and math.isfinite(row[last])]
    if finite_r:
        by_r.plot(*zip(*finite_r, strict=True), marker="o", label="JL(r)")
    by_r.axhline(table[VANILLA][last], color="black", linestyle="--", label="vanilla")
    by_r.set(xlabel="JL dimension r", ylabel=f"epsilon after {last} epochs", xscale="log", yscale="log", title=title)
    by_r.legend()
    figure.tight_layout()
    figure.savefig(paths[2], dpi=120)
    plt.close(figure)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sigma", type=float, default=0.6)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--train-size", type=int, default=25_000)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--projections", default="1,5,10,30,100")
    parser.add_argument("--points", default=None, help="epochs to evaluate (default 1, 5, 10, ..., epochs)")
    parser.add_argument("--out", type=Path, default=Path("outputs/jl_privacy_curve"))
    args = parser.parse_args()
    if not (args.sigma > 0 and 0 < args.batch_size <= args.train_size and args.epochs > 0 and 0 < args.delta < 1):
        parser.error("need sigma > 0, 0 < batch size <= train size, epochs > 0 and delta in (0, 1)")
    points = ([int(p) for p in args.points.split(",")] if args.points
              else sorted({1, *range(5, args.epochs, 5), args.epochs}))
    projections = [int(r) for r in args.projections.split(",")]
    steps_per_epoch = max(1, round(args.train_size / args.batch_size))
    title = (f"sigma {args.sigma}, B {args.batch_size}, N {args.train_size}, delta {args.delta:g}")
    print(f"epsilon of DP-SGD-JL by r ({title}, {steps_per_epoch} steps per epoch)", flush=True)
    table = epsilon_table(args.sigma, args.batch_size / args.train_size, steps_per_epoch, args.delta, projections,
                          points)
    for path in write_outputs(table, args.out, title):
        print("wrote", path)


if __name__ == "__main__":
    main()
