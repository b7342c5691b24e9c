"""The tuner's on-disk cache: one small JSON file per (program, shapes, schedule, target, evaluator, model version);
verification verdicts of winners are stored the same way (evaluator "verify"), with the kernel source.

Keys are SHA-256 hashes, so a re-run of the same tuning job finds every outcome and evaluates nothing. The model
version is a hash of the source of the layers an outcome depends on (language, compiler, templates, interpreter,
performance model): editing any of them invalidates old entries instead of serving stale latencies.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib

from tilec.tune.evaluate import Job, Outcome

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPENDS_ON = ("tilec/lang", "tilec/compiler", "tilec/nki", "tilec/perf", "tilec/trace.py", "tilec/templates")
DEFAULT_DIR = pathlib.Path(".tilec-cache") / "tune"


@functools.lru_cache(maxsize=1)
def model_version() -> str:
    """Hash of every source file the evaluation depends on, in sorted path order."""
    digest = hashlib.sha256()
    for rel in DEPENDS_ON:
        base = ROOT / rel
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file()
                                                       and p.suffix in (".py", ".jinja", ".j2", ".lark", ".json"))
        for path in files:
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


class DiskCache:
    """Outcomes by key under `directory` (default `.tilec-cache/tune/` in the working directory)."""

    def __init__(self, directory: str | os.PathLike[str] | None = None, version: str | None = None) -> None:
        self.dir = pathlib.Path(directory) if directory is not None else DEFAULT_DIR
        self.version = version if version is not None else model_version()

    def key(self, job: Job, schedule: str, evaluator: str) -> str:
        record = {"program": job.program_text, "shapes": sorted(job.shapes), "schedule": schedule,
                  "target": job.target, "evaluator": evaluator, "model": self.version, "nki": job.nki}
        return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()

    def _path(self, key: str) -> pathlib.Path:
        return self.dir / key[:2] / f"{key}.json"

    def get(self, key: str) -> Outcome | None:
        try:
            data = json.loads(self._path(key).read_text())
        except (OSError, ValueError):
            return None  # missing or half-written by a killed run: evaluate again
        return Outcome(us=float(data["us"]), mfu=float(data["mfu"]), error=str(data["error"]))

    def put(self, key: str, outcome: Outcome) -> None:
        # inf is not JSON; store it as a string json can parse back through float()
        self.put_record(key, {"us": outcome.us if outcome.us != float("inf") else "inf", "mfu": outcome.mfu,
                              "error": outcome.error})

    def get_record(self, key: str) -> dict | None:
        """Any JSON object stored under `key` (e.g. a verification verdict), or None."""
        try:
            data = json.loads(self._path(key).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def put_record(self, key: str, record: dict) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(record, sort_keys=True))
        os.replace(tmp, path)  # atomic: readers see the old file or the whole new one
