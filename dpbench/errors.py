"""Errors that stop a run before it can do anything wrong, with a message a user can act on."""


class ConfigurationError(ValueError):
    """A configuration that dpbench refuses: unknown keys, impossible budgets, unsupported models or data."""


class UnsupportedModelError(ConfigurationError):
    """The model has a layer that the chosen privatizer cannot handle privately."""


class MissingDataError(ConfigurationError):
    """Offline data is not installed, or a data set is empty or unknown."""
