"""Every key of a run's schema is documented in docs/configuration.md, and the README is a map: a key added to the
schema without a line there fails here."""

import dataclasses
from collections.abc import Iterator

from dpbench.core.config import Config
from tests.helpers.cli import ROOT


def schema_keys(schema: type, prefix: str = "") -> Iterator[str]:
    for field in dataclasses.fields(schema):
        default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        if dataclasses.is_dataclass(default):
            yield from schema_keys(type(default), f"{prefix}{field.name}.")
        else:
            yield prefix + field.name


def test_every_key_of_the_run_schema_is_documented():
    text = (ROOT / "docs" / "configuration.md").read_text()
    keys = list(schema_keys(Config))
    assert len(keys) > 40
    assert [key for key in keys if f"`{key}" not in text and f" {key}=" not in text] == []


def test_the_readme_is_a_map_that_links_every_page_it_names():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 120
    for page in ("configuration", "privacy", "architecture", "methods", "plugins", "scale", "resume"):
        assert f"](docs/{page}.md)" in readme and (ROOT / "docs" / f"{page}.md").exists()
