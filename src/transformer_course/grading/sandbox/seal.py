"""In-process defences of a grading process against the notebook code it runs.

A student's notebook runs in the same Python process as the checks that grade it. The sandbox
(`transformer_course.grading.sandbox.isolation`) keeps the notebook away from other students, the
gradebook and the grading machine, but not away from the checks; this module is what the grading
runner (`transformer_course.grading.sandbox.runner`) arms before the first notebook cell runs.

- **Provenance.** Every code object is *library* code (from a file of the Python installation, the
  environment or the course package), *grader* code (the grade cells the runner compiles itself,
  known by identity), or *notebook* code (everything else: cells, `exec` strings, code made at run
  time). Code compiled under a library file's name must match that file.
- **The audit hook** (PEP 578: once added it cannot be removed, and nothing hands it out). While
  notebook code is on the calling thread's stack it refuses every way of getting a frame
  (`sys._getframe`, `inspect.stack()`, `traceback.walk_stack`, a traceback's or generator's frame,
  trace and profile functions); it always refuses what reaches other threads' frames or any object
  (`sys._current_frames`, `gc.get_objects/referrers/referents`), more audit hooks, `ctypes` and
  `/proc/<pid>/mem` from notebook code, and code objects or functions made to pass for library
  code. So notebook code can read neither the hidden tests nor the grader's variables.
- **The hook writes the verdicts.** In the forked child that runs a grade cell, the runner
  registers the result channel and a one-time nonce with the hook (only code with no notebook or
  grader frame on its stack may), then drops them. From then on only the hook writes records: a
  note for every `fail(...)` of a check (sent the moment it happens, so a failure swallowed later
  still counts), each check's verdict (accepted only from the strict check proxy, with no notebook
  frame on the stack), and the end of the cell. Notebook code can neither forge nor suppress them.
- **Integrity of the tools.** A frozen copy of the checks' snapshot of their tools (torch, the
  checks, the reference solution, the context managers they use) and a fast check that puts back
  whatever was replaced. Sealed style throughout: the functions here use no module globals and no
  closures that notebook code could rebind; what they need is bound as positional defaults, which
  Python keeps in an immutable tuple (and replacing `__defaults__` or `__code__` of library
  functions is refused by the hook).
- **The profile guard** of the child: whenever notebook code returns into library or grader code
  the tools are checked and restored, so re-patching the checks while a check runs changes
  nothing; calls of this notebook's reference solutions from inside notebook code are recorded.
- **seccomp** in the child: no threads, no processes, no ptrace, so nothing runs beside the check.

Known limit: an attacker who forges library code through importlib's private bytecode loader can
run code that passes for library code, and such code, called directly by a check, could take
frames; it still sees nothing outside its sandbox.
"""

from __future__ import annotations

import _thread
import ctypes
import operator
import os
import platform
import re
import signal
import site
import struct
import sys
import types
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

LIBRARY, GRADER, NOTEBOOK = 0, 1, 2
EVENT = "transformer_course.seal"  # events of ours: EVENT + ".arm", ".grader", ".child", ".verdict", ".done"
CHECK_FAILED = "transformer_course.check_failed"  # raised by checks.framework.fail
RECORD_MAGIC = b"TCR1"

_FRAME_EVENTS = frozenset({"sys._getframe", "sys.settrace", "sys.setprofile", "sys.monitoring.register_callback"})
_FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
_ALWAYS_REFUSED = frozenset({
    "sys._current_frames", "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.addaudithook",
    "sys._setprofileallthreads", "sys._settraceallthreads",
})
_FUNCTION_INTERNALS = frozenset({"__code__", "__defaults__", "__kwdefaults__"})
_MEMORY_FILE = re.compile(r"^/proc/[^/]+/(task/[^/]+/)?mem$|^/dev/k?mem$")

REFUSALS = {
    "frames": "inspecting the call stack (frames, tracebacks' frames, trace and profile functions) is "
              "switched off while your notebook is graded",
    "always": "this introspection (other threads' frames, the garbage collector's lists of objects, extra "
              "audit hooks) is switched off while your notebook is graded",
    "forgery": "code objects or functions that pass for installed library code are not allowed while your "
               "notebook is graded",
    "memory": "reading or writing the process's memory directly is not allowed while your notebook is graded",
    "ours": "only the grader may send this event",
}


