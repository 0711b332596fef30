"""Every command that README.md, docs/user_guide.md and the demo's summary tell a user to type,
run as a user would, failing on any line of output that mentions a warning.

The commands run from a copy of the repository root (``pyproject.toml``, ``dagster.yaml``,
``workspace.yaml``, the package linked in) in a temporary directory, with the defaults the README
describes (``./.corr_pipeline``, ``DAGSTER_HOME`` the repository root), ``XDG_RUNTIME_DIR`` unset
and nothing filtering Python's warnings, on a tiny synthetic universe (40 symbols x 300 days).

Which commands: every line of the docs' ```bash blocks that runs ``corr-pipeline``, ``dg`` or
``dagster`` (the ``dg``/``dagster`` lines verbatim; ``corr-pipeline`` lines with their
placeholders and example symbols filled in and the universe shrunk), the two commands the demo
prints to open the UI, the queries its summary ends with, and one concrete run of every ``corr-pipeline``/``dg``/``dagster``
command the docs name inline (``COMMANDS``). A command named in the docs and missing here fails
the test, so the list cannot drift from the docs. The superseded ``dagster dev`` may be named,
never taught in a ```bash block.

The user guide's walk-through for a new team (its section :data:`WALK_THROUGH`) is run apart, as
the user follows it: its ```bash blocks in order, verbatim, in one bash session from a fresh copy
of the repository (its exports and shell variables carry over from block to block; the backfill
command waits for its runs itself); the only change is a free port for the UI instead of 3000.

``corr-pipeline ui`` (the demo's line, started like a background job of a non-interactive shell,
SIGINT ignored, stopped by SIGTERM) runs on a free local port, concurrently with the other
commands, until its web server answers the token it printed; then every process of it must be
gone within ``STOP_BOUND_S``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow  # every documented command: outside `pytest -m "not slow"`

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "user_guide.md"
#: The user guide's walk-through for a new team, up to the next ``## `` heading.
WALK_THROUGH = "## 13. Adopting the pipeline on your own data"
WALK_THROUGH_TIMEOUT_S = 1800.0
DOCS = [REPO / "README.md", REPO / "docs" / "user_guide.md"]
PROGRAMS = ("corr-pipeline", "dg", "dagster")
#: May be named in prose (as superseded), never taught in a ```bash block.
SUPERSEDED = {
    "dagster dev",
    "dg dev",
    "dagster definitions validate",
    "dagster asset materialize",
}
WARNING = re.compile(r"warn", re.IGNORECASE)
#: The demo's verdict of publication_freshness when it failed with severity WARN (its prices end
#: before the latest session), said as the UI says it: a result, not a warning of the software.
CHECK_VERDICT = re.compile(r"\s*publication_freshness failed \(warning; ")
#: Exports of the docs' bash blocks the commands here follow; the others configure another price
#: source (their own section and tests).
FOLLOWED_EXPORTS = {"DAGSTER_HOME", "CORR_PIPELINE_HOME"}
IGNORED_EXPORTS = {
    "CORR_PIPELINE_PRICES_TABLE",
    "CORR_PIPELINE_PRICES_COLUMNS",
    "CORR_PIPELINE_PRICES_TIMEZONE",
}
#: The docs' example symbols (3,000-symbol demo) -> symbols of the tiny universe (an injected pair).
SYMBOLS = {"S00242": "S00003", "S01863": "S00007", "SYMBOL": "S00003", "A B": "S00003 S00007"}
UI_ANSWER_TIMEOUT_S = 300.0
STOP_BOUND_S = 60.0
COMMAND_TIMEOUT_S = 600.0

#: One concrete run of each corr-pipeline / dg / dagster command (by signature: the program and
#: its sub-command words). ``None``: run by the background UI runners.
COMMANDS: dict[str, list[str] | None] = {
    "corr-pipeline db init": ["corr-pipeline db init"],
    "corr-pipeline db upgrade": ["corr-pipeline db upgrade"],
    "corr-pipeline db status": ["corr-pipeline db status"],
    "corr-pipeline db url": ["corr-pipeline db url"],
    "corr-pipeline db downgrade": ["corr-pipeline db downgrade {head}"],
    "corr-pipeline db prune": ["corr-pipeline db prune --before 2026-11-02 --dry-run"],
    "corr-pipeline prices import": ["corr-pipeline prices import prices.csv"],
    "corr-pipeline prices synth": ["corr-pipeline prices synth --symbols 40 --days 300 --seed 7"],
    "corr-pipeline demo": ["corr-pipeline demo"],
    "corr-pipeline query snapshots": ["corr-pipeline query snapshots"],
    "corr-pipeline query peers": [
        "corr-pipeline query peers S00003 --json",
        'corr-pipeline query peers "S00003" --date 2026-11-27',
    ],
    "corr-pipeline query cluster": ["corr-pipeline query cluster S00003"],
    "corr-pipeline query lead-lag": ["corr-pipeline query lead-lag S00003"],
    "corr-pipeline query corr": ["corr-pipeline query corr S00003 S00007 --date 2026-11-27"],
    "corr-pipeline query changes": [
        "corr-pipeline query changes",
        "corr-pipeline query changes S00003 --date 2026-11-27 --json",
    ],
    "corr-pipeline query quality": [
        "corr-pipeline query quality",
        "corr-pipeline query quality --date 2026-11-27 --json",
    ],
    "corr-pipeline store list": ["corr-pipeline store list", "corr-pipeline store list --json"],
    "corr-pipeline store prune": ["corr-pipeline store prune --keep 5 --dry-run"],
    "corr-pipeline store verify": [
        "corr-pipeline store verify",
        "corr-pipeline store verify --partition 2026-11-27 --json",
    ],
    "corr-pipeline bench": ["corr-pipeline bench --n 40 --t 60"],
    "corr-pipeline backfill": ["corr-pipeline backfill --from 2026-11-24 --to 2026-11-27"],
    "corr-pipeline concurrency show": ["corr-pipeline concurrency show --n 24000 --t 252"],
    "corr-pipeline concurrency set": [
        "corr-pipeline concurrency set --n 24000 --t 252",
        "corr-pipeline concurrency set 2",
    ],
    "corr-pipeline dask certs": [
        "corr-pipeline dask certs",
        "corr-pipeline dask certs dask-tls-elsewhere --port 18786 --days 30",
    ],
    "corr-pipeline ui": None,
    "dg check defs": ["dg check defs"],
    "dg list defs": ["dg list defs"],
    "dg launch": ["dg launch --job snapshot_job --partition 2026-11-27"],
    "dagster job backfill": [
        "dagster job backfill -w workspace.yaml -j snapshot_job --from 2026-11-24 --to "
        "2026-11-25 --noprompt"
    ],
    "dagster schedule start": [
        "dagster schedule start nightly_snapshot_schedule -w workspace.yaml"
    ],
    "dagster instance concurrency set": [
        "dagster instance concurrency set corr_pipeline_snapshot 2"
    ],
    "dagster schedule list": ["dagster schedule list -w workspace.yaml"],
    "dagster sensor start": ["dagster sensor start prices_ready_sensor -w workspace.yaml"],
    "dagster sensor stop": ["dagster sensor stop prices_ready_sensor -w workspace.yaml"],
    "dagster schedule stop": ["dagster schedule stop nightly_snapshot_schedule -w workspace.yaml"],
}
#: Run after the UIs are gone (their daemon would run the backfills' queued runs) and the rest.
LAST = (
    "dagster ",
    "corr-pipeline backfill",
    "corr-pipeline db prune",
    "corr-pipeline store prune",
    "corr-pipeline db down",
)
#: Run first, in this order (the universe, then the demo on it).
FIRST = (
    "corr-pipeline db init",
    "corr-pipeline db url",
    "corr-pipeline prices import",
    "corr-pipeline prices synth",
    "corr-pipeline demo",
)


# ------------------------------------------------------------------------------------------------
# What the docs say
# ------------------------------------------------------------------------------------------------


def signature(command: str) -> str:
    """The program and up to three sub-command words: ``corr-pipeline query peers``."""
    words = shlex.split(command.replace("...", ""))
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value prefixes
        words.pop(0)
    if not words or words[0] not in PROGRAMS:
        return ""
    out = [words[0]]
    for word in words[1:4]:
        if not re.fullmatch(r"[a-z][a-z-]*", word):
            break
        out.append(word)
    return " ".join(out)


def fenced_blocks(text: str, language: str) -> list[list[str]]:
    """The lines of each ```language block, dedented by the fence's indentation."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    indent = 0
    for line in text.splitlines():
        stripped = line.strip()
        if current is None and stripped == f"```{language}":
            current, indent = [], len(line) - len(line.lstrip())
        elif current is not None and stripped.startswith("```"):
            blocks.append(current)
            current = None
        elif current is not None:
            head = line[:indent]
            current.append(line[indent:].rstrip() if not head.strip() else line.strip())
    return blocks


