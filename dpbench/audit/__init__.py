"""Empirical privacy audits.

- `gradient_canary`: one privatized step, many trials, a canary's gradient direction as the test (any privatizer).
- `one_run` (with `canary_run`, `one_run_attacks`, `one_run_bound`): Steinke et al.'s one-run audit of a whole real
  multi-epoch run through white-box gradient canaries; catches privacy randomness derivable from what a run
  publishes and epochs that replay their batches.
- `canary` and `python -m dpbench.audit`: canary exposure of trained word2vec runs (Carlini et al.'s Secret Sharer).
"""
