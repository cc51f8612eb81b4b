"""The case tables, one per family, in the order the sweep runs them."""

from __future__ import annotations

from ..records import Row
from .bad_files import BAD_FILES
from .bad_outputs import BAD_OUTPUTS
from .bounded_phases import BOUNDED_PHASES
from .clear_errors import CLEAR_ERRORS
from .debris import DEBRIS
from .earlier_results import EARLIER_RESULTS
from .force import FORCE, FORCE_CONTROL
from .inputs_launch import INPUTS_LAUNCH
from .memory import OUT_OF_MEMORY, SIZES
from .minibatch import MINIBATCH
from .model_files import MODEL_FILES
from .pyg_reductions import PYG_REDUCTIONS
from .pyg_scripts import PYG_SCRIPTS
from .silent_values import SILENT_VALUES
from .unclear_lines import UNCLEAR_LINES

#: Every table; the first five are the first sweep, the rest the second (issue 22).
TABLES: list[list[Row]] = [
    EARLIER_RESULTS,
    BAD_FILES,
    BAD_OUTPUTS,
    DEBRIS,
    INPUTS_LAUNCH,
    FORCE,
    BOUNDED_PHASES,
    SIZES,
    OUT_OF_MEMORY,
    CLEAR_ERRORS,
    MINIBATCH,
    PYG_REDUCTIONS,
    PYG_SCRIPTS,
    SILENT_VALUES,
    MODEL_FILES,
    UNCLEAR_LINES,
    FORCE_CONTROL,
]
