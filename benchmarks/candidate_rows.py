"""A tune report's candidates as rows a benchmark writes beside its timings: name, backend,
precision, verdict, p50, and the accuracy figures the check decided on (the candidate's
max abs error, eager's at the same precision, their ratio against the calibrated bound)."""

from __future__ import annotations

import json


def candidate_rows(report) -> list[dict]:
    """One dict per candidate of ``report`` (an ``aitune._core.TuneReport``)."""
    data = json.loads(report.to_json())
    rows = []
    for c in data["candidates"]:
        correctness = c.get("correctness") or {}
        outputs = correctness.get("outputs") or []
        ratios = [o["error_ratio"] for o in outputs if o.get("error_ratio") is not None]
        eager = [o["eager_at_precision_max_abs_error"] for o in outputs
                 if o.get("eager_at_precision_max_abs_error") is not None]
        rows.append({
            "name": c["name"], "backend": c["backend"], "precision": c["precision"], "status": c["status"],
            "transform": c.get("transform", ""),
            "p50_us": (c.get("profile") or {}).get("host_us", {}).get("p50"),
            "max_abs_error": correctness.get("max_abs_error"),
            "eager_at_precision_max_abs_error": max(eager) if eager else None,
            "error_ratio": max(ratios) if ratios else None,
            "accuracy_factor": correctness.get("accuracy_factor"),
            "fp32_nodes": len(c.get("fp32_nodes") or []),
            "fused_operators": c.get("fused_operators") or {},
            "reason": (c.get("reason") or "")[:300],
        })
    return rows
