"""Turning problems with an object into ``Cause``s a person can act on.

Design decisions:

* Field paths read the way Kubernetes prints them: dotted names, ``[i]`` for list indexes and
  ``[key]`` for map keys that are not plain identifiers (``metadata.labels[app.kubernetes.io/name]``).
  ``format_path`` is the only place that spells a path.
* Pydantic's errors are rewritten, not passed through: ``missing`` becomes "required field is
  missing", ``extra_forbidden`` becomes ``unknown field "foo"`` (with a did-you-mean from the
  model's own fields), and every message says what it got. The per-member errors pydantic emits
  for a union (``cpu.str``, ``cpu.float``...) are folded into one "expected a string or a number".
* YAML 1.1 traps are named as such. A string field holding a boolean or a number is almost always
  an unquoted ``on``/``yes``/``no``/``1.10``; the message quotes what the user wrote (from
  ``RawScalars``) and never coerces. Traps pydantic cannot see — a mapping key YAML turned into a
  boolean or number, a date, a value JSON cannot hold — are found by ``scan`` over the whole object;
  pydantic errors at a path where ``scan`` already reported the *value* are dropped so each problem
  is said once. A problem with the key and one with its value are two problems, both reported.
* Pydantic reports a mapping key as it sees it: the boolean key of ``{yes: 2}`` arrives as the
  index-like ``1``. ``causes_from_validation`` maps every location back onto the keys of the input
  (``given``), so the value's error is reported where the user wrote it, ``annotations.yes``.
* Values are echoed clipped (``clip``): a message or a path quotes at most ``MAX_ECHO`` characters
  of what the user sent and says how many it left out. A 1 MB label value once came back twice in
  a 2 MB 422 (and, through a batch's per-document details, several times over).
* A NUL character is refused in every key and every string, wherever it is: PostgreSQL text
  cannot hold one, and a name or a label with one could be stored by one backend and not another.
  ``scan`` reports it, so every write through admission (objects, status, decisions) refuses it
  with a 422 at the field's path. Paths and messages show it, like any unprintable character, as
  an escape (``\u0000``), never raw.
"""

from __future__ import annotations

import datetime as dt
import difflib
import math
import re
import types
import typing
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from joch.admission.documents import FieldPath, RawScalars
from joch.api.errors import Cause

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
MAX_ECHO = 100  # characters of a user's value a message or path quotes: more than any valid name
_UNION_TAG = re.compile(r"^(str|int|float|bool|none|constrained-\w+|[\w-]+\[.*\])$")
_TYPE_WORDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "a boolean"}
_TYPE_ERRORS = {
    "string_type": "a string", "int_type": "an integer", "float_type": "a number",
    "bool_type": "a boolean (true or false)", "dict_type": "a mapping", "model_type": "a mapping",
    "list_type": "a list", "int_from_float": "an integer",
}
_SCALAR_WORDS = frozenset({"an integer", "a number", "a boolean", "a boolean (true or false)"})
_NUL = "\x00"
NUL_PROBLEM = "contains a NUL character (\\u0000), which cannot be stored; remove it"
_BOOL_HINT = "YAML 1.1 reads unquoted on/off/yes/no as booleans"
_NUMBER_HINT = "YAML reads unquoted {text} as a number"


def format_path(path: Iterable[Hashable]) -> str:
    out = ""
    for seg in path:
        if isinstance(seg, int) and not isinstance(seg, bool):
            out += f"[{seg}]"
        elif isinstance(seg, str) and len(seg) <= MAX_ECHO and _IDENTIFIER.match(seg):
            out += f".{seg}" if out else seg
        else:
            out += f"[{clip(printable(_scalar_text(seg)))}]"
    return out


def clip(text: str, limit: int = MAX_ECHO) -> str:
    """``text`` as a message quotes it: at most ``limit`` characters, then how many were left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def printable(text: str) -> str:
    """``text`` with unprintable characters (NUL, line breaks) as ``\\uXXXX`` escapes."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text)


