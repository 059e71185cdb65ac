"""dpbench: experiment runner and benchmark harness for differentially private training."""

__version__ = "0.1.0"
