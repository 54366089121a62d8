"""Moved to :mod:`suffice.training.fit.config`; this name re-exports it for one release."""

from suffice.training.fit.config import *  # noqa: F401,F403
from suffice.training.fit.config import (BASELINES, ID2LABEL, POSITIVE_LABEL, REGISTERED_MODEL, TASKS,  # noqa: F401
                                         CalibrationSettings, LoraSettings, RetrievalGateData, TrackingSettings, TrainConfig,
                                         build_train_config, normalise_argv)
