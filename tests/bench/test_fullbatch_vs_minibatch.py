"""``bench.fullbatch_vs_minibatch``'s exact-propagation methods (``bench/propagation_methods.py``):
their commands, as ``fullgraph train`` parses them, and how their time to the target is split.

Nothing trains: every method's command is parsed by fullgraph's own parser, its configuration
checked and its model built, for the arxiv-synth validation and for the products-synth run at
P = 4 that the lead starts (a renamed flag, a model kind that refuses an option, a recipe that
does not reach the command fails here, not an hour into that run).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest

from bench import fullbatch_vs_minibatch as fbmb
from bench import propagation_methods as prop
from fullgraph.cli import build_parser
from fullgraph.training.config import TrainConfig


def _args(*argv: str):
    return fbmb.parser().parse_args(list(argv))


def _train_config(cmd: list[str]) -> TrainConfig:
    """The configuration ``fullgraph train`` makes of ``cmd`` (its launcher and binary cut)."""
    argv = cmd[cmd.index("train") :]
    return TrainConfig.from_args(build_parser(argv).parse_args(argv))


def _flag(cmd: list[str], name: str) -> str:
    """The last value of ``name`` in ``cmd`` (argparse's: the last one wins)."""
    return cmd[len(cmd) - 1 - cmd[::-1].index(name) + 1]


@pytest.mark.parametrize(
    ("dataset", "ranks", "argv"),
    [
        ("arxiv-synth", 1, ("--epoch-scale", "0.5")),
        ("arxiv-synth", 2, ()),
        ("products-synth", 4, ("--hidden", "256")),  # the lead's products command
    ],
)
def test_every_method_is_a_train_command_fullgraph_accepts(dataset, ranks, argv, tmp_path) -> None:
    args = _args("--datasets", dataset, "--ranks", str(ranks), "--methods", "all", *argv)
    parts = tmp_path / f"{dataset}-{ranks}"
    variants = {m: cmd for m, _, cmd in fbmb.commands(args, dataset, ranks, tmp_path, parts)}
    assert set(prop.METHODS) <= set(variants)
    assert set(variants) - fbmb.SHORT == fbmb.chosen_methods("all") - (
        set() if ranks > 1 else {"full-batch int8"}  # halo compression needs two ranks
    )
    for method, m in prop.METHODS.items():
        cmd = variants[method]
        if ranks > 1:
            assert cmd[:3] == [str(fbmb.BIN / "mpirun"), "-n", str(ranks)]
        else:
            assert "mpirun" not in " ".join(cmd)
        r = prop.recipe(fbmb.SETTINGS[dataset], method)
        assert cmd[cmd.index("train") : cmd.index("train") + 3] == ["train", "--parts", str(parts)]
        assert cmd[-1] == "--force"  # the hops recomputed (their time measured), logs replaced
        config = _train_config(cmd)
        scale = args.epoch_scale
        assert (config.model, config.layers, config.lr) == (
            m.model,
            r.get("layers", m.layers),
            r["lr"],
        )
        assert (config.epochs, config.eval_every) == (round(r["epochs"] * scale), r["eval_every"])
        assert config.hidden == r.get("hidden", args.hidden) and config.seed == 0
        assert (config.correct_smooth_params() is not None) == m.smoothing
        if m.precompute:
            assert int(_flag(cmd, "--hops")) == config.hops
        config.build_model(100, 47)  # the kind takes every option the bench gives it
    # the recipes differ from full-batch SAGE's own command (which they do not inherit)
    assert _flag(variants["full-batch"], "--model") == "sage"
    assert "--correct-smooth" not in variants["full-batch"]


def test_a_dataset_recipe_overrides_the_default_and_its_flags_win() -> None:
    products = fbmb.SETTINGS["products-synth"]
    assert prop.recipe(products, "sage+cs")["epochs"] == 30
    assert prop.recipe({}, "sage+cs") == prop.DEFAULT_RECIPES["sage+cs"]
    cmd = prop.method_command("sage+cs", ["fullgraph", "train"], products, ["--dropout", "0.5"])
    assert _train_config(cmd).dropout == 0.2  # the recipe's flags after the bench's


def test_an_unknown_method_stops_the_bench_naming_the_known_ones() -> None:
    with pytest.raises(SystemExit, match=r"unknown method\(s\) \['sign2'\]; known: all, .*sign"):
        fbmb.chosen_methods("full-batch,sign2")
    assert fbmb.chosen_methods("sign, mini-batch") == {"sign", "mini-batch"}


def _epochs(accs: list[float | None], epoch_s: float = 1.0, eval_s: float = 0.5) -> list[dict]:
    out = []
    for i, acc in enumerate(accs, 1):
        rec = {"epoch": i, "epoch_s": epoch_s, "eval_s": 0.0, "peak_rss_mb": 10.0}
        if acc is not None:
            rec.update(test_acc=acc, eval_s=eval_s)
        out.append(rec)
    return out


def test_split_adds_the_precompute_and_a_smoothing_evaluation() -> None:
    epochs = _epochs([None, 0.5, None, 0.8, None, 0.9])
    plain = prop.split(epochs, 0.75, precompute_s=2.0)
    assert plain["epochs_to_target"] == 4
    assert plain["time_to_target_s"] == 2.0 + 4 * 1.0
    assert plain["wall_to_target_s"] == 2.0 + 4 * 1.0 + 2 * 0.5
    assert plain["eval_to_target_s"] == 1.0
    smoothed = prop.split(epochs, 0.75, precompute_s=0.0, smoothing=True)
    assert smoothed["time_to_target_s"] == 4 * 1.0 + 0.5  # the evaluation that reached it
    missed = prop.split(epochs, 0.95, precompute_s=2.0)
    assert math.isnan(missed["time_to_target_s"]) and math.isnan(missed["epochs_to_target"])
    final = {"median_epoch_s": 1.0, "test_acc": 0.9}
    stats = fbmb.summarise(epochs, final, 0.75, 3.0, "sign")
    assert stats["time_to_target_s"] == 7.0 and stats["train_time_s"] == 6.0
    assert fbmb.summarise(epochs, final, 0.75, 0.0, "mlp+cs")["time_to_target_s"] == 4.5


def _entry(parts: Path, name: str, seconds: float, mtime: float) -> None:
    path = parts / "precompute" / name / "hops.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"seconds": seconds}))
    os.utime(path, (mtime, mtime))


def test_precompute_seconds_are_the_hops_this_run_wrote(tmp_path) -> None:
    now = time.time()
    assert math.isnan(prop.precompute_seconds(tmp_path, now))
    _entry(tmp_path, "sym-k3-all-old", 9.0, now - 3600)  # an earlier run's entry
    assert math.isnan(prop.precompute_seconds(tmp_path, now))
    _entry(tmp_path, "gcn-k2-last-new", 1.5, now + 1)
    assert prop.precompute_seconds(tmp_path, now) == 1.5
    log = tmp_path / "run.jsonl"
    assert prop.load_precompute(log) == 0.0
    prop.save_precompute(log, 1.5)
    assert prop.load_precompute(log) == 1.5


def test_the_table_gives_the_ratio_to_mini_batch_at_the_same_p() -> None:
    def stats(t: float) -> dict[str, float]:
        keys = ("wall_to_target_s", "precompute_s", "epochs_to_target", "median_epoch_s")
        keys += ("eval_to_target_s", "final_test_acc", "peak_rss_mb")
        return {"time_to_target_s": t, **dict.fromkeys(keys, 1.0)}

    table = [
        ("d", "mini-batch", 1, 0.7, stats(10.0), 2, 1.0),
        ("d", "sgc", 1, 0.7, stats(2.5), 2, 1.0),
        ("d", "sgc", 2, 0.7, stats(2.5), 2, 1.0),
    ]
    rows = prop.table_text(table).splitlines()
    assert rows[2].split()[:6] == ["d", "sgc", "1", "0.7000", "2.50", "0.25"]
    assert rows[3].split()[5] == "nan"  # no mini-batch run at P = 2
