"""CPU seconds per Dagster step of two (or more) checkouts of the project, from interleaved runs.

One ``--prerender`` demo API serves every run; each round runs ``dagster asset materialize -m
fieldsales_dagster --select '*'`` once per checkout (``name=path``: that folder's
``fieldsales_dagster`` is imported, through ``PYTHONPATH``, with this virtualenv's packages),
each into a fresh lake and an initialised ``DAGSTER_HOME``, and reads each step's CPU and wall
seconds (``step_cpu.py``). Prints the median over rounds per step, the CPU outside the steps
and the whole command's CPU, wall, peak RSS and bytes written (``io_written.py``).

    python -m benchmarks.steps_ab 100000 2 base=/tmp/base-checkout branch=.

A side may set variables for its runs after an ``@``, so one checkout can be measured under
several settings in one interleaved run (the memory-limit curve, ``benchmarks/README.md``):

    python -m benchmarks.steps_ab 1000000 1 \
        192MB=.@FIELDSALES_DUCKDB_MEMORY_LIMIT=192MB 2GB=.@FIELDSALES_DUCKDB_MEMORY_LIMIT=2GB

A value's ``{run}`` is the run's own folder: a revision from before the lake (dfc037d) stores
into a single DuckDB file, which must be new for each run as the lake is:

    python -m benchmarks.steps_ab 1000000 2 \
        dfc037d=../dfc@FIELDSALES_DUCKDB_PATH={run}/fieldsales.duckdb final=.

``--nightly G`` measures each lake's second run: its first run (not measured) against the demo
API at generation 0, then the run measured against generation ``G`` (``G`` = 1: ~1% of the events
changed, the nightly run; ``G`` = 0: nothing changed):

    python -m benchmarks.steps_ab --nightly 1 100000 2 base=/tmp/base-checkout branch=.

``--profile heavy`` serves the demo API's heavy profile instead of the default one;
``--select raw_events,raw_transactions`` runs those assets instead of every one (``*``), in
Dagster's selection syntax, to look at one step's CPU and peak RSS alone. ``--live-server``
starts the demo API without ``--prerender`` (it renders each page per request): 3M items
rendered at its start take ~15 GB, rendered per request ~60 MB.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import BIN, DemoAPI, measure
from benchmarks.step_cpu import step_cpu

IO_WRITTEN = Path(__file__).with_name("io_written.py")


def _home(tree: Path, home: Path, env: dict[str, str]) -> None:
    home.mkdir(parents=True)
    # The project's instance settings without their storage keys (as `make demo` writes them).
    text = (tree / "dagster.yaml").read_text().split("# Where the runs")[0]
    (home / "dagster.yaml").write_text(text)
    subprocess.run(
        [str(BIN / "dagster"), "instance", "migrate"],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
    )


def _side(arg: str) -> tuple[str, Path, dict[str, str]]:
    """``name=path[@VAR=value,...]``: a checkout and the variables its runs get."""
    name, _, rest = arg.partition("=")
    path, _, assignments = rest.partition("@")
    extra = dict(a.split("=", 1) for a in assignments.split(",") if a)
    return name, Path(path).resolve(), extra


def main(argv: list[str]) -> int:
    live = "--live-server" in argv  # the demo API renders per request: less memory (README)
    argv = [a for a in argv if a != "--live-server"]
    options = {"--profile": "demo", "--select": "*", "--nightly": ""}
    while argv and argv[0] in options:
        options[argv[0]], argv = argv[1], argv[2:]
    profile, select, nightly = options["--profile"], options["--select"], options["--nightly"]
    size, rounds = int(argv[0]), int(argv[1])
    sides = [_side(a) for a in argv[2:]]
    trees = {name: tree for name, tree, _ in sides}
    extra_env = {name: extra for name, _, extra in sides}
    out = Path(tempfile.mkdtemp(prefix=f"steps-ab-{size}-"))
    token = secrets.token_hex(16)
    env0 = {k: v for k, v in os.environ.items() if not k.startswith(("FIELDSALES_", "DAGSTER_"))}
    env0["PYTHONUNBUFFERED"] = "1"
    results: dict[str, list[dict]] = {name: [] for name in trees}
    # ``--nightly G``: each lake's first run at generation 0, then the measured run at G.
    generations = [0, int(nightly)] if nightly else [0]
    for round_ in range(rounds):
        for index, generation in enumerate(generations):
            log = out / f"api-{round_}-{index}.log"
            with DemoAPI(
                size, token, log, prerender=not live, profile=profile, generation=generation
            ) as api:
                for name, tree in trees.items():
                    where = out / f"{name}-{round_}"
                    if not (where / "lake").exists():
                        (where / "lake").mkdir(parents=True)
                    env = {
                        **env0,
                        "PYTHONPATH": str(tree),
                        "DAGSTER_HOME": str(where / "home"),
                        "FIELDSALES_BASE_URL": api.base_url,
                        "FIELDSALES_API_TOKEN": token,
                        "FIELDSALES_DUCKLAKE_CATALOG": f"sqlite:{where}/lake.sqlite",
                        "FIELDSALES_DUCKLAKE_DATA_PATH": str(where / "lake"),
                        "FIELDSALES_TOKEN_STORE": str(where / "token.json"),
                        # ``{run}`` in a side's value: this run's folder (a file of its own).
                        **{k: v.replace("{run}", str(where)) for k, v in extra_env[name].items()},
                    }
                    if not (where / "home").exists():
                        _home(tree, where / "home", env)
                    # The bytes the run's process tree wrote (benchmarks/io_written.py).
                    io_json = where / f"run-{index}.io.json"
                    argv_run = [sys.executable, str(IO_WRITTEN), str(io_json), "--"]
                    argv_run += [str(BIN / "dagster"), "asset", "materialize", "-m"]
                    argv_run += ["fieldsales_dagster", "--select", select]
                    run_log = where / f"run-{index}.log"
                    m = measure(name, argv_run, run_log, env, server=api, cwd=tree)
                    written = json.loads(io_json.read_text())["write_bytes"] if m.ok else 0
                    print(
                        f"{name} round {round_} generation {generation}: "
                        f"{'ok' if m.ok else 'FAILED'}, wall {m.wall_s:.1f} s, "
                        f"CPU {m.cpu_s:.1f} s, peak RSS {m.peak_rss / 2**20:.0f} MiB, "
                        f"written {written / 2**20:.0f} MiB",
                        file=sys.stderr,
                        flush=True,
                    )
                    if index < len(generations) - 1:
                        continue
                    by_step = step_cpu(where / "home", m.cpu_samples, m.rss_samples)
                    results[name].append(
                        {
                            "ok": m.ok,
                            "wall": m.wall_s,
                            "cpu": m.cpu_s,
                            "rss": m.peak_rss,
                            "written": written,
                            "steps": {s.step: (s.cpu_s, s.wall_s, s.peak_rss) for s in by_step},
                        }
                    )
        for name in trees:
            shutil.rmtree(out / f"{name}-{round_}" / "lake", ignore_errors=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))

    def median(name: str, pick) -> float:
        values = [pick(r) for r in results[name] if r["ok"]]
        return statistics.median(values) if values else float("nan")

    nan = float("nan")
    steps = {step for runs in results.values() for r in runs for step in r["steps"]}
    order = sorted(
        steps, key=lambda s: -median(next(iter(trees)), lambda r: r["steps"].get(s, (0, 0))[0])
    )
    print("| step | " + " | ".join(f"{n} CPU s | {n} wall s | {n} RSS MiB" for n in trees) + " |")
    print("|---|" + "---:|---:|---:|" * len(trees))
    for step in order:
        cells = [
            f"{median(n, lambda r, s=step: r['steps'].get(s, (nan, nan))[0]):.2f} | "
            f"{median(n, lambda r, s=step: r['steps'].get(s, (nan, nan))[1]):.2f} | "
            f"{median(n, lambda r, s=step: r['steps'].get(s, (nan, nan, 0))[2]) / 2**20:.0f}"
            for n in trees
        ]
        print(f"| `{step}` | " + " | ".join(cells) + " |")
    outside = [
        f"{median(n, lambda r: r['cpu'] - sum(c[0] for c in r['steps'].values())):.2f} | | "
        for n in trees
    ]
    print("| outside the steps | " + " | ".join(outside) + " |")
    whole = [
        f"{median(n, lambda r: r['cpu']):.2f} | {median(n, lambda r: r['wall']):.2f} | "
        f"{median(n, lambda r: r['rss']) / 2**20:.0f}"
        for n in trees
    ]
    print("| whole command | " + " | ".join(whole) + " |")
    rss = ", ".join(f"{n} {median(n, lambda r: r['rss']) / 2**20:.0f} MiB" for n in trees)
    written = ", ".join(f"{n} {median(n, lambda r: r['written']) / 2**20:.1f} MiB" for n in trees)
    print(f"peak RSS (median): {rss}; written (median): {written}; logs, results.json in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
