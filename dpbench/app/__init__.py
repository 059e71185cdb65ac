"""The application layer: Hydra's set-up for dpbench (conf dir, schemas, plugin config groups) and the catalog of
what a run accepts. The commands (dpbench.cli, .list, .plan, .profile) use it; it never imports a command."""
