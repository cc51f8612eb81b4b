"""A trained model as a plain PyG model: ``fullgraph export --model FILE --to pyg OUT``.

The model file of ``fullgraph train`` (:mod:`fullgraph.training.model_file`) becomes a
``torch.nn.Module`` of PyG layers, :class:`FullgraphGNN`, whose logits on the whole graph
(``model(x, edge_index)``, evaluation mode, one process) equal those of our
:class:`~fullgraph.models.gnn.GNN` to rounding. The mapping, layer by layer:

- ``layers.i`` gcn -> ``GCNConv(in, out)``: ``convs.i.lin.weight``, ``convs.i.bias``;
- ``layers.i`` sage -> ``SAGEConv(in, out, aggr)`` (``aggr`` the model's ``--aggr``: mean,
  sum or max): ``convs.i.lin_l.weight``, ``convs.i.lin_l.bias``, ``convs.i.lin_r.weight``
  (our ``root``);
- ``layers.i`` graphconv -> ``GraphConv(in, out, aggr)``: ``convs.i.lin_rel.weight``,
  ``convs.i.lin_rel.bias`` (our ``lin``), ``convs.i.lin_root.weight`` (our ``root``);
- ``layers.i`` gat -> ``GATConv(in, width, heads, concat)``: ``convs.i.lin.weight``,
  ``convs.i.att_src``, ``convs.i.att_dst``, ``convs.i.bias``;
- ``layers.i`` gin -> ``GINConv(MLP([in, out, out], norm=None), train_eps=True)``:
  ``convs.i.eps``, ``convs.i.nn.lins.0.weight`` / ``bias`` (our ``mlp.0``),
  ``convs.i.nn.lins.1.weight`` / ``bias`` (our ``mlp.2``);
- ``norms.i`` batch -> ``BatchNorm(width)``, evaluated with its running statistics:
  ``norms.i.module.weight`` / ``bias`` / ``running_mean`` / ``running_var`` /
  ``num_batches_tracked``;
- ``norms.i`` layer -> ``LayerNorm(width, mode="node")``: ``norms.i.weight``, ``norms.i.bias``;
- ``residuals.i`` projection -> ``Linear(in, out, bias=False)``: ``residuals.i.weight`` (the
  identity where the widths match: no key).

``convs`` and ``norms`` are the names of PyG's own ``BasicGNN`` models, so a model without
residual connections (and, for GAT, with as many heads in the last layer as in the others)
also loads into ``torch_geometric.nn.models.GCN`` / ``GraphSAGE`` / ``GAT`` (GIN: also without
``--norm``, which PyG's ``GIN`` puts inside every MLP; GraphConv has no such model): the export
records their constructor arguments (``pyg_model``).

Two outputs (see ``docs/export.md``):

- ``OUT.pt``: ``torch.save`` of a plain dict, opened by ``torch.load(path, weights_only=True)``:
  ``{"format": "fullgraph-pyg", "version": 1, "class": "FullgraphGNN", "init_args": {...},
  "state_dict": {...}, "pyg_model": {"class": ..., "kwargs": {...}} or None,
  "normalize_features": bool, "source": {...}}``, checksummed in the zip comment as every file
  fullgraph writes (:mod:`fullgraph.run.torch_file`);
- ``OUT.py``: a standalone module (it imports torch and torch_geometric only) holding
  :class:`FullgraphGNN`'s source and ``load_model(weights_path=None)``, with the weights beside
  it as ``OUT.pt`` (the file above).

The source of :class:`FullgraphGNN` written into ``OUT.py`` is this module's own (one copy of
the code, checked by the linter and the tests). Before anything is written the exported
``state_dict`` is loaded into the class (``strict=True``).
"""

from __future__ import annotations

import inspect
import os
import textwrap
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import (
    MLP,
    BatchNorm,
    GATConv,
    GCNConv,
    GINConv,
    GraphConv,
    LayerNorm,
    Linear,
    SAGEConv,
)

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
from fullgraph.models.layers import layer_class
from fullgraph.run.nesting import check_not_inside_output
from fullgraph.run.torch_file import encode_torch_file, not_of_kinds
from fullgraph.training.model_file import ModelFile, load_model_file

FORMAT = "fullgraph-pyg"
VERSION = 1
#: The first line of every ``OUT.py`` (how ``--force`` recognises a file it may replace).
MARKER = "# Written by `fullgraph export --to pyg`"
#: Our ``--norm`` -> the name PyG's ``normalization_resolver`` (and :class:`FullgraphGNN`) uses.
NORM_NAMES = {"none": None, "batch": "batch_norm", "layer": "layer_norm"}
#: Our layer kind -> PyG's ``BasicGNN`` of the same layers (``None``: PyG has none).
BASIC_GNN = {"gcn": "GCN", "sage": "GraphSAGE", "gat": "GAT", "gin": "GIN", "graphconv": None}


