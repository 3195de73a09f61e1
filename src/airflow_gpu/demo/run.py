"""`airflow-gpu demo` from start to end: the stack up, the story, the record (JSON), the
timeline (terminal and PNG), the checks, one success or failure line, and the stack down
with its temporary files, however it ends (Ctrl-C and SIGTERM included)."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import tempfile
import time
from pathlib import Path

import httpx
from rich.markup import escape

from .stack import Stack, StackError
from .story import TEAMS, Story, StoryFailed, checks
from .timeline import terminal_chart, write_png

DAGS = Path(__file__).parent.parent / "demo_dags"
# The oldest waiting job of each priority band is protected at once (reserve_after 0):
# it gets a reservation, and smaller jobs backfill only where they end before it starts.
POLICY = {"mode": "backfill", "reserve_after": 0}
UI_PAGE = "/plugin/gpu_cluster"       # the plugin's page inside the Airflow UI
# LocalExecutor worker slots: fewer than the GPU tasks that wait at once (five), so the
# story shows that deferred tasks hold none
PARALLELISM = 4


def _stop_on_sigterm(*_) -> None:
    raise KeyboardInterrupt


def run(args, console) -> int:
    began = time.monotonic()
    out = Path(args.out)
    work = Path(tempfile.mkdtemp(prefix="airflow-gpu-demo-"))
    gate = work / "wave-3-waits"
    stack = Stack(work, "demo", POLICY, DAGS, TEAMS, PARALLELISM,
                  extra_env={"AIRFLOW_GPU_DEMO_SPEED": str(args.speed),
                             "AIRFLOW_GPU_DEMO_GATE": str(gate)})
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)

    def say(text: str, markup: bool = True) -> None:
        console.print(text, markup=markup)

    try:
        try:
            stack.start(say)
            say(f"[bold]Airflow UI[/] {stack.url}  GPU pages: {stack.url}{UI_PAGE} "
                f"(queue: {stack.url}/gpu/queue)")
            story = Story(stack.url, stack.core_url, stack.tokens["admin"], say, gate)
            try:
                story.run()
                record = story.record(PARALLELISM)
            finally:
                story.close()
        except (StackError, StoryFailed, httpx.HTTPError) as exc:
            _keep_logs(stack, out)
            console.print(f"[red]the demo failed:[/] {escape(str(exc))}\nlogs kept in "
                          f"{out / 'logs'}")
            console.print(f"[bold red]FAILED[/] after {time.monotonic() - began:.0f} s")
            return 1
        record["checks"] = checks(record)
        record["seconds"] = round(time.monotonic() - began, 1)
        out.mkdir(parents=True, exist_ok=True)
        (out / "demo-story.json").write_text(json.dumps(record, indent=1))
        console.print()
        console.print(terminal_chart(record))
        png = write_png(record, out / "demo-timeline.png")
        console.print(f"\nrecord: {out / 'demo-story.json'}; chart: "
                      + (str(png) if png else "not drawn (pip install "
                         "'airflow-provider-gpu[plot]' for matplotlib)"))
        for name, c in record["checks"].items():
            mark = "[green]ok[/]  " if c["ok"] else "[red]FAIL[/]"
            console.print(f"  {mark} {name:9} {escape(c['says'])}")
        ok = all(c["ok"] for c in record["checks"].values())
        seconds = time.monotonic() - began
        if ok and args.keep:
            _keep(stack, console)
        if not ok:
            _keep_logs(stack, out)
            console.print(f"[bold red]FAILED[/]: the story did not happen as told (see the "
                          f"checks above; logs in {out / 'logs'}), {seconds:.0f} s")
            return 1
        console.print(f"[bold green]SUCCESS[/]: 7 GPU jobs of 3 teams ran through Airflow: "
                      f"deferred, backfilled, by priority; {seconds:.0f} s")
        return 0
    except KeyboardInterrupt:
        console.print("\n[yellow]interrupted[/]: stopping the demo stack")
        return 130
    finally:
        stack.stop()
        shutil.rmtree(work, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous)


def _keep(stack: Stack, console) -> None:
    console.print(f"\n[bold]--keep[/]: the stack stays up. Airflow UI {stack.url} (GPU "
                  f"pages: {stack.url}{UI_PAGE}); the scheduler-core's queue:\n  "
                  f"AIRFLOW_GPU_URL={stack.core_url} AIRFLOW_GPU_TOKEN="
                  f"{stack.tokens['admin']} airflow-gpu queue --all\nCtrl-C stops it.")
    try:
        while True:
            time.sleep(1)
            for name, p in stack.procs.items():
                if p.poll() is not None:
                    console.print(f"[red]{name} exited[/] (code {p.returncode}): stopping")
                    return
    except KeyboardInterrupt:
        console.print("\nstopping the demo stack")


def _keep_logs(stack: Stack, out: Path) -> None:
    """Copy the logs out of the temporary folder, which is removed."""
    with contextlib.suppress(OSError):
        shutil.copytree(stack.logs, out / "logs", dirs_exist_ok=True)
        shutil.copytree(stack.work / "airflow" / "logs", out / "logs" / "airflow",
                        dirs_exist_ok=True)     # the task logs
