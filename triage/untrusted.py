"""Reading files that untrusted code could have written, without trusting them.

An arm's script runs in the same interpreter as triage's worker, so anything in the arm's
directory may be the script's work: a symlink to /dev/zero, a FIFO nobody writes to, a
directory, a gigabyte of JSON, a zip that inflates a thousandfold, an object array that
unpickles.  These readers turn every such file into `UntrustedOutput` (with a message that
says what was wrong), quickly and within the memory they are given: links are not followed,
nothing blocks, and every size is checked before the bytes are read or allocated.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import stat
import struct
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import numpy as np

MAX_JSON_DEPTH = 64
# Values (containers and scalars) a JSON document may hold: parsed, each is a Python object of
# 30-60 bytes, so 64 MiB of `[],` is 22 million lists and gigabytes in triage's own process,
# built before any check sees the document's shape. Counted in the bytes first (every value
# but the last is followed by a comma, every container opens with a bracket; brackets and
# commas inside strings count too, which only errs toward refusing).
MAX_JSON_VALUES = 4_000_000
MAX_INT_DIGITS = 40  # JSON integers beyond this are refused (Python would parse 4,300 digits)
MAX_NPY_HEADER_BYTES = 10000  # numpy's own default limit for the header it parses
NUMERIC_KINDS = "biufc"  # bool, signed, unsigned, float, complex: no objects, strings, records
_NPZ_MEMBER = re.compile(r"[A-Za-z0-9_]{1,64}\.npy")


class UntrustedOutput(Exception):
    """A file (or message) from untrusted code is not what triage's own code writes there."""


# -- shapes of untrusted JSON -----------------------------------------------------------------
# A `Check` returns None for a value of the expected shape, else "path: what is wrong".  Plain
# closures rather than a JSON Schema validator: a result of 2,000 observables has ~200,000
# values, and jsonschema takes seconds over them where these take a tenth of one.  Each check
# also carries its shape as JSON Schema (`form`), so that where a field reaches report.json the
# schema `triage post` validates is generated from the check that admitted it
# (triage/report/schema.py), not written a second time.
class Check(Protocol):
    form: dict[str, Any]  # the shape as JSON Schema; `$defs/<name>` references for `named` checks
    definition: dict[str, Any]  # a `named` check's own form (its `$defs` entry)

    def __call__(self, v: Any, /) -> str | None: ...


# report.json writes a nonfinite number as a string (JSON has no literal for it): whoever
# generates a schema from these forms defines `$defs/real` as a number or one of those strings.
REAL = {"$ref": "#/$defs/real"}
NULL = {"type": "null"}


def _shaped(check: Callable[[Any], str | None], form: dict[str, Any], nullable: bool = False) -> Check:
    check.form = _or_null(form) if nullable else form  # type: ignore[attr-defined]
    return check  # type: ignore[return-value]


def _or_null(form: dict[str, Any]) -> dict[str, Any]:
    if isinstance(form.get("type"), str) and "$ref" not in form:
        return {**form, "type": [form["type"], "null"]}
    return {"anyOf": [form, NULL]}


def _anchored(pattern: str) -> str:
    """A Python `fullmatch` pattern as JSON Schema's (which searches)."""
    return f"^(?:{pattern})$"


def named(name: str, check: Check, description: str | None = None) -> Check:
    """`check`, described once as `$defs/<name>` and referred to by name wherever it is used."""
    check.definition = {"description": description, **check.form} if description else check.form
    check.form = {"$ref": f"#/$defs/{name}"}
    return check


def described(description: str, check: Check) -> Check:
    """`check` with a sentence for the schema's reader (the check itself is shared, unchanged)."""
    def same(v: Any) -> str | None:
        return check(v)
    return _shaped(same, {"description": description, **check.form})


def maybe(check: Check) -> Check:
    """None, or what `check` admits."""
    def check_or_null(v: Any) -> str | None:
        return None if v is None else check(v)
    return _shaped(check_or_null, check.form, nullable=True)


def text(max_length: int, pattern: str | None = None, nullable: bool = False) -> Check:
    form = re.compile(pattern) if pattern else None

    def check(v: Any) -> str | None:
        if v is None and nullable:
            return None
        if type(v) is not str:
            return f": {_kind(v)}, not a string"
        if len(v) > max_length:
            return f": a string of {len(v)} characters, more than {max_length}"
        if form is not None and not form.fullmatch(v):
            return f": {v[:40]!r} is not in the expected form"
        return None
    return _shaped(check, {"type": "string", "maxLength": max_length,
                           **({"pattern": _anchored(pattern)} if pattern else {})}, nullable)


