"""Sweep reports: results.json files -> a comparison table (markdown, CSV) and PNG plots."""

from dpbench.report.build import build_report
from dpbench.report.collect import collect_results, label_of
from dpbench.report.table import tabulate

__all__ = ["build_report", "collect_results", "label_of", "tabulate"]
