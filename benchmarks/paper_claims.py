"""Do the seed papers' qualitative claims hold under one honest protocol? (a script, not a test)

Every method is **tuned with the same budget by ``fedtune sweep``**: the same number of Optuna
trials per search (the first is the search space's defaults, the papers' settings), the same
rounds, local epochs and batch size, the same search-space policy for the knobs all methods
share (``local_lr``, ``local_momentum``, ``weight_decay`` and ``global_lr`` with one range and
distribution everywhere: :mod:`fedtune.spaces.shared`), and the whole search repeated over
``--trial-seeds`` (different sampler and data seeds), so every ± is over independent searches
and includes selection variance, as DomainBed's. Each (method, held-out domain) is one study
under ``OUTPUT/claims-<part>/``; the script re-runs nothing that is already there
(``fedtune sweep --resume``), so an interrupted benchmark continues where it stopped.

Parts:

* ``fdg`` — rotated-digits, leave-one-domain-out over every domain: FedAvg, FedOMG, FedSAM,
  FedSAM+OMG, GFM, FedGaLA with the descent gate (fedtune's default) and with the literal gate
  (the paper's formula and the authors' code), and the seeds' baseline rows: FedGA, FedIIR,
  FedSR, Fishr, FedIIR+OMG, FedSR+OMG (the FedOMG paper's table), MOON, Scaffold, FedDyn (GFM's).
* ``fda`` — rotated-digits with a labelled target sample: FedAvg, target-only, FedDA and FedGP at
  fixed β ∈ {0.2, 0.5, 0.8} (fedtune's convention: β weights the *source* term, the paper's Def.
  4.3) and auto-β; selected by source validation (``val``) and by the target client's held-out
  labels (``target-val``).
* ``pacs`` — PACS at 32 px (``--data-root``, e.g. ``../shared/data/PACS64``), the cnn from scratch,
  two held-out domains, few rounds: sized for a 2-core machine. ``--model resnet18 --image-size 64``
  gives the GPU variant.

Every table also shows DomainBed's oracle (a fixed target slice chooses, last round only),
labelled as such. Claims are checked on the honest numbers by the paired difference of the two
methods' domain averages over trial seeds (same seeds, same data): a claim *holds* when the 95 %
Student-t interval of that difference lies above zero, is *NOT held* when it lies below, and is
*undecided* otherwise (``fedtune report`` uses the same rule, :func:`fedtune.reports.stats.paired_gap`).

    python benchmarks/paper_claims.py --part fdg fda               # rotated-digits
    python benchmarks/paper_claims.py --part pacs --data-root ../shared/data/PACS64
    python benchmarks/paper_claims.py --part all --jobs 4 --cpus-per-job 4 --markdown evidence.md
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@dataclass(frozen=True)
class Method:
    """A table row: an algorithm's search space, with some parameters pinned (``pin``) or added."""

    label: str
    algorithm: str
    pin: dict[str, Any] = field(default_factory=dict)  # parameter -> fixed value (replaces its distribution)
    merge: tuple[str, ...] = ()  # other algorithms' spaces whose parameters are added (FedSAM+OMG)
    drop_switches: bool = False  # FDA fixed-β rows: no "fixed or auto" switch, β pinned

    @property
    def slug(self) -> str:
        out = "".join(c if c.isalnum() else "-" for c in self.label.lower())
        return "-".join(p for p in out.split("-") if p)


FDG = [
    Method("FedAvg", "fedavg"),
    Method("FedOMG", "fedomg"),
    Method("FedSAM", "fedsam"),
    Method("FedSAM+OMG", "fedsam", pin={"server_rule": "fedomg"}, merge=("fedomg",)),
    Method("GFM", "gfm"),
    Method("FedGaLA (descent gate)", "fedgala", pin={"gala_gate": "descent"}),
    Method("FedGaLA (literal gate)", "fedgala", pin={"gala_gate": "literal"}),
    # the FedOMG paper's and GFM's baseline rows (issue 20)
    Method("FedGA", "fedga"),
    Method("FedIIR", "fediir"),
    Method("FedSR", "fedsr"),
    Method("Fishr", "fishr"),
    Method("FedIIR+OMG", "fediir-omg"),
    Method("FedSR+OMG", "fedsr-omg"),
    Method("MOON", "moon"),
    Method("Scaffold", "scaffold"),
    Method("FedDyn", "feddyn"),
]
FDA = [
    Method("FedAvg (fda)", "fedavg"),
    Method("Target-only", "target-only"),
    *[Method(f"{r} β={b}", r.lower(), pin={"gp_beta": b}, drop_switches=True)
      for r in ("FedDA", "FedGP") for b in (0.2, 0.5, 0.8)],
    *[Method(f"{r} β=auto", r.lower(), pin={"gp_beta": "auto"}, drop_switches=True) for r in ("FedDA", "FedGP")],
]
PACS = [m for m in FDG if m.label in ("FedAvg", "FedOMG", "FedSAM", "GFM", "FedGaLA (descent gate)",
                                      "FedGaLA (literal gate)")]


