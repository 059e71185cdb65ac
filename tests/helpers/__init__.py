"""What several test modules share and none of them tests: small models and their batches (models, zoo_models,
transformer_models, recurrent_models, tangent_models, checked_models, construction_models, tiny_task), the
references engines are compared against (per_sample_reference, jl_projections), data and suites for the recipes'
and leaderboard's tests (fashion_mnist, leaderboard_suites), and ways to run dpbench as a user would (cli, trainer_run,
wandb_records). Fixtures live in tests/conftest.py; test modules import from here, never from one another."""
