"""Sweep reports: results.json files -> a comparison table (markdown, CSV) and PNG plots (`build.build_report`).

Nothing is imported here: Hydra imports `callback` in every run, sweep or not, and plotting (matplotlib, 0.9 s) is
only needed when a sweep ends."""
