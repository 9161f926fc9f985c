"""Every named algorithm for a few steps on one GPU: does each method's CUDA path run, and is its loss finite?

    PYTHONPATH=. python3 benchmarks/gpu_methods.py [--data-root .gpu_data/PACS64] [--image-size 64]
                       [--model resnet18] [--rounds 2] [--local-steps 3] [--budget-s 300] [--out FILE.md]
    PYTHONPATH=. python3 benchmarks/gpu_methods.py --cpu --image-size 32 --model cnn   # the same on the CPU

Each preset that runs in setting fdg (``fedtune algorithms``) runs once, one after another in this
process, on the local backend with Ray and Optuna made unimportable (the GPU machine has neither):
PACS at ``--image-size`` px, target photo, 6 clients mixing the source domains
(``domain_homogeneity`` 0.5, so the methods that compare a client's domains act), ``--rounds`` x
``--local-steps`` steps of 16 images, random init, DomainBed augmentation, channels_last, fp32. A
method's own sizes that would dwarf the model are set small (FedADG's nets, FedSR's z). Prints one
row per preset: status, device, the last round's training loss and target accuracy, wall seconds,
and the error's last line when it failed. Presets left when the budget runs out are listed as not
run. Exit status 0 when every preset that ran completed with a finite loss, else 1; 0 with one line
when ``--cpu`` is not given and there is no CUDA GPU.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.gpu_check_child import _Absent  # noqa: E402  (Ray and Optuna unimportable)

NO_GPU = "gpu_methods: no CUDA GPU here (torch.cuda.is_available() is False); nothing to check"
SMALL = {"fedadg_noise": 64, "fedadg_latent": 256, "fedadg_disc_width": 128, "fedsr_z_dim": 64,
         "simclr_proj_dim": 32}


def options(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-root", default=".gpu_data/PACS64")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--model", default="resnet18")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--local-steps", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=300.0)
    p.add_argument("--presets", default="", help="comma-separated presets (default: every one that runs in fdg)")
    p.add_argument("--cpu", action="store_true", help="run on the CPU (a smoke run of the harness)")
    p.add_argument("--out", default="")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = options(argv)
    from fedtune.algorithms.presets import PRESETS

    unknown = [n for n in (a.presets.split(",") if a.presets else []) if n and n not in PRESETS]
    if unknown:
        print(f"gpu_methods: --presets {','.join(unknown)}: not a preset; allowed: {', '.join(PRESETS)}")
        return 2
    sys.meta_path.insert(0, _Absent)
    import torch

    if not a.cpu and not torch.cuda.is_available():
        print(NO_GPU)
        return 0
    from fedtune.config import FederatedRunConfig
    from fedtune.runtime.driver import run

    names = [n for n in (a.presets.split(",") if a.presets else PRESETS) if n]
    names = [n for n in names if "fdg" in PRESETS[n].settings] if not a.presets else names
    work = Path(tempfile.mkdtemp(prefix="gpu_methods-"))
    base = {"backend": "local", "dataset": "pacs", "data_root": str(Path(a.data_root).resolve()),
            "image_size": a.image_size, "model": a.model, "weights": "none", "precision": "fp32",
            "client_gpus": 0.0 if a.cpu else 1.0, "channels_last": True, "augment": "domainbed", "setting": "fdg",
            "target_domain": "photo", "num_clients": 6, "domain_homogeneity": 0.5, "rounds": a.rounds,
            "local_steps": a.local_steps, "batch_size": 16, "eval_every": a.rounds, "eval_batch_size": 128,
            "cache_dir": str(work / "cache"), "output": str(work / "results")}
    device = "cpu" if a.cpu else torch.cuda.get_device_name(0)
    lines = [f"## fedtune methods on {device} (benchmarks/gpu_methods.py)", "",
             f"- torch {torch.__version__}; PACS at {a.image_size} px, {a.model} from scratch, fdg (target photo), "
             f"6 clients at domain_homogeneity 0.5, {a.rounds} round(s) x {a.local_steps} steps of 16, fp32, "
             "channels_last, DomainBed augmentation, local backend, Ray and Optuna unimportable", "",
             "| preset | status | device | train_loss | target_acc | wall s | error |", "|---|---|---|---|---|---|---|"]
    deadline, ok = time.time() + a.budget_s, True
    for name in names:
        if time.time() > deadline:
            lines.append(f"| {name} | not run (budget) | | | | | |")
            continue
        spec = PRESETS[name]
        declared = FederatedRunConfig.from_dict({"algorithm": name}).resolved.hparam_specs()
        cfg = {**base, "algorithm": name, "name": name, **{k: v for k, v in SMALL.items() if k in declared}}
        t0 = time.time()
        try:
            res = run(FederatedRunConfig.from_dict(cfg), progress=False)
            last = res.rows[-1] if res.rows else {}
            loss, acc = last.get("train_loss", math.nan), last.get("target_acc", math.nan)
            good = res.status == "completed" and math.isfinite(loss)
            err = (res.error or "").strip().splitlines()[-1:] if res.error else []
            row = (res.status, f"{loss:.4f}", f"{acc:.3f}", err[0][:120] if err else "")
        except Exception as exc:  # noqa: BLE001 - a harness row, not a crash: the next preset runs
            good, row = False, ("error", "", "", f"{type(exc).__name__}: {exc}".splitlines()[0][:120])
        ok &= good
        dev = "cuda" if torch.cuda.is_available() and not a.cpu else "cpu"
        lines.append(f"| {name} ({spec.client_method} + {spec.server_rule}) | {row[0]} | {dev} | {row[1]} | {row[2]} | "
                     f"{time.time() - t0:.1f} | {row[3]} |")
        print(lines[-1], flush=True)
    lines.append("")
    lines.append(f"forbidden modules loaded: {sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'optuna'}) or 'none'}")
    text = "\n".join(lines)
    print("\n" + text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