# --- provenance --------------------------------------------------------------------------------


def library_roots(extra: Iterable[str] = ()) -> tuple[str, ...]:
    """Folders whose files are library code: the Python installation, the environment, the course package."""
    import transformer_course

    folders = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *site.getsitepackages(),
               str(Path(transformer_course.__file__).parent), *extra]
    roots = set()
    for folder in folders:
        for form in (os.path.abspath(folder), os.path.realpath(folder)):
            roots.add(form.rstrip(os.sep) + os.sep)
    return tuple(sorted(roots))


def make_provenance(roots: tuple[str, ...]) -> tuple[Callable[[Any], int], Callable[[Any], int], dict, dict]:
    """(kind_of_code, kind_of_file, trusted, grader): sealed classifiers and their two registries
    (id -> code object, kept alive so that an id is never reused while registered)."""
    by_file: dict[str, int] = {}
    trusted: dict[int, types.CodeType] = {}
    grader: dict[int, types.CodeType] = {}

    def file_kind(filename, _roots=roots, _cache=by_file, _type=type, _str=str, _LIBRARY=LIBRARY,
                  _NOTEBOOK=NOTEBOOK):
        if _type(filename) is not _str:
            return _NOTEBOOK
        kind = _cache.get(filename)
        if kind is None:
            kind = _LIBRARY if (filename.startswith(_roots) or filename.startswith("<frozen ")) else _NOTEBOOK
            _cache[filename] = kind
        return kind

    def code_kind(code, _file_kind=file_kind, _trusted=trusted, _grader=grader, _id=id, _LIBRARY=LIBRARY,
                  _GRADER=GRADER):
        identity = _id(code)
        if identity in _grader:
            return _GRADER
        if identity in _trusted:
            return _LIBRARY
        return _file_kind(code.co_filename)

    return code_kind, file_kind, trusted, grader


