"""``suffice evaluate`` and ``suffice fit-selective``: how good is a model, next to the baselines.

- :mod:`.evaluate`      score a model directory or bundle on a split; the CLI
- :mod:`.report`        per-source report of a model and the baselines: tables, JSON, MLflow metrics, plots
- :mod:`.metrics`       accuracy, macro-F1, AUROC, ECE, kappa, selective accuracy; plots
- :mod:`.baselines`     keyword coverage, answer in context, TF-IDF + logistic regression
- :mod:`.selective_fit` fit the selective-answering model (serving's :mod:`suffice.serving.gates.selective`)
"""