class FullgraphGNN(torch.nn.Module):
    """A GCN / GraphSAGE / GAT / GIN stack of PyG layers, as ``fullgraph train`` builds it.

    Layer ``i``: ``h = conv(drop(x), edge_index) + res(drop(x))``; then, but for the last
    layer, ``x = relu(norm(h))``. ``res`` (``residual=True``) is the identity where the widths
    match, else a ``Linear`` without bias. Dropout acts in training only.

    Args:
        kind: ``gcn`` (``GCNConv``), ``sage`` (``SAGEConv(aggr=aggr)``), ``gat``
            (``GATConv``), ``gin`` (``GINConv`` of ``MLP([in, out, out])``, ``train_eps``) or
            ``graphconv`` (``GraphConv(aggr=aggr)``).
        in_channels: input features.
        hidden_channels: hidden width (per head for ``gat``).
        out_channels: classes.
        num_layers: number of layers (>= 1).
        heads: ``gat``: heads of the hidden layers, concatenated.
        output_heads: ``gat``: heads of the last layer, averaged.
        norm: after every layer but the last: ``None``, ``"batch_norm"`` (``BatchNorm``) or
            ``"layer_norm"`` (``LayerNorm(mode="node")``, every node's row on its own).
        residual: add every layer's input to its output.
        dropout: drop probability before every layer but the first.
        input_dropout: drop probability before the first layer.
        attention_dropout: ``gat``: drop probability of the attention coefficients.
        aggr: ``sage`` / ``graphconv``: ``mean``, ``sum`` or ``max`` (``None``: ``mean`` for
            ``sage``, ``sum`` for ``graphconv``).
    """

    def __init__(
        self,
        kind: str,
        in_channels: int,
        hidden_channels: int,
        out_channels: int,
        num_layers: int,
        heads: int = 1,
        output_heads: int = 1,
        norm: str | None = None,
        residual: bool = False,
        dropout: float = 0.0,
        input_dropout: float = 0.0,
        attention_dropout: float = 0.0,
        aggr: str | None = None,
    ) -> None:
        super().__init__()
        if kind not in ("gcn", "sage", "gat", "gin", "graphconv"):
            raise ValueError(f"kind must be gcn, sage, gat, gin or graphconv, not {kind!r}")
        if norm not in (None, "batch_norm", "layer_norm"):
            raise ValueError(f"norm must be None, 'batch_norm' or 'layer_norm', not {norm!r}")
        self.kind, self.residual = kind, residual
        self.dropout, self.input_dropout = dropout, input_dropout
        self.convs = torch.nn.ModuleList()
        self.norms = torch.nn.ModuleList()
        self.residuals = torch.nn.ModuleList()
        width = in_channels
        for i in range(num_layers):
            last = i == num_layers - 1
            out = out_channels if last else hidden_channels
            if kind == "gcn":
                conv, width_out = GCNConv(width, out), out
            elif kind == "sage":
                conv, width_out = SAGEConv(width, out, aggr=aggr or "mean"), out
            elif kind == "graphconv":
                conv, width_out = GraphConv(width, out, aggr=aggr or "sum"), out
            elif kind == "gin":
                mlp = MLP([width, out, out], norm=None)
                conv, width_out = GINConv(mlp, train_eps=True), out
            else:
                n = output_heads if last else heads
                conv = GATConv(width, out, heads=n, concat=not last, dropout=attention_dropout)
                width_out = out if last else out * n
            self.convs.append(conv)
            if residual:
                same = width == width_out
                self.residuals.append(
                    torch.nn.Identity() if same else Linear(width, width_out, bias=False)
                )
            if not last:
                if norm == "batch_norm":
                    self.norms.append(BatchNorm(width_out))
                elif norm == "layer_norm":
                    self.norms.append(LayerNorm(width_out, mode="node"))
                else:
                    self.norms.append(torch.nn.Identity())
            width = width_out

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        """Logits of every node, [num_nodes, out_channels]."""
        for i, conv in enumerate(self.convs):
            p = self.input_dropout if i == 0 else self.dropout
            x = F.dropout(x, p=p, training=self.training)
            h = conv(x, edge_index)
            if self.residual:
                h = h + self.residuals[i](x)
            if i < len(self.convs) - 1:
                h = self.norms[i](h).relu()
            x = h
        return x


