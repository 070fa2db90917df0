"""Built-in example submissions: a correct one, a blank one and one with a single known bug.

They are made from the committed notebooks at run time (never stored), so they can't go stale.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat

from quality.mistakes import Edit, is_solution

# One representative bug per stage for the demo and the end-to-end test; the full mistake
# catalog lives with the checks.
KNOWN_BUGS: dict[str, Edit] = {bug.assignment: bug for bug in [
    Edit(
        "00_why_attention",
        "softmax over the queries instead of the source positions",
        "weights = torch.softmax(scores, dim=-1)",
        "weights = torch.softmax(scores, dim=1)",
    ),
    Edit(
        "01_positional_encoding",
        "cos written to the even columns as well (no sin)",
        "pe[:, 0::2] = torch.sin(position * div_term)",
        "pe[:, 0::2] = torch.cos(position * div_term)",
    ),
    Edit(
        "02_attention",
        "scores not divided by sqrt(d_k)",
        "scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)",
        "scores = Q @ K.transpose(-2, -1)",
    ),
    Edit(
        "03_blocks",
        "no residual connection around the feed-forward sublayer (encoder)",
        "x = self.norm2(x + self.dropout(self.feed_forward(x)))",  # only EncoderBlock has this line
        "x = self.norm2(self.dropout(self.feed_forward(x)))",
    ),
    Edit(
        "04_transformer",
        "encoder embeddings not scaled by sqrt(d_model)",
        "x = self.embedding(x) * math.sqrt(self.d_model)  # (batch, src_len, d_model)",
        "x = self.embedding(x)  # (batch, src_len, d_model)",
    ),
    Edit(
        "05_training",
        "target not shifted: the decoder is asked to predict the token it already reads",
        "tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]",
        "tgt_in, tgt_out = tgt[:, :-1], tgt[:, :-1]",
    ),
    Edit(
        "06_decoding",
        "finished sentences are not padded: they keep producing words after <eos>",
        "        next_token = next_token.masked_fill(finished, pad_idx)  # finished sentences only get padding\n",
        "",
    ),
    Edit(
        "07_fast_and_better_decoding",
        "the cached step adds the positional encoding of position 0 at every step",
        "x = x + decoder.positional_encoding.pe[:, position:position + 1]  # the signal of THIS position",
        "x = decoder.positional_encoding(x)",
    ),
]}


def student_submissions(root: Path, assignments: list[str]) -> dict[str, dict[str, nbformat.NotebookNode]]:
    """{student: {assignment: notebook}} for the three example students."""
    submissions: dict[str, dict[str, nbformat.NotebookNode]] = {"ada": {}, "blake": {}, "chen": {}}
    for assignment in assignments:
        name = f"{assignment}/{assignment}.ipynb"
        solution = nbformat.read(root / "solutions" / name, as_version=4)
        submissions["ada"][assignment] = solution  # everything right
        submissions["blake"][assignment] = nbformat.read(root / "notebooks" / name, as_version=4)  # blank
        buggy = nbformat.read(root / "solutions" / name, as_version=4)
        if assignment in KNOWN_BUGS:
            KNOWN_BUGS[assignment].apply(buggy)
        submissions["chen"][assignment] = buggy  # one bug per stage
    return submissions


# --- a class folder as an instructor receives it --------------------------------------------------

HOSTILE_CELLS = {
    "reads other students, the hidden tests and the instructor's files": (
        "import glob, os\n"
        "leaks = []\n"
        "for pattern in {patterns!r}:\n"
        "    for path in glob.glob(pattern, recursive=True):\n"
        "        try:\n"
        "            leaks.append((path, len(open(path, 'rb').read())))\n"
        "        except OSError:\n"
        "            pass\n"
        "print('LEAKED:', leaks)\n"
        "print('GRADER ENVIRONMENT:', sorted(name for name in os.environ if name.startswith('GRADER_')))"
    ),
    "writes the gradebook and plants symlinks to it": (
        "import os\n"
        "try:\n"
        "    open({gradebook!r}, 'ab').write(b'x')\n"
        "    print('WROTE GRADEBOOK')\n"
        "except OSError as error:\n"
        "    print('gradebook write blocked:', type(error).__name__)\n"
        "for name in ('{assignment}.ipynb', 'gradebook.db', 'feedback'):\n"
        "    try:\n"
        "        os.symlink({gradebook!r}, name)\n"
        "    except OSError:\n"
        "        pass\n"
        "print('planted links:', sorted(os.listdir('.')))"
    ),
    "reaches the network and the grader's sockets": (
        "import glob, socket\n"
        "reached = []\n"
        "for address in [('pypi.org', 443), ('127.0.0.1', 22), ('127.0.0.1', 5432), ('127.0.0.1', 8888)]:\n"
        "    try:\n"
        "        socket.create_connection(address, timeout=3)\n"
        "        reached.append(address)\n"
        "    except OSError:\n"
        "        pass\n"
        "for path in glob.glob('/run/**/*.sock', recursive=True) + glob.glob('/var/run/*.sock'):\n"
        "    try:\n"
        "        socket.socket(socket.AF_UNIX).connect(path)\n"
        "        reached.append(path)\n"
        "    except OSError:\n"
        "        pass\n"
        "print('NETWORK REACHED' if reached else 'network blocked:', reached)"
    ),
    "allocates too much memory": "hoard = bytearray(64 * 2**30)",
    "fills the disk": (
        "written = {{}}\n"
        "for folder in ('.', '/tmp'):\n"
        "    written[folder] = 0\n"
        "    try:\n"
        "        with open(folder + '/filler', 'wb') as handle:\n"
        "            for _ in range(4096):\n"
        "                handle.write(b'x' * 2**20)\n"
        "                written[folder] += 1\n"
        "    except OSError as error:\n"
        "        print('disk full in', folder, 'after', written[folder], 'MiB:', type(error).__name__)"
    ),
    "re-patches the checks from a thread": (
        "import threading, time, torch\n"
        "from transformer_course.checks import framework\n"
        "def patch_forever():\n"
        "    while True:\n"
        "        framework.fail = lambda *args, **kwargs: None\n"
        "        torch.allclose = lambda *args, **kwargs: True\n"
        "        time.sleep(0.0005)\n"
        "threading.Thread(target=patch_forever, daemon=True).start()"
    ),
    "rewrites every later cell with an input transformer": (
        "shell = globals()['get_' + 'ipython']()\n"
        "getattr(shell, 'input_' + 'transformers_post').append(lambda lines: lines)  # harmless here"
    ),
    "prints a flood": "print('spam ' * 2_000_000)",
    "floods standard error at the descriptor": (
        "import os\n"
        "for _ in range(64):\n"
        "    os.write(2, b'noise ' * 2**20)  # 384 MiB at the grader's log, which keeps a bounded tail"
    ),
    "leaves processes and zombies behind": (
        "import os, subprocess, sys, time\n"
        "daemon = subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True: time.sleep(0.1)'],\n"
        "                          start_new_session=True)\n"
        "for _ in range(20):\n"
        "    if os.fork() == 0:\n"
        "        os._exit(0)  # never waited for: a zombie\n"
        "time.sleep(0.2)\n"
        "print('left behind:', daemon.pid)"
    ),
    "plants hooks on the interpreter and torch": (
        "import signal, sys\n"
        "from torch.overrides import TorchFunctionMode\n"
        "sys.addaudithook(lambda event, args: None)\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "class Quiet(TorchFunctionMode):\n"
        "    def __torch_function__(self, func, types, args=(), kwargs=None):\n"
        "        return func(*args, **(kwargs or {{}}))\n"
        "Quiet().__enter__()"
    ),
    "poisons caches: a fake torch, a .pth file, matplotlib's config, __pycache__": (
        "import os, tempfile\n"
        "for folder in ('.', tempfile.gettempdir(), os.path.expanduser('~')):\n"
        "    for name, text in (('torch.py', 'raise SystemExit(\"poisoned\")'), ('sitecustomize.py', 'import os'),\n"
        "                       ('evil.pth', 'import os; os.environ[\"POISONED\"] = \"1\"')):\n"
        "        try:\n"
        "            open(os.path.join(folder, name), 'w').write(text)\n"
        "        except OSError:\n"
        "            pass\n"
        "os.makedirs(os.path.join(tempfile.gettempdir(), 'matplotlib'), exist_ok=True)\n"
        "open(os.path.join(tempfile.gettempdir(), 'matplotlib', 'matplotlibrc'), 'w').write('backend: nonsense')"
    ),
    "makes a hundred thousand files": (
        "import os\n"
        "os.makedirs('many', exist_ok=True)\n"
        "made = 0\n"
        "try:\n"
        "    for made in range(100_000):\n"
        "        open(f'many/{{made}}', 'w').close()\n"
        "except OSError as error:\n"
        "    print('stopped after', made, type(error).__name__)\n"
        "print('files made:', made)"
    ),
    "shows HTML, script and terminal escapes": (
        "from IPython.display import HTML, Javascript, Markdown, display\n"
        "display(HTML('<img src=x onerror=\"document.title=1\"><script>document.title=2</script>'))\n"
        "display(Javascript('document.title = 3'))\n"
        "display(Markdown('<script>document.title=4</script>'))\n"
        "print('\\x1b[2J\\x1b]0;owned\\x07<script>document.title=5</script>')"
    ),
    "keeps two cores busy for a while": (
        "import threading, time\n"
        "def spin(seconds=4.0):\n"
        "    end = time.time() + seconds\n"
        "    while time.time() < end:\n"
        "        pass\n"
        "for _ in range(4):\n"
        "    threading.Thread(target=spin, daemon=True).start()"
    ),
    "kills its kernel": "import os\nos._exit(1)",
}


def write_example_class(course: Path, folder: Path, assignment: str, class_dir: Path, submissions: Path) -> None:
    """A submissions folder with one student of each kind the batch grader must cope with.

    ada: correct; blake: blank; chen: one known bug; dana: Canvas-style flat file with all
    metadata stripped (correct); eve: a visible test cell deleted (correct otherwise); finn: broken
    JSON; gus: an exercise cell that loops forever after its definitions; hana: correct but hostile
    (tries to read others' work, the hidden tests and the instructor's files, write the gradebook and
    plant symlinks to it, reach the network and the grader's sockets, allocate 64 GiB, fill the disk,
    re-patch the checks from a thread, hook IPython, flood the output, kill its process and print the
    input history, hidden tests included, into its feedback); two who try to take a classmate's place
    with a blank notebook handed in later: mallory names her file as Canvas names dana's, in her own
    folder, and a folder ADA differs from ada's only by case (before issue 19, each replaced the
    classmate's notebook as the newer one of the same student).
    """
    solution = nbformat.read(course / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)
    release = nbformat.read(course / "notebooks" / assignment / f"{assignment}.ipynb", as_version=4)

    def save(notebook: nbformat.NotebookNode, relative: str) -> None:
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, path)

    def copy(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
        return nbformat.from_dict(json.loads(json.dumps(notebook)))

    save(solution, f"ada/{assignment}.ipynb")
    save(release, f"blake/{assignment}.ipynb")
    save(KNOWN_BUGS[assignment].apply(copy(solution)) if assignment in KNOWN_BUGS else release,
         f"chen/{assignment} (1).ipynb")
    stripped = copy(solution)
    for cell in stripped.cells:
        cell.metadata = {}
    save(stripped, f"dana_12345_67890_{assignment}.ipynb")
    deleted = copy(solution)
    first_test = next(i for i, c in enumerate(deleted.cells) if c.metadata.get("nbgrader", {}).get("grade"))
    del deleted.cells[first_test]
    save(deleted, f"eve/Copy of {assignment}.ipynb")
    broken = folder / "finn" / f"{assignment}.ipynb"
    broken.parent.mkdir(parents=True, exist_ok=True)
    broken.write_text(nbformat.writes(solution)[:5000], encoding="utf-8")
    looping = copy(solution)
    first_solution = next(c for c in looping.cells if is_solution(c))
    first_solution.source += "\n\nwhile True:  # a runaway loop\n    pass\n"
    save(looping, f"gus/{assignment}.ipynb")
    hostile = copy(solution)
    patterns = [str(class_dir / "submitted" / "**" / "*.ipynb"), str(class_dir / "autograded" / "ada" / "**" / "*"),
                str(course / "solutions" / "**" / "*.ipynb"), str(submissions / "**" / "*.ipynb")]
    patterns += ["/root/*", "/home/*/*", str(course / "lessons" / "*.py"), str(course / ".git" / "config")]
    sources = [text.format(patterns=patterns, gradebook=str(class_dir / "gradebook.db"), assignment=assignment)
               for text in HOSTILE_CELLS.values()]
    hostile.cells[first_test:first_test] = [nbformat.v4.new_code_cell(source) for source in sources]
    hostile.cells.append(nbformat.v4.new_code_cell("print('HISTORY:', In)  # would copy hidden tests into feedback"))
    save(hostile, f"hana/{assignment}.ipynb")
    later = (folder / f"ada/{assignment}.ipynb").stat().st_mtime + 3600  # newer than every honest file
    for impostor in (f"mallory/dana_12345_67890_{assignment}.ipynb", f"ADA/{assignment}.ipynb"):
        save(release, impostor)
        os.utime(folder / impostor, (later, later))


def main(argv: list[str] | None = None) -> int:
    """python -m quality.examples FOLDER [--assignment 02_attention]: write the example class."""
    import argparse

    from transformer_course.authoring import repository_root

    parser = argparse.ArgumentParser(description=write_example_class.__doc__)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--assignment", default="02_attention")
    parser.add_argument("--class-dir", type=Path, help="the --class-dir you will grade into (for the hostile probes)")
    arguments = parser.parse_args(argv)
    root = repository_root()
    class_dir = arguments.class_dir or root / "autograde" / "class"
    write_example_class(root, arguments.folder, arguments.assignment, class_dir.resolve(), arguments.folder.resolve())
    print(f"wrote ten example students to {arguments.folder}; grade them with\n"
          f"  python -m transformer_course.grading.batch {arguments.folder} --assignment {arguments.assignment}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
