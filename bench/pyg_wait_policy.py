"""``python -m bench.pyg_wait_policy``: a ``fullgraph.pyg`` script's OpenMP wait policy.

GNU OpenMP reads ``OMP_WAIT_POLICY`` once, when ``import torch`` loads it: a script cannot set
it afterwards (``fullgraph.pyg.process``). ``fullgraph.pyg`` sets it when it is imported first;
a script that imports torch first gets one line on rank 0 instead. This times one process
(torch's default threads: all cores) training PyG's ``GCN`` converted by ``fullgraph.pyg`` on a
synthetic graph, the three ways a script can start, with ``--busy N`` busy loops beside it (a
loaded machine), rounds interleaved:

- ``import torch`` first, ``OMP_WAIT_POLICY`` unset: OpenMP's threads spin between operators
  (what every ``fullgraph.pyg`` script did before);
- ``from fullgraph import pyg`` first, unset: ``fullgraph.pyg`` sets ``PASSIVE``;
- ``import torch`` first, ``OMP_WAIT_POLICY=PASSIVE`` in the environment (the line's fix).

Prints the median epoch (ms) of every configuration and round.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import median

#: The script: ``{first}`` is its first import; prints the median epoch in ms.
SCRIPT = """\
{first}
import time
import torch
import torch.nn.functional as F
from torch_geometric.nn.models import GCN
from fullgraph import pyg
from fullgraph.datasets.synthetic import generate

graph = generate("tiny", num_nodes={nodes}, num_edges={edges}, num_features=64)
data = pyg.load_part(graph)
model = pyg.distribute(GCN(data.num_features, 64, 2, data.num_classes), data)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
times = []
for epoch in range({epochs}):
    t = time.perf_counter()
    opt.zero_grad()
    loss = pyg.loss(model(data.x, data.edge_index), data)
    loss.backward()
    opt.step()
    times.append(time.perf_counter() - t)
times.sort()
print(1000 * times[len(times) // 2])
"""

#: (name, first import, extra environment) of every configuration.
CONFIGS: list[tuple[str, str, dict[str, str]]] = [
    ("import torch first, policy unset", "import torch", {}),
    ("import fullgraph.pyg first, policy unset", "from fullgraph import pyg", {}),
    ("import torch first, OMP_WAIT_POLICY=PASSIVE", "import torch", {"OMP_WAIT_POLICY": "PASSIVE"}),
]


def main(argv: list[str] | None = None) -> int:
    """Run the configurations ``--rounds`` times, interleaved; print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--busy", type=int, default=1, help="busy loops beside (default 1)")
    p.add_argument("--nodes", type=int, default=20000)
    p.add_argument("--edges", type=int, default=400000)
    p.add_argument("--epochs", type=int, default=30)
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="fg-wait-policy-"))
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
    times: dict[str, list[float]] = {}
    try:
        for _ in range(a.rounds):
            for name, first, extra in CONFIGS:
                script = work / "script.py"
                script.write_text(
                    SCRIPT.format(first=first, nodes=a.nodes, edges=a.edges, epochs=a.epochs)
                )
                out = subprocess.run(
                    [sys.executable, str(script)],
                    env={**env, **extra},
                    capture_output=True,
                    text=True,
                    timeout=1800,
                    check=True,
                )
                times.setdefault(name, []).append(float(out.stdout.split()[-1]))
                noted = "OMP_WAIT_POLICY is not set" in out.stderr
                times.setdefault(f"{name}: line printed", []).append(float(noted))
    finally:
        for proc in busy:
            proc.kill()
    print(f"{os.cpu_count()} cores, {a.busy} busy loop(s); median epoch (ms), {a.rounds} rounds")
    print("| configuration | median over rounds | every round | wait-policy line |")
    print("|---|---|---|---|")
    for name, _, _ in CONFIGS:
        values, noted = times[name], times[f"{name}: line printed"]
        shown = ", ".join(f"{v:.0f}" for v in values)
        print(f"| {name} | {median(values):.0f} | {shown} | {'yes' if all(noted) else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