def trust_loaded_code(trusted: dict, file_kind: Callable[[Any], int]) -> None:
    """Library code made from strings before arming (dataclass and namedtuple methods) is library code."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reading some torch attributes warns that they are deprecated
        _trust_loaded_code(trusted, file_kind)


def _trust_loaded_code(trusted: dict, file_kind: Callable[[Any], int]) -> None:
    for module in list(sys.modules.values()):
        for value in list(getattr(module, "__dict__", {}).values()):
            for function in _functions_of(value):
                code = function.__code__
                for each in _code_tree(code):
                    if file_kind(each.co_filename) == NOTEBOOK:
                        trusted[id(each)] = each


def _functions_of(value: Any) -> list[types.FunctionType]:
    if isinstance(value, types.FunctionType):
        return [value]
    if isinstance(value, type):
        found = []
        for member in list(vars(value).values()):
            member = getattr(member, "__func__", member)
            if isinstance(member, property):
                found += [f for f in (member.fget, member.fset) if isinstance(f, types.FunctionType)]
            elif isinstance(member, types.FunctionType):
                found.append(member)
        return found
    return []


def _code_tree(code: types.CodeType) -> list[types.CodeType]:
    found, pending = [], [code]
    while pending:
        each = pending.pop()
        found.append(each)
        pending += [constant for constant in each.co_consts if isinstance(constant, types.CodeType)]
    return found


# --- records: what a sealed child tells the grader ---------------------------------------------


def make_packer() -> Callable[[Any], bytes]:
    """A sealed encoder of str/int/float/bool/None/list/tuple/dict values for `unpack` (grader side).

    Strings travel as hex, so whatever a notebook printed the grader parses plain JSON; only
    builtins bound here are used (notebook code may have replaced `json` or any module global)."""

    def pack(value, _type=type, _repr=repr, _str=str, _int=int, _float=float, _list=list, _tuple=tuple,
             _dict=dict, _len=len, _range=range, _bytes=bytes, _join="".join, _inf=float("inf")):
        parts = []
        pending = [value]
        while pending:
            item = pending.pop()
            kind = _type(item)
            if kind is _tuple and _len(item) == 1 and _type(item[0]) is _bytes:  # a literal piece
                parts.append(item[0].decode("ascii"))
            elif item is None or item is True or item is False:
                parts.append("null" if item is None else ("true" if item is True else "false"))
            elif kind is _int or kind is _float:
                number = _float(item) if kind is _float else _int(item)
                parts.append(_repr(number) if number == number and -_inf < number < _inf else "null")
            elif kind is _str:
                parts.append('"' + item.encode("utf-8", "replace").hex() + '"')
            elif kind is _list or kind is _tuple:
                pending.append((b"]",))
                for index in _range(_len(item) - 1, -1, -1):
                    pending.append(item[index])
                    if index:
                        pending.append((b",",))
                pending.append((b"[",))
            elif kind is _dict:
                keys = [key for key in item if _type(key) is _str]
                pending.append((b"}",))
                for index in _range(_len(keys) - 1, -1, -1):
                    pending.append(item[keys[index]])
                    pending.append((('"' + keys[index].encode("utf-8").hex() + '":').encode("ascii"),))
                    if index:
                        pending.append((b",",))
                pending.append((b"{",))
            else:  # anything else becomes the name of its type
                parts.append('"' + _str.__str__(kind.__name__ if _type(kind.__name__) is _str else "?")
                             .encode("utf-8", "replace").hex() + '"')
        return _join(parts).encode("ascii")

    return pack


def unpack(data: bytes) -> Any:
    """Decode a `make_packer` encoding (grader side)."""
    import json

    def decode(value: Any) -> Any:
        if isinstance(value, str):
            return bytes.fromhex(value).decode("utf-8", "replace")
        if isinstance(value, list):
            return [decode(item) for item in value]
        if isinstance(value, dict):
            return {bytes.fromhex(key).decode("utf-8", "replace"): decode(item) for key, item in value.items()}
        return value

    return decode(json.loads(data.decode("ascii")))


def frame_record(payload: bytes) -> bytes:
    return RECORD_MAGIC + len(payload).to_bytes(8, "big") + payload


# --- the audit hook ---------------------------------------------------------------------------


def allowed_frame_users() -> tuple[tuple[types.CodeType, types.CodeType | None], ...]:
    """(code, caller) pairs allowed to take frames although notebook code is on the stack, because
    they give no frame back (caller None: called from anywhere). `traceback.walk_tb` walks a
    traceback (the callees of whoever caught the exception, never whoever called the notebook);
    (`_walk_tb_with_full_positions` likewise); `traceback.format_stack`/`extract_stack`/`print_stack`
    turn the stack into text (torch records
    one on every `torch.manual_seed`); `typing._caller` and `collections.namedtuple` read a module name,
    `typing_extensions._has_generic_or_protocol_as_origin` a yes or no; logging's
    `currentframe` only when `Logger.findCaller` asks; the checks' `student_frame` reads the
    student's own frame for its message."""
    import collections
    import logging
    import traceback
    import typing

    from transformer_course.checks import errors

    pairs: list[tuple[types.CodeType, types.CodeType | None]] = [
        (traceback.walk_tb.__code__, None), (traceback.format_stack.__code__, None),
        (traceback.extract_stack.__code__, None), (traceback.print_stack.__code__, None),
        (logging.currentframe.__code__, logging.Logger.findCaller.__code__),
        (collections.namedtuple.__code__, None),  # reads its caller's module name
    ]
    candidates = [getattr(errors, "student_frame", None), getattr(typing, "_caller", None),
                  getattr(traceback, "_walk_tb_with_full_positions", None)]
    try:
        import typing_extensions

        # asks whether its caller is typing's Generic machinery; answers True or False
        candidates.append(getattr(typing_extensions, "_has_generic_or_protocol_as_origin", None))
        candidates.append(getattr(typing_extensions, "_caller", None))
    except ImportError:
        pass
    for function in candidates:
        if isinstance(function, types.FunctionType):
            pairs.append((function.__code__, None))
    return tuple(pairs)


