"""Which per-sample engine `privatizer.engine=auto` gives each built-in and example model, and why (the README's
table, per_sample/construction.py): every model as `model=NAME` builds it on the data it is run with.

    python -m benchmarks.engines
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import OmegaConf

from dpbench.data import load_data
from dpbench.models import build_model
from dpbench.privatizers.per_sample.construction import fast_path_refusal

CASES: dict[str, tuple[dict, dict]] = {
    "cnn": ({}, {"name": "mnist5k"}),
    "cnn_large": ({}, {"name": "mnist5k"}),
    "cnn_d2p2": ({}, {"name": "mnist5k"}),
    "vit": ({}, {"name": "mnist5k"}),
    "scatternet_linear": ({}, {"name": "mnist5k"}),
    "lstm": ({}, {"name": "rotten_tomatoes", "tokenizer": "word", "max_length": 32}),
    "minilm": ({}, {"name": "rotten_tomatoes", "tokenizer": "hf:minilm", "max_length": 32}),
    "minilm (LoRA)": ({"lora": {"rank": 4}}, {"name": "rotten_tomatoes", "tokenizer": "hf:minilm", "max_length": 32}),
    "opt": ({}, {"name": "rotten_tomatoes", "tokenizer": "hf:minilm", "max_length": 32}),
    "roberta": ({}, {"name": "rotten_tomatoes", "tokenizer": "hf:minilm", "max_length": 32}),
    "word2vec": ({}, {"name": "bbc_news"}),
}
EXAMPLES = {"examples/my_mlp (model=mlp)": ("my_mlp.build_mlp", {"name": "mlp"}, {"name": "mnist5k"})}


def engine_of(model_config: dict, data_config: dict) -> str:
    model = build_model(OmegaConf.create(model_config), load_data(OmegaConf.create(data_config)))
    refusal = fast_path_refusal(model)
    return "hooks" if refusal is None else f"functorch (vmap): {refusal}"


def rows(names: list[str] | None = None) -> dict[str, str]:
    """Engine by model, for the CASES named (all when None) and the examples."""
    found = {}
    for name, (overrides, data) in CASES.items():
        if names is None or name in names:
            base = OmegaConf.to_container(OmegaConf.load(f"conf/model/{name.split(' ')[0]}.yaml"))
            found[name] = engine_of(OmegaConf.merge(base, overrides), data)  # type: ignore[arg-type]
    if names is None:
        sys.path.insert(0, str(Path("examples").resolve()))
        for name, (target, options, data) in EXAMPLES.items():
            found[name] = engine_of({"_target_": target, **options}, data)
    return found


def main() -> None:
    for name, engine in rows().items():
        print(f"{name:32s} {engine}")


if __name__ == "__main__":
    main()
