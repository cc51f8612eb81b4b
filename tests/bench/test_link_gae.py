"""``bench.link_gae``'s pure parts: its options, the commands it runs, reading a run's final
record, the table (mean ± std, the published rows, the largest P=4 - P=1 difference) and the
CSV it writes read back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import link_gae as bench
from bench.common import CSVWriter


def test_parse_args_defaults_and_refusals() -> None:
    a = bench.parse_args([])
    assert a.datasets == ["cora", "citeseer", "coauthor-cs", "amazon-photo"]
    assert a.seeds == [0, 1, 2] and a.ranks == [1, 4]
    assert bench.parse_args(["--ranks", "4", "1", "4"]).ranks == [1, 4]
    for bad in (["--datasets", "pubmed"], ["--datasets", ","], ["--ranks", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def _value(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def test_commands_follow_the_gae_protocol(tmp_path: Path) -> None:
    split = bench.linksplit_command("cora", tmp_path / "root", 2, tmp_path / "split")
    assert split[1:3] == ["data", "linksplit"]
    assert _value(split, "--dataset") == "cora" and _value(split, "--name") == "cora-gae-s2"
    assert _value(split, "--val") == "0.05" and _value(split, "--test") == "0.1"
    assert _value(split, "--neg-ratio") == "1" and _value(split, "--seed") == "2"
    assert _value(split, "--out") == str(tmp_path / "split")
    part = bench.partition_command("cora-gae-s2", tmp_path / "split", 4, tmp_path / "p")
    assert part[1] == "partition" and _value(part, "--parts") == "4"
    assert _value(part, "--root") == str(tmp_path / "split")
    one = bench.train_command(tmp_path / "p", 1, 2, tmp_path / "log.jsonl", 2)
    assert Path(one[0]).name == "fullgraph" and one[1] == "train"
    four = bench.train_command(tmp_path / "p", 4, 2, tmp_path / "log.jsonl", 1)
    assert Path(four[0]).name == "mpirun" and _value(four, "-n") == "4"
    for cmd in (one, four):
        assert _value(cmd, "--task") == "link" and _value(cmd, "--decoder") == "dot"
        assert _value(cmd, "--model") == "gcn" and _value(cmd, "--layers") == "2"
        assert _value(cmd, "--hidden") == "32" and _value(cmd, "--embed-dim") == "16"
        assert _value(cmd, "--lr") == "0.01" and _value(cmd, "--epochs") == "200"
        assert _value(cmd, "--neg-ratio") == "1" and _value(cmd, "--seed") == "2"


def test_read_scores_takes_the_final_record(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    epoch = {"epoch": 1, "val_auc": 0.8, "test_auc": 0.7, "test_ap": 0.6}
    final = {"final": True, "task": "link", "metric": "auc", "best_val_auc": 0.9}
    final |= {"test_auc": 0.91, "test_ap": 0.925}
    log.write_text(json.dumps(epoch) + "\n" + json.dumps(final) + "\n")
    assert bench.read_scores(log) == pytest.approx({"test_auc": 91.0, "test_ap": 92.5})
    # a final record without test_ap: the AP of its best epoch's record
    del final["test_ap"]
    best = {"epoch": 2, "val_auc": 0.9, "test_auc": 0.91, "test_ap": 0.93}
    log.write_text("".join(json.dumps(r) + "\n" for r in (epoch, best, final | {"best_epoch": 2})))
    assert bench.read_scores(log) == pytest.approx({"test_auc": 91.0, "test_ap": 93.0})
    log.write_text("".join(json.dumps(r) + "\n" for r in (epoch, final | {"best_epoch": 5})))
    with pytest.raises(SystemExit, match="no test_ap"):
        bench.read_scores(log)
    log.write_text(json.dumps(epoch) + "\n")
    with pytest.raises(SystemExit, match="no final record"):
        bench.read_scores(log)


def _results() -> bench.Results:
    def s(auc: float, ap: float) -> dict[str, float]:
        return {"test_auc": auc, "test_ap": ap}

    return {
        ("cora", 1): {0: s(90.0, 91.0), 1: s(92.0, 93.0)},
        ("cora", 4): {0: s(90.0, 91.0), 1: s(92.0, 93.25)},
        ("amazon-photo", 1): {0: s(80.0, 81.0)},
    }


def test_max_rank_difference_pairs_the_same_seed() -> None:
    r = _results()
    assert bench.max_rank_difference(r, "cora", [1, 4]) == {"test_auc": 0.0, "test_ap": 0.25}
    photo = bench.max_rank_difference(r, "amazon-photo", [1, 4])
    assert all(v != v for v in photo.values())  # NaN: no seed at P=4


def test_table_rows_means_published_and_differences() -> None:
    text = bench.table(_results(), ["cora", "amazon-photo"], [4, 1])
    lines = text.splitlines()
    assert lines[0].startswith("| dataset | AUC P=1 | AP P=1 | AUC P=4 | AP P=4 |")
    assert "max abs P=4 - P=1" in lines[0]
    cora = lines[2].split(" | ")
    # sample std of 90 and 92: 1.414...
    assert cora[1:5] == ["91.0 ± 1.4", "92.0 ± 1.4", "91.0 ± 1.4", "92.1 ± 1.6"]
    assert cora[5] == "91.0 / 92.0" and cora[6] == "0 / 0.25 |"
    photo = lines[3].split(" | ")
    assert photo[1:5] == ["80.0 ± 0.0", "81.0 ± 0.0", "—", "—"]
    assert photo[5] == "no published row" and photo[6] == "— / — |"
    single = bench.table(_results(), ["cora"], [1]).splitlines()[0]
    assert "max abs" not in single


def test_csv_rows_read_back_into_the_same_table(tmp_path: Path) -> None:
    rows = CSVWriter(tmp_path / "link_gae.csv")
    for (name, p), per_seed in _results().items():
        for seed, scores in per_seed.items():
            rows.write(name, "fullgraph", "wall_time", "s", f"seed{seed}", 3.0, p)
            for key, metric in bench.SCORES:
                rows.write(name, "fullgraph", metric, "%", f"seed{seed}", scores[key] - 5, p)
                rows.write(name, "fullgraph", metric, "%", f"seed{seed}", scores[key], p)
    rows.write("cora", bench.PUBLISHED_SOURCE, "test_auc_mean", "%", "mean", 91.0)
    assert bench.read_csv_results(rows.path) == _results()  # the last row of a seed wins
    assert bench.main(["--table", str(rows.path)]) == 0


def test_the_commands_are_ones_fullgraph_accepts(tmp_path: Path) -> None:
    from fullgraph.cli import build_parser
    from fullgraph.training.config import TrainConfig

    def parsed(cmd: list[str], start: str):
        argv = cmd[cmd.index(start) :]
        return build_parser(argv).parse_args(argv)

    split = parsed(bench.linksplit_command("cora", tmp_path, 1, tmp_path / "s"), "data")
    assert (split.val, split.test, split.neg_ratio, split.seed) == (0.05, 0.1, 1, 1)
    part = parsed(
        bench.partition_command("cora-gae-s1", tmp_path / "s", 4, tmp_path / "p"), "partition"
    )
    assert part.parts == 4 and part.dataset == "cora-gae-s1"
    cmd = bench.train_command(tmp_path / "p", 4, 1, tmp_path / "log.jsonl", 1)
    config = TrainConfig.from_args(parsed(cmd, "train"))
    assert (config.task, config.decoder, config.model) == ("link", "dot", "gcn")
    assert (config.layers, config.hidden, config.embed_dim) == (2, 32, 16)
    assert (config.lr, config.epochs, config.dropout, config.weight_decay) == (0.01, 200, 0, 0)
    assert (config.link_batch, config.neg_ratio, config.seed) == (0, 1, 1)
