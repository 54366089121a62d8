"""``suffice train``: fit a sufficiency (or retrieval-gate) cross-encoder.

The stages of a run, one module each, in the order :func:`suffice.training.fit.run.run` calls them:

- :mod:`.config`   the :class:`TrainConfig` dataclass (YAML + ``--key=value``)
- :mod:`.splits`   raw train/validation/test splits for both tasks
- :mod:`.encode`   rows -> packed, labelled datasets; samplers, collation, data loaders
- :mod:`.model`    the cross-encoder (LoRA or full fine-tuning) and its model directory
- :mod:`.meta`     :class:`ModelMeta`, the ``suffice_model.json`` of a model directory
- :mod:`.loop`     the run object (:class:`TrainingRun`), the training loop, run state, checkpoints, prediction
- :mod:`.features` the hook an optional training feature comes through (its columns, batch grouping, loss)
- :mod:`.pairs`    the contrast features: the retrieval gate's pairs, sufficiency's passage groups
- :mod:`.calibration` calibration settings and fits (temperature or Platt), decisiveness
- :mod:`.finalize` temperature, thresholds, reports, metadata, save and register (train and soup)
- :mod:`.run`      the outline: accelerator, splits, loaders, model and optimiser, loop, finalize
- :mod:`.soup`     ``suffice soup``: average fine-tuned models into one

Heavy dependencies (torch, transformers, accelerate, mlflow) are imported inside functions.
"""
