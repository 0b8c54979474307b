"""The pipeline's fatal errors: each its own exit code and a message that says
what was wrong, where, and what to do. Sessions catch PipelineError, print the
message and exit with its code; nothing is half-written behind one.

Every exit code is here, and nowhere else (tests and CI scripts rely on them):

    1  PipelineError     anything without its own code
    2  ConfigError       release.toml or a flag
    3  HostError         the build host lacks something
    4  ImageError        a base, builder or runtime image
    5  BuildError        building or repairing a wheel
    6  AuditError        the payload audit
    7  PatchError        the vLLM patch series or distribution
    8  ManifestError     recording a release, or one whose bytes or signature do
                         not verify (verify: a path or flag typed wrong is 2)
    9  PublishError      publishing (10: CollisionError, other bytes already there)
   11  DirtyTreeError    uncommitted changes without --allow-dirty
   12  SigningKeyError   a signing or trusted key, or a fingerprint
   13  ParityError       the parity gate
   14  BusyError         another run holds the pipeline lock
   15  RebuildError      an independent rebuild
"""

from __future__ import annotations


class PipelineError(Exception):
    exit_code = 1


class ConfigError(PipelineError):
    """release.toml or a flag is wrong."""

    exit_code = 2


class HostError(PipelineError):
    """The build host lacks something the pipeline cannot install."""

    exit_code = 3


class HostPreparationError(HostError):
    """Preparing the host (installing a package, starting a daemon) failed."""


class ImageError(PipelineError):
    """A base or builder image could not be made or obtained."""

    exit_code = 4


class BuildError(PipelineError):
    """Building or repairing a wheel failed."""

    exit_code = 5


class AuditError(PipelineError):
    """The payload audit rejected a wheel; the message lists every finding."""

    exit_code = 6


class PatchError(PipelineError):
    """A vLLM distribution or patch series cannot be used: not pinned, not
    downloadable with its hash, or a hunk that does not apply exactly."""

    exit_code = 7


class ManifestError(PipelineError):
    """A release cannot be recorded (a stage's record is missing or says it
    failed), or a manifest does not verify (its signature, schema or an
    artifact's bytes)."""

    exit_code = 8


class PublishError(PipelineError):
    """Publishing to a destination failed."""

    exit_code = 9


class CollisionError(PublishError):
    """This version is already published with other bytes: a published
    version is never overwritten."""

    exit_code = 10


class DirtyTreeError(PipelineError):
    """The working tree has uncommitted changes and --allow-dirty was not given."""

    exit_code = 11


class SigningKeyError(PipelineError):
    """A signing or trusted key cannot be used (missing, unreadable, too open
    to others, locked without its passphrase, not Ed25519) or a fingerprint
    is malformed."""

    exit_code = 12


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
