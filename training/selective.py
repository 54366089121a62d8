"""Moved to :mod:`suffice.training.evaluation.selective_fit`; this name re-exports it for one release."""

import sys

from suffice.training.evaluation.selective_fit import main, plot_selective_curves, read_rows  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