def integer(minimum: int | None = None, maximum: int | None = None, nullable: bool = False) -> Check:
    def check(v: Any) -> str | None:
        if v is None and nullable:
            return None
        if type(v) is not int:  # not bool, and not 7.0 (JSON Schema's integer would take it)
            return f": {_kind(v)}, not an integer"
        if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
            return f": {v} is not between {minimum} and {maximum}"
        return None
    bounds = {k: x for k, x in (("minimum", minimum), ("maximum", maximum)) if x is not None}
    return _shaped(check, {"type": "integer", **bounds}, nullable)


def number(nullable: bool = False) -> Check:
    """An int or a float (NaN and ±inf included: JSON writers emit them as literals)."""
    def check(v: Any) -> str | None:
        if v is None and nullable:
            return None
        return None if type(v) in (int, float) else f": {_kind(v)}, not a number"
    return _shaped(check, REAL, nullable)


def boolean(nullable: bool = False) -> Check:
    def check(v: Any) -> str | None:
        return None if type(v) is bool or (v is None and nullable) else f": {_kind(v)}, not true or false"
    return _shaped(check, {"type": "boolean"}, nullable)


def one_of(*values: Any) -> Check:
    allowed = [(type(x), x) for x in values]

    def check(v: Any) -> str | None:
        if (type(v), v) in allowed:
            return None
        # Only a scalar is shown: a list or object from a control message can be nested deep
        # enough for repr() to exhaust the recursion limit.
        shown = repr(v)[:40] if type(v) in (str, int, float, bool, type(None)) else _kind(v)
        return f": {shown} is not one of {', '.join(map(repr, values))}"
    return _shaped(check, {"enum": list(values)})


def either(*checks: Check) -> Check:
    """Any one of `checks` (the first one's problem when none holds)."""
    def check(v: Any) -> str | None:
        problems = [c(v) for c in checks]
        return None if None in problems else problems[0]
    return _shaped(check, {"anyOf": [c.form for c in checks]})


def all_of(*checks: Check) -> Check:
    def check(v: Any) -> str | None:
        for c in checks:
            problem = c(v)
            if problem is not None:
                return problem
        return None
    return _shaped(check, {"allOf": [c.form for c in checks]})


def array(item: Check, max_items: int, min_items: int = 0, nullable: bool = False) -> Check:
    def check(v: Any) -> str | None:
        if v is None and nullable:
            return None
        if type(v) is not list:
            return f": {_kind(v)}, not a list"
        if not min_items <= len(v) <= max_items:
            return f": a list of {len(v)} items, not {min_items} to {max_items}"
        for i, x in enumerate(v):
            problem = item(x)
            if problem is not None:
                return f"/{i}{problem}"
        return None
    return _shaped(check, {"type": "array", **({"minItems": min_items} if min_items else {}), "maxItems": max_items,
                           "items": item.form}, nullable)


def record(fields: dict[str, Check], required: tuple[str, ...] = (), closed: bool = False,
           nullable: bool = False) -> Check:
    """An object with these fields (each optional unless `required`); `closed`: no others."""
    def check(v: Any) -> str | None:
        if v is None and nullable:
            return None
        if type(v) is not dict:
            return f": {_kind(v)}, not an object"
        for name in required:
            if name not in v:
                return f": {name} is missing"
        for name, x in v.items():
            field = fields.get(name)
            if field is None:
                if closed:
                    return f": an unexpected field {str(name)[:40]!r}"
                continue
            problem = field(x)
            if problem is not None:
                return f"/{name}{problem}"
        return None
    check.fields = fields  # type: ignore[attr-defined]  # what a generated schema splits field by field
    return _shaped(check, {"type": "object", "properties": {k: c.form for k, c in fields.items()},
                           **({"required": list(required)} if required else {}),
                           **({"additionalProperties": False} if closed else {})}, nullable)