#: ``load_model`` as written into ``OUT.py``.
_LOADER = '''

def load_model(weights_path: str | Path | None = None) -> FullgraphGNN:
    """The trained model in evaluation mode, on the CPU.

    Args:
        weights_path: the weights (default: the ``.pt`` file of this module's name, beside it).
    """
    path = Path(__file__).with_suffix(".pt") if weights_path is None else Path(weights_path)
    saved = torch.load(path, map_location="cpu", weights_only=True)
    model = FullgraphGNN(**saved["init_args"])
    model.load_state_dict(saved["state_dict"])
    return model.eval()
'''

#: The imports of ``OUT.py`` (those :class:`FullgraphGNN` uses, as this module spells them).
_IMPORTS = """from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import (
    MLP,
    BatchNorm,
    GATConv,
    GCNConv,
    GINConv,
    GraphConv,
    LayerNorm,
    Linear,
    SAGEConv,
)

__all__ = ["FullgraphGNN", "load_model"]
"""


def init_args(mf: ModelFile) -> dict[str, Any]:
    """The :class:`FullgraphGNN` constructor arguments of the model in ``mf``.

    Raises:
        ConfigError: a layer kind PyG has no layer for.
    """
    cfg = mf.config
    if cfg.model not in BASIC_GNN:
        raise ConfigError(
            f"--model {mf.path}: layer kind {cfg.model!r} has no PyG layer to export to "
            f"(exported: {', '.join(BASIC_GNN)})"
        )
    weighted = [f"--{k.replace('_', '-')}" for k in ("edge_weight", "improved") if getattr(cfg, k)]
    if weighted:  # FullgraphGNN builds plain GCNConv layers and takes no edge weights
        raise ConfigError(
            f"--model {mf.path}: a gcn trained with {' and '.join(weighted)} cannot be exported "
            f"to PyG yet (its GCNConv would differ from the trained layer)"
        )
    opts = cfg.layer_options()
    return {
        "kind": cfg.model,
        "in_channels": int(mf.num_features),
        "hidden_channels": int(cfg.hidden),
        "out_channels": int(mf.num_classes),
        "num_layers": int(cfg.layers),
        "heads": int(opts.heads),
        "output_heads": int(opts.output_heads),
        "norm": NORM_NAMES[cfg.norm],
        "residual": bool(cfg.residual),
        "dropout": float(cfg.dropout),
        "input_dropout": float(cfg.resolved_input_dropout()),
        "attention_dropout": float(opts.attention_dropout),
        "aggr": getattr(layer_class(cfg.model).variant(opts), "aggr", None),
    }


def pyg_state_dict(model: GNN) -> dict[str, Tensor]:
    """Our model's weights and statistics under :class:`FullgraphGNN`'s keys (CPU copies).

    Raises:
        ConfigError: a layer kind PyG has no layer for.
    """
    out: dict[str, Tensor] = {}
    for i, layer in enumerate(model.layers):
        p = f"convs.{i}."
        if model.kind == "gcn":
            out[p + "lin.weight"] = layer.lin.weight
            out[p + "bias"] = layer.lin.bias
        elif model.kind == "sage":
            out[p + "lin_l.weight"] = layer.lin.weight
            out[p + "lin_l.bias"] = layer.lin.bias
            out[p + "lin_r.weight"] = layer.root.weight
        elif model.kind == "graphconv":
            out[p + "lin_rel.weight"] = layer.lin.weight
            out[p + "lin_rel.bias"] = layer.lin.bias
            out[p + "lin_root.weight"] = layer.root.weight
        elif model.kind == "gat":
            out[p + "lin.weight"] = layer.lin.weight
            out[p + "att_src"] = layer.att_src
            out[p + "att_dst"] = layer.att_dst
            out[p + "bias"] = layer.bias
        elif model.kind == "gin":
            out[p + "eps"] = layer.eps
            for ours, theirs in ((0, 0), (2, 1)):
                out[f"{p}nn.lins.{theirs}.weight"] = layer.mlp[ours].weight
                out[f"{p}nn.lins.{theirs}.bias"] = layer.mlp[ours].bias
        else:
            raise ConfigError(f"layer kind {model.kind!r} has no PyG layer to export to")
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