def _strip_comment(line: str) -> str:
    # the docs' comments follow two or more spaces; no documented command has " #" in a quote
    return re.split(r"\s{2,}#|^#", line, maxsplit=1)[0].strip()


def split_walk_through(text: str) -> tuple[str, str]:
    """(``text`` without the :data:`WALK_THROUGH` section, that section); ``""`` when absent."""
    start = text.find("\n" + WALK_THROUGH + "\n")
    if start < 0:
        return text, ""
    end = text.find("\n## ", start + 1)
    end = len(text) if end < 0 else end
    return text[:start] + text[end:], text[start:end]


def bash_lines(text: str) -> list[str]:
    """The command lines of the ```bash blocks (comments removed, continuations joined, here
    documents left out, one entry per ``&&``-separated command)."""
    out = []
    for block in fenced_blocks(text, "bash"):
        joined, pending = [], ""
        here_end: str | None = None
        for raw in block:
            if here_end is not None:  # a here document's line: input, not a command
                here_end = None if raw.strip() == here_end else here_end
                continue
            line = _strip_comment(raw.strip())
            here = re.search(r"<<-?\s*(['\"]?)(\w+)\1", line)
            if here:
                here_end = here.group(2)
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            joined.append(pending + line)
            pending = ""
        for line in joined:
            out.extend(part.strip() for part in line.split("&&") if part.strip())
    return out


