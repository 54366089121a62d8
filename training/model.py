"""Moved to :mod:`suffice.training.fit.model` (and :mod:`suffice.training.fit.meta`); re-exported for one release."""

from suffice.training.fit.meta import MODEL_META, ModelMeta, read_model_meta, write_model_meta  # noqa: F401
from suffice.training.fit.model import *  # noqa: F401,F403
from suffice.training.fit.model import (HEAD_MODULES, TOKENIZER_FILES, build_model, is_head_parameter, load_model_dir,  # noqa: F401
                                        load_tokenizer, load_trainable_state_dict, optimizer_groups, resolve_base_dir,
                                        save_model_dir, trainable_parameters, trainable_state_dict)
