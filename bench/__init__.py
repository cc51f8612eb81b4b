"""The benchmarks: one module each, run from the repository root as ``python -m bench.NAME``.

``python -m bench.train --help`` lists a benchmark's options; its module docstring says what it
measures and where its rows go. Shared by all of them:

- :mod:`bench.common`: long-format CSV rows (machine, git revision, the reproducing command);
- :mod:`bench.plot`: every chart (a few presets; ``python -m bench.plot FILE.csv`` plots a CSV);
- :mod:`bench.child`: a measurement in a child process and its ``RESULT {json}`` line;
- :mod:`bench.pyg_baseline`: the PyG peer's training step;
- :mod:`bench.link_model`: the projected epoch time on a link.

Importing the package imports nothing else: ``bench.gpu_check`` must run on a machine whose
torch does not import.
"""
