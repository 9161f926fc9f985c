#!/usr/bin/env bash
# Are pyproject.toml's dependency floors true? Builds a throwaway virtual environment in which
# every floor is installed exactly (each `name>=X` of [project].dependencies and of the extras
# tensorboard, mlflow, wandb and test becomes `name==X`), checks pip agrees they fit together,
# then runs fedtune there: every module imported, `fedtune run`, a tiny `fedtune sweep` with
# every --logger and its report, and the tests that exercise the APIs the floors are for.
#
#   bash benchmarks/check_floors.sh [VENV]            # default VENV: /tmp/fedtune-floors
#   PYTHON=python3.10 bash benchmarks/check_floors.sh # the interpreter of the venv (default:
#                                                     # requires-python's floor, 3.10, if found)
#   FLOORS_TESTS="tests/algorithms/test_gala.py" bash ...        # the tests to run ("" for none)
#
# Needs PyPI. The venv is reused when it exists (pip then only changes what differs); the
# floors of torch/torchvision are CUDA builds from PyPI (about 4 GB in the venv). The venv's
# Python 3.10 cannot read pyproject.toml (tomllib is 3.11+), so the host's python3 does.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${1:-/tmp/fedtune-floors}"
HOST_PY="${HOST_PYTHON:-python3}"
if [ -z "${PYTHON:-}" ]; then  # python3.10 that runs (a pyenv shim may exist and refuse), else pyenv's 3.10
  for candidate in python3.10 "$HOME"/.pyenv/versions/3.10.*/bin/python; do
    if "$candidate" --version >/dev/null 2>&1; then PYTHON="$candidate"; break; fi
  done
  [ -n "${PYTHON:-}" ] || { echo "check_floors: no Python 3.10 found; set PYTHON=/path/to/python" >&2; exit 2; }
fi
FLOORS_TESTS="${FLOORS_TESTS-tests/algorithms/test_gala.py tests/models/test_models.py tests/tune/test_optuna_storage.py tests/slow/tune/test_optuna_storage.py tests/tune/test_loggers.py tests/slow/tune/test_loggers.py tests/reports/test_report.py tests/results/test_results.py tests/data/test_data.py tests/data/test_image_pipeline.py tests/slow/data/test_image_pipeline.py tests/project/test_doctests.py}"

# name[extras]==floor for every requirement with a >= floor (extras of one name merged).
mapfile -t PINS < <("$HOST_PY" - "$ROOT/pyproject.toml" <<'EOF'
import re, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
reqs = list(project["dependencies"])
for extra in ("tensorboard", "mlflow", "wandb", "test"):
    reqs += project["optional-dependencies"].get(extra, [])
pins: dict[str, tuple[set[str], str | None]] = {}
for r in reqs:
    m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)(?:\[([^\]]*)\])?\s*(?:>=\s*([0-9][0-9A-Za-z.]*))?\s*", r.split(";")[0])
    if not m:
        sys.exit(f"check_floors: cannot read the requirement {r!r} (expected NAME[EXTRAS]>=FLOOR)")
    name, extras, floor = m.group(1).lower(), m.group(2), m.group(3)
    old_extras, old_floor = pins.get(name, (set(), None))
    if old_floor and floor and old_floor != floor:
        sys.exit(f"check_floors: {name} has two floors, {old_floor} and {floor}")
    pins[name] = (old_extras | {e.strip() for e in (extras or "").split(",") if e.strip()}, floor or old_floor)
for name, (extras, floor) in sorted(pins.items()):
    print(name + (f"[{','.join(sorted(extras))}]" if extras else "") + (f"=={floor}" if floor else ""))
EOF
)
echo "check_floors: $("$PYTHON" --version) in $VENV; pins: ${PINS[*]}"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "${PINS[@]}"
"$VENV/bin/python" -m pip install -q --no-deps -e "$ROOT"
"$VENV/bin/python" -m pip check

# Each pinned distribution is installed at its floor (no other requirement lifted it).
"$VENV/bin/python" - "${PINS[@]}" <<'EOF'
import re, sys
from importlib.metadata import version
from packaging.version import Version
bad = []
for pin in sys.argv[1:]:
    if "==" not in pin:
        continue
    name, floor = re.sub(r"\[.*\]", "", pin).split("==")
    got = version(name)
    print(f"  {name:14} floor {floor:8} installed {got}")
    if Version(got) != Version(floor):
        bad.append(f"{name} {got} != {floor}")
sys.exit("check_floors: not at the floor: " + "; ".join(bad) if bad else 0)
EOF

WORK="$(mktemp -d /tmp/fedtune-floors-run.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
"$VENV/bin/python" - <<'EOF'
import importlib, pkgutil, sys
import fedtune
names = ["fedtune"] + [m.name for m in pkgutil.walk_packages(fedtune.__path__, prefix="fedtune.")]
bad = []
for n in names:
    try:
        importlib.import_module(n)
    except Exception as exc:  # noqa: BLE001
        bad.append(f"{n}: {type(exc).__name__}: {exc}")
print(f"check_floors: imported {len(names) - len(bad)}/{len(names)} fedtune modules")
sys.exit("\n".join(bad) if bad else 0)
EOF
env -u WANDB_MODE -u WANDB_API_KEY -u WANDB_DIR -u MLFLOW_TRACKING_URI PATH="$VENV/bin:$PATH" bash -c '
  set -euo pipefail
  fedtune --version
  fedtune run --backend local --rounds 1 --output out | tail -3
  fedtune sweep --address local --algorithm fedavg --rounds 2 --num-samples 2 --sampler tpe --set local_steps=1 \
      --logger csv --logger tensorboard --logger mlflow --logger wandb --output out --name floors | tail -4
  test -s out/floors/report.md
  ls -d out/floors/wandb/offline-run-* | wc -l | xargs echo "check_floors: W&B offline runs:"
'
echo "check_floors: fedtune run, fedtune sweep (4 loggers) and its report work at the floors"
if [ -n "$FLOORS_TESTS" ]; then
  cd "$ROOT"
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider $FLOORS_TESTS
fi
