"""Every ```python example of README.md and of the docs pages that carry the README's former examples
(docs/python-api.md, docs/algorithms.md, docs/results.md, docs/tuner-api.md) runs as written.

Each block is run with ``exec``, in a fresh namespace, in one temporary working directory shared
by the blocks of this module, so whatever an example writes (``fedtune_results/``, Tune's
storage) lands there and never in the repository; whatever one registers (the README's
``fedtune.register(Clipped)``) is gone after it (``registries_isolated``). The examples that read
a study read ``fedtune_results/default``, what the README's quick start (``fedtune sweep``) or
``fedtune run`` writes; :func:`workdir` writes a small one first (rotated-digits, the mlp, 1 round,
in-process).
Blocks that use Ray Tune run on the test session's local Ray (``ray_session``), in the slow tier
(tests/slow/project/test_readme_examples.py).

A block the tests cannot run as written is preceded, on the line before its fence, by
``<!-- not run by tests/project/test_readme_examples.py: REASON -->``; :data:`MAY_SKIP` lists the ones
allowed (none today), so a new exception is a decision made here, with its reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/python-api.md", "docs/algorithms.md", "docs/results.md", "docs/tuner-api.md")
SKIP_MARK = re.compile(r"<!--\s*not run by tests/project/test_readme_examples\.py:\s*(?P<reason>.+?)\s*-->")
MAY_SKIP: dict[str, str] = {}  # "file:line" of a block -> why it cannot run in a test (e.g. it needs a cluster)


@dataclass(frozen=True)
class Block:
    path: str
    line: int  # of the opening fence
    code: str
    skip_reason: str | None

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def python_blocks(path: str) -> list[Block]:
    """The ```python blocks of ``path`` (relative to the repository), in order."""
    lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i
            i += 1
            body = []
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            mark = SKIP_MARK.search(lines[start - 1]) if start else None
            blocks.append(Block(path, start + 1, "\n".join(body) + "\n", mark["reason"] if mark else None))
        i += 1
    return blocks


def all_blocks() -> list[Block]:
    """Every block of :data:`DOCS`; a block that repeats an earlier one verbatim runs once."""
    seen: set[str] = set()
    out = []
    for path in DOCS:
        for block in python_blocks(path):
            if block.code not in seen:
                seen.add(block.code)
                out.append(block)
    return out


BLOCKS = all_blocks()


def uses_ray(block: Block) -> bool:
    return re.search(r"^\s*(from ray\b|import ray\b)", block.code, re.M) is not None


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """The examples' working directory, holding the study the README's examples read
    (``fedtune_results/default``), made small: rotated-digits, the mlp, 1 round, in-process."""
    import os

    from fedtune.config import FederatedRunConfig
    from fedtune.runtime.driver import run

    folder = tmp_path_factory.mktemp("readme")
    before = os.getcwd()
    os.chdir(folder)
    try:
        cfg = FederatedRunConfig.from_dict({"backend": "local", "rounds": 1, "model": "mlp", "mlp_hidden": [16],
                                            "local_steps": 2})
        assert run(cfg, progress=False).status == "completed"
    finally:
        os.chdir(before)
    return folder


def test_the_examples_are_found():
    readme = python_blocks("README.md")
    assert len(readme) >= 3, [b.where for b in readme]  # one run, the Tuner, your own method
    assert any("fedtune.run(" in b.code for b in readme) and any("fedtune.load(" in b.code for b in readme)
    assert any("tune.Tuner(" in b.code for b in readme) and any("fedtune.register(" in b.code for b in readme)
    for page in DOCS[1:]:
        assert python_blocks(page), f"{page} lost its example"
    assert len(BLOCKS) >= 8, [b.where for b in BLOCKS]  # the README's eight of issue 45, now spread over the pages


def test_only_the_listed_examples_are_skipped():
    skipped = {b.where: b.skip_reason for b in BLOCKS if b.skip_reason}
    assert set(skipped) == set(MAY_SKIP), (f"README examples marked 'not run' {skipped} must be listed, with their "
                                           f"reason, in MAY_SKIP ({MAY_SKIP}), and the list kept to those marked")


@pytest.mark.parametrize("block", [pytest.param(b, id=b.where) for b in BLOCKS if not uses_ray(b)])
def test_the_example_runs_as_written(block, workdir, monkeypatch, request):
    """The examples without Ray; those that use Ray Tune run in tests/slow/project/test_readme_examples.py."""
    run_example(block, workdir, monkeypatch, request)


def run_example(block: Block, workdir: Path, monkeypatch, request) -> None:
    if block.skip_reason:
        pytest.skip(f"{block.where}: {block.skip_reason}")
    # An example that names an absolute path would write outside the test's folder (or fail): it
    # derives its paths from the working directory instead (Path("fedtune_results").resolve()).
    assert not re.search(r"""(?<![\w.])["'](/|~)""", block.code), f"{block.where} names an absolute path"
    if uses_ray(block):
        request.getfixturevalue("ray_session")
    request.getfixturevalue("registries_isolated")  # the README's fedtune.register(Clipped) is gone after it
    monkeypatch.chdir(workdir)
    exec(compile(block.code, block.where, "exec"), {"__name__": "__readme_example__"})
