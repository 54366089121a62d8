"""The synth stage (``suffice synth``): a teacher LLM writes questions about passages, a judge re-labels
them, and the accepted ones become training items.

The command line is :mod:`suffice.training.synth.cli`; the stage's parts are its modules
(``corpus``, ``prompt``, ``candidates``, ``judge``, ``run``, ``report``, ``config``).
"""
