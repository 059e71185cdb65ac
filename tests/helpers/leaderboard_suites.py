"""A tiny leaderboard suite (two tasks, a third whose data is absent, three methods, one profile) for the tests of
the leaderboard's machinery (tests/leaderboard/test_leaderboard.py, test_leaderboard_recost.py)."""

TINY = """
delta: 1.0e-5
common: [trainer.enable_progress_bar=false, trainer.checkpoint=false, trainer.check_val_every_n_epoch=null,
         logger.csv=false, profiler.warmup_steps=1, eval_batch_size=1000]
methods:
  nonprivate: {label: non-private, overrides: [privatizer=nonprivate], optimizer: task, private: false}
  dpsgd: {label: DP-SGD, overrides: [privatizer=vanilla], optimizer: sgd}
  jl:
    label: JL
    overrides: [privatizer=jl]
    optimizer: task
    ladder: {key: privatizer.projections, short: r, values: [1], keep: 1}
tasks:
  cnn:
    title: tiny CNN
    note: Three steps only, so the numbers say nothing.
    overrides: [model=cnn, data=mnist5k, batch_size=100, max_steps=3]
    optimizer: sgd
    lr: {sgd: [0.5, 2.0]}
    clip: [0.5, 2.0]
    validation_size: 200
  vit:
    title: tiny ViT
    delta: 1.0e-6
    overrides: [model=vit, data=mnist5k, batch_size=100, max_steps=3]
    optimizer: sgd
    lr: {sgd: [0.5, 2.0]}
    clip: [0.5, 2.0]
    validation_size: 200
  absent:
    title: data not installed
    overrides: [model=cnn, data=fashion_mnist]
    optimizer: sgd
    lr: {sgd: [0.5, 2.0]}
    clip: [0.5, 2.0]
    validation_size: 200
    requires: /nonexistent/fashion-mnist
profiles:
  tiny:
    budgets: [1]
    tune_epsilon: 1
    tuning: {lr_points: 1, clip_points: 1, max_growth: 1, each_budget: false}
    tuning_seed: 100
    seeds: [0]
    smoke: true
    tasks:
      cnn: {methods: [nonprivate, dpsgd]}
      vit: {methods: [dpsgd, jl]}
      absent: {methods: [dpsgd]}
"""