@dataclass
class Part:
    name: str
    title: str
    dataset: str
    setting: str
    methods: list[Method]
    domains: list[str] | None  # None: every domain of the dataset
    protocols: tuple[str, ...]
    overrides: dict[str, Any]


def parts(args: argparse.Namespace) -> dict[str, Part]:
    common = {"batch_size": args.batch_size, "client_cpus": 1.0, "max_client_actors": 1}
    digits = {**common, "model": args.model or "mlp", "local_epochs": 1}
    pacs = {**common, "model": args.model or "cnn", "image_size": args.image_size or 32,
            "local_steps": args.local_steps or 10}
    if args.local_steps:
        digits = {**digits, "local_steps": args.local_steps}
    if args.client_gpus:  # e.g. on a GPU machine: client actors share the GPU(s)
        digits["client_gpus"] = pacs["client_gpus"] = args.client_gpus
    return {
        "fdg": Part("fdg", "FDG, leave-one-domain-out on rotated-digits", "rotated-digits", "fdg", FDG,
                    args.domains, ("val", "oracle"), digits),
        "fda": Part("fda", "FDA on rotated-digits (labelled target sample)", "rotated-digits", "fda", FDA,
                    args.domains or ["0", "30", "75"], ("val", "target-val", "oracle"),
                    {**digits, "local_steps": args.local_steps or 10, "target_fraction": args.target_fraction}),
        "pacs": Part("pacs", "FDG on PACS (leave-one-domain-out, two held-out domains)", "pacs", "fdg", PACS,
                     args.domains or ["sketch", "art_painting"], ("val", "oracle"), pacs),
    }


# ------------------------------------------------------------------------------------------------
def space_file(method: Method, setting: str, folder: Path) -> Path:
    """The method's search space: fedtune's own (complete: its file over the declarations; a pinned
    client_method / server_rule derives the composed pair's space), with the method's pins and merges."""
    from fedtune.spaces.lookup import load_space
    from fedtune.spaces.yaml_files import build_space

    space = load_space(method.algorithm)
    pair = {k: v for k, v in method.pin.items() if k in ("client_method", "server_rule")}
    if pair:
        override = yaml.safe_load(Path(space.source).read_text()) if Path(space.source).is_file() else {}
        space = build_space({**override, "algorithm": method.algorithm, **pair}, space.source, None)
    doc = space.to_document()
    params = dict(doc.get("params") or {})
    for other in method.merge:
        extra = load_space(other).to_document()
        for k, v in (extra.get("params") or {}).items():
            if k not in params or k == "global_lr":  # the merged server rule's own default step
                params[k] = v
    # Every row of every part runs the seed papers' server step (server_optimizer sgd; its optimisers' knobs dropped).
    params = {k: v for k, v in params.items() if not (isinstance(v, dict) and "server_optimizer" in (v.get("when") or {}))}
    params["server_optimizer"] = {"distribution": "fixed", "value": "sgd"}
    if method.drop_switches:
        doc.pop("switches", None)
        for k, v in list(params.items()):
            if isinstance(v, dict):
                params[k] = {kk: vv for kk, vv in v.items() if kk not in ("when", "otherwise")}
    for k, v in method.pin.items():
        if k in ("client_method", "server_rule"):  # a composed pair: top-level keys of a space
            doc[k] = v
        else:
            params[k] = {"distribution": "fixed", "value": v}
    doc["params"] = params
    doc["description"] = f"{method.label} (benchmarks/paper_claims.py)"
    if setting != "fdg":
        doc["setting"] = setting
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{method.slug}.yaml"
    text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def study_name(method: Method, domain: str) -> str:
    return f"{method.slug}--{domain}"


