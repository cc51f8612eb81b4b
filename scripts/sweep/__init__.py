"""The fault sweep's parts (``scripts/fault_sweep.py`` is its command line).

- ``records``: the case record of the tables (``Row``, ``Send``) and the runnable ``Case``;
- ``tables``: the case tables, one module per family;
- ``commands``: the launchers and the placeholders of a row's command;
- ``steps`` / ``checks``: the vocabulary of setup steps and after-run checks;
- ``build``: rows to runnable cases, in the sweep's order;
- ``workspace``: the small workspace every case copies;
- ``runner``: runs one case and classifies its outcome.
"""
