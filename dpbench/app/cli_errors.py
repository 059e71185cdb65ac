"""The errors Hydra and OmegaConf catch before dpbench sees the config (a mistyped key, a value of the wrong type,
an unknown group option, an unparsable override) in dpbench's own form: one line naming the key, exit 2, with a
"did you mean" where a close name exists and, for a key of another component, the components that take it.

Hydra prints these itself in four to seven lines with exit 1 and advice to add `+` (which the schema then refuses)
unless HYDRA_FULL_ERROR is set, when it raises them: `one_line_errors` sets it for the call and catches them. A user
who set HYDRA_FULL_ERROR gets Hydra's full error. Errors a job raises while it runs are not configuration errors:
they keep their traceback (`from_the_job` marks them).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from dpbench.core.errors import did_you_mean
from dpbench.core.methods import METHODS, OPTIMIZERS, method_label
from dpbench.core.registry import COMPONENTS, RECIPES

FULL_ERROR = "HYDRA_FULL_ERROR"
_FROM_JOB = "_dpbench_from_the_job"


def from_the_job(error: BaseException) -> None:
    """Mark an error raised while a job ran: it is reported with its traceback, not as a configuration error."""
    setattr(error, _FROM_JOB, True)


@contextmanager
def one_line_errors(prefix: str, argv: list[str]) -> Iterator[None]:
    user_asked = FULL_ERROR in os.environ
    os.environ[FULL_ERROR] = "1"  # Hydra then raises its errors, for us to word, instead of printing them
    try:
        yield
    except (HydraException, OmegaConfBaseException) as error:
        if user_asked or getattr(error, _FROM_JOB, False):
            raise
        print(f"{prefix}: error: {describe(error, argv)}", file=sys.stderr)
        sys.exit(2)
    finally:
        if not user_asked:
            os.environ.pop(FULL_ERROR, None)


def _first_line(text: str) -> str:
    return str(text).strip().splitlines()[0] if str(text).strip() else ""



def describe(error: BaseException, argv: list[str]) -> str:
    if isinstance(error, MissingConfigException) and error.missing_cfg_file and "/" in error.missing_cfg_file:
        group, _, name = error.missing_cfg_file.rpartition("/")
        return unknown_option(group, name, list(error.options or []))
    if isinstance(error, OverrideParseException):
        lines = [line for line in str(error.message).splitlines()
                 if line.strip() and not line.startswith(("Error parsing override", "See https"))]
        reason = lines[0].partition(f": {error.override}")[0].strip()[:100] if lines else ""
        return (f"cannot parse the override {error.override!r}{f' ({reason})' if reason else ''}: a value with "
                "spaces, non-ASCII or special characters needs quotes that reach Hydra, e.g. 'key=\"a value\"'")
    # Hydra chains an error of a config file it composes (a user's experiment) as the context, not the cause
    cause = error if isinstance(error, OmegaConfBaseException) else (error.__cause__ or error.__context__)
    if isinstance(cause, OmegaConfBaseException) and cause.full_key:
        found = re.match(r"In '([^']+)'", str(error)) if cause is not error else None
        where = f" (in {found.group(1)}.yaml)" if found else ""  # a key of a config file, not of the command line
        if isinstance(cause, ConfigKeyError | ConfigAttributeError):
            keys = list(cause.parent_node.keys()) if cause.parent_node is not None else []
            name = cause.parent_node.get("name") if cause.parent_node is not None else None
            return unknown_key(str(cause.full_key), keys, name, argv) + where
        return f"{cause.full_key}: {_first_line(cause.msg)}{where}"
    return _first_line(str(error))


def _method_spelling(name: str) -> str:
    """A method typed as a privatizer (`privatizer=dpsgd`, `privatizer=DP-Adam`): the overrides that mean it."""
    typed = re.sub(r"[^a-z0-9]", "", name.lower())
    for privatizer in METHODS:
        for optimizer in OPTIMIZERS:
            if re.sub(r"[^a-z0-9]", "", method_label(privatizer, optimizer).lower()) == typed:
                return f"; {method_label(privatizer, optimizer)} is privatizer={privatizer} optimizer={optimizer}"
    return ""


def unknown_option(group: str, name: str, options: list[str]) -> str:
    plus = "+" if group in RECIPES else ""
    alias = _method_spelling(name) if group == "privatizer" else ""
    hint = alias or did_you_mean(name, options, f"{plus}{group}=")
    listed = f"; choose from {', '.join(options)}" if options else ""
    return f"{plus}{group}={name}: no such {group}{hint}{listed}"


def unknown_key(full_key: str, keys: list[str], component: str | None, argv: list[str]) -> str:
    parent, _, key = full_key.rpartition(".")
    where = f"{parent}." if parent else ""
    hint = did_you_mean(key, [str(k) for k in keys], where)
    if parent in COMPONENTS:
        owner = f"{parent}={component}" if component else parent
        message = f"{full_key}: {owner} has no key {key!r}{hint}"
        if not hint:
            takers = components_taking(parent, key, argv)
            message += (f"; {', '.join(f'{parent}={t}' for t in takers)} take{'s' if len(takers) == 1 else ''} it"
                        if takers else f"; no {parent} takes it")
        return message
    return f"{full_key}: no such key{hint}"


def components_taking(group: str, key: str, argv: list[str]) -> list[str]:
    """The options of a group (presets apart) whose config has `key`, as `python -m dpbench.components` lists them."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.global_hydra import GlobalHydra

    from dpbench.app.catalog import entries
    from dpbench.app.hydra_setup import main_hydra

    try:
        args, _ = get_args_parser().parse_known_args(argv)
    except SystemExit:
        return []
    GlobalHydra.instance().clear()
    try:
        hydra = main_hydra(argparse.Namespace(config_path=None, config_dir=args.config_dir))
        return [entry.name for entry in entries(hydra, group)
                if key in entry.keys and not entry.origin.startswith("preset of")]
    except Exception:  # only a hint: the error itself is already known
        return []
    finally:
        GlobalHydra.instance().clear()
