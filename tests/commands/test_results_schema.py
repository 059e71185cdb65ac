"""results.json is the typed, versioned record of `dpbench.core.results`: a real CLI run writes exactly its fields,
reading gives the same record back, every field is documented in docs/configuration.md, and files of an unknown
version or with a privatizer figure that shadows a field are refused."""

import dataclasses
import json
import re

import pytest

from dpbench.core.errors import ConfigurationError
from dpbench.core.results import SCHEMA_VERSION, RunResults, StoppedRun, read_results
from tests.helpers.cli import FAST, ROOT, dpbench


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("run")
    done = dpbench("max_steps=2", "batch_size=500", "privacy.epsilon=4", "trainer.checkpoint=false", *FAST,
                   f"hydra.run.dir={directory}")
    assert done.returncode == 0, done.stderr[-2000:]
    return directory


def test_a_run_writes_exactly_the_schemas_fields_and_reads_back_the_same_record(run_dir):
    payload = json.loads((run_dir / "results.json").read_text())
    assert payload["schema_version"] == SCHEMA_VERSION
    assert set(payload) == set(RunResults.json_keys(payload["test_metric"]))  # vanilla has no figures of its own
    record = read_results(run_dir)
    assert isinstance(record, RunResults) and record.private and record.steps == 2
    assert record.test_score == payload["test_accuracy"] and record.epsilon == payload["epsilon"]
    assert record.to_json() == payload
    assert record.objective == payload["test_accuracy"]  # no validation split: sweeps optimise the test metric


def test_every_field_is_documented_and_every_documented_field_exists():
    text = (ROOT / "docs" / "configuration.md").read_text()
    section = text[text.index("## results.json"):text.index("## The remaining keys")]
    documented = {key for row in re.findall(r"^\| (.+?) \|", section, re.MULTILINE)
                  for key in re.findall(r"`([a-z_<>]+)`", row)}
    fields = set(RunResults.json_keys("<metric>"))
    assert fields - documented == set(), "fields of RunResults missing from docs/configuration.md"
    assert documented - fields == set(), "documented results.json fields that RunResults lacks"
    stopped = {f.name for f in dataclasses.fields(StoppedRun)}
    assert all(f"`{name}`" in section for name in stopped)


def test_a_newer_schema_is_refused_and_a_file_from_before_the_schema_reads_with_nulls(run_dir, tmp_path):
    payload = json.loads((run_dir / "results.json").read_text())
    (tmp_path / "results.json").write_text(json.dumps({**payload, "schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(ConfigurationError, match=f"schema_version {SCHEMA_VERSION + 1}.*upgrade dpbench"):
        read_results(tmp_path)
    legacy = {key: value for key, value in payload.items() if key not in ("schema_version", "page_faults_per_step")}
    (tmp_path / "results.json").write_text(json.dumps(legacy))
    record = read_results(tmp_path / "results.json")
    assert record.schema_version == 0 and record.page_faults_per_step is None and record.epsilon == payload["epsilon"]


def test_a_privatizer_figure_named_like_a_field_is_refused_and_others_sit_beside_the_fields(run_dir):
    record = read_results(run_dir)
    with pytest.raises(ConfigurationError, match="privacy_report.*epsilon"):
        dataclasses.replace(record, strategy_figures={"epsilon": 0.0})
    with_figures = dataclasses.replace(record, strategy_figures={"theorem3_epsilon": 7.5})
    assert with_figures.to_json()["theorem3_epsilon"] == 7.5
    assert RunResults.from_json(with_figures.to_json()) == with_figures
