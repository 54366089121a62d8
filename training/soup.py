"""Moved to :mod:`suffice.training.fit.soup`; this name re-exports it for one release."""

import sys

from suffice.training.fit.soup import *  # noqa: F401,F403
from suffice.training.fit.soup import (METHODS, METRICS, MUST_MATCH, Ingredient, SoupError, average,  # noqa: F401
                                       better_or_equal, build_parser, check_compatible, check_same_parameters, greedy_soup,
                                       load_weights, main, resolve_ingredient, soup)

if __name__ == "__main__":
    sys.exit(main())
