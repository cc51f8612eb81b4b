"""The module an export to PyG writes (``OUT.py``): :class:`FullgraphGNN` and ``load_model``.

``OUT.py`` is standalone: it imports torch and torch_geometric only, and holds the source of
:class:`FullgraphGNN` as this module defines it (one copy of the code, checked by the linter and
the tests), so any exported ``OUT.py`` builds any exported ``OUT.pt``
(:mod:`fullgraph.training.export_pyg`, ``docs/export.md``). The class builds every layer kind's
PyG layer itself, from the kind's name (a kind's :attr:`~fullgraph.models.layers.GraphLayer.pyg`
says which layer and which keys); :func:`module_source` writes the module's text.
"""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path
from typing import TypedDict

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import (
    APPNP,
    MLP,
    BatchNorm,
    GATConv,
    GCNConv,
    GINConv,
    GraphConv,
    LayerNorm,
    Linear,
    SAGEConv,
    SGConv,
)

from fullgraph.models.layers import layer_class

#: The first line of every ``OUT.py`` (how ``--force`` recognises a file it may replace).
MARKER = "# Written by `fullgraph export --to pyg`"
#: :class:`FullgraphGNN`'s constructor arguments (every value a plain number, string or None).
InitArgs = dict[str, int | float | str | None]
#: What ``OUT.pt`` holds (:func:`fullgraph.training.export_pyg.export_state`).
ExportState = TypedDict(
    "ExportState",
    {
        "format": str,
        "version": int,
        "class": str,
        "init_args": InitArgs,
        "state_dict": dict[str, Tensor],
        "pyg_model": dict[str, object] | None,
        "normalize_features": bool,
        "source": dict[str, int | float | str | None],
    },
)


class FullgraphGNN(torch.nn.Module):
    """A GCN / GraphSAGE / GAT / GIN / MLP / APPNP / SGC stack of PyG layers, as ``fullgraph
    train`` builds it.

    Layer ``i``: ``h = conv(drop(x), edge_index) + res(drop(x))`` (``mlp``, ``appnp``: a
    ``Linear``, ``conv(drop(x))``; ``appnp``'s last layer then ``APPNP(hops, alpha)`` of it,
    before the residual); then, but for the last layer, ``x = relu(norm(h))``. ``res``
    (``residual=True``) is the identity where the widths match, else a ``Linear`` without
    bias. Dropout acts in training only.

    Args:
        kind: ``gcn`` (``GCNConv``), ``sage`` (``SAGEConv(aggr=aggr)``), ``gat``
            (``GATConv``), ``gin`` (``GINConv`` of ``MLP([in, out, out])``, ``train_eps``) or
            ``graphconv`` (``GraphConv(aggr=aggr)``), ``mlp`` (``Linear``) or ``appnp``
            (``Linear`` layers, then ``APPNP(hops, alpha)``) or ``sgc`` (one layer:
            ``SGConv(K=hops)``).
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
        hops: ``appnp``: propagation steps ``K``; ``sgc``: its ``K``.
        alpha: ``appnp``: teleport probability.
        decoder: a link model's pair scorer (:meth:`decode`): ``"dot"`` (``<z_u, z_v>``) or
            ``"mlp"`` (OGB's ``LinkPredictor``: ``decoder_layers`` linears, ``out_channels``
            wide, on ``z_u * z_v``, ReLU between, the last to one logit); ``None``: a node
            model (its output is the logits).
        decoder_layers: ``mlp``: its linears (>= 1).
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
        hops: int = 10,
        alpha: float = 0.1,
        decoder: str | None = None,
        decoder_layers: int = 0,
    ) -> None:
        super().__init__()
        if decoder not in (None, "dot", "mlp"):
            raise ValueError(f"decoder must be None, 'dot' or 'mlp', not {decoder!r}")
        self.decoder_kind = decoder
        if decoder == "mlp":  # the keys of fullgraph's MLPDecoder: decoder.lins.i.weight
            widths = [out_channels] * decoder_layers + [1]
            lins = [torch.nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:], strict=True)]
            self.decoder = torch.nn.ModuleDict({"lins": torch.nn.ModuleList(lins)})
        kinds = ("gcn", "sage", "gat", "gin", "graphconv", "mlp", "appnp", "sgc")
        if kind not in kinds:
            raise ValueError(f"kind must be one of {', '.join(kinds)}, not {kind!r}")
        if norm not in (None, "batch_norm", "layer_norm"):
            raise ValueError(f"norm must be None, 'batch_norm' or 'layer_norm', not {norm!r}")
        self.kind, self.residual = kind, residual
        self.dropout, self.input_dropout = dropout, input_dropout
        self.convs = torch.nn.ModuleList()
        self.norms = torch.nn.ModuleList()
        self.residuals = torch.nn.ModuleList()
        self.rows = kind in ("mlp", "appnp")  # per-row layers: no edge_index
        self.propagation = APPNP(hops, alpha) if kind == "appnp" else None
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
            elif self.rows:
                conv, width_out = Linear(width, out), out
            elif kind == "sgc":
                conv, width_out = SGConv(width, out, K=hops), out
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
            last = i == len(self.convs) - 1
            h = conv(x) if self.rows else conv(x, edge_index)
            if last and self.propagation is not None:
                h = self.propagation(h, edge_index)
            if self.residual:
                h = h + self.residuals[i](x)
            if not last:
                h = self.norms[i](h).relu()
            x = h
        return x

    def encode(self, x: Tensor, edge_index: Tensor) -> Tensor:
        """A link model's node embeddings, [num_nodes, out_channels] (``forward``)."""
        return self(x, edge_index)

    def decode(self, z: Tensor, edge_label_index: Tensor) -> Tensor:
        """A link model's logit of every pair ``edge_label_index`` [2, m] of embeddings ``z``
        (the probability is its sigmoid)."""
        if self.decoder_kind is None:
            raise ValueError("a node model (decoder None) scores no pairs")
        h = z[edge_label_index[0]] * z[edge_label_index[1]]
        if self.decoder_kind == "dot":
            return h.sum(dim=-1)
        lins = self.decoder["lins"]
        for lin in lins[:-1]:
            h = lin(h).relu()
        return lins[-1](h).squeeze(-1)


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
    APPNP,
    MLP,
    BatchNorm,
    GATConv,
    GCNConv,
    GINConv,
    GraphConv,
    LayerNorm,
    Linear,
    SAGEConv,
    SGConv,
)

