"""Every page of the documentation runs as a reader would run it: README.md and
docs/*.md are collected here, each page's blocks in one shell of its own (parsers.py,
shell.py). conventions.md, how a page is written, stands for them in the collection."""

from __future__ import annotations

from pathlib import Path

import pytest
from sybil import Sybil
from sybil.integration.pytest import SybilFile
from sybil.parsers.markdown import SkipParser

from tests.docs.parsers import FileParser, ShellParser
from tests.docs.shell import Shell
from tests.helpers import REPO

HERE = Path(__file__).resolve().parent
PAGES = ("README.md", "docs/*.md")


def setup(namespace: dict) -> None:
    namespace["shell"] = Shell()


def teardown(namespace: dict) -> None:
    namespace["shell"].close()


SYBIL = Sybil(parsers=[SkipParser(), FileParser(), ShellParser()], path=str(REPO),
              patterns=PAGES, setup=setup, teardown=teardown)


def pages() -> list[Path]:
    return sorted({p for pattern in PAGES for p in REPO.glob(pattern)})


class Pages(pytest.File):
    """The documentation's pages, each a Sybil file (node ids README.md::line:N,...)."""

    def collect(self):
        for page in pages():
            yield SybilFile.from_parent(self, path=page, sybils=[SYBIL])


def pytest_collect_file(file_path: Path, parent):
    if file_path == HERE / "conventions.md":
        return Pages.from_parent(parent, path=file_path)
    return None
