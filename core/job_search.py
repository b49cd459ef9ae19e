"""The job list's search language: filters `path op value` and sort keys over a job's
summary columns, its times, and any path in its spec or summary (JSON).

    best_test_error<0.08    model.options.unit=full_preact    recipe.lr>=0.1
    summary.best_train_error<0.05    dataset.name~cifar    created_at>=2026-11-01
    data_digest=sha256:3f2a...    data_digest=3f2a9c01

`data_digest` is the digest of the data a job read (its row's column, set once its data is
loaded): `=` or `!=` with the whole `sha256:<64 hex>`, the hex alone, or its first 8 or
more hex digits (a prefix match).

A bare path is in the spec (`spec.` may prefix it); `summary.` reads the summary JSON.
Comparisons are typed: a number compares with numbers only, a string with strings, and
`true`, `false`, `null` with themselves ("0.1" in quotes is a string). Portable between
Postgres (json operators) and SQLite (json_extract); a value of another type never errs,
it does not match. On Postgres `path=value` on the spec is jsonb containment, which a GIN
index answers (migration 0008).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, case, cast, false, func, not_
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import InstrumentedAttribute

from core.db.tables import Job

# The job's own columns a filter or a sort may name, by what they hold.
NUMBER_COLUMNS: dict[str, InstrumentedAttribute[Any]] = {
    "final_test_error": Job.final_test_error,
    "best_test_error": Job.best_test_error,
    "params": Job.params,
    "macs": Job.macs,
    "wall_time_s": Job.wall_time_s,
    "images_per_s": Job.images_per_s,
    "depth": Job.depth,
}
TIME_COLUMNS: dict[str, InstrumentedAttribute[Any]] = {
    "created_at": Job.created_at,
    "started_at": Job.started_at,
    "finished_at": Job.finished_at,
}
# The digest of the data a job read ("sha256:<64 hex>"): matched whole, or by its start.
TEXT_COLUMNS: dict[str, InstrumentedAttribute[Any]] = {"data_digest": Job.data_digest}
DIGEST_PREFIX = "sha256:"
MIN_DIGEST_HEX = 8  # the shortest start of a digest a filter may give
_DIGEST = re.compile(rf"[0-9a-f]{{{MIN_DIGEST_HEX},64}}")
DOCUMENTS: dict[str, InstrumentedAttribute[Any]] = {"spec": Job.spec, "summary": Job.summary}
SORT_ALIASES = {"created": "created_at", "finished": "finished_at"}
OPS = ("=", "!=", "<", "<=", ">", ">=", "~")
MAX_DEPTH = 8  # path segments
MAX_VALUE = 200  # characters

_EXPRESSION = re.compile(r"\s*([A-Za-z0-9_.]+)\s*(<=|>=|!=|=|<|>|~)\s*(.*?)\s*", re.DOTALL)
_SEGMENT = re.compile(r"[a-z0-9_]+")
_NUMBER = re.compile(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
SYNTAX = (
    "a filter is `path op value`: path is dotted lowercase names (best_test_error, "
    "model.options.unit, recipe.lr, summary.best_train_error, created_at, data_digest), op one of "
    f"{' '.join(OPS)}, e.g. best_test_error<0.08"
)
SORTS = (
    "a sort is created, finished, a summary column (best_test_error, final_test_error, "
    "params, macs, wall_time_s, images_per_s, depth), summary.<key> or a dotted spec path "
    "(recipe.lr); prefix - for descending"
)

Value = str | float | bool | datetime | None


@dataclass(frozen=True)
class Field:
    """Where a value lives: a column of the job, or a path in its spec or summary JSON."""

    name: str
    column: str | None = None
    document: str | None = None
    path: tuple[str, ...] = ()

    @property
    def is_time(self) -> bool:
        """Whether it holds times (the column kind compared with ISO times)."""
        return self.column in TIME_COLUMNS

    def read(self, job: Job) -> Any:
        """This field's value in a loaded job row (None when it is not there)."""
        if self.column is not None:
            return getattr(job, self.column)
        value: Any = getattr(job, self.document or "spec")
        for segment in self.path:
            if isinstance(value, dict):
                value = value.get(segment)
            elif isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
                value = value[int(segment)]
            else:
                return None
        return value


@dataclass(frozen=True)
class Condition:
    """One filter: a field, a comparison and a typed value."""

    field: Field
    op: str
    value: Value


@dataclass(frozen=True)
class SortKey:
    """A sort: a field (nulls last) and its direction; ties go by id the same way."""

    name: str
    field: Field
    descending: bool


