"""normkit.conformance: `python -m normkit check`, the ATen-contract conformance checker.

Modules: `cases` (the case library), `rules` (tolerances and judgements), `backends` (what is
checked: torch, normkit, or any module with aten-named functions), `runner` (runs cases against the
float64 oracle, normkit.reference), `report` (progress, tables, JSON), `cli` (the command).
"""

from normkit.conformance.cli import main  # noqa: F401
