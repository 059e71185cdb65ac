"""Tiny leaderboard suites for the tests of the leaderboard's machinery: TINY (two tasks, a third whose data is
absent, three methods, one profile; tests/leaderboard/test_leaderboard.py, test_leaderboard_recost.py) and a
word2vec one under total budgets whose methods and task entry each test gives (word2vec_totals)."""

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


def word2vec_totals(methods: str, methods_run: str, task_entry: str = "") -> str:
    """A 20-step word2vec task under total budgets 3 and 8 (profile `totals`): `methods` are the suite's method
    lines (each indented two spaces), `methods_run` the profile's list, `task_entry` extra lines of its task entry."""
    return f"""
delta: 1.0e-6
common: [trainer.enable_progress_bar=false, trainer.checkpoint=false, trainer.check_val_every_n_epoch=null]
methods:
  nonprivate: {{overrides: [privatizer=nonprivate], optimizer: adam, private: false}}
  dpadam: {{label: DP-Adam, overrides: [privatizer=vanilla], optimizer: adam}}
{methods}
tasks:
  w2v:
    title: tiny word2vec
    overrides: [model=word2vec, data=bbc_news, model.init_std=1.0, data.train_size=1000, batch_size=100,
                max_steps=20]
    optimizer: adam
    lr: {{adam: [0.001, 0.01]}}
    clip: [1.0, 5.0]
    validation_size: 200
profiles:
  totals:
    budgets: [3, 8]
    tune_epsilon: 3
    budget: total
    tuning: {{lr_points: 2, clip_points: 2, max_growth: 1, each_budget: true, trials: 4, score_noise: 10}}
    seeds: [1, 2]
    smoke: true
    tasks:
      w2v:
        methods: [{methods_run}]
{task_entry}"""