__all__ = ["FullgraphGNN", "load_model"]
"""


def _text(value: object) -> str:
    """``value`` for a docstring: printable, no quote or backslash."""
    return "".join(c if c.isprintable() and c not in '"\\' else "?" for c in str(value))


def _summary(state: ExportState) -> str:
    """``GCN, 3 layers, hidden 16, batch norm, residual`` for the module docstring."""
    a = state["init_args"]
    kind = layer_class(str(a["kind"]))
    words = [kind.pyg.name if kind.pyg is not None else str(a["kind"])]
    if a.get("aggr"):
        words[0] += f" ({a['aggr']})"
    words.append(f"{a['num_layers']} layer{'s' if a['num_layers'] > 1 else ''}")
    if a["num_layers"] > 1:
        words.append(f"hidden {a['hidden_channels']}")
    if "heads" in kind.accepts:
        words.append(f"heads {a['heads']}, output heads {a['output_heads']}")
    if "hops" in a:
        words.append(f"K {a['hops']}" + (f", alpha {a['alpha']:g}" if "alpha" in a else ""))
    if a["norm"]:
        words.append(a["norm"].replace("_", " "))
    if a["residual"]:
        words.append("residual")
    if a.get("decoder") == "dot":
        words.append("dot-product decoder")
    elif a.get("decoder") == "mlp":
        words.append(f"MLP decoder of {a['decoder_layers']} linears")
    return ", ".join(words)


def module_source(state: ExportState, name: str) -> str:
    """The text of ``OUT.py`` for the export ``state``
    (:func:`~fullgraph.training.export_pyg.export_state`).

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
    calls = "    logits = model(data.x, data.edge_index)\n"
    if state["init_args"].get("decoder") is not None:
        calls = (
            "    z = model.encode(data.x, data.edge_index)\n"
            "    logits = model.decode(z, edge_label_index)  # pairs [2, m]; sigmoid: p\n"
        )
    doc = (
        f'"""{_summary(state)}: a plain PyG model, with its weights in {_text(name)}.pt beside\n'
        f"this file.\n\n{textwrap.fill(trained + '.', 96)}\n\n"
        f"    {usage}\n"
        f"    model = load_model()                  # evaluation mode, CPU\n"
        f"{calls}\n"
        f"The weights file: ``saved = torch.load(path, weights_only=True)``;\n"
        f'``FullgraphGNN(**saved["init_args"]).load_state_dict(saved["state_dict"])``.\n'
    )
    doc += "".join(f"\n{n}\n" for n in notes) + '"""\n'
    body = inspect.getsource(FullgraphGNN)
    return f"{MARKER}; `--force` may replace it.\n{doc}\n{_IMPORTS}\n\n{body}{_LOADER}"