def parse_field(name: str) -> Field:
    """The field a dotted name means; ValueError when it is not one."""
    segments = name.split(".")
    if not all(_SEGMENT.fullmatch(segment) for segment in segments):
        raise ValueError(f"{name!r}: a path is dotted lowercase names [a-z0-9_]")
    if len(segments) > MAX_DEPTH:
        raise ValueError(f"{name!r}: a path is at most {MAX_DEPTH} names deep")
    if len(segments) == 1 and name in NUMBER_COLUMNS | TIME_COLUMNS | TEXT_COLUMNS:
        return Field(name, column=name)
    document = segments[0] if segments[0] in DOCUMENTS else "spec"
    path = tuple(segments[1:] if segments[0] in DOCUMENTS else segments)
    if not path:
        raise ValueError(f"{name!r}: name a key inside it, e.g. {name}.lr")
    return Field(name, document=document, path=path)


def parse_filter(text: str) -> Condition:
    """A filter expression as a condition; ValueError, naming it, when it is not one."""
    found = None if "\x00" in text else _EXPRESSION.fullmatch(text)
    if found is None:
        raise ValueError(f"filter {text!r} is not one: {SYNTAX}")
    name, op, raw = found.groups()
    try:
        field = parse_field(name)
        value = _typed(field, op, raw)
    except ValueError as error:
        raise ValueError(f"filter {text!r}: {error}") from None
    return Condition(field, op, value)


def _typed(field: Field, op: str, raw: str) -> Value:
    """The value of a comparison, typed by how it is written and what the field holds."""
    if not raw:
        raise ValueError('the value is missing (write "" for an empty string)')
    if raw[0] in "<>=!~":
        raise ValueError(f"the value {raw!r} starts with an operator; quote it if it is text")
    if len(raw) > MAX_VALUE:
        raise ValueError(f"the value is longer than {MAX_VALUE} characters")
    if field.column in TEXT_COLUMNS:
        return _digest(field.name, op, raw)
    value = raw if op == "~" else _literal(raw)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"the number {raw} is out of range")
    if op in ("<", "<=", ">", ">=") and (value is None or isinstance(value, bool)):
        raise ValueError(f"{op} compares numbers, strings or times, not {raw}")
    if field.column is None:
        return value
    if op == "~":
        raise ValueError(f"{field.name} is a column of numbers or times; ~ is for text")
    if value is None and op in ("=", "!="):
        return None
    if field.is_time:
        return _time(field.name, value)
    if not isinstance(value, float):
        raise ValueError(f"{field.name} is a number: compare it with one, e.g. {field.name}<0.1")
    return value


def _digest(name: str, op: str, raw: str) -> str | None:
    """A digest to match: `sha256:<hex>` or the hex alone, whole or its first 8+ digits."""
    if op not in ("=", "!="):
        raise ValueError(f"{name} is a digest: match it with = or !=")
    text = raw[1:-1] if len(raw) >= 2 and raw[0] == raw[-1] == '"' else raw
    if text == "null":
        return None
    hexdigits = text.strip().lower().removeprefix(DIGEST_PREFIX)
    if not _DIGEST.fullmatch(hexdigits):
        raise ValueError(
            f"{name} is {DIGEST_PREFIX}<64 hex digits>, or the hex alone, whole or its first "
            f"{MIN_DIGEST_HEX} or more, e.g. {name}=3f2a9c01"
        )
    return DIGEST_PREFIX + hexdigits


def _literal(raw: str) -> str | float | bool | None:
    """A written value: "quoted" text, true, false, null, a number, else text."""
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        return raw[1:-1]
    if raw in ("true", "false"):
        return raw == "true"
    if raw == "null":
        return None
    return float(raw) if _NUMBER.fullmatch(raw) else raw


def _time(name: str, value: Any) -> datetime:
    """An ISO date or time (UTC unless it says otherwise)."""
    try:
        moment = datetime.fromisoformat(str(value))
        return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)
    except (ValueError, OverflowError):
        raise ValueError(f"{name} is a time: compare it with an ISO one, e.g. 2026-11-01") from None


def parse_sort(text: str) -> SortKey:
    """A sort name (`-` for descending) as a sort key; ValueError when it is not one."""
    name = text.removeprefix("-")
    name = SORT_ALIASES.get(name, name)
    try:
        field = parse_field(name)
    except ValueError as error:
        raise ValueError(f"sort {text!r}: {error}; {SORTS}") from None
    if field.column is None and field.document == "spec" and "." not in name:
        raise ValueError(f"sort {text!r} is not one: {SORTS}")
    if field.column in TEXT_COLUMNS:
        raise ValueError(f"sort {text!r}: {name} is a digest, not an order; {SORTS}")
    return SortKey(text, field, text.startswith("-"))