def inline_commands(text: str) -> list[str]:
    return [m for m in re.findall(r"`([^`\n]+)`", text) if m.split(" ")[0] in PROGRAMS]


def documented() -> tuple[list[str], set[str]]:
    """(the bash-block lines outside the walk-through, the signatures of every command named
    anywhere, the walk-through's included)."""
    lines: list[str] = []
    signatures: set[str] = set()
    for path in DOCS:
        text = path.read_text()
        rest, walk = split_walk_through(text)
        lines += bash_lines(rest)
        signatures |= {signature(c) for c in inline_commands(text)}
        signatures |= {signature(line) for line in bash_lines(walk)}
    signatures |= {signature(line) for line in lines}
    # a program alone is no command (`dg`, `corr-pipeline --debug ...`)
    return lines, signatures - {"", *PROGRAMS}


def walk_through_signatures() -> set[str]:
    """The signatures of the commands the walk-through's ```bash blocks run."""
    _, walk = split_walk_through(GUIDE.read_text())
    return {signature(line) for line in bash_lines(walk)} - {"", *PROGRAMS}


def concrete(line: str) -> str:
    """A documented corr-pipeline line made runnable here: placeholders and example symbols
    filled in, optional ``[...]`` parts dropped, the universe shrunk."""
    line = re.sub(r"\s*\[[^\]]*\]", "", line)
    for doc, here in SYMBOLS.items():
        line = re.sub(rf"\b{doc}\b", here, line)
    line = re.sub(r"--symbols \d+", "--symbols 40", line)
    line = re.sub(r"--n \d+ --t \d+", "--n 40 --t 60", line)
    for placeholder, value in {"D": "2026-11-27", "DATE": "2026-11-02", "K": "5"}.items():
        line = re.sub(rf"(?<= ){placeholder}\b", value, line)
    return line


# ------------------------------------------------------------------------------------------------
# Running them
# ------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    command: str
    code: int | None
    output: str
    seconds: float
    problems: list[str] = field(default_factory=list)


