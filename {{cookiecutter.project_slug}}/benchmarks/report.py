"""The report: the comparison table, the targets met or missed, and the depth sweep."""

from __future__ import annotations

from typing import Any

from workloads import (
    CHECKPOINT_EVERY,
    CONFIG,
    DEPTH_STEPS,
    HF_LLAMA,
    HF_LLAMA_BATCH,
    HF_MOE,
    STRATEGY,
    TRAINER_TARGET,
)

HF_LLAMA_LABEL = (
    f"hf llama ({HF_LLAMA['layers']} layers, dim {HF_LLAMA['dim']}, "
    f"seq {HF_LLAMA['seq_len']}, batch {HF_LLAMA_BATCH})"
)
HF_MOE_LABEL = (
    f"hf mixtral ({HF_MOE['experts']} experts, top {HF_MOE['experts_per_token']}, "
    f"{HF_MOE['layers']} layers, dim {HF_MOE['dim']}, seq {HF_MOE['seq_len']}, "
    f"batch {HF_LLAMA_BATCH})"
)
MODEL_KEYS = ("flops_per_step", "tokens_per_step", "parameters")  # the trainer reports them


def table(rows: list[dict[str, Any]], task_name: str) -> str:
    lines = [
        "| workload | contender | steps/s (median) | rounds | vs reference | host ms/step "
        "| first step (s) | graphs | fallback ops | transfers/step | outside logging |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    names = {
        "task": task_name,
        "spmd": "spmd mlp x8",
        "fsdp": f"fsdp {task_name} x8",
        "ckpt": f"{task_name}, saving every {CHECKPOINT_EVERY} steps",
        "hf-llama": HF_LLAMA_LABEL,
        "hf-moe": HF_MOE_LABEL,
    }
    by_workload: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_workload.setdefault(row["workload"], []).append(row)
    for workload, group in by_workload.items():
        label = names.get(workload, workload)
        for row in group:
            if "skipped" in row:
                lines.append(f"| {label} | skipped: {row['skipped']} | | | | | | | | | |")
                continue
            rounds = " ".join(f"{rate:.3g}" for rate in row["rounds"])
            graphs = str(row["compilations"])
            if row["eval_graphs"] is not None:
                graphs += f" (+{row['eval_graphs']} eval)"
            ops = ", ".join(f"{k} x{v}" for k, v in row["fallback_ops"].items()) or "0"
            lines.append(
                f"| {label} | {row['contender']} | {row['median']:.1f} | {rounds} "
                f"| {row['vs_reference']:.2f}x | {row['host_ms']:.1f} | {row['first_step']:.1f} "
                f"| {graphs} | {ops} "
                f"| {row['transfers_per_step']:.3f} | {row['outside_logging_per_step']:.3f} |"
            )
        if workload in STRATEGY:
            lines.append(f"| {label} | accelerate | n/a: no XLA:CPU SPMD path | | | | | | | | |")
    return "\n".join(lines)


def verdict(rows: list[dict[str, Any]]) -> list[str]:
    """The targets, met or missed, per workload."""
    notes = []
    for workload in dict.fromkeys(row["workload"] for row in rows):
        group = {
            row["contender"]: row
            for row in rows
            if row["workload"] == workload and "skipped" not in row
        }
        if "hand-written" not in group:
            continue  # skipped, or a comparison of the loop with itself: no target
        ours = group["trainer"]
        target = TRAINER_TARGET
        checks = [
            (
                f"trainer {ours['vs_reference']:.2f}x hand-written (target >= {target:.2f}x)",
                ours["vs_reference"] >= target,
            ),
            (
                f"trainer graphs: {ours['compilations']} train + {ours['eval_graphs']} eval "
                "(target 1 + 1)",
                ours["compilations"] == 1 and ours["eval_graphs"] == 1,
            ),
            ("trainer fallback ops: none", not ours["fallback_ops"]),
            (
                f"trainer transfers outside logging: {ours['outside_logging_per_step']:.3f}/step",
                ours["outside_logging_per_step"] <= 0,
            ),
        ]
        if "accelerate" in group:
            ratio = ours["median"] / group["accelerate"]["median"]
            checks.append((f"trainer {ratio:.2f}x Accelerate (target >= 1.2x)", ratio >= 1.2))
        checks += active_flops(ours.get("model", {}))
        for text, met in checks:
            notes.append(f"- {workload}: {'met' if met else 'MISSED'}: {text}")
    return notes


def active_flops(model: dict[str, Any]) -> list[tuple[str, bool]]:
    """For a mixture of experts: the FLOPs per step that FLOPs/s and MFU use, against
    6 x active parameters x tokens (a token's top-k experts) and 6 x all of them."""
    counts = model.get("parameters", {})
    flops, tokens = model.get("flops_per_step"), model.get("tokens_per_step")
    if "active" not in counts or not flops or not tokens:
        return []
    active, total = 6 * counts["active"] * tokens, 6 * counts["total"] * tokens
    text = (
        f"FLOPs/step for FLOPs/s and MFU: {flops:.3g}, {flops / active:.2f}x 6 x active "
        f"parameters ({counts['active'] / 1e6:.2f}M) x tokens, {flops / total:.2f}x 6 x all "
        f"({counts['total'] / 1e6:.2f}M; target: closer to active, attention on top)"
    )
    return [(text, abs(flops / active - 1) < abs(flops / total - 1))]


def depth_table(rows: list[dict[str, Any]]) -> str:
    """The sweep as a table, and the scanned deepest model against the shallowest."""
    by = {(row["blocks"], row["scanned"]): row for row in rows}
    lines = [
        f"Depth sweep ({CONFIG.task} example, one device, {DEPTH_STEPS} steps, cold process each):",
        "",
        "| blocks | first step unrolled (s) | first step scanned (s) | compile unrolled (s) "
        "| compile scanned (s) | steps/s unrolled | steps/s scanned | graphs | losses equal |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for blocks in sorted({row["blocks"] for row in rows}):
        plain, scan = by[(blocks, False)], by[(blocks, True)]
        same = all(
            abs(a - b) <= 1e-5 * abs(b)
            for a, b in zip(scan["losses"], plain["losses"], strict=True)
        )
        lines.append(
            f"| {blocks} | {plain['first_step']:.1f} | {scan['first_step']:.1f} "
            f"| {plain['compile']:.1f} | {scan['compile']:.1f} | {plain['rate']:.1f} "
            f"| {scan['rate']:.1f} | {plain['graphs']} / {scan['graphs']} "
            f"| {'yes' if same else 'NO'} |"
        )
    shallow, deep = min(by)[0], max(by)[0]
    ratio = by[(deep, True)]["first_step"] / by[(shallow, False)]["first_step"]
    lines += [
        "",
        f"- scanned {deep} blocks: first step {ratio:.2f}x the unrolled {shallow}-block one "
        f"(target <= 1.5x): {'met' if ratio <= 1.5 else 'MISSED'}",
    ]
    return "\n".join(lines)
