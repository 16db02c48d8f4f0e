"""Summary and advice templates: what a report says when the logs did not give a rank, a host or a field."""

from __future__ import annotations

import re

import pytest

from ddpslurm.analyze.report.render import fill
from ddpslurm.analyze.rules.loading import load_signatures

SIGS = load_signatures()
FIELD = re.compile(r"\{(\w+)\}")


def shipped_templates() -> list[tuple[str, str]]:
    """(where, template) for every shipped summary and advice line."""
    out = []
    for cause, info in SIGS.causes.items():
        out += [(f"causes.{cause}.summary", info.summary)] + [(f"causes.{cause}.advice", a) for a in info.advice]
    for sig in SIGS.signatures:
        out += [(f"{sig.id}.summary", sig.summary)] if sig.summary else []
        out += [(f"{sig.id}.advice", a) for a in sig.advice]
    return out


TEMPLATES = shipped_templates()


def test_the_first_alternative_whose_fields_are_known_is_used() -> None:
    template = "[[Rank {rank} on {host}|Rank {rank}|A rank on {host}|A rank]] failed[[ ({signal})]]."
    assert fill(template, {"rank": 3, "host": "n1", "signal": "Killed"}) == "Rank 3 on n1 failed (Killed)."
    assert fill(template, {"rank": 0, "host": None, "signal": ""}) == "Rank 0 failed."
    assert fill(template, {"host": "gpu-0005"}) == "A rank on gpu-0005 failed."
    assert fill(template, {}) == "A rank failed."


def test_a_field_unknown_outside_an_optional_part_still_reads_a_question_mark() -> None:
    """A site's own template without `[[...]]` keeps working; the unknown value shows as `?`, not a traceback."""
    assert fill("Rank {rank} on {host}.", {"rank": 7}) == "Rank 7 on ?."
    assert fill("a stray { brace", {}) == "a stray { brace"


@pytest.mark.parametrize(("where", "template"), TEMPLATES, ids=[w for w, _ in TEMPLATES])
def test_every_shipped_template_reads_well_with_nothing_known(where: str, template: str) -> None:
    """No `?`, no placeholder and no bracket left, and no gap where a part was dropped."""
    text = fill(template, {})
    assert not re.search(r"\?|\{|\}|\[\[|\]\]", text), text
    assert not re.search(r"  | [.,;:)]|\( | \(\)", text), text


@pytest.mark.parametrize(("where", "template"), TEMPLATES, ids=[w for w, _ in TEMPLATES])
def test_every_shipped_template_uses_every_field_it_names_when_known(where: str, template: str) -> None:
    fields = set(FIELD.findall(template))
    text = fill(template, {name: f"<{name}>" for name in fields})
    assert not re.search(r"\?|\[\[|\]\]", text), text
    assert all(f"<{name}>" in text for name in fields), text