def mapping(value: Check, max_items: int, key_pattern: str | None = None, nullable: bool = False) -> Check:
    """An object used as a map: any keys (of `key_pattern`), each value `value`."""
    keys = re.compile(key_pattern) if key_pattern else None

    def check(v: Any) -> str | None:
        if v is None and nullable:
            return None
        if type(v) is not dict:
            return f": {_kind(v)}, not an object"
        if len(v) > max_items:
            return f": {len(v)} entries, more than {max_items}"
        for name, x in v.items():
            if keys is not None and not keys.fullmatch(name):
                return f": a key {name[:40]!r} not in the expected form"
            problem = value(x)
            if problem is not None:
                return f"/{name[:80]}{problem}"
        return None
    return _shaped(check, {"type": "object", "maxProperties": max_items,
                           **({"propertyNames": {"pattern": _anchored(key_pattern)}} if key_pattern else {}),
                           "additionalProperties": value.form}, nullable)


def _kind(v: Any) -> str:
    return {type(None): "null", bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(v), type(v).__name__)


def open_regular(path: str | os.PathLike[str], max_bytes: int) -> BinaryIO:
    """`path` opened for reading, only if neither it nor its folder is a symlink and it is a
    regular file of at most `max_bytes`; never blocks (a FIFO is refused, not waited on)."""
    path = Path(path)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        directory = os.open(path.parent, flags | os.O_DIRECTORY)
    except OSError as e:
        raise UntrustedOutput(f"{path.parent.name}/ cannot be opened as a directory ({e.strerror})") from None
    try:
        fd = os.open(path.name, flags, dir_fd=directory)
    except FileNotFoundError:
        raise UntrustedOutput(f"{path.name} is missing") from None
    except OSError as e:
        # ELOOP: the name is a symlink (O_NOFOLLOW); ENXIO: a FIFO or socket with no writer.
        raise UntrustedOutput(f"{path.name} cannot be opened as a regular file ({e.strerror})") from None
    finally:
        os.close(directory)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedOutput(f"{path.name} is not a regular file")
        if info.st_size > max_bytes:
            raise UntrustedOutput(f"{path.name} is {info.st_size} bytes, more than the {max_bytes} triage reads")
        # Back to blocking reads: a regular file never blocks, and buffered reads expect it.
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """The whole file (see `open_regular`); one that changes size while it is read is refused."""
    with open_regular(path, max_bytes) as f:
        size = os.fstat(f.fileno()).st_size
        # Exactly what fstat said: read(max_bytes) would allocate max_bytes up front.
        data = f.read(size + 1)
    if len(data) != size:
        raise UntrustedOutput(f"{Path(path).name} changed while triage read it")
    return data


def read_json(path: str | os.PathLike[str], max_bytes: int, max_depth: int = MAX_JSON_DEPTH,
              max_values: int = MAX_JSON_VALUES) -> Any:
    """The JSON document in `path`: at most `max_bytes`, of at most `max_values` values,
    nested at most `max_depth` deep, with integers of at most MAX_INT_DIGITS digits (NaN and
    ±Infinity are read as floats, as the worker writes them)."""
    name = Path(path).name
    data = read_bytes(path, max_bytes)
    if json_values(data) > max_values:
        raise UntrustedOutput(f"{name} holds more than {max_values:,} values")
    try:
        doc = json.loads(data.decode("utf-8"), parse_int=_bounded_int)
    except RecursionError:
        raise UntrustedOutput(f"{name} is nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise UntrustedOutput(f"{name} is not valid JSON ({str(e)[:200]})") from None
    if _depth_exceeds(doc, max_depth):
        raise UntrustedOutput(f"{name} is nested more than {max_depth} levels deep")
    return doc


def json_values(data: bytes) -> int:
    """An upper bound on the values a JSON text holds, from its bytes alone (MAX_JSON_VALUES)."""
    return data.count(b",") + data.count(b"[") + data.count(b"{") + 1


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(digits)} digits")
    return int(digits)