def make_audit_hook(code_kind: Callable[[Any], int], file_kind: Callable[[Any], int], trusted: dict, grader: dict,
                    allowed: tuple, verdict_code: types.CodeType, done_code: types.CodeType) -> Callable:
    """The grading process's audit hook (see the module docstring). `verdict_code` is the code of the
    strict check proxy, the only code allowed to report a verdict; `done_code` the runner's."""
    pack = make_packer()
    state: list[Any] = [False, None]  # armed, (fd, nonce, device, inode) of a registered child

    def same_as_file(source, filename, _open=open, _type=type, _str=str, _bytes=bytes, _OSError=OSError):
        try:
            with _open(filename, "rb") as handle:
                content = handle.read()
        except _OSError:
            return False
        if _type(source) is _str:
            source = source.encode("utf-8")
        return _type(source) is _bytes and source == content

    def write(kind, fields, _state=state, _pack=pack, _write=os.write, _fstat=os.fstat, _magic=RECORD_MAGIC,
              _len=len, _OSError=OSError):
        channel = _state[1]
        if channel is None:
            return
        fd, nonce, device, inode = channel
        try:
            status = _fstat(fd)
        except _OSError:
            _state[1] = None
            return
        if status.st_dev != device or status.st_ino != inode:  # the channel was swapped: write nothing more
            _state[1] = None
            return
        payload = _pack({"record": kind, "nonce": nonce, **fields})
        data = _magic + _len(payload).to_bytes(8, "big") + payload
        while data:
            try:
                done = _write(fd, data)
            except _OSError:
                _state[1] = None
                return
            data = data[done:]

    def hook(event, args, _state=state, _code_kind=code_kind, _file_kind=file_kind, _grader=grader,
             _allowed={id(code): caller for code, caller in allowed}, _allowed_codes=allowed,
             _verdict=verdict_code, _done=done_code, _getframe=sys._getframe, _ident=_thread.get_ident,
             _inside=set(), _frame_events=_FRAME_EVENTS, _frame_attributes=_FRAME_ATTRIBUTES,
             _always=_ALWAYS_REFUSED, _refusals=REFUSALS, _internals=_FUNCTION_INTERNALS,
             _memory=_MEMORY_FILE.match, _same=same_as_file, _write=write, _Refused=PermissionError,
             _FunctionType=types.FunctionType, _ModuleType=types.ModuleType, _type=type, _str=str, _len=len,
             _id=id, _isinstance=isinstance, _fstat=os.fstat, _event=EVENT, _failed=CHECK_FAILED,
             _LIBRARY=LIBRARY, _GRADER=GRADER, _NOTEBOOK=NOTEBOOK, _tree=_code_tree):
        ours = event.startswith(_event)
        if not ours and not _state[0]:
            return
        if event == _failed:
            _write("fail", {"message": args[0] if args and _type(args[0]) is _str else "?"})
            return
        if event in _always:
            raise _Refused(_refusals["always"] + f" ({event})")
        setting = event == "object.__setattr__" and _len(args) > 1 and args[1] in _internals \
            and _type(args[0]) is _FunctionType
        if event == "open" and args and _type(args[0]) is _str and _memory(args[0]):
            raise _Refused(_refusals["memory"])
        frame_event = event in _frame_events or (
            event == "object.__getattr__" and _len(args) > 1 and args[1] in _frame_attributes)
        if not (ours or frame_event or setting or event == "compile" or event == "code.__new__"
                or event == "function.__new__" or event.startswith("ctypes.")):
            return
        me = _ident()
        if me in _inside:  # the hook's own frame walking
            return
        _inside.add(me)
        try:
            frame = _getframe(1)
            innermost = frame.f_code
            caller = frame.f_back.f_code if frame.f_back is not None else None
            notebook = grading = False
            while frame is not None:
                kind = _code_kind(frame.f_code)
                if kind == _NOTEBOOK:
                    notebook = True
                    break
                if kind == _GRADER:
                    grading = True
                frame = frame.f_back
            frame = None
        finally:
            _inside.discard(me)
        if ours:
            if event == _event + ".verdict":
                if innermost is not _verdict or notebook:
                    raise _Refused(_refusals["ours"])
                _write("verdict", {"title": args[0], "passed": args[1] is True, "message": args[2],
                                   "name": args[3] if _len(args) > 3 else ""})
                return
            if notebook or grading:
                raise _Refused(_refusals["ours"])
            if event == _event + ".done":
                if innermost is _done:
                    _write("done", args[0])
                return
            if event == _event + ".arm":
                _state[0] = True
            elif event == _event + ".grader":
                for code in _tree(args[0]):
                    _grader[_id(code)] = code
            elif event == _event + ".child":
                status = _fstat(args[0])
                _state[1] = (args[0], args[1], status.st_dev, status.st_ino)
            return
        if not notebook:
            return
        if frame_event:
            if _id(innermost) in _allowed:
                required = _allowed[_id(innermost)]
                if required is None or required is caller:
                    return
            place = innermost.co_filename.rsplit("/", 1)[-1]
            raise _Refused(_refusals["frames"] + f" ({event} in {innermost.co_name}, {place})")
        if setting:
            target, name = args[0], args[1]
            if _code_kind(target.__code__) != _NOTEBOOK:
                raise _Refused(_refusals["forgery"] + f" (setting {name} of {target.__qualname__})")
            return
        if event.startswith("ctypes."):
            raise _Refused(_refusals["memory"] + f" ({event})")
        if event == "compile" and _len(args) > 1:
            filename = args[1]
            if _file_kind(filename) == _LIBRARY and not _same(args[0], filename):
                raise _Refused(_refusals["forgery"] + f" (compiling code as {filename})")
        elif event == "code.__new__" and _len(args) > 1 and _file_kind(args[1]) == _LIBRARY:
            raise _Refused(_refusals["forgery"] + f" (a code object named {args[1]})")
        elif event == "function.__new__" and args and _code_kind(args[0]) != _NOTEBOOK:
            raise _Refused(_refusals["forgery"] + f" (a function made of {args[0].co_name}'s code)")

    return hook


