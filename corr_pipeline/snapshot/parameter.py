"""One snapshot parameter, declared once as a field of
:class:`~corr_pipeline.snapshot.params.SnapshotParameters`: the field gives its name, type and
default, :func:`parameter` adds its help, its range and the steps that read it. Everything else
is read from these declarations (:func:`parameters_of`): the record's JSON values in
``snapshots.params`` (:meth:`Parameter.plain`), the check of each field at run start
(:meth:`Parameter.problem`), each step's own record of them (:class:`StepRecord`), the
launchpad's fields (:class:`corr_pipeline.defs.resources.SnapshotParams`, pinned to the
declarations by a test) and the docs' parameter table (:func:`markdown_table`, in
docs/user_guide.md §6, checked by a test).

The record's own fields are the declaration, rather than a separate table the record would be
built from, because mypy needs the field names written out: this way each parameter is still one
statement.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar, cast, overload

__all__ = [
    "Parameter",
    "StepRecord",
    "markdown_table",
    "parameter",
    "parameters_of",
    "step_fields",
]

T = TypeVar("T")

#: The key of a declaration in its dataclass field's metadata.
_DECLARATION = "corr_pipeline.snapshot.parameter"


@dataclass(frozen=True)
class Parameter:
    """One parameter: its field's ``name``, ``kind`` (``int``, ``float``, ``str`` or ``bool``),
    ``optional`` (None allowed: no value, never checked) and ``default``; ``help``: what it
    sets, for the launchpad and the docs; ``steps``: the steps whose own record
    (:mod:`corr_pipeline.snapshot.params`) holds it.

    The range of a number: ``low`` (``low_open``: excluded) and ``high`` (included), and
    ``finite``: NaN and infinities refused; of a text: ``choices``, or ``pattern`` (a regular
    expression the whole text matches) which ``allows`` says in words. A refused text is never
    repeated in its message (a text may be anything, a secret included, and the message reaches
    the run's event log). ``note`` ends the message.

    ``recorded``: in ``snapshots.params`` (and a bundle's parameters); ``neutral``: the results
    do not depend on it (bit-identical whatever its value; not compared when deciding whether a
    published session is current, not recorded in a bundle); ``launchpad``: set in run config
    (False: deployment configuration, from the environment).
    """

    name: str
    kind: type
    optional: bool
    default: Any
    help: str
    steps: tuple[str, ...] = ()
    low: float | None = None
    low_open: bool = False
    high: float | None = None
    finite: bool = False
    choices: tuple[str, ...] = ()
    pattern: str = ""
    allows: str = ""
    note: str = ""
    recorded: bool = True
    neutral: bool = False
    launchpad: bool = True

    def plain(self, value: Any) -> Any:
        """``value`` as a plain JSON value of the parameter's kind (None stays None)."""
        return None if value is None else self.kind(value)

    def field_in(self, step: str) -> str:
        """Its field's name in ``step``'s record: its name less the prefix ``<step>_``."""
        return self.name.removeprefix(f"{step}_")

    @property
    def allowed(self) -> str:
        """The values it takes, in words (empty when any value of its kind will do)."""
        if self.choices:
            return ", ".join(self.choices)
        if self.pattern:
            return self.allows
        if self.kind is bool:
            return "true, false"
        return "" if self.kind is str else self._range

    @property
    def _range(self) -> str:
        low, high = _number(self.low), _number(self.high)
        if self.low is None and self.high is None:
            return "finite" if self.finite else ""
        if self.high is None:
            sign = ">" if self.low_open else ">="
            return f"a finite number {sign} {low}" if self.finite else f"{sign} {low}"
        if self.low is None:
            return f"<= {high}"
        return f"({low}, {high}]" if self.low_open else f"{low} .. {high}"

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value``, in one line starting with the name; None if nothing."""
        if value is None and self.optional:
            return None
        if self.choices or self.pattern:
            if value in self.choices or (
                self.pattern and re.fullmatch(self.pattern, str(value)) is not None
            ):
                return None
            return f"{self.name} must be {self._text_rule} (the value given is not repeated)"
        if self.kind in (bool, str):
            return None
        low_ok = self.low is None or (value > self.low if self.low_open else not value < self.low)
        high_ok = self.high is None or value <= self.high
        if low_ok and high_ok and (not self.finite or math.isfinite(value)):
            return None
        note = f"; {self.note}" if self.note else ""
        return f"{self.name} must {self._number_rule} (got {value}){note}"

    @property
    def _text_rule(self) -> str:
        return f"one of {', '.join(self.choices)}" if self.choices else self.allows

    @property
    def _number_rule(self) -> str:
        allowed = self._range
        if allowed == "finite":
            return "be finite"
        if allowed.startswith("("):
            return f"lie in {allowed}"
        return f"be in {allowed}" if " .. " in allowed else f"be {allowed}"

    @property
    def shown_default(self) -> str:
        """The default as the docs' table shows it (YAML: ``null``, ``false``)."""
        value = self.default
        if value is None:
            return "`null`"
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, str):
            return f"`{value}`"
        return _number(value)


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:g}"