def show(value: Any) -> str:
    """How a message names a value the user gave: ``boolean true``, ``number 1.1``, ``"abc"``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {_scalar_text(value)}"
    if isinstance(value, int | float):
        return f"number {value}"
    if isinstance(value, str):
        return f'"{printable(value[:60])}…"' if len(value) > 60 else f'"{printable(value)}"'
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"


# --- pydantic errors -----------------------------------------------------------------------------

def causes_from_validation(
    exc: ValidationError, *, model: type[BaseModel], prefix: FieldPath, raw: RawScalars, given: Any
) -> list[Cause]:
    """One cause per problem, union member errors folded, ``[key]`` errors left to ``scan``.
    ``given`` is the validated input, whose keys the error locations are mapped back onto."""
    groups: dict[FieldPath, list[ErrorDetails]] = {}
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        if "[key]" in loc or err["type"] == "invalid_key":
            continue  # a non-string mapping key: ``scan`` reports it with the YAML hint
        groups.setdefault(_input_keys(given, _strip_union_tag(loc)), []).append(err)
    return [_cause(loc, errs, model=model, prefix=prefix, raw=raw) for loc, errs in groups.items()]


def _input_keys(value: Any, loc: FieldPath) -> FieldPath:
    """``loc`` with each mapping key replaced by the input's own key object (``True``, not ``1``)."""
    out: list[Hashable] = []
    for seg in loc:
        if isinstance(value, dict) and seg in value:
            key = next(k for k in value if k == seg and isinstance(k, str) == isinstance(seg, str))
            out.append(key)
            value = value[key]
        elif isinstance(value, list) and isinstance(seg, int) and 0 <= seg < len(value):
            out.append(seg)
            value = value[seg]
        else:
            out.append(seg)
            value = None
    return tuple(out)


def _strip_union_tag(loc: FieldPath) -> FieldPath:
    if len(loc) > 1 and isinstance(loc[-1], str) and _UNION_TAG.match(loc[-1]):
        loc = loc[:-1]
    # a tagged union's member inside the path (AgentProvider argsTemplate's "conditional[]")
    return tuple(seg for i, seg in enumerate(loc) if not (
        0 < i and isinstance(seg, str) and seg.endswith("[]") and isinstance(loc[i - 1], int)))


def _cause(
    loc: FieldPath, errs: list[ErrorDetails], *, model: type[BaseModel], prefix: FieldPath,
    raw: RawScalars,
) -> Cause:
    path = (*prefix, *loc)
    field = format_path(_as_written(path, raw))
    first = errs[0]
    if first["type"] == "missing":
        return Cause(field, "required field is missing", "FieldValueRequired")
    if first["type"] == "extra_forbidden":
        return Cause(field, _unknown_field(model, loc), "FieldValueInvalid")
    expected = _expected(errs)
    if expected:
        return Cause(field, _type_message(expected, first["input"], raw.values.get(path)),
                     "FieldValueTypeInvalid")
    return Cause(field, _constraint_message(first, raw.values.get(path)), "FieldValueInvalid")


def _expected(errs: list[ErrorDetails]) -> list[str]:
    """What the value should have been, when every error is a type mismatch; else []."""
    words: list[str] = []
    for err in errs:
        if err["type"] not in _TYPE_ERRORS:
            return []
        tag = err["loc"][-1] if err["loc"] else None
        word = _TYPE_WORDS.get(tag, "") if isinstance(tag, str) else ""
        word = word or _TYPE_ERRORS[err["type"]]
        if word not in words:
            words.append(word)
    if "a number" in words and "an integer" in words:
        words.remove("an integer")
    return words


