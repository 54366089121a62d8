"""Moved to :mod:`suffice.training.evaluation` (:mod:`.evaluate` and :mod:`.report`); re-exported for one release."""

import sys

from suffice.training.evaluation.evaluate import (EVAL_EXPERIMENT, build_parser, eval_config, evaluate, main, model_info,  # noqa: F401
                                                  resolve_model, score_bundle, score_model_dir)
from suffice.training.evaluation.report import (BINARY_NAMES, GOLD_READING, answers_for, classification_report,  # noqa: F401
                                                full_report, margins, render_report, report_json, report_metrics, save_plots)

if __name__ == "__main__":
    sys.exit(main())
