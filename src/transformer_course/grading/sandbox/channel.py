"""The one channel between a student's processes and the grader: typed, size-bounded, schema-validated.

This module is the security boundary of grading. Everything a student's process says to the grader
crosses it as one *message*: a frame (magic, length) around a value encoded in the small binary format
below. The grader decodes a frame with `decode`, which builds nothing but plain values: None, bools,
ints, floats, strings, bytes, lists, tuples, dicts, CPU or meta tensors of a few dtypes, opaque
`Handle`s to objects that stay in the student's process, and records of the course's own dataclasses
(`transformer_course.checks.*`, built without running their `__init__`). No pickle, no marshal, no code:
a message cannot make the grader run anything, and every size is bounded (`Limits`) before anything is
allocated, so a hostile message can only be refused (`ChannelError`).

The grader's requests travel the other way with the same format plus three tags only the grader sends:
a name in the notebook's namespace (`StudentName`), a function of the course or of torch named by its
module and qualified name, and a handle the student's side handed out earlier.

    frame   := MAGIC (4 bytes) + length (8 bytes, big-endian) + value
    value   := tag (1 byte) + payload
    N T F   None, True, False            i  int64            I  big int (decimal text)
    f       float64                      s  str (UTF-8)       b  bytes
    l t     list, tuple (count + items)  d  dict (count + key, value pairs)
    X       tensor: dtype, device (cpu|meta), ndim, sizes, raw little-endian data (cpu only)
    D       torch.dtype                  V  torch.device (its name)      H  handle (id + description)
    R       record: "module:qualname" + dict of fields
    M       a student name (grader -> student only)   P  a course or torch function (grader -> student only)
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import struct
import sys
from dataclasses import dataclass
from typing import Any

MAGIC = b"TFS2"
HEADER = 12


class ChannelError(ValueError):
    """A message that is not well-formed, too large, or of a kind this side does not accept."""


@dataclass(frozen=True)
class Limits:
    message_bytes: int = 64 * 2**20  # one whole message
    depth: int = 40  # nesting of containers
    items: int = 2_000_000  # values in one message, all containers together
    string_bytes: int = 4 * 2**20  # one string or bytes value
    tensor_elements: int = 2**24  # one tensor
    tensor_dims: int = 8


LIMITS = Limits()


@dataclass(frozen=True)
class Handle:
    """An object that stays in the student's process (a module, a function, anything not plain data).

    The grader can only hand it back in a later request; `description` says what it is, for messages."""

    id: int
    description: str = ""

    def __getattr__(self, name: str) -> Any:  # only dataclass fields exist; anything else is a mistake
        raise AttributeError(f"{self.description or 'a student object'} lives in the student's process: "
                             f"pass it to a function that runs there instead of reading .{name} here")


@dataclass(frozen=True)
class StudentName:
    """A name of the notebook's namespace (a grade cell's argument, e.g. `MultiHeadAttention`)."""

    name: str


@dataclass(frozen=True)
class Unknown:
    """A record the grader does not know (only made when decoding with `strict=False`, for tests)."""

    kind: str
    fields: dict


# --- dtypes ---------------------------------------------------------------------------------------------------

def _dtypes() -> list[Any]:
    import torch

    return [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
            torch.int8, torch.uint8, torch.bool]


_DTYPES: list[Any] = []


def _dtype_table() -> list[Any]:
    if not _DTYPES:
        _DTYPES.extend(_dtypes())
    return _DTYPES


# --- encoding -------------------------------------------------------------------------------------------------

class Encoder:
    """Values to bytes. `keep(obj) -> Handle` is called for anything that is not plain data (the student's
    side keeps it in a table); without it such a value is refused."""

    def __init__(self, keep: Any = None, *, requests: bool = False) -> None:
        self.keep, self.requests = keep, requests
        self.parts: list[bytes] = []

    def encode(self, value: Any) -> bytes:
        self.parts = []
        self._value(value, 0)
        return b"".join(self.parts)

    def _value(self, value: Any, depth: int) -> None:  # noqa: C901 (one branch per type)
        put = self.parts.append
        if depth > LIMITS.depth:
            raise ChannelError("values nested too deeply")
        if value is None:
            put(b"N")
        elif value is True:
            put(b"T")
        elif value is False:
            put(b"F")
        elif isinstance(value, int):
            value = int(value)
            if -(2**63) <= value < 2**63:
                put(b"i" + struct.pack("<q", value))
            else:
                self._text(b"I", str(value))
        elif isinstance(value, float):
            put(b"f" + struct.pack("<d", float(value)))
        elif isinstance(value, str):
            self._text(b"s", str(value))
        elif isinstance(value, bytes | bytearray | memoryview):
            data = bytes(value)
            put(b"b" + struct.pack("<I", len(data)) + data)
        elif isinstance(value, list | tuple) and not _is_record(value):
            items = list(value)
            put((b"l" if isinstance(value, list) else b"t") + struct.pack("<I", len(items)))
            for item in items:
                self._value(item, depth + 1)
        elif isinstance(value, dict):
            items = list(value.items())
            put(b"d" + struct.pack("<I", len(items)))
            for key, item in items:
                self._value(key, depth + 1)
                self._value(item, depth + 1)
        elif isinstance(value, Handle):
            put(b"H" + struct.pack("<I", value.id))
            self._text(b"", value.description)
        elif isinstance(value, StudentName):
            if not self.requests:
                raise ChannelError("a student name is only sent by the grader")
            self._text(b"M", value.name)
        else:
            self._other(value, depth)

    def _text(self, tag: bytes, text: str) -> None:
        data = text.encode("utf-8", "replace")
        self.parts.append(tag + struct.pack("<I", len(data)) + data)

    def _other(self, value: Any, depth: int) -> None:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(value, torch.Tensor):
            self._tensor(value)
            return
        if torch is not None and isinstance(value, torch.dtype):
            if value not in _dtype_table():
                raise ChannelError(f"the dtype {value} cannot cross the channel")
            self.parts.append(b"D" + bytes([_dtype_table().index(value)]))
            return
        if torch is not None and isinstance(value, torch.device):
            self._text(b"V", str(value))
            return
        numpy = sys.modules.get("numpy")
        if numpy is not None and isinstance(value, numpy.generic):
            self._value(value.item(), depth)
            return
        if numpy is not None and isinstance(value, numpy.ndarray) and torch is not None:
            self._tensor(torch.from_numpy(numpy.ascontiguousarray(value)))
            return
        if dataclasses.is_dataclass(value) and not isinstance(value, type) and _course_class(type(value)):
            self._text(b"R", f"{type(value).__module__}:{type(value).__qualname__}")
            fields = {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
            self._value(fields, depth + 1)
            return
        if self.requests and callable(value) and _importable(value):
            self._text(b"P", f"{value.__module__}:{value.__qualname__}")
            return
        if self.keep is None:
            raise ChannelError(f"a {type(value).__name__} cannot cross the channel")
        self._value(self.keep(value), depth)

    def _tensor(self, tensor: Any) -> None:
        import torch

        tensor = torch.Tensor.as_subclass(tensor, torch.Tensor).detach()
        if tensor.dtype not in _dtype_table():
            tensor = tensor.to(torch.float64) if tensor.is_floating_point() or tensor.is_complex() else tensor.long()
        if len(tensor.shape) > LIMITS.tensor_dims:
            raise ChannelError(f"a tensor with {len(tensor.shape)} axes cannot cross the channel")
        meta = tensor.device.type == "meta"
        header = struct.pack("<BBB", _dtype_table().index(tensor.dtype), 1 if meta else 0, tensor.dim())
        sizes = struct.pack(f"<{tensor.dim()}Q", *tensor.shape)
        self.parts.append(b"X" + header + sizes)
        if not meta:
            flat = tensor.cpu().contiguous().reshape(-1)
            self.parts.append(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")


def _is_record(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and _course_class(type(value))


def _course_class(cls: type) -> bool:
    return (cls.__module__ or "").startswith("transformer_course.")


def _importable(function: Any) -> bool:
    module, qualname = getattr(function, "__module__", None), getattr(function, "__qualname__", None)
    if not (isinstance(module, str) and isinstance(qualname, str)) or "<" in qualname:
        return False
    if not module.startswith(("transformer_course.", "torch")):
        return False
    try:
        return _lookup(module, qualname) is function
    except Exception:  # anything that cannot be found again by name is not sent as a name
        return False


def _lookup(module: str, qualname: str) -> Any:
    value: Any = importlib.import_module(module)
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


def frame(payload: bytes) -> bytes:
    return MAGIC + len(payload).to_bytes(8, "big") + payload


def encode(value: Any, keep: Any = None, *, requests: bool = False) -> bytes:
    """One framed message holding `value`."""
    return frame(Encoder(keep, requests=requests).encode(value))


# --- decoding -------------------------------------------------------------------------------------------------

class Decoder:
    """Bytes to values, every size checked before it is used. `requests=True` also accepts the grader's own
    tags (names, functions) and resolves handles with `resolve`; the grader decodes with requests=False."""

    def __init__(self, data: bytes, *, requests: bool = False, resolve: Any = None, names: Any = None,
                 strict: bool = True, limits: Limits = LIMITS) -> None:
        self.data, self.position, self.items = memoryview(data), 0, 0
        self.requests, self.resolve, self.names, self.strict, self.limits = requests, resolve, names, strict, limits

    def decode(self) -> Any:
        value = self._value(0)
        if self.position != len(self.data):
            raise ChannelError("bytes left over after the message")
        return value

    def _take(self, count: int) -> memoryview:
        if count < 0 or self.position + count > len(self.data):
            raise ChannelError("the message ends too early")
        piece = self.data[self.position:self.position + count]
        self.position += count
        return piece

    def _unpack(self, fmt: str) -> tuple:
        return struct.unpack(fmt, self._take(struct.calcsize(fmt)))

    def _text(self) -> str:
        (length,) = self._unpack("<I")
        if length > self.limits.string_bytes:
            raise ChannelError(f"a string of {length} bytes is too long")
        try:
            return bytes(self._take(length)).decode("utf-8")
        except UnicodeDecodeError as error:
            raise ChannelError(f"a string that is not UTF-8 ({error})") from None

    def _value(self, depth: int) -> Any:  # noqa: C901 (one branch per tag)
        if depth > self.limits.depth:
            raise ChannelError("values nested too deeply")
        self.items += 1
        if self.items > self.limits.items:
            raise ChannelError("too many values in one message")
        tag = bytes(self._take(1))
        if tag == b"N":
            return None
        if tag == b"T":
            return True
        if tag == b"F":
            return False
        if tag == b"i":
            return self._unpack("<q")[0]
        if tag == b"I":
            text = self._text()
            if len(text) > 4000 or not _DECIMAL.fullmatch(text):  # ASCII digits only, under Python's int limit
                raise ChannelError("a malformed big integer")
            return int(text)
        if tag == b"f":
            return self._unpack("<d")[0]
        if tag == b"s":
            return self._text()
        if tag == b"b":
            (length,) = self._unpack("<I")
            if length > self.limits.string_bytes:
                raise ChannelError(f"{length} bytes are too many")
            return bytes(self._take(length))
        if tag in (b"l", b"t"):
            (count,) = self._unpack("<I")
            if count > len(self.data) - self.position:  # every item takes at least one byte
                raise ChannelError("a list longer than the message")
            items = [self._value(depth + 1) for _ in range(count)]
            return items if tag == b"l" else tuple(items)
        if tag == b"d":
            (count,) = self._unpack("<I")
            if 2 * count > len(self.data) - self.position:
                raise ChannelError("a dict longer than the message")
            result = {}
            for _ in range(count):
                key = self._value(depth + 1)
                if not _plain_key(key):
                    raise ChannelError("a dict key that is not a string, number or tuple of them")
                result[key] = self._value(depth + 1)
            return result
        if tag == b"X":
            return self._tensor()
        if tag == b"D":
            (index,) = self._unpack("<B")
            if index >= len(_dtype_table()):
                raise ChannelError("an unknown dtype")
            return _dtype_table()[index]
        if tag == b"V":
            import torch

            text = self._text()
            if not re.fullmatch(r"(cpu|meta|cuda|mps)(:\d{1,3})?", text):
                raise ChannelError(f"an unknown device {text[:40]!r}")
            return torch.device(text)
        if tag == b"H":
            (identity,) = self._unpack("<I")
            description = self._text()
            if self.requests:
                if self.resolve is None:
                    raise ChannelError("a handle where none can be resolved")
                return self.resolve(identity)
            return Handle(identity, description[:200])
        if tag == b"R":
            kind = self._text()
            fields = self._value(depth + 1)
            if not isinstance(fields, dict) or not all(isinstance(key, str) for key in fields):
                raise ChannelError("a record whose fields are not named")
            return self._record(kind, fields)
        if tag == b"M" and self.requests:
            name = self._text()
            return self.names(name) if self.names is not None else StudentName(name)
        if tag == b"P" and self.requests:
            module, _, qualname = self._text().partition(":")
            if not module.startswith(("transformer_course.", "torch")):
                raise ChannelError(f"a function from {module!r}")
            return _lookup(module, qualname)
        raise ChannelError(f"an unknown or refused tag {tag!r}")

    def _tensor(self) -> Any:
        import torch

        dtype_index, device, ndim = self._unpack("<BBB")
        if dtype_index >= len(_dtype_table()) or device > 1 or ndim > self.limits.tensor_dims:
            raise ChannelError("a malformed tensor header")
        sizes = self._unpack(f"<{ndim}Q") if ndim else ()
        elements = 1
        for size in sizes:
            if size > self.limits.tensor_elements:  # also with another axis of size 0: torch refuses such sizes
                raise ChannelError(f"a tensor axis of {size} elements")
            elements *= size
            if elements > self.limits.tensor_elements:
                raise ChannelError(f"a tensor of more than {self.limits.tensor_elements} elements")
        dtype = _dtype_table()[dtype_index]
        if device == 1:
            return torch.empty(sizes, dtype=dtype, device="meta")
        size = elements * torch.empty((), dtype=dtype).element_size()
        raw = self._take(size)
        if not elements:
            return torch.empty(sizes, dtype=dtype)
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(sizes)

    def _record(self, kind: str, fields: dict) -> Any:
        module, _, qualname = kind.partition(":")
        if not module.startswith("transformer_course.checks."):
            if self.strict:
                raise ChannelError(f"a record of {kind!r}")
            return Unknown(kind, fields)
        cls = _record_class(module, qualname)
        if cls is None:
            raise ChannelError("a record of a kind the grader does not know")
        names = {field.name for field in dataclasses.fields(cls)}
        if set(fields) != names:
            raise ChannelError(f"a {cls.__qualname__} record with other fields than its own")
        try:
            record = object.__new__(cls)
            for name, value in fields.items():
                object.__setattr__(record, name, value)
        except Exception:  # a class that object.__new__ cannot make is no record
            raise ChannelError(f"a {cls.__qualname__} record that cannot be made") from None
        return record


_DECIMAL = re.compile(r"-?[0-9]+")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _record_class(module: str, qualname: str) -> type | None:
    """The dataclass `qualname` defined in the course's checks module `module`, found in the namespaces of
    the module and its classes only: no attribute of anything else is read (no module's `__getattr__`, no
    lazy import of torch's submodules, no property), and nothing defined elsewhere is accepted."""
    parts = qualname.split(".")
    if not all(_IDENTIFIER.fullmatch(part) for part in [*module.split("."), *parts]):
        return None
    try:
        value: Any = importlib.import_module(module)
    except Exception:  # a module of the course that does not exist or cannot load here
        return None
    for part in parts:
        value = vars(value).get(part)  # the namespace itself: no getattr
        if not isinstance(value, type):
            return None
    if value.__module__ != module or value.__qualname__ != qualname or not dataclasses.is_dataclass(value):
        return None
    return value


def _plain_key(key: Any) -> bool:
    if isinstance(key, str | int | float | bool) or key is None:
        return True
    return isinstance(key, tuple) and all(_plain_key(item) for item in key)


def decode(payload: bytes, **options: Any) -> Any:
    """The value of one message's payload (the part after the frame header). Whatever the bytes, the only
    exception is ChannelError: a hostile message is refused, never a crash of the side that reads it."""
    if len(payload) > options.get("limits", LIMITS).message_bytes:
        raise ChannelError(f"a message of {len(payload)} bytes is too large")
    if options.get("requests"):  # the student's side: a name or handle it lacks raises its own error
        return Decoder(payload, **options).decode()
    try:
        return Decoder(payload, **options).decode()
    except ChannelError:
        raise
    except Exception as error:  # torch refusing sizes, an int the interpreter will not parse, ...
        raise ChannelError(f"a malformed message ({type(error).__name__})") from None


def read_header(header: bytes, limits: Limits = LIMITS) -> int:
    """The payload length announced by a frame header (ChannelError if it is not ours or too large)."""
    if len(header) != HEADER or header[:4] != MAGIC:
        raise ChannelError("bytes that are not a message of the grader's channel")
    size = int.from_bytes(header[4:], "big")
    if size > limits.message_bytes:
        raise ChannelError(f"a message of {size} bytes is too large")
    return size