def _type_message(expected: list[str], value: Any, text: str | None) -> str:
    message = f"expected {' or '.join(expected)}, got {show(value)}"
    wants_string = "a string" in expected
    if isinstance(value, bool) and wants_string:
        return f"{message}; {_bool_hint(text, 'value')}"
    if isinstance(value, int | float) and wants_string:
        if text is None:
            return f'{message} — quote the value ("{value}") if you meant text'
        return f'{message}; {_NUMBER_HINT.format(text=text)} — quote the value ("{text}")'
    if value is None:
        return f"{message}; an empty value or ~ reads as null — write a value or remove the field"
    if isinstance(value, str) and set(expected) <= _SCALAR_WORDS:
        return f"{message}; remove the quotes if you meant {expected[0]}"
    return message


def _bool_hint(text: str | None, what: str) -> str:
    """Why a string became a boolean: the YAML 1.1 trap, unless the user wrote true/false."""
    if text is None:
        return f"{_BOOL_HINT} — quote the {what}"
    if text.lower() in ("true", "false"):
        return f'quote the {what} ("{text}") if you meant text'
    return f'{_BOOL_HINT} — quote the {what} ("{text}")'


def _constraint_message(err: ErrorDetails, text: str | None = None) -> str:
    msg = err["msg"]
    msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if err["type"] == "string_too_short" and (err.get("ctx") or {}).get("min_length") == 1:
        return "must not be empty"
    if err["type"] == "literal_error":
        message = f"must be one of {(err.get('ctx') or {}).get('expected', '')}; got {show(err['input'])}"
        # network.mode: off — the YAML 1.1 trap, for a field whose values are words such as on/off.
        return f"{message}; {_bool_hint(text, 'value')}" if isinstance(err["input"], bool) else message
    if err["type"] == "too_short":
        return msg.replace("List should", "must").split(" after validation")[0]
    msg = msg.replace("Input should be", "must be").replace("String should", "must")
    if err["type"] == "value_error" or not err["loc"]:
        return msg
    return f"{msg}; got {show(err['input'])}"


def _unknown_field(model: type[BaseModel], loc: FieldPath) -> str:
    name = loc[-1] if loc else ""
    message = f'unknown field "{_scalar_text(name)}"'
    parent = model_at(model, loc[:-1])
    if parent is None or not isinstance(name, str):
        return message
    match = closest(name, fields_of(parent))
    return f'{message}; did you mean "{match}"?' if match else message


def closest(word: str, known: Iterable[str]) -> str | None:
    """The known word ``word`` most likely misspells: the same word in another case, else the
    closest by ``difflib`` (ratio 0.6 or more); None when nothing is close. Every did-you-mean
    (fields, kinds, resource types in the CLI) picks its suggestion here."""
    words = list(known)
    same = next((k for k in words if k.lower() == word.lower()), None)
    return same or next(iter(difflib.get_close_matches(word, words, n=1, cutoff=0.6)), None)


def fields_of(model: type[BaseModel]) -> list[str]:
    """The field names ``model`` accepts, as written in a manifest (aliases)."""
    return [f.alias or n for n, f in model.model_fields.items()]


