"""Moved to :mod:`suffice.training.data.variants`; this path re-exports its names for one release."""

from suffice.training.data.variants import (  # noqa: F401
    RULES, drop_supporting, make_variants, other_paragraph, paragraph_pool, remove_answer_sentence)

__all__ = [name for name in dir() if not name.startswith("_")]
