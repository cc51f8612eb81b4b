"""``fullgraph --help`` and the subcommands' usage lines say what the commands take."""

from __future__ import annotations

import pytest

from fullgraph.cli import main, summary
from fullgraph.models.layers import layer_kinds


def test_train_summary_names_every_layer_kind() -> None:
    """The summary ``fullgraph --help`` lists for ``train`` names each ``--model`` kind."""
    text = summary("train")
    missing = [kind for kind in layer_kinds() if kind not in text]
    assert not missing, (missing, text)


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ("export", ["--model FILE [--to TARGET]"]),
        ("predict", ["--model FILE --out DIR"]),
    ],
)
def test_required_options_are_shown_required(
    command: str, shown: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A required option stands without brackets in the usage line; an optional one in them."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    usage = " ".join(capsys.readouterr().out.split("\n\n")[0].split())
    for text in shown:
        assert text in usage, (text, usage)


def test_a_missing_required_option_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """``fullgraph export OUT`` without ``--model``: one line, exit status 2."""
    with pytest.raises(SystemExit) as exc:
        main(["export", "out.py"])
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "required: --model" in lines[0], lines


def test_export_target_defaults_to_pyg() -> None:
    """``--to`` has one value, so it need not be given."""
    from fullgraph.commands.export import ExportOptions

    opts = ExportOptions(model="m.pt", out="o.py")
    assert opts.to == "pyg"