def model_at(model: type[BaseModel], loc: FieldPath) -> type[BaseModel] | None:
    """The pydantic model that validates the value at ``loc`` inside ``model``, if one does."""
    tp: Any = model
    for seg in loc:
        tp = _unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel) and isinstance(seg, str):
            field = tp.model_fields.get(seg)
            if field is None:
                return None
            tp = field.annotation
        elif typing.get_origin(tp) is list and isinstance(seg, int):
            tp = typing.get_args(tp)[0]
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        else:
            return None
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _unwrap(tp: Any) -> Any:
    """Strip ``Annotated`` and ``X | None`` down to ``X`` (a real union stays as it is)."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin is typing.Union or origin is types.UnionType:
            members = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(members) != 1:
                return tp
            tp = members[0]
        else:
            return tp


# --- YAML traps pydantic cannot see --------------------------------------------------------------

@dataclass(frozen=True)
class Scan:
    """What ``scan`` found: every cause, and the fields whose *value* it reported (as opposed to
    a key), where a schema error would only say the same thing again."""

    causes: list[Cause]
    value_fields: frozenset[str]


def scan(obj: Any, *, raw: RawScalars) -> Scan:
    """Mapping keys that are not strings, values JSON cannot hold and NUL characters, anywhere in
    ``obj``."""
    if _plain(obj):
        return Scan(causes=[], value_fields=frozenset())
    found = list(_scan(obj, (), raw))
    return Scan(causes=[cause for cause, _ in found],
                value_fields=frozenset(cause.field for cause, is_key in found if not is_key))


def _plain(value: Any) -> bool:
    """Whether ``_scan`` would find nothing in ``value``, decided without building paths: only
    plain JSON values (exactly ``str``, ``int``, ``bool``, finite ``float``, None, ``dict`` with
    ``str`` keys and ``list``) and no NUL. Anything else (a subclass too) is left to ``_scan``."""
    kind = type(value)
    if kind is str:
        return _NUL not in value
    if kind is dict:
        for key, child in value.items():
            if type(key) is not str or _NUL in key or not _plain(child):
                return False
        return True
    if kind is list:
        for child in value:
            if not _plain(child):
                return False
        return True
    if kind is float:
        return math.isfinite(value)
    return value is None or kind is int or kind is bool


def _scan(value: Any, path: FieldPath, raw: RawScalars) -> Iterator[tuple[Cause, bool]]:
    """(cause, whether it is about a key) for every problem at or below ``path``."""
    if isinstance(value, dict):
        for key, child in value.items():
            if not isinstance(key, str):
                yield _key_cause(key, (*path, key), raw), True
            elif _NUL in key:
                yield Cause(format_path((*path, key)), f"the key {show(key)} {NUL_PROBLEM}",
                            "FieldValueInvalid"), True
            yield from _scan(child, (*path, key), raw)
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _scan(child, (*path, i), raw)
    elif isinstance(value, dt.date):  # datetime is a date too
        text = raw.values.get(path) or value.isoformat()
        yield Cause(
            format_path(_as_written(path, raw)),
            f'got the timestamp {text}; YAML reads unquoted dates and times as timestamps — '
            f'quote the value ("{text}")',
            "FieldValueTypeInvalid",
        ), False
    elif isinstance(value, str):
        if _NUL in value:
            yield Cause(format_path(_as_written(path, raw)), f"{show(value)} {NUL_PROBLEM}",
                        "FieldValueInvalid"), False
    elif isinstance(value, float) and not math.isfinite(value):
        yield Cause(format_path(_as_written(path, raw)),
                    f"got {value}, which JSON cannot represent; quote it if you meant text",
                    "FieldValueTypeInvalid"), False
    elif value is not None and not isinstance(value, str | int | float | bool):
        yield Cause(format_path(_as_written(path, raw)),
                    f"got {show(value)}; only strings, numbers, booleans, null, lists and mappings "
                    "are allowed", "FieldValueTypeInvalid"), False


def _key_cause(key: Any, path: FieldPath, raw: RawScalars) -> Cause:
    written = raw.keys.get(path) or _scalar_text(key)
    if isinstance(key, bool):
        hint = _bool_hint(raw.keys.get(path) or written, "key")
    elif isinstance(key, int | float):
        hint = f'{_NUMBER_HINT.format(text=written)} — quote the key ("{written}")'
    else:
        hint = f'keys must be strings — quote the key ("{written}")'
    return Cause(format_path(_as_written(path, raw)),
                 f"the key {written} was read as {show(key)}, not a string; {hint}",
                 "FieldValueTypeInvalid")


def _as_written(path: FieldPath, raw: RawScalars) -> FieldPath:
    """``path`` with every non-string key spelled as the user wrote it (``on``, not ``True``)."""
    out: list[Hashable] = []
    for i, seg in enumerate(path):
        written = raw.keys.get(path[: i + 1])
        if written is not None:
            out.append(written)
        elif isinstance(seg, str) or (isinstance(seg, int) and not isinstance(seg, bool)):
            out.append(seg)  # a name, or a list index
        else:
            out.append(_scalar_text(seg))
    return tuple(out)


def _scalar_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)
