"""Profiler capture and the metrics report with its diagnosis, off a TPU."""

from __future__ import annotations

from pathlib import Path

from {{ cookiecutter.package_name }}.core.health import HealthSnapshot, diagnose

from backend_facts import METRICS_REPORT, TRACES, TRANSFER
from training_helpers import cli, write_config


def test_profile_writes_a_trace_in_tensorboard_layout(tmp_path: Path) -> None:
    """It captures a trace of N steps under RUN_DIR/profile/plugins/profile."""
    config = write_config(tmp_path, log_every=0)
    run_dir = tmp_path / "run"
    result = cli(
        "profile", "--config", str(config), "--steps", "5", "--max-steps", "30",
        "--run-dir", str(run_dir),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    traces = list((run_dir / "profile" / "plugins" / "profile").glob(TRACES))
    assert traces and traces[0].stat().st_size > 0
    assert "TPU timelines need a TPU" in result.stdout


def test_debug_prints_and_saves_the_metrics_report(tmp_path: Path) -> None:
    """It prints the backend's metrics report with a diagnosis and saves it in the run."""
    config = write_config(tmp_path, log_every=5)
    run_dir = tmp_path / "run"
    result = cli("debug", "--config", str(config), "--max-steps", "10", "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stderr
    saved = (run_dir / "metrics_report.txt").read_text()
    assert METRICS_REPORT in saved and "# Diagnosis" in saved
    assert "no recompilation, fallback op or host sync found" in saved
    assert "# Diagnosis" in result.stdout
{%- if cookiecutter.backend == "torch_tpu" %}


def test_diagnosis_names_each_cause() -> None:
    """It explains host reads beyond one a step, and graph breaks that read the device."""
    breaks = {"Tensor.item() call with capture_scalar_outputs=False": 2, "Unsupported: x": 1}
    findings = diagnose(HealthSnapshot(compilations=5, transfers=40, graph_breaks=breaks), 10)
    assert len(findings) == 2
    assert f"40 {TRANSFER}s over 10 steps, 10 expected" in findings[0]
    assert "the compiled step reads the device: Tensor.item()" in findings[1]
    assert "Unsupported" not in findings[1]  # a graph break that reads nothing
    assert diagnose(HealthSnapshot(compilations=2, transfers=1), steps=10) == []
{%- else %}


def test_diagnosis_names_each_cause() -> None:
    """It explains recompilation, fallback ops and host syncs in plain words."""
    findings = diagnose(
        HealthSnapshot(compilations=5, transfers=40, fallback_ops={"aten::nonzero": 3}),
        steps=10,
        expected_graphs=2,
    )
    assert len(findings) == 3
    assert "5 graphs compiled for 2 expected" in findings[0]
    assert "aten::nonzero x3" in findings[1]
    assert f"40 {TRANSFER}s over 10 steps, 10 expected" in findings[2]
    assert diagnose(HealthSnapshot(compilations=2, transfers=1), steps=10) == []
{%- endif %}


def test_diagnosis_counts_only_reads_beyond_the_deliberate_ones() -> None:
    """It accepts the loop's own host reads (logging, eval, checkpoints) and flags more."""
    loop = HealthSnapshot(compilations=1, transfers=25)
    assert diagnose(loop, steps=10, expected_graphs=1, expected_transfers=25) == []
    (finding,) = diagnose(loop, steps=10, expected_graphs=1, expected_transfers=24)
    assert f"25 {TRANSFER}s over 10 steps, 24 expected" in finding
