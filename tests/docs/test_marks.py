"""The pages' marks, and the runner on a page of its own: a block that fails, or whose
output lacks a line the page shows, fails its test."""

from __future__ import annotations

import re

import pytest
from sybil import Sybil
from sybil.parsers.markdown import SkipParser

from tests.docs.conftest import pages, setup, teardown
from tests.docs.parsers import FileParser, ShellParser, missing_lines

SKIP = re.compile(r'^[ \t]*<!-- skip: next "(?P<reason>[^"]+)" -->$')
OTHER_SHELLS = re.compile(r"^[ \t]*```(bash|shell|console|zsh|shell-session)\b", re.M)


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_every_skipped_block_says_so_to_the_reader(page):
    lines = page.read_text().splitlines()
    for i, line in enumerate(lines):
        if "skip:" in line and line.lstrip().startswith("<!--"):
            assert SKIP.match(line), f"{page.name}:{i + 1}: write <!-- skip: next \"why\" -->"
            shown = lines[i + 1].strip()
            assert shown.startswith("*") and shown.endswith("*") and \
                "not run by the test suite" in shown.lower(), (
                    f"{page.name}:{i + 2}: a skipped block needs an italic line for the "
                    f"reader right after the skip, e.g. *Needs a GPU host; not run by the "
                    f"test suite.*")
            fence = next(x for x in lines[i + 2:] if x.strip())
            assert fence.strip() == "```sh", \
                f"{page.name}:{i + 1}: a skip goes right before a ```sh block"


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_shell_examples_are_fenced_as_sh(page):
    found = OTHER_SHELLS.search(page.read_text())
    assert not found, f"{page.name}: {found.group(0).strip()}: fence shell examples as ```sh"


def test_output_lines_match_in_order_with_ellipses_and_any_job_id():
    printed = ("│ 3f5db580-4185-4b84-89fc-90c8c218b87a │ train  │ vision │ admitted │\n"
               "team,jobs,gpu_hours\n")
    assert missing_lines("│ 11111111-2222-3333-4444-555555555555 │ train │ ... │", printed) == []
    assert missing_lines("team,jobs,...", printed) == []
    assert missing_lines("team,jobs\n│ ... │ train │", printed) == ["│ ... │ train │"]
    assert missing_lines("│ ... │ nlp │", printed) == ["│ ... │ nlp │"]


PAGE = '''# A page

```sh
export GREETING=hello
mkdir sub && cd sub
```

```sh
echo "$GREETING from $(basename "$PWD")"
```

```text
hello from sub
```

```yaml
# made.yaml
a: 1
```

```sh
cat made.yaml
```

```text
a: 2
```

```sh
false
echo after
```

<!-- skip: next "an illustration" -->
*An illustration; not run by the test suite.*

```sh
exit 3
```
'''


def test_a_page_runs_block_after_block_and_a_wrong_block_fails(tmp_path):
    (tmp_path / "page.md").write_text(PAGE)
    sybil = Sybil(parsers=[SkipParser(), FileParser(), ShellParser()], path=str(tmp_path),
                  patterns=["*.md"], setup=setup, teardown=teardown)
    document = sybil.parse(tmp_path / "page.md")
    setup(document.namespace)
    results = []
    try:
        for example in document.examples():
            try:
                example.evaluate()
                results.append("ok")
            except Exception as e:  # noqa: BLE001 - the outcome is what is tested
                results.append(f"{type(e).__name__}: {e}")
    finally:
        teardown(document.namespace)
    assert results[:3] == ["ok", "ok", "ok"], results          # export and cd carried
    assert "lacks these lines" in results[3] and "a: 2" in results[3], results
    assert "1 false" in results[4] and "after" in results[4], results   # exit status, command
    assert results[5] == "ok" and results[6].startswith("SkipTest: an illustration"), results
