"""The sandbox's writable folders as the grader reaches them from outside, to empty them or put them back.

A student's notebook writes only in three folders of its sandbox: its working folder, /tmp and /dev/shm
(`isolation`). What one of the notebook's processes leaves there can reach another: a hidden test's inputs
written by one hidden part and read by the next, or a disk filled in one grade cell that every later cell then
lives with. So the grader itself, never a process of the student's, changes them (issue 39):

- `empty(folders, keep)`: before each hidden part, every folder is emptied (the folders on the way to the
  notebook's working folder stay, empty), so no hidden part starts from a state another one wrote;
- `inventory(folders)` and `restore(folders, kept)`: after each grade cell's checks, what that cell's process
  wrote (new entries, files changed) is removed, so a storm in one exercise's code costs that exercise only.

`folders` is a list of (the folder as the notebook sees it, a descriptor of it opened by the grader:
`isolation.Confined.writable_folders`). Everything is done through descriptors, one entry at a time, never
following a symbolic link the student made (a link to a host path is removed, never entered), and bounded:
a folder holding more than `MAX_ENTRIES` entries is emptied, not inventoried, and emptying stops at the
caller's deadline (TooMuch: the caller then ends the sandbox, and its files go with it).
"""

from __future__ import annotations

import contextlib
import os
import stat
import time

MAX_ENTRIES = 20_000  # entries an inventory records or a restore removes (the zygote's own caches are a few dozen)
MAX_EMPTIED = 10_000_000  # entries emptying removes before the caller ends the sandbox instead (30 µs each on tmpfs)
MAX_DEPTH = 64  # folders opened at once while emptying; deeper ones are moved up first
Folders = list[tuple[str, int]]
Inventory = dict[str, dict[str, tuple[int, ...]]]  # folder -> {relative path: what the entry was}