def parameter(
    default: T,
    help: str,
    **rules: Any,
) -> T:
    """The declaration of one parameter as a dataclass field: ``default``, ``help`` and the
    :class:`Parameter` attributes in ``rules`` (keywords). Typed as its default, as a field's
    default is, so that the record's field keeps its type."""
    declared = {"help": help, **rules}
    unknown = set(declared) - {f.name for f in dataclasses.fields(Parameter)}
    if unknown:
        raise TypeError(f"not a parameter attribute: {', '.join(sorted(unknown))}")
    return cast("T", dataclasses.field(default=default, metadata={_DECLARATION: declared}))


def parameters_of(record: type) -> tuple[Parameter, ...]:
    """The :class:`Parameter` of each field of the dataclass ``record``, in its order."""
    hints = typing.get_type_hints(record)
    found = []
    for field in dataclasses.fields(record):
        kinds = typing.get_args(hints[field.name]) if _is_union(hints[field.name]) else ()
        kind = next((k for k in kinds if k is not type(None)), hints[field.name])
        found.append(
            Parameter(
                name=field.name,
                kind=kind,
                optional=type(None) in kinds,
                default=field.default,
                **field.metadata[_DECLARATION],
            )
        )
    return tuple(found)


def _is_union(hint: Any) -> bool:
    return isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union


def step_fields(parameters: Iterable[Parameter], step: str) -> dict[str, Parameter]:
    """``{field of step's record: parameter}`` of the ``parameters`` declared for ``step``."""
    return {p.field_in(step): p for p in parameters if step in p.steps}


class _OfStep(Protocol):
    STEP: ClassVar[str]


Record = TypeVar("Record", bound=_OfStep)


class StepRecord(Generic[Record]):
    """An attribute of a parameters record (``params.lead_lag``) that is one step's own record
    of it: a ``record`` (a dataclass whose ``STEP`` names the step) of the parameters declared
    for that step, each field named as :meth:`Parameter.field_in` says."""

    def __init__(self, record: type[Record]) -> None:
        self.record = record
        self._fields: dict[str, Parameter] | None = None  # read on first use

    @overload
    def __get__(self, params: None, owner: type) -> StepRecord[Record]: ...
    @overload
    def __get__(self, params: object, owner: type) -> Record: ...
    def __get__(self, params: object, owner: type) -> StepRecord[Record] | Record:
        if params is None:
            return self
        if self._fields is None:
            self._fields = step_fields(parameters_of(owner), self.record.STEP)
        fields = self._fields.items()
        return self.record(**{field: getattr(params, p.name) for field, p in fields})


def markdown_table(parameters: Iterable[Parameter]) -> str:
    """The docs' table of the launchpad's parameters: field, default, allowed values, meaning
    (a ``|`` of the help escaped)."""
    lines = ["| field | default | allowed | meaning |", "|---|---|---|---|"]
    for p in parameters:
        if p.launchpad:
            cells = (f"`{p.name}`", p.shown_default, p.allowed, p.help)
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"
