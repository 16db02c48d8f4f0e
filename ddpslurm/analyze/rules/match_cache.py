"""What a SignatureSet keeps so that matching a line stays cheap: its literal index and its memos per line shape.

In: the set's signatures (priority order), indexed once, at the first line matched; and what matching and the
scanner learn line by line. Out: for a line's text, the signatures its prefilter literals let through
(`candidates`) and whether a signature may match a line of its shape (`may_match_shape`); per line shape (digits
and hex runs as 0, `digit_shape.line_shape`), the plan the blind signatures made (`plans`), the lines the scanner
found say nothing (`inert_lines`) and those it can replay from spans (`line_recipes`). Every memo is per process
and bounded (signatures.remember).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ddpslurm.analyze.rules.digit_shape import digit_gated, shape
from ddpslurm.analyze.rules.hex_runs import literal_run_blind
from ddpslurm.analyze.rules.literals import LiteralsIn, derive_any_literal


class Indexed(Protocol):
    """What the index reads of a signature (signatures.Signature)."""

    @property
    def kind(self) -> str: ...
    @property
    def pattern_text(self) -> str: ...
    @property
    def prefilter(self) -> tuple[str, ...]: ...
    @property
    def source(self) -> str: ...


@dataclass(frozen=True)
class ShapePlan:
    """For one line shape: the digit-sensitive signatures its digit-free literals let through (priority order),
    and the first digit-blind signature that matches it (None: none matches)."""

    sensitive: tuple[int, ...]
    first_blind: int | None


@dataclass
class MatchCaches:
    """A SignatureSet's literal index (derived from its signatures by `index`) and its memos per line shape."""

    #: prefilter literal -> indexes of the signatures it gates; the signatures gated by no literal
    by_literal: dict[str, list[int]] = field(default_factory=dict)
    no_literal: set[int] = field(default_factory=set)
    literals_in: LiteralsIn | None = None  # over `by_literal`'s keys
    #: signature index -> literals every match of its regex holds one of (derive_any_literal), where the prefilter
    #: literals that let a line through do not already tell
    required: dict[int, tuple[str, ...]] = field(default_factory=dict)
    #: of those, the shapes (digits as 0) of their literals that have a digit (another line of a shape may hold one)
    required_digits: dict[int, tuple[str, ...]] = field(default_factory=dict)
    #: the signatures of which such a literal may sit inside a hex run (hex_runs.literal_run_blind)
    required_in_runs: set[int] = field(default_factory=set)
    #: indexes of the shipped signatures (tested: untimed on short lines)
    shipped: set[int] = field(default_factory=set)
    #: whether a signature is not digit-blind (digit_shape), by index, as far as asked (`SignatureSet._sensitive`);
    #: the signatures gated by prefilter literals holding digits, and those literals
    sensitivity: dict[int, bool] = field(default_factory=dict)
    digit_gated: dict[int, tuple[str, ...]] = field(default_factory=dict)
    digit_literals: set[str] = field(default_factory=set)
    digit_literal_shapes: set[str] = field(default_factory=set)  # those of `digit_gated`, shaped
    #: whether a signature is not run-blind (hex_runs), by index, as far as asked; the signatures gated by prefilter
    #: literals that may sit inside a hex run, and those literals
    run_sensitivity: dict[int, bool] = field(default_factory=dict)
    run_gated: dict[int, tuple[str, ...]] = field(default_factory=dict)
    run_literals: set[str] = field(default_factory=set)
    #: signature id -> its position (`SignatureSet.index_of`, asked for every line read in full: no scan of the list)
    positions: dict[str, int] = field(default_factory=dict)
    #: line shape -> what the digit-blind signatures decide for it (at most signatures.MAX_PLANS)
    plans: dict[Any, ShapePlan] = field(default_factory=dict)
    #: shapes (digits as 0) of raw lines the scanner found can say nothing with these signatures unless one of a few
    #: digit-sensitive ones matches: the offset of their text after the prefixes, and those signatures (scan.py
    #: `_FileState.note_inert`; at most scan.MAX_INERT)
    inert_lines: dict[Any, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    #: shapes of raw lines whose whole reading the scanner can replay from spans (scan.py `LineRecipe`; at most
    #: scan.MAX_RECIPES)
    line_recipes: dict[Any, Any] = field(default_factory=dict)

    def index(self, signatures: Sequence[Indexed], shipped: str, unmatched: Collection[str]) -> None:
        """literal -> indexes of the signatures it gates (signatures are ordered by priority); the literals each
        signature's every match must hold one of, where they can be told; which signatures are the shipped ones
        (their source is under the folder `shipped`); the literals that hold digits and the signatures they gate
        (which signatures are not digit-blind is asked per signature). Signatures of the kinds `unmatched` are
        never matched against a line: left out."""
        for i, sig in enumerate(signatures):
            if sig.kind in unmatched:
                continue
            required = derive_any_literal(sig.pattern_text) or ()
            if required and not all(any(lit in gate for lit in required) for gate in sig.prefilter):
                self.required[i] = required  # (a prefilter literal that holds one of them tells it already)
                shaped = tuple(shape(lit) for lit in required if digit_gated(lit))
                if shaped:
                    self.required_digits[i] = shaped
                if not all(literal_run_blind(lit) for lit in required):
                    self.required_in_runs.add(i)
            if sig.source.startswith(shipped):
                self.shipped.add(i)
            if not sig.prefilter:
                self.no_literal.add(i)
            for lit in sig.prefilter:
                self.by_literal.setdefault(lit, []).append(i)
            digit_literals = tuple(lit for lit in sig.prefilter if digit_gated(lit))
            if digit_literals:  # (gated by digits: digit-sensitive, whatever its regex)
                self.digit_gated[i] = digit_literals
            run_literals = tuple(lit for lit in sig.prefilter if not literal_run_blind(lit))
            if run_literals:  # (and by what a hex run may hold: run-sensitive)
                self.run_gated[i] = run_literals
        self.digit_literals = {lit for lit in self.by_literal if digit_gated(lit)}
        self.run_literals = {lit for lits in self.run_gated.values() for lit in lits}
        self.digit_literal_shapes = {shape(lit) for lits in self.digit_gated.values() for lit in lits}
        self.literals_in = LiteralsIn(list(self.by_literal))

    def candidates(self, text: str, runs: bool = False) -> tuple[list[int], set[int]]:
        """The signatures `text`'s literals let through, in priority order, and those let through by a literal
        that every line of its shape holds alike (no digit; where it has hex runs, none a run may hold too), or by
        none. Only once indexed."""
        by_literal, no_literal = self.by_literal, self.no_literal
        found = self.literals_in(text)
        hits = {i for lit in found for i in by_literal[lit]}
        unlike = self.digit_literals | self.run_literals if runs else self.digit_literals
        clean = {i for lit in found if lit not in unlike for i in by_literal[lit]}
        return sorted(hits | no_literal), clean | no_literal

    def may_match_shape(self, i: int, text: str, masked: str, runs: bool = False) -> bool:
        """Whether signature i may match some line of `text`'s shape (`masked`: digits and hex runs as 0): not when
        none of the literals its matches hold one of can be in such a line (a literal without digits is in a line
        where it is in its shape; one with digits, where its shape is; one a hex run may hold, in any line with
        runs), so a plan does not keep it to run again on every line of that shape."""
        required = self.required.get(i)
        if required is None or any(lit in text for lit in required) or (runs and i in self.required_in_runs):
            return True
        return any(lit in masked for lit in self.required_digits.get(i, ()))
