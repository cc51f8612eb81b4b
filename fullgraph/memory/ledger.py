"""The memory model's ledger (:mod:`fullgraph.memory.model`): live buffers by name, term and
size, and the largest total with its terms; the byte sizes the replays count in."""

from __future__ import annotations

from dataclasses import dataclass, field

F32, I64, I32 = 4, 8, 4
BF16, F64 = 2, 8
#: Terms in the order they are printed, with their labels.
TERMS = {
    "structure": "graph structure",
    "features": "features",
    "saved": "saved activations",
    "working": "layer temporaries",
    "halo": "halo buffers in flight",
    "optimizer": "gradients + optimiser state",
    "compression": "compression residuals",
    "floor": "process floor",
}


#: The phases of the step that are not one layer's (a phase ``forward, layer 3`` is): their
#: totals grow linearly with the depth (the loss's phase holds every saved activation), which
#: :func:`fullgraph.memory.model.predict_quickly` extends to deeper models.
WHOLE_MODEL_PHASES = ("setup", "forward, input dropout", "loss", "gradient all-reduce")


@dataclass
class Ledger:
    """Live buffers (name -> term, bytes); keeps the largest total and its terms.

    The totals are kept as buffers come and go, so that a step costs the same at any depth (a
    replay of ``--layers 100000`` is linear in the layers, not quadratic)."""

    floor: int
    live: dict[str, tuple[str, int]] = field(default_factory=dict)
    phase: str = "setup"
    peak: int = -1
    peak_terms: dict[str, int] = field(default_factory=dict)
    peak_phase: str = ""
    #: bytes of the live buffers of every term (the floor included)
    terms: dict[str, int] = field(default_factory=dict)
    #: the largest total (and its terms) in each phase of :data:`WHOLE_MODEL_PHASES`
    phase_peaks: dict[str, tuple[int, dict[str, int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.terms = dict.fromkeys(TERMS, 0)
        self.terms["floor"] = self.floor

    def add(self, name: str, term: str, nbytes: float) -> None:
        """A buffer is created (its name must not be live)."""
        assert term in TERMS and name not in self.live, name
        self.live[name] = (term, int(nbytes))
        self.terms[term] += int(nbytes)
        self._check()

    def drop(self, *names: str) -> None:
        """Buffers are released (names not live are ignored)."""
        for name in names:
            if name in self.live:
                t, b = self.live.pop(name)
                self.terms[t] -= b

    def rename(self, old: str, new: str, term: str | None = None) -> None:
        """A buffer changes role (an in-place operation): same bytes, maybe another term."""
        t, b = self.live.pop(old)
        self.live[new] = (term or t, b)
        self.terms[t] -= b
        self.terms[term or t] += b

    def _check(self) -> None:
        total = sum(self.terms.values())
        if self.phase in WHOLE_MODEL_PHASES and total > self.phase_peaks.get(self.phase, (-1,))[0]:
            self.phase_peaks[self.phase] = (total, dict(self.terms))
        if total > self.peak:
            self.peak, self.peak_terms, self.peak_phase = total, dict(self.terms), self.phase