def basic_gnn(args: dict[str, Any]) -> dict[str, Any] | None:
    """PyG's own model (``torch_geometric.nn.models.GCN`` / ``GraphSAGE`` / ``GAT``) that takes
    the same ``state_dict`` and gives the same logits in evaluation, or ``None`` when there is
    none (residual connections; GAT with another head count in the last layer; GIN with a
    norm, which PyG's ``GIN`` puts inside every MLP).

    Returns:
        ``{"class": "torch_geometric.nn.models.GCN", "kwargs": {...}}`` or ``None``.
    """
    if args["residual"] or (args["kind"] == "gin" and args["norm"] is not None):
        return None
    if BASIC_GNN[args["kind"]] is None:
        return None
    kwargs: dict[str, Any] = {
        "in_channels": args["in_channels"],
        "hidden_channels": args["hidden_channels"],
        "num_layers": args["num_layers"],
        "out_channels": args["out_channels"],
        "dropout": args["dropout"],
    }
    if args["kind"] == "gat":
        heads = args["output_heads"]
        if args["num_layers"] > 1:
            if args["heads"] != heads:
                return None
            kwargs["hidden_channels"] = args["hidden_channels"] * heads  # PyG: all heads
        kwargs["heads"] = heads
    if args["kind"] == "gin":
        kwargs["train_eps"] = True
    if args["kind"] == "sage" and args.get("aggr") not in (None, "mean"):
        kwargs["aggr"] = args["aggr"]
    if args["norm"] is not None:
        kwargs["norm"] = args["norm"]
        if args["norm"] == "layer_norm":
            kwargs["norm_kwargs"] = {"mode": "node"}
    return {"class": f"torch_geometric.nn.models.{BASIC_GNN[args['kind']]}", "kwargs": kwargs}


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def export_state(mf: ModelFile) -> dict[str, Any]:
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
    source = {"model_file": str(mf.path), "sha256": mf.sha256}
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


def _text(value: Any) -> str:
    """``value`` for a docstring: printable, no quote or backslash."""
    return "".join(c if c.isprintable() and c not in '"\\' else "?" for c in str(value))


def _summary(state: dict[str, Any]) -> str:
    """``GCN, 3 layers, hidden 16, batch norm, residual`` for the module docstring."""
    a = state["init_args"]
    names = {
        "gcn": "GCN",
        "sage": "GraphSAGE",
        "gat": "GAT",
        "gin": "GIN",
        "graphconv": "GraphConv",
    }
    words = [names[a["kind"]]]
    if a.get("aggr"):
        words[0] += f" ({a['aggr']})"
    words.append(f"{a['num_layers']} layer{'s' if a['num_layers'] > 1 else ''}")
    if a["num_layers"] > 1:
        words.append(f"hidden {a['hidden_channels']}")
    if a["kind"] == "gat":
        words.append(f"heads {a['heads']}, output heads {a['output_heads']}")
    if a["norm"]:
        words.append(a["norm"].replace("_", " "))
    if a["residual"]:
        words.append("residual")
    return ", ".join(words)


def module_source(state: dict[str, Any], name: str) -> str:
    """The text of ``OUT.py`` for the export ``state`` (from :func:`export_state`).

    Args:
        state: the dict written to the weights file.
        name: the module's file name stem (``OUT`` of ``OUT.py``), for its usage line.
    """
    src = state["source"]
    trained = f"Trained by fullgraph: {_text(Path(src['model_file']).name)}"
    trained += f" (sha256 {src['sha256'][:16]}...)"
    if isinstance(src.get("epoch"), int):
        trained += f", best epoch {src['epoch']}"
    for key in ("val", "test"):
        if isinstance(src.get(key), float):
            trained += f", {key} {src.get('metric', 'acc')} {src[key]:.4f}"
    if src.get("data"):
        trained += f", data {_text(src['data'])}"
    usage = f"from {name} import load_model"
    if not name.isidentifier():
        usage = "load_model = ...                  # this file's, imported with importlib"
    notes = []
    if state["normalize_features"]:
        notes.append(
            "The model was trained on features row-normalised as PyG's NormalizeFeatures does\n"
            "(``--normalize-features``): apply ``torch_geometric.transforms.NormalizeFeatures()``\n"
            "to the data first."
        )
    if state["pyg_model"] is not None:
        cls = state["pyg_model"]["class"]
        notes.append(
            f"The same state_dict also loads into PyG's own ``{cls}``:\n"
            f'``{cls.rpartition(".")[2]}(**saved["pyg_model"]["kwargs"])``.'
        )
    doc = (
        f'"""{_summary(state)}: a plain PyG model, with its weights in {_text(name)}.pt beside\n'
        f"this file.\n\n{textwrap.fill(trained + '.', 96)}\n\n"
        f"    {usage}\n"
        f"    model = load_model()                  # evaluation mode, CPU\n"
        f"    logits = model(data.x, data.edge_index)\n\n"
        f"The weights file: ``saved = torch.load(path, weights_only=True)``;\n"
        f'``FullgraphGNN(**saved["init_args"]).load_state_dict(saved["state_dict"])``.\n'
    )
    doc += "".join(f"\n{n}\n" for n in notes) + '"""\n'
    body = inspect.getsource(FullgraphGNN)
    return f"{MARKER}; `--force` may replace it.\n{doc}\n{_IMPORTS}\n\n{body}{_LOADER}"


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
