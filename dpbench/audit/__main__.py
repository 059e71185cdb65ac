"""`python -m dpbench.audit RUN_OR_SWEEP_DIR ...`: canary exposure of trained word2vec runs.

Each run must have been trained with canaries (data.canaries=N, e.g. 1000, data.canary_copies=n_c). Writes
canary_audit.json into every run directory, and canary_ranks.png (one panel per run, plus a control of random
phrases that were never inserted) into --out (default: the first directory given).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dpbench.audit.canary import canary_ranks, plot_histograms, uniformity
from dpbench.core.errors import ConfigurationError
from dpbench.core.results import RESULTS_FILE, read_results, write_json_atomic
from dpbench.data.corpus import make_canaries
from dpbench.models.word2vec import Word2Vec
from dpbench.training.checkpoint_io import load_checkpoint


def load_run(run_dir: Path) -> tuple[Word2Vec, dict, dict]:
    results = read_results(run_dir).to_json()
    config = results["config"]
    model_cfg, data_cfg = config["model"], config["data"]
    if model_cfg.get("name") != "word2vec":
        raise ConfigurationError(f"{run_dir}: the canary audit needs a model=word2vec run")
    if not data_cfg.get("canaries"):
        raise ConfigurationError(f"{run_dir}: trained without canaries; train with data.canaries=1000")
    model = Word2Vec(model_cfg["vocab_size"], model_cfg["dim"], model_cfg["mode"], model_cfg["tied"])
    checkpoint = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    state = {k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items() if k.startswith("model.")}
    model.load_state_dict(state)
    return model.eval(), data_cfg, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--references", type=int, default=10_000, help="random phrases per canary (the paper: 10K)")
    parser.add_argument("--bins", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    try:
        audit(args)
    except ConfigurationError as error:  # a run the audit cannot use, or a checkpoint it refuses to load
        print(f"dpbench.audit: error: {error}", file=sys.stderr)
        sys.exit(2)


def audit(args: argparse.Namespace) -> None:
    """canary_audit.json for every run under the given directories, and their rank histograms in one figure."""
    runs = sorted({p.parent for d in args.dirs for p in ([d / RESULTS_FILE] + list(d.rglob(RESULTS_FILE)))
                   if p.exists()})
    if not runs:
        raise SystemExit(f"no {RESULTS_FILE} under {', '.join(map(str, args.dirs))}")
    panels = {}
    for run_dir in runs:
        model, data_cfg, results = load_run(run_dir)
        canaries = make_canaries(model.embedding.num_embeddings, data_cfg["canaries"], data_cfg["canary_seed"])
        ranks = canary_ranks(model, canaries, args.references)
        if not panels:  # phrases never inserted: what no memorization looks like (the paper's Figure 2d)
            control = make_canaries(model.embedding.num_embeddings, data_cfg["canaries"], data_cfg["canary_seed"] + 1)
            panels["control (not inserted)"] = canary_ranks(model, control, args.references)
        label = f"{results['privatizer']} n_c={data_cfg['canary_copies']}"
        if results.get("epsilon") is not None:
            label += f" eps={results['epsilon']:.3g}"
        panels[label] = ranks
        test = uniformity(ranks, args.bins)
        write_json_atomic(run_dir / "canary_audit.json", {
            "canaries": len(canaries), "copies": data_cfg["canary_copies"], "references": args.references,
            "mean_rank": float(ranks.mean()), "histogram": test.counts, "chi2": test.chi2, "p_value": test.p_value,
            "ranks": ranks.tolist(),
        })
        print(f"{run_dir}: {label}: chi2 {test.chi2:.1f}, p {test.p_value:.3g}, mean rank {ranks.mean():.3f}")
    out = args.out or args.dirs[0]
    out.mkdir(parents=True, exist_ok=True)
    plot_histograms(panels, out / "canary_ranks.png", args.bins)
    print("wrote", out / "canary_ranks.png")


if __name__ == "__main__":
    main()
