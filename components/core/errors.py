"""Errors the core raises for bad input. Each message names the file, line or field at fault."""


class PipelineInputError(ValueError):
    """Bad input data: a missing, empty, corrupted or malformed file or dataset."""


class ConfigError(ValueError):
    """A setting that cannot work (names the setting and what to do)."""
