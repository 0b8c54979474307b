"""The pipeline's fatal errors: each its own exit code and a message that says
what was wrong, where, and what to do. Sessions catch PipelineError, print the
message and exit with its code; nothing is half-written behind one."""

from __future__ import annotations


class PipelineError(Exception):
    exit_code = 1


class ConfigError(PipelineError):
    """release.toml or a flag is wrong."""

    exit_code = 2


class HostError(PipelineError):
    """The build host lacks something the pipeline cannot install."""

    exit_code = 3


class ImageError(PipelineError):
    """A base or builder image could not be made or obtained."""

    exit_code = 4


class BuildError(PipelineError):
    """Building or repairing a wheel failed."""

    exit_code = 5


class AuditError(PipelineError):
    """The payload audit rejected a wheel; the message lists every finding."""

    exit_code = 6


class ParityError(PipelineError):
    """The parity gate did not pass on what ships, could not run, or its
    evidence is for other wheels."""

    exit_code = 13


class BusyError(PipelineError):
    """Another pipeline run holds this checkout's lock."""

    exit_code = 14


class RebuildError(PipelineError):
    """An independent rebuild did not give the published bytes, or could not run."""

    exit_code = 15