def _warnings(output: str) -> list[str]:
    return [
        line
        for line in output.splitlines()
        if WARNING.search(line) and not CHECK_VERDICT.match(line)
    ]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(port: int, token: str) -> bool:
    """Whether the web server on ``port`` answers a request carrying ``token`` (``""``: none)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/server_info",
        headers={"Authorization": f"Bearer {token}"} if token else {},
    )
    try:
        with urllib.request.urlopen(request, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _printed_token(log: Path) -> str:
    """The token a UI printed in ``log`` (``""`` before it did)."""
    found = re.search(r"\?token=([A-Za-z0-9_-]+)", log.read_text())
    return found.group(1) if found else ""


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.NoSuchProcess:
            pass
    return alive


class Project:
    """A repository root in ``tmp`` with the environment the README sets up."""

    def __init__(self, tmp: Path) -> None:
        self.root = (tmp / "repo").resolve()
        self.root.mkdir()
        for name in ("pyproject.toml", "dagster.yaml", "workspace.yaml"):
            (self.root / name).write_bytes((REPO / name).read_bytes())
        (self.root / "corr_pipeline").symlink_to(REPO / "corr_pipeline")
        guide = (REPO / "docs" / "user_guide.md").read_text()
        (self.root / "prices.csv").write_text("\n".join(fenced_blocks(guide, "csv")[0]) + "\n")
        snapshot_yaml = next(b for b in fenced_blocks(guide, "yaml") if b[0] == "# snapshot.yaml")
        (self.root / "snapshot.yaml").write_text("\n".join(snapshot_yaml) + "\n")
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("CORR_PIPELINE_", "DAGSTER_", "PYTEST_"))
            and k not in ("XDG_RUNTIME_DIR", "PYTHONWARNINGS", "COLUMNS")
        }
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
        )
        self.env = env

    def export(self, line: str) -> None:
        """Follow a documented ``export NAME=value`` (value expanded by bash, here)."""
        name = line.split()[1].split("=", 1)[0]
        assert name in FOLLOWED_EXPORTS | IGNORED_EXPORTS, f"unknown documented export: {line}"
        if name in FOLLOWED_EXPORTS:
            value = subprocess.run(
                ["bash", "-c", f'{line}; printf %s "${name}"'],
                cwd=self.root,
                env=self.env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            self.env[name] = value

    def run(self, command: str, timeout: float = COMMAND_TIMEOUT_S) -> Outcome:
        start = time.monotonic()
        proc = subprocess.run(
            ["bash", "-c", command],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        out = Outcome(command, proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start)
        if proc.returncode != 0:
            out.problems.append(f"exit status {proc.returncode}")
        out.problems += [f"warning: {w}" for w in _warnings(out.output)]
        return out

    def serve(self, command: str) -> Outcome:
        """Start a UI command like ``cmd &`` in a non-interactive shell (SIGINT ignored) on a
        free port, wait until its web server answers the token it printed, stop it by SIGTERM
        as the README says, and check that every process of it is gone."""
        port = _free_port()
        start = time.monotonic()
        log = self.root / f"serve-{port}.log"
        with open(log, "w") as sink:

            def ignore_sigint() -> None:  # a background job of a non-interactive shell
                signal.signal(signal.SIGINT, signal.SIG_IGN)

            words = shlex.split(command)
            env = dict(self.env)
            while "=" in words[0]:  # NAME=value prefixes, as the shell applies them
                name, value = words.pop(0).split("=", 1)
                env[name] = value
            proc = subprocess.Popen(
                [*words, "--port", str(port)],
                cwd=self.root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # so that the test can clean up whatever happens
                preexec_fn=ignore_sigint,  # noqa: PLW1509
            )
            problems: list[str] = []
            tree: list[psutil.Process] = []
            try:
                deadline = time.monotonic() + UI_ANSWER_TIMEOUT_S
                while not _answers(port, _printed_token(log)):
                    if proc.poll() is not None:
                        problems.append(f"exited with {proc.returncode} before answering")
                        break
                    if time.monotonic() > deadline:
                        problems.append(f"no answer on port {port} in {UI_ANSWER_TIMEOUT_S} s")
                        break
                    time.sleep(0.5)
                tree = _descendants(proc.pid)
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=STOP_BOUND_S)
                except subprocess.TimeoutExpired:
                    problems.append(f"still running {STOP_BOUND_S} s after the stop signal")
                deadline = time.monotonic() + 10
                while _alive(tree) and time.monotonic() < deadline:
                    time.sleep(0.2)
                left = _alive(tree)
                if left:
                    problems.append(
                        "processes left behind: "
                        + "; ".join(" ".join(p.cmdline()[:4]) for p in left)
                    )
            finally:
                with_group = [proc.pid] if proc.poll() is None else []
                for pid in with_group:
                    os.killpg(pid, signal.SIGKILL)
                for p in _alive(tree):
                    p.kill()
        output = log.read_text()
        out = Outcome(f"{command} --port {port}", proc.returncode, output, time.monotonic() - start)
        out.problems = problems + [f"warning: {w}" for w in _warnings(output)]
        return out


def test_every_documented_command_runs_without_a_warning(tmp_path: Path) -> None:
    from corr_pipeline.db.migrate import head_revision

    lines, named = documented()

    # the docs teach no superseded command, and every command they name is run below
    taught = {signature(line) for line in lines}
    assert not taught & SUPERSEDED, f"superseded commands taught: {taught & SUPERSEDED}"
    missing = named - set(COMMANDS) - SUPERSEDED - walk_through_signatures()
    assert not missing, f"documented commands this test does not run: {sorted(missing)}"

    project = Project(tmp_path)
    for line in (x for x in lines if x.startswith("export ")):
        project.export(line)
    assert project.env.get("DAGSTER_HOME") == str(project.root), project.env.get("DAGSTER_HOME")

    # the runs: the bash-block lines, then one run of each named command not among them
    runs: list[str] = []
    for line in lines:
        sig = signature(line)
        if not sig or COMMANDS.get(sig, []) is None:
            continue  # not a command of ours (pip, python3, kill, ...), or a UI (below)
        runs.append(line if not line.startswith("corr-pipeline") else concrete(line))
    for sig, commands in COMMANDS.items():
        if commands and not any(signature(r) == sig for r in runs):
            runs += [c.format(head=head_revision()) for c in commands]
    runs = list(dict.fromkeys(runs))
    first = [r for prefix in FIRST for r in runs if r.startswith(prefix)]
    last = [r for r in runs if r.startswith(LAST) and r not in first]
    middle = [r for r in runs if r not in first and r not in last]

    outcomes: list[Outcome] = []
    for command in first:
        outcomes.append(project.run(command))
        assert not outcomes[-1].problems, _report(outcomes[-1:])
    demo = outcomes[-1].output
    ui_line = re.search(r"Dagster UI:\s+(\S.* corr-pipeline ui)\s*$", demo, re.M)
    assert ui_line, f"the demo's summary names no UI command:\n{demo}"
    ui = ui_line.group(1)
    # the queries the demo's summary ends with, run with the quick commands
    tried = re.findall(r"^\s+(?:try next:\s+)?(corr-pipeline query \S.*?)\s+# ", demo, re.M)
    assert len(tried) == 3, f"the demo's summary suggests no queries:\n{demo}"

    # the UIs in the background while the other commands run: each run of the pipeline in its
    # own lane, the quick commands in one; then the last ones (the schedule's start before its
    # stop)
    launches = [[r] for r in middle if r.startswith("dg launch")]
    quick = [r for r in middle if not r.startswith("dg launch")] + tried
    schedule = [r for r in last if r.startswith("dagster schedule")]
    schedule.sort(key=lambda r: ("start" not in r, r))
    outcomes += _lanes(
        project,
        [[(ui,)], *launches, quick],
    )
    outcomes += _lanes(project, [schedule, [r for r in last if r not in schedule]])

    for o in outcomes:  # shown with -rA / -s: where the time goes
        print(f"{o.seconds:6.1f} s  {o.command}")
    failed = [o for o in outcomes if o.problems]
    assert not failed, _report(failed)
    ran = {signature(o.command) for o in outcomes}
    assert set(COMMANDS) <= ran, sorted(set(COMMANDS) - ran)


class BashSession:
    """One non-interactive ``bash`` in the project's root, fed block after block (each
    ``source``-d from a file, input from ``/dev/null``), as a user pasting the walk-through's
    blocks into one terminal; its output (background jobs' included) is collected by a
    thread. A failing command is reported by an ``ERR`` trap."""

    DONE = "__walk_through_block_done__"
    FAILED = "__walk_through_command_failed__"

    def __init__(self, project: Project) -> None:
        self.project = project
        self.proc = subprocess.Popen(
            ["bash", "--norc", "--noprofile"],
            cwd=project.root,
            env=project.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,  # so that the test can clean up whatever happens
        )
        self.lines: list[str] = []
        self._seen = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._send(f"set -o pipefail; trap 'echo \"{self.FAILED} $? $BASH_COMMAND\"' ERR")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def _send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def run(self, index: int, block: str, timeout: float) -> Outcome:
        """Source ``block``; wait for it to finish; its output and problems (failed commands,
        warnings)."""
        script = self.project.root / f"walk_through_{index}.sh"
        script.write_text(block + "\n")
        start = time.monotonic()
        self._send(f"source {shlex.quote(script.name)} < /dev/null; echo {self.DONE}")
        deadline = start + timeout
        while not any(line == self.DONE for line in self.lines[self._seen :]):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        output = self.lines[self._seen :]
        self._seen = len(self.lines)
        out = Outcome(block, 0, "\n".join(output), time.monotonic() - start)
        if self.DONE not in output:
            out.problems.append(f"did not finish within {timeout:.0f} s")
        out.problems += [line for line in output if line.startswith(self.FAILED)]
        out.problems += [f"warning: {w}" for w in _warnings(out.output)]
        return out

    def close(self) -> None:
        """End the shell; kill whatever it left running (a UI started with ``&``)."""
        tree = _descendants(self.proc.pid)
        for proc in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in proc.children(recursive=True):
                    if child not in tree:
                        tree.append(child)
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        for proc in _alive(tree):
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        self.proc.wait(timeout=30)


def test_the_walk_through_runs_top_to_bottom(tmp_path: Path) -> None:
    _, walk = split_walk_through(GUIDE.read_text())
    assert walk, f"the user guide has no section {WALK_THROUGH!r}"
    blocks = ["\n".join(block) for block in fenced_blocks(walk, "bash")]
    assert any("corr-pipeline backfill" in b for b in blocks) and any("&" in b for b in blocks)
    port = _free_port()
    project = Project(tmp_path)
    session = BashSession(project)
    outcomes: list[Outcome] = []
    try:
        for index, block in enumerate(blocks):
            runnable = block.replace("--port 3000", f"--port {port}")
            outcomes.append(session.run(index, runnable, WALK_THROUGH_TIMEOUT_S))
            assert not outcomes[-1].problems, _report(outcomes[-1:])
    finally:
        session.close()
    for o in outcomes:  # shown with -rA / -s: where the time goes
        print(f"{o.seconds:6.1f} s  {o.command.splitlines()[0]}")
    # what the blocks say they show
    text = "\n".join(o.output for o in outcomes)
    assert "view market.corr_closes, readable" in text
    assert "2026-11-26  Thu  closed  no partition" in text
    assert "Sensor: prices_ready_sensor [RUNNING]" in text
    assert "3 session(s) published in 1 run(s)" in text and "; 0 failed" in text
    assert "3 snapshot(s) published" in text
    assert "leads  S00117  S00062    1" in text


def _lanes(project: Project, lanes: list[list]) -> list[Outcome]:
    """Run each lane (commands, or one ``(ui command,)`` to serve) in its own thread,
    the commands of a lane one after the other."""

    def lane(items: list) -> list[Outcome]:
        return [
            project.serve(item[0]) if isinstance(item, tuple) else project.run(item)
            for item in items
        ]

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(lanes)) as pool:
        futures = [pool.submit(lane, items) for items in lanes if items]
        return [o for f in futures for o in f.result()]


def _report(outcomes: list[Outcome]) -> str:
    parts = []
    for o in outcomes:
        tail = "\n".join(o.output.splitlines()[-25:])
        parts.append(
            f"$ {o.command}  ({o.seconds:.0f} s)\n  " + "\n  ".join(o.problems) + f"\n{tail}"
        )
    return "\n\n".join(parts)


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("corr-pipeline query peers SYMBOL [--date D] [--json]", "corr-pipeline query peers"),
        ("dg check defs", "dg check defs"),
        ("CORR_PIPELINE_HOME=/x DAGSTER_HOME=/y dg dev", "dg dev"),
        (
            "dagster schedule start nightly_snapshot_schedule -w workspace.yaml",
            "dagster schedule start",
        ),
        ("corr-pipeline --debug ...", "corr-pipeline"),
        ("pip install -e '.[dev]'", ""),
    ],
)
def test_signature(command: str, expected: str) -> None:
    assert signature(command) == expected