def arm(hook: Callable) -> None:
    """Install the hook, hide the ways back to a profile function, switch the hook on."""
    sys.addaudithook(hook)
    # sys.getprofile/gettrace would hand notebook code the sealed child's profile guard
    sys.getprofile = lambda: None  # type: ignore[assignment]
    sys.gettrace = lambda: None  # type: ignore[assignment]
    sys.audit(EVENT + ".arm")


# --- integrity of the checks' tools ----------------------------------------------------------

CONTEXT_TOOLS = ("contextlib", "warnings", "torch.autograd.grad_mode", "torch.utils._contextlib", "torch.random",
                 "torch.overrides", "torch.nn.modules.module")


def frozen_tools() -> tuple[tuple, tuple, tuple]:
    """An immutable copy of the checks' snapshot (framework._SNAPSHOTS/_FUNCTIONS/_MODULES), plus the
    context managers the checks use (`with torch.no_grad()`, `warnings.catch_warnings()`,
    `contextlib` generators): a replaced `__exit__` could swallow a check's failure.
    Returns (owners, closures, modules), each a tuple of tuples."""
    import importlib

    from transformer_course.checks import framework

    entries: dict[int, tuple[Any, dict[str, Any]]] = dict(framework._SNAPSHOTS)
    for name in CONTEXT_TOOLS:
        module = importlib.import_module(name)
        entries.setdefault(id(module), (module, {key: value for key, value in vars(module).items()
                                                 if callable(value) or isinstance(value, types.ModuleType)}))
        for value in list(vars(module).values()):
            if isinstance(value, type) and getattr(value, "__module__", None) == name:
                entries.setdefault(id(value), (value, dict(vars(value))))
    owners = []
    for owner, namespace in entries.values():
        names = tuple(namespace)
        if not names:
            continue
        getter = operator.itemgetter(*names) if len(names) > 1 else operator.itemgetter(names[0], names[0])
        owners.append((owner, names, tuple(namespace[name] for name in names), getter,
                       len(vars(owner)) if isinstance(owner, type) else -1))
    closures = []
    for function, _code, _defaults, _keyword_defaults, cells in framework._FUNCTIONS.values():
        for cell, content in zip(function.__closure__ or (), cells, strict=False):
            closures.append((cell, content))
    modules = tuple(framework._MODULES.items())
    return tuple(owners), tuple(closures), modules