def sort_expression(field: Field, dialect: str) -> ColumnElement[Any]:
    """What a sort orders by: the column, or the path's value where it is a number."""
    if field.column is not None:
        columns = NUMBER_COLUMNS | TIME_COLUMNS | TEXT_COLUMNS
        return columns[field.column].expression
    return _number(field, dialect)


def condition(where: Condition, dialect: str) -> ColumnElement[bool]:
    """The WHERE clause of a filter."""
    field, op, value = where.field, where.op, where.value
    if value is None:
        stored = sort_expression(field, dialect) if field.column else _text(field, dialect)
        present = stored.is_not(None)
        return present if op == "!=" else not_(present)
    if op == "!=":  # also true where the field is missing or of another type
        return not_(func.coalesce(_compare(field, "=", value, dialect), false()))
    return _compare(field, op, value, dialect)


def _compare(field: Field, op: str, value: Value, dialect: str) -> ColumnElement[bool]:
    """field op value, typed: NULL (no match) where the field holds another type."""
    if field.column in TEXT_COLUMNS:
        column = TEXT_COLUMNS[field.column]
        digest = str(value)
        # A whole digest is an index lookup; a start of one, a prefix (LIKE 'sha256:3f2a%').
        whole = len(digest) == len(DIGEST_PREFIX) + 64
        return column == digest if whole else column.startswith(digest)
    if op == "=" and dialect == "postgresql" and _containable(field, value):
        return _contains(field, value)
    if field.column is not None:
        left: ColumnElement[Any] = sort_expression(field, dialect)
    elif isinstance(value, bool):
        return _boolean(field, value, dialect)
    elif isinstance(value, float):
        left = _number(field, dialect)
    else:
        left = _text(field, dialect, typed=True)
    if op == "~":
        return left.ilike(f"%{escape_like(str(value))}%", escape="\\")
    compare = {
        "=": left.__eq__,
        "<": left.__lt__,
        "<=": left.__le__,
        ">": left.__gt__,
        ">=": left.__ge__,
    }
    return compare[op](value)


def _containable(field: Field, value: Value) -> bool:
    """Whether jsonb containment tells field = value (no array index on the path)."""
    return field.document == "spec" and not any(segment.isdigit() for segment in field.path)


def _contains(field: Field, value: Value) -> ColumnElement[bool]:
    """spec::jsonb @> {"a": {"b": value}}: a typed equality that the spec's GIN index
    (migration 0008) answers, and whose selectivity Postgres knows."""
    nested: Any = value
    for segment in reversed(field.path):
        nested = {segment: nested}
    return cast(DOCUMENTS["spec"], JSONB).contains(nested)


def escape_like(text: str) -> str:
    """`text` with LIKE's wildcards (and the escape character) escaped by a backslash."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


# A JSON value's type as each database names it.
_TYPES: dict[str, dict[str, tuple[str, ...]]] = {
    "postgresql": {"number": ("number",), "string": ("string",), "boolean": ("boolean",)},
    "sqlite": {"number": ("integer", "real"), "string": ("text",), "boolean": ("true", "false")},
}


def _json_type(field: Field, dialect: str) -> ColumnElement[str]:
    """The type name of the JSON value at the field's path (NULL where there is none)."""
    document = DOCUMENTS[field.document or "spec"]
    if dialect == "postgresql":  # the spec is json there, the summary jsonb (migration 0008)
        typeof = func.jsonb_typeof if field.document == "summary" else func.json_typeof
        return typeof(document[field.path])
    return func.json_type(document, _sqlite_path(field.path))


def _sqlite_path(path: tuple[str, ...]) -> str:
    return "$" + "".join(f"[{s}]" if s.isdigit() else f'."{s}"' for s in path)


def _is(field: Field, kind: str, dialect: str) -> ColumnElement[bool]:
    names = _TYPES.get(dialect, _TYPES["sqlite"])[kind]
    return _json_type(field, dialect).in_(names)


def _number(field: Field, dialect: str) -> ColumnElement[float]:
    """The path's value where it is a number, else NULL (so a string never fails a cast)."""
    document = DOCUMENTS[field.document or "spec"]
    return case((_is(field, "number", dialect), document[field.path].as_float()))


def _text(field: Field, dialect: str, *, typed: bool = False) -> ColumnElement[str]:
    """The path's value as text; with `typed`, only where it is a string."""
    text = DOCUMENTS[field.document or "spec"][field.path].as_string()
    return case((_is(field, "string", dialect), text)) if typed else text


def _boolean(field: Field, value: bool, dialect: str) -> ColumnElement[bool]:
    if dialect == "postgresql":
        text = DOCUMENTS[field.document or "spec"][field.path].as_string()
        return and_(_is(field, "boolean", dialect), text == ("true" if value else "false"))
    return _json_type(field, dialect) == ("true" if value else "false")
