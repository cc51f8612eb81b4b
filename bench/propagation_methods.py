"""The exact-propagation methods of :mod:`bench.fullbatch_vs_minibatch` (issue 34): their
commands, their recipes and how their time to accuracy is split.

Each method is one ``fullgraph train --parts DIR`` run on the bench's partition:

- ``sign``: ``--model sign`` (K = 3, ``sym``), full-batch steps over the precomputed hops;
- ``sgc``: ``--model sgc --layers 1`` (K = 2, ``gcn``): a linear layer on ``A^K X``;
- ``appnp``: ``--model appnp`` (an MLP, then K = 10 steps of personalised PageRank every step);
- ``mlp+cs`` and ``sage+cs``: ``--model mlp`` / ``--model sage`` with ``--correct-smooth``:
  every evaluation puts the predictions through Correct & Smooth, whose smoothed validation
  score picks the best model (``fullgraph.propagation.correct_smooth``).

The hops of ``sign`` and ``sgc`` are recomputed every run (``--force``): their seconds (rank 0's,
from the cache entry's ``hops.json``) are the method's precompute, added to its time to the
target. For the C&S methods the smoothing is part of the prediction, so the evaluation that
first reaches the target is counted in their time to the target too (:func:`split`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fullgraph.atomic import atomic_write_json


@dataclass(frozen=True)
class Method:
    """One exact-propagation method of the bench.

    Attributes:
        tag: the log files' name part.
        model: ``--model``.
        layers: ``--layers`` (a recipe's ``layers`` wins).
        flags: the method's own ``fullgraph train`` flags.
        precompute: it reads precomputed hops (their seconds are added to its time).
        smoothing: its evaluations run Correct & Smooth (counted in its time to the target).
    """

    tag: str
    model: str
    layers: int
    flags: tuple[str, ...] = ()
    precompute: bool = False
    smoothing: bool = False


METHODS: dict[str, Method] = {
    "sign": Method("sign", "sign", 2, ("--hops", "3", "--propagation", "sym"), precompute=True),
    "sgc": Method("sgc", "sgc", 1, ("--hops", "2", "--propagation", "gcn"), precompute=True),
    "appnp": Method("appnp", "appnp", 2, ("--hops", "10", "--alpha", "0.1")),
    "mlp+cs": Method("mlp-cs", "mlp", 3, ("--correct-smooth",), smoothing=True),
    "sage+cs": Method("sage-cs", "sage", 3, ("--correct-smooth",), smoothing=True),
}

#: Every method's recipe where a dataset's ``SETTINGS[...]["recipes"]`` names none: Adam
#: learning rate, epochs (scaled by ``--epoch-scale``), evaluation cadence, and optionally
#: ``layers`` (over the method's), ``hidden`` (over the bench's ``--hidden``) and more
#: ``flags`` (after the bench's: they win).
DEFAULT_RECIPES: dict[str, dict] = {
    "sign": {"lr": 0.01, "epochs": 100, "eval_every": 5},
    "sgc": {"lr": 0.1, "epochs": 100, "eval_every": 5},
    "appnp": {"lr": 0.01, "epochs": 80, "eval_every": 2},
    "mlp+cs": {"lr": 0.01, "epochs": 100, "eval_every": 25},
    "sage+cs": {"lr": 0.01, "epochs": 80, "eval_every": 20},
}


def recipe(settings: dict, method: str) -> dict:
    """The recipe of ``method`` on a dataset: its ``settings["recipes"][method]`` over the
    default."""
    return {**DEFAULT_RECIPES[method], **settings.get("recipes", {}).get(method, {})}


def method_command(
    method: str,
    prefix: list[str],
    settings: dict,
    model_flags: list[str],
    epoch_scale: float = 1.0,
) -> list[str]:
    """The ``fullgraph train`` command of ``method`` (without ``--log-json``).

    Args:
        method: a key of :data:`METHODS`.
        prefix: the launcher, ``fullgraph train --parts DIR``.
        settings: the dataset's ``SETTINGS`` entry (its ``recipes``).
        model_flags: the bench's flags of every run (hidden width, dropout, seed, threads...).
        epoch_scale: multiplies the recipe's epochs (``--epoch-scale``).
    """
    m, r = METHODS[method], recipe(settings, method)
    epochs = max(1, round(r["epochs"] * epoch_scale))
    layers = r.get("layers", m.layers)
    cmd = [*prefix, "--model", m.model, "--layers", str(layers), "--lr", str(r["lr"])]
    cmd += [*model_flags, "--eval-every", str(r["eval_every"]), *m.flags]
    if "hidden" in r:  # after the bench's --hidden: argparse keeps the last
        cmd += ["--hidden", str(r["hidden"])]
    return [*cmd, *r.get("flags", ()), "--epochs", str(epochs), "--force"]


def precompute_seconds(parts: Path, since: float) -> float:
    """The seconds of the hops computed into ``parts`` (their cache entry's ``hops.json``)
    at or after ``since`` (a ``time.time()``); NaN where no entry was written then."""
    found = [
        p for p in (parts / "precompute").glob("*/hops.json") if p.stat().st_mtime >= since - 1
    ]
    if not found:
        return float("nan")
    newest = max(found, key=lambda p: p.stat().st_mtime)
    return float(json.loads(newest.read_text())["seconds"])


def save_precompute(log: Path, seconds: float) -> None:
    """Keep a run's precompute seconds beside its log (``--reuse`` reads them back)."""
    atomic_write_json(log.with_suffix(".precompute.json"), {"precompute_s": seconds})


def load_precompute(log: Path) -> float:
    """The precompute seconds :func:`save_precompute` kept for ``log`` (0 where none)."""
    path = log.with_suffix(".precompute.json")
    return float(json.loads(path.read_text())["precompute_s"]) if path.is_file() else 0.0


def split(
    epochs: list[dict], target: float, precompute_s: float = 0.0, smoothing: bool = False
) -> dict[str, float]:
    """A run's time to the target and its split: precompute + steps x step time + evaluation
    (a full-batch epoch is one step; a mini-batch epoch is many).

    ``time_to_target_s`` = precompute + the training steps up to the first evaluation at or
    above ``target`` (+ that evaluation for a C&S method: its smoothing makes the prediction);
    ``wall_to_target_s`` adds every evaluation up to it. NaN where the target is not reached.
    """
    train, evals, steps = 0.0, 0.0, 0
    out = {
        "precompute_s": precompute_s,
        "epochs_to_target": float("nan"),
        "eval_to_target_s": float("nan"),
        "time_to_target_s": float("nan"),
        "wall_to_target_s": float("nan"),
    }
    for rec in epochs:
        train += rec["epoch_s"]
        evals += rec.get("eval_s", 0.0)
        steps += 1
        if "test_acc" in rec and rec["test_acc"] >= target:
            last = rec.get("eval_s", 0.0) if smoothing else 0.0
            out.update(epochs_to_target=float(steps), eval_to_target_s=evals)
            out["time_to_target_s"] = precompute_s + train + last
            out["wall_to_target_s"] = precompute_s + train + evals
            break
    return out


def _ratio(st: dict, base: dict | None) -> float:
    if base is None:
        return float("nan")
    return st["time_to_target_s"] / base["time_to_target_s"]


def table_text(table: list[tuple]) -> str:
    """The bench's summary table: one row per (dataset, method, P) of ``(dataset, method, P,
    target, stats, epochs run, wall seconds)``, with the time to the target over mini-batch's
    at the same P (``x mb``)."""
    mini = {(r[0], r[2]): r[4] for r in table if r[1] == "mini-batch"}
    head = (
        f"{'dataset':16} {'method':19} {'P':>2} {'target':>7} {'to target s':>11} "
        f"{'x mb':>6} {'+eval s':>8} {'pre s':>6} {'ep->t':>5} {'median ep s':>11} "
        f"{'eval->t s':>9} {'final acc':>9} {'peak MiB':>8} {'epochs':>6} {'wall s':>7}"
    )
    rows = [head]
    for name, method, p, target, st, n_ep, wall in table:
        rows.append(
            f"{name:16} {method:19} {p:>2} {target:7.4f} {st['time_to_target_s']:11.2f} "
            f"{_ratio(st, mini.get((name, p))):6.2f} {st['wall_to_target_s']:8.1f} "
            f"{st['precompute_s']:6.2f} {st['epochs_to_target']:5.0f} "
            f"{st['median_epoch_s']:11.3f} {st['eval_to_target_s']:9.1f} "
            f"{st['final_test_acc']:9.4f} {st['peak_rss_mb']:8.0f} {n_ep:6d} {wall:7.1f}"
        )
    return "\n".join(rows)
