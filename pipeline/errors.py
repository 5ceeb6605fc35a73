"""Errors of the Spark pipeline, each saying what is wrong and what to do about it."""

from __future__ import annotations


class PipelineError(RuntimeError):
    """Base class of the pipeline's errors."""


class BrokerUnreachableError(PipelineError):
    """No broker answered at the bootstrap address."""


class UnknownTopicError(PipelineError):
    """The topic does not exist (the pipeline never creates a topic by reading it)."""


class OffsetRangeError(PipelineError):
    """Requested offsets lie outside what the partition holds, or start after they end."""


class OptionError(PipelineError, ValueError):
    """A data source or builder option is missing or malformed."""
