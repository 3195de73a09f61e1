"""Sybil parsers for the pages' blocks.

- A ```sh block runs in the page's shell (shell.py); it fails when one of its commands
  fails. A ```text block right after it (nothing but blank lines between) is what the
  block prints: each of its lines must appear in the output, in order (whitespace runs
  count as one space, `...` stands for any text, table borders are ignored, and a job id
  matches any other).
- A ```yaml block whose first line is `# NAME.yaml` is written to that file in the
  page's working directory, where the page's later blocks read it.
- `<!-- invisible-code-block: sh ... -->` runs like a ```sh block, unseen (a page's setup).
- `<!-- skip: next "reason" -->` (Sybil's own skip) leaves out the next block: the
  page shows the reason in an italic line for the reader (test_marks.py checks both)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from sybil import Document, Example, Region
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer, FencedCodeBlockLexer

from tests.docs.shell import BlockFailed, Shell

BORDERS = re.compile(r"[│┃┆┊║|]")
# job ids change from run to run: a page shows real ones, any id matches any other
UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
SHORT_ID = re.compile(r"\b[0-9a-f]{8}\b")
FILE_LINE = re.compile(r"#\s*(?P<name>[\w.-]+\.ya?ml)\s*$")


def normal(line: str) -> str:
    line = SHORT_ID.sub("<id>", UUID.sub("<uuid>", line))
    return " ".join(BORDERS.sub(" ", line).split())


def line_pattern(expected: str) -> re.Pattern:
    parts = [re.escape(normal(p)) for p in expected.split("...")]
    return re.compile(r"\s*.*?\s*".join(parts))


def missing_lines(expected: str, printed: str) -> list[str]:
    """The expected lines not found in `printed`, in order."""
    lines = [normal(x) for x in printed.splitlines()]
    at, missing = 0, []
    for want in (x for x in expected.splitlines() if x.strip()):
        pattern = line_pattern(want)
        for i in range(at, len(lines)):
            if pattern.search(lines[i]):
                at = i + 1
                break
        else:
            missing.append(want)
    return missing


def shell_of(example: Example) -> Shell:
    return example.namespace["shell"]


class ShellParser:
    """```sh blocks, each with the ```text block that shows its output, if any."""

    def __init__(self) -> None:
        self.lexer = FencedCodeBlockLexer(language=r"sh|text")
        self.hidden = DirectiveInHTMLCommentLexer("invisible-code-block", arguments="sh")

    def __call__(self, document: Document) -> Iterable[Region]:
        for region in self.hidden(document):   # a page's setup, hidden from the reader
            yield Region(region.start, region.end, (str(region.lexemes["source"]), None),
                         self.evaluate)
        regions = list(self.lexer(document))
        for i, region in enumerate(regions):
            if region.lexemes["language"] != "sh":
                continue
            expected, end = None, region.end
            after = regions[i + 1] if i + 1 < len(regions) else None
            if (after is not None and after.lexemes["language"] == "text"
                    and not document.text[region.end:after.start].strip()):
                expected, end = str(after.lexemes["source"]), after.end
            yield Region(region.start, end, (str(region.lexemes["source"]), expected),
                         self.evaluate)

    @staticmethod
    def evaluate(example: Example) -> str | None:
        source, expected = example.parsed
        try:
            printed = shell_of(example).run(source)
        except BlockFailed as e:
            return str(e)   # Sybil shows it as the failure, without a traceback
        if expected is None:
            return None
        missing = missing_lines(expected, printed)
        if missing:
            return ("the block's output lacks these lines the page shows (in order):\n"
                    + "\n".join(missing) + "\n--- it printed:\n" + printed[-6000:])
        return None


class FileParser:
    """```yaml blocks that name their file in a first-line comment, written there."""

    def __init__(self) -> None:
        self.lexer = FencedCodeBlockLexer(language=r"ya?ml")

    def __call__(self, document: Document) -> Iterable[Region]:
        for region in self.lexer(document):
            source = str(region.lexemes["source"])
            m = FILE_LINE.match(source.splitlines()[0]) if source.strip() else None
            if m:
                yield Region(region.start, region.end, (m.group("name"), source),
                             self.evaluate)

    @staticmethod
    def evaluate(example: Example) -> str | None:
        name, source = example.parsed   # written where the page's shell is (after its `cd`s)
        try:
            shell_of(example).run(f"cat > {name} <<'__DOCS_FILE__'\n{source}__DOCS_FILE__\n")
        except BlockFailed as e:
            return str(e)
        return None
