"""``fullgraph export --model FILE [--to pyg] OUT.py|OUT.pt``: a trained model as a PyG model.

Reads a model file of ``fullgraph train`` (``--save-model``) and writes a plain PyG model of the
same layers (:mod:`fullgraph.training.export_pyg`): ``OUT.py`` (a standalone module defining
the model class and ``load_model()``, its weights beside it as ``OUT.pt``) or ``OUT.pt`` alone
(the PyG-keyed ``state_dict`` and the constructor arguments). Bad input (not a model file, a
damaged one, an unknown target, another suffix, an existing output without ``--force``, or one
fullgraph did not write) ends with one line and exit status 2 before anything is written.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fullgraph.config import Config, check_path, option
from fullgraph.errors import ConfigError

#: What ``--to`` accepts.
TARGETS = ("pyg",)


def _target(name: str, value: str) -> None:
    """``--to`` names a target fullgraph exports to."""
    if value not in TARGETS:
        raise ConfigError(
            f"{name} {value}: unsupported target; fullgraph exports to: {', '.join(TARGETS)}"
        )


@dataclass
class ExportOptions(Config):
    """What ``fullgraph export`` reads and writes."""

    model: str | None = option(
        None,
        "model file written by `fullgraph train` (--save-model)",
        metavar="FILE",
        required=True,
    )
    to: str = option(
        "pyg", f"what to export to ({', '.join(TARGETS)})", check=_target, metavar="TARGET"
    )
    out: str | None = option(
        None, "OUT.py (a PyG module, weights beside it as OUT.pt) or OUT.pt", cli=False
    )
    force: bool = option(False, "replace OUT (and its weights) when fullgraph export wrote them")

    def check(self) -> None:
        """``--model`` and ``OUT`` are given and not empty."""
        if self.model is None:
            raise ConfigError("--model FILE is required (a model file of `fullgraph train`)")
        check_path("--model", self.model)
        if self.out is None or not str(self.out).strip():
            raise ConfigError("OUT is required (OUT.py or OUT.pt)")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``export`` subcommand."""
    p = subparsers.add_parser(
        "export",
        help="export a trained model (--save-model) to a plain PyG model",
        description=(
            "Export the model file of `fullgraph train` to PyG: OUT.py is a standalone module "
            "(torch and torch_geometric only) with the model class and load_model(), its "
            "weights beside it as OUT.pt; OUT.pt alone holds the PyG state_dict and the "
            "constructor arguments (torch.load(..., weights_only=True)). Its logits on the "
            "whole graph equal the trained model's. See docs/export.md."
        ),
    )
    ExportOptions.add_arguments(p)
    p.add_argument("out", metavar="OUT", help="OUT.py or OUT.pt")
    p.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    """Handler of ``fullgraph export``; returns the exit status."""
    opts = ExportOptions.from_args(args)
    from fullgraph.training.export_pyg import export_pyg

    written = export_pyg(opts.model, opts.out, force=opts.force)
    print(f"fullgraph export: wrote {' and '.join(str(p) for p in written)}")
    return 0