def make_integrity_check(tools: tuple[tuple, tuple, tuple]) -> Callable[[], list[str]]:
    """A sealed function that puts back every replaced tool and returns what it put back ([] when
    intact). PyTorch's own lazy wrappers (torch.manual_seed once dynamo loads, an optimizer's step on
    first use) are adopted, not reverted. Fast when nothing changed: one C-level identity
    comparison per owner."""
    import torch

    torch_folder = str(Path(torch.__file__).resolve().parent)

    def torch_wraps(new, old, _getattr=getattr, _folder=torch_folder, _range=range, _type=type, _str=str):
        value = new
        for _ in _range(4):
            code = _getattr(value, "__code__", None)
            filename = _getattr(code, "co_filename", None)
            if _type(filename) is not _str or not filename.startswith(_folder):
                return False
            value = _getattr(value, "__wrapped__", None)
            if value is old:
                return True
        return False

    def integrity(_tools=tools, _adopted={}, _module_dict=types.ModuleType.__dict__["__dict__"].__get__,
                  _class_dict=type.__dict__["__dict__"].__get__,
                  _len=len, _all=all, _map=map, _is=operator.is_, _set_class=type.__setattr__,
                  _set_module=types.ModuleType.__setattr__, _del_class=type.__delattr__, _list=list, _zip=zip,
                  _modules=sys.modules, _id=id, _KeyError=KeyError, _getattr=getattr, _wraps=torch_wraps,
                  _mro=type.__dict__["__mro__"].__get__):
        owners, closures, modules = _tools
        replaced = []
        for owner, names, values, getter, length in owners:
            is_class = length >= 0
            namespace = _class_dict(owner) if is_class else _module_dict(owner)
            try:
                current = getter(namespace)
            except _KeyError:
                current = None
            if current is not None and _all(_map(_is, current, values)) and (length < 0 or _len(namespace) == length):
                continue
            for name, value in _zip(names, values):
                now = namespace.get(name, None)
                if now is value:
                    continue
                key = (_id(owner), name)
                if now is not None and (_adopted.get(key, None) is now or _wraps(now, value)):
                    _adopted[key] = now
                    continue
                if is_class:
                    _set_class(owner, name, value)
                else:
                    _set_module(owner, name, value)
                replaced.append(f"{_getattr(owner, '__name__', '?')}.{name}")
            if is_class:
                for name in _list(namespace):
                    if name in names:
                        continue
                    key = (_id(owner), name)
                    added = namespace[name]
                    inherited = None
                    for base in _mro(owner)[1:]:
                        if name in _class_dict(base):
                            inherited = _class_dict(base)[name]
                            break
                    if _adopted.get(key, None) is added or _wraps(added, inherited):
                        _adopted[key] = added
                        continue
                    _del_class(owner, name)
                    replaced.append(f"{_getattr(owner, '__name__', '?')}.{name}")
        for cell, content in closures:
            if cell.cell_contents is not content:
                cell.cell_contents = content
                replaced.append("a closure of the checks")
        for name, module in modules:
            if _modules.get(name) is not module:
                _modules[name] = module
                replaced.append(f"sys.modules[{name!r}]")
        return replaced

    return integrity


# --- the profile guard of a sealed child -------------------------------------------------------


def make_profile_guard(code_kind: Callable[[Any], int], integrity: Callable[[], list[str]],
                       reference: dict[int, str], checks_made: dict[int, Any],
                       findings: list[str]) -> Callable[..., None]:
    """A profile function for the sealed child. It counts notebook frames; when the count drops to 0
    (notebook code returned into library or grader code) it checks and restores the tools; it
    records a call of this notebook's reference solutions (`reference`: id(code) -> name) made
    while notebook code runs, unless the object was made by a check (`checks_made`, filled here
    when a reference constructor runs outside notebook code). `findings` gets one line each."""

    def guard(frame, event, arg, _depth=[0], _kind=code_kind, _integrity=integrity, _reference=reference,
              _made=checks_made, _findings=findings, _id=id, _NOTEBOOK=NOTEBOOK, _join=", ".join):
        if event == "call":
            code = frame.f_code
            if _kind(code) == _NOTEBOOK:
                _depth[0] += 1
                return
            identity = _id(code)
            if identity not in _reference:
                return
            owner = frame.f_locals.get("self", None) if code.co_argcount else None
            if _depth[0] == 0:
                if owner is not None and code.co_name == "__init__":
                    _made[_id(owner)] = owner
                return
            if owner is not None and _id(owner) in _made:
                return
            line = f"runs the course's reference solution ({_reference[identity]}) from inside its own code"
            if line not in _findings:
                _findings.append(line)
        elif event == "return" and _kind(frame.f_code) == _NOTEBOOK:
            _depth[0] -= 1
            if _depth[0] <= 0:
                _depth[0] = 0
                replaced = _integrity()
                if replaced:
                    line = "replaced the checks' tools while a check ran: " + _join(replaced[:4])
                    if line not in _findings:
                        _findings.append(line)

    return guard


