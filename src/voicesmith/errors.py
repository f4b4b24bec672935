"""Errors that reach the user as one clear paragraph and an exit code.

The command line turns these into a message and the exit code of
../shared/DESIGN.md (2: bad input from the user, 1: the run failed); any
other exception is a bug and is shown as such (with a traceback under --debug).
"""

from __future__ import annotations


class VoicesmithError(Exception):
    """Base class: the message is written for the user, not the developer."""

    exit_code = 1


class UserInputError(VoicesmithError):
    """The user's data, config or arguments are at fault; exit 2."""

    exit_code = 2


class ConfigError(UserInputError):
    """A config file or override is unreadable, malformed or invalid."""


class DataError(UserInputError):
    """The dataset cannot be used (e.g. no usable item)."""


class RunFailed(VoicesmithError):
    """The run itself failed (too many skipped batches, a crash); exit 1."""


class DiskFull(VoicesmithError):
    """A write ran out of disk space (ENOSPC, quota); the message names the file and what to free. Exit 1.
    Not an OSError on purpose: code that tolerates a bad input file must not swallow a full disk."""
