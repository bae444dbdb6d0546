"""Per-module mutation scores from a finished `mutmut run` (its `mutants/**/*.py.meta` files).

    python tests/support/mutation_scores.py build/mutation/mutants [--survivors]
    python tests/support/mutation_scores.py --narrow build/mutation/pyproject.toml MUTANTS [TESTS...]

Prints a Markdown table (the one docs/testing.md keeps) and, with --survivors, every surviving mutant's name.
`--narrow` (`make mutation`'s step before mutmut) rewrites the flat copy's `[tool.mutmut]`: only the modules the
`MUTANTS` patterns can name are mutated (mutmut generates every listed file's mutants on each run), and where test
paths are given, they replace the test selection (mutmut runs the whole selection once to learn which tests reach
which function: the full unit suite costs tens of minutes on a loaded 2-core machine).
Killed counts mutants a test failed on, timed out on, or mypy rejected; "no tests" are mutants of code no
selected test reaches, and count against the score like survivors.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

KILLED = {1, 3, 36, 37, 24, -24, 152, 255}
SURVIVED = {0}
NO_TESTS = {5, 33}


def scores(mutants: Path) -> list[tuple[str, Counter[str], list[str]]]:
    rows = []
    for meta in sorted(mutants.rglob("*.py.meta")):
        module = meta.relative_to(mutants).as_posix().removesuffix(".py.meta").replace("/", ".")
        codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
        counts: Counter[str] = Counter()
        survivors = []
        for name, code in sorted(codes.items()):
            if code in KILLED:
                counts["killed"] += 1
            elif code in SURVIVED:
                counts["survived"] += 1
                survivors.append(name)
            elif code in NO_TESTS:
                counts["no tests"] += 1
                survivors.append(name)
            else:
                counts["other"] += 1
        rows.append((module, counts, survivors))
    return rows


def _module(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def narrow(pyproject: Path, patterns: list[str], tests: list[str]) -> None:
    text = pyproject.read_text()
    if patterns:
        prefixes = [p.split("*", 1)[0] for p in patterns]

        def named(path: str) -> bool:
            module = _module(path) + "."
            return any(prefix.startswith(module) or module.startswith(prefix) for prefix in prefixes)

        block = re.search(r"^only_mutate = \[\n(.*?)^\]", text, re.MULTILINE | re.DOTALL)
        assert block is not None, "[tool.mutmut] has no only_mutate list"
        kept = [m for m in re.findall(r'^\s*"([^"]+)",', block[1], re.MULTILINE) if named(m)]
        assert kept, f"no module of only_mutate matches {patterns}"
        text = text.replace(block[0], "only_mutate = " + json.dumps(kept))
    if tests:
        block = re.search(r"^pytest_add_cli_args_test_selection = \[\n.*?^\]", text, re.MULTILINE | re.DOTALL)
        assert block is not None, "[tool.mutmut] has no pytest_add_cli_args_test_selection list"
        text = text.replace(block[0], "pytest_add_cli_args_test_selection = " + json.dumps(tests))
    pyproject.write_text(text)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--narrow"]:
        narrow(Path(argv[1]), argv[2].split(), argv[3:])
        return 0
    mutants = Path(argv[0]) if argv else Path("build/mutation/mutants")
    rows = scores(mutants)
    print("| module | mutants | killed | survived | no tests | score |")
    print("|---|---:|---:|---:|---:|---:|")
    worst = 100.0
    for module, counts, _ in rows:
        total = sum(counts.values())
        score = 100.0 * counts["killed"] / total if total else 100.0
        worst = min(worst, score)
        cells = [f"`{module}`", total, counts["killed"], counts["survived"], counts["no tests"], f"{score:.1f} %"]
        print("| " + " | ".join(map(str, cells)) + " |")
    if "--survivors" in argv:
        for _, _, survivors in rows:
            for name in survivors:
                print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