# --- seccomp: nothing runs beside a grade cell ----------------------------------------------------

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000
_REFUSED_X86_64 = {"clone3": 435, "fork": 57, "vfork": 58, "ptrace": 101, "process_vm_readv": 310,
                   "process_vm_writev": 311}
_CLONE_X86_64 = 56
_CLONE_THREAD = 0x00010000


def seccomp_program() -> bytes | None:
    """A BPF filter (x86-64; None elsewhere): no threads (clone with CLONE_THREAD; clone3 reports
    ENOSYS so the C library falls back to clone), no fork/vfork, no ptrace, no process_vm_*."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    load, jump_equal, jump_greater_equal, jump_set, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    # (label, code, true-target, false-target, k); targets are labels
    steps: list[tuple[str, int, str | None, str | None, int]] = [
        ("arch", load, None, None, 4),
        ("", jump_equal, "nr", "allow", _AUDIT_ARCH_X86_64),
        ("nr", load, None, None, 0),
        ("", jump_greater_equal, "eperm", "clone3", _X32_BIT),
        ("clone3", jump_equal, "enosys", "refused0", _REFUSED_X86_64["clone3"]),
    ]
    refused = [number for name, number in _REFUSED_X86_64.items() if name != "clone3"]
    for index, number in enumerate(refused):
        following = f"refused{index + 1}" if index + 1 < len(refused) else "clone"
        steps.append((f"refused{index}", jump_equal, "eperm", following, number))
    steps += [
        ("clone", jump_equal, "flags", "allow", _CLONE_X86_64),
        ("flags", load, None, None, 16),
        ("", jump_set, "eperm", "allow", _CLONE_THREAD),
        ("allow", ret, None, None, allow),
        ("eperm", ret, None, None, eperm),
        ("enosys", ret, None, None, enosys),
    ]
    where = {label: index for index, (label, *_rest) in enumerate(steps) if label}
    program = []
    for index, (_label, code, true, false, k) in enumerate(steps):
        jt = where[true] - index - 1 if true else 0
        jf = where[false] - index - 1 if false else 0
        program.append(struct.pack("HBBI", code, jt, jf, k))
    return b"".join(program)


def make_seccomp_installer() -> Callable[[], bool]:
    """Prepared before any notebook code runs (ctypes is refused to notebook code afterwards);
    calling the result in a forked child installs the filter there. Returns whether it did."""
    program = seccomp_program()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return lambda: False
    if program is None:
        return lambda: False
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    filters = ctypes.create_string_buffer(program, len(program))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(program) // 8, ctypes.cast(filters, ctypes.c_void_p).value)
    address = ctypes.addressof(fprog)

    def install(_prctl=prctl, _fprog=fprog, _filters=filters, _address=address, _nnp=_PR_SET_NO_NEW_PRIVS,
                _seccomp=_PR_SET_SECCOMP, _mode=_SECCOMP_MODE_FILTER) -> bool:
        if _prctl(_nnp, 1, None, 0, 0) != 0:
            return False
        return _prctl(_seccomp, _mode, _address, 0, 0) == 0

    return install


def make_signal_blocker() -> Callable[[], None]:
    """A sealed function that blocks every signal a handler could catch (a notebook's alarm handler
    must not run while the grade cell's records are written)."""
    every = set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}

    def block(_mask=signal.pthread_sigmask, _how=signal.SIG_BLOCK, _every=frozenset(every)) -> None:
        _mask(_how, _every)

    return block


__all__ = [
    "CHECK_FAILED", "EVENT", "GRADER", "LIBRARY", "NOTEBOOK", "arm", "frozen_tools", "library_roots",
    "make_audit_hook", "make_integrity_check", "make_packer", "make_profile_guard", "make_provenance",
    "make_seccomp_installer", "make_signal_blocker", "trust_loaded_code", "unpack",
]