def sweep_command(args: argparse.Namespace, part: Part, method: Method, domain: str, out: Path) -> list[str]:
    space = space_file(method, part.setting, out / "spaces")
    name = study_name(method, domain)
    if (out / name / "study.json").exists():  # started before: continue it with its saved options
        return [sys.executable, "-m", "fedtune.cli", "sweep", "--resume", "--name", name, "--output", str(out),
                "--no-report"]
    cmd = [sys.executable, "-m", "fedtune.cli", "sweep", str(space), "--algorithm", method.algorithm,
           "--dataset", part.dataset, "--target-domain", domain, "--rounds", str(args.rounds),
           "--num-samples", str(args.trials), "--trial-seeds", str(args.trial_seeds),
           "--sampler", args.sampler, "--output", str(out), "--name", name, "--no-report",
           "--set", f"setting={part.setting}", "--set", f"num_cpus={args.cpus_per_job}"]
    if args.num_gpus_per_job:
        cmd += ["--set", f"num_gpus={args.num_gpus_per_job}"]
    if part.dataset != "rotated-digits":
        cmd += ["--data-root", str(Path(args.data_root).resolve())]
    for k, v in part.overrides.items():
        cmd += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    return cmd


def run_study(cmd: list[str], log: Path) -> tuple[int, float]:
    t0 = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with log.open("a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env).returncode
    return rc, time.perf_counter() - t0


# ------------------------------------------------------------------------------------------------
def selected(study_dir: Path, protocol: str) -> dict[int, float]:
    """trial seed -> reported target accuracy of the trial that ``protocol`` selects in that
    seed's search: ``fedtune report``'s own selection (:mod:`fedtune.results.selection`, the one owner
    of the protocol; search k of ``--trial-seeds`` runs with seed ``seed + k``)."""
    from fedtune.reports.report import make_report

    rep = make_report(study_dir, selection=protocol, plots=False, write=False)
    if rep.selected.empty:
        return {}
    return {int(r["seed"]): float(r["target_acc"]) for _, r in rep.selected.iterrows()
            if math.isfinite(float(r["target_acc"]))}


def _mean_se(xs: list[float]) -> tuple[float, float, int]:
    a = np.array([x for x in xs if math.isfinite(x)], dtype=float)
    if len(a) == 0:
        return math.nan, math.nan, 0
    return float(a.mean()), (float(a.std(ddof=1) / math.sqrt(len(a))) if len(a) > 1 else math.nan), len(a)


def _cell(mu: float, se: float) -> str:
    if not math.isfinite(mu):
        return "—"
    return f"{100 * mu:.1f} ± {100 * se:.1f}" if math.isfinite(se) else f"{100 * mu:.1f}"


def collect(part: Part, domains: list[str], out: Path) -> dict[str, dict[str, dict[str, dict[int, float]]]]:
    """protocol -> method label -> domain -> {trial seed: selected target accuracy}."""
    res: dict[str, dict[str, dict[str, dict[int, float]]]] = {}
    for p in part.protocols:
        for m in part.methods:
            for d in domains:
                sd = out / study_name(m, d)
                if (sd / "trials.parquet").exists():
                    res.setdefault(p, {}).setdefault(m.label, {})[d] = selected(sd, p)
    return res


def averages(per_domain: dict[str, dict[int, float]], domains: list[str]) -> dict[int, float]:
    """trial seed -> average over domains (only seeds present in every domain)."""
    seeds = set.intersection(*(set(per_domain.get(d, {})) for d in domains)) if domains else set()
    return {s: float(np.mean([per_domain[d][s] for d in domains])) for s in sorted(seeds)}


def table(part: Part, protocol: str, domains: list[str], res: dict) -> str:
    from fedtune.results.selection import LABELS

    rows = res.get(protocol, {})
    head = f"#### {part.title} — {LABELS[protocol]}"
    lines = [head, "", "| method | " + " | ".join(domains) + " | average |", "|---|" + "---|" * (len(domains) + 1)]
    for m in part.methods:
        if m.label not in rows:
            continue
        cells = [_cell(*_mean_se(list(rows[m.label].get(d, {}).values()))[:2]) for d in domains]
        avg = averages(rows[m.label], domains)
        lines.append(f"| {m.label} | " + " | ".join(cells) + f" | {_cell(*_mean_se(list(avg.values()))[:2])} |")
    return "\n".join(lines)


def compare(res: dict, domains: list[str], a: str, b: str, protocol: str = "val") -> tuple[str, str]:
    """Verdict on "a > b": the paired difference of the domain averages per trial seed
    (:func:`fedtune.reports.stats.paired_gap`, the report's own rule): *held* when its 95 % Student-t
    interval lies above zero, *NOT held* when below, *undecided* otherwise."""
    from fedtune.reports.stats import paired_gap

    rows = res.get(protocol, {})
    if a not in rows or b not in rows:
        return "n/a", f"{a} or {b} not run"
    xa, xb = averages(rows[a], domains), averages(rows[b], domains)
    gap = paired_gap(xa, xb)
    seeds = sorted(set(xa) & set(xb))
    ma = float(np.mean([xa[s] for s in seeds])) if seeds else math.nan
    mb = float(np.mean([xb[s] for s in seeds])) if seeds else math.nan
    detail = f"{a} {100 * ma:.1f} vs {b} {100 * mb:.1f}; paired difference {gap.text()}"
    if gap.n < 2:
        return "undecided", detail + " (too few trial seeds for an interval)"
    if gap.resolved:
        return ("held" if gap.mean > 0 else "NOT held"), detail
    return "undecided", detail + " (the interval contains zero)"


def spread(res: dict, domains: list[str], rule: str, protocol: str = "val") -> float:
    rows = res.get(protocol, {})
    xs = []
    for b in (0.2, 0.5, 0.8):
        avg = averages(rows.get(f"{rule} β={b}", {}), domains)
        if avg:
            xs.append(float(np.mean(list(avg.values()))))
    return max(xs) - min(xs) if len(xs) == 3 else math.nan


def claims(name: str, res: dict, domains: list[str]) -> list[tuple[str, str, str]]:
    out = []
    if name in ("fdg", "pacs"):
        for claim, a, b in (("FedOMG > FedAvg under domain shift (FedOMG paper)", "FedOMG", "FedAvg"),
                            ("FedSAM+OMG > FedSAM (FedOMG paper)", "FedSAM+OMG", "FedSAM"),
                            ("GFM > FedSAM (GFM paper)", "GFM", "FedSAM"),
                            ("GFM > FedAvg (GFM paper)", "GFM", "FedAvg"),
                            ("FedGaLA > FedAvg (FedGaLA paper; descent gate)", "FedGaLA (descent gate)", "FedAvg"),
                            ("FedGaLA > FedAvg (FedGaLA paper; literal gate, as published)",
                             "FedGaLA (literal gate)", "FedAvg"),
                            # the FedOMG paper's table: OMG on top of a client method helps, FedOMG beats the baselines
                            ("FedIIR+OMG > FedIIR (FedOMG paper)", "FedIIR+OMG", "FedIIR"),
                            ("FedSR+OMG > FedSR (FedOMG paper)", "FedSR+OMG", "FedSR"),
                            ("FedOMG > FedGA (FedOMG paper)", "FedOMG", "FedGA"),
                            ("FedOMG > FedIIR (FedOMG paper)", "FedOMG", "FedIIR"),
                            ("FedOMG > FedSR (FedOMG paper)", "FedOMG", "FedSR"),
                            ("FedOMG > Fishr (FedOMG paper)", "FedOMG", "Fishr"),
                            # GFM's table
                            ("GFM > MOON (GFM paper)", "GFM", "MOON"),
                            ("GFM > Scaffold (GFM paper)", "GFM", "Scaffold"),
                            ("GFM > FedDyn (GFM paper)", "GFM", "FedDyn")):
            v, d = compare(res, domains, a, b)
            if v != "n/a":
                out.append((claim, v, d))
    if name == "fda":
        for protocol in ("val", "target-val"):
            sp_gp, sp_da = spread(res, domains, "FedGP", protocol), spread(res, domains, "FedDA", protocol)
            if math.isfinite(sp_gp) and math.isfinite(sp_da):
                out.append((f"FedGP is more robust to β than FedDA ({protocol})",
                            "held" if sp_gp < sp_da else "NOT held",
                            f"spread of the averages over β ∈ {{0.2, 0.5, 0.8}}: FedGP {100 * sp_gp:.1f}, "
                            f"FedDA {100 * sp_da:.1f} (no error bar: a descriptive comparison)"))
            for claim, a, b in (("FedGP > FedDA at β=0.5", "FedGP β=0.5", "FedDA β=0.5"),
                                ("auto-β FedDA > FedDA at β=0.5", "FedDA β=auto", "FedDA β=0.5"),
                                ("FedGP (auto) > FedAvg", "FedGP β=auto", "FedAvg (fda)"),
                                ("FedGP (auto) > target-only", "FedGP β=auto", "Target-only"),
                                ("FedDA (auto) > target-only", "FedDA β=auto", "Target-only")):
                v, d = compare(res, domains, a, b, protocol)
                if v != "n/a":
                    out.append((f"{claim} ({protocol})", v, d))
    return out


# ------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", nargs="+", choices=("fdg", "fda", "pacs", "all"), default=["fdg", "fda"])
    ap.add_argument("--data-root", default="../shared/data/PACS64", help="pacs: folder holding PACS/")
    ap.add_argument("--domains", nargs="*", default=None, help="held-out domains (default: per part)")
    ap.add_argument("--trials", type=int, default=5, help="Optuna trials per search (the first: the defaults)")
    ap.add_argument("--trial-seeds", type=int, default=3, help="independent searches per (method, domain)")
    ap.add_argument("--sampler", default="tpe", help="fedtune sweep --sampler")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--local-steps", type=int, default=None, help="default: 1 local epoch (fdg), 10 steps (fda: the target's few labels still give auto-β "
                    "several steps; pacs)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--model", default=None, help="default: mlp (digits), cnn (pacs)")
    ap.add_argument("--image-size", type=int, default=None, help="pacs: pixels per side (default 32)")
    ap.add_argument("--client-gpus", type=float, default=None, help="GPU share of each client actor")
    ap.add_argument("--target-fraction", type=float, default=0.2,
                    help="fda: labelled share of the target domain (a fifth of it is the target client's validation)")
    ap.add_argument("--jobs", type=int, default=1, help="studies run side by side (one fedtune sweep each)")
    ap.add_argument("--cpus-per-job", type=int, default=2, help="num_cpus of each study's Ray")
    ap.add_argument("--num-gpus-per-job", type=float, default=None, help="num_gpus of each study's Ray")
    ap.add_argument("--output", default="fedtune_results/paper_claims")
    ap.add_argument("--methods", nargs="*", default=None, help="only these method labels")
    ap.add_argument("--markdown", default=None, help="also write the tables and verdicts to this file")
    ap.add_argument("--report-only", action="store_true", help="tables of the studies already stored; run nothing")
    args = ap.parse_args(argv)

    from fedtune.data.registry import dataset_info

    chosen = ["fdg", "fda", "pacs"] if "all" in args.part else args.part
    all_parts = parts(args)
    budget = (f"{args.trials} Optuna trials per search (the first = the space's defaults), "
              f"{args.trial_seeds} trial seeds (independent searches), {args.rounds} rounds, batch {args.batch_size}, "
              f"sampler {args.sampler}")
    jobs: list[tuple[Part, Method, str, list[str]]] = []
    doms: dict[str, list[str]] = {}
    for name in chosen:
        part = all_parts[name]
        if part.dataset == "pacs":
            info = dataset_info("pacs", root=args.data_root)
        else:
            info = dataset_info(part.dataset)
        doms[name] = list(part.domains or info.domains)
        out = Path(args.output) / f"claims-{name}"
        for m in part.methods:
            if args.methods and m.label not in args.methods:
                continue
            for d in doms[name]:
                jobs.append((part, m, d, sweep_command(args, part, m, d, out)))
    if not args.report_only:
        print(f"{len(jobs)} studies ({budget}); {args.jobs} at a time", flush=True)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futs = {}
            for part, m, d, cmd in jobs:
                out = Path(args.output) / f"claims-{part.name}"
                out.mkdir(parents=True, exist_ok=True)
                futs[pool.submit(run_study, cmd, out / f"{study_name(m, d)}.log")] = (part, m, d)
            for i, fut in enumerate(as_completed(futs), 1):
                part, m, d = futs[fut]
                rc, secs = fut.result()
                print(f"[{i}/{len(jobs)} {time.perf_counter() - t0:6.0f}s] {part.name} {m.label:<24} target={d:<13} "
                      f"exit {rc} in {secs:.0f}s", flush=True)
    md: list[str] = [f"Budget: {budget}.", ""]
    for name in chosen:
        part = all_parts[name]
        out = Path(args.output) / f"claims-{name}"
        res = collect(part, doms[name], out)
        over = ", ".join(f"{k}={v}" for k, v in part.overrides.items())
        md += [f"### {part.title}", "", f"Fixed for every method: {over}.", ""]
        for p in part.protocols:
            md += [table(part, p, doms[name], res), ""]
        md += ["Claims (honest selection; a verdict needs the 95 % paired t-interval over trial seeds to "
               "exclude zero):", ""]
        md += [f"- {c}: **{v}** ({d})" for c, v, d in claims(name, res, doms[name])]
        md.append("")
    text = "\n".join(md)
    print("\n" + text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