def _depth_exceeds(doc: Any, max_depth: int) -> bool:
    """Whether lists/dicts nest deeper than `max_depth` (iteratively: no recursion limit)."""
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > max_depth:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def load_npz(path: str | os.PathLike[str], max_bytes_total: int, max_members: int,
             wanted: re.Pattern[str] | None = None) -> dict[str, np.ndarray]:
    """The numeric arrays of an ``np.savez``/``np.savez_compressed`` file, read without numpy's
    loader: each member's .npy header is parsed and its shape × itemsize checked against what
    is left of `max_bytes_total` before a byte of it is allocated.  Object, string and record
    arrays are refused (nothing is ever unpickled).  Members whose name (without ``.npy``) does
    not match `wanted` are skipped unread."""
    name = Path(path).name
    # Stored members are their data plus small headers; compressed ones are smaller still.
    f = open_regular(path, max_bytes_total + 4096 * max_members)
    arrays: dict[str, np.ndarray] = {}
    left = max_bytes_total
    try:
        try:
            archive = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError, struct.error) as e:
            raise UntrustedOutput(f"{name} is not a zip archive ({str(e)[:200]})") from None
        with archive:
            members = archive.infolist()
            if len(members) > max_members:
                raise UntrustedOutput(f"{name} holds {len(members)} arrays, more than the {max_members} triage reads")
            for info in members:
                key = info.filename.removesuffix(".npy")
                if wanted is not None and not wanted.fullmatch(key):
                    continue
                if not _NPZ_MEMBER.fullmatch(info.filename):
                    raise UntrustedOutput(f"{name} holds a member named {info.filename[:80]!r}")
                if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                    # bzip2 and lzma members inflate without a bound on each read.
                    raise UntrustedOutput(f"{name}: {info.filename} uses a compression np.savez does not write")
                array = _read_member(archive, info, left, name)
                left -= array.nbytes
                arrays[key] = array
    finally:
        f.close()
    return arrays


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, budget: int, name: str) -> np.ndarray:
    where = f"{name}: {info.filename}"
    try:
        with archive.open(info) as member:
            version = np.lib.format.read_magic(member)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(member,
                                                                            max_header_size=MAX_NPY_HEADER_BYTES)
            elif version in ((2, 0), (3, 0)):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(member,
                                                                            max_header_size=MAX_NPY_HEADER_BYTES)
            else:
                raise UntrustedOutput(f"{where} has an unknown .npy version {version}")
            if dtype.hasobject or dtype.kind not in NUMERIC_KINDS or dtype.fields is not None or dtype.subdtype:
                raise UntrustedOutput(f"{where} is an array of {dtype}, not a numeric one")
            if any(n < 0 for n in shape):
                raise UntrustedOutput(f"{where} has a negative dimension {shape}")
            count = math.prod(shape)
            nbytes = count * dtype.itemsize
            if nbytes > budget:
                raise UntrustedOutput(f"{where} is a {'×'.join(map(str, shape)) or 'scalar'} {dtype} array of "
                                      f"{nbytes} bytes, more than the {budget} bytes left of triage's budget")
            array = np.empty(count, dtype=dtype)
            view = memoryview(array.view(np.uint8))
            got = 0
            while got < nbytes:
                n = member.readinto(view[got:])
                if not n:
                    raise UntrustedOutput(f"{where} ends before its {nbytes} bytes of data")
                got += n
    except UntrustedOutput:
        raise
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, TypeError, SyntaxError, NotImplementedError,
            RuntimeError, zlib.error, struct.error) as e:
        # zipfile (RuntimeError: an encrypted member) and numpy's header parser raise all of
        # these on crafted input.
        raise UntrustedOutput(f"{where} is not a valid .npy member ({type(e).__name__}: {str(e)[:200]})") from None
    return array.reshape(shape, order="F" if fortran else "C")


def remove_tree(path: str | os.PathLike[str]) -> None:
    """Remove a directory untrusted code had access to, whatever it left there (FIFOs, links,
    subdirectories, read-only directories); never raises, never follows a link out of it."""
    if not os.path.lexists(path):
        return
    if os.path.islink(path) or not os.path.isdir(path):
        try:
            os.unlink(path)
        except OSError:
            pass
        return
    # A folder the script made read-only keeps its entries: open every folder up first, never
    # through a link (os.walk does not follow them, and neither does the chmod).
    _make_writable(path)
    for folder, subfolders, _ in os.walk(path):
        for name in subfolders:
            _make_writable(os.path.join(folder, name))
    shutil.rmtree(path, ignore_errors=True)


def _make_writable(folder: str | os.PathLike[str]) -> None:
    try:
        os.chmod(folder, stat.S_IRWXU, follow_symlinks=False)
    except (OSError, NotImplementedError):  # a link (EOPNOTSUPP), or no lchmod on this platform
        pass
