"""A trained model as a plain PyG model: ``fullgraph export --model FILE --to pyg OUT``.

The model file of ``fullgraph train`` (:mod:`fullgraph.training.model_file`) becomes a
``torch.nn.Module`` of PyG layers, :class:`FullgraphGNN`, whose logits on the whole graph
(``model(x, edge_index)``, evaluation mode, one process) equal those of our
:class:`~fullgraph.models.gnn.GNN` to rounding. The mapping, layer by layer:

- ``layers.i`` of a kind -> the kind's PyG layer (its
  :attr:`~fullgraph.models.layers.GraphLayer.pyg`: ``GCNConv``, ``SAGEConv(aggr)``,
  ``GraphConv(aggr)``, ``GATConv(heads, concat)``, ``GINConv(MLP([in, out, out]),
  train_eps=True)``, ``Linear`` for ``mlp`` and ``appnp``), its parameters under the kind's
  ``keys`` (``convs.i.lin_l.weight`` <- our ``layers.i.lin.weight``, ...);
- ``appnp``'s propagation -> ``APPNP(K, alpha)`` after the last ``Linear`` (no parameters;
  ``K`` and ``alpha`` are the init args ``hops`` and ``alpha``);
- ``norms.i`` batch -> ``BatchNorm(width)``, evaluated with its running statistics:
  ``norms.i.module.weight`` / ``bias`` / ``running_mean`` / ``running_var`` /
  ``num_batches_tracked``;
- ``norms.i`` layer -> ``LayerNorm(width, mode="node")``: ``norms.i.weight``, ``norms.i.bias``;
- ``residuals.i`` projection -> ``Linear(in, out, bias=False)``: ``residuals.i.weight`` (the
  identity where the widths match: no key);
- a link model (``--task link``): its encoder as above (``out_channels`` the embedding width),
  its decoder as :class:`FullgraphGNN`'s ``decode`` (``decoder="dot"``, or ``"mlp"`` with
  ``decoder.lins.i.weight`` / ``bias`` <- our ``decoder.lins.i``): ``model.decode(
  model.encode(x, edge_index), pairs)`` are the logits ``fullgraph predict --pairs`` scores.

``convs`` and ``norms`` are the names of PyG's own ``BasicGNN`` models, so a model without
residual connections (and, for GAT, with as many heads in the last layer as in the others)
also loads into ``torch_geometric.nn.models.GCN`` / ``GraphSAGE`` / ``GAT`` (GIN: also without
``--norm``, which PyG's ``GIN`` puts inside every MLP; GraphConv has no such model, nor MLP and
APPNP under these names: PyG's ``MLP`` names its layers ``lins``): the export
records their constructor arguments (``pyg_model``).

Two outputs (see ``docs/export.md``):

- ``OUT.pt``: ``torch.save`` of a plain dict, opened by ``torch.load(path, weights_only=True)``:
  ``{"format": "fullgraph-pyg", "version": 1, "class": "FullgraphGNN", "init_args": {...},
  "state_dict": {...}, "pyg_model": {"class": ..., "kwargs": {...}} or None,
  "normalize_features": bool, "source": {...}}``, checksummed in the zip comment as every file
  fullgraph writes (:mod:`fullgraph.run.torch_file`);
- ``OUT.py``: a standalone module (it imports torch and torch_geometric only) holding
  :class:`FullgraphGNN`'s source and ``load_model(weights_path=None)``, with the weights beside
  it as ``OUT.pt`` (the file above): :mod:`fullgraph.training.export_module`.

Before anything is written the exported ``state_dict`` is loaded into the class
(``strict=True``).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor

from fullgraph.atomic import (
    OutputKind,
    Place,
    atomic_write_bytes,
    check_apart,
    check_output,
    is_plain_file,
)
from fullgraph.errors import ConfigError
from fullgraph.models.gnn import GNN
from fullgraph.models.layers import PygExport, kinds_with, layer_class
from fullgraph.models.layers.appnp import propagation_steps
from fullgraph.models.link_decoder import LinkModel
from fullgraph.run.nesting import check_not_inside_output
from fullgraph.run.torch_file import encode_torch_file, not_of_kinds
from fullgraph.training.export_module import (
    MARKER,
    ExportState,
    FullgraphGNN,
    InitArgs,
    module_source,
)
from fullgraph.training.model_file import ModelFile, load_model_file

__all__ = ["FORMAT", "MARKER", "FullgraphGNN", "export_pyg", "init_args", "outputs"]

FORMAT = "fullgraph-pyg"
VERSION = 1
#: Our ``--norm`` -> the name PyG's ``normalization_resolver`` (and :class:`FullgraphGNN`) uses.
NORM_NAMES = {"none": None, "batch": "batch_norm", "layer": "layer_norm"}


def exported(kind: str) -> PygExport:
    """The PyG export of layer kind ``kind`` (:attr:`~fullgraph.models.layers.GraphLayer.pyg`).

    Raises:
        ConfigError: the kind has no PyG layer (why, when the kind says:
            :attr:`~fullgraph.models.layers.GraphLayer.export_note`; the kinds that have one
            are listed).
    """
    cls = layer_class(kind)
    spec = cls.pyg
    if spec is None:
        kinds = ", ".join(kinds_with(lambda c: c.pyg is not None))
        why = f": {cls.export_note}" if cls.export_note else ""
        raise ConfigError(
            f"layer kind {kind!r} has no PyG layer to export to{why} (exported: {kinds})"
        )
    return spec


def init_args(mf: ModelFile) -> InitArgs:
    """The :class:`FullgraphGNN` constructor arguments of the model in ``mf``.

    Raises:
        ConfigError: a layer kind PyG has no layer for, or options its export does not carry
            (a kind's :attr:`~fullgraph.models.layers.PygExport.not_exported`).
    """
    cfg = mf.config
    try:
        spec = exported(cfg.model)
    except ConfigError as exc:
        raise ConfigError(f"--model {mf.path}: {exc}") from None
    opts = cfg.layer_options()
    refused = [f"--{k.replace('_', '-')}" for k in spec.not_exported if getattr(opts, k)]
    if refused:  # FullgraphGNN builds the kind's plain PyG layer
        raise ConfigError(
            f"--model {mf.path}: a {cfg.model} trained with {' and '.join(refused)} cannot be "
            f"exported to PyG yet (its {spec.conv} would differ from the trained layer)"
        )
    link = cfg.task == "link"
    args: InitArgs = {
        "kind": cfg.model,
        "in_channels": int(mf.num_features),
        "hidden_channels": int(cfg.hidden),
        "out_channels": int(cfg.embed_dim or cfg.hidden) if link else int(mf.num_classes),
        "num_layers": int(cfg.layers),
        "heads": int(opts.heads),
        "output_heads": int(opts.output_heads),
        "norm": NORM_NAMES[cfg.norm],
        "residual": bool(cfg.residual),
        "dropout": float(cfg.dropout),
        "input_dropout": float(cfg.resolved_input_dropout()),
        "attention_dropout": float(opts.attention_dropout),
        "aggr": getattr(cfg.layer_kind(), "aggr", None),
    }
    if link:  # the pair scorer after the encoder
        args["decoder"] = cfg.decoder
        args["decoder_layers"] = int(cfg.decoder_layers) if cfg.decoder == "mlp" else 0
    if cfg.model == "appnp":  # the propagation after the MLP (PyG's APPNP(K, alpha))
        args["hops"], args["alpha"] = propagation_steps(opts)
    if cfg.model == "sgc":  # PyG's SGConv: one linear layer on A^K X, A GCN's operator
        propagation, args["hops"], _ = cfg.layer_kind().hop_options(opts)
        if cfg.layers != 1 or propagation != "gcn":
            raise ConfigError(
                f"--model {mf.path}: an sgc of {cfg.layers} layers on --propagation "
                f"{propagation} cannot be exported to PyG: its SGConv is one linear layer on "
                f"A^K X with GCN's operator (--layers 1 --propagation gcn)"
            )
    return args


def pyg_state_dict(model: GNN | LinkModel) -> dict[str, Tensor]:
    """Our model's weights and statistics under :class:`FullgraphGNN`'s keys (CPU copies):
    every layer's parameters by its kind's :attr:`~fullgraph.models.layers.PygExport.keys`
    (a link model: its encoder's, and its decoder's under their own names).

    Raises:
        ConfigError: a layer kind PyG has no layer for.
    """
    out: dict[str, Tensor] = {}
    if isinstance(model, LinkModel):
        for name, t in model.decoder.state_dict().items():
            out[f"decoder.{name}"] = t
        model = model.encoder
    keys = exported(model.kind).keys
    for i, layer in enumerate(model.layers):
        for theirs, ours in keys.items():
            out[f"convs.{i}.{theirs}"] = layer.get_parameter(ours)
    for i, norm in enumerate(model.norms):
        p = f"norms.{i}."
        if model.norm_kind == "batch":  # PyG's BatchNorm holds a BatchNorm1d as ``module``
            for name in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"):
                out[p + "module." + name] = getattr(norm, name)
        elif model.norm_kind == "layer":
            out[p + "weight"], out[p + "bias"] = norm.weight, norm.bias
    for i, res in enumerate(model.residuals):
        if isinstance(res, torch.nn.Linear):
            out[f"residuals.{i}.weight"] = res.weight
    return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in out.items()}


def basic_gnn(args: InitArgs) -> dict[str, object] | None:
    """PyG's own model (``torch_geometric.nn.models.GCN`` / ``GraphSAGE`` / ``GAT`` / ``GIN``)
    that takes the same ``state_dict`` and gives the same logits in evaluation, or ``None`` when
    there is none (residual connections; a kind without one; the kind's own reasons, its
    :attr:`~fullgraph.models.layers.PygExport.basic_kwargs`: GAT with another head count in
    the last layer, GIN with a norm, which PyG's ``GIN`` puts inside every MLP).

    Returns:
        ``{"class": "torch_geometric.nn.models.GCN", "kwargs": {...}}`` or ``None``.
    """
    spec = exported(str(args["kind"]))
    if args["residual"] or spec.basic_gnn is None or args.get("decoder") is not None:
        return None
    kwargs: dict[str, object] = {
        "in_channels": args["in_channels"],
        "hidden_channels": args["hidden_channels"],
        "num_layers": args["num_layers"],
        "out_channels": args["out_channels"],
        "dropout": args["dropout"],
    }
    if spec.basic_kwargs is not None:
        own = spec.basic_kwargs(args)
        if own is None:
            return None
        kwargs.update(own)
    if args["norm"] is not None:
        kwargs["norm"] = args["norm"]
        if args["norm"] == "layer_norm":
            kwargs["norm_kwargs"] = {"mode": "node"}
    return {"class": f"torch_geometric.nn.models.{spec.basic_gnn}", "kwargs": kwargs}


def _plain(value: object) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def export_state(mf: ModelFile) -> ExportState:
    """The dict ``OUT.pt`` holds (see the module docstring), its ``state_dict`` checked by
    loading it into :class:`FullgraphGNN` (``strict=True``).

    Raises:
        ConfigError: the weights do not fit the model the file describes, or a layer kind PyG
            has no layer for.
    """
    args = init_args(mf)
    state = pyg_state_dict(mf.build())
    with torch.random.fork_rng(devices=[]):  # the throw-away initial weights draw nothing
        reference = FullgraphGNN(**args)
    keys = list(reference.state_dict())
    if set(keys) != set(state):  # a mapping that forgot a key: our bug, not the user's
        raise RuntimeError(
            f"export: keys differ from FullgraphGNN's: {sorted(set(keys) ^ set(state))}"
        )
    state = {k: state[k] for k in keys}  # PyG's order
    reference.load_state_dict(state, strict=True)
    source: dict[str, int | float | str | None] = {"model_file": str(mf.path), "sha256": mf.sha256}
    source.update({k: v for k, v in mf.info.items() if _plain(v)})
    return {
        "format": FORMAT,
        "version": VERSION,
        "class": FullgraphGNN.__name__,
        "init_args": args,
        "state_dict": state,
        "pyg_model": basic_gnn(args),
        "normalize_features": bool(mf.config.normalize_features),
        "source": source,
    }


def _not_exported_weights(path: Path) -> str | None:
    """``None`` for a weights file ``fullgraph export`` wrote (whole or damaged), else why not
    (by its content: a model file or a checkpoint is another writer's)."""
    return not_of_kinds(path, FORMAT)


def _not_exported_source(path: Path) -> str | None:
    """``None`` for a module ``fullgraph export`` wrote (its first line), else why not."""
    if not is_plain_file(path):
        return "it is not a regular file"
    with open(path, "rb") as f:
        first = f.readline(len(MARKER) + 1)
    if first.startswith(MARKER.encode()):
        return None
    return "its first line is not the mark fullgraph writes"


#: ``OUT.pt`` (and the weights beside ``OUT.py``).
EXPORTED_WEIGHTS = OutputKind("a PyG export", _not_exported_weights)
#: ``OUT.py``.
EXPORTED_SOURCE = OutputKind("a PyG export", _not_exported_source)


def outputs(out: str | os.PathLike[str]) -> list[Path]:
    """The files an export to ``out`` writes: ``[OUT.pt]``, or ``[OUT.pt, OUT.py]`` (the
    weights first: a module is never written before its weights).

    Raises:
        ConfigError: ``out`` ends neither in ``.py`` nor in ``.pt``.
    """
    out = Path(out)
    if out.suffix == ".pt":
        return [out]
    if out.suffix == ".py":
        return [out.with_suffix(".pt"), out]
    raise ConfigError(
        f"OUT {out}: give a path ending in .py (a PyG module, its weights beside it as .pt) or "
        f".pt (the weights and the constructor arguments)"
    )


def export_pyg(
    model: str | os.PathLike[str], out: str | os.PathLike[str], *, force: bool = False
) -> list[Path]:
    """Export the model file ``model`` to ``out`` (``OUT.py`` or ``OUT.pt``), atomically.

    Every check comes before anything is written: ``out``'s suffix, the outputs apart from the
    model file, the model file itself (read, checksum, weights that fit), the outputs'
    existence (``force`` replaces only files an export wrote).

    Args:
        model: a model file of ``fullgraph train`` (``--save-model``).
        out: ``OUT.py`` (a module and ``OUT.pt`` beside it) or ``OUT.pt``.
        force: replace existing outputs that ``fullgraph export`` wrote.

    Returns:
        The paths written, the weights first.

    Raises:
        ConfigError: a bad suffix, an output that is the model file, a file that is not a
            model file or is damaged, an existing output fullgraph did not write.
        FileExistsError: an output exists and ``force`` is false.
    """
    model, out = Path(model), Path(out)
    paths = outputs(out)
    named = {p: f"OUT {out}" if p == out else f"OUT {out} (its weights {p})" for p in paths}
    check_apart(
        [Place(p, named[p]) for p in paths],
        [Place(model, f"--model {model}", what="the model file")],
    )
    mf = load_model_file(model)
    state = export_state(mf)
    for p in paths:
        check_not_inside_output(p, named[p])  # not into a prediction, a checkpoint directory...
        kind = EXPORTED_SOURCE if p.suffix == ".py" else EXPORTED_WEIGHTS
        option = "OUT" if p == out else "OUT's weights"
        check_output(p, option, exist_ok=force, ours=kind)
    for p in paths:
        if p.suffix == ".pt":
            data = encode_torch_file(state)
        else:
            data = module_source(state, p.stem).encode()
        atomic_write_bytes(p, data, replace=force)
    return paths