def _open_folder(parent: int, name: str) -> int | None:
    """A descriptor of the folder `name` in `parent` (made readable and writable for its owner, the grader's
    uid, first when it must be), or None when it is gone or is not a folder."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=parent)
    except PermissionError:
        _own(parent, name)
        with contextlib.suppress(OSError):
            return os.open(name, flags, dir_fd=parent)
    except OSError:
        pass
    return None


def _own(parent: int, name: str, mode: int = 0o700) -> None:
    """chmod `name` (never through a symbolic link): a folder its student made unreadable or unwritable."""
    try:
        path = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError:
        return
    try:
        if stat.S_ISDIR(os.fstat(path).st_mode):
            os.chmod(f"/proc/self/fd/{path}", mode)
    except OSError:
        pass
    finally:
        os.close(path)


def _set_mode(folder: int, mode: int) -> None:
    with contextlib.suppress(OSError):
        if stat.S_IMODE(os.fstat(folder).st_mode) != mode:
            os.chmod(f"/proc/self/fd/{folder}", mode)


class TooMuch(Exception):
    """A folder held more entries than the caller allows, or removing them took past its deadline: the caller
    ends the sandbox instead (its files go with it)."""


class _Budget:
    """How many entries may still go, and until when (time.monotonic()); TooMuch past either."""

    def __init__(self, entries: int, deadline: float | None = None) -> None:
        self.entries, self.deadline = entries, deadline

    def spend(self) -> None:
        self.entries -= 1
        if self.entries < 0 or (self.deadline is not None and self.entries % 256 == 0
                                and time.monotonic() > self.deadline):
            raise TooMuch


def _remove(parent: int, name: str, top: int, budget: _Budget) -> int:
    """Remove `name` from `parent`, a whole tree if it is a folder; returns how many entries went. A folder
    MAX_DEPTH levels down is moved up into `top` (a rename: the same file system) and removed from there, so
    that no more than MAX_DEPTH folders are open at once however deep the tree. TooMuch once `budget` is spent."""
    removed = 0
    pending = [(parent, name)]
    while pending:
        moved: list[str] = []
        for where, what in pending:
            removed += _remove_tree(where, what, top, moved, budget)
        pending = [(top, flattened) for flattened in moved]
    return removed


def _unlink(parent: int, name: str) -> bool | None:
    """Remove a file or link: True when it went, False when `name` is a folder, None when it could not go."""
    for attempt in range(2):
        try:
            os.unlink(name, dir_fd=parent)
            return True
        except IsADirectoryError:
            return False
        except PermissionError:  # Linux says EPERM for a folder too; or its folder was made read-only
            try:
                if stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                    return False
            except OSError:
                return None
            if attempt == 0:
                _set_mode(parent, 0o700)
        except OSError:
            return None
    return None


def _remove_tree(parent: int, name: str, top: int, moved: list[str], budget: _Budget) -> int:
    removed = 0
    stack: list[tuple[int, str, int, list[str]]] = []  # (parent, name, descriptor, names left in it)
    current_parent, current_name = parent, name
    try:
        while True:
            budget.spend()
            gone = _unlink(current_parent, current_name)
            if gone:
                removed += 1
            elif gone is False and len(stack) >= MAX_DEPTH:
                flattened = f".course-moved-{os.urandom(8).hex()}"
                with contextlib.suppress(OSError):
                    os.rename(current_name, flattened, src_dir_fd=current_parent, dst_dir_fd=top)
                    moved.append(flattened)
            elif gone is False:
                folder = _open_folder(current_parent, current_name)
                if folder is not None:
                    _set_mode(folder, 0o700)
                    try:
                        names = os.listdir(folder)
                    except OSError:
                        names = []
                    stack.append((current_parent, current_name, folder, names))
            # the next name: in the innermost open folder, or that folder itself once it is empty
            while stack and not stack[-1][3]:
                folder_parent, folder_name, folder, _ = stack.pop()
                os.close(folder)
                try:
                    os.rmdir(folder_name, dir_fd=folder_parent)
                    removed += 1
                except OSError:
                    pass
            if not stack:
                return removed
            current_parent, current_name = stack[-1][2], stack[-1][3].pop()
    finally:
        for _, _, folder, _ in stack:
            os.close(folder)


def empty(folders: Folders, keep: dict[str, list[str]] | None = None, limit: int = MAX_ENTRIES,
          deadline: float | None = None) -> int:
    """Remove everything in each folder but the chain of folders named in `keep[folder]` (the way to the
    notebook's working folder: ["work", "notebook"] keeps work/ and work/notebook/, emptied). Returns the number
    of entries removed; TooMuch past `limit` of them, or past `deadline` (time.monotonic())."""
    removed, budget = 0, _Budget(limit, deadline)
    for name, descriptor in folders:
        chain = list((keep or {}).get(name, []))
        current, opened = descriptor, []
        try:
            while True:
                kept = chain.pop(0) if chain else None
                for _ in range(3):  # what a live process of the student's adds meanwhile: a few rounds, no more
                    try:
                        entries = [entry for entry in os.listdir(current) if entry != kept]
                    except OSError:
                        break
                    if not entries:
                        break
                    for entry in entries:
                        removed += _remove(current, entry, current, budget)
                if kept is None:
                    break
                inner = _open_folder(current, kept)
                if inner is None:
                    break
                _set_mode(inner, 0o755)
                opened.append(inner)
                current = inner
        finally:
            for descriptor_open in opened:
                os.close(descriptor_open)
    return removed


def _describe(info: os.stat_result) -> tuple[int, ...]:
    """What an entry is, as far as `restore` tells: a folder by its inode (what it holds is compared entry by
    entry), anything else by its inode, change time and size (a write changes the time; one through a shared
    mapping of a tmpfs file does not, so such a file is not put back: a grade cell only overwrites its own)."""
    if stat.S_ISDIR(info.st_mode):
        return (stat.S_IFDIR, info.st_ino)
    return (stat.S_IFMT(info.st_mode), info.st_ino, info.st_ctime_ns, info.st_size)


def _walk(folder: int, limit: int) -> dict[str, tuple[int, ...]] | None:
    """{relative path: `_describe`} of everything below `folder`, None past `limit` entries."""
    found: dict[str, tuple[int, ...]] = {}
    pending: list[tuple[int, str, bool]] = [(folder, "", False)]  # (descriptor, its path, close it after)
    try:
        while pending:
            current, prefix, owned = pending.pop()
            try:
                with os.scandir(current) as entries:
                    for entry in entries:
                        path = prefix + entry.name
                        try:
                            info = entry.stat(follow_symlinks=False)
                        except OSError:
                            continue
                        found[path] = _describe(info)
                        if len(found) > limit:
                            return None
                        if stat.S_ISDIR(info.st_mode):
                            inner = _open_folder(current, entry.name)
                            if inner is not None:
                                pending.append((inner, path + "/", True))
            finally:
                if owned:
                    os.close(current)
    finally:
        for current, _, owned in pending:
            if owned:
                os.close(current)
    return found


def inventory(folders: Folders, limit: int = MAX_ENTRIES) -> Inventory | None:
    """What each folder holds now (for `restore`), or None when there is too much to record (the caller then
    leaves the folders as they are)."""
    found: Inventory = {}
    for name, descriptor in folders:
        entries = _walk(descriptor, limit)
        if entries is None:
            return None
        found[name] = entries
    return found


def restore(folders: Folders, kept: Inventory, limit: int = MAX_ENTRIES) -> int:
    """Remove what is new or changed since `inventory` returned `kept` (what was removed stays removed). Returns
    the number of entries removed; TooMuch past `limit` of them."""
    removed, budget = 0, _Budget(limit)
    for name, descriptor in folders:
        before = kept.get(name)
        if before is None:
            continue
        pending: list[tuple[int, str, bool]] = [(descriptor, "", False)]
        while pending:
            current, prefix, owned = pending.pop()
            try:
                try:
                    names = os.listdir(current)
                except OSError:
                    names = []
                for entry in names:
                    path = prefix + entry
                    try:
                        info = os.stat(entry, dir_fd=current, follow_symlinks=False)
                    except OSError:
                        continue
                    if before.get(path) != _describe(info):
                        removed += _remove(current, entry, current, budget)
                    elif stat.S_ISDIR(info.st_mode):
                        inner = _open_folder(current, entry)
                        if inner is not None:
                            pending.append((inner, path + "/", True))
            finally:
                if owned:
                    os.close(current)
    return removed
